//! Label, taint and annotation names with a meaning to Kubernetes components.

pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
pub const LABEL_OS: &str = "kubernetes.io/os";
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";

pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const TAINT_OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

pub const EFFECT_NO_SCHEDULE: &str = "NoSchedule";
pub const EFFECT_NO_EXECUTE: &str = "NoExecute";

pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

pub const STS_POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const STS_POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
pub const REVISION_HASH_LABEL: &str = "controller-revision-hash";

pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
pub const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";
pub const BIND_COMPLETED_ANNOTATION: &str = "pv.kubernetes.io/bind-completed";
pub const BOUND_BY_CONTROLLER_ANNOTATION: &str = "pv.kubernetes.io/bound-by-controller";

pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

//! What the simulated cluster looks like: its nodes, storage classes and timings.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

/// One node (a kubelet plus its `Node` object).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSpec {
    pub name: String,
    pub zone: String,
    /// Extra labels, applied on registration on top of the well-known ones.
    pub labels: BTreeMap<String, String>,
    /// Taints the kubelet registers the node with (`--register-with-taints`).
    pub taints: Vec<Taint>,
    /// `spec.providerID`, e.g. `aws:///us-east-1a/i-0123456789abcdef0`.
    pub provider_id: Option<String>,
    /// InternalIP address; one is allocated when absent.
    pub internal_ip: Option<String>,
}

impl NodeSpec {
    pub fn new(name: impl Into<String>, zone: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            zone: zone.into(),
            ..Self::default()
        }
    }

    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn with_taint(mut self, key: &str, value: Option<&str>, effect: &str) -> Self {
        self.taints.push(Taint {
            key: key.to_string(),
            value: value.map(str::to_string),
            effect: effect.to_string(),
            time_added: None,
        });
        self
    }

    /// A node backing an AWS instance, named like EC2's private DNS names are not: the name is
    /// the caller's choice, the providerID follows the `aws:///<zone>/<instance-id>` form.
    pub fn aws_instance(
        name: impl Into<String>,
        zone: impl Into<String>,
        instance_id: &str,
    ) -> Self {
        let zone = zone.into();
        let provider_id = Some(format!("aws:///{zone}/{instance_id}"));
        Self {
            name: name.into(),
            zone,
            provider_id,
            ..Self::default()
        }
    }
}

/// A StorageClass the cluster is created with (as a cloud installation would ship one).
#[derive(Clone, Debug, PartialEq)]
pub struct StorageClassSpec {
    pub name: String,
    /// Marked `storageclass.kubernetes.io/is-default-class: "true"`.
    pub default: bool,
    /// `WaitForFirstConsumer` when true, `Immediate` otherwise.
    pub wait_for_first_consumer: bool,
    /// `Delete` or `Retain`.
    pub reclaim_policy: String,
    pub allow_volume_expansion: bool,
}

impl StorageClassSpec {
    pub fn gp3() -> Self {
        Self {
            name: "gp3".to_string(),
            default: true,
            wait_for_first_consumer: true,
            reclaim_policy: "Delete".to_string(),
            allow_volume_expansion: true,
        }
    }
}

/// Allocatable resources of every simulated node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeCapacity {
    pub cpu: String,
    pub memory: String,
    pub pods: u32,
    pub ephemeral_storage: String,
}

impl Default for NodeCapacity {
    fn default() -> Self {
        Self {
            cpu: "4".to_string(),
            memory: "16Gi".to_string(),
            pods: 110,
            ephemeral_storage: "100Gi".to_string(),
        }
    }
}

/// All durations are simulated time (see [`crate::clock::Clock`]).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub nodes: Vec<NodeSpec>,
    /// Lease renewal and Node status heartbeat period (kubelet's nodeStatusUpdateFrequency).
    pub heartbeat_interval: Duration,
    /// Silence after which a node becomes `Ready=Unknown` (kube-controller-manager's
    /// `--node-monitor-grace-period`).
    pub node_grace_period: Duration,
    /// How long a VolumeAttachment lingers after it stops being needed (detach time).
    pub detach_delay: Duration,
    /// How long until a created VolumeAttachment reports `attached: true`.
    pub attach_delay: Duration,
    /// From "all volumes attached" to containers running and Ready.
    pub pod_start_delay: Duration,
    /// How long containers take to stop after a graceful delete (capped by the pod's grace).
    pub pod_stop_delay: Duration,
    /// `tolerationSeconds` given to pods without their own not-ready/unreachable toleration, as
    /// the DefaultTolerationSeconds admission plugin does (Kubernetes default 300s).
    pub default_toleration_seconds: i64,
    /// Pods bound to a Node that no longer exists are force-deleted after this long (pod GC).
    pub orphan_pod_grace: Duration,
    /// Safety-net period at which every controller re-examines the whole cluster.
    pub resync_interval: Duration,
    /// CSI driver name used for provisioned volumes and VolumeAttachments.
    pub csi_driver: String,
    /// StorageClasses created at start if missing.
    pub storage_classes: Vec<StorageClassSpec>,
    pub node_capacity: NodeCapacity,
    pub kubelet_version: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            heartbeat_interval: Duration::from_secs(10),
            node_grace_period: Duration::from_secs(40),
            detach_delay: Duration::from_secs(5),
            attach_delay: Duration::from_secs(2),
            pod_start_delay: Duration::from_secs(3),
            pod_stop_delay: Duration::from_secs(2),
            default_toleration_seconds: 300,
            orphan_pod_grace: Duration::from_secs(40),
            resync_interval: Duration::from_secs(30),
            csi_driver: "ebs.csi.aws.com".to_string(),
            storage_classes: vec![StorageClassSpec::gp3()],
            node_capacity: NodeCapacity::default(),
            kubelet_version: "v1.33.0".to_string(),
        }
    }
}

impl ClusterConfig {
    /// Three nodes over two zones of `us-east-1`, as the sandbox uses.
    pub fn three_nodes_two_zones() -> Self {
        Self {
            nodes: vec![
                NodeSpec::new("node-a1", "us-east-1a"),
                NodeSpec::new("node-a2", "us-east-1a"),
                NodeSpec::new("node-b1", "us-east-1b"),
            ],
            ..Self::default()
        }
    }
}

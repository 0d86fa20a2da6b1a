//! A real Kubernetes control plane for tests, benches and the sandbox: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler built from their Go modules
//! (`hack/control-plane/`), started as plain processes on loopback, plus what kubelets and the
//! EBS CSI driver would do (`kubelet`, `csi`), optionally with a real QuestDB per database pod
//! (`database`), and a proxy in front of the apiserver that counts
//! requests and injects faults (`proxy`). Never a dependency of the operator binary.
//!
//! Shortened timings (so tests take seconds, not minutes) are all in [`timings`].

pub mod binaries;
mod cache;
pub mod control_plane;
pub mod crds;
pub mod csi;
pub mod database;
pub mod hostile;
pub mod instances;
pub mod kubelet;
pub mod kubelet_api;
pub mod moto;
pub mod process;
pub mod proxy;
pub mod rbac;
pub mod timings;

pub use control_plane::{ControlPlane, ControlPlaneOptions};
pub use database::{DatabaseExit, DatabaseProcess, Databases};
#[cfg(feature = "moto")]
pub use instances::join_ec2_instances;
pub use instances::{node_name_for_instance, spawn_instance_join, InstanceChange};
pub use kubelet::{Fault as NodeFault, NodeHandle, NodeRegistration};
pub use proxy::{Fault, FaultId, Held, RequestCounts, Verb};

//! Pulling the plug from kubectl: annotating a Node `sandbox.questdb.io/fault=power-off` stops
//! its instance (EC2 reports it `stopped`) and its kubelet; `partition` stops only the kubelet's
//! heartbeats and pod updates while the instance keeps running and keeps its volume. Removing
//! the annotation heals the kubelet (a powered-off instance stays stopped in EC2).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use questdb_operator::cloud::memory::MemoryEc2;
use questdb_testenv::{ControlPlane, NodeFault};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub const FAULT_ANNOTATION: &str = "sandbox.questdb.io/fault";

pub fn spawn(
    cp: &ControlPlane,
    client: kube::Client,
    ec2: Option<Arc<MemoryEc2>>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let kubelets = cp.kubelets().clone();
    tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client);
        let mut events =
            std::pin::pin!(watcher(nodes, watcher::Config::default()).applied_objects());
        loop {
            let node = tokio::select! {
                _ = stop.cancelled() => return,
                n = events.next() => match n {
                    Some(Ok(n)) => n,
                    Some(Err(_)) => continue,
                    None => return,
                },
            };
            let Some(handle) = kubelets.get(&node.name_any()) else {
                continue;
            };
            let wanted = match node.annotations().get(FAULT_ANNOTATION).map(String::as_str) {
                Some("power-off") => NodeFault::PowerOff,
                Some("partition") => NodeFault::Partition,
                _ => NodeFault::None,
            };
            if handle.fault() == wanted {
                continue;
            }
            if wanted == NodeFault::PowerOff {
                let instance = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .and_then(|p| p.rsplit('/').next())
                    .map(str::to_string);
                if let (Some(ec2), Some(id)) = (&ec2, instance) {
                    ec2.power_off(&id);
                }
            }
            info!(node = %node.name_any(), fault = ?wanted, "sandbox fault");
            handle.set_fault(wanted);
        }
    })
}

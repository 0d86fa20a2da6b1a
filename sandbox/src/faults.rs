//! Pulling the plug from kubectl: annotating a Node `sandbox.questdb.io/fault=power-off` kills
//! its kubelet and databases while EC2 still reports the instance `running`, as it does for a
//! hardware failure (failed status checks, not a stopped state); `partition` cuts the node off:
//! its kubelet's heartbeats and pod updates stop and nothing outside reaches its databases,
//! while the instance keeps running; `kubelet-cut-off` stops only the kubelet's heartbeats and
//! pod updates, its databases still answer (the operator does not fence those); `not-ready` keeps the Lease renewing while the kubelet reports `Ready=False` (PLEG is not
//! healthy) and its databases keep running. Removing the annotation heals the kubelet: after a
//! power-off that is the power coming back (the kubelet restarts its pods as after a reboot),
//! unless the operator fenced the instance meanwhile.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use questdb_testenv::{ControlPlane, NodeFault};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub const FAULT_ANNOTATION: &str = "sandbox.questdb.io/fault";

pub fn spawn(cp: &ControlPlane, client: kube::Client, stop: CancellationToken) -> JoinHandle<()> {
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
                Some("kubelet-cut-off") => NodeFault::KubeletCutOff,
                Some("not-ready") => NodeFault::NotReady,
                _ => NodeFault::None,
            };
            if handle.fault() == wanted {
                continue;
            }
            info!(node = %node.name_any(), fault = ?wanted, "sandbox fault");
            handle.set_fault(wanted);
        }
    })
}

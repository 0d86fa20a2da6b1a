//! Pulling the plug from kubectl: annotating a Node `sandbox.questdb.io/fault=power-off` kills
//! its kubelet and databases while EC2 still reports the instance `running`, as it does for a
//! hardware failure (failed status checks, not a stopped state); `partition` cuts the node off:
//! its kubelet's heartbeats and pod updates stop and nothing outside reaches its databases,
//! while the instance keeps running; `kubelet-cut-off` stops only the kubelet's heartbeats and
//! pod updates, its databases still answer (the operator does not fence those); `not-ready` keeps the Lease renewing while the kubelet reports `Ready=False` (PLEG is not
//! healthy) and its databases keep running. Removing the annotation heals the kubelet: after a
//! power-off that is the power coming back (the kubelet restarts its pods as after a reboot),
//! unless the operator fenced the instance meanwhile.
//!
//! AWS's maintenance from kubectl: annotating a dedicated Node
//! `sandbox.questdb.io/scheduled-event=instance-retirement` (or `instance-stop`,
//! `instance-reboot`, `system-reboot`, `system-maintenance`, optionally `@<duration>`, e.g.
//! `instance-retirement@3h`; 30 minutes unless said) has the memory EC2 schedule that event for
//! the node's instance, as `DescribeInstanceStatus` then reports it; at its time a stop or
//! retirement stops the instance if it still runs.

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
pub const SCHEDULED_EVENT_ANNOTATION: &str = "sandbox.questdb.io/scheduled-event";

/// `<code>[@<duration>]`: the event's code and how far ahead it is scheduled.
fn scheduled_event(value: &str) -> Option<(String, std::time::Duration)> {
    let (code, ahead) = match value.split_once('@') {
        Some((code, ahead)) => (code, questdb_operator::cli::parse_duration(ahead).ok()?),
        None => (value, std::time::Duration::from_secs(30 * 60)),
    };
    questdb_operator::cloud::SCHEDULED_EVENT_CODES
        .contains(&code)
        .then(|| (code.to_string(), ahead))
}

pub fn spawn(
    cp: &ControlPlane,
    client: kube::Client,
    ec2: Option<std::sync::Arc<questdb_operator::cloud::memory::MemoryEc2>>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let kubelets = cp.kubelets().clone();
    tokio::spawn(async move {
        // The annotation values already scheduled, by node: a watch event repeats them.
        let mut scheduled: std::collections::HashMap<String, String> = Default::default();
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
            if let (Some(ec2), Some(value)) = (
                ec2.as_ref(),
                node.annotations().get(SCHEDULED_EVENT_ANNOTATION),
            ) {
                if scheduled.get(&node.name_any()) != Some(value) {
                    scheduled.insert(node.name_any(), value.clone());
                    match scheduled_event(value) {
                        Some((code, ahead)) => {
                            // Node names are `<instance id>.<region>.compute.internal`.
                            let name = node.name_any();
                            let instance = name.split('.').next().unwrap_or_default();
                            let id = ec2.schedule_event(
                                instance,
                                &code,
                                std::time::SystemTime::now() + ahead,
                            );
                            info!(node = %name, %code, event = %id, in_secs = ahead.as_secs(), "sandbox: EC2 scheduled event");
                        }
                        None => {
                            info!(node = %node.name_any(), %value, "sandbox: not a scheduled event (instance-retirement, instance-stop, instance-reboot, system-reboot, system-maintenance, with an optional @<duration>)")
                        }
                    }
                }
            }
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

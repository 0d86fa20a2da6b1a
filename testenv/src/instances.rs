//! EC2 instances becoming Nodes, as on a real cluster: an instance that reaches `running` boots
//! from its user data and its kubelet registers (or fails to, and the node never joins); a
//! terminated instance's kubelet stops and the cloud controller deletes its Node.

use futures::{Stream, StreamExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::kubelet::Kubelets;

/// What a cloud reports about one instance.
#[derive(Clone, Debug)]
pub enum InstanceChange {
    Running {
        id: String,
        zone: String,
        private_ip: Option<String>,
        /// As RunInstances received it (base64 or plain).
        user_data: String,
    },
    /// Stopped: the kubelet is gone, the Node stays (tainted by the cloud controller).
    Stopped {
        id: String,
    },
    Terminated {
        id: String,
    },
}

/// The Node name of an instance: EKS's resource-name hostnames, `<instance-id>.<region>.compute.internal`.
pub fn node_name_for_instance(id: &str) -> String {
    format!("{id}.{}.compute.internal", crate::control_plane::REGION)
}

/// Joins and removes Nodes as `changes` arrive, until `stop`.
pub fn spawn_instance_join(
    kubelets: Kubelets,
    changes: impl Stream<Item = InstanceChange> + Send + 'static,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut changes = std::pin::pin!(changes);
        loop {
            let change = tokio::select! {
                _ = stop.cancelled() => return,
                c = changes.next() => match c { Some(c) => c, None => return },
            };
            match change {
                InstanceChange::Running {
                    id,
                    zone,
                    private_ip,
                    user_data,
                } => {
                    let name = node_name_for_instance(&id);
                    if let Err(e) = kubelets
                        .instance_running(&name, &zone, &id, private_ip, &user_data)
                        .await
                    {
                        warn!(instance = %id, error = format!("{e:#}"), "node join failed");
                    }
                }
                InstanceChange::Stopped { id } => {
                    kubelets.instance_stopped(&node_name_for_instance(&id))
                }
                InstanceChange::Terminated { id } => {
                    kubelets.instance_terminated(&node_name_for_instance(&id))
                }
            }
        }
    })
}

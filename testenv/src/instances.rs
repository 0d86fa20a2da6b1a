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
    /// EC2 began to stop (or terminate) it: normally, the OS shuts down and flushes
    /// (`graceful`), or forced, the power goes.
    Stopping {
        id: String,
        graceful: bool,
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
                InstanceChange::Stopping { id, graceful } => {
                    kubelets.instance_stopping(&node_name_for_instance(&id), graceful)
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

#[cfg(feature = "moto")]
/// Joins every instance an EC2 endpoint (moto) runs under its private DNS name, from the user
/// data the endpoint holds, and stops a terminated one's kubelet, polling every second until
/// `stop`. EC2 has no event stream, so this is how a cloud controller sees it too. The task ends
/// with the error when an instance cannot join (its user data would not boot a node).
pub fn join_ec2_instances(
    kubelets: Kubelets,
    ec2: aws_sdk_ec2::Client,
    stop: CancellationToken,
) -> JoinHandle<anyhow::Result<()>> {
    let ipamd = ec2.clone();
    kubelets.on_pod_addresses(move |node, blocks| {
        Box::pin(assign_pod_addresses(ipamd.clone(), node, blocks))
    });
    tokio::spawn(async move {
        let mut joined: std::collections::BTreeMap<String, String> = Default::default();
        loop {
            match ec2.describe_instances().send().await {
                Ok(out) => {
                    for i in out.reservations().iter().flat_map(|r| r.instances()) {
                        let (Some(id), Some(name)) = (i.instance_id(), i.private_dns_name()) else {
                            continue;
                        };
                        match i.state().and_then(|s| s.name()).map(|n| n.as_str()) {
                            Some("running") if !joined.contains_key(id) => {
                                let user_data = ec2
                                    .describe_instance_attribute()
                                    .instance_id(id)
                                    .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
                                    .send()
                                    .await
                                    .ok()
                                    .and_then(|a| {
                                        a.user_data().and_then(|u| u.value()).map(str::to_string)
                                    })
                                    .unwrap_or_default();
                                let zone = i
                                    .placement()
                                    .and_then(|p| p.availability_zone())
                                    .unwrap_or_default();
                                let ip = i.private_ip_address().map(str::to_string);
                                if let Err(e) = kubelets
                                    .instance_running(name, zone, id, ip, &user_data)
                                    .await
                                {
                                    warn!(instance = %id, error = format!("{e:#}"), "node join failed");
                                    return Err(e.context(format!("instance {id} could not join")));
                                }
                                joined.insert(id.to_string(), name.to_string());
                            }
                            Some("shutting-down" | "terminated") => {
                                if let Some(name) = joined.remove(id) {
                                    kubelets.instance_terminated(&name);
                                }
                            }
                            _ => {}
                        }
                    }
                }
                Err(e) => {
                    warn!(error = %aws_sdk_ec2::error::DisplayErrorContext(&e), "describing instances failed")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    })
}

#[cfg(feature = "moto")]
/// The VPC CNI's ipamd at a node's start: the pod addresses `blocks` assigned to the primary
/// network interface of the instance named `node` (its private DNS name). moto has no prefix
/// delegation, so each address goes as a secondary private IP (`AssignPrivateIpAddresses`),
/// as ipamd assigns them without it.
async fn assign_pod_addresses(ec2: aws_sdk_ec2::Client, node: String, blocks: Vec<String>) {
    let filter = aws_sdk_ec2::types::Filter::builder()
        .name("private-dns-name")
        .values(node.clone())
        .build();
    let eni = match ec2.describe_instances().filters(filter).send().await {
        Ok(out) => out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .flat_map(|i| i.network_interfaces())
            .min_by_key(|n| n.attachment().and_then(|a| a.device_index()).unwrap_or(0))
            .and_then(|n| n.network_interface_id().map(str::to_string)),
        Err(e) => {
            warn!(%node, error = %aws_sdk_ec2::error::DisplayErrorContext(&e), "describing the instance for its pod addresses failed");
            None
        }
    };
    let Some(eni) = eni else {
        warn!(%node, "no network interface to assign pod addresses to");
        return;
    };
    let addresses: Vec<String> = blocks
        .iter()
        .filter_map(|b| b.strip_suffix(".0/24"))
        .flat_map(|net| (1..=254).map(move |h| format!("{net}.{h}")))
        .collect();
    if let Err(e) = ec2
        .assign_private_ip_addresses()
        .network_interface_id(eni)
        .set_private_ip_addresses(Some(addresses))
        .send()
        .await
    {
        warn!(%node, error = %aws_sdk_ec2::error::DisplayErrorContext(&e), "assigning pod addresses failed");
    }
}

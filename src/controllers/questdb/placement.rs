//! Where a database is while it moves: whether its DNS record names a node, whether its
//! volume is still attached to one (read live: VolumeAttachments are not cached).

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use crate::api::{QuestDB, QuestDBStatus};
use crate::controllers::cloud_runtime::CloudRuntime;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired::{names, DedicatedNode};

/// The DNS record's TTL (zero without `spec.dns`): how long resolvers may still send clients
/// to an address the record no longer names.
pub(crate) fn dns_ttl(qdb: &QuestDB) -> std::time::Duration {
    std::time::Duration::from_secs(qdb.spec.dns.as_ref().map_or(0, |d| d.ttl.max(0) as u64))
}

/// The dedicated node the pod is pinned to, binding host ports as
/// [`crate::desired::statefulset::binds_host_ports`] decides for the StatefulSet that runs now.
pub(crate) fn dedicated_node(qdb: &QuestDB, ctx: &Context) -> DedicatedNode {
    let running = ctx
        .caches
        .statefulsets
        .get(&ObjectRef::new(&names::statefulset(qdb)).within(&qdb.namespace().unwrap_or_default()))
        .map(|s| s.kept.host_ports);
    DedicatedNode::for_questdb(qdb).running_with_host_ports(qdb, running)
}

/// The database pod's Node and address, as the scheduler bound it and its kubelet reports it.
pub(crate) fn pod_placement(qdb: &QuestDB, ctx: &Context) -> (Option<String>, Option<String>) {
    let Some(pod) = ctx
        .caches
        .pods
        .get(&ObjectRef::new(&names::pod(qdb)).within(&qdb.namespace().unwrap_or_default()))
    else {
        return (None, None);
    };
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .filter(|ip| !ip.is_empty());
    (pod.node_name.clone(), ip)
}

/// The database pod's address as its kubelet reports it, when the pod is bound to `node`.
pub(crate) fn pod_ip_on(qdb: &QuestDB, ctx: &Context, node: &str) -> Option<String> {
    match pod_placement(qdb, ctx) {
        (Some(bound), ip) if bound == node => ip,
        _ => None,
    }
}

/// `spec.dns` is unset (or cannot be served), or the record names `node`'s address (the
/// database pod's on it, without host ports). The DNS step writes a pod's address only once
/// EC2 shows it assigned to the instance, so a record equal to it is a verified one.
pub(crate) fn dns_follows(
    qdb: &QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    node: Option<&Node>,
) -> bool {
    match (&qdb.spec.dns, cloud.dns.as_ref(), node) {
        (Some(dns), Some(_), Some(n)) => {
            let want = if !dns.public && !dedicated_node(qdb, ctx).host_ports {
                pod_ip_on(qdb, ctx, &n.name_any())
            } else {
                let kind = if dns.public {
                    "ExternalIP"
                } else {
                    "InternalIP"
                };
                n.status
                    .as_ref()
                    .and_then(|s| s.addresses.as_ref())
                    .and_then(|a| a.iter().find(|a| a.type_ == kind))
                    .map(|a| a.address.clone())
            };
            want.is_some() && status.dns_ip == want
        }
        (Some(_), Some(_), None) => false,
        _ => true,
    }
}

/// Whether the QuestDB's volume still has a VolumeAttachment on `node`. Matched by the PV
/// name in `spec.source` (the object's name is a CSI implementation detail).
pub(crate) async fn volume_attached_to(
    qdb: &QuestDB,
    ctx: &Context,
    node: &str,
) -> Result<bool, Error> {
    let ns = qdb.namespace().unwrap_or_default();
    let pv = ctx
        .caches
        .pvcs
        .get(&ObjectRef::new(&names::pvc(qdb)).within(&ns))
        .and_then(|p| p.spec.as_ref()?.volume_name.clone());
    let Some(pv) = pv else { return Ok(false) };
    let api: Api<VolumeAttachment> = Api::all(ctx.client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(Error::Kube)?;
    Ok(list.items.iter().any(|va| {
        va.spec.node_name == node
            && va.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str())
    }))
}

/// The database pod as the cache has it, and the node it is bound to.
pub(crate) fn database_pod(
    qdb: &QuestDB,
    ctx: &Context,
) -> (
    Option<std::sync::Arc<crate::controllers::cached_pod::CachedPod>>,
    Option<String>,
) {
    let ns = qdb.namespace().unwrap_or_default();
    let pod = ctx
        .caches
        .pods
        .get(&ObjectRef::new(&names::pod(qdb)).within(&ns));
    let node = pod.as_ref().and_then(|p| p.node_name.clone());
    (pod, node)
}

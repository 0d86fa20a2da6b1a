//! Compute last: a dedicated node is released (instance terminated) only once the database
//! pod is gone, so QuestDB always gets its termination grace to close its tables and the
//! kubelet unmounts the volume before the instance goes. Terminating first leaves the pod
//! Terminating on a dead node and its volume attached until the attach-detach controller's
//! 6-minute force detach (`maxWaitForUnmountDuration` in kubernetes/kubernetes
//! pkg/controller/volume/attachdetach/reconciler/reconciler.go; see also
//! <https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/>).

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use serde_json::json;

use crate::api::{QuestDB, MANAGER};
use crate::cache::compacted::CachedStatefulSet;
use crate::cache::Caches;
use crate::controllers::Error;
use crate::desired;

/// True when no database pod exists and the StatefulSet (if any) wants none and has none.
pub(crate) fn database_stopped(qdb: &QuestDB, caches: &Caches) -> bool {
    let ns = qdb.namespace().unwrap_or_default();
    let pod = ObjectRef::new(&desired::names::pod(qdb)).within(&ns);
    if caches.pods.get(&pod).is_some() {
        return false;
    }
    let sts = ObjectRef::new(&qdb.name_any()).within(&ns);
    caches
        .statefulsets
        .get(&sts)
        .is_none_or(|s| scaled_to_zero(&s))
}

/// True while the database pod still runs on the node of the instance status records: the
/// node must not go yet when `spec.node` was removed and the pod is moving to a shared node.
pub(crate) fn pod_on_recorded_node(qdb: &QuestDB, caches: &Caches) -> bool {
    let Some(id) = qdb.status.as_ref().and_then(|s| s.instance_id.as_deref()) else {
        return false;
    };
    let nodes = caches.nodes.state();
    let Some(node) = crate::plan::node::node_for(&nodes, id) else {
        return false;
    };
    let ns = qdb.namespace().unwrap_or_default();
    let pod = ObjectRef::new(&desired::names::pod(qdb)).within(&ns);
    caches
        .pods
        .get(&pod)
        .is_some_and(|p| p.node_name.as_deref() == node.metadata.name.as_deref())
}

fn scaled_to_zero(sts: &CachedStatefulSet) -> bool {
    sts.kept.replicas == Some(0) && sts.kept.status.as_ref().is_none_or(|s| s.replicas == 0)
}

/// On deletion the StatefulSet outlives the QuestDB's finalizer (garbage collection comes
/// after), so it is scaled to zero here first. One write, only when it still wants a pod.
pub(crate) async fn scale_to_zero(
    qdb: &QuestDB,
    caches: &Caches,
    client: &kube::Client,
) -> Result<(), Error> {
    let ns = qdb.namespace().unwrap_or_default();
    let name = qdb.name_any();
    let Some(sts) = caches.statefulsets.get(&ObjectRef::new(&name).within(&ns)) else {
        return Ok(());
    };
    if sts.kept.replicas == Some(0) {
        return Ok(());
    }
    let owned =
        crate::controllers::children::controlled_by(sts.as_ref(), &qdb.uid().unwrap_or_default());
    if !owned {
        return Ok(());
    }
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(&name, &pp, &Patch::Merge(json!({"spec": {"replicas": 0}})))
        .await
        .map_err(Error::from_status_write)?;
    Ok(())
}

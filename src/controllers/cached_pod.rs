//! A database pod as the caches hold it.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

/// What the controllers read of a pod: its metadata, the node it is bound to and a trimmed
/// status (phase, conditions, addresses, and the state of a container that cannot run). The
/// pod spec (containers, volumes) is most of a pod's size and never read from the cache; it is
/// not here to be read empty. At 1,000 QuestDBs the typed `Pod` with only its node name kept
/// cost 2.2 KiB each before its strings. Made `From<Pod>` in `questdb::container_state`,
/// which decides which container statuses to keep and reads them back.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CachedPod {
    pub metadata: ObjectMeta,
    /// `spec.nodeName`: where the scheduler bound the pod.
    pub node_name: Option<String>,
    pub status: Option<PodStatus>,
}

impl Resource for CachedPod {
    type DynamicType = ();
    type Scope = <Pod as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_cache_keeps_what_the_controllers_read_of_a_pod() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "db1-0", "namespace": "t",
                         "labels": {"controller-revision-hash": "db1-7c9"},
                         "annotations": {"big": "x"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "node-a", "containers": [{"name": "questdb", "image": "q"}]},
            "status": {
                "phase": "Running", "hostIP": "10.0.0.7", "podIP": "10.1.0.9",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "questdb", "image": "q", "imageID": "",
                    "ready": true, "restartCount": 0, "state": {"running": {}}}],
                "qosClass": "Burstable"
            }
        }))
        .unwrap();
        let cached = CachedPod::from(pod.clone());
        assert_eq!(cached.node_name.as_deref(), Some("node-a"));
        assert_eq!(cached.metadata.labels, pod.metadata.labels);
        assert!(cached.metadata.annotations.is_none() && cached.metadata.managed_fields.is_none());
        let (status, was) = (cached.status.unwrap(), pod.status.unwrap());
        assert_eq!(
            (
                status.phase,
                status.conditions,
                status.host_ip,
                status.pod_ip
            ),
            (was.phase, was.conditions, was.host_ip, was.pod_ip)
        );
        assert!(status.qos_class.is_none());
        assert!(
            status.container_statuses.is_none(),
            "a healthy container's status is not kept"
        );
    }
}

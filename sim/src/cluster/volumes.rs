//! Pod → PVC → PV lookups shared by the scheduler, kubelet, attach/detach controller and
//! provisioner.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;

use super::runtime::Stores;
use super::wellknown::DEFAULT_CLASS_ANNOTATION;

/// Names of the PVCs a pod mounts.
pub(crate) fn pod_claims(pod: &Pod) -> Vec<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
        .collect()
}

/// The CSI `(driver, volumeHandle)` of a PV, if it is a CSI volume.
pub(crate) fn csi_source(pv: &PersistentVolume) -> Option<(&str, &str)> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    Some((csi.driver.as_str(), csi.volume_handle.as_str()))
}

/// The PV a claim is bound to, when both sides exist.
pub(crate) fn bound_pv(
    stores: &Stores,
    claim: &PersistentVolumeClaim,
) -> Option<Arc<PersistentVolume>> {
    let name = claim.spec.as_ref()?.volume_name.as_deref()?;
    stores.pv(name)
}

/// The PVs behind a pod's claims; `None` when any claim is missing or not yet bound.
pub(crate) fn pod_volumes(stores: &Stores, pod: &Pod) -> Option<Vec<Arc<PersistentVolume>>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    pod_claims(pod)
        .into_iter()
        .map(|claim| {
            let pvc = stores.pvc(namespace, claim)?;
            bound_pv(stores, &pvc)
        })
        .collect()
}

/// The PVs behind those of a pod's claims that are bound; the others contribute nothing yet.
pub(crate) fn pod_bound_volumes(stores: &Stores, pod: &Pod) -> Vec<Arc<PersistentVolume>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    pod_claims(pod)
        .into_iter()
        .filter_map(|claim| {
            let pvc = stores.pvc(namespace, claim)?;
            bound_pv(stores, &pvc)
        })
        .collect()
}

/// The class a claim uses: its own, or the default class when it names none (what the
/// DefaultStorageClass admission plugin would have filled in).
pub(crate) fn claim_class(
    stores: &Stores,
    claim: &PersistentVolumeClaim,
) -> Option<Arc<StorageClass>> {
    match claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
    {
        Some("") => None,
        Some(name) => stores.storage_class(name),
        None => stores.storage_classes.state().into_iter().find(|sc| {
            sc.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true")
        }),
    }
}

pub(crate) fn waits_for_first_consumer(class: &StorageClass) -> bool {
    class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
}

pub(crate) fn pod_is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

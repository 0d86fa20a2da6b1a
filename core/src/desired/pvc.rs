//! The PersistentVolumeClaim with the whole QuestDB root directory.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::labels::child_meta;
use super::names;
use super::quantity::parse_quantity;
use crate::api::QuestDB;
use crate::api::VolumeSizeReason;

/// Whether the PVC carries the QuestDB's controller reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PvcOwnership {
    /// Owned like every other child: garbage-collected with the QuestDB.
    Owned,
    /// No owner reference: the PVC (and the data) outlives the QuestDB, and a new QuestDB of the
    /// same name adopts it.
    Detached,
}

impl PvcOwnership {
    /// The ownership the PVC of `qdb` gets: detached whenever `volume.retainOnDelete` is set, so
    /// deleting the QuestDB can never take the data, even while the operator is down and
    /// whatever the deletion propagation policy. Flipping the flag attaches or detaches the
    /// existing claim on the next reconcile.
    pub fn for_questdb(qdb: &QuestDB) -> Self {
        if qdb.spec.volume.retain_on_delete {
            Self::Detached
        } else {
            Self::Owned
        }
    }
}

/// `<name>-data` with the ownership `volume.retainOnDelete` asks for (see
/// [`PvcOwnership::for_questdb`]). A retained claim carries no owner reference, so a new QuestDB
/// of the same name simply finds and mounts it.
pub fn pvc(qdb: &QuestDB) -> PersistentVolumeClaim {
    pvc_with_ownership(qdb, PvcOwnership::for_questdb(qdb))
}

/// `<name>-data`: ReadWriteOnce (one pod at a time), `spec.volume.size`, and the storage class
/// when one is given (otherwise the cluster default applies); owned or not as `ownership` says.
pub fn pvc_with_ownership(qdb: &QuestDB, ownership: PvcOwnership) -> PersistentVolumeClaim {
    let mut metadata = child_meta(qdb, names::pvc(qdb));
    if ownership == PvcOwnership::Detached {
        metadata.owner_references = None;
    }
    // None of the QuestDB's annotations: the volume machinery and backup tools act on a claim's
    // (a provisioner's selected node, a CSI driver's parameters, a backup tool's hooks), and a
    // tenant must not steer them at the database's volume.
    metadata.annotations = None;
    PersistentVolumeClaim {
        metadata,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: qdb.spec.volume.storage_class_name.clone(),
            resources: Some(storage_request(&qdb.spec.volume.size)),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// A claim's `dataSource` for a restore from the VolumeSnapshot `name` (same namespace).
pub fn snapshot_source(name: &str) -> k8s_openapi::api::core::v1::TypedLocalObjectReference {
    k8s_openapi::api::core::v1::TypedLocalObjectReference {
        api_group: Some("snapshot.storage.k8s.io".to_string()),
        kind: "VolumeSnapshot".to_string(),
        name: name.to_string(),
    }
}

fn storage_request(size: &str) -> VolumeResourceRequirements {
    VolumeResourceRequirements {
        requests: Some(BTreeMap::from([(
            "storage".to_string(),
            Quantity(size.to_string()),
        )])),
        ..VolumeResourceRequirements::default()
    }
}

/// Whether `want` asks for more than `have` (both quantities; unparsable never grows).
pub fn grows(want: &str, have: &str) -> bool {
    matches!((parse_quantity(want), parse_quantity(have)), (Some(w), Some(h)) if w > h)
}

/// What to ask of an existing claim's size, and what to tell the user about it.
#[derive(Clone, Debug, PartialEq)]
pub struct SizePlan {
    /// The size to request: never below what the claim already requests.
    pub request: String,
    /// `VolumeSizeReady`.
    pub ready: bool,
    pub reason: VolumeSizeReason,
    pub message: String,
}

/// The size to request of an existing claim that requests `have` when the spec wants `want`.
/// `expandable`: whether its StorageClass allows expansion (`None`: unknown, let the
/// apiserver decide). Volumes never shrink (the apiserver refuses it), and a class without
/// `allowVolumeExpansion` makes growing fail at admission on every reconcile: both keep the
/// current size and say so, instead of a write that can never succeed. Pure.
pub fn size_plan(want: &str, have: &str, expandable: Option<bool>, class: &str) -> SizePlan {
    let (w, h) = (parse_quantity(want), parse_quantity(have));
    let keep = |ready, reason, message: String| SizePlan {
        request: have.to_string(),
        ready,
        reason,
        message,
    };
    match (w, h) {
        _ if grows(want, have) && expandable == Some(false) => keep(
            false,
            VolumeSizeReason::NotExpandable,
            format!(
                "spec.volume.size asks for {want} but StorageClass {class} does not allow volume expansion; the volume stays at {have}"
            ),
        ),
        _ if grows(want, have) => SizePlan {
            request: want.to_string(),
            ready: true,
            reason: VolumeSizeReason::Expanding,
            message: format!("the volume is being expanded from {have} to {want}"),
        },
        (Some(w), Some(h)) if w < h => keep(
            true,
            VolumeSizeReason::Larger,
            format!("the volume requests {have}, more than spec.volume.size {want}; volumes never shrink"),
        ),
        _ => keep(true, VolumeSizeReason::AsRequested, format!("the volume requests {have}")),
    }
}

/// The storage a claim requests, as written.
pub fn requested_size(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .map(|q| q.0.clone())
}

/// What is written to an existing claim: its metadata and the size of `plan`, nothing of the
/// spec that is immutable once bound (access modes, class, volume mode).
pub fn pvc_update(desired: &PersistentVolumeClaim, request: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: desired.metadata.clone(),
        spec: Some(PersistentVolumeClaimSpec {
            resources: Some(storage_request(request)),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::labels::{child_labels, owner_references};
    use crate::desired::testing::questdb;

    #[test]
    fn a_tenants_annotations_never_reach_the_claim_or_the_generated_secret() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.metadata.annotations = Some(BTreeMap::from([
            (
                "volume.kubernetes.io/selected-node".to_string(),
                "someone-elses-node".to_string(),
            ),
            (
                "backup.velero.io/backup-volumes".to_string(),
                "data".to_string(),
            ),
            ("team".to_string(), "payments".to_string()),
        ]));
        assert_eq!(pvc(&qdb).metadata.annotations, None);
        let secret = crate::desired::credentials::generated_secret(
            &qdb,
            &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1),
        );
        let keys: Vec<_> = secret.metadata.annotations.unwrap().into_keys().collect();
        assert_eq!(
            keys,
            vec![crate::desired::credentials::GENERATED_FOR_ANNOTATION.to_string()]
        );
        // The other children still carry them (cost and ownership tools read those).
        assert_eq!(
            crate::desired::config_map(&qdb, false)
                .metadata
                .annotations
                .unwrap()["team"],
            "payments"
        );
    }

    #[test]
    fn a_volume_never_shrinks_and_a_fixed_class_is_reported_not_retried() {
        let larger = size_plan("50Gi", "100Gi", Some(true), "gp3");
        assert_eq!(larger.request, "100Gi");
        assert!(larger.ready);
        let fixed = size_plan("200Gi", "100Gi", Some(false), "gp3-fixed");
        assert_eq!(fixed.request, "100Gi");
        assert!(!fixed.ready);
        assert_eq!(fixed.reason, VolumeSizeReason::NotExpandable);
        assert!(fixed.message.contains("gp3-fixed"), "{}", fixed.message);
        let grows = size_plan("200Gi", "100Gi", Some(true), "gp3");
        assert_eq!(grows.request, "200Gi");
        let unknown = size_plan("200Gi", "100Gi", None, "gp3");
        assert_eq!(unknown.request, "200Gi", "the apiserver decides");
        let same = size_plan("100Gi", "102400Mi", Some(false), "gp3-fixed");
        assert_eq!(same.request, "102400Mi");
        assert_eq!(same.reason, VolumeSizeReason::AsRequested);
    }

    #[test]
    fn an_update_of_a_bound_claim_carries_no_immutable_field() {
        let qdb = questdb("db1", "tenant-a");
        let body = pvc_update(&pvc(&qdb), "60Gi");
        let spec = body.spec.clone().unwrap_or_default();
        assert_eq!(spec.access_modes, None);
        assert_eq!(spec.storage_class_name, None);
        assert_eq!(requested_size(&body).as_deref(), Some("60Gi"));
        assert_eq!(body.metadata, pvc(&qdb).metadata);
    }

    #[test]
    fn pvc_requests_the_volume_with_its_class() {
        let qdb = questdb("db1", "tenant-a");
        let pvc = pvc_with_ownership(&qdb, PvcOwnership::Owned);
        assert_eq!(pvc.metadata.name.as_deref(), Some("db1-data"));
        assert_eq!(pvc.metadata.namespace.as_deref(), Some("tenant-a"));
        assert_eq!(pvc.metadata.labels, Some(child_labels(&qdb)));
        assert_eq!(pvc.metadata.owner_references, Some(owner_references(&qdb)));
        let spec = pvc.spec.clone().unwrap_or_default();
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
        assert_eq!(spec.storage_class_name.as_deref(), Some("gp3"));
        assert_eq!(requested_size(&pvc).as_deref(), Some("50Gi"));
    }

    #[test]
    fn pvc_without_class_uses_the_cluster_default() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.volume.storage_class_name = None;
        let spec = pvc(&qdb).spec.unwrap_or_default();
        assert_eq!(spec.storage_class_name, None);
    }

    #[test]
    fn detached_pvc_has_no_owner_but_keeps_its_labels() {
        let qdb = questdb("db1", "tenant-a");
        let pvc = pvc_with_ownership(&qdb, PvcOwnership::Detached);
        assert_eq!(pvc.metadata.owner_references, None);
        assert_eq!(pvc.metadata.labels, Some(child_labels(&qdb)));
    }

    #[test]
    fn retained_volume_is_never_owned_by_the_questdb() {
        let mut qdb = questdb("db1", "tenant-a");
        assert!(qdb.spec.volume.retain_on_delete, "retention is the default");
        assert_eq!(PvcOwnership::for_questdb(&qdb), PvcOwnership::Detached);
        assert_eq!(pvc(&qdb).metadata.owner_references, None);

        qdb.spec.volume.retain_on_delete = false;
        assert_eq!(PvcOwnership::for_questdb(&qdb), PvcOwnership::Owned);
        assert_eq!(
            pvc(&qdb).metadata.owner_references,
            Some(owner_references(&qdb))
        );
    }
}

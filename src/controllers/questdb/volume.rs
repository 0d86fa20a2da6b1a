//! The volume step, first in every reconcile: the PVC (and a `retainOnDelete` flip, and a
//! size growth) before anything that could run the database on it.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::ResourceExt;
use tracing::debug;

use crate::api::QuestDB;
use crate::api::VolumeSizeReason;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired;
use crate::plan::conditions::Verdict;

use super::apply::Applier;

/// Applies the PVC; returns `VolumeSizeReady` once the claim exists (or was created just now).
///
/// A retained PVC never carries an owner reference, not even while the QuestDB lives: data must
/// survive a deletion even when the operator is down or a finalizer is removed by hand.
///
/// `restore_from` names the VolumeSnapshot a claim that does not exist yet is created from.
pub(crate) async fn step(
    applier: &mut Applier<'_>,
    qdb: &QuestDB,
    restore_from: Option<&str>,
) -> Result<Option<Verdict<VolumeSizeReason>>, Error> {
    let mut pvc = desired::pvc(qdb);
    if pvc.metadata.owner_references.is_none() {
        // An explicit empty list makes the merge patch drop an owner reference left from
        // retainOnDelete: false.
        pvc.metadata.owner_references = Some(Vec::new());
    }
    let existing = applier.cached::<PersistentVolumeClaim>(&pvc.name_any());
    let have = existing.as_deref().and_then(desired::requested_size);
    let new_claim = existing.is_none();
    let (Some(existing), Some(have)) = (existing, have) else {
        if let (true, Some(snapshot), Some(spec)) = (new_claim, restore_from, pvc.spec.as_mut()) {
            spec.data_source = Some(desired::pvc::snapshot_source(snapshot));
        }
        let what = super::apply::described::<PersistentVolumeClaim>(&pvc.name_any());
        applier.apply(pvc).await?;
        // A claim this reconcile created requests exactly the spec's size: saying so now spares
        // the status a write of its own once the claim reaches the cache.
        let created = applier.report.created(&what);
        let want = qdb.spec.volume.size.as_str();
        return Ok(created.then(|| size_condition(&desired::size_plan(want, want, None, ""))));
    };
    let want = qdb.spec.volume.size.as_str();
    let class = existing
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    // The StorageClass is read only when it matters: when the size grows.
    let expandable = if desired::pvc::grows(want, &have) && !class.is_empty() {
        storage_class_expands(applier.context(), &class).await
    } else {
        None
    };
    let mut plan = desired::size_plan(want, &have, expandable, &class);
    let grown = desired::pvc_update(&pvc, &plan.request);
    if expandable.is_some() || plan.request == have {
        pvc = grown;
    } else {
        // The class could not be read (a namespaced install has no StorageClass grant): the
        // apiserver's resize admission decides, and its refusal is the answer.
        match applier.apply(grown).await {
            Err(Error::Write {
                source: kube::Error::Api(e),
                ..
            }) if refused_resize(&e) => {
                plan = desired::size_plan(want, &have, Some(false), &class);
                pvc = desired::pvc_update(&pvc, &plan.request);
            }
            other => {
                other?;
                return Ok(Some(size_condition(&plan)));
            }
        }
    }
    applier.apply(pvc).await?;
    Ok(Some(size_condition(&plan)))
}

fn size_condition(plan: &desired::SizePlan) -> Verdict<VolumeSizeReason> {
    Verdict::new(plan.ready, plan.reason, plan.message.clone())
}

/// The PersistentVolumeClaimResize admission plugin's refusal of a claim whose StorageClass
/// does not allow expansion (plugin/pkg/admission/storage/persistentvolume/resize: 403, "only
/// dynamically provisioned pvc can be resized and the storageclass that provisions the pvc
/// must support resize").
pub(super) fn refused_resize(e: &kube::core::Status) -> bool {
    e.code == 403 && e.message.contains("must support resize")
}

/// `allowVolumeExpansion` of a StorageClass; `None` when it cannot be read (the apiserver's
/// admission then has the last word).
pub(super) async fn storage_class_expands(ctx: &Context, class: &str) -> Option<bool> {
    let api: Api<StorageClass> = Api::all(ctx.client.clone());
    match api.get_opt(class).await {
        Ok(Some(sc)) => Some(sc.allow_volume_expansion == Some(true)),
        Ok(None) => Some(false),
        Err(e) => {
            debug!(storage_class = %class, error = %e, "could not read the StorageClass");
            None
        }
    }
}

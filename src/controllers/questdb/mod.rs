//! The QuestDB controller: observe (caches) -> validate -> build (pure) -> apply (only what
//! differs) -> status (only when it differs). A reconcile of a converged QuestDB makes no write.

pub mod cloud;
pub mod failover;
mod ilp;
mod node_marks;
pub mod outcome;
mod placement;
mod record;
pub mod status;
#[cfg(test)]
mod status_tests;
mod stop_first;
pub mod upgrade;

use std::sync::Arc;

use crate::controllers::conditions::reasons;
use crate::controllers::Next;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::api::{conditions, QuestDB, MANAGER};
use crate::controllers::children::{self, Applied};
use crate::controllers::conditions::Verdict;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired;

pub const CONTROLLER_NAME: &str = "questdb";

/// How often a converged QuestDB is looked at again even without any event (a safety net for
/// missed events; it makes no write when nothing changed).
const RESYNC: std::time::Duration = std::time::Duration::from_secs(300);

pub async fn reconcile(qdb: Arc<QuestDB>, ctx: Arc<Context>) -> Result<Next, Error> {
    let ns = qdb.namespace().ok_or(Error::MissingNamespace)?;
    if qdb.meta().deletion_timestamp.is_some() {
        return finalize(qdb, &ctx).await;
    }
    let uid = qdb.uid().ok_or(Error::MissingUid)?;
    let mut observed = status::Observed::default();

    if let Err(problems) = desired::validate(&qdb) {
        observed.invalid = problems.iter().map(ToString::to_string).collect();
        let note = observed.invalid.join("; ");
        if !already_reported_invalid(&qdb, &note) {
            warn!(questdb = %qdb.name_any(), problems = %note, "invalid QuestDB spec");
            ctx.event(
                &qdb,
                EventType::Warning,
                reasons::INVALID_SPEC,
                "Validate",
                note,
            )
            .await;
        }
        write_status(&qdb, &ctx, &observed).await?;
        return Ok(Next::AwaitChange);
    }

    // Cloud steps write status (intent before side effects), so they work on an owned copy
    // whose resourceVersion follows those writes; the final status write then builds on it.
    let mut current = (*qdb).clone();
    let wants_finalizer = (ctx.cloud.is_some() && cloud::wants_finalizer(&current))
        || !current.spec.volume.retain_on_delete;
    if wants_finalizer && !cloud::has_finalizer(&current) {
        // Before any cloud resource exists and before the PVC carries an owner reference, so a
        // deletion can never skip its cleanup nor outrun a retainOnDelete flip.
        cloud::set_finalizer(&mut current, &ctx, true).await?;
    }
    // Data first: the PVC (and a retainOnDelete flip) before any other step.
    sync_pvc(&ctx, &current, &uid, &ns, &mut observed).await?;
    // A paused database keeps its node until its pod has stopped (the StatefulSet below is
    // scaled to zero first).
    let release = current.spec.paused && stop_first::database_stopped(&current, &ctx.caches);
    // spec.node removed: the unpinned pod moves to a shared node first, then the node goes.
    let hold = current.spec.node.is_none()
        && !current.spec.paused
        && stop_first::pod_on_recorded_node(&current, &ctx.caches);
    let cloud_out = cloud::reconcile(&mut current, &ctx, release, hold).await?;
    let qdb = Arc::new(current);

    let auth = ilp::resolve(&qdb, &ctx).await?;
    observed.ilp_auth = auth.condition.clone();

    let ilp_enabled = qdb.spec.ilp_auth.enabled;
    let config = desired::config_map(&qdb, ilp_enabled);
    let auth_map = auth
        .file
        .as_deref()
        .map(|txt| desired::ilp_auth_config_map(&qdb, txt));
    let mut mounted: Vec<&ConfigMap> = vec![&config];
    if let Some(a) = &auth_map {
        mounted.push(a);
    }
    let hash = desired::config_hash(&mounted);
    let sts = desired::statefulset(&qdb, &hash, ilp_enabled, cloud_out.dedicated.as_ref());

    let c = &ctx.caches;
    sync(&ctx, &qdb, &uid, &ns, &c.configmaps, config, &mut observed).await?;
    if let Some(a) = auth_map {
        sync(&ctx, &qdb, &uid, &ns, &c.configmaps, a, &mut observed).await?;
    } else {
        // ILP auth turned off: the auth file the pod no longer mounts goes too.
        let name = desired::names::ilp_auth_config_map(&qdb);
        let existing = c.configmaps.get(&ObjectRef::new(&name).within(&ns));
        if let Some(cm) = existing.filter(|cm| children::controlled_by(cm.as_ref(), &uid)) {
            children::delete_owned(&Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns), &cm)
                .await
                .map_err(Error::Kube)?;
            info!(questdb = %qdb.name_any(), child = %name, "deleted (ILP auth disabled)");
            observed.changed.push(format!("ConfigMap {name}"));
        }
    }
    match desired::network_policy(&qdb) {
        Some(np) => {
            sync(
                &ctx,
                &qdb,
                &uid,
                &ns,
                &c.network_policies,
                np,
                &mut observed,
            )
            .await?
        }
        None => {
            // Switched off: the policy the operator made goes (never one it does not control).
            let name = desired::names::network_policy(&qdb);
            let existing = c.network_policies.get(&ObjectRef::new(&name).within(&ns));
            if let Some(np) = existing.filter(|n| children::controlled_by(n.as_ref(), &uid)) {
                let api = Api::<NetworkPolicy>::namespaced(ctx.client.clone(), &ns);
                children::delete_owned(&api, &np)
                    .await
                    .map_err(Error::Kube)?;
                info!(questdb = %qdb.name_any(), child = %name, "deleted (network policy off)");
                observed.changed.push(format!("NetworkPolicy {name}"));
            }
        }
    }
    let svc_headless = desired::headless_service(&qdb);
    let svc_client = desired::client_service(&qdb);
    sync(
        &ctx,
        &qdb,
        &uid,
        &ns,
        &c.services,
        svc_headless,
        &mut observed,
    )
    .await?;
    sync(
        &ctx,
        &qdb,
        &uid,
        &ns,
        &c.services,
        svc_client,
        &mut observed,
    )
    .await?;
    let sts_name = sts.name_any();
    // A blocked child (another application's PVC or ConfigMap with a colliding name) is never
    // mounted: the StatefulSet waits until the conflict is resolved.
    if observed.blocked.is_empty() {
        sync(&ctx, &qdb, &uid, &ns, &c.statefulsets, sts, &mut observed).await?;
    }

    let sts_obj = c.statefulsets.get(&ObjectRef::new(&sts_name).within(&ns));
    let pod_obj = c
        .pods
        .get(&ObjectRef::new(&desired::names::pod(&qdb)).within(&ns));
    let node_obj = pod_obj
        .as_ref()
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
        .and_then(|n| c.nodes.get(&ObjectRef::new(&n)));
    observed.statefulset = sts_obj.as_deref();
    observed.pod = pod_obj.as_deref();
    observed.node = node_obj.as_deref();
    observed.cloud = Some(&cloud_out);

    publish_applied(&qdb, &ctx, &observed.applied).await;
    write_status(&qdb, &ctx, &observed).await?;
    let next = if observed.changed.is_empty() && observed.blocked.is_empty() {
        RESYNC
    } else {
        // Our own writes come back as watch events, and a blocking child usually belongs to a
        // predecessor of the same name that garbage collection is about to remove; this is only
        // a backstop.
        std::time::Duration::from_secs(30)
    };
    Ok(Next::RequeueAfter(
        cloud_out.requeue.map_or(next, |r| r.min(next)),
    ))
}

/// A retained PVC never carries an owner reference, not even while the QuestDB lives: data must
/// survive a deletion even when the operator is down or a finalizer is removed by hand.
async fn sync_pvc(
    ctx: &Context,
    qdb: &QuestDB,
    uid: &str,
    ns: &str,
    observed: &mut status::Observed<'_>,
) -> Result<(), Error> {
    let mut pvc = desired::pvc(qdb);
    if pvc.metadata.owner_references.is_none() {
        // An explicit empty list makes the merge patch drop an owner reference left from
        // retainOnDelete: false.
        pvc.metadata.owner_references = Some(Vec::new());
    }
    let name = pvc.name_any();
    let existing = ctx.caches.pvcs.get(&ObjectRef::new(&name).within(ns));
    let have = existing.as_deref().and_then(desired::requested_size);
    if let (Some(existing), Some(have)) = (existing.as_deref(), have) {
        let want = qdb.spec.volume.size.as_str();
        let class = existing
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default();
        // The StorageClass is read only when it matters: when the size grows.
        let expandable = if desired::pvc::grows(want, &have) && !class.is_empty() {
            storage_class_expands(ctx, &class).await
        } else {
            None
        };
        let plan = desired::size_plan(want, &have, expandable, &class);
        observed.volume_size = Some(Verdict::new(
            conditions::VOLUME_SIZE_READY,
            plan.ready,
            plan.reason,
            plan.message.clone(),
        ));
        let grown = desired::pvc_update(&pvc, &plan.request);
        if expandable.is_some() || plan.request == have {
            pvc = grown;
        } else {
            // The class could not be read (a namespaced install has no StorageClass grant):
            // the apiserver's resize admission decides, and its refusal is the answer.
            match sync(ctx, qdb, uid, ns, &ctx.caches.pvcs, grown, observed).await {
                Err(Error::Kube(kube::Error::Api(e))) if refused_resize(&e) => {
                    let plan = desired::size_plan(want, &have, Some(false), &class);
                    observed.volume_size = Some(Verdict::new(
                        conditions::VOLUME_SIZE_READY,
                        plan.ready,
                        plan.reason,
                        plan.message.clone(),
                    ));
                    pvc = desired::pvc_update(&pvc, &plan.request);
                }
                other => return other,
            }
        }
    }
    sync(ctx, qdb, uid, ns, &ctx.caches.pvcs, pvc, observed).await
}

/// The PersistentVolumeClaimResize admission plugin's refusal of a claim whose StorageClass
/// does not allow expansion (plugin/pkg/admission/storage/persistentvolume/resize: 403, "only
/// dynamically provisioned pvc can be resized and the storageclass that provisions the pvc
/// must support resize").
fn refused_resize(e: &kube::core::Status) -> bool {
    e.code == 403 && e.message.contains("must support resize")
}

/// `allowVolumeExpansion` of a StorageClass; `None` when it cannot be read (the apiserver's
/// admission then has the last word).
async fn storage_class_expands(ctx: &Context, class: &str) -> Option<bool> {
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

/// Deletion: release the node and the DNS record, then let the QuestDB go. Children carry
/// owner references (the retained PVC none), so garbage collection does the rest.
async fn finalize(qdb: Arc<QuestDB>, ctx: &Context) -> Result<Next, Error> {
    if !cloud::has_finalizer(&qdb) {
        return Ok(Next::AwaitChange);
    }
    match release_and_unblock(qdb, ctx).await {
        // A reconcile queued before the finalizer went finds the object already gone.
        Err(Error::Kube(kube::Error::Api(s))) if s.code == 404 => Ok(Next::AwaitChange),
        other => other,
    }
}

async fn release_and_unblock(qdb: Arc<QuestDB>, ctx: &Context) -> Result<Next, Error> {
    let mut current = (*qdb).clone();
    if current.spec.volume.retain_on_delete {
        // Data first: a retainOnDelete flip that raced the delete still keeps the volume, as
        // the PVC loses our owner reference before the finalizer goes.
        let uid = current.uid().ok_or(Error::MissingUid)?;
        let ns = current.namespace().ok_or(Error::MissingNamespace)?;
        let name = desired::names::pvc(&current);
        let ours = ctx
            .caches
            .pvcs
            .get(&ObjectRef::new(&name).within(&ns))
            .is_some_and(|p| children::controlled_by(p.as_ref(), &uid));
        if ours {
            let mut observed = status::Observed::default();
            sync_pvc(ctx, &current, &uid, &ns, &mut observed).await?;
        }
    }
    if !stop_first::database_stopped(&current, &ctx.caches) {
        stop_first::scale_to_zero(&current, &ctx.caches, &ctx.client).await?;
        debug!(questdb = %current.name_any(), "waiting for the database pod to stop before releasing its node");
        // The pod's deletion is a watch event; this is a backstop.
        return Ok(Next::RequeueAfter(cloud::WAITING_SYNC));
    }
    let out = cloud::reconcile(&mut current, ctx, true, false).await?;
    if !out.released {
        if ctx.cloud.is_none() {
            let note = "the operator runs without a cloud provider; the finalizer stays until the instance and DNS record recorded in status are cleaned up".to_string();
            ctx.event(
                &current,
                EventType::Warning,
                "CleanupBlocked",
                "Finalize",
                note,
            )
            .await;
            return Ok(Next::RequeueAfter(RESYNC));
        }
        return Ok(Next::RequeueAfter(
            out.requeue.unwrap_or(cloud::WAITING_SYNC),
        ));
    }
    info!(questdb = %current.name_any(), "cloud resources released; removing the finalizer");
    cloud::set_finalizer(&mut current, ctx, false).await?;
    Ok(Next::AwaitChange)
}

fn already_reported_invalid(qdb: &QuestDB, note: &str) -> bool {
    qdb.status.as_ref().is_some_and(|s| {
        s.observed_generation == qdb.metadata.generation
            && s.conditions.iter().any(|c| {
                c.type_ == crate::api::conditions::SPEC_VALID
                    && c.reason == reasons::INVALID_SPEC
                    && c.message == note
            })
    })
}

/// Brings one child in line with `desired`, reading the current state from `cache`.
async fn sync<K>(
    ctx: &Context,
    qdb: &QuestDB,
    uid: &str,
    ns: &str,
    cache: &Store<K>,
    mut desired: K,
    observed: &mut status::Observed<'_>,
) -> Result<(), Error>
where
    K: desired::OwnedChild
        + Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let name = desired.name_any();
    let kind = K::kind(&()).to_string();
    if K::SERVER_SIDE_APPLY {
        children::stamp_applied_hash(&mut desired);
    }
    let existing = cache.get(&ObjectRef::new(&name).within(ns));
    let action = children::decide(&desired, existing.as_deref(), uid);
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let what = format!("{kind} {name}");
    let mut applied = children::apply(&api, &desired, existing.as_deref(), &action).await;
    if matches!(applied, Ok(Applied::Stale)) && action == children::ChildAction::Create {
        // The object exists but is not in our cache: created a moment ago, or stripped of the
        // operator's labels (the caches only see labelled children). Decide on the live object.
        let live = api.get_opt(&name).await.map_err(Error::Kube)?;
        let action = children::decide(&desired, live.as_ref(), uid);
        applied = children::apply(&api, &desired, live.as_ref(), &action).await;
    }
    match applied {
        Ok(Applied::Unchanged) => {}
        Ok(Applied::Blocked(by)) => {
            let note = format!("{what} is controlled by {by}; leaving it alone");
            // One Warning per distinct conflict: the status already names reported ones.
            let reported = qdb.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.reason == reasons::CHILD_CONFLICT
                        && c.message.split(", ").any(|m| m.ends_with(&what))
                })
            });
            if !reported {
                ctx.event(
                    qdb,
                    EventType::Warning,
                    reasons::CHILD_CONFLICT,
                    "Reconcile",
                    note,
                )
                .await;
            }
            observed.blocked.push(what);
        }
        Ok(Applied::Stale) => {
            debug!(child = %what, "cache behind the apiserver; will retry");
            return Err(Error::StaleCache(what));
        }
        Ok(done) => {
            let (reason, verb) = match done {
                Applied::Created => ("Created", "created"),
                Applied::Adopted => ("Adopted", "adopted"),
                _ => ("Updated", "updated"),
            };
            info!(questdb = %qdb.name_any(), child = %what, "{verb}");
            observed.applied.push((reason, what.clone()));
            observed.changed.push(what);
        }
        Err(e) => {
            ctx.event(
                qdb,
                EventType::Warning,
                "ApplyFailed",
                "Reconcile",
                format!(
                    "could not apply {what}: {}",
                    crate::controllers::short_error(&e)
                ),
            )
            .await;
            return Err(Error::Kube(e));
        }
    }
    Ok(())
}

/// Replaces the status only when it differs; `replace_status` carries the cached
/// resourceVersion so a concurrent writer yields a conflict instead of being overwritten.
async fn write_status(
    qdb: &QuestDB,
    ctx: &Context,
    observed: &status::Observed<'_>,
) -> Result<(), Error> {
    let new = status::compute(qdb, observed, Timestamp::now());
    let old = qdb.status.clone().unwrap_or_default();
    if old == new {
        return Ok(());
    }
    let mut obj = qdb.clone();
    obj.status = Some(new.clone());
    obj.metadata.managed_fields = None;
    let api: Api<QuestDB> =
        Api::namespaced(ctx.client.clone(), &qdb.namespace().unwrap_or_default());
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    api.replace_status(&qdb.name_any(), &pp, &obj)
        .await
        .map_err(Error::from_status_write)?;
    // Counted once it is written: a conflict retry would otherwise count the same transition
    // twice.
    ctx.metrics_conditions(&old.conditions, &new.conditions);
    Ok(())
}

/// A QuestDB the operator cannot parse (e.g. written against another schema version): it is
/// left alone, said once in the log and as a Warning event, and every other QuestDB carries on.
pub async fn report_unreadable(
    obj: &crate::controllers::context::GuardedQuestDB,
    invalid: &kube::core::error_boundary::InvalidObject,
    ctx: &Context,
) -> Result<Next, Error> {
    warn!(
        questdb = %obj.name_any(),
        namespace = obj.namespace().unwrap_or_default(),
        error = %invalid.error,
        "cannot read this QuestDB; leaving it alone until it changes"
    );
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(format!("{}/v1beta1", crate::api::GROUP)),
        kind: Some("QuestDB".into()),
        name: invalid.metadata.name.clone(),
        namespace: invalid.metadata.namespace.clone(),
        uid: invalid.metadata.uid.clone(),
        resource_version: invalid.metadata.resource_version.clone(),
        ..Default::default()
    };
    ctx.event_for(
        &reference,
        EventType::Warning,
        "Unreadable",
        "Reconcile",
        format!("the operator cannot read this QuestDB: {}", invalid.error),
    )
    .await;
    Ok(Next::AwaitChange)
}

/// One event per reason and reconcile ("created ConfigMap a, Service b, ..."), not one per child:
/// fewer writes, and every child named. kube's recorder folds events with the same key into one
/// series that keeps its first note, so the action carries a digest of the note: a repeat of the
/// same change is counted in its series, a different change is a new event.
async fn publish_applied(qdb: &QuestDB, ctx: &Context, applied: &[(&'static str, String)]) {
    for reason in ["Created", "Adopted", "Updated"] {
        let what: Vec<&str> = applied
            .iter()
            .filter(|(r, _)| *r == reason)
            .map(|(_, w)| w.as_str())
            .collect();
        if what.is_empty() {
            continue;
        }
        let note = format!("{} {}", reason.to_lowercase(), what.join(", "));
        let digest = {
            use sha2::Digest;
            hex::encode(&sha2::Sha256::digest(note.as_bytes())[..4])
        };
        ctx.event(
            qdb,
            EventType::Normal,
            reason,
            &format!("Reconcile-{digest}"),
            note,
        )
        .await;
    }
}

//! Carries out [`crate::plan::version_upgrade`]: observes (the caches; the VolumeSnapshot
//! read live only while it is cut, the API asked only when an upgrade is about to stop the
//! database), records the step before its side effect, and performs one side effect per pass.
//! A database whose StatefulSet runs `spec.image` costs no read and no write.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::info;

use crate::api::{QuestDB, VersionUpgradeReason};
use crate::controllers::backup::snapshot;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired;
use crate::plan::backup::Snapshot;
use crate::plan::conditions::Verdict;
use crate::plan::version_upgrade::{self as plan, Claim, Decision, PodState, Say, SnapshotState};
use crate::runtime::clock;

use super::{record, status};

/// Annotation on a PersistentVolume a rollback kept: the QuestDB it was the volume of.
pub(crate) const KEPT_BY_ROLLBACK_ANNOTATION: &str = "crd.questdb.io/kept-by-version-rollback";

/// What the rest of the reconcile builds with.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// The image the StatefulSet runs (`None`: `spec.image`) and whether it is stopped.
    pub image: Option<String>,
    pub stopped: bool,
    /// A claim created now comes from this VolumeSnapshot (a rollback's).
    pub restore_snapshot: Option<String>,
    /// The `VersionUpgrade` condition, when there is something to say.
    pub condition: Option<Verdict<VersionUpgradeReason>>,
    /// Look again after this long.
    pub again: Option<Duration>,
}

pub(crate) async fn step(qdb: &mut QuestDB, ctx: &Context) -> Result<Outcome, Error> {
    let ns = qdb.namespace().ok_or(Error::MissingNamespace)?;
    let caches = &ctx.caches;
    let sts = caches
        .statefulsets
        .get(&ObjectRef::new(&desired::names::statefulset(qdb)).within(&ns));
    let record = qdb.status.as_ref().and_then(|s| s.version_upgrade.clone());
    let sts_image = sts.as_ref().and_then(|s| s.kept.image.clone());
    if record.is_none() && sts_image.as_deref().is_none_or(|i| i == qdb.spec.image) {
        // Converged: nothing read, nothing written.
        return Ok(Outcome::default());
    }
    let pod = caches
        .pods
        .get(&ObjectRef::new(&desired::names::pod(qdb)).within(&ns));
    let claim = caches
        .pvcs
        .get(&ObjectRef::new(&desired::names::pvc(qdb)).within(&ns));
    let pod_state = match (&pod, &sts) {
        (None, _) => PodState::Gone,
        (Some(p), Some(s)) if status::ready_on_template(s, p) => PodState::Ready {
            image: s.kept.image.as_deref().unwrap_or_default(),
        },
        (Some(p), _) => PodState::NotReady {
            ran: status::database_ran(p),
        },
    };
    let trouble = pod
        .as_deref()
        .and_then(super::container_state::trouble)
        .map(|t| t.message);
    let claim_view = claim.as_ref().and_then(|c| {
        Some(Claim {
            uid: c.metadata.uid.as_deref()?,
            volume: c.spec.as_ref().and_then(|s| s.volume_name.as_deref()),
        })
    });
    let snapshot_state = match record.as_ref() {
        Some(r) if r.step == crate::api::VersionUpgradeStep::Snapshotting => {
            match r.snapshot.as_deref() {
                Some(name) => observe_snapshot(ctx, qdb, &ns, name).await?,
                None => SnapshotState::NotLooked,
            }
        }
        _ => SnapshotState::NotLooked,
    };
    let status_now = qdb.status.clone().unwrap_or_default();
    let busy = busy(qdb, ctx, &status_now);
    let name = qdb.name_any();
    let spec = qdb.spec.clone();
    let mut view = plan::View {
        name: &name,
        spec_image: &spec.image,
        generation: qdb.metadata.generation.unwrap_or_default(),
        record: record.as_ref(),
        statefulset_image: sts_image.as_deref(),
        has_data: status_now.data_version.is_some(),
        policy: &spec.version_upgrade,
        busy,
        pod: pod_state,
        trouble: trouble.as_deref(),
        pod_created: pod
            .as_ref()
            .and_then(|p| p.metadata.creation_timestamp.as_ref())
            .map(|t| t.0),
        snapshot: snapshot_state,
        snapshot_api: None,
        claim: claim_view,
        now: clock::now().0,
    };
    let mut decision = plan::decide(&view);
    // The API is asked only before an upgrade stops the database: held then, nothing stops.
    if matches!(&decision, Decision::Record(r, _) if r.step == crate::api::VersionUpgradeStep::Stopping)
    {
        let served = snapshot::api_served(&ctx.client, &ns)
            .await
            .map_err(Error::Kube)?;
        view.snapshot_api = Some(served);
        decision = plan::decide(&view);
    }
    let now = view.now;
    let pod_created = view.pod_created;
    let (again, finished) = perform(qdb, ctx, &ns, record.as_ref(), decision).await?;
    let record = qdb.status.as_ref().and_then(|s| s.version_upgrade.as_ref());
    let t = plan::template(record, &spec.image);
    Ok(Outcome {
        image: (t.image != spec.image).then(|| t.image.to_string()),
        stopped: t.stopped,
        restore_snapshot: plan::restore_snapshot(record).map(str::to_string),
        condition: finished
            .or_else(|| record.map(|r| plan::verdict(r, &spec.version_upgrade, pod_created, now))),
        again,
    })
}

/// Takes `decision`'s step: records it, or acts once (a snapshot, the old volume released)
/// and records the outcome. Returns how soon to look again and, when the upgrade finished,
/// its verdict.
async fn perform(
    qdb: &mut QuestDB,
    ctx: &Context,
    ns: &str,
    record: Option<&crate::api::VersionUpgradeStatus>,
    decision: Decision,
) -> Result<(Option<Duration>, Option<Verdict<VersionUpgradeReason>>), Error> {
    let name = qdb.name_any();
    let mut again = None;
    let mut finished = None;
    match decision {
        Decision::None | Decision::Wait(None) => {}
        Decision::Wait(Some(d)) => again = Some(d),
        Decision::Record(next, say) => {
            info!(questdb = %name, step = %next.step, from = %next.from_image, to = %next.to_image, "version upgrade step");
            record::persist(qdb, ctx, |s| s.version_upgrade = Some(next.clone())).await?;
            say_it(ctx, qdb, say).await;
            // The watch event of the write starts the next pass; this is the backstop.
            again = Some(Duration::from_secs(2));
        }
        Decision::Finish(say) => {
            info!(questdb = %name, "version upgrade done");
            record::persist(qdb, ctx, |s| s.version_upgrade = None).await?;
            finished = Some(Verdict::new(
                true,
                VersionUpgradeReason::NewVersionRunning,
                say.message.clone(),
            ));
            say_it(ctx, qdb, Some(say)).await;
        }
        Decision::Clear(say) => {
            info!(questdb = %name, "version upgrade ended: the image is set back");
            record::persist(qdb, ctx, |s| s.version_upgrade = None).await?;
            say_it(ctx, qdb, say).await;
        }
        Decision::CreateSnapshot { name: snap } => {
            create_snapshot(ctx, qdb, ns, &snap).await?;
            again = Some(plan::SNAPSHOT_POLL);
        }
        Decision::ReleaseVolume { volume, claim_uid } => {
            match release_volume(ctx, qdb, ns, volume.as_deref(), &claim_uid).await {
                Err(Error::Kube(kube::Error::Api(e))) if e.code == 403 => {
                    // A namespaced install may not touch PersistentVolumes: the claim is never
                    // deleted without its volume kept.
                    if let Some(r) = record {
                        let (next, say) = plan::volume_not_kept(r, &e.message);
                        record::persist(qdb, ctx, |s| s.version_upgrade = Some(next.clone()))
                            .await?;
                        say_it(ctx, qdb, Some(say)).await;
                    }
                }
                other => other?,
            }
            again = Some(Duration::from_secs(2));
        }
    }
    Ok((again, finished))
}

/// What holds a version step back now: a pause, a failover, a node move, a backup holding the
/// checkpoint.
fn busy(qdb: &QuestDB, ctx: &Context, status_now: &crate::api::QuestDBStatus) -> Option<String> {
    if qdb.spec.paused {
        Some("the database is paused".to_string())
    } else if crate::plan::failover::in_progress(status_now) {
        Some("a failover is under way".to_string())
    } else if crate::plan::node_move::in_progress(status_now) {
        Some("a node move is under way".to_string())
    } else {
        super::node_move::steps::backup_holding_checkpoint(qdb, ctx).map(|backup| {
            format!("backup {backup} holds the database's checkpoint: stopping it now would fail the backup")
        })
    }
}

async fn say_it(ctx: &Context, qdb: &QuestDB, say: Option<Say>) {
    let Some(say) = say else { return };
    let type_ = if say.warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    ctx.event(qdb, type_, say.reason, "VersionUpgrade", say.message)
        .await;
}

/// The pre-upgrade snapshot, if it is this database's (by owner uid).
async fn observe_snapshot(
    ctx: &Context,
    qdb: &QuestDB,
    ns: &str,
    name: &str,
) -> Result<SnapshotState, Error> {
    let uid = qdb.meta().uid.clone();
    let ours = |obj: &kube::api::DynamicObject| {
        obj.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == uid.as_ref())
    };
    let seen = snapshot::observe_named(&ctx.client, ns, name, ours)
        .await
        .map_err(Error::Kube)?;
    Ok(match seen {
        Snapshot::ApiMissing => SnapshotState::ApiMissing,
        Snapshot::Absent => SnapshotState::Absent,
        Snapshot::NotOurs => SnapshotState::Failed(format!(
            "a VolumeSnapshot {name} exists and is not this database's"
        )),
        Snapshot::Pending { cut } => SnapshotState::Pending { cut },
        Snapshot::Ready { .. } => SnapshotState::Ready,
        Snapshot::Error(e) => SnapshotState::Failed(e),
    })
}

/// A VolumeSnapshot of the database's claim, owned by the QuestDB (it goes with it).
async fn create_snapshot(ctx: &Context, qdb: &QuestDB, ns: &str, name: &str) -> Result<(), Error> {
    let class = qdb
        .spec
        .version_upgrade
        .volume_snapshot_class_name
        .as_deref();
    let spec = snapshot::spec_of(&desired::names::pvc(qdb), class);
    let mut obj = kube::api::DynamicObject::new(name, &snapshot::resource())
        .within(ns)
        .data(json!({"spec": spec}));
    obj.metadata.labels = Some(desired::labels::child_labels(qdb));
    obj.metadata.owner_references = qdb.controller_owner_ref(&()).map(|mut o| {
        o.controller = Some(false);
        vec![o]
    });
    snapshot::create_once(&ctx.client, ns, &obj)
        .await
        .map_err(Error::Kube)?;
    info!(questdb = %qdb.name_any(), snapshot = %name, "pre-upgrade snapshot asked for");
    Ok(())
}

/// Keeps the PersistentVolume the new version ran on (`Retain`, annotated with its database),
/// then deletes its claim, named by uid: never a claim made since.
async fn release_volume(
    ctx: &Context,
    qdb: &QuestDB,
    ns: &str,
    volume: Option<&str>,
    claim_uid: &str,
) -> Result<(), Error> {
    if let Some(pv) = volume {
        let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
        let patch = json!({
            "metadata": {"annotations": {KEPT_BY_ROLLBACK_ANNOTATION: format!("{ns}/{}", qdb.name_any())}},
            "spec": {"persistentVolumeReclaimPolicy": "Retain"},
        });
        api.patch(pv, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::Kube)?;
        info!(questdb = %qdb.name_any(), volume = %pv, "the volume the new version ran on is kept (Retain)");
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(claim_uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&desired::names::pvc(qdb), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

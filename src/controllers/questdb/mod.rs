//! The QuestDB controller: observe (caches) -> validate -> build (pure) -> apply (only what
//! differs) -> status (only when it differs). A reconcile of a converged QuestDB makes no write.

mod apply;
pub(crate) mod cloud;
mod config_reload;
pub(crate) mod container_state;
mod credentials;
mod disk;
mod dns;
pub(crate) mod failover;
mod ilp;
mod machine;
mod node;
mod node_marks;
pub(crate) mod node_move;
pub mod operator_rollout;
pub(crate) mod outcome;
mod placement;
mod record;
mod restore;
mod server_conf;
pub(crate) mod status;
pub mod status_write;
mod stop_first;
mod version_upgrade;
mod volume;

use std::sync::Arc;

use crate::api::EventReason;
use crate::controllers::Next;
use k8s_openapi::api::core::v1::ConfigMap;

use crate::controllers::cached_pod::CachedPod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::api::QuestDB;
use crate::controllers::children;
use crate::controllers::context::Context;
use crate::controllers::refusals;
use crate::controllers::{During, Error, Stage};
use crate::desired;
use apply::{Applier, Report};
use status_write::{write_status, Coalesce};

pub(crate) const CONTROLLER_NAME: &str = "questdb";

/// How often a converged QuestDB is looked at again even without any event (a safety net for
/// missed events; it makes no write when nothing changed).
const RESYNC: std::time::Duration = std::time::Duration::from_secs(300);

/// Every database's backup-age gauges exist from its first reconcile, at its creation: a
/// database never backed up (or never verified) is as old to the alerts as its age, instead
/// of having no series at all. A backup's own time only ever raises them.
fn backup_age_series(qdb: &QuestDB, ctx: &Context) {
    let Some(created) = qdb.metadata.creation_timestamp.as_ref() else {
        return;
    };
    // A backup's throwaway verification database is nobody's database to back up.
    if qdb.labels().contains_key(crate::api::VERIFIES_LABEL) {
        return;
    }
    let (ns, name) = (qdb.namespace().unwrap_or_default(), qdb.name_any());
    let at = created.0.as_second();
    ctx.metrics.last_successful_backup(&ns, &name, at);
    ctx.metrics.last_verified_backup(&ns, &name, at);
}

/// `BackupVerified`, from the backup controller's cache (absent until it runs).
fn backup_verified(
    qdb: &QuestDB,
    ctx: &Context,
) -> Option<crate::plan::conditions::Verdict<crate::api::BackupVerifiedReason>> {
    let ns = qdb.namespace()?;
    let backups = ctx.backups.get()?.state();
    let mine: Vec<&crate::api::QuestDBBackup> = backups
        .iter()
        .map(|b| b.as_ref())
        .filter(|b| b.namespace().as_deref() == Some(ns.as_str()))
        .filter(|b| b.spec.questdb_name == qdb.name_any())
        .collect();
    crate::controllers::backup::verify::database_verdict(&mine)
}

/// One reconcile, as named stages: validate, finalizer, storage (restore gate, version upgrade,
/// volume), cloud (the turns `plan::cloud` gives: release fences, failover, node move, the
/// dedicated node, DNS; a recorded step ends the reconcile there), children (ILP auth,
/// credentials, server.conf, the rest), observe (StatefulSet, pod, node, refusals), the
/// database's own steps (config reload, disk), status, next look. Each stage reads what the ones
/// before it produced.
pub(crate) async fn reconcile(qdb: Arc<QuestDB>, ctx: Arc<Context>) -> Result<Next, Error> {
    qdb.namespace().ok_or(Error::MissingNamespace)?;
    if qdb.meta().deletion_timestamp.is_some() {
        return finalize(qdb, &ctx).await.during(Stage::Deletion);
    }
    qdb.uid().ok_or(Error::MissingUid)?;
    backup_age_series(&qdb, &ctx);
    if let Err(problems) = desired::validate_with(&qdb, &ctx.tenancy) {
        return invalid_spec(&qdb, &ctx, &problems).await;
    }
    // The finalizer and a version upgrade's records write the object: an owned copy follows
    // them (its resourceVersion) into the stages after.
    let mut current = (*qdb).clone();
    finalizer_step(&mut current, &ctx)
        .await
        .during(Stage::Finalizer)?;
    let mut storage = match storage_stage(&mut current, &ctx).await? {
        Ok(storage) => storage,
        Err(blocked) => return Ok(blocked),
    };
    // One applier for the pass: the volume's writes first, then the children's.
    let mut applier = Applier::new(&ctx, &current, Report::default())?;
    storage.volume_size = volume::step(&mut applier, &current, storage.restore_from.as_deref())
        .await
        .during(Stage::Volume)?;
    let cloud_out = cloud::stage(&current, &ctx).await.during(Stage::Cloud)?;
    if cloud_out.recorded {
        return Ok(ended_by_a_cloud_record(&current, &ctx, &applier.report, &cloud_out).await);
    }
    let applied = children_stage(&current, &ctx, &cloud_out, &storage.upgrade, applier)
        .await
        .during(Stage::Children)?;
    let mut qdb = current;
    let seen = Observed::read(&qdb, &ctx);
    let database = database_stage(&mut qdb, &ctx, &applied, &seen).await?;
    let converged = applied.report.changed.is_empty() && applied.report.blocked.is_empty();
    let changed = applied.report.changed.len();
    let again = [
        applied.roll_held,
        database.config.again,
        storage.upgrade.again,
        cloud_out.requeue,
    ];
    let inputs = status_inputs(&qdb, &ctx, &seen, applied, storage, database, &cloud_out);
    let deferred = write_status(&qdb, &ctx, &inputs, Coalesce::Progress)
        .await
        .during(Stage::Status)?;
    let next = again
        .into_iter()
        .chain([deferred])
        .flatten()
        .fold(seen.next_look(&qdb, converged), std::time::Duration::min);
    debug!(
        questdb = %qdb.name_any(),
        pod_ready = seen.pod.as_deref().map(status::pod_ready),
        pod_revision = seen.pod.as_deref().and_then(status::pod_revision),
        revisions = ?seen.sts.as_ref().and_then(|s| s.kept.status.as_ref()).map(|s| {
            (s.current_revision.clone(), s.update_revision.clone(), s.updated_replicas)
        }),
        changed,
        status_held = ?deferred,
        next = ?next,
        "reconciled"
    );
    Ok(Next::RequeueAfter(next))
}
/// What the storage stage settled: the restore gate's verdict and the snapshot a new volume
/// comes from, a version upgrade's step, and (once the volume step ran) the volume's size
/// verdict.
struct Storage {
    restored: Option<crate::plan::conditions::Verdict<crate::api::RestoreReason>>,
    restore_from: Option<String>,
    upgrade: version_upgrade::Outcome,
    volume_size: Option<crate::plan::conditions::Verdict<crate::api::VolumeSizeReason>>,
}

/// The restore gate, then a version upgrade's step (before the volume: a rollback's claim
/// comes from the pre-upgrade snapshot). `Err(next)`: the restore's source is not there yet,
/// nothing is built (no volume, no node, no pod) and the status says why.
async fn storage_stage(
    current: &mut QuestDB,
    ctx: &Context,
) -> Result<Result<Storage, Next>, Error> {
    let (restore_from, restored) = match restore::gate(current, ctx).await.during(Stage::Restore)? {
        restore::Gate::Open(verdict) => (None, verdict),
        restore::Gate::Create {
            snapshot,
            condition,
        } => (Some(snapshot), Some(condition)),
        restore::Gate::Blocked(verdict, retry) => {
            let inputs = status::StatusInputs {
                restore: Some(verdict),
                ..Default::default()
            };
            write_status(current, ctx, &inputs, Coalesce::Never)
                .await
                .during(Stage::Status)?;
            return Ok(Err(retry.map_or(Next::AwaitChange, Next::RequeueAfter)));
        }
    };
    let upgrade = version_upgrade::step(current, ctx)
        .await
        .during(Stage::VersionUpgrade)?;
    Ok(Ok(Storage {
        restored,
        restore_from: restore_from.or(upgrade.restore_snapshot.clone()),
        upgrade,
        volume_size: None,
    }))
}

/// A cloud step was recorded: the reconcile ends, and the watch event of its write starts the
/// next (the requeue is a backstop). The volume's writes of this pass are news all the same.
async fn ended_by_a_cloud_record(
    qdb: &QuestDB,
    ctx: &Context,
    volume: &Report,
    cloud_out: &cloud::CloudOutcome,
) -> Next {
    volume.publish(qdb, ctx).await;
    debug!(questdb = %qdb.name_any(), "a cloud step was recorded; the watch event of its write starts the next reconcile");
    let backstop = std::time::Duration::from_secs(30);
    Next::RequeueAfter(cloud_out.requeue.map_or(backstop, |d| d.min(backstop)))
}

/// What the database's own steps after its children decided.
struct Database {
    config: config_reload::Outcome,
    disk: disk::DiskOut,
}

/// The database's own steps, once its children are written: a settings reload (or restart),
/// the disk (the claim exists; the poll's last look says how full it is).
async fn database_stage(
    qdb: &mut QuestDB,
    ctx: &Context,
    applied: &Applied,
    seen: &Observed,
) -> Result<Database, Error> {
    let pg_digest = applied.creds.usable.as_ref().map(|(_, _, pg)| pg.as_str());
    let config = config_reload::step(qdb, ctx, &applied.marks, seen.pod.as_deref(), pg_digest)
        .await
        .during(Stage::ConfigReload)?;
    let disk = disk::step(qdb, ctx).await.during(Stage::Disk)?;
    Ok(Database { config, disk })
}

/// What the status is computed from, gathered from every stage.
fn status_inputs<'a>(
    qdb: &QuestDB,
    ctx: &Context,
    seen: &'a Observed,
    applied: Applied,
    storage: Storage,
    database: Database,
    cloud_out: &'a cloud::CloudOutcome,
) -> status::StatusInputs<'a> {
    status::StatusInputs {
        statefulset: seen.sts.as_deref(),
        pod: seen.pod.as_deref(),
        pod_refused: seen.pod_refused.clone(),
        volume_pending: seen.volume_pending.clone(),
        node: seen.node.as_deref(),
        children: applied.report,
        ilp_auth: applied.ilp_auth,
        credentials: Some(applied.creds.condition),
        credentials_secret: Some(applied.creds.secret),
        volume_size: storage.volume_size,
        restore: storage.restored,
        write_health: crate::controllers::context::polled(qdb, &ctx.write_health),
        backup_verified: backup_verified(qdb, ctx),
        checkpoint: crate::controllers::context::polled(qdb, &ctx.checkpoints),
        cloud: Some(cloud_out),
        config: database.config.status,
        version_upgrade: storage.upgrade.condition,
        disk_space: database.disk.condition,
        disk: database.disk.status,
        ..Default::default()
    }
}

/// What the children stage applied and what the stages after it read from it.
struct Applied {
    report: Report,
    ilp_auth: Option<crate::plan::conditions::Verdict<crate::api::IlpAuthReason>>,
    creds: credentials::Resolution,
    /// The StatefulSet held for an operator rollout slot: look again within this long.
    roll_held: Option<std::time::Duration>,
    /// The template's config marks, which the reload step compares with the running pod's.
    marks: config_reload::TemplateMarks,
}

/// The children: ILP auth and credentials resolved, every child built from the spec and the
/// cloud stage's pinning, the server.conf Secret written before the StatefulSet that mounts
/// it, then the rest; the report's news published as events.
async fn children_stage(
    qdb: &QuestDB,
    ctx: &Context,
    cloud_out: &cloud::CloudOutcome,
    upgrade: &version_upgrade::Outcome,
    mut applier: Applier<'_>,
) -> Result<Applied, Error> {
    let auth = ilp::resolve(qdb, ctx).await?;
    let creds = credentials::resolve(qdb, ctx).await?;
    let mut wanted = desired::children(
        qdb,
        auth.file.as_deref(),
        creds.seen(),
        cloud_out.dedicated.as_ref(),
    );
    // A version change runs the image (and replica count) of its step.
    if upgrade.image.is_some() || upgrade.stopped {
        let image = upgrade.image.as_deref().unwrap_or(&qdb.spec.image);
        wanted.statefulset = desired::statefulset::with_version(
            wanted.statefulset,
            &qdb.spec.image,
            image,
            upgrade.stopped,
        );
    }
    // The StatefulSet runs only on a volume it knows the identity of (see
    // `with_volume_instance_id`): the claim just made is in the cache on the next reconcile.
    let volume_uid = ctx
        .caches
        .pvcs
        .get(
            &ObjectRef::new(&desired::names::pvc(qdb)).within(&qdb.namespace().unwrap_or_default()),
        )
        .and_then(|p| p.uid());
    let volume_known = volume_uid.is_some();
    if let Some(uid) = &volume_uid {
        wanted.statefulset = desired::statefulset::with_volume_instance_id(wanted.statefulset, uid);
    }
    if let Some(ns) = &ctx.operator_namespace {
        wanted.network_policy = wanted
            .network_policy
            .map(|np| desired::network_policy::admit_operator(np, ns));
    }
    // A change the running version would not reload restarts the database (`status.config`).
    let restarted_for = qdb
        .status
        .as_ref()
        .and_then(|s| s.config.as_ref())
        .and_then(|c| c.restarted_for.clone());
    wanted.statefulset =
        desired::statefulset::with_config_restart(wanted.statefulset, restarted_for.as_deref());
    let marks = {
        let (config_hash, restarted_for) = desired::statefulset::config_marks(&wanted.statefulset);
        config_reload::TemplateMarks {
            config_hash: config_hash.map(str::to_string),
            restarted_for: restarted_for.map(str::to_string),
        }
    };
    // Before the StatefulSet: its pod reads server.conf from this Secret.
    let written = server_conf::step(qdb, ctx, &creds, wanted.server_conf()).await?;
    applier.record(written).await;
    let roll_held = children_step(&mut applier, qdb, wanted, volume_known).await?;
    let report = applier.report;
    report.publish(qdb, ctx).await;
    Ok(Applied {
        report,
        ilp_auth: auth.condition,
        creds,
        roll_held,
        marks,
    })
}

/// The database's StatefulSet, pod and node as the caches show them after the children stage,
/// and, for a pod that is missing or waits, what the events say about why.
struct Observed {
    sts: Option<Arc<crate::cache::compacted::CachedStatefulSet>>,
    pod: Option<Arc<CachedPod>>,
    node: Option<Arc<k8s_openapi::api::core::v1::Node>>,
    /// The StatefulSet wants a pod and has none.
    pod_missing: bool,
    pod_refused: Option<String>,
    /// The pod is not scheduled and its claim is Pending.
    volume_waits: bool,
    volume_pending: Option<String>,
    /// A scheduler's refusal of an unscheduled pod on a shared node counts only after a while.
    refusal_ripens: bool,
}

impl Observed {
    fn read(qdb: &QuestDB, ctx: &Context) -> Self {
        let c = &ctx.caches;
        let ns = qdb.namespace().unwrap_or_default();
        let sts = c
            .statefulsets
            .get(&ObjectRef::new(&desired::names::statefulset(qdb)).within(&ns));
        let pod = c
            .pods
            .get(&ObjectRef::new(&desired::names::pod(qdb)).within(&ns));
        let node = pod
            .as_ref()
            .and_then(|p| p.node_name.clone())
            .and_then(|n| c.nodes.get(&ObjectRef::new(&n)));
        // Without a pod, the StatefulSet controller may have been refused one: only its events
        // say.
        let pod_missing = matches!((&sts, &pod), (Some(s), None) if wants_a_pod(s));
        // Events are read live: only once the database has waited a while, not on every
        // reconcile of a pod that is merely on its way (creation, a restart).
        let waited = waited_long_enough(qdb, Timestamp::now());
        let pod_refused = match &sts {
            Some(sts) if pod_missing && waited => pod_refusal(ctx, &ns, &sts.name_any()),
            _ => None,
        };
        let unscheduled = pod.as_ref().is_some_and(|p| p.node_name.is_none());
        // The scheduler's refusal counts only once it has lasted a while, and no event says
        // when that is: look again (a dedicated node's pod waits for its node, which the
        // node's own events report).
        let refusal_ripens = unscheduled && qdb.spec.node.is_none();
        // A pod waiting for its volume: only the claim's events say why the claim is unbound.
        let volume_waits = unscheduled
            && c.pvcs
                .get(&ObjectRef::new(&desired::names::pvc(qdb)).within(&ns))
                .is_some_and(|claim| {
                    claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
                });
        let volume_pending = if volume_waits && waited {
            volume_refusal(ctx, &ns, &desired::names::pvc(qdb))
        } else {
            None
        };
        Observed {
            sts,
            pod,
            node,
            pod_missing,
            pod_refused,
            volume_waits,
            volume_pending,
            refusal_ripens,
        }
    }

    /// When to look again without an event: the resync for a converged database, the end of a
    /// refusal's grace for one waiting on its pod or volume, a backstop otherwise.
    fn next_look(&self, qdb: &QuestDB, converged: bool) -> std::time::Duration {
        if converged && !self.pod_missing && !self.volume_waits && !self.refusal_ripens {
            RESYNC
        } else if converged {
            // The pod, the claim and the refusal events that say why either is missing all
            // wake the database; only time does not: a refusal counts once the database (or
            // the scheduler's refusal) has waited its grace. Look again then, and at worst
            // later.
            refusals_ripen_in(qdb, self.pod.as_deref(), Timestamp::now())
                .map_or(WAITING_BACKSTOP, |d| d.min(WAITING_BACKSTOP))
        } else {
            // Our own writes come back as watch events, and a blocking child usually belongs
            // to a predecessor of the same name that garbage collection is about to remove;
            // this is only a backstop.
            std::time::Duration::from_secs(30)
        }
    }
}

/// How long a database is not Ready before the events may say why: a pod on its way is
/// usually there within a second, and each look is an uncached list.
const LOOK_FOR_REFUSALS_AFTER: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether `Ready` has not been True for [`LOOK_FOR_REFUSALS_AFTER`] (a QuestDB without a
/// status yet has not waited at all).
fn waited_long_enough(qdb: &QuestDB, now: Timestamp) -> bool {
    let Some(ready) = qdb.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == crate::api::conditions::READY)
    }) else {
        return false;
    };
    ready.status != "True"
        && now.duration_since(ready.last_transition_time.0).as_secs()
            >= LOOK_FOR_REFUSALS_AFTER.as_secs() as i64
}

/// How long a database waiting for its pod or volume goes without a look when no event
/// comes: a backstop, since the events that would change its status all wake it.
const WAITING_BACKSTOP: std::time::Duration = std::time::Duration::from_secs(30);

/// When the next grace a refusal waits out ends, if one is still running: the database's
/// [`LOOK_FOR_REFUSALS_AFTER`] since `Ready` went False, the scheduler's
/// [`container_state::SCHEDULER_RETRY_GRACE`] since `PodScheduled` did. Timestamps are whole
/// seconds, so a little is added to land after the second the grace ends.
fn refusals_ripen_in(
    qdb: &QuestDB,
    pod: Option<&CachedPod>,
    now: Timestamp,
) -> Option<std::time::Duration> {
    let ready = qdb.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == crate::api::conditions::READY && c.status != "True")
            .map(|c| (c.last_transition_time.0, LOOK_FOR_REFUSALS_AFTER))
    });
    let scheduled = pod
        .and_then(container_state::not_scheduled)
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| (t.0, container_state::SCHEDULER_RETRY_GRACE));
    [ready, scheduled]
        .into_iter()
        .flatten()
        .filter_map(|(since, grace)| {
            let waited = now.duration_since(since).as_secs();
            let left = grace.as_secs() as i64 - waited;
            (left > 0).then(|| std::time::Duration::from_secs(left as u64) + RIPEN_MARGIN)
        })
        .min()
}

/// Added to a grace's end: past the whole second it ends in.
const RIPEN_MARGIN: std::time::Duration = std::time::Duration::from_millis(200);

/// How recent a `FailedCreate` event must be to explain a missing pod (events live an hour; an
/// old refusal since resolved must not explain a pod that is merely being replaced).
const REFUSAL_FRESH: std::time::Duration = std::time::Duration::from_secs(120);

fn wants_a_pod(sts: &crate::cache::compacted::CachedStatefulSet) -> bool {
    sts.replicas() > 0
}

/// The StatefulSet controller's newest `FailedCreate` message for `sts`, if recent.
fn pod_refusal(ctx: &Context, ns: &str, sts: &str) -> Option<String> {
    refusals::newest_cached(
        &ctx.caches.refusals,
        ns,
        "StatefulSet",
        sts,
        &[refusals::FAILED_CREATE],
        REFUSAL_FRESH,
    )
}

/// The newest recent word on the unbound claim `pvc` from the persistent volume controller
/// (`FailedBinding`) or a provisioner (`ProvisioningFailed`), from the refusal caches, read
/// while a pod waits for its claim. `WaitingForFirstConsumer` is not news: it is what a claim of a
/// `WaitForFirstConsumer` class says until its pod is scheduled.
fn volume_refusal(ctx: &Context, ns: &str, pvc: &str) -> Option<String> {
    refusals::newest_cached(
        &ctx.caches.refusals,
        ns,
        "PersistentVolumeClaim",
        pvc,
        &[refusals::FAILED_BINDING, refusals::PROVISIONING_FAILED],
        REFUSAL_FRESH,
    )
}

/// An invalid spec builds nothing: status says why, and one Warning event per distinct problem.
async fn invalid_spec(
    qdb: &QuestDB,
    ctx: &Context,
    problems: &[desired::SpecProblem],
) -> Result<Next, Error> {
    let invalid: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let note = invalid.join("; ");
    if !already_reported_invalid(qdb, &note) {
        warn!(questdb = %qdb.name_any(), problems = %note, "invalid QuestDB spec");
        ctx.event(
            qdb,
            EventType::Warning,
            EventReason::InvalidSpec,
            "Validate",
            note,
        )
        .await;
    }
    let inputs = status::StatusInputs {
        invalid,
        ..Default::default()
    };
    write_status(qdb, ctx, &inputs, Coalesce::Never).await?;
    Ok(Next::AwaitChange)
}

/// Before any cloud resource exists and before the PVC carries an owner reference, so a
/// deletion can never skip its cleanup nor outrun a retainOnDelete flip.
async fn finalizer_step(qdb: &mut QuestDB, ctx: &Context) -> Result<(), Error> {
    let wanted =
        (ctx.cloud.is_some() && cloud::wants_finalizer(qdb)) || !qdb.spec.volume.retain_on_delete;
    if wanted && !cloud::has_finalizer(qdb) {
        cloud::set_finalizer(qdb, ctx, true).await?;
    }
    Ok(())
}

/// Every child but the PVC; what is switched off goes (only if it is ours). The children the
/// pod reads are written at once (each a round trip to the apiserver, eight in a row for a new
/// database before), then the StatefulSet, which must not run a pod before they are there.
/// Applies the children; `Some`: the StatefulSet is held for an upgrade slot, look again
/// within that long.
async fn children_step(
    applier: &mut Applier<'_>,
    qdb: &QuestDB,
    wanted: desired::Children,
    volume_known: bool,
) -> Result<Option<std::time::Duration>, Error> {
    let ilp_auth = desired::names::ilp_auth_config_map(qdb);
    let network_policy = desired::names::network_policy(qdb);
    let budget = desired::names::pod_disruption_budget(qdb);
    let first = {
        let a: &Applier<'_> = applier;
        let (config, auth, np, pdb, headless, client) = futures::join!(
            a.write(wanted.config),
            async {
                match wanted.ilp_auth {
                    Some(auth) => a.write(auth).await,
                    None => a.remove::<ConfigMap>(&ilp_auth, "ILP auth disabled").await,
                }
            },
            async {
                match wanted.network_policy {
                    Some(np) => a.write(np).await,
                    None => {
                        a.remove::<NetworkPolicy>(&network_policy, "network policy off")
                            .await
                    }
                }
            },
            async {
                match wanted.pod_disruption_budget {
                    Some(pdb) => a.write(pdb).await,
                    None => {
                        a.remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(
                            &budget,
                            "no dedicated node",
                        )
                        .await
                    }
                }
            },
            a.write(wanted.headless_service),
            a.write(wanted.client_service),
        );
        [config, auth, np, pdb, headless, client]
    };
    // Every write that went through is reported, whichever failed.
    let mut failed = None;
    for written in first {
        match written {
            Ok(w) => applier.record(w).await,
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    // A blocked child (another application's PVC or ConfigMap with a colliding name) is never
    // mounted: the StatefulSet waits until the conflict is resolved.
    if applier.report.blocked.is_empty() && volume_known {
        let ctx = applier.context();
        let mut sts = wanted.statefulset;
        operator_rollout::stamp_version(&mut sts, &ctx.rolls.version);
        // A new operator version's own template change waits for an upgrade slot.
        if let Some(again) = operator_rollout::hold(ctx, qdb, &sts).await {
            return Ok(Some(again));
        }
        applier.apply(sts).await?;
    }
    Ok(None)
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
            let mut applier = Applier::new(ctx, &current, Report::default())?;
            volume::step(&mut applier, &current, None).await?;
        }
    }
    let stopped = stop_first::database_stopped(&current, &ctx.caches);
    if !stopped {
        stop_first::scale_to_zero(&current, &ctx.caches, &ctx.client).await?;
    }
    let turns = cloud::turns_for(&current, ctx, stopped);
    let since = cloud::Since::of(&current);
    // A failover under way fences its old node first: the finalizer never goes while an
    // instance that may still write runs unfenced.
    if turns.release_fence.finish_failover {
        if let Some(fencing) = failover::during_release(&mut current, ctx).await? {
            debug!(questdb = %current.name_any(), "deletion waits on a failover's fence: {fencing}");
            return Ok(Next::RequeueAfter(std::time::Duration::from_secs(2)));
        }
    }
    if turns.release_fence.fence_dead_node {
        if let Some(fencing) = failover::fence_for_release(&mut current, ctx).await? {
            debug!(questdb = %current.name_any(), "deletion waits on a dead node: {fencing}");
            return Ok(Next::RequeueAfter(std::time::Duration::from_secs(2)));
        }
    }
    if !stopped {
        debug!(questdb = %current.name_any(), "waiting for the database pod to stop before releasing its node");
        // The pod's deletion is a watch event; this is a backstop.
        return Ok(Next::RequeueAfter(cloud::WAITING_SYNC));
    }
    let out = cloud::machines(&mut current, ctx, turns, &since).await?;
    if !out.released {
        if ctx.cloud.is_none() {
            let note = "the operator runs without a cloud provider; the finalizer stays until the instance and DNS record recorded in status are cleaned up".to_string();
            ctx.event(
                &current,
                EventType::Warning,
                EventReason::CleanupBlocked,
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

/// Whether a stop or terminate was refused because the instance is not this QuestDB's.
pub(super) fn not_owned(e: &crate::cloud::CloudError) -> bool {
    matches!(e, crate::cloud::CloudError::Permanent { code, .. } if code == crate::cloud::INSTANCE_NOT_OWNED)
}

/// A step record names an instance that is not this QuestDB's (a forged status): the step
/// stops there, touches nothing, and says so in condition `c` and one Warning event.
pub(super) async fn report_not_owned<R: crate::api::ConditionReason>(
    qdb: &QuestDB,
    ctx: &Context,
    status: &crate::api::QuestDBStatus,
    c: crate::plan::conditions::Verdict<R>,
    action: &str,
) -> crate::plan::conditions::Verdict<R> {
    if !record::already_reported(status, &c) {
        warn!(questdb = %qdb.name_any(), "{}", c.message);
        ctx.event(
            qdb,
            EventType::Warning,
            EventReason::InstanceNotOwned,
            action,
            c.message.clone(),
        )
        .await;
    }
    c
}

/// The uid an instance's tags must carry for this QuestDB to stop or terminate it.
pub(super) fn owner_uid(qdb: &QuestDB) -> String {
    qdb.uid().unwrap_or_default()
}

fn already_reported_invalid(qdb: &QuestDB, note: &str) -> bool {
    qdb.status.as_ref().is_some_and(|s| {
        s.observed_generation == qdb.metadata.generation
            && s.conditions.iter().any(|c| {
                c.type_ == crate::api::conditions::SPEC_VALID
                    && c.reason == crate::api::SpecValidReason::InvalidSpec
                    && c.message == note
            })
    })
}

/// A QuestDB the operator cannot parse (e.g. written against another schema version): it is
/// left alone, said once in the log and as a Warning event, and every other QuestDB carries on.
pub(crate) async fn report_unreadable(
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
        EventReason::Unreadable,
        "Reconcile",
        format!("the operator cannot read this QuestDB: {}", invalid.error),
    )
    .await;
    Ok(Next::AwaitChange)
}

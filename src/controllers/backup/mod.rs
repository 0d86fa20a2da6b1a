//! The backup controller: one reconcile per `QuestDBBackup`, walking its steps (see
//! [`plan`]). Each step is recorded in status before its side effect; every side effect is
//! idempotent or checked (a checkpoint is the backup's only by the `started_at` it recorded, a
//! snapshot is created under the backup's name once, only the backup's own checkpoint is ever
//! released), so a manager killed at any line finds its way on. A finalizer holds the backup
//! while its checkpoint may be open.

pub mod snapshot;
pub(crate) mod verify;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::api::{
    BackupReason, BackupStep, CheckpointHolder, EventReason, Phase, QuestDB, QuestDBBackup,
    QuestDBBackupStatus, BACKUP_FINALIZER,
};
use crate::controllers::context::Context;
use crate::controllers::own_writes;
use crate::controllers::{Error, Next};
use crate::desired;
use crate::questdb_http::{Database as Db, Login, QueryError};
use crate::runtime::clock;

use crate::plan::backup as plan;
use plan::{Database, Decision, Observed, OpenCheckpoint, ReleaseAction, Snapshot, Timeouts};

pub const CONTROLLER_NAME: &str = "questdbbackup";

/// How long counting every recorded table may take in all (at the checkpoint, and again in a
/// verification's restore).
pub(crate) const TABLE_FACTS_BUDGET: Duration = Duration::from_secs(60);

/// What the backup reconciles share beyond the manager's context.
pub(crate) struct BackupContext {
    pub ctx: Arc<Context>,
    /// The controller's own cache of backups (who holds which database's checkpoint).
    pub backups: Store<QuestDBBackup>,
    pub timeouts: Timeouts,
    /// Database (namespace/name) -> the backup that claimed its checkpoint in this process: two
    /// backups reconciled at once must not both see the database free.
    claims: Mutex<HashMap<(String, String), String>>,
    /// Reconcile requests for backups a change elsewhere lets go on (see [`plan::next_in_queue`]).
    wake: Wake,
}

/// Sends reconcile requests to the backup controller.
pub(crate) type Wake = futures::channel::mpsc::UnboundedSender<ObjectRef<QuestDBBackup>>;

impl BackupContext {
    pub(crate) fn new(
        ctx: Arc<Context>,
        backups: Store<QuestDBBackup>,
        timeouts: Timeouts,
        wake: Wake,
    ) -> Self {
        Self {
            ctx,
            backups,
            timeouts,
            claims: Mutex::default(),
            wake,
        }
    }
}

/// The waiting backups a change of the QuestDB `questdb` wakes (see
/// [`plan::waiting_on_database`]).
pub(crate) fn woken_by_questdb(
    backups: &Store<QuestDBBackup>,
    questdb: &ObjectRef<crate::controllers::keys::GuardedQuestDB>,
) -> Vec<ObjectRef<QuestDBBackup>> {
    let Some(ns) = questdb.namespace.as_deref() else {
        return vec![];
    };
    plan::waiting_on_database(&backups.state(), ns, &questdb.name)
        .map(|b| ObjectRef::from_obj(&**b))
        .collect()
}

/// `backup` ended or went away: the oldest backup queued behind it goes next.
fn wake_next(bctx: &BackupContext, backup: &QuestDBBackup) {
    let ns = backup.namespace().unwrap_or_default();
    let state = bctx.backups.state();
    if let Some(next) = plan::next_in_queue(&state, &ns, &backup.spec.questdb_name) {
        let _ = bctx.wake.unbounded_send(ObjectRef::from_obj(&**next));
    }
}

pub(crate) async fn reconcile(
    backup: Arc<QuestDBBackup>,
    bctx: Arc<BackupContext>,
) -> Result<Next, Error> {
    let ns = backup.namespace().ok_or(Error::MissingNamespace)?;
    let ctx = &bctx.ctx;
    let api: Api<QuestDBBackup> = Api::namespaced(ctx.client.clone(), &ns);
    let mut current = (*backup).clone();
    let status = current.status.clone().unwrap_or_default();

    if current.metadata.deletion_timestamp.is_some() {
        return finalize(&mut current, &bctx).await;
    }
    let step = status.step;
    if step.is_some_and(BackupStep::is_final) {
        note_final(&current, ctx);
        release_claim(&bctx, &current);
        wake_next(&bctx, &current);
        if has_finalizer(&current) {
            set_finalizer(&api, &mut current, false).await?;
        }
        if step == Some(BackupStep::Succeeded) && current.spec.verify {
            return verify::step(&mut current, &bctx).await;
        }
        return Ok(Next::AwaitChange);
    }
    // A waiting backup holds nothing a deletion must release: the finalizer is added right
    // before the checkpoint is claimed (below), and a backup past that step always has it.
    // So a tenant's hundreds of waiting backups cost the shared workers one status write each.
    if step.is_some_and(|s| s != BackupStep::Pending) && !has_finalizer(&current) {
        set_finalizer(&api, &mut current, true).await?;
    }
    if step.is_none() {
        // Recorded with the first decision's own status write (its wait reason, or the
        // checkpoint step), not in a write of its own.
        let mut s = status.clone();
        s.step = Some(BackupStep::Pending);
        s.started_at = Some(clock::now());
        current.status = Some(s);
    }

    // Queued behind another backup of the same database: decided from the caches alone, so
    // a tenant's hundreds of pending backups cost the shared workers no database or API call
    // (each would otherwise ask its database and the snapshot API every poll) and another
    // tenant's backup is not queued behind them.
    if current.status.as_ref().and_then(|s| s.step) == Some(BackupStep::Pending) {
        if let Some(holder) = other_backup(&current, &bctx) {
            let status = current.status.clone().unwrap_or_default();
            let mut s = status.clone();
            s.reason = Some(BackupReason::AnotherBackupRunning.to_string());
            s.message = Some(plan::queued_behind(&holder));
            if s != status {
                write_status(&api, &mut current, s).await?;
            }
            // The end of the backup ahead wakes the oldest queued (`wake_next`).
            return Ok(Next::RequeueAfter(plan::WOKEN_WAIT_FALLBACK));
        }
    }
    // At most a few decisions per reconcile: each recorded step goes straight on to its effect.
    for _ in 0..4 {
        let obs = observe(&current, &bctx).await?;
        let status = current.status.clone().unwrap_or_default();
        let decision = plan::decide(&status, &obs.plan, bctx.timeouts);
        debug!(backup = %current.name_any(), step = ?status.step, ?decision, "backup");
        if let Some(next) = take(&api, &mut current, &bctx, obs, &status, decision).await? {
            return Ok(next);
        }
    }
    Ok(Next::RequeueAfter(Duration::from_secs(1)))
}

/// Takes one decided step: records it (each recorded step goes straight on to its effect
/// within the same reconcile) or acts. `Some`: the reconcile ends with that; `None`: decide
/// again on what this step recorded.
async fn take(
    api: &Api<QuestDBBackup>,
    current: &mut QuestDBBackup,
    bctx: &BackupContext,
    obs: Observation,
    status: &QuestDBBackupStatus,
    decision: Decision,
) -> Result<Option<Next>, Error> {
    let ctx = &bctx.ctx;
    match decision {
        Decision::Done => return Ok(Some(Next::AwaitChange)),
        Decision::Wait {
            reason,
            message,
            requeue,
        } => {
            release_claim(bctx, current);
            let mut s = status.clone();
            s.step = Some(BackupStep::Pending);
            s.reason = Some(reason.to_string());
            s.message = Some(message);
            if s != *status {
                write_status(api, current, s).await?;
            }
            return Ok(Some(Next::RequeueAfter(requeue)));
        }
        Decision::StartCheckpoint(holder) => {
            if !claim(bctx, current) {
                return Ok(Some(Next::RequeueAfter(Duration::from_secs(2))));
            }
            if !has_finalizer(current) {
                // Before anything could open a checkpoint: a deletion then always
                // releases it.
                let status = current.status.clone();
                set_finalizer(api, current, true).await?;
                // The patch answers with the stored status; the step decided on stays.
                current.status = status;
            }
            let mut s = status.clone();
            s.step = Some(BackupStep::Checkpointing);
            s.checkpoint = Some(holder);
            s.reason = None;
            s.message = None;
            write_status(api, current, s).await?;
            if status.step == Some(BackupStep::Pending) {
                event(
                    ctx,
                    current,
                    EventType::Normal,
                    EventReason::BackupStarted,
                    format!("checkpointing QuestDB {}", current.spec.questdb_name),
                )
                .await;
            }
        }
        Decision::Checkpoint => return open_checkpoint(api, current, bctx, obs, status).await,
        Decision::ReleaseOwn => {
            let Some(db) = obs.db else {
                return Ok(Some(Next::RequeueAfter(Duration::from_secs(2))));
            };
            if let Err(e) = db.checkpoint_release().await {
                warn!(backup = %current.name_any(), error = %e, "CHECKPOINT RELEASE of the backup's unconfirmed checkpoint failed; retrying");
                return Ok(Some(Next::RequeueAfter(Duration::from_secs(5))));
            }
            info!(backup = %current.name_any(), "released the backup's own checkpoint, whose CREATE was never confirmed; opening a new one");
        }
        Decision::CreateSnapshot => {
            snapshot::create(&ctx.client, current, &obs.pvc)
                .await
                .map_err(Error::Kube)?;
            return Ok(Some(Next::RequeueAfter(Duration::from_secs(1))));
        }
        Decision::Poll(d) => return Ok(Some(Next::RequeueAfter(d))),
        Decision::Release { failure } => {
            let mut s = status.clone();
            s.step = Some(BackupStep::Releasing);
            if let Some((reason, message)) = failure {
                s.failed = true;
                s.reason = Some(reason.to_string());
                s.message = Some(message);
            }
            write_status(api, current, s).await?;
        }
        Decision::FinishRelease => {
            if let Some(retry) = release_own(current, &obs, bctx.timeouts).await {
                return Ok(Some(retry));
            }
            release_claim(bctx, current);
            if status.failed {
                let reason = status
                    .reason
                    .as_deref()
                    .and_then(BackupReason::parse)
                    .unwrap_or(BackupReason::BackupFailed);
                let message = status.message.clone().unwrap_or_default();
                fail(api, current, bctx, reason, message).await?;
                return Ok(Some(Next::AwaitChange));
            }
            let mut s = status.clone();
            s.step = Some(BackupStep::Uploading);
            s.released_at = Some(clock::now());
            write_status(api, current, s).await?;
            return Ok(Some(Next::RequeueAfter(Duration::from_secs(1))));
        }
        Decision::Succeed { restore_size } => {
            succeed(api, current, ctx, status, restore_size).await?;
            return Ok(Some(Next::AwaitChange));
        }
        Decision::Fail { reason, message } => {
            release_claim(bctx, current);
            fail(api, current, bctx, reason, message).await?;
            return Ok(Some(Next::AwaitChange));
        }
    }
    Ok(None)
}

/// Opens the database's checkpoint (recorded as asked for before CHECKPOINT CREATE is sent),
/// then records it and starts the volume's snapshot.
async fn open_checkpoint(
    api: &Api<QuestDBBackup>,
    current: &mut QuestDBBackup,
    bctx: &BackupContext,
    obs: Observation,
    status: &QuestDBBackupStatus,
) -> Result<Option<Next>, Error> {
    let ctx = &bctx.ctx;
    claim(bctx, current);
    let Some(db) = obs.db else {
        return Ok(Some(Next::RequeueAfter(Duration::from_secs(2))));
    };
    // Recorded before CREATE is sent: a checkpoint found open after a crash is this
    // backup's only if it started after this.
    let mut s = status.clone();
    s.checkpoint_requested_at = Some(clock::now());
    s.checkpoint_started_at = None;
    write_status(api, current, s).await?;
    match checkpoint(&db, bctx.timeouts).await {
        Ok((tables, started_at, version)) => {
            let mut s = current.status.clone().unwrap_or_default();
            s.step = Some(BackupStep::Snapshotting);
            s.questdb_version = version;
            s.checkpoint_started_at = Some(started_at);
            s.checkpoint_at = Some(clock::now());
            s.snapshot_name = Some(current.name_any());
            s.tables = tables;
            write_status(api, current, s).await?;
            event(
                ctx,
                current,
                EventType::Normal,
                EventReason::BackupCheckpointed,
                format!("checkpoint open; snapshotting volume {}", obs.pvc),
            )
            .await;
            snapshot::create(&ctx.client, current, &obs.pvc)
                .await
                .map_err(Error::Kube)?;
        }
        // Refused or unauthorized will not change by retrying.
        Err(e @ (QueryError::Refused { .. } | QueryError::Unauthorized(_))) => {
            begin_release(api, current, BackupReason::CheckpointFailed, e.to_string()).await?;
        }
        // Unanswered (a timeout, a cut connection): the next pass asks the database
        // what is open, and releases the backup's own unconfirmed checkpoint.
        Err(e) => {
            warn!(backup = %current.name_any(), error = %e, "CHECKPOINT CREATE went unanswered; asking the database what is open");
            return Ok(Some(Next::RequeueAfter(Duration::from_secs(5))));
        }
    }
    Ok(None)
}

/// Records the backup's success, counts and tells it, and lets the finalizer go.
async fn succeed(
    api: &Api<QuestDBBackup>,
    current: &mut QuestDBBackup,
    ctx: &Context,
    status: &QuestDBBackupStatus,
    restore_size: Option<String>,
) -> Result<(), Error> {
    let mut s = status.clone();
    let now = clock::now();
    s.step = Some(BackupStep::Succeeded);
    s.restore_size = restore_size;
    s.duration_seconds =
        clock::between(s.started_at.as_ref(), Some(&now)).map(|d| d.as_secs() as i64);
    s.finished_at = Some(now);
    s.reason = None;
    s.message = None;
    write_status(api, current, s.clone()).await?;
    let took = s.duration_seconds.map(|d| Duration::from_secs(d as u64));
    ctx.metrics.backup_finished(true, took);
    note_final(current, ctx);
    info!(backup = %current.name_any(), questdb = %current.spec.questdb_name, seconds = ?s.duration_seconds, "backup succeeded");
    event(
        ctx,
        current,
        EventType::Normal,
        EventReason::BackupSucceeded,
        format!(
            "snapshot {} of QuestDB {} is ready to use ({} table{})",
            current.name_any(),
            current.spec.questdb_name,
            s.tables.len(),
            if s.tables.len() == 1 { "" } else { "s" }
        ),
    )
    .await;
    set_finalizer(api, current, false).await?;
    Ok(())
}

/// What one pass observed: the plan's view, the database client and the volume's name.
struct Observation {
    plan: Observed,
    /// A client for the database's process while its pod runs (Ready or not).
    db: Option<Db>,
    pvc: String,
}

async fn observe(backup: &QuestDBBackup, bctx: &BackupContext) -> Result<Observation, Error> {
    let ctx = &bctx.ctx;
    let ns = backup.namespace().unwrap_or_default();
    let status = backup.status.clone().unwrap_or_default();
    let step = status.step.unwrap_or(BackupStep::Pending);
    let qdb = ctx
        .caches
        .questdbs
        .get(&ObjectRef::new(&backup.spec.questdb_name).within(&ns))
        .and_then(|g| g.0.as_ref().ok().cloned());
    let pvc = qdb.as_ref().map(desired::names::pvc).unwrap_or_default();
    let live = match &qdb {
        None => Live::default(),
        Some(q) => database_view(q, ctx, step).await?,
    };
    // Asked of a Ready database before a checkpoint is opened, and of the process that may
    // hold the backup's, ready or not, once one may be open.
    let ask = match step {
        BackupStep::Pending => matches!(live.database, Database::Ready(_)),
        s => BackupStep::holds_checkpoint(s),
    };
    let checkpoint = match (&live.db, ask) {
        (Some(db), true) => match db.checkpoint_started_at().await {
            Ok(Some(started_at)) => OpenCheckpoint::Open { started_at },
            Ok(None) => OpenCheckpoint::None,
            Err(e) => {
                debug!(backup = %backup.name_any(), error = %e, "checkpoint_status() unanswered");
                OpenCheckpoint::Unknown
            }
        },
        _ => OpenCheckpoint::Unknown,
    };
    let snapshot = match step {
        BackupStep::Pending if matches!(live.database, Database::Ready(_)) => {
            match snapshot::api_served(&ctx.client, &ns).await {
                Ok(true) => Snapshot::Absent,
                Ok(false) => Snapshot::ApiMissing,
                Err(e) => return Err(Error::Kube(e)),
            }
        }
        BackupStep::Snapshotting | BackupStep::Uploading => snapshot::observe(&ctx.client, backup)
            .await
            .map_err(Error::Kube)?,
        _ => Snapshot::Absent,
    };
    let plan = Observed {
        database: live.database,
        other_backup: other_backup(backup, bctx),
        checkpoint,
        holder: live.holder.clone(),
        snapshot,
        since_checkpoint: clock::since(status.checkpoint_at.as_ref()),
        since_release: clock::since(status.released_at.as_ref()),
        since_start: clock::since(status.started_at.as_ref()),
    };
    Ok(Observation {
        plan,
        db: live.db,
        pvc,
    })
}

/// The database as a backup sees it, and the process in its pod.
struct Live {
    database: Database,
    db: Option<Db>,
    holder: Option<CheckpointHolder>,
}

impl Default for Live {
    fn default() -> Self {
        Self {
            database: Database::Missing,
            db: None,
            holder: None,
        }
    }
}

/// A node move that has not stopped the database yet (validating, launching, waiting for the
/// new node).
fn move_before_its_switch(status: &crate::api::QuestDBStatus) -> bool {
    status
        .node_move
        .as_ref()
        .is_some_and(|u| crate::plan::node_move::before_stopping(u.phase))
}

/// The database as a backup sees it, and a client for the process in its pod. The pod is read
/// from the apiserver (its address and restart count are not cached), only on the way to and
/// while a checkpoint may be open; the client is there whenever the pod runs, Ready or not (a
/// checkpoint is released by asking the process that holds it, not by its readiness).
async fn database_view(qdb: &QuestDB, ctx: &Context, step: BackupStep) -> Result<Live, Error> {
    let status = qdb.status.clone().unwrap_or_default();
    let database = if qdb.metadata.deletion_timestamp.is_some() {
        Some(Database::Deleting)
    } else if crate::plan::failover::database_down(&status) {
        // Draining (the database answers; the fenced instance waits out the old record's
        // TTL, up to days) holds back nothing but that instance's termination.
        Some(Database::Busy("a failover is under way".into()))
    } else if crate::plan::node_move::in_progress(&status)
        && (step == BackupStep::Pending || !move_before_its_switch(&status))
    {
        // A backup already past Pending when a move began goes on: the move holds its switch
        // while the backup holds the checkpoint (`plan::node_move`), and the database runs
        // where it was until then.
        Some(Database::Busy("a node move is under way".into()))
    } else if status.phase != Some(Phase::Running) {
        let phase = status.phase.map(|p| p.as_str()).unwrap_or("unknown");
        Some(Database::Stopped(format!(
            "the QuestDB is {phase}, not Running"
        )))
    } else {
        None
    };
    let may_hold = BackupStep::holds_checkpoint(step);
    if !(may_hold || (step == BackupStep::Pending && database.is_none())) {
        let database = database.unwrap_or_else(|| Database::NotRunning("not needed".into()));
        return Ok(Live {
            database,
            ..Live::default()
        });
    }
    let ns = qdb.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(pod) = pods
        .get_opt(&desired::names::pod(qdb))
        .await
        .map_err(Error::Kube)?
    else {
        return Ok(Live {
            database: database
                .unwrap_or_else(|| Database::NotRunning("the database pod does not exist".into())),
            ..Live::default()
        });
    };
    let pod_status = pod.status.clone().unwrap_or_default();
    let ready = pod_status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip: Option<std::net::IpAddr> = pod_status.pod_ip.as_deref().and_then(|ip| ip.parse().ok());
    let restart_count = pod_status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == desired::CONTAINER_NAME)
        .map_or(0, |c| c.restart_count);
    let holder = CheckpointHolder {
        pod_uid: pod.uid().unwrap_or_default(),
        restart_count,
    };
    let Some(ip) = ip else {
        return Ok(Live {
            database: database
                .unwrap_or_else(|| Database::NotRunning("the database pod is not Ready".into())),
            ..Live::default()
        });
    };
    let login = match http_login(qdb, ctx).await {
        Ok(login) => login,
        Err(message) => {
            return Ok(Live {
                database: database.unwrap_or_else(|| {
                    Database::NotRunning(format!(
                        "{}: {message}",
                        BackupReason::CredentialsUnavailable
                    ))
                }),
                db: None,
                holder: Some(holder),
            })
        }
    };
    let db = Db::at(SocketAddr::new(ip, desired::HTTP_PORT as u16), Some(&login));
    let database = match database {
        Some(d) => d,
        None if ready && pod.metadata.deletion_timestamp.is_none() => {
            Database::Ready(holder.clone())
        }
        None => Database::NotRunning("the database pod is not Ready".into()),
    };
    Ok(Live {
        database,
        db: Some(db),
        holder: Some(holder),
    })
}

/// The HTTP login from the database's credentials Secret (never logged).
async fn http_login(qdb: &QuestDB, ctx: &Context) -> Result<Login, String> {
    let ns = qdb.namespace().unwrap_or_default();
    let name = desired::credentials::secret_name(qdb);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let secret = secrets
        .get_opt(&name)
        .await
        .map_err(|e| {
            format!(
                "reading Secret {name}: {}",
                crate::controllers::short_error(&e)
            )
        })?
        .ok_or_else(|| format!("Secret {name} does not exist"))?;
    Login::from_secret(&secret).ok_or_else(|| format!("Secret {name} lacks the HTTP credentials"))
}

/// Counts the tables, opens the checkpoint and reads its `started_at`. The tables are counted
/// just before CREATE, so the backup holds at least these rows (writes go on meanwhile).
async fn checkpoint(
    db: &Db,
    timeouts: Timeouts,
) -> Result<(Vec<crate::api::TableFacts>, String, Option<String>), QueryError> {
    let version = db.version().await?;
    // One request per table: a budget for all of them, so a slow database holds a backup
    // worker for a minute, not a request limit per table.
    let tables = tokio::time::timeout(TABLE_FACTS_BUDGET, db.table_facts())
        .await
        .map_err(|_| QueryError::Timeout(TABLE_FACTS_BUDGET))??;
    db.checkpoint_create(timeouts.create).await?;
    match db.checkpoint_started_at().await? {
        Some(started_at) => Ok((tables, started_at, version)),
        None => Err(QueryError::Unexpected {
            status: 200,
            body: "CHECKPOINT CREATE answered, but checkpoint_status() shows no checkpoint open"
                .into(),
        }),
    }
}

/// Releases the backup's own checkpoint if it is open (never anyone else's: RELEASE closes
/// whatever is open). `Some(next)`: the process holding it runs but did not answer, or the
/// release failed; ask again then, since a checkpoint left open fills the disk.
async fn release_own(
    backup: &QuestDBBackup,
    obs: &Observation,
    timeouts: Timeouts,
) -> Option<Next> {
    let status = backup.status.clone().unwrap_or_default();
    let holder_runs = obs.plan.holder.is_some() && obs.plan.holder == status.checkpoint;
    match plan::release_action(&status, &obs.plan.checkpoint, holder_runs, timeouts) {
        ReleaseAction::Nothing => None,
        ReleaseAction::Retry => {
            warn!(backup = %backup.name_any(), "the database holding the backup's checkpoint does not answer; asking again to release it");
            Some(Next::RequeueAfter(Duration::from_secs(5)))
        }
        ReleaseAction::Release => {
            let db = obs.db.as_ref()?;
            if let Err(e) = db.checkpoint_release().await {
                warn!(backup = %backup.name_any(), error = %e, "CHECKPOINT RELEASE failed; retrying");
                return Some(Next::RequeueAfter(Duration::from_secs(5)));
            }
            info!(backup = %backup.name_any(), "released the backup's checkpoint");
            None
        }
    }
}

/// Another backup of the same database that may hold its checkpoint (from the cache, and the
/// claims of this process).
fn other_backup(backup: &QuestDBBackup, bctx: &BackupContext) -> Option<String> {
    let ns = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let key = (ns.clone(), backup.spec.questdb_name.clone());
    if let Some(holder) = bctx.claims.lock().expect("claims lock").get(&key) {
        if *holder != name {
            return Some(holder.clone());
        }
    }
    bctx.backups
        .state()
        .iter()
        .filter(|b| b.namespace().as_deref() == Some(ns.as_str()))
        .filter(|b| b.spec.questdb_name == backup.spec.questdb_name && b.name_any() != name)
        .find(|b| {
            b.status
                .as_ref()
                .and_then(|s| s.step)
                .is_some_and(BackupStep::holds_checkpoint)
        })
        .map(|b| b.name_any())
}

fn claim_key(backup: &QuestDBBackup) -> (String, String) {
    (
        backup.namespace().unwrap_or_default(),
        backup.spec.questdb_name.clone(),
    )
}

/// Claims the database's checkpoint for `backup` in this process; false when another holds it.
fn claim(bctx: &BackupContext, backup: &QuestDBBackup) -> bool {
    let mut claims = bctx.claims.lock().expect("claims lock");
    let holder = claims
        .entry(claim_key(backup))
        .or_insert_with(|| backup.name_any());
    *holder == backup.name_any()
}

fn release_claim(bctx: &BackupContext, backup: &QuestDBBackup) {
    let mut claims = bctx.claims.lock().expect("claims lock");
    let key = claim_key(backup);
    if claims.get(&key) == Some(&backup.name_any()) {
        claims.remove(&key);
    }
}

async fn begin_release(
    api: &Api<QuestDBBackup>,
    backup: &mut QuestDBBackup,
    reason: BackupReason,
    message: String,
) -> Result<(), Error> {
    let mut s = backup.status.clone().unwrap_or_default();
    s.step = Some(BackupStep::Releasing);
    s.failed = true;
    s.reason = Some(reason.to_string());
    s.message = Some(message);
    write_status(api, backup, s).await
}

/// Records `Failed` (nothing is held any more), removes the backup's snapshot, and lets the
/// backup go.
async fn fail(
    api: &Api<QuestDBBackup>,
    backup: &mut QuestDBBackup,
    bctx: &BackupContext,
    reason: BackupReason,
    message: String,
) -> Result<(), Error> {
    let ctx = &bctx.ctx;
    // Whatever the policy: a failed backup's snapshot holds no checkpoint it can vouch for,
    // and a retained one nobody owns would only cost money and mislead a restore.
    snapshot::delete(&ctx.client, backup)
        .await
        .map_err(Error::Kube)?;
    let mut s = backup.status.clone().unwrap_or_default();
    let now = clock::now();
    s.step = Some(BackupStep::Failed);
    s.failed = false;
    s.reason = Some(reason.to_string());
    s.message = Some(message.clone());
    s.duration_seconds =
        clock::between(s.started_at.as_ref(), Some(&now)).map(|d| d.as_secs() as i64);
    s.finished_at = Some(now);
    write_status(api, backup, s).await?;
    ctx.metrics.backup_finished(false, None);
    warn!(backup = %backup.name_any(), questdb = %backup.spec.questdb_name, %reason, %message, "backup failed");
    event(
        ctx,
        backup,
        EventType::Warning,
        EventReason::BackupFailed,
        format!("{reason}: {message}"),
    )
    .await;
    set_finalizer(api, backup, false).await
}

/// A deleted backup: the checkpoint it may hold is released (when the database still runs the
/// process that holds it), then the finalizer goes; an owned snapshot goes with the backup.
async fn finalize(backup: &mut QuestDBBackup, bctx: &BackupContext) -> Result<Next, Error> {
    release_claim(bctx, backup);
    if !has_finalizer(backup) {
        wake_next(bctx, backup);
        return Ok(Next::AwaitChange);
    }
    let status = backup.status.clone().unwrap_or_default();
    if status.step.is_some_and(BackupStep::holds_checkpoint) {
        let obs = observe(backup, bctx).await?;
        if let Some(retry) = release_own(backup, &obs, bctx.timeouts).await {
            return Ok(retry);
        }
    }
    let ns = backup.namespace().unwrap_or_default();
    let api: Api<QuestDBBackup> = Api::namespaced(bctx.ctx.client.clone(), &ns);
    set_finalizer(&api, backup, false).await?;
    wake_next(bctx, backup);
    Ok(Next::AwaitChange)
}

/// The last-successful and last-verified backup gauges, also rebuilt from the backups a new
/// leader finds.
fn note_final(backup: &QuestDBBackup, ctx: &Context) {
    let Some(s) = &backup.status else { return };
    if let Some(at) = verify::verified_at(backup) {
        ctx.metrics.last_verified_backup(
            &backup.namespace().unwrap_or_default(),
            &backup.spec.questdb_name,
            at,
        );
    }
    if s.step != Some(BackupStep::Succeeded) {
        return;
    }
    let Some(t) = s.finished_at.as_ref().map(|t| t.0) else {
        return;
    };
    ctx.metrics.last_successful_backup(
        &backup.namespace().unwrap_or_default(),
        &backup.spec.questdb_name,
        t.as_second(),
    );
}

fn has_finalizer(backup: &QuestDBBackup) -> bool {
    own_writes::has_finalizer(backup, BACKUP_FINALIZER)
}

async fn set_finalizer(
    api: &Api<QuestDBBackup>,
    backup: &mut QuestDBBackup,
    present: bool,
) -> Result<(), Error> {
    own_writes::set_finalizer(api, backup, BACKUP_FINALIZER, present).await
}

/// Replaces the status (optimistic concurrency on the resourceVersion read).
async fn write_status(
    api: &Api<QuestDBBackup>,
    backup: &mut QuestDBBackup,
    status: QuestDBBackupStatus,
) -> Result<(), Error> {
    let mut obj = backup.clone();
    obj.status = Some(status);
    *backup = own_writes::replace_status(api, &obj)
        .await
        .map_err(Error::from_status_write)?;
    Ok(())
}

async fn event(
    ctx: &Context,
    backup: &QuestDBBackup,
    type_: EventType,
    reason: EventReason,
    note: String,
) {
    ctx.event_for(&backup.object_ref(&()), type_, reason, "Backup", note)
        .await
}

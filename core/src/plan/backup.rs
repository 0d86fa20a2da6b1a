//! What a backup does next, from its recorded step and what is observed: a pure function, so
//! every step and every crash point is a unit test.
//!
//! The order that keeps a backup honest (QuestDB's backup guide,
//! <https://questdb.com/docs/operations/backup/>): `CHECKPOINT CREATE` right before the
//! snapshot is asked for; the snapshot's point in time is fixed once it is cut
//! (`status.creationTime`); the checkpoint must still be open in the same process then (a
//! restart leaves a stale `.checkpoint` a restore would silently roll back to); then
//! `CHECKPOINT RELEASE`; the backup succeeds only once the storage says the snapshot is ready.
//!
//! A backup owns its checkpoint or has none: one open before it asked (a user's `CHECKPOINT
//! CREATE`, another tool's) is never taken over, because its point in time is not the
//! backup's. The database's `checkpoint_status()` tells checkpoints apart only by `started_at`:
//! the backup records when it sends CREATE (before sending it) and the `started_at` its CREATE
//! got (once CREATE answered); the cut and the release check that same `started_at` is open.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::{BackupReason, BackupStep, CheckpointHolder, QuestDBBackup, QuestDBBackupStatus};

/// How long each wait may last before the backup fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// From `CHECKPOINT CREATE` until the snapshot is cut: the checkpoint is open meanwhile.
    pub cut: Duration,
    /// From the cut until the snapshot is ready to use.
    pub upload: Duration,
    /// How long `CHECKPOINT CREATE` may take to answer: it syncs the database's files, which on
    /// a large database or a slow volume takes minutes.
    pub create: Duration,
    /// How long a backup waits for its QuestDB to exist (a typo in `questdbName`, or a database
    /// deleted before the backup began) before it fails `QuestDBNotFound`.
    pub missing: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            cut: Duration::from_secs(10 * 60),
            upload: Duration::from_secs(6 * 3600),
            create: Duration::from_secs(5 * 60),
            missing: Duration::from_secs(10 * 60),
        }
    }
}

/// How far the database's clock (`started_at`) and the operator's (`checkpointRequestedAt`) may
/// disagree: machines of one cluster keep time by NTP.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5);

/// The database's checkpoint, from `checkpoint_status()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenCheckpoint {
    /// Not asked, or the database did not answer.
    Unknown,
    /// None is open.
    None,
    /// One is open since `started_at` (the database's clock, as it reports it).
    Open { started_at: String },
}

/// Whose an open checkpoint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// This backup's: CREATE answered and got this `started_at`.
    Ours,
    /// Started within the CREATE this backup sent last, whose answer it never had (a crash, a
    /// timeout): its own, but not known to be complete.
    Sent,
    /// Anyone else's.
    Foreign,
}

pub fn owner(status: &QuestDBBackupStatus, started_at: &str, timeouts: Timeouts) -> Owner {
    if status.checkpoint_started_at.as_deref() == Some(started_at) {
        return Owner::Ours;
    }
    let (Some(requested), Ok(started)) = (
        status.checkpoint_requested_at.as_ref(),
        started_at.parse::<Timestamp>(),
    ) else {
        return Owner::Foreign;
    };
    let after = started.duration_since(requested.0);
    let skew = k8s_openapi::jiff::SignedDuration::try_from(CLOCK_SKEW).unwrap_or_default();
    let window = k8s_openapi::jiff::SignedDuration::try_from(timeouts.create + CLOCK_SKEW)
        .unwrap_or_default();
    if after >= -skew && after <= window {
        Owner::Sent
    } else {
        Owner::Foreign
    }
}

/// What a release does with the database's checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseAction {
    /// `CHECKPOINT RELEASE`: the open checkpoint is the backup's.
    Release,
    /// Nothing of the backup's is open (none, another's, or the process that held it is gone).
    Nothing,
    /// The process that holds the backup's checkpoint still runs but did not answer: ask again
    /// (a checkpoint left open keeps WAL segments and old partitions until the disk fills).
    Retry,
}

/// `holder_runs`: the process the checkpoint was opened in still runs (its pod and container,
/// ready or not).
pub fn release_action(
    status: &QuestDBBackupStatus,
    checkpoint: &OpenCheckpoint,
    holder_runs: bool,
    timeouts: Timeouts,
) -> ReleaseAction {
    match checkpoint {
        OpenCheckpoint::Open { started_at }
            if owner(status, started_at, timeouts) != Owner::Foreign =>
        {
            ReleaseAction::Release
        }
        OpenCheckpoint::Open { .. } | OpenCheckpoint::None => ReleaseAction::Nothing,
        OpenCheckpoint::Unknown if holder_runs => ReleaseAction::Retry,
        OpenCheckpoint::Unknown => ReleaseAction::Nothing,
    }
}

/// The database, as far as a backup cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    Missing,
    Deleting,
    /// The QuestDB's own status says it is not Running (paused, pending, failed): only a change
    /// of the QuestDB ends the wait, and that change wakes the backup.
    Stopped(String),
    /// Running, but its pod is missing or not Ready, or its process did not answer (the message
    /// says which): looked at again every [`WAIT_POLL`].
    NotRunning(String),
    /// A failover or node move is under way (the message says which); it ends with a change of
    /// the QuestDB, which wakes the backup.
    Busy(String),
    /// Running; the process that would hold a checkpoint.
    Ready(CheckpointHolder),
}

fn foreign_checkpoint(started_at: &str) -> String {
    format!(
        "a checkpoint this backup did not open has been open since {started_at} (a manual CHECKPOINT CREATE, or another tool's): the backup waits for it to be released (CHECKPOINT RELEASE) and never takes it over"
    )
}

/// The backup's VolumeSnapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Snapshot {
    /// The VolumeSnapshot API is not served (the CSI snapshot CRDs are not installed).
    ApiMissing,
    Absent,
    /// A VolumeSnapshot of that name exists and is not this backup's.
    NotOurs,
    /// Asked for; `cut` once its point in time is fixed (`status.creationTime`).
    Pending {
        cut: bool,
    },
    Ready {
        restore_size: Option<String>,
    },
    Error(String),
}

pub struct Observed {
    pub database: Database,
    /// Another backup of the same database that may hold its checkpoint.
    pub other_backup: Option<String>,
    /// The database's checkpoint (asked while the database is Ready, in the steps that need it).
    pub checkpoint: OpenCheckpoint,
    /// The process running in the database's pod, Ready or not (`None`: no pod runs).
    pub holder: Option<CheckpointHolder>,
    pub snapshot: Snapshot,
    /// Time since the checkpoint was created (`status.checkpointAt`).
    pub since_checkpoint: Option<Duration>,
    /// Time since the backup left `Releasing` (the upload's start is the release).
    pub since_release: Option<Duration>,
    /// Time since the backup began (`status.startedAt`).
    pub since_start: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Stay in `Pending`, saying why; look again after `requeue`.
    Wait {
        reason: BackupReason,
        message: String,
        requeue: Duration,
    },
    /// Record `Checkpointing` with this holder, then open the checkpoint.
    StartCheckpoint(CheckpointHolder),
    /// In `Checkpointing`, none open: record when CREATE is sent, send it, and once it answers
    /// record `Snapshotting` with the checkpoint's `started_at`.
    Checkpoint,
    /// The backup's own checkpoint is open but not known to be complete (its CREATE's answer was
    /// lost), or left from an attempt that went back to waiting: release it; the next pass opens
    /// a new one.
    ReleaseOwn,
    /// In `Snapshotting`: ask for the VolumeSnapshot.
    CreateSnapshot,
    /// Look again after this long.
    Poll(Duration),
    /// Record `Releasing` (failed or not), then release.
    Release {
        failure: Option<(BackupReason, String)>,
    },
    /// In `Releasing`: send `CHECKPOINT RELEASE`, then record `Uploading` or `Failed`.
    FinishRelease,
    /// Record `Succeeded`.
    Succeed { restore_size: Option<String> },
    /// Record `Failed` (nothing held).
    Fail {
        reason: BackupReason,
        message: String,
    },
    /// Final: nothing to do.
    Done,
}

/// Why a backup waits while `holder`, another backup of its database, may hold the checkpoint.
pub fn queued_behind(holder: &str) -> String {
    format!("backup {holder} holds the database's checkpoint")
}

pub const WAIT_POLL: Duration = Duration::from_secs(10);
/// A wait that a change of the QuestDB (or the end of the backup ahead of it) ends is woken by
/// that change (the backup controller's `woken_by_questdb`, and the end of the backup ahead); this is only the fallback. A tenant's
/// hundreds of waiting backups so cost the shared workers nothing while nothing changes, where a
/// 10 s poll of each kept them busy and held back every other tenant's backup.
pub const WOKEN_WAIT_FALLBACK: Duration = Duration::from_secs(300);
const SNAPSHOT_POLL: Duration = Duration::from_secs(2);
/// The longest wait between two looks at a snapshot being uploaded.
const UPLOAD_POLL: Duration = Duration::from_secs(10);

/// How long to wait before looking at an uploading snapshot again: as long as it has been
/// uploading, from 1 s up to [`UPLOAD_POLL`]. A small snapshot is usually ready within a second
/// or two of its cut, and a flat 10 s poll made such a backup take four times as long as it
/// needed; a large one is looked at every 10 s as before.
fn upload_poll(since_release: Option<Duration>) -> Duration {
    since_release
        .unwrap_or_default()
        .clamp(Duration::from_secs(1), UPLOAD_POLL)
}

/// Whether `backup` waits in `Pending` queued behind another backup of its database.
fn queued(backup: &QuestDBBackup) -> bool {
    backup.status.as_ref().is_some_and(|s| {
        s.step == Some(BackupStep::Pending)
            && s.reason.as_deref() == Some(<&str>::from(BackupReason::AnotherBackupRunning))
    })
}

/// The backups of QuestDB `questdb` in `namespace` that a change of it wakes: those waiting in
/// `Pending` for the database itself. Those queued behind another backup of it are woken one
/// at a time by the end of the backup ahead ([`next_in_queue`]), so a change of a database with
/// hundreds queued costs one reconcile, not hundreds.
pub fn waiting_on_database<'a>(
    backups: &'a [Arc<QuestDBBackup>],
    namespace: &'a str,
    questdb: &'a str,
) -> impl Iterator<Item = &'a Arc<QuestDBBackup>> + 'a {
    backups.iter().filter(move |b| {
        of(b, namespace, questdb)
            && b.status.as_ref().and_then(|s| s.step) == Some(BackupStep::Pending)
            && !queued(b)
    })
}

/// The backup of QuestDB `questdb` in `namespace` to wake when the one ahead of it ends: the
/// oldest queued (by creation, then name), so queued backups run in the order they were asked
/// for.
pub fn next_in_queue<'a>(
    backups: &'a [Arc<QuestDBBackup>],
    namespace: &str,
    questdb: &str,
) -> Option<&'a Arc<QuestDBBackup>> {
    backups
        .iter()
        .filter(|b| of(b, namespace, questdb) && queued(b))
        .min_by(|a, b| {
            let created = |b: &QuestDBBackup| b.metadata.creation_timestamp.clone().map(|t| t.0);
            created(a)
                .cmp(&created(b))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        })
}

fn of(backup: &QuestDBBackup, namespace: &str, questdb: &str) -> bool {
    backup.metadata.namespace.as_deref() == Some(namespace) && backup.spec.questdb_name == questdb
}

pub fn decide(status: &QuestDBBackupStatus, obs: &Observed, timeouts: Timeouts) -> Decision {
    let step = status.step.unwrap_or(BackupStep::Pending);
    match step {
        BackupStep::Succeeded | BackupStep::Failed => Decision::Done,
        BackupStep::Pending => pending(status, obs, timeouts),
        BackupStep::Checkpointing => match &obs.database {
            Database::Ready(holder) if Some(holder) != status.checkpoint.as_ref() => {
                // The process changed before the snapshot was asked for: nothing of the old
                // one is in any snapshot, so a checkpoint in the new one is as good.
                Decision::StartCheckpoint(holder.clone())
            }
            Database::Ready(_) => match &obs.checkpoint {
                OpenCheckpoint::None => Decision::Checkpoint,
                OpenCheckpoint::Open { started_at } => {
                    match owner(status, started_at, timeouts) {
                        Owner::Ours | Owner::Sent => Decision::ReleaseOwn,
                        Owner::Foreign => Decision::Wait {
                            reason: BackupReason::ForeignCheckpoint,
                            message: foreign_checkpoint(started_at),
                            requeue: WAIT_POLL,
                        },
                    }
                }
                // The database did not say: ask again, within the checkpoint's time limit.
                OpenCheckpoint::Unknown if since_request(status).is_some_and(|d| d > timeouts.cut) => {
                    Decision::Fail {
                        reason: BackupReason::CheckpointFailed,
                        message: format!(
                            "the database did not answer checkpoint_status() within {}s of the checkpoint's request",
                            timeouts.cut.as_secs()
                        ),
                    }
                }
                OpenCheckpoint::Unknown => Decision::Poll(Duration::from_secs(5)),
            },
            Database::Missing | Database::Deleting => Decision::Fail {
                reason: BackupReason::QuestDBDeleted,
                message: "the QuestDB was deleted during the backup".into(),
            },
            // Unreachable for now (moving, restarting): the checkpoint, if any, went with it, or
            // is released as the backup's own once the database is back.
            Database::Stopped(_) | Database::NotRunning(_) | Database::Busy(_) => {
                pending(status, obs, timeouts)
            }
        },
        BackupStep::Snapshotting => snapshotting(status, obs, timeouts),
        BackupStep::Releasing => Decision::FinishRelease,
        BackupStep::Uploading => uploading(obs, timeouts),
    }
}

/// Time since the backup last sent (or was about to send) `CHECKPOINT CREATE`.
fn since_request(status: &QuestDBBackupStatus) -> Option<Duration> {
    crate::clock::since(status.checkpoint_requested_at.as_ref())
}

fn pending(status: &QuestDBBackupStatus, obs: &Observed, timeouts: Timeouts) -> Decision {
    let wait = |reason, message: String, requeue| Decision::Wait {
        reason,
        message,
        requeue,
    };
    match &obs.database {
        Database::Missing if obs.since_start.is_some_and(|d| d > timeouts.missing) => {
            Decision::Fail {
                reason: BackupReason::QuestDBNotFound,
                message: format!(
                    "the QuestDB did not exist within {}s of the backup's start",
                    timeouts.missing.as_secs()
                ),
            }
        }
        Database::Missing => wait(
            BackupReason::QuestDBNotFound,
            "the QuestDB does not exist".into(),
            Duration::from_secs(30),
        ),
        Database::Deleting => Decision::Fail {
            reason: BackupReason::QuestDBDeleted,
            message: "the QuestDB is being deleted".into(),
        },
        Database::Stopped(why) => wait(
            BackupReason::DatabaseNotRunning,
            why.clone(),
            WOKEN_WAIT_FALLBACK,
        ),
        Database::NotRunning(why) => wait(BackupReason::DatabaseNotRunning, why.clone(), WAIT_POLL),
        Database::Busy(why) => wait(BackupReason::DatabaseBusy, why.clone(), WOKEN_WAIT_FALLBACK),
        Database::Ready(_) if matches!(obs.snapshot, Snapshot::ApiMissing) => wait(
            BackupReason::SnapshotApiMissing,
            SNAPSHOT_API_MISSING.into(),
            Duration::from_secs(60),
        ),
        Database::Ready(_) if obs.other_backup.is_some() => wait(
            BackupReason::AnotherBackupRunning,
            queued_behind(obs.other_backup.as_deref().unwrap_or_default()),
            WOKEN_WAIT_FALLBACK,
        ),
        Database::Ready(_) if matches!(obs.checkpoint, OpenCheckpoint::Unknown) => wait(
            BackupReason::DatabaseNotRunning,
            "the database did not answer checkpoint_status()".into(),
            WAIT_POLL,
        ),
        Database::Ready(holder) => match &obs.checkpoint {
            OpenCheckpoint::Open { started_at } => match owner(status, started_at, timeouts) {
                // Left open by this backup's own earlier attempt (the database went away
                // meanwhile, and came back in the same process).
                Owner::Ours | Owner::Sent => Decision::ReleaseOwn,
                Owner::Foreign => wait(
                    BackupReason::ForeignCheckpoint,
                    foreign_checkpoint(started_at),
                    WAIT_POLL,
                ),
            },
            _ => Decision::StartCheckpoint(holder.clone()),
        },
    }
}

pub const SNAPSHOT_API_MISSING: &str = "the VolumeSnapshot API (snapshot.storage.k8s.io/v1) is not served: install the CSI snapshot CRDs and the snapshot-controller, and a VolumeSnapshotClass for the volume's CSI driver";

fn snapshotting(status: &QuestDBBackupStatus, obs: &Observed, timeouts: Timeouts) -> Decision {
    let fail = |reason, message: String| Decision::Release {
        failure: Some((reason, message)),
    };
    // The process, not its readiness: a pod briefly not Ready still holds the checkpoint, and
    // the cut below asks the database itself.
    let held_by_same_process = obs.holder.is_some() && obs.holder == status.checkpoint;
    match &obs.snapshot {
        Snapshot::ApiMissing => fail(BackupReason::SnapshotApiMissing, SNAPSHOT_API_MISSING.into()),
        Snapshot::NotOurs => fail(
            BackupReason::SnapshotFailed,
            "a VolumeSnapshot of the backup's name exists and is not this backup's".into(),
        ),
        Snapshot::Error(e) => fail(BackupReason::SnapshotFailed, e.clone()),
        _ if !held_by_same_process => fail(
            BackupReason::CheckpointLost,
            "the database restarted or moved while its checkpoint was open; the snapshot could restore to a stale checkpoint".into(),
        ),
        Snapshot::Absent => Decision::CreateSnapshot,
        // The cut: the snapshot holds the checkpoint only if that same checkpoint is still open.
        Snapshot::Pending { cut: true } | Snapshot::Ready { .. } => match &obs.checkpoint {
            OpenCheckpoint::Open { started_at }
                if status.checkpoint_started_at.as_deref() == Some(started_at.as_str()) =>
            {
                Decision::Release { failure: None }
            }
            OpenCheckpoint::Unknown if obs.since_checkpoint.is_none_or(|d| d <= timeouts.cut) => {
                Decision::Poll(SNAPSHOT_POLL)
            }
            OpenCheckpoint::Unknown => fail(
                BackupReason::CheckpointLost,
                "the database did not say whether the backup's checkpoint was still open at the cut".into(),
            ),
            OpenCheckpoint::None => fail(
                BackupReason::CheckpointLost,
                "the backup's checkpoint was no longer open when the snapshot was cut (released by someone else?)".into(),
            ),
            OpenCheckpoint::Open { started_at } => fail(
                BackupReason::CheckpointLost,
                format!(
                    "at the cut the open checkpoint started at {started_at}, not the backup's ({}): released and replaced by someone else",
                    status.checkpoint_started_at.as_deref().unwrap_or("unknown")
                ),
            ),
        },
        Snapshot::Pending { cut: false }
            if obs.since_checkpoint.is_some_and(|d| d > timeouts.cut) =>
        {
            fail(
                BackupReason::SnapshotTimeout,
                format!(
                    "the snapshot was not taken within {}s of the checkpoint",
                    timeouts.cut.as_secs()
                ),
            )
        }
        Snapshot::Pending { cut: false } => Decision::Poll(SNAPSHOT_POLL),
    }
}

fn uploading(obs: &Observed, timeouts: Timeouts) -> Decision {
    match &obs.snapshot {
        Snapshot::Ready { restore_size } => Decision::Succeed {
            restore_size: restore_size.clone(),
        },
        Snapshot::Error(e) => Decision::Fail {
            reason: BackupReason::SnapshotFailed,
            message: e.clone(),
        },
        Snapshot::Absent | Snapshot::NotOurs | Snapshot::ApiMissing => Decision::Fail {
            reason: BackupReason::SnapshotFailed,
            message: "the backup's VolumeSnapshot is gone".into(),
        },
        Snapshot::Pending { .. } if obs.since_release.is_some_and(|d| d > timeouts.upload) => {
            Decision::Fail {
                reason: BackupReason::SnapshotTimeout,
                message: format!(
                    "the snapshot was not ready to use within {}s",
                    timeouts.upload.as_secs()
                ),
            }
        }
        Snapshot::Pending { .. } => Decision::Poll(upload_poll(obs.since_release)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn holder(uid: &str, restarts: i32) -> CheckpointHolder {
        CheckpointHolder {
            pod_uid: uid.into(),
            restart_count: restarts,
        }
    }

    /// When the backup sent CREATE (operator's clock) and when its checkpoint started
    /// (database's clock, a second later).
    const REQUESTED: &str = "2026-11-28T08:00:00Z";
    const STARTED: &str = "2026-11-28T08:00:01.123456Z";

    fn status(step: BackupStep) -> QuestDBBackupStatus {
        QuestDBBackupStatus {
            step: Some(step),
            checkpoint: Some(holder("pod-1", 0)),
            checkpoint_requested_at: Some(Time(REQUESTED.parse().unwrap())),
            checkpoint_started_at: matches!(
                step,
                BackupStep::Snapshotting | BackupStep::Releasing | BackupStep::Uploading
            )
            .then(|| STARTED.to_string()),
            ..Default::default()
        }
    }

    fn open(started_at: &str) -> OpenCheckpoint {
        OpenCheckpoint::Open {
            started_at: started_at.into(),
        }
    }

    fn observed(database: Database, snapshot: Snapshot) -> Observed {
        let holder = match &database {
            Database::Ready(h) => Some(h.clone()),
            _ => None,
        };
        Observed {
            database,
            other_backup: None,
            checkpoint: OpenCheckpoint::None,
            holder,
            snapshot,
            since_checkpoint: Some(Duration::from_secs(1)),
            since_release: Some(Duration::from_secs(1)),
            since_start: Some(Duration::from_secs(1)),
        }
    }

    /// At the cut, with the backup's own checkpoint still open.
    fn cut(database: Database, snapshot: Snapshot) -> Observed {
        Observed {
            checkpoint: open(STARTED),
            ..observed(database, snapshot)
        }
    }

    fn ready() -> Database {
        Database::Ready(holder("pod-1", 0))
    }

    fn failure(d: Decision) -> Option<BackupReason> {
        match d {
            Decision::Release {
                failure: Some((r, _)),
            } => Some(r),
            Decision::Fail { reason, .. } => Some(reason),
            _ => None,
        }
    }

    fn backup_of(
        ns: &str,
        questdb: &str,
        name: &str,
        created: i64,
        reason: Option<BackupReason>,
        step: Option<BackupStep>,
    ) -> Arc<QuestDBBackup> {
        let mut b = QuestDBBackup::new(
            name,
            crate::api::QuestDBBackupSpec {
                questdb_name: questdb.into(),
                volume_snapshot_class_name: None,
                deletion_policy: Default::default(),
                verify: false,
            },
        );
        b.metadata.namespace = Some(ns.into());
        b.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        b.status = Some(QuestDBBackupStatus {
            step,
            reason: reason.map(|r| r.to_string()),
            ..Default::default()
        });
        Arc::new(b)
    }

    /// A change of a database wakes the backups waiting for it, never those of another
    /// database or tenant, nor those queued behind a backup of it (the end of that one wakes
    /// the oldest queued: they run in the order asked for).
    #[test]
    fn a_change_wakes_only_the_backups_that_wait_for_it_and_the_queue_goes_oldest_first() {
        let pending = Some(BackupStep::Pending);
        let queued = Some(BackupReason::AnotherBackupRunning);
        let stopped = Some(BackupReason::DatabaseNotRunning);
        let all = vec![
            backup_of("a", "db", "waits", 10, stopped, pending),
            backup_of("a", "db", "queued-later", 30, queued, pending),
            backup_of("a", "db", "queued-first", 20, queued, pending),
            backup_of("a", "db", "queued-same-time-b", 25, queued, pending),
            backup_of(
                "a",
                "db",
                "running",
                5,
                None,
                Some(BackupStep::Snapshotting),
            ),
            backup_of("a", "db", "done", 1, None, Some(BackupStep::Succeeded)),
            backup_of("a", "other", "other-db", 1, stopped, pending),
            backup_of("b", "db", "other-tenant", 1, stopped, pending),
        ];
        let names = |it: Vec<&Arc<QuestDBBackup>>| {
            it.iter()
                .map(|b| b.metadata.name.clone().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(waiting_on_database(&all, "a", "db").collect()),
            ["waits"]
        );
        assert_eq!(
            names(next_in_queue(&all, "a", "db").into_iter().collect()),
            ["queued-first"]
        );
        let mut tied = all.clone();
        tied.push(backup_of("a", "db", "queued-a", 20, queued, pending));
        assert_eq!(
            names(next_in_queue(&tied, "a", "db").into_iter().collect()),
            ["queued-a"],
            "same creation second: by name"
        );
        assert!(next_in_queue(&all, "b", "db").is_none());
    }

    /// A waiting backup is looked at again by a timer only when nothing it waits for sends a
    /// change: a tenant's hundreds of paused-database or queued backups must not keep the
    /// shared workers busy.
    #[test]
    fn only_waits_no_change_ends_are_polled() {
        let new = QuestDBBackupStatus::default();
        let t = Timeouts::default();
        let requeue = |obs: &Observed| match decide(&new, obs, t) {
            Decision::Wait { requeue, .. } => requeue,
            other => panic!("not a wait: {other:?}"),
        };
        for db in [
            Database::Stopped("the QuestDB is Paused, not Running".into()),
            Database::Busy("a failover is under way".into()),
        ] {
            assert_eq!(
                requeue(&observed(db, Snapshot::Absent)),
                WOKEN_WAIT_FALLBACK
            );
        }
        let mut queued = observed(ready(), Snapshot::Absent);
        queued.other_backup = Some("nightly-1".into());
        assert_eq!(requeue(&queued), WOKEN_WAIT_FALLBACK);
        // The pod's readiness and a foreign checkpoint send the backup nothing: polled.
        let pod = observed(
            Database::NotRunning("the database pod is not Ready".into()),
            Snapshot::Absent,
        );
        assert_eq!(requeue(&pod), WAIT_POLL);
        let mut foreign = observed(ready(), Snapshot::Absent);
        foreign.checkpoint = OpenCheckpoint::Open {
            started_at: "2026-01-01T00:00:00Z".into(),
        };
        assert_eq!(requeue(&foreign), WAIT_POLL);
    }

    #[test]
    fn a_new_backup_checkpoints_only_a_running_database_no_other_backup_holds() {
        let new = QuestDBBackupStatus::default();
        let t = Timeouts::default();
        let mut obs = observed(ready(), Snapshot::Absent);
        assert_eq!(
            decide(&new, &obs, t),
            Decision::StartCheckpoint(holder("pod-1", 0))
        );
        obs.other_backup = Some("nightly-1".into());
        assert!(matches!(
            decide(&new, &obs, t),
            Decision::Wait {
                reason: BackupReason::AnotherBackupRunning,
                ..
            }
        ));
        for (db, reason) in [
            (Database::Missing, BackupReason::QuestDBNotFound),
            (
                Database::NotRunning("x".into()),
                BackupReason::DatabaseNotRunning,
            ),
            (
                Database::Stopped("paused".into()),
                BackupReason::DatabaseNotRunning,
            ),
            (
                Database::Busy("failover".into()),
                BackupReason::DatabaseBusy,
            ),
        ] {
            let obs = observed(db, Snapshot::Absent);
            assert!(
                matches!(decide(&new, &obs, t), Decision::Wait { reason: r, .. } if r == reason),
                "{reason}"
            );
        }
        let obs = observed(ready(), Snapshot::ApiMissing);
        assert!(matches!(
            decide(&new, &obs, t),
            Decision::Wait { reason: BackupReason::SnapshotApiMissing, ref message, .. } if message.contains("snapshot-controller")
        ));
        // A backup of a database that never appears ends instead of waiting forever.
        let mut never = observed(Database::Missing, Snapshot::Absent);
        never.since_start = Some(t.missing + Duration::from_secs(1));
        assert_eq!(
            failure(decide(&new, &never, t)),
            Some(BackupReason::QuestDBNotFound)
        );
        let obs = observed(Database::Deleting, Snapshot::Absent);
        assert_eq!(
            failure(decide(&new, &obs, t)),
            Some(BackupReason::QuestDBDeleted)
        );
    }

    #[test]
    fn a_crash_after_recording_checkpointing_opens_the_checkpoint_again_in_the_live_process() {
        let t = Timeouts::default();
        let s = status(BackupStep::Checkpointing);
        assert_eq!(
            decide(&s, &observed(ready(), Snapshot::Absent), t),
            Decision::Checkpoint
        );
        // Restarted before the snapshot was asked for: re-record the new process.
        let restarted = Database::Ready(holder("pod-1", 1));
        assert_eq!(
            decide(&s, &observed(restarted, Snapshot::Absent), t),
            Decision::StartCheckpoint(holder("pod-1", 1))
        );
    }

    #[test]
    fn the_snapshot_is_asked_for_once_and_released_only_once_cut_in_the_same_process() {
        let t = Timeouts::default();
        let s = status(BackupStep::Snapshotting);
        assert_eq!(
            decide(&s, &observed(ready(), Snapshot::Absent), t),
            Decision::CreateSnapshot
        );
        assert_eq!(
            decide(&s, &observed(ready(), Snapshot::Pending { cut: false }), t),
            Decision::Poll(SNAPSHOT_POLL)
        );
        assert_eq!(
            decide(&s, &cut(ready(), Snapshot::Pending { cut: true }), t),
            Decision::Release { failure: None }
        );
    }

    #[test]
    fn a_database_restarted_during_the_checkpoint_never_makes_a_successful_backup() {
        let t = Timeouts::default();
        let s = status(BackupStep::Snapshotting);
        for db in [
            Database::Ready(holder("pod-1", 1)),
            Database::Ready(holder("pod-2", 0)),
            Database::NotRunning("restarting".into()),
            Database::Missing,
        ] {
            for snap in [
                Snapshot::Pending { cut: true },
                Snapshot::Ready { restore_size: None },
            ] {
                assert_eq!(
                    failure(decide(&s, &cut(db.clone(), snap), t)),
                    Some(BackupReason::CheckpointLost),
                    "{db:?}"
                );
            }
        }
    }

    #[test]
    fn a_snapshot_that_fails_or_stalls_releases_the_checkpoint_and_fails() {
        let t = Timeouts::default();
        let s = status(BackupStep::Snapshotting);
        let err = observed(ready(), Snapshot::Error("quota".into()));
        assert_eq!(
            failure(decide(&s, &err, t)),
            Some(BackupReason::SnapshotFailed)
        );
        let mut stalled = observed(ready(), Snapshot::Pending { cut: false });
        stalled.since_checkpoint = Some(t.cut + Duration::from_secs(1));
        assert_eq!(
            failure(decide(&s, &stalled, t)),
            Some(BackupReason::SnapshotTimeout)
        );
        let taken = observed(ready(), Snapshot::NotOurs);
        assert_eq!(
            failure(decide(&s, &taken, t)),
            Some(BackupReason::SnapshotFailed)
        );
        let missing = observed(ready(), Snapshot::ApiMissing);
        assert_eq!(
            failure(decide(&s, &missing, t)),
            Some(BackupReason::SnapshotApiMissing)
        );
    }

    #[test]
    fn a_release_is_always_finished_whatever_the_database_looks_like() {
        let t = Timeouts::default();
        let s = status(BackupStep::Releasing);
        for db in [ready(), Database::Missing, Database::NotRunning("x".into())] {
            assert_eq!(
                decide(&s, &observed(db, Snapshot::Absent), t),
                Decision::FinishRelease
            );
        }
    }

    #[test]
    fn the_backup_succeeds_only_when_the_storage_says_the_snapshot_is_ready() {
        let t = Timeouts::default();
        let s = status(BackupStep::Uploading);
        let mut uploading = observed(ready(), Snapshot::Pending { cut: true });
        assert_eq!(
            decide(&s, &uploading, t),
            Decision::Poll(Duration::from_secs(1)),
            "just released: looked at again soon"
        );
        uploading.since_release = Some(Duration::from_secs(4));
        assert_eq!(
            decide(&s, &uploading, t),
            Decision::Poll(Duration::from_secs(4))
        );
        uploading.since_release = Some(Duration::from_secs(600));
        assert_eq!(decide(&s, &uploading, t), Decision::Poll(UPLOAD_POLL));
        let done = Snapshot::Ready {
            restore_size: Some("1Gi".into()),
        };
        assert_eq!(
            decide(&s, &observed(Database::Missing, done), t),
            Decision::Succeed {
                restore_size: Some("1Gi".into())
            }
        );
        let gone = observed(ready(), Snapshot::Absent);
        assert_eq!(
            failure(decide(&s, &gone, t)),
            Some(BackupReason::SnapshotFailed)
        );
        let mut slow = observed(ready(), Snapshot::Pending { cut: true });
        slow.since_release = Some(t.upload + Duration::from_secs(1));
        assert_eq!(
            failure(decide(&s, &slow, t)),
            Some(BackupReason::SnapshotTimeout)
        );
    }

    /// The harm this prevents: a backup that said Succeeded and restored 5,000 of 8,000
    /// acknowledged rows, because it took over a checkpoint a user had opened by hand earlier.
    #[test]
    fn a_checkpoint_the_backup_did_not_open_is_never_taken_over() {
        let t = Timeouts::default();
        let foreign = "2026-11-28T07:00:00Z";
        let waits_on_it = |d: Decision| matches!(d, Decision::Wait { reason: BackupReason::ForeignCheckpoint, ref message, .. } if message.contains(foreign));
        let new = QuestDBBackupStatus::default();
        let obs = Observed {
            checkpoint: open(foreign),
            ..observed(ready(), Snapshot::Absent)
        };
        assert!(waits_on_it(decide(&new, &obs, t)));
        // Recorded Checkpointing, then found one open that started before its CREATE was sent.
        let s = status(BackupStep::Checkpointing);
        assert!(waits_on_it(decide(&s, &obs, t)));
        // Nor one that started long after (the backup's CREATE never reached the database).
        let late = Observed {
            checkpoint: open("2026-11-28T09:00:00Z"),
            ..observed(ready(), Snapshot::Absent)
        };
        assert!(matches!(
            decide(&s, &late, t),
            Decision::Wait {
                reason: BackupReason::ForeignCheckpoint,
                ..
            }
        ));
        // Once it is released, the backup opens its own.
        assert_eq!(
            decide(&new, &observed(ready(), Snapshot::Absent), t),
            Decision::StartCheckpoint(holder("pod-1", 0))
        );
    }

    #[test]
    fn a_checkpoint_is_the_backups_by_its_recorded_start_or_within_its_own_create() {
        let t = Timeouts::default();
        let mut s = status(BackupStep::Checkpointing);
        assert_eq!(owner(&s, STARTED, t), Owner::Sent);
        // The clocks may disagree by a few seconds.
        assert_eq!(owner(&s, "2026-11-28T07:59:57Z", t), Owner::Sent);
        assert_eq!(owner(&s, "2026-11-28T07:59:50Z", t), Owner::Foreign);
        assert_eq!(owner(&s, "2026-11-28T08:04:59Z", t), Owner::Sent);
        assert_eq!(owner(&s, "2026-11-28T08:10:00Z", t), Owner::Foreign);
        assert_eq!(owner(&s, "not a time", t), Owner::Foreign);
        s.checkpoint_started_at = Some(STARTED.into());
        assert_eq!(owner(&s, STARTED, t), Owner::Ours);
        assert_eq!(
            owner(&QuestDBBackupStatus::default(), STARTED, t),
            Owner::Foreign
        );
    }

    /// CREATE's answer lost (a crash, a timeout): the checkpoint is the backup's, but whether it
    /// completed its sync is unknown, so it is released and opened again, never cut.
    #[test]
    fn a_create_whose_answer_was_lost_is_released_and_opened_again() {
        let t = Timeouts::default();
        let sent = Observed {
            checkpoint: open(STARTED),
            ..observed(ready(), Snapshot::Absent)
        };
        assert_eq!(
            decide(&status(BackupStep::Checkpointing), &sent, t),
            Decision::ReleaseOwn
        );
        // Left open by an attempt that went back to waiting: released before anything else.
        let mut waiting = status(BackupStep::Checkpointing);
        waiting.step = Some(BackupStep::Pending);
        assert_eq!(decide(&waiting, &sent, t), Decision::ReleaseOwn);
        // The database did not answer: asked again, then the backup fails.
        let mut unknown = Observed {
            checkpoint: OpenCheckpoint::Unknown,
            ..observed(ready(), Snapshot::Absent)
        };
        let mut recent = status(BackupStep::Checkpointing);
        recent.checkpoint_requested_at = Some(crate::clock::now());
        assert!(matches!(decide(&recent, &unknown, t), Decision::Poll(_)));
        assert_eq!(
            failure(decide(&status(BackupStep::Checkpointing), &unknown, t)),
            Some(BackupReason::CheckpointFailed)
        );
        unknown.database = Database::NotRunning("x".into());
        assert!(matches!(
            decide(&recent, &unknown, t),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn the_cut_holds_only_the_backups_own_checkpoint_still_open() {
        let t = Timeouts::default();
        let s = status(BackupStep::Snapshotting);
        let at_cut = |checkpoint| Observed {
            checkpoint,
            ..observed(ready(), Snapshot::Pending { cut: true })
        };
        assert_eq!(
            decide(&s, &at_cut(open(STARTED)), t),
            Decision::Release { failure: None }
        );
        for lost in [open("2026-11-28T08:01:00Z"), OpenCheckpoint::None] {
            assert_eq!(
                failure(decide(&s, &at_cut(lost.clone()), t)),
                Some(BackupReason::CheckpointLost),
                "{lost:?}"
            );
        }
        assert!(matches!(
            decide(&s, &at_cut(OpenCheckpoint::Unknown), t),
            Decision::Poll(_)
        ));
        let mut late = at_cut(OpenCheckpoint::Unknown);
        late.since_checkpoint = Some(t.cut + Duration::from_secs(1));
        assert_eq!(
            failure(decide(&s, &late, t)),
            Some(BackupReason::CheckpointLost)
        );
        // A pod briefly not Ready still runs the process holding the checkpoint.
        let not_ready = Observed {
            holder: Some(holder("pod-1", 0)),
            ..at_cut(open(STARTED))
        };
        let not_ready = Observed {
            database: Database::NotRunning("the database pod is not Ready".into()),
            ..not_ready
        };
        assert_eq!(
            decide(&s, &not_ready, t),
            Decision::Release { failure: None }
        );
    }

    /// RELEASE closes whatever checkpoint is open: only the backup's own is released, and one
    /// whose process still runs but does not answer is asked again, never forgotten.
    #[test]
    fn a_release_closes_only_the_backups_own_checkpoint_and_never_gives_up_on_a_live_one() {
        let t = Timeouts::default();
        let s = status(BackupStep::Releasing);
        assert_eq!(
            release_action(&s, &open(STARTED), true, t),
            ReleaseAction::Release
        );
        let mut sent = status(BackupStep::Checkpointing);
        sent.step = Some(BackupStep::Releasing);
        assert_eq!(
            release_action(&sent, &open(STARTED), true, t),
            ReleaseAction::Release
        );
        assert_eq!(
            release_action(&s, &open("2026-11-28T07:00:00Z"), true, t),
            ReleaseAction::Nothing
        );
        assert_eq!(
            release_action(&s, &OpenCheckpoint::None, true, t),
            ReleaseAction::Nothing
        );
        assert_eq!(
            release_action(&s, &OpenCheckpoint::Unknown, true, t),
            ReleaseAction::Retry
        );
        assert_eq!(
            release_action(&s, &OpenCheckpoint::Unknown, false, t),
            ReleaseAction::Nothing
        );
    }

    #[test]
    fn final_steps_do_nothing() {
        let t = Timeouts::default();
        for step in [BackupStep::Succeeded, BackupStep::Failed] {
            let s = status(step);
            assert_eq!(
                decide(&s, &observed(ready(), Snapshot::Absent), t),
                Decision::Done
            );
        }
    }
}

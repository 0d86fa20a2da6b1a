//! What a backup does next, from its recorded step and what is observed: a pure function, so
//! every step and every crash point is a unit test.
//!
//! The order that keeps a backup honest (QuestDB's backup guide,
//! <https://questdb.com/docs/operations/backup/>): `CHECKPOINT CREATE` right before the
//! snapshot is asked for; the snapshot's point in time is fixed once it is cut
//! (`status.creationTime`); the checkpoint must still be open in the same process then (a
//! restart leaves a stale `.checkpoint` a restore would silently roll back to); then
//! `CHECKPOINT RELEASE`; the backup succeeds only once the storage says the snapshot is ready.

use std::time::Duration;

use crate::api::{BackupReason, BackupStep, CheckpointHolder, QuestDBBackupStatus};

/// How long each wait may last before the backup fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// From `CHECKPOINT CREATE` until the snapshot is cut: the checkpoint is open meanwhile.
    pub cut: Duration,
    /// From the cut until the snapshot is ready to use.
    pub upload: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            cut: Duration::from_secs(10 * 60),
            upload: Duration::from_secs(6 * 3600),
        }
    }
}

/// The database, as far as a backup cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    Missing,
    Deleting,
    /// Not Running, or its pod is not Ready (the message says which).
    NotRunning(String),
    /// A failover or node move is under way (the message says which).
    Busy(String),
    /// Running; the process that would hold a checkpoint.
    Ready(CheckpointHolder),
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
    pub snapshot: Snapshot,
    /// Time since the checkpoint was created (`status.checkpointAt`).
    pub since_checkpoint: Option<Duration>,
    /// Time since the backup left `Releasing` (the upload's start is the release).
    pub since_release: Option<Duration>,
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
    /// In `Checkpointing`: open the checkpoint (or find it open), then record `Snapshotting`.
    Checkpoint,
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

const WAIT_POLL: Duration = Duration::from_secs(10);
const SNAPSHOT_POLL: Duration = Duration::from_secs(2);
const UPLOAD_POLL: Duration = Duration::from_secs(10);

pub fn decide(status: &QuestDBBackupStatus, obs: &Observed, timeouts: Timeouts) -> Decision {
    let step = status.step.unwrap_or(BackupStep::Pending);
    match step {
        BackupStep::Succeeded | BackupStep::Failed => Decision::Done,
        BackupStep::Pending => pending(obs),
        BackupStep::Checkpointing => match &obs.database {
            Database::Ready(holder) if Some(holder) != status.checkpoint.as_ref() => {
                // The process changed before the snapshot was asked for: nothing of the old
                // one is in any snapshot, so a checkpoint in the new one is as good.
                Decision::StartCheckpoint(holder.clone())
            }
            Database::Ready(_) => Decision::Checkpoint,
            Database::Missing | Database::Deleting => Decision::Fail {
                reason: BackupReason::QuestDBDeleted,
                message: "the QuestDB was deleted during the backup".into(),
            },
            // Unreachable for now (moving, restarting): the checkpoint, if any, went with it.
            Database::NotRunning(_) | Database::Busy(_) => pending(obs),
        },
        BackupStep::Snapshotting => snapshotting(status, obs, timeouts),
        BackupStep::Releasing => Decision::FinishRelease,
        BackupStep::Uploading => uploading(obs, timeouts),
    }
}

fn pending(obs: &Observed) -> Decision {
    let wait = |reason, message: String, requeue| Decision::Wait {
        reason,
        message,
        requeue,
    };
    match &obs.database {
        Database::Missing => wait(
            BackupReason::QuestDBNotFound,
            "the QuestDB does not exist".into(),
            Duration::from_secs(30),
        ),
        Database::Deleting => Decision::Fail {
            reason: BackupReason::QuestDBDeleted,
            message: "the QuestDB is being deleted".into(),
        },
        Database::NotRunning(why) => wait(BackupReason::DatabaseNotRunning, why.clone(), WAIT_POLL),
        Database::Busy(why) => wait(BackupReason::DatabaseBusy, why.clone(), WAIT_POLL),
        Database::Ready(_) if matches!(obs.snapshot, Snapshot::ApiMissing) => wait(
            BackupReason::SnapshotApiMissing,
            SNAPSHOT_API_MISSING.into(),
            Duration::from_secs(60),
        ),
        Database::Ready(_) if obs.other_backup.is_some() => wait(
            BackupReason::AnotherBackupRunning,
            format!(
                "backup {} holds the database's checkpoint",
                obs.other_backup.as_deref().unwrap_or_default()
            ),
            WAIT_POLL,
        ),
        Database::Ready(holder) => Decision::StartCheckpoint(holder.clone()),
    }
}

pub const SNAPSHOT_API_MISSING: &str = "the VolumeSnapshot API (snapshot.storage.k8s.io/v1) is not served: install the CSI snapshot CRDs and the snapshot-controller, and a VolumeSnapshotClass for the volume's CSI driver";

fn snapshotting(status: &QuestDBBackupStatus, obs: &Observed, timeouts: Timeouts) -> Decision {
    let fail = |reason, message: String| Decision::Release {
        failure: Some((reason, message)),
    };
    let held_by_same_process = match &obs.database {
        Database::Ready(holder) => Some(holder) == status.checkpoint.as_ref(),
        _ => false,
    };
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
        Snapshot::Pending { cut: true } | Snapshot::Ready { .. } => Decision::Release { failure: None },
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
        Snapshot::Pending { .. } => Decision::Poll(UPLOAD_POLL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(uid: &str, restarts: i32) -> CheckpointHolder {
        CheckpointHolder {
            pod_uid: uid.into(),
            restart_count: restarts,
        }
    }

    fn status(step: BackupStep) -> QuestDBBackupStatus {
        QuestDBBackupStatus {
            step: Some(step),
            checkpoint: Some(holder("pod-1", 0)),
            ..Default::default()
        }
    }

    fn observed(database: Database, snapshot: Snapshot) -> Observed {
        Observed {
            database,
            other_backup: None,
            snapshot,
            since_checkpoint: Some(Duration::from_secs(1)),
            since_release: Some(Duration::from_secs(1)),
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
            decide(&s, &observed(ready(), Snapshot::Pending { cut: true }), t),
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
                    failure(decide(&s, &observed(db.clone(), snap), t)),
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
        assert_eq!(
            decide(&s, &observed(ready(), Snapshot::Pending { cut: true }), t),
            Decision::Poll(UPLOAD_POLL)
        );
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

//! The checkpoint watchdog: every Running database's `checkpoint_status()`, asked on the
//! write-health poll. While a checkpoint is open QuestDB purges no WAL segment and no old
//! partition version (QuestDB's backup guide: "the database will not clean up ... until the
//! checkpoint is released"), so one left open fills the disk, then tables suspend and ILP rows
//! are dropped. A checkpoint open past the backup's checkpoint limit that no backup is cutting
//! is released when a backup of the operator's opened it (its recorded `started_at`, or one
//! started within its unanswered CREATE) and reported either way: condition
//! `CheckpointReleased`, a Warning event, and `questdb_operator_checkpoint_open_seconds`.
//! A checkpoint the operator did not open is never released by it: its owner may still be
//! copying the files.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::api::{BackupStep, CheckpointReason, EventReason, QuestDB, QuestDBBackupStatus};
use crate::controllers::context::Context;
use crate::plan::backup::{owner, Owner, Timeouts};
use crate::plan::conditions::Verdict;
use crate::questdb_http::Database;

/// A backup of the database, as the watchdog sees it.
pub(crate) struct BackupView<'a> {
    pub name: &'a str,
    pub status: &'a QuestDBBackupStatus,
}

/// What the watchdog found and does.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Watch {
    pub condition: Verdict<CheckpointReason>,
    /// Seconds the open checkpoint has been open (0: none).
    pub open_seconds: i64,
    /// Release the open checkpoint: the operator's backup of this name opened it and left it.
    pub release_for: Option<String>,
}

/// `open`: the open checkpoint's `started_at` as the database reports it, `None` when none is.
pub(crate) fn watch(
    open: Option<&str>,
    now: Timestamp,
    backups: &[BackupView<'_>],
    timeouts: Timeouts,
) -> Watch {
    let Some(started_at) = open else {
        return Watch {
            condition: Verdict::new(
                true,
                CheckpointReason::NoCheckpointOpen,
                "no checkpoint is open",
            ),
            open_seconds: 0,
            release_for: None,
        };
    };
    let age = started_at
        .parse::<Timestamp>()
        .ok()
        .and_then(|t| Duration::try_from(now.duration_since(t)).ok())
        .unwrap_or_default();
    let open_seconds = age.as_secs() as i64;
    let ours = backups
        .iter()
        .find(|b| owner(b.status, started_at, timeouts) != Owner::Foreign);
    // A backup still on its way holds it and ends it by its own time limits.
    let held = ours.filter(|b| b.status.step.is_some_and(BackupStep::holds_checkpoint));
    if let Some(b) = held {
        return Watch {
            condition: Verdict::new(
                true,
                CheckpointReason::HeldByBackup,
                format!(
                    "backup {} holds the checkpoint open since {started_at}",
                    b.name
                ),
            ),
            open_seconds,
            release_for: None,
        };
    }
    if age <= timeouts.cut {
        return Watch {
            condition: Verdict::new(
                true,
                CheckpointReason::CheckpointWithinLimit,
                format!(
                    "a checkpoint is open since {started_at}, within the {}s a checkpoint may stay open",
                    timeouts.cut.as_secs()
                ),
            ),
            open_seconds,
            release_for: None,
        };
    }
    match ours {
        Some(b) => Watch {
            condition: Verdict::new(
                false,
                CheckpointReason::CheckpointLeftOpen,
                format!(
                    "backup {} ({}) left its checkpoint open since {started_at} ({}s): released by the operator",
                    b.name,
                    b.status.step.map_or("new", |s| s.as_str()),
                    age.as_secs()
                ),
            ),
            open_seconds,
            release_for: Some(b.name.to_string()),
        },
        None => Watch {
            condition: Verdict::new(
                false,
                CheckpointReason::CheckpointLeftOpen,
                format!(
                    "a checkpoint no backup of the operator opened has been open since {started_at} ({}s): QuestDB keeps every WAL segment and old partition until it is released, and the disk fills; whoever ran CHECKPOINT CREATE should run CHECKPOINT RELEASE (the operator never releases a checkpoint it did not open, and its backups of this database wait meanwhile)",
                    age.as_secs()
                ),
            ),
            open_seconds,
            release_for: None,
        },
    }
}

/// Asks `db` for its checkpoint, releases it when [`watch`] says so, and reports: the metric
/// always, a Warning event when a checkpoint is first found left open, a Normal one when the
/// operator released it. `None`: the database did not answer (the last verdict stands).
pub(crate) async fn check(
    ctx: &Context,
    qdb: &QuestDB,
    db: &Database,
    timeouts: Timeouts,
) -> Option<Verdict<CheckpointReason>> {
    let ns = qdb.namespace().unwrap_or_default();
    let open = match db.checkpoint_started_at().await {
        Ok(open) => open,
        Err(e) => {
            debug!(questdb = %qdb.name_any(), error = %e, "checkpoint_status() unanswered");
            return None;
        }
    };
    let backups: Vec<std::sync::Arc<crate::api::QuestDBBackup>> = ctx
        .backups
        .get()
        .map(|store| {
            store
                .state()
                .into_iter()
                .filter(|b| b.namespace().as_deref() == Some(ns.as_str()))
                .filter(|b| b.spec.questdb_name == qdb.name_any())
                .collect()
        })
        .unwrap_or_default();
    let statuses: Vec<(String, QuestDBBackupStatus)> = backups
        .iter()
        .map(|b| (b.name_any(), b.status.clone().unwrap_or_default()))
        .collect();
    let views: Vec<BackupView<'_>> = statuses
        .iter()
        .map(|(name, status)| BackupView { name, status })
        .collect();
    let w = watch(open.as_deref(), Timestamp::now(), &views, timeouts);
    ctx.metrics
        .set_checkpoint_open_seconds(&ns, &qdb.name_any(), w.open_seconds);
    let before = crate::controllers::context::polled(qdb, &ctx.checkpoints);
    let newly_left_open = !w.condition.status && before.as_ref().is_none_or(|b| b.status);
    if newly_left_open {
        warn!(questdb = %qdb.name_any(), namespace = %ns, message = %w.condition.message, "checkpoint left open");
        ctx.event_for(
            &qdb.object_ref(&()),
            EventType::Warning,
            EventReason::CheckpointLeftOpen,
            "CheckpointWatch",
            w.condition.message.clone(),
        )
        .await;
    }
    if let Some(backup) = &w.release_for {
        match db.checkpoint_release().await {
            Ok(()) => {
                info!(questdb = %qdb.name_any(), namespace = %ns, %backup, "released a checkpoint the operator's backup left open");
                ctx.event_for(
                    &qdb.object_ref(&()),
                    EventType::Normal,
                    EventReason::CheckpointReleased,
                    "CheckpointWatch",
                    format!("released the checkpoint backup {backup} left open"),
                )
                .await;
                ctx.metrics
                    .set_checkpoint_open_seconds(&ns, &qdb.name_any(), 0);
            }
            Err(e) => {
                warn!(questdb = %qdb.name_any(), %backup, error = %e, "CHECKPOINT RELEASE of a checkpoint left open failed; asking again on the next poll")
            }
        }
    }
    Some(w.condition)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const STARTED: &str = "2026-11-28T10:00:00.000000Z";

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn status(step: BackupStep, started: Option<&str>) -> QuestDBBackupStatus {
        QuestDBBackupStatus {
            step: Some(step),
            checkpoint_requested_at: Some(Time(at("2026-11-28T09:59:59Z"))),
            checkpoint_started_at: started.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn no_checkpoint_open_is_healthy_and_counts_zero() {
        let w = watch(None, at("2026-11-28T12:00:00Z"), &[], Timeouts::default());
        assert!(w.condition.status);
        assert_eq!((w.open_seconds, w.release_for), (0, None));
    }

    /// The harm: a checkpoint left open fills the disk; one the operator opened and lost track
    /// of (a backup that failed or was deleted before its release) is released.
    #[test]
    fn a_checkpoint_a_finished_backup_left_open_past_the_limit_is_released() {
        let t = Timeouts::default();
        let late = at("2026-11-28T10:30:00Z");
        for step in [
            BackupStep::Failed,
            BackupStep::Succeeded,
            BackupStep::Pending,
        ] {
            let s = status(step, Some(STARTED));
            let w = watch(
                Some(STARTED),
                late,
                &[BackupView {
                    name: "b1",
                    status: &s,
                }],
                t,
            );
            assert!(!w.condition.status, "{step:?}");
            assert_eq!(w.condition.reason, CheckpointReason::CheckpointLeftOpen);
            assert_eq!(w.release_for.as_deref(), Some("b1"), "{step:?}");
            assert_eq!(w.open_seconds, 1800);
        }
        // One whose CREATE went unanswered (started within it) is the backup's too.
        let s = status(BackupStep::Failed, None);
        let w = watch(
            Some(STARTED),
            late,
            &[BackupView {
                name: "b1",
                status: &s,
            }],
            t,
        );
        assert_eq!(w.release_for.as_deref(), Some("b1"));
    }

    /// The harm: releasing a checkpoint a person opened to copy the files by hand.
    #[test]
    fn a_checkpoint_nobody_of_the_operator_opened_is_reported_never_released() {
        let t = Timeouts::default();
        // Yesterday's backup, which opened (and released) yesterday's checkpoint.
        let other = QuestDBBackupStatus {
            step: Some(BackupStep::Failed),
            checkpoint_requested_at: Some(Time(at("2026-11-27T09:59:59Z"))),
            checkpoint_started_at: Some("2026-11-27T10:00:00.000000Z".into()),
            ..Default::default()
        };
        let w = watch(
            Some(STARTED),
            at("2026-11-28T11:00:00Z"),
            &[BackupView {
                name: "old",
                status: &other,
            }],
            t,
        );
        assert!(!w.condition.status);
        assert_eq!(w.release_for, None);
        assert!(
            w.condition.message.contains("CHECKPOINT RELEASE"),
            "{}",
            w.condition.message
        );
    }

    #[test]
    fn a_backup_cutting_its_checkpoint_or_a_young_checkpoint_is_left_alone() {
        let t = Timeouts::default();
        let s = status(BackupStep::Snapshotting, Some(STARTED));
        let w = watch(
            Some(STARTED),
            at("2026-11-28T11:00:00Z"),
            &[BackupView {
                name: "b1",
                status: &s,
            }],
            t,
        );
        assert_eq!(
            (w.condition.status, w.condition.reason),
            (true, CheckpointReason::HeldByBackup)
        );
        assert_eq!(w.release_for, None);
        let w = watch(Some(STARTED), at("2026-11-28T10:05:00Z"), &[], t);
        assert_eq!(
            (w.condition.status, w.condition.reason, w.release_for),
            (true, CheckpointReason::CheckpointWithinLimit, None)
        );
        assert_eq!(w.open_seconds, 300);
    }
}

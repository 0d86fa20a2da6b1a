//! The `QuestDBBackupSchedule` custom resource: `QuestDBBackup`s of one database made on a
//! cron schedule, the last `retention` successful ones kept (and none older than
//! `retentionDays` but the newest success). The backups are not owned by the schedule:
//! deleting a schedule stops new runs and keeps every backup it made, because a schedule
//! deleted by mistake (or by a GitOps prune) must not take the backups with it. Like a CronJob: UTC, a missed run
//! is made late only within `startingDeadlineSeconds`, and never two at once.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backup::BackupDeletionPolicy;

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "crd.questdb.io",
    version = "v1beta1",
    kind = "QuestDBBackupSchedule",
    plural = "questdbbackupschedules",
    singular = "questdbbackupschedule",
    shortname = "qdbschedule",
    namespaced,
    status = "QuestDBBackupScheduleStatus",
    printcolumn = r#"{"name":"Database","type":"string","jsonPath":".spec.questdbName"}"#,
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#,
    printcolumn = r#"{"name":"Suspend","type":"boolean","jsonPath":".spec.suspend"}"#,
    printcolumn = r#"{"name":"Active","type":"string","jsonPath":".status.active"}"#,
    printcolumn = r#"{"name":"LastSuccess","type":"date","jsonPath":".status.lastSuccessfulTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct QuestDBBackupScheduleSpec {
    /// The QuestDB to back up, in the schedule's namespace.
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 63").message("questdbName must be the name of a QuestDB"))]
    pub questdb_name: String,
    /// Cron schedule in UTC (`minute hour day-of-month month day-of-week`, or `@daily` etc.).
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 100").message("schedule must be a cron expression such as '0 2 * * *'"))]
    pub schedule: String,
    /// How many successful backups to keep (the newest); older ones are deleted, and failed
    /// ones older than the oldest kept.
    #[serde(default = "default_retention")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000").message("retention must be between 1 and 1000"))]
    pub retention: i32,
    /// Also delete backups older than this many days (by creation), beside `retention`'s
    /// count; the newest successful backup is always kept, however old, so a schedule whose
    /// runs fail never ends with none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 3650").message("retentionDays must be between 1 and 3650"))]
    pub retention_days: Option<i32>,
    /// No new backups while true; retention still applies.
    #[serde(default)]
    pub suspend: bool,
    /// A run missed (operator down, schedule suspended) by more than this many seconds is
    /// skipped rather than made late; unset: made however late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("startingDeadlineSeconds must not be negative"))]
    pub starting_deadline_seconds: Option<i64>,
    /// VolumeSnapshotClass of the backups' snapshots; the cluster's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// `deletionPolicy` of the backups made (what happens to a snapshot when retention
    /// deletes its backup): `Delete` by default, so retention frees the snapshots it drops.
    /// Deleting the schedule deletes none of its backups: they stay (labelled
    /// `crd.questdb.io/schedule`) until deleted by hand.
    #[serde(default = "delete_snapshots")]
    pub deletion_policy: BackupDeletionPolicy,
    /// Verify every Nth backup made (`spec.verify` on it): 1 verifies each, 7 one a week of a
    /// daily schedule. Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000").message("verifyEvery must be between 1 and 1000"))]
    pub verify_every: Option<i32>,
}

fn delete_snapshots() -> BackupDeletionPolicy {
    BackupDeletionPolicy::Delete
}

fn default_retention() -> i32 {
    7
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct QuestDBBackupScheduleStatus {
    /// The scheduled time of the newest run made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<String>,
    /// The backup of this schedule under way, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_backup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<String>,
    /// Why the last run was not made, or the schedule is invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The newest backups of this schedule (name and step), newest first, at most ten.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<ScheduledBackup>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledBackup {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

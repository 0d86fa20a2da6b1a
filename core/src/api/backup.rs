//! The `QuestDBBackup` custom resource: one backup of one database, a QuestDB checkpoint
//! held open while a CSI VolumeSnapshot of its volume is taken.
//!
//! Its steps are recorded in `status.step` before each side effect, like a failover's, so an
//! operator restarted at any point finds the checkpoint it opened and the snapshot it asked for.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A backup of the QuestDB `questdbName` in the same namespace. Immutable once created.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "crd.questdb.io",
    version = "v1beta1",
    kind = "QuestDBBackup",
    plural = "questdbbackups",
    singular = "questdbbackup",
    shortname = "qdbbackup",
    namespaced,
    status = "QuestDBBackupStatus",
    printcolumn = r#"{"name":"Database","type":"string","jsonPath":".spec.questdbName"}"#,
    printcolumn = r#"{"name":"Step","type":"string","jsonPath":".status.step"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason"}"#,
    printcolumn = r#"{"name":"Snapshot","type":"string","jsonPath":".status.snapshotName"}"#,
    printcolumn = r#"{"name":"Size","type":"string","jsonPath":".status.restoreSize"}"#,
    printcolumn = r#"{"name":"Verified","type":"string","jsonPath":".status.conditions[?(@.type==\"Verified\")].status"}"#,
    printcolumn = r#"{"name":"Duration","type":"integer","priority":1,"jsonPath":".status.durationSeconds"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("a backup's spec is immutable: create a new QuestDBBackup"))]
pub struct QuestDBBackupSpec {
    /// The QuestDB to back up, in the backup's namespace.
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 63").message("questdbName must be the name of a QuestDB"))]
    pub questdb_name: String,
    /// VolumeSnapshotClass of the snapshot; the cluster's default class when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 253").message("volumeSnapshotClassName must be a VolumeSnapshotClass name"))]
    pub volume_snapshot_class_name: Option<String>,
    /// What happens to the VolumeSnapshot when this backup is deleted: `Retain` (the default)
    /// keeps it, so deleting the backup object by mistake loses no data; `Delete` deletes it
    /// with the backup. (A schedule's backups are made with the schedule's own policy.)
    #[serde(default)]
    pub deletion_policy: BackupDeletionPolicy,
    /// Prove the backup by restoring it: once it succeeds, its snapshot is restored into a
    /// throwaway QuestDB of the same image (`verify-<backup>`: no dedicated node, no DNS, its
    /// own credentials, reachable by the operator only), which is opened (QuestDB's checkpoint
    /// recovery), every table recorded at the checkpoint counted again, then deleted with its
    /// volume. Condition `Verified` says the result, naming the tables that differ. It needs
    /// room for one more database of the source's size while it runs (minutes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify: bool,
}

/// Whether a backup's VolumeSnapshot goes with it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackupDeletionPolicy {
    Delete,
    #[default]
    Retain,
}

/// The steps of a backup, in order. `Succeeded` and `Failed` are final.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackupStep {
    /// Waiting until the database is Running and nothing else (a failover, a node move,
    /// another backup) holds it; `reason` says what it waits for.
    Pending,
    /// `CHECKPOINT CREATE` is being (or has been) sent to the database.
    Checkpointing,
    /// The VolumeSnapshot was asked for; waiting until it is ready to use.
    Snapshotting,
    /// The snapshot is cut (its point in time fixed): `CHECKPOINT RELEASE` is being sent;
    /// `failed` says whether the backup failed on the way.
    Releasing,
    /// The checkpoint is released; the storage is still copying the snapshot (an EBS snapshot
    /// is `pending` until `completed`), which may fail.
    Uploading,
    Succeeded,
    Failed,
}

impl BackupStep {
    pub const ALL: [BackupStep; 7] = [
        BackupStep::Pending,
        BackupStep::Checkpointing,
        BackupStep::Snapshotting,
        BackupStep::Releasing,
        BackupStep::Uploading,
        BackupStep::Succeeded,
        BackupStep::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BackupStep::Pending => "Pending",
            BackupStep::Checkpointing => "Checkpointing",
            BackupStep::Snapshotting => "Snapshotting",
            BackupStep::Releasing => "Releasing",
            BackupStep::Uploading => "Uploading",
            BackupStep::Succeeded => "Succeeded",
            BackupStep::Failed => "Failed",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, BackupStep::Succeeded | BackupStep::Failed)
    }

    /// Steps during which the database's checkpoint may be open.
    pub fn holds_checkpoint(self) -> bool {
        matches!(
            self,
            BackupStep::Checkpointing | BackupStep::Snapshotting | BackupStep::Releasing
        )
    }
}

/// Observed state, written only by the operator.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct QuestDBBackupStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<BackupStep>,
    /// Why the backup waits (step `Pending`) or failed (step `Failed`, or `Releasing` on the
    /// way there), as a CamelCase reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Set when the backup failed after the checkpoint was opened: the checkpoint is released
    /// first, then the step becomes `Failed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
    /// The VolumeSnapshot holding the data (in the backup's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_name: Option<String>,
    /// The size a volume restored from the snapshot needs, from the snapshot's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<String>,
    /// The database pod the checkpoint was opened in: a different pod (or a restarted
    /// container) when the snapshot is ready means the checkpoint was lost with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointHolder>,
    /// The tables at checkpoint time: counted just before `CHECKPOINT CREATE`, so the backup
    /// holds at least these rows (writes go on during a checkpoint).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<TableFacts>,
    /// When the backup began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the backup last sent `CHECKPOINT CREATE` (recorded before it is sent): a checkpoint
    /// found open after a crash whose `started_at` is no earlier is the one it sent, anything
    /// else is not the backup's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_requested_at: Option<Time>,
    /// The checkpoint's `started_at` as the database reports it (`checkpoint_status()`), read
    /// once `CHECKPOINT CREATE` returned: the backup's own checkpoint is the open one with this
    /// `started_at`, at the cut and at the release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_started_at: Option<String>,
    /// When `CHECKPOINT CREATE` returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_at: Option<Time>,
    /// The QuestDB version the database reported at the checkpoint (`build()`): a restore into
    /// an older version would open data it may not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub questdb_version: Option<String>,
    /// When the checkpoint was released (the snapshot's upload runs on from there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
    /// When the backup succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<i64>,
    /// The verification (`spec.verify`) under way or done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    /// `Verified`: True once a restore of the backup held every table recorded at its
    /// checkpoint with at least its rows and newest timestamp; False naming what differs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// The steps of a verification, each recorded before its side effect.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyStep {
    /// The throwaway QuestDB restoring the snapshot is being created, or starting.
    Restoring,
    /// The result is recorded; the throwaway QuestDB (and its volume) is being deleted.
    CleaningUp,
    /// Nothing of the verification is left.
    Done,
}

/// A backup's verification.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<VerifyStep>,
    /// The throwaway QuestDB (owned by the backup).
    pub database: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The tables compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables_checked: Option<i32>,
}

/// Which process held the checkpoint.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointHolder {
    pub pod_uid: String,
    pub restart_count: i32,
}

/// One table as the database reported it at checkpoint time.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TableFacts {
    pub name: String,
    pub rows: i64,
    /// The newest designated timestamp, when the table has one and rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_timestamp: Option<String>,
}

//! Types of the `crd.questdb.io` API and the names the operator stamps on what it owns.

mod backup;
mod backup_schedule;
mod pod;
mod questdb;
mod reason;

pub use backup::*;
pub use backup_schedule::*;
pub use pod::{
    reserved_mount_message, reserved_mount_path, restricted_problems, PodOptions,
    RESERVED_MOUNT_DIRS, RESERVED_VOLUMES,
};
pub use questdb::*;
pub use reason::*;

/// API group of the operator's resources.
pub const GROUP: &str = "crd.questdb.io";
/// Annotation on a Secret that maps it to a QuestDB in the same namespace (ILP auth keys).
pub const SECRET_QUESTDB_ANNOTATION: &str = "crd.questdb.io/name";
/// Finalizer that guards cloud resources (instance, DNS record) and PVC retention.
pub const FINALIZER: &str = "crd.questdb.io/finalizer";
/// Finalizer on a `QuestDBBackup` while it may hold the database's checkpoint open: deleting
/// the backup then releases the checkpoint first.
pub const BACKUP_FINALIZER: &str = "crd.questdb.io/checkpoint";
/// Label on the VolumeSnapshot of a backup: the backup's name.
pub const BACKUP_LABEL: &str = "crd.questdb.io/backup";
/// Label on a backup made by a `QuestDBBackupSchedule`: the schedule's name.
pub const SCHEDULE_LABEL: &str = "crd.questdb.io/schedule";
/// On a throwaway QuestDB a backup's verification restores into: the backup's name.
pub const VERIFIES_LABEL: &str = "crd.questdb.io/verifies";
/// Annotation a user puts on an existing object (a PVC, ConfigMap or Service with a colliding
/// name, e.g. from a migration) to hand it over to the QuestDB of that name. Without it, only
/// objects carrying the operator's labels for that QuestDB are ever adopted.
pub const ADOPT_ANNOTATION: &str = "crd.questdb.io/adopt";
/// Field manager / event reporter name.
pub const MANAGER: &str = "questdb-operator";

/// Selector labels: the operator's own, stable, never the user's (selectors are immutable).
pub mod labels {
    pub const NAME: &str = "app.kubernetes.io/name";
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const NAME_VALUE: &str = "questdb";
    pub const MANAGED_BY_VALUE: &str = "questdb-operator";
}

/// Condition types written to `status.conditions`.
pub mod conditions {
    pub const READY: &str = "Ready";
    pub const ILP_AUTH_READY: &str = "IlpAuthReady";
    pub const NODE_READY: &str = "NodeReady";
    pub const DNS_READY: &str = "DnsReady";
    /// Whether the database's credentials Secret exists and holds every key.
    pub const CREDENTIALS_READY: &str = "CredentialsReady";
    /// Whether the current spec could be built; False keeps a running database on its last
    /// good spec, with every other condition and column as it was.
    pub const SPEC_VALID: &str = "SpecValid";
    /// Whether the volume requests what `spec.volume.size` asks (or more: volumes never
    /// shrink); False when its StorageClass cannot expand it.
    pub const VOLUME_SIZE_READY: &str = "VolumeSizeReady";
    /// Automatic failover of the dedicated node: True while nothing holds it back (or it is
    /// under way), False with reason `FailoverSuppressed`/`FailoverStuck` when a person should
    /// look.
    pub const FAILOVER: &str = "Failover";
    /// A move to a node of a new image or instance type: `Moving` (with the step) while it
    /// runs, `UpToDate` when the node matches the spec, False with the reason it waits or was
    /// aborted.
    pub const NODE_MOVE: &str = "NodeMove";
    /// `NodeMove`'s name before the rename: a status that still carries it drops it.
    pub const LEGACY_NODE_UPGRADE: &str = "NodeUpgrade";
    /// Only with `spec.volume.restoreFrom`: whether the volume was created from the backup
    /// (False while the backup is not ready, or when an existing volume is in the way).
    pub const VOLUME_RESTORED: &str = "VolumeRestored";
    /// The database's own view of its writes (`wal_tables()`): False with the suspended or
    /// lagging tables named. Absent until the first poll of a Running database.
    pub const WRITE_HEALTHY: &str = "WriteHealthy";
    /// Whether a checkpoint is left open (`checkpoint_status()`, asked with `WriteHealthy`):
    /// False with reason `CheckpointLeftOpen` when one is open past the backup checkpoint
    /// limit with no backup cutting it. Absent until the first poll of a Running database.
    pub const CHECKPOINT_RELEASED: &str = "CheckpointReleased";
    /// The newest verification of the database's backups (`QuestDBBackup` `spec.verify`):
    /// True naming the newest backup proven by restoring it and when it was taken, False
    /// when the newest verification failed. Absent until a backup of it is verified.
    pub const BACKUP_VERIFIED: &str = "BackupVerified";
    /// A change of QuestDB version (`spec.image`) of a database that has run: False with the
    /// step while it waits, stops, snapshots, starts or rolls back; True `Upgraded` once the
    /// new version ran ready; False `RolledBack` while the old one runs again.
    pub const VERSION_UPGRADE: &str = "VersionUpgrade";
    /// The volume's file system, from the kubelet's volume statistics: True `Room` or
    /// `Growing`; False past the threshold when nothing grows it (`Filling`, `AtMaximum`,
    /// `NotExpandable`) or when the statistics cannot be read. Absent until the first poll
    /// of a Running database.
    pub const DISK_SPACE: &str = "DiskSpace";
}

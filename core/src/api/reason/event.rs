//! The reasons that are not a condition's: events, a backup's status, and why a due failover
//! is held back.

use strum::{Display, EnumIter, EnumString, IntoStaticStr};

use super::reason_text;

/// Every event reason the operator publishes (on a QuestDB, a backup, a schedule or a Node),
/// including the reconcile errors of `questdb_operator_reconcile_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum EventReason {
    // Children and the spec.
    Created,
    Adopted,
    Updated,
    /// A child could not be written.
    ApplyFailed,
    /// A child the operator would create exists and is not ours.
    ChildConflict,
    /// The QuestDB (or a schedule) fails validation.
    InvalidSpec,
    /// The QuestDB does not parse (another schema version).
    Unreadable,
    /// Deletion waits for cloud resources that no provider can clean up.
    CleanupBlocked,

    // Credentials and ILP auth: the condition's reason, said once.
    /// The operator generated `<name>-credentials`.
    CredentialsGenerated,
    SecretNotFound,
    MissingKeys,
    DefaultPassword,
    NoKeys,
    InvalidSecret,
    DuplicateKid,

    // The database container: `Ready`'s reason, said once per cause.
    CrashLoop,
    OutOfMemory,
    ImagePullFailed,
    ContainerConfigError,
    Unschedulable,
    PodRefused,
    VolumePending,

    // The dedicated node.
    /// A status record names an instance that is not this QuestDB's: nothing is done to it.
    InstanceNotOwned,
    /// A dedicated Node reports an address its EC2 instance does not have.
    NodeAddressUntrusted,
    NodeIdentityConflict,
    NodeNeverJoined,
    LaunchFailed,
    /// A new operator version builds a different pod template: the restart waits for an
    /// upgrade slot or the maintenance window.
    OperatorRolloutHeld,
    // Settings.
    /// Reloadable settings were reloaded into the running database, no restart.
    ConfigReloaded,
    /// Reloadable settings the running database would not take in place: it restarts.
    ConfigRestart,
    /// A preflight check of what the operator needs failed (on the operator's own Pod).
    PreflightFailed,
    RelaunchBackoff,
    RelaunchCapped,
    NodeGone,
    /// The operator terminates the node (the volume is kept).
    Releasing,

    // DNS.
    DnsPublished,
    DnsRejected,
    RecordOwnedElsewhere,

    // Version upgrades (`spec.image`).
    /// The upgrade waits: the snapshot cannot be taken (Warning).
    VersionUpgradeHeld,
    /// The new version ran ready.
    VersionUpgraded,
    /// The new version was not ready in time (or the image was set back): it is stopped and
    /// the old version and its data are put back (Warning).
    VersionRollingBack,
    /// The old version runs again on the data from the snapshot (Warning).
    VersionRolledBack,

    // The volume's space (`spec.volume.autoGrow`).
    /// The volume is past its threshold: its claim is expanded by a step.
    VolumeGrowing,
    /// The volume is past its threshold and already at `autoGrow.maximum` (Warning).
    VolumeAtMaximum,
    /// WAL tables suspended while the volume was full were resumed once there was room.
    TablesResumed,

    // Failover: one per step entered.
    FailoverSuppressed,
    FailoverStarted,
    FailoverFencing,
    FailoverReleasing,
    FailoverReattaching,
    FailoverRecovering,
    FailoverDraining,
    FailoverHealthy,
    FailoverSucceeded,
    FailoverStuck,
    /// A failover's replacement died, stopped or never joined before the failover ended: it
    /// is fenced and replaced in turn.
    ReplacementFailed,
    /// A pause, deletion or node removal ended a failover once its fence and release were
    /// done: the fenced instances are terminated, and the release goes on.
    FailoverEnded,
    /// A fence's normal stop did not end in time: the stop is forced (a power cut for what
    /// the database had not synced).
    FenceForced,
    /// A release waited on a pod stuck on a dead node: the node was fenced instead.
    ReleaseFenced,

    // Node moves: one per step entered.
    NodeMoveStarted,
    /// EC2 scheduled a retirement, stop, reboot or maintenance of the database's instance: a
    /// planned move replaces the node before it.
    ScheduledEvent,
    NodeMoveValidating,
    NodeMoveProvisioning,
    NodeMoveNodeReady,
    NodeMoveStopping,
    NodeMoveMoving,
    NodeMoveVerifying,
    NodeMoveRetaining,
    NodeMoveCompleted,
    NodeMoveAborted,
    NodeMoveRolledBack,
    NodeMoveRollingBack,
    NodeMoveStuck,

    // Backups and schedules.
    BackupStarted,
    BackupCheckpointed,
    BackupSucceeded,
    BackupFailed,
    /// A restore of the backup held every table recorded at its checkpoint.
    BackupVerified,
    /// A restore of the backup differs from what was recorded, or could not be made (Warning).
    BackupVerificationFailed,
    /// A schedule made a backup.
    BackupScheduled,
    /// A schedule skipped a run (past its starting deadline).
    BackupSkipped,
    /// A checkpoint is open past the checkpoint limit with no backup cutting it (Warning).
    CheckpointLeftOpen,
    /// The operator released a checkpoint its own backup left open.
    CheckpointReleased,

    // Orphaned instances (on the Node).
    OrphanSweepHeldBack,
    OrphanTerminated,

    // Failed reconciles (one Warning per streak).
    MissingNamespace,
    MissingUid,
    StaleCache,
    Conflict,
    KubernetesApiError,
    CloudApiError,
}

/// A QuestDBBackup's `status.reason`: what it waits for, or why it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum BackupReason {
    /// Waiting: the QuestDB does not exist.
    QuestDBNotFound,
    /// Waiting: the database is not Running (or its pod not Ready).
    DatabaseNotRunning,
    /// Waiting: a failover or node move is under way.
    DatabaseBusy,
    /// Waiting: another backup of the same database holds its checkpoint.
    AnotherBackupRunning,
    /// Waiting: a checkpoint this backup did not open is open in the database (a user's, or
    /// another tool's): a backup never takes over a checkpoint it did not open, whose point in
    /// time it does not know.
    ForeignCheckpoint,
    /// The VolumeSnapshot API (the CSI snapshot CRDs) is not installed.
    SnapshotApiMissing,
    /// `CHECKPOINT CREATE` (or a query around it) failed.
    CheckpointFailed,
    /// The database's HTTP credentials could not be read.
    CredentialsUnavailable,
    /// The VolumeSnapshot reports an error.
    SnapshotFailed,
    /// The VolumeSnapshot did not become ready in time.
    SnapshotTimeout,
    /// The database restarted (or moved) while the checkpoint was open: the snapshot may
    /// roll back to a stale checkpoint, so it is not a backup.
    CheckpointLost,
    /// The QuestDB was deleted during the backup.
    QuestDBDeleted,
    /// A failure recorded without a reason this operator knows.
    BackupFailed,
}

/// Why a due failover is held back: the label values of
/// `questdb_operator_failovers_suppressed_total`, and the start of `Failover`'s message while
/// its reason is `FailoverSuppressed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum SuppressionReason {
    /// `spec.failover.enabled` is false.
    Disabled,
    /// The QuestDB carries the annotation that turns failover off.
    SkipAnnotation,
    /// The last failover was too recent.
    RecentFailover,
    /// Too many dedicated nodes are unhealthy at once (the circuit breaker).
    TooManyUnhealthyNodes,
    /// The replacement failed too, as many times as one failover replaces it.
    AttemptsExhausted,
    /// The node is silent but its database still answers the operator over its HTTP channel:
    /// a kubelet cut off from the API server, not a dead node.
    DatabaseAnswers,
}

reason_text!(EventReason, BackupReason, SuppressionReason);

//! The reasons that are not a condition's: events, a backup's status, and why a due failover
//! is held back.

use strum::{Display, EnumIter, EnumString, IntoStaticStr};

use super::reason_text;

/// Every event reason the operator publishes (on a QuestDB, a backup, a schedule or a Node),
/// including the reconcile errors of `questdb_operator_reconcile_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum EventReason {
    // Children and the spec.
    /// A child object was created (the message names it).
    Created,
    /// An ownerless child with this QuestDB's labels (or the adoption annotation) was taken over.
    Adopted,
    /// A child was changed to match the spec (the message names it).
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
    /// The Secret `spec.credentials.secretName` names does not exist (Warning).
    SecretNotFound,
    /// The credentials Secret lacks keys (named, never their values) (Warning).
    MissingKeys,
    /// The credentials Secret holds QuestDB's default password (Warning).
    DefaultPassword,
    /// ILP authentication is on and no Secret gives a key: every ILP client is refused.
    NoKeys,
    /// An annotated key Secret is rejected (named, never its contents); the valid keys are used
    /// (Warning).
    InvalidSecret,
    /// Two or more key Secrets give the same key id: none of their keys is used (Warning).
    DuplicateKid,

    // The database container: `Ready`'s reason, said once per cause.
    /// QuestDB exits at start and is restarted with back-off (Warning).
    CrashLoop,
    /// The kernel killed QuestDB for using more memory than its container's limit (Warning).
    OutOfMemory,
    /// The image (the QuestDB version) cannot be pulled (Warning).
    ImagePullFailed,
    /// The kubelet cannot build the container (a missing Secret or key in its env) (Warning).
    ContainerConfigError,
    /// The scheduler finds no node for the database pod (Warning).
    Unschedulable,
    /// The apiserver refuses to create the database pod (Warning).
    PodRefused,
    /// The database's volume claim cannot be bound (Warning).
    VolumePending,

    // The dedicated node.
    /// A status record names an instance that is not this QuestDB's: nothing is done to it.
    InstanceNotOwned,
    /// A dedicated Node reports an address its EC2 instance does not have.
    NodeAddressUntrusted,
    /// Two Nodes claim the dedicated instance, or its Node's name is not the instance's: none is
    /// dedicated (Warning).
    NodeIdentityConflict,
    /// A dedicated instance ran past `--node-join-timeout` and no Node joined for it: it is
    /// replaced (Warning).
    NodeNeverJoined,
    /// EC2 refused to launch the dedicated node (the message is EC2's) (Warning).
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
    /// The dedicated instance went away by itself: the next launch waits out a back-off (Warning).
    RelaunchBackoff,
    /// The dedicated instance went away again with 5 relaunches in the last hour: no launch until
    /// the hour passes (Warning).
    RelaunchCapped,
    /// The dedicated instance is gone (EC2's reason in the message): the next node generation is
    /// launched (Warning).
    NodeGone,
    /// The operator terminates the node (the volume is kept).
    Releasing,

    // DNS.
    /// The DNS record was written with the database's address.
    DnsPublished,
    /// The DNS name is not one this namespace may use, or Route53 refused the record (Warning).
    DnsRejected,
    /// A DNS record of this name is not this database's: it is never overwritten (Warning).
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
    /// A due failover is held back; the message says why ([`SuppressionReason`]) (Warning).
    FailoverSuppressed,
    /// A failover began: the dedicated node is taken for dead (the message says why) (Warning).
    FailoverStarted,
    /// A failover entered its fence: the old instance is stopped so it can no longer write.
    FailoverFencing,
    /// The old instance is fenced: its Node is tainted out-of-service so the pod and volume let go.
    FailoverReleasing,
    /// The old node let go: the database pod starts on the replacement node with the same volume.
    FailoverReattaching,
    /// The database pod runs on the replacement node: waiting for it to answer and DNS to follow.
    FailoverRecovering,
    /// The database answers again; the fenced instance keeps its address until the DNS TTL runs
    /// out.
    FailoverDraining,
    /// A failover entered its last step, `Healthy`: it is over.
    FailoverHealthy,
    /// A failover ended: the database answers on the replacement node and the fenced instances were
    /// terminated.
    FailoverSucceeded,
    /// A failover step ran past its timeout, or a fenced instance whose volume did not detach is
    /// terminated to free it (Warning).
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
    /// A node move began: the spec asks for another node, EC2 scheduled an event, the node was
    /// cordoned, or the spec was set back within the rollback window.
    NodeMoveStarted,
    /// EC2 scheduled a retirement, stop, reboot or maintenance of the database's instance: a
    /// planned move replaces the node before it.
    ScheduledEvent,
    /// A node move entered its first step: the new image and instance type are checked with EC2.
    NodeMoveValidating,
    /// The new image and instance type passed the checks: the new node is launched.
    NodeMoveProvisioning,
    /// The new node joined and is dedicated to the database; the switch waits for it to be Ready.
    NodeMoveNodeReady,
    /// The new node is Ready: the database stops on the old node (the downtime starts).
    NodeMoveStopping,
    /// The database stopped on the old node and let go of its volume: it starts on the new node.
    NodeMoveMoving,
    /// The database pod runs on the new node: waiting for it to be Ready and for DNS to name it.
    NodeMoveVerifying,
    /// The database answers on the new node; the old node is kept until the rollback window ends.
    NodeMoveRetaining,
    /// The rollback window is over and the old node was terminated: the move is complete.
    NodeMoveCompleted,
    /// A node move was aborted; the message starts with its `NodeMove` reason (Warning).
    NodeMoveAborted,
    /// A move was rolled back: the database answers on its old node again and the new instance was
    /// terminated (Warning).
    NodeMoveRolledBack,
    /// A move is undone after the database stopped: it goes back to the old node; the message
    /// starts with the reason (Warning).
    NodeMoveRollingBack,
    /// The node a move leaves holds the database past its grace period and the step timeout: its
    /// instance is fenced so the move goes on (Warning).
    NodeMoveStuck,

    // Backups and schedules.
    /// On a backup: it began; the database is being checkpointed.
    BackupStarted,
    /// On a backup: the database's checkpoint is open and the volume's snapshot is being taken.
    BackupCheckpointed,
    /// On a backup: its snapshot is ready to use (a verification, if asked for, follows).
    BackupSucceeded,
    /// On a backup: it failed; its `status.reason` and the message say why (Warning).
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
    /// On a Node: more instances look orphaned than one sweep may terminate, so none is (Warning).
    OrphanSweepHeldBack,
    /// On a Node: an instance whose QuestDB is gone, or an older node generation no record names,
    /// was terminated (Warning).
    OrphanTerminated,

    // Failed reconciles (one Warning per streak).
    /// A reconcile failed: the object has no namespace (Warning).
    MissingNamespace,
    /// A reconcile failed: the object has no uid (Warning).
    MissingUid,
    /// The operator's cache lags the apiserver: the reconcile is retried, not reported as failed.
    StaleCache,
    /// A write lost an optimistic-concurrency race (HTTP 409): it is retried, not reported as
    /// failed.
    Conflict,
    /// A reconcile failed on a Kubernetes API call; the message says which and why (Warning).
    KubernetesApiError,
    /// A reconcile failed on an AWS API call; the message says which and why (Warning).
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

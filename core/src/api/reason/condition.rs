//! One enum per condition type in `status.conditions`, each naming every reason that
//! condition can carry.

use strum::{Display, EnumIter, EnumString, IntoStaticStr};

use super::{reason_text, ConditionReason};
use crate::api::conditions;

/// `Ready`, and the phase beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum ReadyReason {
    /// The first reconcile: nothing applied yet.
    Creating,
    /// A child was just applied, or the StatefulSet has not rolled out.
    RollingOut,
    /// The database pod is not Ready.
    PodNotReady,
    /// The database pod is Ready.
    Running,
    /// `spec.paused`: the database is scaled to zero.
    Paused,
    /// The spec fails validation; nothing is applied.
    InvalidSpec,
    /// A child the operator would create exists and is not ours.
    ChildConflict,
    /// The database pod's node is not Ready.
    NodeNotReady,
    /// QuestDB exits at start and is restarted with back-off.
    CrashLoop,
    /// The kernel killed QuestDB for using more memory than its container's limit
    /// (`OOMKilled`); it is restarted.
    OutOfMemory,
    /// The image (the QuestDB version) cannot be pulled.
    ImagePullFailed,
    /// The kubelet cannot build the container (a missing Secret or key in its env).
    ContainerConfigError,
    /// The scheduler finds no node for the database pod (its placement fields, resources).
    Unschedulable,
    /// The apiserver refuses to create the database pod (Pod Security, a quota, an admission
    /// webhook): the StatefulSet controller's words, which otherwise only its events carry.
    PodRefused,
    /// The database's volume claim cannot be bound (no StorageClass set and none is the
    /// default, a class that does not exist, a provisioner that refuses): the persistent
    /// volume controller's or provisioner's words, which otherwise only the claim's events carry.
    VolumePending,
    /// Nothing is built until the volume's restore source exists.
    RestoreSourceNotFound,
    /// Nothing is built until the volume's restore source is ready.
    RestoreSourceNotReady,
    /// A volume of this name is in the way of the restore.
    RestoreRefused,
}

/// `SpecValid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum SpecValidReason {
    /// The spec passes the operator's validation.
    Valid,
    /// The spec fails the operator's validation; the message names the field.
    InvalidSpec,
}

/// `IlpAuthReady`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum IlpAuthReason {
    /// `spec.ilpAuth.enabled` is false.
    Disabled,
    /// Every annotated key Secret is valid and its key is in the ILP auth file.
    KeysLoaded,
    /// ILP authentication is on and no Secret gives a key: every ILP client is refused.
    NoKeys,
    /// An annotated key Secret is rejected (named, never its contents); the valid keys are used.
    InvalidSecret,
    /// Two or more key Secrets give the same key id: none of their keys is used.
    DuplicateKid,
}

/// `CredentialsReady`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum CredentialsReason {
    /// The credentials Secret holds every key.
    CredentialsFound,
    /// The Secret `spec.credentials.secretName` names does not exist.
    SecretNotFound,
    /// The credentials Secret lacks keys (named, never their values).
    MissingKeys,
    /// The credentials Secret holds QuestDB's default password.
    DefaultPassword,
}

/// `VolumeSizeReady`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum VolumeSizeReason {
    /// The volume's claim requests the size the spec asks for.
    AsRequested,
    /// The spec asks for a larger volume: the claim was grown and the volume is being resized.
    Expanding,
    /// The spec asks for more but the StorageClass does not allow expansion: the size is kept.
    NotExpandable,
    /// The volume requests more than the spec (volumes never shrink).
    Larger,
}

/// `NodeReady`: the dedicated node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum NodeReadyReason {
    /// The dedicated node runs, has joined and is Ready.
    Ready,
    /// The dedicated node's instance is being launched or is starting.
    Launching,
    /// The node is there, but the volume's CSI driver has not registered on it yet.
    WaitingForCsiDriver,
    /// The dedicated node has not joined (or has no address) yet.
    WaitingForNode,
    /// The dedicated node has joined but is not Ready.
    NodeNotReady,
    /// EC2 reports the dedicated instance stopping or stopped.
    InstanceStopped,
    /// EC2 refused to launch the dedicated node (the message is EC2's); it is tried again later.
    LaunchFailed,
    /// The operator's preflight found a network mistake EC2 would refuse every launch for:
    /// nothing is launched until it is fixed.
    PreflightFailed,
    /// The dedicated instance went away by itself: the next launch waits out a back-off.
    RelaunchBackoff,
    /// The dedicated node was relaunched 5 times in the last hour: no launch until the hour passes.
    RelaunchCapped,
    /// An instance was launched and never joined: it is terminated and replaced.
    NodeNeverJoined,
    /// Two Nodes claim the instance, or its Node's name is not the instance's: none is
    /// dedicated or pinned.
    NodeIdentityConflict,
    /// The node is being terminated (or EC2 is still shutting it down).
    Releasing,
    /// The node is gone and the volume kept: the end of a release, not a step of one.
    Released,
    /// `spec.node` was removed; the node goes once the pod has left it.
    MovingOff,
    /// The operator runs without the cloud provider this needs.
    NotConfigured,
    /// The namespace already has `--max-dedicated-nodes-per-namespace` databases with a node
    /// of their own: no first node is launched until one goes.
    NamespaceQuota,
}

/// `DnsReady`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum DnsReason {
    /// The DNS record names the database's address.
    Published,
    /// There is no address to publish yet (the dedicated node's, or the database pod's on it).
    WaitingForNode,
    /// The record was removed while the database is paused (its name stays reserved) or deleted.
    Removed,
    /// A record of this name exists that is not this database's: it is never overwritten.
    RecordOwnedElsewhere,
    /// The name is outside what this namespace may use, or Route53 refused the record.
    DnsRejected,
    /// The operator runs without the cloud provider or the Route53 hosted zone `spec.dns` needs.
    NotConfigured,
}

/// `Failover`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum FailoverReason {
    /// Failover is on and no failover is under way or due.
    Armed,
    /// `spec.failover.enabled` is false.
    Disabled,
    /// A failover is under way: the node is fenced and replaced (the message names the step).
    InProgress,
    /// The last failover succeeded: the database runs on the replacement node.
    Recovered,
    /// A due failover is held back ([`super::SuppressionReason`] says why, in the message).
    FailoverSuppressed,
    /// A failover step has run past its timeout (the message names the step).
    FailoverStuck,
    /// The record names an instance that is not this QuestDB's: nothing is done to it.
    InstanceNotOwned,
    NotConfigured,
}

/// `NodeMove`, and `status.nodeMove.reason`: why a move waits, was aborted or rolled back.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Display,
    IntoStaticStr,
    EnumIter,
    EnumString,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum NodeMoveReason {
    /// The node runs the image and instance type the spec asks for.
    UpToDate,
    /// A move to another node is under way (the message names the step).
    Moving,
    /// The move is done; the old node is kept for the rollback window (at least the DNS TTL).
    Retaining,
    /// A move is due but waits (the maintenance window, a move slot, a failover, a database not
    /// Ready, the retry of a failed replacement); the message says why.
    Waiting,
    /// The move ended before the switch; the database stays on its node.
    Aborted,
    /// The move was rolled back after the switch: the database runs on its old node again.
    RolledBack,
    /// The new image or instance type does not fit (unknown, unavailable, not EBS-backed, not
    /// offered in the zone, another architecture): the move is aborted.
    InvalidNode,
    /// EC2 refused to launch the new node: the move is aborted.
    LaunchFailed,
    /// The new instance ended before it joined (EC2's reason in the message): the move is aborted.
    InstanceGone,
    /// The new instance did not join as a Node the operator trusts in time: the move is aborted.
    NodeNeverJoined,
    /// The new node joined but did not become Ready in time: the move is aborted.
    NodeNeverReady,
    /// `spec.node` changed again before the database stopped: this move is aborted, the database
    /// stays on its node, and a move to the new target follows.
    Superseded,
    /// A failover started before the move stopped the database: the move starts again after it.
    Preempted,
    /// The database did not become Ready on the new node in time: it goes back to the old node.
    MoveFailed,
    /// `spec.node` was set back after the database stopped: it goes back to the old node.
    Reverted,
    /// The node the database was moving to stopped renewing its Lease after the switch.
    TargetNodeFailed,
    /// Both nodes of a move stopped answering after the switch: the move ends and a failover
    /// replaces the node.
    NodesFailed,
    /// The node a move leaves holds the database's pod or volume past its grace period and the
    /// step timeout: it is fenced. Kept in `status.nodeMove.reason`, where an operator before
    /// the rename wrote `UpgradeStuck`, which still reads as this.
    #[strum(to_string = "NodeMoveStuck", serialize = "UpgradeStuck")]
    #[serde(alias = "UpgradeStuck")]
    NodeMoveStuck,
    /// The record names an instance that is not this QuestDB's: nothing is done to it.
    InstanceNotOwned,
    NotConfigured,
}

/// A plain string in the schema, as before the reasons were split: the record is written by
/// the operator alone, and the list of every reason would only lengthen the CRD.
impl schemars::JsonSchema for NodeMoveReason {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Reason".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string"})
    }
}

/// `VolumeRestored`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum RestoreReason {
    /// The volume was created from the backup's snapshot.
    Restored,
    /// The backup or VolumeSnapshot named in `volume.restoreFrom` does not exist.
    RestoreSourceNotFound,
    /// The backup has not succeeded (yet), or its snapshot is not ready to use.
    RestoreSourceNotReady,
    /// A volume of this name exists and was not restored from the source: it is never
    /// overwritten.
    RestoreRefused,
}

/// `DiskSpace`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum DiskSpaceReason {
    /// Below the threshold (or no `autoGrow` and below 80%).
    Room,
    /// Past the threshold: the claim asks for a larger volume and the storage grows it.
    Growing,
    /// Past the threshold with no `autoGrow`: a person grows `spec.volume.size` or frees
    /// space.
    Filling,
    /// Past the threshold and at `autoGrow.maximum`.
    AtMaximum,
    /// Past the threshold and the StorageClass does not allow expansion.
    NotExpandable,
    /// The kubelet's volume statistics cannot be read (the message says why).
    UsageUnknown,
}

/// `VersionUpgrade`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum VersionUpgradeReason {
    /// The new version ran ready.
    NewVersionRunning,
    /// A failover, node move or pause is under way: the old version runs until it ends.
    Waiting,
    /// The old version is stopping, or its volume's snapshot is being cut.
    BackingUp,
    /// The new version is starting (within `readyTimeout`).
    StartingNewVersion,
    /// The new version was not ready in time, or the image was set back: the old version and
    /// its data are being put back.
    RollingBack,
    /// The old version runs again on the data it left.
    RolledBack,
    /// The snapshot could not be taken: the old version runs; an edit of the spec tries again.
    SnapshotFailed,
    /// The new version is not ready in time and there is no snapshot to go back to
    /// (`backup: Skip`): a person decides.
    NotReadyNoSnapshot,
}

/// `WriteHealthy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum WriteHealthReason {
    /// No WAL table is suspended or lagging: every WAL table applies its writes.
    WalHealthy,
    /// A WAL table is suspended: it refuses writes until resumed.
    TablesSuspended,
    /// WAL apply lags far behind the sequencer.
    WalApplyLagging,
}

/// `CheckpointReleased`: whether a checkpoint is left open (see the checkpoint watchdog).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum CheckpointReason {
    /// No checkpoint is open in the database.
    NoCheckpointOpen,
    /// A backup of the operator's holds it on its way to the snapshot's cut.
    HeldByBackup,
    /// Open for less than the checkpoint limit.
    CheckpointWithinLimit,
    /// Open past the limit with no backup cutting it: released when the operator's, reported
    /// either way.
    CheckpointLeftOpen,
}

/// `BackupVerified`: the newest verification of one of the database's backups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum BackupVerifiedReason {
    /// The newest verified backup restored every recorded table.
    BackupVerified,
    /// The newest verification failed (the message names the backup and what differs).
    VerificationFailed,
}

macro_rules! condition_of {
    ($($t:ty => $condition:expr),* $(,)?) => {$(
        impl ConditionReason for $t {
            const CONDITION: &'static str = $condition;
        }
    )*};
}

condition_of! {
    ReadyReason => conditions::READY,
    SpecValidReason => conditions::SPEC_VALID,
    IlpAuthReason => conditions::ILP_AUTH_READY,
    CredentialsReason => conditions::CREDENTIALS_READY,
    VolumeSizeReason => conditions::VOLUME_SIZE_READY,
    NodeReadyReason => conditions::NODE_READY,
    DnsReason => conditions::DNS_READY,
    FailoverReason => conditions::FAILOVER,
    NodeMoveReason => conditions::NODE_MOVE,
    RestoreReason => conditions::VOLUME_RESTORED,
    WriteHealthReason => conditions::WRITE_HEALTHY,
    CheckpointReason => conditions::CHECKPOINT_RELEASED,
    BackupVerifiedReason => conditions::BACKUP_VERIFIED,
    VersionUpgradeReason => conditions::VERSION_UPGRADE,
    DiskSpaceReason => conditions::DISK_SPACE,
}

reason_text!(
    ReadyReason,
    SpecValidReason,
    IlpAuthReason,
    CredentialsReason,
    VolumeSizeReason,
    NodeReadyReason,
    DnsReason,
    FailoverReason,
    NodeMoveReason,
    RestoreReason,
    WriteHealthReason,
    CheckpointReason,
    BackupVerifiedReason,
    VersionUpgradeReason,
    DiskSpaceReason,
);

/// Every condition's reasons, for the tests that check them all.
#[cfg(test)]
pub fn every_condition_reason() -> Vec<(&'static str, &'static str)> {
    fn of<R: ConditionReason + strum::IntoEnumIterator>() -> Vec<(&'static str, &'static str)> {
        R::iter().map(|r| (R::CONDITION, r.into())).collect()
    }
    [
        of::<ReadyReason>(),
        of::<SpecValidReason>(),
        of::<IlpAuthReason>(),
        of::<CredentialsReason>(),
        of::<VolumeSizeReason>(),
        of::<NodeReadyReason>(),
        of::<DnsReason>(),
        of::<FailoverReason>(),
        of::<NodeMoveReason>(),
        of::<RestoreReason>(),
        of::<WriteHealthReason>(),
        of::<CheckpointReason>(),
        of::<BackupVerifiedReason>(),
        of::<VersionUpgradeReason>(),
        of::<DiskSpaceReason>(),
    ]
    .concat()
}

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
    Valid,
    InvalidSpec,
}

/// `IlpAuthReady`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum IlpAuthReason {
    /// `spec.ilpAuth.enabled` is false.
    Disabled,
    KeysLoaded,
    NoKeys,
    InvalidSecret,
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
    AsRequested,
    Expanding,
    NotExpandable,
    /// The volume requests more than the spec (volumes never shrink).
    Larger,
}

/// `NodeReady`: the dedicated node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum NodeReadyReason {
    Ready,
    Launching,
    /// The node is there, but the volume's CSI driver has not registered on it yet.
    WaitingForCsiDriver,
    /// The dedicated node has not joined (or has no address) yet.
    WaitingForNode,
    NodeNotReady,
    InstanceStopped,
    LaunchFailed,
    /// The operator's preflight found a network mistake EC2 would refuse every launch for:
    /// nothing is launched until it is fixed.
    PreflightFailed,
    RelaunchBackoff,
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
    Published,
    WaitingForNode,
    Removed,
    RecordOwnedElsewhere,
    DnsRejected,
    NotConfigured,
}

/// `Failover`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum FailoverReason {
    Armed,
    /// `spec.failover.enabled` is false.
    Disabled,
    InProgress,
    Recovered,
    /// A due failover is held back ([`super::SuppressionReason`] says why, in the message).
    FailoverSuppressed,
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
    UpToDate,
    Moving,
    Retaining,
    Waiting,
    Aborted,
    RolledBack,
    InvalidNode,
    LaunchFailed,
    InstanceGone,
    NodeNeverJoined,
    NodeNeverReady,
    Superseded,
    Preempted,
    MoveFailed,
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
    WalHealthy,
    /// A WAL table is suspended: it refuses writes until resumed.
    TablesSuspended,
    /// WAL apply lags far behind the sequencer.
    WalApplyLagging,
}

/// `CheckpointReleased`: whether a checkpoint is left open (see the checkpoint watchdog).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Display, IntoStaticStr, EnumIter, EnumString)]
pub enum CheckpointReason {
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

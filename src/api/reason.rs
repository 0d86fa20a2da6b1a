//! Every reason a QuestDB's conditions and events carry: one enum, one spelling each, so a
//! reason the code acts on is a variant compared by the compiler, never a string compared by
//! hand, and the list on-call engineers may see is in one place (`Reason::all`).
//!
//! A variant's name is the reason's text (`Reason::LaunchFailed` is `"LaunchFailed"`), which
//! already satisfies the apiserver's pattern for `Condition.reason`.

/// Serialized (in the records of `status.failover` and `status.upgrade`) as its name.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    strum::Display,
    strum::IntoStaticStr,
    strum::EnumIter,
    strum::EnumString,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum Reason {
    // Ready, and the phase beside it.
    /// The first reconcile: nothing applied yet.
    Creating,
    /// Waiting for the dedicated node.
    Provisioning,
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
    /// `SpecValid=True`.
    Valid,

    // Children (events).
    Created,
    Adopted,
    Updated,
    /// A child could not be written.
    ApplyFailed,
    /// The QuestDB does not parse (another schema version).
    Unreadable,
    /// Deletion waits for cloud resources that no provider can clean up.
    CleanupBlocked,

    // ILP auth.
    KeysLoaded,
    NoKeys,
    InvalidSecret,
    DuplicateKid,
    /// A feature switched off (ILP auth, failover).
    Disabled,

    // Credentials (`CredentialsReady`).
    /// The credentials Secret holds every key.
    CredentialsFound,
    /// The operator generated `<name>-credentials` (event).
    CredentialsGenerated,
    /// The Secret `spec.credentials.secretName` names does not exist.
    SecretNotFound,
    /// The credentials Secret lacks keys (named, never their values).
    MissingKeys,
    /// The credentials Secret holds QuestDB's default password.
    DefaultPassword,

    // The database container (Ready=False while it cannot run).
    /// QuestDB exits at start and is restarted with back-off.
    CrashLoop,
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

    // Volume size.
    AsRequested,
    Expanding,
    NotExpandable,
    /// The volume requests more than the spec (volumes never shrink).
    Larger,

    // Dedicated node.
    /// A status record names an instance that is not this QuestDB's: nothing is done to it
    /// (the reconcile error, and its Warning event).
    InstanceNotOwned,
    /// A dedicated Node reports an address its EC2 instance does not have (event).
    NodeAddressUntrusted,
    /// Two Nodes claim the instance, or its Node's name is not the instance's: none is
    /// dedicated or pinned.
    NodeIdentityConflict,
    Ready,
    Launching,
    /// The dedicated node has not joined (or has no address) yet.
    /// The node is there, but the volume's CSI driver has not registered on it yet.
    WaitingForCsiDriver,
    WaitingForNode,
    NodeNotReady,
    InstanceStopped,
    LaunchFailed,
    RelaunchBackoff,
    RelaunchCapped,
    NodeGone,
    Releasing,
    ReleasingNode,
    Released,
    /// `spec.node` was removed; the node goes once the pod has left it.
    MovingOff,
    /// The operator runs without the cloud provider this needs.
    NotConfigured,

    // DNS.
    Published,
    DnsPublished,
    Removed,
    RecordOwnedElsewhere,
    DnsRejected,

    // Failover.
    Armed,
    InProgress,
    Recovered,
    FailoverSuppressed,
    FailoverStuck,
    FailoverStarted,
    FailoverSucceeded,
    FailoverFencing,
    FailoverReleasing,
    FailoverReattaching,
    FailoverRecovering,
    FailoverDraining,
    FailoverHealthy,
    InstanceDown,
    /// EC2 reports the instance terminated (or terminating) outside the operator: failed over
    /// at once, without waiting for the threshold.
    InstanceTerminated,
    NodeLeaseExpired,
    /// The Node object of a running instance is gone (`kubectl delete node`, or a kubelet that
    /// never re-registered).
    NodeDeleted,
    /// A release waited on a pod stuck on a dead node: the node was fenced instead.
    ReleaseFenced,
    SkipAnnotation,
    RecentFailover,
    TooManyUnhealthyNodes,

    // Node moves.
    UpToDate,
    Moving,
    Retaining,
    Waiting,
    Aborted,
    RolledBack,
    NodeMoveStarted,
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
    /// The node a move leaves holds the database's pod or volume past its grace period and the
    /// step timeout: it is fenced. Kept in `status.upgrade.reason`, where an operator before
    /// the rename wrote `UpgradeStuck`, which still reads as this.
    #[strum(to_string = "NodeMoveStuck", serialize = "UpgradeStuck")]
    #[serde(alias = "UpgradeStuck")]
    NodeMoveStuck,
    InvalidNode,
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

    // Restore (`VolumeRestored`).
    /// The volume was created from the backup's snapshot.
    Restored,
    /// The backup or VolumeSnapshot named in `volume.restoreFrom` does not exist.
    RestoreSourceNotFound,
    /// The backup has not succeeded (yet), or its snapshot is not ready to use.
    RestoreSourceNotReady,
    /// A volume of this name exists and was not restored from the source: it is never
    /// overwritten.
    RestoreRefused,

    // Write health (`WriteHealthy`).
    WalHealthy,
    /// A WAL table is suspended: it refuses writes until resumed.
    TablesSuspended,
    /// WAL apply lags far behind the sequencer.
    WalApplyLagging,

    // Backups (a QuestDBBackup's `status.reason` and events).
    /// Waiting: the QuestDB does not exist.
    QuestDBNotFound,
    /// Waiting: the database is not Running (or its pod not Ready).
    DatabaseNotRunning,
    /// Waiting: a failover or node move is under way.
    DatabaseBusy,
    /// Waiting: another backup of the same database holds its checkpoint.
    AnotherBackupRunning,
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
    BackupStarted,
    BackupCheckpointed,
    BackupSucceeded,
    BackupFailed,
    /// A schedule made a backup (event).
    BackupScheduled,
    /// A schedule skipped a run (past its starting deadline).
    BackupSkipped,

    // Orphaned instances (events on the Node).
    OrphanSweepHeldBack,
    OrphanTerminated,

    // Failed reconciles (`questdb_operator_reconcile_errors_total`, one Warning per streak).
    MissingNamespace,
    MissingUid,
    StaleCache,
    Conflict,
    SerializeFailed,
    KubernetesApiError,
    CloudApiError,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The reason an event or condition spelt out earlier.
    pub fn parse(s: &str) -> Option<Reason> {
        s.parse().ok()
    }

    pub fn all() -> impl Iterator<Item = Reason> {
        <Reason as strum::IntoEnumIterator>::iter()
    }
}

/// A plain string in the schema: the records are written by the operator alone, and the list
/// of every reason would only lengthen the CRD.
impl schemars::JsonSchema for Reason {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Reason".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string"})
    }
}

impl From<Reason> for String {
    fn from(r: Reason) -> String {
        r.as_str().to_string()
    }
}

impl AsRef<str> for Reason {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq<Reason> for String {
    fn eq(&self, other: &Reason) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Reason> for str {
    fn eq(&self, other: &Reason) -> bool {
        self == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `metav1.Condition.reason` must match `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$` and be
    /// at most 1024 characters (apimachinery's ValidateConditions): an invalid one fails the
    /// status write of every QuestDB that carries it.
    #[test]
    fn every_reason_is_one_the_apiserver_accepts_and_spelt_once() {
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::all() {
            let s = r.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(s.len() <= 1024);
            assert!(s.starts_with(|c: char| c.is_ascii_uppercase()), "{s}");
            assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
            assert_eq!(Reason::parse(s), Some(r));
            assert_eq!(serde_json::to_value(r).unwrap(), serde_json::json!(s));
            assert!(
                !s.starts_with("Upgrade"),
                "{s}: a node move is not an upgrade"
            );
        }
        assert_eq!(Reason::parse("NoSuchReason"), None);
    }

    /// A move stuck under an operator before the rename recorded `UpgradeStuck`: it still
    /// reads, as the same reason, or the QuestDB would be unreadable after an upgrade.
    #[test]
    fn a_reason_recorded_before_the_node_move_rename_still_reads() {
        assert_eq!(Reason::parse("UpgradeStuck"), Some(Reason::NodeMoveStuck));
        assert_eq!(
            serde_json::from_value::<Reason>(serde_json::json!("UpgradeStuck")).unwrap(),
            Reason::NodeMoveStuck
        );
        assert_eq!(Reason::NodeMoveStuck.as_str(), "NodeMoveStuck");
    }
}

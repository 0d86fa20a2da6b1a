use super::*;

/// `metav1.Condition.reason` must match `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$` and be
/// at most 1024 characters (apimachinery's ValidateConditions): an invalid one fails the
/// status write of every QuestDB that carries it. Events are held to the same rule.
fn assert_valid(s: &str) {
    assert!(s.len() <= 1024);
    assert!(s.starts_with(|c: char| c.is_ascii_uppercase()), "{s}");
    assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
    assert!(
        !s.starts_with("Upgrade"),
        "{s}: a node move is not an upgrade"
    );
}

#[test]
fn every_condition_reason_is_one_the_apiserver_accepts_and_spelt_once_per_condition() {
    let mut seen = std::collections::BTreeSet::new();
    for (condition, reason) in every_condition_reason() {
        assert_valid(reason);
        assert!(
            seen.insert((condition, reason)),
            "{condition}/{reason} twice"
        );
    }
    assert!(NodeReadyReason::parse("NoSuchReason").is_none());
}

#[test]
fn every_other_reason_is_valid_reads_back_and_is_spelt_once() {
    fn check<R>(all: impl Iterator<Item = R>, parse: fn(&str) -> Option<R>)
    where
        R: Copy + PartialEq + std::fmt::Debug + Into<&'static str>,
    {
        let mut seen = std::collections::BTreeSet::new();
        for r in all {
            let s: &'static str = r.into();
            assert_valid(s);
            assert!(seen.insert(s), "{s} twice");
            assert_eq!(parse(s), Some(r));
        }
    }
    check(EventReason::all(), EventReason::parse);
    check(BackupReason::all(), BackupReason::parse);
    check(SuppressionReason::all(), SuppressionReason::parse);
    check(NodeMoveReason::all(), NodeMoveReason::parse);
}

/// The split of the one `Reason` enum into one per condition kept every text users, alerts
/// and dashboards see: the texts each condition could carry before are all still there.
#[test]
fn every_condition_reason_text_is_pinned_so_a_rename_cannot_break_alerts() {
    let expect = [
        ("Ready", "Creating RollingOut PodNotReady Running Paused InvalidSpec ChildConflict NodeNotReady CrashLoop OutOfMemory ImagePullFailed ContainerConfigError Unschedulable PodRefused VolumePending RestoreSourceNotFound RestoreSourceNotReady RestoreRefused"),
        ("SpecValid", "Valid InvalidSpec"),
        ("IlpAuthReady", "Disabled KeysLoaded NoKeys InvalidSecret DuplicateKid"),
        ("CredentialsReady", "CredentialsFound SecretNotFound MissingKeys DefaultPassword"),
        ("VolumeSizeReady", "AsRequested Expanding NotExpandable Larger"),
        ("NodeReady", "Ready Launching WaitingForCsiDriver WaitingForNode NodeNotReady InstanceStopped LaunchFailed PreflightFailed RelaunchBackoff RelaunchCapped NodeNeverJoined NodeIdentityConflict Releasing Released MovingOff NotConfigured NamespaceQuota"),
        ("DnsReady", "Published WaitingForNode Removed RecordOwnedElsewhere DnsRejected NotConfigured"),
        ("Failover", "Armed Disabled InProgress Recovered FailoverSuppressed FailoverStuck InstanceNotOwned NotConfigured"),
        ("NodeMove", "UpToDate Moving Retaining Waiting Aborted RolledBack InvalidNode LaunchFailed InstanceGone NodeNeverJoined NodeNeverReady Superseded Preempted MoveFailed Reverted TargetNodeFailed NodesFailed NodeMoveStuck InstanceNotOwned NotConfigured"),
        ("VolumeRestored", "Restored RestoreSourceNotFound RestoreSourceNotReady RestoreRefused"),
        ("WriteHealthy", "WalHealthy TablesSuspended WalApplyLagging"),
        ("CheckpointReleased", "NoCheckpointOpen HeldByBackup CheckpointWithinLimit CheckpointLeftOpen"),
        ("BackupVerified", "BackupVerified VerificationFailed"),
        ("VersionUpgrade", "NewVersionRunning Waiting BackingUp StartingNewVersion RollingBack RolledBack SnapshotFailed NotReadyNoSnapshot"),
        ("DiskSpace", "Room Growing Filling AtMaximum NotExpandable UsageUnknown"),
    ];
    let all = every_condition_reason();
    for (condition, reasons) in expect {
        let have: Vec<&str> = all
            .iter()
            .filter(|(c, _)| *c == condition)
            .map(|(_, r)| *r)
            .collect();
        assert_eq!(have, reasons.split(' ').collect::<Vec<_>>(), "{condition}");
    }
    assert_eq!(
        all.len(),
        expect
            .iter()
            .map(|(_, r)| r.split(' ').count())
            .sum::<usize>()
    );
}

/// A move stuck under an operator before the rename recorded `UpgradeStuck`: it still
/// reads, as the same reason, or the QuestDB would be unreadable after an upgrade.
#[test]
fn a_reason_recorded_before_the_node_move_rename_still_reads() {
    assert_eq!(
        NodeMoveReason::parse("UpgradeStuck"),
        Some(NodeMoveReason::NodeMoveStuck)
    );
    assert_eq!(
        serde_json::from_value::<NodeMoveReason>(serde_json::json!("UpgradeStuck")).unwrap(),
        NodeMoveReason::NodeMoveStuck
    );
    assert_eq!(NodeMoveReason::NodeMoveStuck.as_str(), "NodeMoveStuck");
    assert_eq!(
        serde_json::to_value(NodeMoveReason::NodeMoveStuck).unwrap(),
        serde_json::json!("NodeMoveStuck")
    );
}

/// The runbook (docs/operations/runbook.md) explains every reason a condition can carry, under
/// that condition's heading: a reason added to the code and not to the page fails here, so an
/// on-call engineer never meets one it does not explain.
#[test]
fn the_runbook_explains_every_condition_reason() {
    let runbook = include_str!("../../../../docs/operations/runbook.md");
    let mut missing = Vec::new();
    for (condition, reason) in every_condition_reason() {
        let heading = format!("\n## `{condition}`\n");
        let Some(start) = runbook.find(&heading) else {
            missing.push(format!("{condition} (no section)"));
            continue;
        };
        let section = &runbook[start + heading.len()..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        if !section.contains(&format!("\n| `{reason}` | ")) {
            missing.push(format!("{condition}/{reason}"));
        }
    }
    assert!(missing.is_empty(), "not in the runbook: {missing:?}");
}

/// The runbook's event table names every event reason the operator publishes.
#[test]
fn the_runbook_explains_every_event_reason() {
    let runbook = include_str!("../../../../docs/operations/runbook.md");
    let start = runbook.find("\n## Events\n").expect("an Events section");
    let events = &runbook[start..];
    let missing: Vec<&str> = EventReason::all()
        .map(EventReason::as_str)
        .filter(|r| !events.contains(&format!("\n| `{r}` | ")))
        .collect();
    assert!(missing.is_empty(), "events not in the runbook: {missing:?}");
}

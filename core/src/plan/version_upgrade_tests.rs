use super::*;
use crate::api::EventReason;
use VersionUpgradeStep::*;

const OLD: &str = "questdb/questdb:9.2.0";
const NEW: &str = "questdb/questdb:9.3.2";
const OTHER: &str = "questdb/questdb:9.3.1";

fn now() -> Timestamp {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

fn secs_ago(s: i64) -> Option<Time> {
    Some(Time(
        now() - k8s_openapi::jiff::SignedDuration::from_secs(s),
    ))
}

fn record(step: VersionUpgradeStep) -> VersionUpgradeStatus {
    VersionUpgradeStatus {
        from_image: OLD.into(),
        to_image: NEW.into(),
        step,
        since: secs_ago(5),
        snapshot: Some("db1-before-9.3.2-4".into()),
        ..Default::default()
    }
}

struct Case {
    spec_image: &'static str,
    record: Option<VersionUpgradeStatus>,
    statefulset_image: Option<&'static str>,
    has_data: bool,
    policy: VersionUpgradeSpec,
    busy: Option<String>,
    pod: PodState<'static>,
    trouble: Option<&'static str>,
    pod_created: Option<Timestamp>,
    snapshot: SnapshotState,
    snapshot_api: Option<bool>,
    claim: Option<Claim<'static>>,
    generation: i64,
}

impl Default for Case {
    fn default() -> Self {
        Self {
            spec_image: NEW,
            record: None,
            statefulset_image: Some(OLD),
            has_data: true,
            policy: VersionUpgradeSpec::default(),
            busy: None,
            pod: PodState::Ready { image: OLD },
            trouble: None,
            pod_created: None,
            snapshot: SnapshotState::NotLooked,
            snapshot_api: None,
            claim: Some(Claim {
                uid: "claim-1",
                volume: Some("pv-1"),
            }),
            generation: 4,
        }
    }
}

impl Case {
    fn decide(&self) -> Decision {
        decide(&View {
            name: "db1",
            spec_image: self.spec_image,
            generation: self.generation,
            record: self.record.as_ref(),
            statefulset_image: self.statefulset_image,
            has_data: self.has_data,
            policy: &self.policy,
            busy: self.busy.clone(),
            pod: self.pod,
            trouble: self.trouble,
            pod_created: self.pod_created,
            snapshot: self.snapshot.clone(),
            snapshot_api: self.snapshot_api,
            claim: self.claim,
            now: now(),
        })
    }
}

fn recorded(d: Decision) -> (VersionUpgradeStatus, Option<Say>) {
    match d {
        Decision::Record(r, say) => (r, say),
        other => panic!("expected a record, got {other:?}"),
    }
}

#[test]
fn a_first_image_or_an_unchanged_one_needs_no_way_back() {
    let never_ran = Case {
        has_data: false,
        ..Case::default()
    };
    assert_eq!(never_ran.decide(), Decision::None);
    let unchanged = Case {
        spec_image: OLD,
        ..Case::default()
    };
    assert_eq!(unchanged.decide(), Decision::None);
    let no_statefulset = Case {
        statefulset_image: None,
        ..Case::default()
    };
    assert_eq!(no_statefulset.decide(), Decision::None);
}

#[test]
fn an_image_change_of_a_database_with_data_first_stops_the_old_version() {
    let (r, say) = recorded(Case::default().decide());
    assert_eq!(
        (r.step, r.from_image.as_str(), r.to_image.as_str()),
        (Stopping, OLD, NEW)
    );
    assert_eq!(r.since, Some(Time(now())));
    assert!(say.is_none());
    let t = template(Some(&r), NEW);
    assert_eq!((t.image, t.stopped), (OLD, true));
}

#[test]
fn an_upgrade_waits_for_a_failover_node_move_or_pause_with_the_old_version_running() {
    let (r, _) = recorded(
        Case {
            busy: Some("a failover is under way".into()),
            ..Case::default()
        }
        .decide(),
    );
    assert_eq!(r.step, Waiting);
    assert_eq!(
        template(Some(&r), NEW),
        Template {
            image: OLD,
            stopped: false
        }
    );
    // Still busy: nothing written again.
    let still = Case {
        busy: Some("a failover is under way".into()),
        record: Some(r.clone()),
        ..Case::default()
    };
    assert_eq!(still.decide(), Decision::Wait(None));
    // Free: it goes on.
    let free = Case {
        record: Some(r),
        ..Case::default()
    };
    assert_eq!(recorded(free.decide()).0.step, Stopping);
}

#[test]
fn without_the_snapshot_api_the_upgrade_is_held_before_anything_stops() {
    let (r, say) = recorded(
        Case {
            snapshot_api: Some(false),
            ..Case::default()
        }
        .decide(),
    );
    assert_eq!(r.step, Held);
    assert_eq!(r.generation, Some(4));
    assert!(r.message.as_deref().unwrap().contains("backup: Skip"));
    assert_eq!(say.unwrap().reason, EventReason::VersionUpgradeHeld);
    assert_eq!(
        template(Some(&r), NEW),
        Template {
            image: OLD,
            stopped: false
        }
    );
    let same_spec = Case {
        record: Some(r.clone()),
        ..Case::default()
    };
    assert_eq!(same_spec.decide(), Decision::Wait(None));
    let edited = Case {
        record: Some(r),
        generation: 5,
        ..Case::default()
    };
    assert_eq!(recorded(edited.decide()).0.step, Stopping);
}

#[test]
fn with_backup_skip_the_new_version_starts_at_once() {
    let (r, _) = recorded(
        Case {
            policy: VersionUpgradeSpec {
                backup: UpgradeBackup::Skip,
                ..Default::default()
            },
            ..Case::default()
        }
        .decide(),
    );
    assert_eq!((r.step, r.snapshot.as_deref()), (Starting, None));
    assert_eq!(
        template(Some(&r), NEW),
        Template {
            image: NEW,
            stopped: false
        }
    );
}

#[test]
fn the_snapshot_is_named_in_the_record_only_once_the_old_version_has_stopped() {
    let stopping = Case {
        record: Some(VersionUpgradeStatus {
            snapshot: None,
            ..record(Stopping)
        }),
        pod: PodState::NotReady { ran: true },
        ..Case::default()
    };
    assert_eq!(stopping.decide(), Decision::Wait(None));
    let (r, _) = recorded(
        Case {
            pod: PodState::Gone,
            ..stopping
        }
        .decide(),
    );
    assert_eq!(r.step, Snapshotting);
    assert_eq!(r.snapshot.as_deref(), Some("db1-before-9.3.2-4"));
    assert_eq!(
        template(Some(&r), NEW),
        Template {
            image: OLD,
            stopped: true
        }
    );
}

#[test]
fn the_new_version_starts_once_the_snapshot_is_cut_not_uploaded() {
    let case = |snapshot| Case {
        record: Some(record(Snapshotting)),
        pod: PodState::Gone,
        snapshot,
        ..Case::default()
    };
    assert_eq!(
        case(SnapshotState::Absent).decide(),
        Decision::CreateSnapshot {
            name: "db1-before-9.3.2-4".into()
        }
    );
    assert_eq!(
        case(SnapshotState::Pending { cut: false }).decide(),
        Decision::Wait(Some(SNAPSHOT_POLL))
    );
    for cut in [SnapshotState::Pending { cut: true }, SnapshotState::Ready] {
        let (r, _) = recorded(case(cut).decide());
        assert_eq!(r.step, Starting);
        assert_eq!(r.since, Some(Time(now())));
    }
}

#[test]
fn a_failed_snapshot_holds_the_upgrade_and_runs_the_old_version_again() {
    let (r, say) = recorded(
        Case {
            record: Some(record(Snapshotting)),
            pod: PodState::Gone,
            snapshot: SnapshotState::Failed("no space".into()),
            ..Case::default()
        }
        .decide(),
    );
    assert_eq!(r.step, Held);
    assert!(r.message.as_deref().unwrap().contains("no space"));
    assert!(say.unwrap().warning);
    assert_eq!(
        template(Some(&r), NEW),
        Template {
            image: OLD,
            stopped: false
        }
    );
}

#[test]
fn the_image_set_back_before_the_new_version_ran_ends_the_upgrade() {
    for step in [Waiting, Held, Stopping, Snapshotting] {
        let case = Case {
            spec_image: OLD,
            record: Some(record(step)),
            ..Case::default()
        };
        assert_eq!(case.decide(), Decision::Clear(None), "{step}");
    }
}

#[test]
fn a_new_version_ready_in_time_ends_the_upgrade() {
    let case = Case {
        record: Some(record(Starting)),
        pod: PodState::Ready { image: NEW },
        ..Case::default()
    };
    let Decision::Finish(say) = case.decide() else {
        panic!("expected the end")
    };
    assert_eq!(say.reason, EventReason::VersionUpgraded);
    assert!(say.message.contains("db1-before-9.3.2-4"));
    // Ready on the old template (the StatefulSet not rolled yet) is not the new version.
    let old_ready = Case {
        record: Some(record(Starting)),
        pod: PodState::Ready { image: OLD },
        ..Case::default()
    };
    assert!(matches!(old_ready.decide(), Decision::Wait(Some(_))));
}

#[test]
fn a_new_version_not_ready_within_its_timeout_is_rolled_back_from_the_snapshot() {
    let starting = |since, pod| Case {
        record: Some(VersionUpgradeStatus {
            since: secs_ago(since),
            ..record(Starting)
        }),
        policy: VersionUpgradeSpec {
            ready_timeout: Some("60s".into()),
            ..Default::default()
        },
        pod,
        ..Case::default()
    };
    assert_eq!(
        starting(20, PodState::NotReady { ran: true }).decide(),
        Decision::Wait(Some(Duration::from_secs(40)))
    );
    let overdue = Case {
        trouble: Some("QuestDB exits at start (exit code 55)"),
        ..starting(61, PodState::NotReady { ran: true })
    };
    let (r, say) = recorded(overdue.decide());
    assert_eq!(r.step, StoppingNew);
    let message = r.message.as_deref().unwrap();
    assert!(message.contains("not ready within 1m"), "{message}");
    assert!(message.contains("exit code 55"), "{message}");
    assert_eq!(say.unwrap().reason, EventReason::VersionRollingBack);
    assert_eq!(
        template(Some(&r), NEW),
        Template {
            image: OLD,
            stopped: true
        }
    );
}

#[test]
fn a_new_versions_pod_replaced_meanwhile_gets_its_whole_timeout() {
    // A failover or a pause and unpause made a new pod 10 s ago; the step began 120 s ago.
    let case = Case {
        record: Some(VersionUpgradeStatus {
            since: secs_ago(120),
            ..record(Starting)
        }),
        policy: VersionUpgradeSpec {
            ready_timeout: Some("60s".into()),
            ..Default::default()
        },
        pod: PodState::NotReady { ran: true },
        pod_created: secs_ago(10).map(|t| t.0),
        ..Case::default()
    };
    assert_eq!(case.decide(), Decision::Wait(Some(Duration::from_secs(50))));
}

#[test]
fn the_image_set_back_while_the_new_version_starts_rolls_back_at_once() {
    let (r, _) = recorded(
        Case {
            spec_image: OLD,
            record: Some(record(Starting)),
            pod: PodState::NotReady { ran: true },
            ..Case::default()
        }
        .decide(),
    );
    assert_eq!(r.step, StoppingNew);
    assert!(r.message.as_deref().unwrap().contains("spec.image changed"));
}

#[test]
fn a_new_version_that_never_started_goes_back_without_a_restore() {
    let (r, say) = recorded(
        Case {
            spec_image: OLD,
            record: Some(record(Starting)),
            pod: PodState::NotReady { ran: false },
            ..Case::default()
        }
        .decide(),
    );
    // No claim released; the snapshot stays named (the QuestDB owns it).
    assert_eq!((r.step, r.claim_uid.as_deref()), (RolledBack, None));
    assert_eq!(r.snapshot.as_deref(), Some("db1-before-9.3.2-4"));
    assert!(say.unwrap().message.contains("never started"));
    let v = verdict(&r, &VersionUpgradeSpec::default(), None, now());
    assert!(v.message.contains("never started"), "{}", v.message);
    assert_eq!(
        template(Some(&r), OLD),
        Template {
            image: OLD,
            stopped: false
        }
    );
}

#[test]
fn without_a_snapshot_an_overdue_new_version_is_left_for_a_person() {
    let skip = VersionUpgradeSpec {
        backup: UpgradeBackup::Skip,
        ready_timeout: Some("60s".into()),
        ..Default::default()
    };
    let r = VersionUpgradeStatus {
        snapshot: None,
        since: secs_ago(120),
        ..record(Starting)
    };
    let case = Case {
        record: Some(r.clone()),
        policy: skip.clone(),
        pod: PodState::NotReady { ran: true },
        ..Case::default()
    };
    assert_eq!(case.decide(), Decision::Wait(None));
    let v = verdict(&r, &skip, None, now());
    assert_eq!(v.reason, VersionUpgradeReason::NotReadyNoSnapshot);
    // The image set back: the old version on the data as it is, which Skip chose.
    let set_back = Case {
        spec_image: OLD,
        ..case
    };
    let Decision::Clear(Some(say)) = set_back.decide() else {
        panic!("expected the end")
    };
    assert!(say.message.contains("backup Skip"));
}

#[test]
fn a_rollback_keeps_the_volume_the_new_version_ran_on_before_its_claim_goes() {
    let stopping = Case {
        record: Some(record(StoppingNew)),
        pod: PodState::NotReady { ran: true },
        ..Case::default()
    };
    assert_eq!(stopping.decide(), Decision::Wait(None));
    let (r, _) = recorded(
        Case {
            pod: PodState::Gone,
            ..stopping
        }
        .decide(),
    );
    assert_eq!(r.step, ReleasingVolume);
    assert_eq!(
        (r.claim_uid.as_deref(), r.retained_volume.as_deref()),
        (Some("claim-1"), Some("pv-1"))
    );
    assert_eq!(restore_snapshot(Some(&r)), Some("db1-before-9.3.2-4"));
    let releasing = Case {
        record: Some(r.clone()),
        pod: PodState::Gone,
        ..Case::default()
    };
    assert_eq!(
        releasing.decide(),
        Decision::ReleaseVolume {
            volume: Some("pv-1".into()),
            claim_uid: "claim-1".into()
        }
    );
    // Gone, or a claim of another uid (the one from the snapshot): restoring.
    for claim in [
        None,
        Some(Claim {
            uid: "claim-2",
            volume: None,
        }),
    ] {
        let (next, _) = recorded(
            Case {
                claim,
                record: Some(r.clone()),
                pod: PodState::Gone,
                ..Case::default()
            }
            .decide(),
        );
        assert_eq!(next.step, Restoring);
    }
}

#[test]
fn the_rollback_ends_when_the_old_version_is_ready_on_the_restored_claim() {
    let r = VersionUpgradeStatus {
        claim_uid: Some("claim-1".into()),
        retained_volume: Some("pv-1".into()),
        message: Some("questdb/questdb:9.3.2 was not ready within 60s".into()),
        ..record(Restoring)
    };
    assert_eq!(
        template(Some(&r), NEW),
        Template {
            image: OLD,
            stopped: false
        }
    );
    let same_claim = Case {
        record: Some(r.clone()),
        pod: PodState::Ready { image: OLD },
        ..Case::default()
    };
    assert_eq!(same_claim.decide(), Decision::Wait(None));
    let (done, say) = recorded(
        Case {
            claim: Some(Claim {
                uid: "claim-2",
                volume: Some("pv-2"),
            }),
            ..same_claim
        }
        .decide(),
    );
    assert_eq!((done.step, done.generation), (RolledBack, Some(4)));
    let say = say.unwrap();
    assert_eq!(say.reason, EventReason::VersionRolledBack);
    assert!(
        say.message.contains("PersistentVolume pv-1"),
        "{}",
        say.message
    );
    assert!(say.message.contains("db1-before-9.3.2-4"));
    let v = verdict(&done, &VersionUpgradeSpec::default(), None, now());
    assert_eq!(
        (v.status, v.reason),
        (false, VersionUpgradeReason::RolledBack)
    );
}

#[test]
fn a_rolled_back_database_stays_on_the_old_version_until_the_spec_changes() {
    let r = VersionUpgradeStatus {
        generation: Some(4),
        ..record(RolledBack)
    };
    // The same version after an edit (the setting that stopped it removed): tried again.
    let edited = Case {
        record: Some(r.clone()),
        generation: 5,
        ..Case::default()
    };
    let (again, _) = recorded(edited.decide());
    assert_eq!((again.step, again.from_image.as_str()), (Stopping, OLD));
    let same = Case {
        record: Some(r.clone()),
        ..Case::default()
    };
    assert_eq!(same.decide(), Decision::Wait(None));
    let set_back = Case {
        spec_image: OLD,
        record: Some(r.clone()),
        ..Case::default()
    };
    assert_eq!(set_back.decide(), Decision::Clear(None));
    let (next, _) = recorded(
        Case {
            spec_image: OTHER,
            record: Some(r),
            ..Case::default()
        }
        .decide(),
    );
    assert_eq!(
        (next.step, next.from_image.as_str(), next.to_image.as_str()),
        (Stopping, OLD, OTHER)
    );
}

#[test]
fn only_a_rollback_creates_a_claim_from_the_snapshot() {
    for step in [
        Waiting,
        Stopping,
        Snapshotting,
        Starting,
        StoppingNew,
        RolledBack,
        Held,
    ] {
        assert_eq!(restore_snapshot(Some(&record(step))), None, "{step}");
    }
    for step in [ReleasingVolume, Restoring] {
        assert!(restore_snapshot(Some(&record(step))).is_some(), "{step}");
    }
    assert_eq!(restore_snapshot(None), None);
}

#[test]
fn snapshot_names_are_valid_object_names() {
    assert_eq!(snapshot_name("db1", NEW, 7), "db1-before-9.3.2-7");
    assert_eq!(
        snapshot_name("db1", "reg.example.com:5000/questdb/questdb:9.3.2-RC_1", 7),
        "db1-before-9.3.2-rc-1-7"
    );
    let long = "d".repeat(253);
    assert!(snapshot_name(&long, NEW, 7).len() <= 253);
}

#[test]
fn a_volume_the_operator_may_not_keep_leaves_the_claim_and_says_so() {
    let r = VersionUpgradeStatus {
        claim_uid: Some("claim-1".into()),
        retained_volume: Some("pv-1".into()),
        message: Some("questdb/questdb:9.3.2 was not ready within 1m".into()),
        ..record(ReleasingVolume)
    };
    let (next, say) = volume_not_kept(&r, "forbidden");
    assert_eq!((next.step, next.claim_uid.as_deref()), (Restoring, None));
    assert_eq!(next.retained_volume, None);
    assert!(say.message.contains("forbidden") && say.message.contains("db1-before-9.3.2-4"));
    // Restoring with no claim recorded: the old version ready on the claim that stayed ends it.
    let restoring = Case {
        record: Some(next),
        pod: PodState::Ready { image: OLD },
        ..Case::default()
    };
    assert_eq!(recorded(restoring.decide()).0.step, RolledBack);
}

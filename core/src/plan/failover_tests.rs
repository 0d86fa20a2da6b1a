use super::*;
use crate::api::{FailoverReason, SuppressionReason};

fn spec() -> FailoverSpec {
    FailoverSpec {
        enabled: true,
        unhealthy_after_seconds: 30,
    }
}

fn running_status() -> QuestDBStatus {
    QuestDBStatus {
        instance_id: Some("i-old".into()),
        node_name: Some("node-old".into()),
        node_generation: Some(1),
        ..Default::default()
    }
}

fn start(
    spec: &FailoverSpec,
    status: &QuestDBStatus,
    unhealthy: Option<u64>,
    breaker: bool,
) -> Start {
    should_start(&StartView {
        spec,
        skip_annotation: false,
        status,
        unhealthy_for: unhealthy.map(Duration::from_secs),
        lease_duration: Duration::from_secs(10),
        breaker: breaker.then(|| "zone z-a".to_string()),
        since_last_start: None,
    })
}

#[test]
fn a_node_silent_past_the_threshold_is_failed_over() {
    assert_eq!(
        start(&spec(), &running_status(), Some(31), false),
        Start::Go
    );
}

#[test]
fn a_threshold_under_the_kubelets_lease_waits_out_the_lease() {
    let status = running_status();
    let mut short = spec();
    short.unhealthy_after_seconds = 10;
    let view = |silent: u64| StartView {
        spec: &short,
        skip_annotation: false,
        status: &status,
        unhealthy_for: Some(Duration::from_secs(silent)),
        lease_duration: Duration::from_secs(40),
        breaker: None,
        since_last_start: None,
    };
    // A real kubelet renews every 10 s: 10-39 s of silence is a late renewal, not a dead node.
    assert_eq!(should_start(&view(25)), Start::No);
    assert_eq!(should_start(&view(39)), Start::No);
    assert_eq!(should_start(&view(40)), Start::Go);
}

#[test]
fn a_heartbeat_that_returns_before_the_threshold_causes_nothing() {
    assert_eq!(
        start(&spec(), &running_status(), Some(29), false),
        Start::No
    );
    assert_eq!(start(&spec(), &running_status(), None, false), Start::No);
}

#[test]
fn many_silent_nodes_at_once_are_a_partition_not_a_dead_node() {
    assert!(matches!(
        start(&spec(), &running_status(), Some(60), true),
        Start::Suppressed {
            reason: SuppressionReason::TooManyUnhealthyNodes,
            ..
        }
    ));
    // More than max(1, 20%): one of one may fail over, two of five may not.
    assert!(!breaker_open(1, 1));
    assert!(!breaker_open(1, 5));
    assert!(breaker_open(2, 5));
    assert!(breaker_open(3, 5));
    assert!(!breaker_open(2, 10));
    assert!(breaker_open(3, 10));
    // At 1,000 dedicated nodes: 200 silent at once may still be 200 dead nodes, 201 may not.
    assert!(!breaker_open(200, 1000));
    assert!(breaker_open(201, 1000));
}

/// A held-back failover says the same words at every look while the silence lasts: the
/// QuestDB reconcile reports a suppression (status write, Warning event, counter) only when
/// its words change, and at 1,000 nodes a breaker holding 250 databases looked at every second
/// wrote 250 statuses and events a second.
#[test]
fn a_held_back_failover_says_the_same_words_while_the_silence_lasts() {
    let message = |unhealthy| match start(&spec(), &running_status(), Some(unhealthy), true) {
        Start::Suppressed { message, .. } => message,
        other => panic!("{other:?}"),
    };
    assert_eq!(message(31), message(300));
    assert!(message(31).contains("node-old"), "{}", message(31));
    assert!(message(31).contains("30s"), "{}", message(31));
}

#[test]
fn disabled_skipped_or_recently_failed_over_databases_are_held_back_with_a_reason() {
    let mut off = spec();
    off.enabled = false;
    assert!(matches!(
        start(&off, &running_status(), Some(60), false),
        Start::Suppressed {
            reason: SuppressionReason::Disabled,
            ..
        }
    ));
    let status = running_status();
    let skip = should_start(&StartView {
        spec: &spec(),
        skip_annotation: true,
        status: &status,
        unhealthy_for: Some(Duration::from_secs(60)),
        lease_duration: Duration::from_secs(10),
        breaker: None,
        since_last_start: None,
    });
    assert!(matches!(
        skip,
        Start::Suppressed {
            reason: SuppressionReason::SkipAnnotation,
            ..
        }
    ));
    let recent = should_start(&StartView {
        spec: &spec(),
        skip_annotation: false,
        status: &status,
        unhealthy_for: Some(Duration::from_secs(60)),
        lease_duration: Duration::from_secs(10),
        breaker: None,
        since_last_start: Some(Duration::from_secs(60)),
    });
    assert!(matches!(
        recent,
        Start::Suppressed {
            reason: SuppressionReason::RecentFailover,
            ..
        }
    ));
}

#[test]
fn a_failover_under_way_or_without_an_instance_does_not_start_another() {
    let mut status = running_status();
    status.failover = Some(FailoverStatus {
        phase: FailoverPhase::Releasing,
        ..Default::default()
    });
    assert_eq!(start(&spec(), &status, Some(600), false), Start::No);
    let mut none = running_status();
    none.instance_id = None;
    assert_eq!(start(&spec(), &none, Some(600), false), Start::No);
    // A finished one is only a record.
    status.failover.as_mut().unwrap().phase = FailoverPhase::Healthy;
    assert_eq!(start(&spec(), &status, Some(600), false), Start::Go);
}

fn failover(phase: FailoverPhase) -> FailoverStatus {
    FailoverStatus {
        phase,
        old_instance_id: Some("i-old".into()),
        old_node: Some("node-old".into()),
        ..Default::default()
    }
}

fn view(f: &FailoverStatus) -> StepView<'_> {
    StepView {
        failover: f,
        old_instance: Some(InstanceState::Running),
        old_node_exists: true,
        old_node_tainted: false,
        old_node_holds_pod: true,
        old_node_holds_volume: true,
        pod_running_on_new_node: false,
        pod_ready: false,
        dns_follows: false,
        dns_ttl: Duration::from_secs(60),
        in_step_for: Duration::ZERO,
        fence_stop_for: Duration::ZERO,
        escalation: Escalation::DEFAULT,
    }
}

/// A failover in `Fencing` whose stop of the old instance was recorded in `mode`.
fn fencing_with(mode: StopMode) -> FailoverStatus {
    FailoverStatus {
        fence_stop: Some(crate::api::FenceStop {
            instance: "i-old".into(),
            mode,
            requested_at: crate::clock::now(),
        }),
        ..failover(FailoverPhase::Fencing)
    }
}

/// The rule everything else rests on: the volume is let go only once EC2 says the old
/// instance no longer runs.
#[test]
fn nothing_releases_the_volume_before_the_old_instance_is_fenced() {
    let f = failover(FailoverPhase::Fencing);
    // The stop is recorded before it is sent, normal first.
    for state in [
        InstanceState::Running,
        InstanceState::Pending,
        InstanceState::Stopping,
    ] {
        let v = StepView {
            old_instance: Some(state),
            ..view(&f)
        };
        assert_eq!(next_step(&v), Step::RecordStop(StopMode::Graceful));
    }
    let shutting_down = StepView {
        old_instance: Some(InstanceState::ShuttingDown),
        ..view(&f)
    };
    assert!(matches!(next_step(&shutting_down), Step::Wait(_)));
    let forced = fencing_with(StopMode::Forced);
    for state in [InstanceState::Running, InstanceState::Pending] {
        let v = StepView {
            old_instance: Some(state),
            ..view(&forced)
        };
        assert_eq!(next_step(&v), Step::Fence("i-old".into(), StopMode::Forced));
    }
    // A forced stop that hangs is forced again, about once a minute.
    let hung = |secs: u64| StepView {
        old_instance: Some(InstanceState::Stopping),
        fence_stop_for: Duration::from_secs(secs),
        ..view(&forced)
    };
    assert!(matches!(next_step(&hung(59)), Step::Wait(_)));
    assert_eq!(
        next_step(&hung(61)),
        Step::Fence("i-old".into(), StopMode::Forced)
    );
    assert!(matches!(next_step(&hung(90)), Step::Wait(_)));
    assert_eq!(
        next_step(&hung(122)),
        Step::Fence("i-old".into(), StopMode::Forced)
    );
    for state in [
        Some(InstanceState::Stopped),
        Some(InstanceState::Terminated),
        None,
    ] {
        let v = StepView {
            old_instance: state,
            ..view(&f)
        };
        assert_eq!(next_step(&v), Step::Advance(FailoverPhase::Releasing));
    }
}

/// A partitioned or deleted-but-running node is alive: a normal stop lets its OS stop QuestDB
/// and write back what it held, so no acknowledged row is lost even under `nosync`. The stop
/// is forced only once the normal one has had `graceful_stop` (a dead host never shuts down),
/// and a stop recorded for another instance (an earlier failover's) does not count.
#[test]
fn the_fence_stops_normally_first_and_forces_only_after_the_graceful_timeout() {
    let graceful = fencing_with(StopMode::Graceful);
    let at = |secs: u64, state: InstanceState| StepView {
        old_instance: Some(state),
        fence_stop_for: Duration::from_secs(secs),
        ..view(&graceful)
    };
    assert_eq!(
        next_step(&at(0, InstanceState::Running)),
        Step::Fence("i-old".into(), StopMode::Graceful)
    );
    assert!(
        matches!(next_step(&at(10, InstanceState::Stopping)), Step::Wait(m) if m.contains("normally")),
        "a normal stop under way is waited for"
    );
    assert_eq!(
        next_step(&at(29, InstanceState::Running)),
        Step::Fence("i-old".into(), StopMode::Graceful)
    );
    for state in [InstanceState::Running, InstanceState::Stopping] {
        assert_eq!(
            next_step(&at(30, state)),
            Step::RecordStop(StopMode::Forced)
        );
    }
    assert_eq!(
        next_step(&at(45, InstanceState::Stopped)),
        Step::Advance(FailoverPhase::Releasing)
    );
    let mut other = fencing_with(StopMode::Forced);
    other.fence_stop.as_mut().unwrap().instance = "i-earlier".into();
    assert_eq!(
        next_step(&view(&other)),
        Step::RecordStop(StopMode::Graceful)
    );
    let quick = Escalation {
        graceful_stop: Duration::from_secs(5),
        ..Escalation::DEFAULT
    };
    let v = StepView {
        escalation: quick,
        ..at(6, InstanceState::Stopping)
    };
    assert_eq!(next_step(&v), Step::RecordStop(StopMode::Forced));
}

#[test]
fn releasing_taints_the_fenced_node_once_then_waits_for_pod_and_volume() {
    let f = failover(FailoverPhase::Releasing);
    assert_eq!(
        next_step(&view(&f)),
        Step::TaintOutOfService("node-old".into())
    );
    // Fenced (EC2 said stopped or terminated): the pod goes now, not when pod GC gets to it.
    let tainted = StepView {
        old_node_tainted: true,
        ..view(&f)
    };
    assert_eq!(next_step(&tainted), Step::ForceDeletePod);
    let pod_gone = StepView {
        old_node_tainted: true,
        old_node_holds_pod: false,
        ..view(&f)
    };
    assert!(
        matches!(next_step(&pod_gone), Step::Wait(_)),
        "volume still attached"
    );
    let free = StepView {
        old_node_holds_pod: false,
        old_node_holds_volume: false,
        ..view(&f)
    };
    assert_eq!(next_step(&free), Step::Advance(FailoverPhase::Reattaching));
    // The Node was deleted (the cloud removed it): nothing to taint; the pod goes, then the
    // volume waits for the attach-detach controller.
    let gone = StepView {
        old_node_exists: false,
        ..view(&f)
    };
    assert_eq!(next_step(&gone), Step::ForceDeletePod);
    let gone_pod_gone = StepView {
        old_node_holds_pod: false,
        ..gone
    };
    assert!(matches!(next_step(&gone_pod_gone), Step::Wait(m) if m.contains("6 min")));
}

#[test]
fn recovery_ends_when_the_database_answers_and_dns_follows() {
    let f = failover(FailoverPhase::Reattaching);
    assert!(matches!(next_step(&view(&f)), Step::Wait(_)));
    let started = StepView {
        pod_running_on_new_node: true,
        ..view(&f)
    };
    assert_eq!(
        next_step(&started),
        Step::Advance(FailoverPhase::Recovering)
    );
    let f = failover(FailoverPhase::Recovering);
    let ready = StepView {
        pod_running_on_new_node: true,
        pod_ready: true,
        ..view(&f)
    };
    assert!(matches!(next_step(&ready), Step::Wait(m) if m.contains("DNS")));
    let done = StepView {
        dns_follows: true,
        ..ready
    };
    assert_eq!(next_step(&done), Step::Advance(FailoverPhase::Draining));
}

/// A record Route53 refuses kept the failover in `Recovering` for ever, holding back backups,
/// moves and the next failover of a database that answered: past the wait it goes on, and the
/// record is `DnsReady`'s to retry.
#[test]
fn a_dns_record_that_never_follows_holds_the_failover_only_for_a_bounded_wait() {
    let f = failover(FailoverPhase::Recovering);
    let answering = |secs: u64| StepView {
        pod_running_on_new_node: true,
        pod_ready: true,
        dns_follows: false,
        in_step_for: Duration::from_secs(secs),
        ..view(&f)
    };
    assert!(
        matches!(next_step(&answering(DNS_FOLLOW_WAIT.as_secs() - 1)), Step::Wait(m) if m.contains("DnsReady"))
    );
    assert_eq!(
        next_step(&answering(DNS_FOLLOW_WAIT.as_secs())),
        Step::Advance(FailoverPhase::Draining)
    );
    // Never before the database answers.
    let silent = StepView {
        pod_ready: false,
        ..answering(3600)
    };
    assert!(matches!(next_step(&silent), Step::Wait(_)));
}

/// A terminated instance's private address can go to another instance at once, while
/// resolvers still send clients there for the record's TTL: the fenced instance keeps it.
#[test]
fn the_fenced_instance_keeps_its_address_until_the_old_dns_record_expired() {
    let f = failover(FailoverPhase::Draining);
    let draining = |secs: u64, ttl: u64| StepView {
        pod_running_on_new_node: true,
        pod_ready: true,
        dns_follows: true,
        dns_ttl: Duration::from_secs(ttl),
        in_step_for: Duration::from_secs(secs),
        ..view(&f)
    };
    assert!(matches!(next_step(&draining(59, 60)), Step::Wait(m) if m.contains("60s TTL")));
    assert_eq!(next_step(&draining(60, 60)), Step::Finish("i-old".into()));
    // The database is back: the phase column no longer says FailingOver.
    let status = |phase: FailoverPhase| QuestDBStatus {
        failover: Some(failover(phase)),
        ..Default::default()
    };
    assert!(database_down(&status(FailoverPhase::Recovering)));
    assert!(!database_down(&status(FailoverPhase::Draining)));
    assert!(in_progress(&status(FailoverPhase::Draining)));
    // Without spec.dns no resolver holds the address.
    assert_eq!(next_step(&draining(0, 0)), Step::Finish("i-old".into()));
}

#[test]
fn a_step_past_its_timeout_is_reported_stuck() {
    let f = failover(FailoverPhase::Releasing);
    assert_eq!(stuck(&f, Duration::from_secs(60)), None);
    let c = stuck(&f, Duration::from_secs(601)).expect("stuck");
    assert_eq!(c.reason, FailoverReason::FailoverStuck);
    assert!(!c.status);
}

#[test]
fn the_armed_condition_says_when_the_spec_asks_for_less_than_the_lease() {
    let lease = Duration::from_secs(40);
    assert_eq!(
        armed_message(90, lease),
        "the dedicated node is replaced automatically once its kubelet Lease has been silent for 90s"
    );
    let short = armed_message(10, lease);
    assert!(short.contains("silent for 40s"), "{short}");
    assert!(
        short.contains("unhealthyAfterSeconds is 10") && short.contains("every 10s"),
        "{short}"
    );
}

#[test]
fn a_database_with_failover_off_never_says_armed() {
    let lease = Duration::from_secs(40);
    let on = FailoverSpec::default();
    let (status, reason, _) = idle_condition(&on, lease);
    assert!(status);
    assert_eq!(reason, FailoverReason::Armed);
    let off = FailoverSpec {
        enabled: false,
        ..FailoverSpec::default()
    };
    let (status, reason, message) = idle_condition(&off, lease);
    assert!(!status);
    assert_eq!(reason, FailoverReason::Disabled);
    assert!(message.contains("not replaced"), "{message}");
}

#[test]
fn a_release_waiting_on_a_dead_node_fences_and_taints_it_but_never_a_live_one() {
    let view = |silent: Option<u64>, state: Option<InstanceState>, tainted: bool| ReleaseView {
        node: "node-old",
        instance: "i-old",
        pod_on_node: true,
        silent_for: silent.map(Duration::from_secs),
        threshold: Duration::from_secs(30),
        breaker_open: false,
        instance_state: state,
        node_tainted: tainted,
        stop: None,
        escalation: Escalation::DEFAULT,
    };
    let running = Some(InstanceState::Running);
    // A live kubelet stops the pod gracefully; a short silence is not death.
    assert_eq!(
        release_fence(&view(None, running, false)),
        ReleaseFence::None
    );
    assert_eq!(
        release_fence(&view(Some(29), running, false)),
        ReleaseFence::None
    );
    assert_eq!(
        release_fence(&view(Some(30), running, false)),
        ReleaseFence::RecordStop(StopMode::Graceful)
    );
    let recorded = |mode: StopMode, age: u64, state: Option<InstanceState>| ReleaseView {
        stop: Some((mode, Duration::from_secs(age))),
        ..view(Some(40), state, false)
    };
    assert_eq!(
        release_fence(&recorded(StopMode::Graceful, 1, running)),
        ReleaseFence::Stop("i-old".into(), StopMode::Graceful)
    );
    assert!(matches!(
        release_fence(&recorded(
            StopMode::Graceful,
            10,
            Some(InstanceState::Stopping)
        )),
        ReleaseFence::Wait(_)
    ));
    assert_eq!(
        release_fence(&recorded(
            StopMode::Graceful,
            30,
            Some(InstanceState::Stopping)
        )),
        ReleaseFence::RecordStop(StopMode::Forced)
    );
    // Only once EC2 says the instance is down does anything let the pod go.
    for down in [
        Some(InstanceState::Stopped),
        Some(InstanceState::Terminated),
        None,
    ] {
        assert_eq!(
            release_fence(&view(Some(40), down, false)),
            ReleaseFence::Taint("node-old".into())
        );
        assert!(matches!(
            release_fence(&view(Some(40), down, true)),
            ReleaseFence::Wait(_)
        ));
    }
    // A forced stop that hangs is forced again a minute after it was recorded, once a minute.
    let stopping = Some(InstanceState::Stopping);
    assert!(matches!(
        release_fence(&recorded(StopMode::Forced, 59, stopping)),
        ReleaseFence::Wait(_)
    ));
    assert_eq!(
        release_fence(&recorded(StopMode::Forced, 61, stopping)),
        ReleaseFence::Stop("i-old".into(), StopMode::Forced)
    );
    assert!(matches!(
        release_fence(&recorded(StopMode::Forced, 70, stopping)),
        ReleaseFence::Wait(_)
    ));
    assert_eq!(
        release_fence(&recorded(StopMode::Forced, 122, stopping)),
        ReleaseFence::Stop("i-old".into(), StopMode::Forced)
    );
    let outage = ReleaseView {
        breaker_open: true,
        ..view(Some(40), running, false)
    };
    assert!(matches!(release_fence(&outage), ReleaseFence::Wait(_)));
    let gone = ReleaseView {
        pod_on_node: false,
        ..view(Some(40), running, false)
    };
    assert_eq!(release_fence(&gone), ReleaseFence::None);
}

/// A volume stuck detaching from the fenced node would hold the failover in Releasing (and the
/// database down) for as long as EBS likes: past two minutes the fenced instance, already
/// stopped, is terminated, which detaches it; not before, and not at every poll.
#[test]
fn a_detach_that_sticks_after_the_fence_terminates_the_fenced_instance() {
    let f = failover(FailoverPhase::Releasing);
    let stuck = |secs: u64| StepView {
        old_node_tainted: true,
        old_node_holds_pod: false,
        in_step_for: Duration::from_secs(secs),
        ..view(&f)
    };
    assert!(matches!(next_step(&stuck(30)), Step::Wait(_)));
    assert_eq!(
        next_step(&stuck(121)),
        Step::TerminateFenced(f.old_instance_id.clone().unwrap())
    );
    assert!(matches!(next_step(&stuck(150)), Step::Wait(_)));
    assert!(matches!(next_step(&stuck(241)), Step::TerminateFenced(_)));
}

/// The escalations follow the operator's settings (`--fence-stop-escalation`,
/// `--fence-detach-escalation`), and a period too short to poll within is taken as 10 s, so
/// an escalation is never sent at every poll.
#[test]
fn escalations_follow_their_settings_and_never_fire_at_every_poll() {
    let quick = Escalation {
        graceful_stop: Duration::from_secs(10),
        stop: Duration::from_secs(15),
        detach: Duration::from_secs(30),
    };
    let fencing = fencing_with(StopMode::Forced);
    let hung = |secs: u64, escalation: Escalation| StepView {
        old_instance: Some(InstanceState::Stopping),
        fence_stop_for: Duration::from_secs(secs),
        escalation,
        ..view(&fencing)
    };
    assert!(matches!(next_step(&hung(14, quick)), Step::Wait(_)));
    assert_eq!(
        next_step(&hung(16, quick)),
        Step::Fence("i-old".into(), StopMode::Forced)
    );
    assert!(matches!(
        next_step(&hung(16, Escalation::DEFAULT)),
        Step::Wait(_)
    ));
    let releasing = failover(FailoverPhase::Releasing);
    let stuck = |secs: u64| StepView {
        old_node_tainted: true,
        old_node_holds_pod: false,
        in_step_for: Duration::from_secs(secs),
        escalation: quick,
        ..view(&releasing)
    };
    assert!(matches!(next_step(&stuck(29)), Step::Wait(_)));
    assert!(matches!(next_step(&stuck(31)), Step::TerminateFenced(_)));
    let tiny = Escalation {
        graceful_stop: Duration::from_secs(1),
        stop: Duration::from_secs(1),
        detach: Duration::from_secs(1),
    };
    let fired: Vec<u64> = (0..30)
        .filter(|s| next_step(&hung(*s, tiny)) == Step::Fence("i-old".into(), StopMode::Forced))
        .collect();
    assert_eq!(fired, vec![10, 11, 12, 13, 14, 20, 21, 22, 23, 24]);
}

/// The harm: one tenant whose dedicated nodes all go silent (a broken image) holding back every
/// other tenant's failover. Alone it counts for little unless it is the whole fleet; silent
/// nodes of many namespaces (an outage) still trip the breaker.
#[test]
fn one_namespace_alone_cannot_trip_the_breaker_for_everyone() {
    // 50 nodes: team-a's 20 all silent, 30 healthy elsewhere.
    let counted = breaker_count([(20, 20), (0, 10), (0, 10), (0, 10)]);
    assert_eq!(counted, 5);
    assert!(!breaker_open(counted, 50));
    // An outage: a third of every namespace's nodes silent.
    let outage = breaker_count([(7, 20), (4, 10), (4, 10), (4, 10)]);
    assert!(breaker_open(outage, 50));
    // One namespace that is the whole fleet keeps its breaker.
    assert!(breaker_open(breaker_count([(3, 10)]), 10));
    assert!(!breaker_open(breaker_count([(2, 10)]), 10));
}

/// A failover on its replacement `i-new`, in `phase`, on attempt `attempt`.
fn on_replacement(phase: FailoverPhase, attempt: u32) -> QuestDBStatus {
    QuestDBStatus {
        instance_id: Some("i-new".into()),
        node_generation: Some(2),
        failover: Some(FailoverStatus {
            attempt: Some(attempt.into()),
            ..failover(phase)
        }),
        ..Default::default()
    }
}

fn again(status: &QuestDBStatus, unhealthy: Option<u64>, breaker: bool) -> Start {
    replace_again(&StartView {
        spec: &spec(),
        skip_annotation: false,
        status,
        unhealthy_for: unhealthy.map(Duration::from_secs),
        lease_duration: Duration::from_secs(10),
        breaker: breaker.then(|| "zone z-a".to_string()),
        since_last_start: None,
    })
}

/// The stranded failover of the sandbox: a replacement that died once the old node had let the
/// volume go was waited for for ever. Now it is fenced and replaced in turn, in every step
/// after the old node's release, under the same threshold, and not before it (two fences of
/// one failover never overlap).
#[test]
fn a_replacement_that_dies_after_the_old_node_let_go_is_replaced_in_turn() {
    use FailoverPhase::*;
    for phase in [Reattaching, Recovering, Draining] {
        let status = on_replacement(phase, 1);
        assert_eq!(again(&status, Some(31), false), Start::Go, "{phase}");
        assert_eq!(again(&status, Some(29), false), Start::No, "{phase}");
        assert_eq!(again(&status, None, false), Start::No, "{phase}");
    }
    for phase in [Fencing, Releasing, Healthy] {
        let status = on_replacement(phase, 1);
        assert_eq!(again(&status, Some(600), false), Start::No, "{phase}");
    }
    // The instance fenced is never judged as the replacement.
    let mut fenced = on_replacement(Reattaching, 2);
    fenced.instance_id = Some("i-old".into());
    assert_eq!(again(&fenced, Some(600), false), Start::No);
    fenced.failover.as_mut().unwrap().fenced_instance_ids = vec!["i-first".into()];
    fenced.instance_id = Some("i-first".into());
    assert_eq!(again(&fenced, Some(600), false), Start::No);
    // No replacement launched yet: nothing to judge.
    let mut none = on_replacement(Reattaching, 1);
    none.instance_id = None;
    assert_eq!(again(&none, Some(600), false), Start::No);
}

#[test]
fn a_replacement_is_replaced_under_the_breaker_and_the_spec_but_not_the_interval() {
    let status = on_replacement(FailoverPhase::Recovering, 1);
    assert!(matches!(
        again(&status, Some(31), true),
        Start::Suppressed {
            reason: SuppressionReason::TooManyUnhealthyNodes,
            ..
        }
    ));
    let mut off = spec();
    off.enabled = false;
    let view = StartView {
        spec: &off,
        skip_annotation: false,
        status: &status,
        unhealthy_for: Some(Duration::from_secs(31)),
        lease_duration: Duration::from_secs(10),
        breaker: None,
        since_last_start: None,
    };
    assert!(matches!(
        replace_again(&view),
        Start::Suppressed {
            reason: SuppressionReason::Disabled,
            ..
        }
    ));
    // Started a minute ago: the interval between failovers does not hold back its own
    // replacement's replacement.
    let mut recent = status.clone();
    recent.failover.as_mut().unwrap().started_at = Some(crate::clock::now());
    assert_eq!(again(&recent, Some(31), false), Start::Go);
}

#[test]
fn the_third_failed_replacement_stops_the_loop_and_says_what_to_do() {
    assert_eq!(
        again(
            &on_replacement(FailoverPhase::Reattaching, 2),
            Some(31),
            false
        ),
        Start::Go
    );
    match again(
        &on_replacement(FailoverPhase::Reattaching, MAX_ATTEMPTS),
        Some(31),
        false,
    ) {
        Start::Suppressed { reason, message } => {
            assert_eq!(reason, SuppressionReason::AttemptsExhausted);
            assert!(message.contains("i-new"), "{message}");
            assert!(message.contains("pause and unpause"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// The next attempt fences the replacement, keeps every instance fenced so far for the end,
/// and counts the downtime from the first fence.
#[test]
fn the_next_attempt_keeps_every_fenced_instance_and_the_first_start() {
    let first_start = crate::clock::now();
    let first = FailoverStatus {
        started_at: Some(first_start.clone()),
        ..failover(FailoverPhase::Recovering)
    };
    let second = next_attempt(
        &first,
        FailoverCause::NodeLeaseExpired,
        "i-new",
        "node-new",
        crate::clock::now(),
    );
    assert_eq!(second.phase, FailoverPhase::Fencing);
    assert_eq!(second.old_instance_id.as_deref(), Some("i-new"));
    assert_eq!(second.old_node.as_deref(), Some("node-new"));
    assert_eq!(second.started_at, Some(first_start));
    assert_eq!(second.attempt(), 2);
    assert_eq!(second.fenced().collect::<Vec<_>>(), ["i-old", "i-new"]);
    assert!(
        second.fence_stop.is_none(),
        "a fresh stop for the new instance"
    );
    let third = next_attempt(
        &second,
        FailoverCause::NodeNeverJoined,
        "i-third",
        "",
        crate::clock::now(),
    );
    assert_eq!(
        third.old_node, None,
        "a replacement that never joined has no Node"
    );
    assert_eq!(
        third.fenced().collect::<Vec<_>>(),
        ["i-old", "i-new", "i-third"]
    );
    assert_eq!(third.attempt(), 3);
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The sandbox's poisoned breaker: an unrelated worker dead for two minutes plus one real death
/// counted as an outage, and the database stayed down for as long as the worker did. Silences
/// count together only when they began together.
#[test]
fn only_silences_that_began_together_count_as_an_outage() {
    let total = |c: &std::collections::HashMap<(), usize>| c.values().sum();
    let window = secs(40);
    // A worker silent for two minutes, a dedicated node for 50 s: two groups of one.
    assert_eq!(
        together(&[(secs(120), ()), (secs(50), ())], window, total),
        1
    );
    // Two deaths a renewal apart (10 s): one group.
    assert_eq!(
        together(&[(secs(60), ()), (secs(50), ())], window, total),
        2
    );
    // A rolling group: 0-40 s and 40-80 s overlap in the middle only.
    let rolling = [
        (secs(80), ()),
        (secs(60), ()),
        (secs(41), ()),
        (secs(20), ()),
    ];
    assert_eq!(together(&rolling, window, total), 3);
    assert_eq!(together::<()>(&[], window, total), 0);
}

#[test]
fn a_namespaces_share_is_still_capped_within_one_group() {
    // Three silent nodes of a namespace of five (cap 2) and one of another (cap 2), all at once;
    // a fourth of the first namespace long dead.
    let managed: std::collections::HashMap<&str, usize> = [("a", 5), ("b", 5)].into();
    let weigh = |c: &std::collections::HashMap<&str, usize>| {
        breaker_count(c.iter().map(|(k, n)| (*n, managed[k])))
    };
    let silences = [
        (secs(30), "a"),
        (secs(31), "a"),
        (secs(32), "a"),
        (secs(33), "b"),
        (secs(900), "a"),
    ];
    assert_eq!(together(&silences, secs(40), weigh), 3);
}

#[test]
fn a_silent_node_whose_database_still_answers_is_not_fenced() {
    // A due fence, as should_start decides it; the database's word comes last.
    assert_eq!(
        start(&spec(), &running_status(), Some(31), false),
        Start::Go
    );
    let answered = DatabaseWord::Answered {
        at: "10.0.1.17:9000".into(),
    };
    match heed_the_database(&answered, "node-old") {
        Start::Suppressed { reason, message } => {
            assert_eq!(reason, SuppressionReason::DatabaseAnswers);
            assert!(message.contains("node-old"), "{message}");
            assert!(message.contains("10.0.1.17:9000"), "{message}");
            assert!(
                message.contains("fenced once it stops answering"),
                "{message}"
            );
            // The same words at every look while it lasts (no write, no event per look).
            assert_eq!(
                heed_the_database(&answered, "node-old"),
                Start::Suppressed { reason, message }
            );
        }
        other => panic!("a database that answers must not be fenced: {other:?}"),
    }
    assert_eq!(
        heed_the_database(&DatabaseWord::Silent, "node-old"),
        Start::Go
    );
}

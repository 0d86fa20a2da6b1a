use super::*;
use crate::api::NodeMoveReason;
use crate::cloud::InstanceState;

fn spec(image: &str) -> NodeSpec {
    NodeSpec {
        image: image.into(),
        instance_type: "m6i.large".into(),
        zone: "z-a".into(),
        ..Default::default()
    }
}

fn instance(id: &str, image: &str, state: InstanceState) -> Instance {
    Instance {
        id: id.into(),
        state,
        zone: "z-a".into(),
        image: image.into(),
        instance_type: "m6i.large".into(),
        private_ip: None,
        public_ip: None,
        tags: Default::default(),
        launched_at: None,
        state_reason: None,
        private_dns_name: None,
        pod_addresses: Default::default(),
    }
}

fn running_on(image: &str) -> QuestDBStatus {
    QuestDBStatus {
        instance_id: Some("i-1".into()),
        node_image: Some(image.into()),
        node_instance_type: Some("m6i.large".into()),
        ..Default::default()
    }
}

fn start_view<'a>(spec: &'a NodeSpec, status: &'a QuestDBStatus) -> StartView<'a> {
    StartView {
        spec,
        status,
        database_ready: true,
        failover_in_progress: false,
        // A Monday.
        now: "2026-11-23T12:00:00Z".parse().unwrap(),
        moves_elsewhere: 0,
        concurrency: 2,
        moves_in_namespace: 0,
        namespace_concurrency: 1,
        scheduled_event: None,
        cordoned_node: None,
    }
}

/// Whether a move starts, and to which image.
fn goes_to(start: &Start) -> Option<String> {
    match start {
        Start::Go(record) => record.to_image.clone(),
        _ => None,
    }
}

/// One tenant's moves (stuck ones included) never hold every slot: a second move of the same
/// namespace waits while another namespace's starts.
#[test]
fn one_namespaces_moves_never_hold_every_slot() {
    let s = spec("ami-2");
    let st = running_on("ami-1");
    let same_tenant = StartView {
        moves_elsewhere: 1,
        moves_in_namespace: 1,
        ..start_view(&s, &st)
    };
    match should_start(&same_tenant) {
        Start::Waiting { why, .. } => {
            assert!(
                why.contains("--node-move-concurrency-per-namespace"),
                "{why}"
            )
        }
        other => panic!("waits, not {other:?}"),
    }
    let other_tenant = StartView {
        moves_elsewhere: 1,
        moves_in_namespace: 0,
        ..start_view(&s, &st)
    };
    assert!(matches!(should_start(&other_tenant), Start::Go(_)));
}

fn start(spec: &NodeSpec, status: &QuestDBStatus, ready: bool) -> Start {
    should_start(&StartView {
        database_ready: ready,
        ..start_view(spec, status)
    })
}

#[test]
fn a_new_image_or_instance_type_starts_a_move_from_a_healthy_database_only() {
    let status = running_on("ami-1");
    assert_eq!(start(&spec("ami-1"), &status, true), Start::No);
    assert!(matches!(start(&spec("ami-2"), &status, true), Start::Go(_)));
    let mut bigger = spec("ami-1");
    bigger.instance_type = "m6i.xlarge".into();
    assert!(matches!(start(&bigger, &status, true), Start::Go(_)));
    assert!(matches!(
        start(&spec("ami-2"), &status, false),
        Start::Waiting { .. }
    ));
    let mut unrecorded = status.clone();
    unrecorded.node_instance_type = None;
    assert_eq!(start(&bigger, &unrecorded, true), Start::No);
}

#[test]
fn an_aborted_target_is_not_retried_in_a_loop_but_a_new_edit_is() {
    let mut status = running_on("ami-1");
    status.node_move = Some(NodeMoveStatus {
        phase: NodeMovePhase::Aborted,
        to_image: Some("ami-bad".into()),
        to_instance_type: Some("m6i.large".into()),
        ..Default::default()
    });
    assert_eq!(start(&spec("ami-bad"), &status, true), Start::No);
    assert!(matches!(start(&spec("ami-2"), &status, true), Start::Go(_)));
    // A failover pre-empted it: the target did not fail, the move starts again.
    status.node_move.as_mut().unwrap().reason = Some(NodeMoveReason::Preempted);
    assert!(matches!(
        start(&spec("ami-bad"), &status, true),
        Start::Go(_)
    ));
}

fn upgrade(phase: NodeMovePhase) -> NodeMoveStatus {
    NodeMoveStatus {
        phase,
        to_image: Some("ami-2".into()),
        to_instance_type: Some("m6i.large".into()),
        new_instance_id: Some("i-2".into()),
        ..Default::default()
    }
}

fn view<'a>(u: &'a NodeMoveStatus, spec: &'a NodeSpec, new: Option<&'a Instance>) -> StepView<'a> {
    StepView {
        node_move: u,
        spec,
        new_instance: new,
        launch_error: None,
        new_node: None,
        new_node_dedicated: false,
        new_node_distrusted: None,
        new_node_ready: false,
        new_node_cordoned: false,
        validation: None,
        in_phase_for: Duration::from_secs(1),
        node_timeout: Duration::from_secs(600),
        move_timeout: Duration::from_secs(300),
        stop_grace: Duration::from_secs(60),
        retention_over: false,
        dns_ttl_over: true,
        pod_on_old_node: true,
        volume_on_old_node: true,
        pod_running_on_new_node: false,
        pod_ready: false,
        dns_follows: false,
        old_node_dead: false,
        new_node_dead: false,
        old_node_renews: true,
        backup_holding_checkpoint: None,
    }
}

/// At `NodeReady` (per `u`), the new node `n2` joined, dedicated and Ready.
fn new_node_ready<'a>(
    u: &'a NodeMoveStatus,
    spec: &'a NodeSpec,
    new: &'a Instance,
) -> StepView<'a> {
    StepView {
        new_node: Some("n2".into()),
        new_node_dedicated: true,
        new_node_ready: true,
        ..view(u, spec, Some(new))
    }
}

/// Until the new node is Ready, nothing touches the running database: every failure aborts.
#[test]
fn failures_before_the_database_stops_abort_without_touching_it() {
    let s = spec("ami-2");
    let u = upgrade(NodeMovePhase::Provisioning);
    let bad = StepView {
        launch_error: Some("InvalidAMIID.NotFound"),
        ..view(&u, &s, None)
    };
    assert!(matches!(
        next_step(&bad),
        Step::Abort {
            reason: NodeMoveReason::LaunchFailed,
            ..
        }
    ));
    let pending = instance("i-2", "ami-2", InstanceState::Running);
    let late = StepView {
        in_phase_for: Duration::from_secs(601),
        ..view(&u, &s, Some(&pending))
    };
    assert!(matches!(
        next_step(&late),
        Step::Abort {
            reason: NodeMoveReason::NodeNeverJoined,
            ..
        }
    ));
    let mut dead = instance("i-2", "ami-2", InstanceState::Terminated);
    dead.state_reason = Some("Server.InternalError".into());
    assert!(matches!(
        next_step(&view(&u, &s, Some(&dead))),
        Step::Abort {
            reason: NodeMoveReason::InstanceGone,
            ..
        }
    ));
    let u = upgrade(NodeMovePhase::NodeReady);
    let not_ready = StepView {
        in_phase_for: Duration::from_secs(601),
        new_node: Some("n2".into()),
        ..view(&u, &s, Some(&pending))
    };
    assert!(matches!(
        next_step(&not_ready),
        Step::Abort {
            reason: NodeMoveReason::NodeNeverReady,
            ..
        }
    ));
}

#[test]
fn setting_the_field_back_before_the_database_stops_aborts_the_move() {
    let back = spec("ami-1");
    for p in [NodeMovePhase::Provisioning, NodeMovePhase::NodeReady] {
        let u = upgrade(p);
        assert!(matches!(
            next_step(&view(&u, &back, None)),
            Step::Abort {
                reason: NodeMoveReason::Superseded,
                ..
            }
        ));
    }
    // After the stop, setting the field back sends the database back to the old node.
    let mut u = upgrade(NodeMovePhase::Moving);
    u.from_image = Some("ami-1".into());
    u.from_instance_type = Some("m6i.large".into());
    assert!(matches!(
        next_step(&view(&u, &back, None)),
        Step::RollBack {
            reason: NodeMoveReason::Reverted,
            ..
        }
    ));
    // A third image after the stop: this move finishes first, then the next one starts.
    assert!(matches!(
        next_step(&view(&u, &spec("ami-3"), None)),
        Step::Wait(_)
    ));
}

#[test]
fn the_move_walks_launch_dedicate_ready_switch_stop_move_verify_finish() {
    let s = spec("ami-2");
    let new = instance("i-2", "ami-2", InstanceState::Running);
    let mut u = upgrade(NodeMovePhase::Provisioning);
    u.new_instance_id = None;
    assert_eq!(next_step(&view(&u, &s, Some(&new))), Step::Launch);
    let u = upgrade(NodeMovePhase::Provisioning);
    assert!(matches!(
        next_step(&view(&u, &s, Some(&new))),
        Step::Wait(_)
    ));
    let joined = StepView {
        new_node: Some("n2".into()),
        ..view(&u, &s, Some(&new))
    };
    assert_eq!(
        next_step(&joined),
        Step::Dedicate {
            node: "n2".into(),
            instance: "i-2".into()
        }
    );
    // A Node whose name is not the new instance's private DNS name (or a second claimant) is
    // never dedicated: the move waits, then aborts, and the database stays where it runs.
    let liar = StepView {
        new_node_distrusted: Some("Node evil claims instance i-2 whose private DNS name is ip-10-0-0-2: not trusted with the database".into()),
        ..view(&u, &s, Some(&new))
    };
    let liar = StepView {
        new_node: Some("evil".into()),
        ..liar
    };
    assert!(
        matches!(next_step(&liar), Step::Wait(ref why) if why.contains("not trusted")),
        "{:?}",
        next_step(&liar)
    );
    let too_long = StepView {
        in_phase_for: Duration::from_secs(601),
        ..liar
    };
    assert!(
        matches!(next_step(&too_long), Step::Abort { .. }),
        "{:?}",
        next_step(&too_long)
    );
    let dedicated = StepView {
        new_node_dedicated: true,
        ..joined
    };
    assert_eq!(
        next_step(&dedicated),
        Step::Advance(NodeMovePhase::NodeReady)
    );
    let u = upgrade(NodeMovePhase::NodeReady);
    let ready = new_node_ready(&u, &s, &new);
    assert_eq!(next_step(&ready), Step::Switch);
    let u = upgrade(NodeMovePhase::Stopping);
    assert!(matches!(
        next_step(&view(&u, &s, Some(&new))),
        Step::Wait(_)
    ));
    let stopped = StepView {
        pod_on_old_node: false,
        volume_on_old_node: false,
        ..view(&u, &s, Some(&new))
    };
    assert_eq!(next_step(&stopped), Step::Advance(NodeMovePhase::Moving));
    let u = upgrade(NodeMovePhase::Moving);
    let running = StepView {
        pod_running_on_new_node: true,
        ..view(&u, &s, Some(&new))
    };
    assert_eq!(next_step(&running), Step::Advance(NodeMovePhase::Verifying));
    let u = upgrade(NodeMovePhase::Verifying);
    let answers = StepView {
        pod_ready: true,
        dns_follows: true,
        ..view(&u, &s, Some(&new))
    };
    assert_eq!(next_step(&answers), Step::Retain);
}

#[test]
fn a_move_waits_for_its_maintenance_window_and_says_when_it_opens() {
    let status = running_on("ami-1");
    let mut s = spec("ami-2");
    s.maintenance_window = Some(crate::api::MaintenanceWindow {
        days: vec!["Sat".into()],
        start: "02:00".into(),
        duration: "4h".into(),
    });
    match should_start(&start_view(&s, &status)) {
        Start::Waiting { why, retry } => {
            assert!(why.contains("2026-11-28T02:00:00Z"), "{why}");
            assert_eq!(retry, Duration::from_secs(3600));
        }
        other => panic!("{other:?}"),
    }
    let inside = StartView {
        now: "2026-11-28T03:00:00Z".parse().unwrap(),
        ..start_view(&s, &status)
    };
    assert!(matches!(should_start(&inside), Start::Go(_)));
}

#[test]
fn no_more_moves_start_than_the_concurrency_flag_allows() {
    let status = running_on("ami-1");
    let s = spec("ami-2");
    let full = StartView {
        moves_elsewhere: 2,
        ..start_view(&s, &status)
    };
    assert!(matches!(should_start(&full), Start::Waiting { .. }));
    let room = StartView {
        moves_elsewhere: 1,
        ..start_view(&s, &status)
    };
    assert!(matches!(should_start(&room), Start::Go(_)));
}

#[test]
fn a_rolled_back_target_is_not_retried_and_a_retained_node_is_not_a_new_move() {
    let mut status = running_on("ami-1");
    status.node_move = Some(NodeMoveStatus {
        phase: NodeMovePhase::RolledBack,
        to_image: Some("ami-2".into()),
        to_instance_type: Some("m6i.large".into()),
        ..Default::default()
    });
    assert_eq!(start(&spec("ami-2"), &status, true), Start::No);
    assert!(matches!(start(&spec("ami-3"), &status, true), Start::Go(_)));
    status.node_move.as_mut().unwrap().phase = NodeMovePhase::Retaining;
    assert_eq!(start(&spec("ami-3"), &status, true), Start::No);
    assert!(!in_progress(&status) && active(&status));
}

#[test]
fn running_on_an_allowed_fallback_type_is_not_a_difference() {
    let mut status = running_on("ami-1");
    status.node_instance_type = Some("m6a.large".into());
    let mut s = spec("ami-1");
    assert!(matches!(start(&s, &status, true), Start::Go(_)));
    s.fallback_instance_types = vec!["m6a.large".into()];
    assert_eq!(start(&s, &status, true), Start::No);
}

fn facts(arch: &str, kind_arch: &str) -> NodeFacts {
    NodeFacts {
        image: Some(crate::cloud::ImageFacts {
            id: "ami-2".into(),
            state: "available".into(),
            architecture: arch.into(),
            root_device_type: "ebs".into(),
            root_device_name: Some("/dev/xvda".into()),
            ebs_devices: Vec::new(),
            owner: "602401143452".into(),
            owner_alias: None,
        }),
        instance_type: Some(crate::cloud::InstanceTypeFacts {
            name: "m6i.large".into(),
            architectures: vec![kind_arch.into()],
            offered_in_zone: true,
        }),
    }
}

#[test]
fn an_image_or_type_that_cannot_run_the_node_is_refused_before_any_launch() {
    let s = spec("ami-2");
    assert_eq!(check_node(&facts("x86_64", "x86_64"), &s), Ok(()));
    let refused = |f: NodeFacts, says: &str| {
        let e = check_node(&f, &s).unwrap_err();
        assert!(e.contains(says), "{e}");
    };
    refused(facts("arm64", "x86_64"), "built for arm64");
    let mut f = facts("x86_64", "x86_64");
    f.image = None;
    refused(f, "does not exist");
    let mut f = facts("x86_64", "x86_64");
    f.image.as_mut().unwrap().state = "deregistered".into();
    refused(f, "deregistered");
    let mut f = facts("x86_64", "x86_64");
    f.image.as_mut().unwrap().root_device_type = "instance-store".into();
    refused(f, "EBS-backed");
    let mut f = facts("x86_64", "x86_64");
    f.instance_type = None;
    refused(f, "instance type m6i.large does not exist");
    let mut f = facts("x86_64", "x86_64");
    f.instance_type.as_mut().unwrap().offered_in_zone = false;
    refused(f, "not offered in z-a");
}

#[test]
fn validation_decides_between_provisioning_and_abort() {
    let s = spec("ami-2");
    let u = upgrade(NodeMovePhase::Validating);
    assert!(matches!(next_step(&view(&u, &s, None)), Step::Wait(_)));
    let ok = StepView {
        validation: Some(Ok(())),
        ..view(&u, &s, None)
    };
    assert_eq!(next_step(&ok), Step::Advance(NodeMovePhase::Provisioning));
    let bad = StepView {
        validation: Some(Err("image ami-2 does not exist".into())),
        ..view(&u, &s, None)
    };
    assert!(matches!(
        next_step(&bad),
        Step::Abort {
            reason: NodeMoveReason::InvalidNode,
            ..
        }
    ));
}

/// A database granted a grace period longer than the step timeout is never cut off while it
/// may still be closing its tables: the stop's limit is the grace period plus the step timeout.
#[test]
fn a_stop_within_its_grace_period_is_waited_for_past_the_step_timeout() {
    let s = spec("ami-2");
    let u = upgrade(NodeMovePhase::Stopping);
    let grace = Duration::from_secs(900);
    let stopping = |in_phase: u64| StepView {
        in_phase_for: Duration::from_secs(in_phase),
        stop_grace: grace,
        ..view(&u, &s, None)
    };
    assert!(matches!(next_step(&stopping(600)), Step::Wait(m) if m.contains("900s grace period")));
    let limit = (grace + Duration::from_secs(300)).as_secs();
    assert!(matches!(next_step(&stopping(limit)), Step::Wait(_)));
    assert!(
        matches!(next_step(&stopping(limit + 1)), Step::FenceStuck { message } if message.contains("within 1200s"))
    );
}

/// A node that answers but holds the pod or volume past the grace period and the step timeout
/// (an unmount that fails) lets the database go neither forward nor back: it is fenced, in
/// either direction, whatever the breaker says, and the move goes on.
#[test]
fn a_stop_stuck_on_a_live_node_fences_that_node_in_either_direction() {
    let s = spec("ami-2");
    for rolling_back in [false, true] {
        let mut u = upgrade(NodeMovePhase::Stopping);
        u.rolling_back = rolling_back;
        for (pod, volume) in [(true, true), (false, true), (true, false)] {
            let stuck = StepView {
                in_phase_for: Duration::from_secs(361),
                pod_on_old_node: pod,
                volume_on_old_node: volume,
                ..view(&u, &s, None)
            };
            assert!(
                matches!(next_step(&stuck), Step::FenceStuck { .. }),
                "rolling back {rolling_back}, pod {pod}, volume {volume}"
            );
        }
        let released = StepView {
            in_phase_for: Duration::from_secs(361),
            pod_on_old_node: false,
            volume_on_old_node: false,
            ..view(&u, &s, None)
        };
        assert_eq!(next_step(&released), Step::Advance(NodeMovePhase::Moving));
    }
}

/// A silent node that is not judged dead (the breaker holds: maybe a partition, and the
/// database may still be running there) is never fenced for a slow stop: the move goes back,
/// or, already going back, waits for a human, as before.
#[test]
fn a_slow_stop_on_a_silent_node_held_by_the_breaker_fences_nothing() {
    let s = spec("ami-2");
    let u = upgrade(NodeMovePhase::Stopping);
    let silent = StepView {
        in_phase_for: Duration::from_secs(361),
        old_node_renews: false,
        ..view(&u, &s, None)
    };
    assert!(matches!(
        next_step(&silent),
        Step::RollBack {
            reason: NodeMoveReason::MoveFailed,
            ..
        }
    ));
    let mut back = upgrade(NodeMovePhase::Stopping);
    back.rolling_back = true;
    let silent = StepView {
        in_phase_for: Duration::from_secs(361),
        old_node_renews: false,
        ..view(&back, &s, None)
    };
    assert!(matches!(next_step(&silent), Step::Wait(m) if m.contains("needs attention")));
}

/// A fence begun for a stop that did not end goes on once its node falls silent (the stop
/// silences it): the record says so, and the move never turns back onto the node it stopped.
#[test]
fn a_begun_stuck_fence_goes_on_when_its_stopped_node_falls_silent() {
    let s = spec("ami-2");
    let mut u = upgrade(NodeMovePhase::Stopping);
    u.reason = Some(NodeMoveReason::NodeMoveStuck);
    for in_phase in [5, 361] {
        let silent = StepView {
            in_phase_for: Duration::from_secs(in_phase),
            old_node_renews: false,
            ..view(&u, &s, None)
        };
        assert!(matches!(next_step(&silent), Step::FenceStuck { .. }));
    }
    let released = StepView {
        pod_on_old_node: false,
        volume_on_old_node: false,
        old_node_renews: false,
        ..view(&u, &s, None)
    };
    assert_eq!(next_step(&released), Step::Advance(NodeMovePhase::Moving));
}

/// After the stop, a step that takes too long sends the database back to its old node once;
/// a move back that stalls too waits for a human instead of bouncing.
#[test]
fn a_failure_after_the_stop_moves_the_database_back_once() {
    let s = spec("ami-2");
    for p in [NodeMovePhase::Moving, NodeMovePhase::Verifying] {
        let u = upgrade(p);
        let late = StepView {
            in_phase_for: Duration::from_secs(301),
            ..view(&u, &s, None)
        };
        assert!(
            matches!(
                next_step(&late),
                Step::RollBack {
                    reason: NodeMoveReason::MoveFailed,
                    ..
                }
            ),
            "{p}"
        );
        let mut back = upgrade(p);
        back.rolling_back = true;
        let late = StepView {
            in_phase_for: Duration::from_secs(301),
            ..view(&back, &s, None)
        };
        assert!(
            matches!(next_step(&late), Step::Wait(m) if m.contains("needs attention")),
            "{p}"
        );
    }
    let mut back = upgrade(NodeMovePhase::Verifying);
    back.rolling_back = true;
    let answers = StepView {
        pod_ready: true,
        dns_follows: true,
        ..view(&back, &s, None)
    };
    assert_eq!(next_step(&answers), Step::FinishRollback);
}

#[test]
fn a_retained_node_is_released_after_its_window_or_used_for_a_revert() {
    let mut u = upgrade(NodeMovePhase::Retaining);
    u.from_image = Some("ami-1".into());
    u.from_instance_type = Some("m6i.large".into());
    u.old_instance_id = Some("i-1".into());
    let (two, one) = (spec("ami-2"), spec("ami-1"));
    assert!(matches!(
        next_step(&view(&u, &spec("ami-2"), None)),
        Step::Wait(_)
    ));
    let over = StepView {
        retention_over: true,
        ..view(&u, &two, None)
    };
    assert_eq!(next_step(&over), Step::Release);
    assert_eq!(next_step(&view(&u, &spec("ami-3"), None)), Step::Release);
    // A third target releases the old node early, but not before its DNS TTL passed.
    let three = spec("ami-3");
    let early = StepView {
        dns_ttl_over: false,
        ..view(&u, &three, None)
    };
    assert!(matches!(next_step(&early), Step::Wait(_)));
    assert_eq!(next_step(&view(&u, &spec("ami-1"), None)), Step::Revert);
    // Even past the window, as long as the node is still there.
    let over = StepView {
        retention_over: true,
        ..view(&u, &one, None)
    };
    assert_eq!(next_step(&over), Step::Revert);

    let status = QuestDBStatus {
        instance_id: Some("i-2".into()),
        node_image: Some("ami-2".into()),
        node_instance_type: Some("m6i.large".into()),
        ..Default::default()
    };
    let back = revert_record(&u, &status, &Time("2026-11-23T12:00:00Z".parse().unwrap()));
    assert_eq!(back.phase, NodeMovePhase::NodeReady);
    assert_eq!(back.new_instance_id.as_deref(), Some("i-1"));
    assert_eq!(back.old_instance_id.as_deref(), Some("i-2"));
    assert!(targets(&back, &spec("ami-1")) && reverts(&back, &spec("ami-2")));
    // The retained node is cordoned: it takes pods again before the switch.
    let cordoned = StepView {
        new_node: Some("n1".into()),
        new_node_ready: true,
        new_node_cordoned: true,
        ..view(&back, &one, None)
    };
    assert_eq!(next_step(&cordoned), Step::Uncordon { node: "n1".into() });
    let open = StepView {
        new_node_cordoned: false,
        ..cordoned
    };
    assert_eq!(next_step(&open), Step::Switch);
}

#[test]
fn a_retained_old_node_is_kept_at_least_for_the_dns_ttl() {
    let u = NodeMoveStatus {
        phase: NodeMovePhase::Retaining,
        phase_started_at: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
        ..Default::default()
    };
    let mut no_window = spec("ami-2");
    no_window.rollback_window = Some("0s".into());
    let end = |ttl: u64| {
        retention_end(&u, &no_window, Duration::from_secs(ttl))
            .map(|t| t.to_string())
            .unwrap_or_default()
    };
    assert_eq!(end(0), "2026-01-01T00:00:00Z");
    assert_eq!(end(60), "2026-01-01T00:01:00Z");
}

/// The old node dying after the switch, with the pod still on it, would hold the move in
/// Stopping until its timeout and then send the database back to a dead node: it is fenced
/// instead, and never returned to.
#[test]
fn a_dead_old_node_after_the_switch_is_fenced_and_never_returned_to() {
    let s = spec("ami-2");
    let mut u = upgrade(NodeMovePhase::Stopping);
    u.old_instance_id = Some("i-1".into());
    let dead = StepView {
        old_node_dead: true,
        ..view(&u, &s, None)
    };
    assert_eq!(next_step(&dead), Step::FenceOld);
    let released = StepView {
        pod_on_old_node: false,
        volume_on_old_node: false,
        ..dead
    };
    assert_eq!(next_step(&released), Step::Advance(NodeMovePhase::Moving));
    for p in [NodeMovePhase::Moving, NodeMovePhase::Verifying] {
        let u = upgrade(p);
        let late = StepView {
            in_phase_for: Duration::from_secs(301),
            old_node_dead: true,
            pod_on_old_node: false,
            volume_on_old_node: false,
            ..view(&u, &s, None)
        };
        assert!(
            matches!(next_step(&late), Step::Wait(m) if m.contains("nothing to go back to")),
            "{p}"
        );
    }
    // Retained and dead: no revert onto it; released once resolvers dropped its address.
    let mut kept = upgrade(NodeMovePhase::Retaining);
    kept.from_image = Some("ami-1".into());
    kept.from_instance_type = Some("m6i.large".into());
    let back = spec("ami-1");
    let dead_kept = StepView {
        old_node_dead: true,
        ..view(&kept, &back, None)
    };
    assert_eq!(next_step(&dead_kept), Step::Release);
    let too_soon = StepView {
        dns_ttl_over: false,
        ..dead_kept
    };
    assert!(matches!(next_step(&too_soon), Step::Wait(_)));
}

/// The target node dying after the switch would strand the database on a dead node (and a
/// failover would resume the move with stale ids): the move goes back to the live old node,
/// fencing the dead one on its way out; with both dead it hands over to a failover.
#[test]
fn a_dead_target_after_the_switch_sends_the_database_back_or_hands_over_when_both_died() {
    let s = spec("ami-2");
    for p in [
        NodeMovePhase::Stopping,
        NodeMovePhase::Moving,
        NodeMovePhase::Verifying,
    ] {
        let mut u = upgrade(p);
        u.old_instance_id = Some("i-1".into());
        let dead_target = StepView {
            new_node_dead: true,
            pod_on_old_node: false,
            volume_on_old_node: false,
            ..view(&u, &s, None)
        };
        assert!(
            matches!(
                next_step(&dead_target),
                Step::RollBack {
                    reason: NodeMoveReason::TargetNodeFailed,
                    ..
                }
            ),
            "{p}"
        );
        let both = StepView {
            old_node_dead: true,
            ..view(&u, &s, None)
        };
        let both = StepView {
            new_node_dead: true,
            pod_on_old_node: false,
            volume_on_old_node: false,
            ..both
        };
        assert!(matches!(next_step(&both), Step::HandOver { .. }), "{p}");
        // Still on the dead old node: that node is fenced first.
        let stuck = StepView {
            old_node_dead: true,
            new_node_dead: true,
            volume_on_old_node: false,
            ..view(&u, &s, None)
        };
        if p == NodeMovePhase::Stopping {
            assert_eq!(next_step(&stuck), Step::FenceOld);
        }
    }
    // Moving back, the dead node being left (the failed target) holds the pod: fenced.
    let mut back = upgrade(NodeMovePhase::Stopping);
    back.rolling_back = true;
    let leaving_dead = StepView {
        old_node_dead: true,
        ..view(&back, &s, None)
    };
    assert_eq!(next_step(&leaving_dead), Step::FenceOld);
}

#[test]
fn the_move_owns_the_database_only_between_the_switch_and_the_answer() {
    for (p, owns) in [
        (NodeMovePhase::NodeReady, false),
        (NodeMovePhase::Stopping, true),
        (NodeMovePhase::Moving, true),
        (NodeMovePhase::Verifying, true),
        (NodeMovePhase::Retaining, false),
    ] {
        let status = QuestDBStatus {
            node_move: Some(upgrade(p)),
            ..Default::default()
        };
        assert_eq!(owns_the_database(&status), owns, "{p}");
    }
}

/// The switch stops the database: a backup that holds its checkpoint then would fail
/// (`CheckpointLost`), so a move whose new node is Ready waits for it, however long past the
/// node timeout, and switches once the checkpoint is released. A backup only uploading its
/// cut snapshot holds nothing back.
#[test]
fn the_switch_waits_for_a_backup_that_holds_the_checkpoint() {
    let s = spec("ami-2");
    let new = instance("i-2", "ami-2", InstanceState::Running);
    let u = upgrade(NodeMovePhase::NodeReady);
    let ready = new_node_ready(&u, &s, &new);
    let held = StepView {
        backup_holding_checkpoint: Some("nightly-1".into()),
        in_phase_for: Duration::from_secs(3600),
        ..ready
    };
    match next_step(&held) {
        Step::Wait(message) => assert!(message.contains("backup nightly-1"), "{message}"),
        other => panic!("the switch went ahead of the backup: {other:?}"),
    }
    let released = StepView {
        backup_holding_checkpoint: None,
        ..held
    };
    assert_eq!(next_step(&released), Step::Switch);
}

fn retirement(instance: &str, in_secs: u64) -> crate::cloud::ScheduledEvent {
    let monday_noon: Timestamp = "2026-11-23T12:00:00Z".parse().unwrap();
    crate::cloud::ScheduledEvent {
        instance_id: instance.into(),
        id: Some("instance-event-1".into()),
        code: "instance-retirement".into(),
        description: "The instance is running on degraded hardware".into(),
        not_before: Some(std::time::SystemTime::from(
            monday_noon
                .checked_add(SignedDuration::from_secs(in_secs as i64))
                .unwrap(),
        )),
        not_after: None,
    }
}

/// The harm: AWS retires the hardware at its own time, and the database goes down in an
/// unplanned failover (a forced stop under `nosync`) where a planned move would have cost
/// seconds. An event on the database's instance replaces its node, with the node it runs on.
#[test]
fn a_scheduled_retirement_replaces_a_converged_node_with_one_of_the_same_image_and_type() {
    let status = running_on("ami-1");
    let s = spec("ami-1");
    let event = retirement("i-1", 14 * 24 * 3600);
    let view = StartView {
        scheduled_event: Some(&event),
        ..start_view(&s, &status)
    };
    let Start::Go(record) = should_start(&view) else {
        panic!("a replacement starts");
    };
    assert_eq!(record.to_image.as_deref(), Some("ami-1"));
    assert_eq!(record.to_instance_type.as_deref(), Some("m6i.large"));
    assert_eq!(record.old_instance_id.as_deref(), Some("i-1"));
    let answered = record
        .scheduled_event
        .clone()
        .expect("the event is recorded");
    assert_eq!(answered.code, "instance-retirement");
    assert_eq!(answered.instance_id, "i-1");
    assert!(replaces_node(&record) && !reverts(&record, &s) && !superseded(&record, &s));
    // An event of another instance (one the database left) is not this node's.
    let elsewhere = retirement("i-0", 3600);
    let other = StartView {
        scheduled_event: Some(&elsewhere),
        ..start_view(&s, &status)
    };
    assert_eq!(should_start(&other), Start::No);
    // A database that is not Ready waits, as for any move.
    let not_ready = StartView {
        database_ready: false,
        ..view
    };
    assert!(matches!(should_start(&not_ready), Start::Waiting { .. }));
}

#[test]
fn a_scheduled_event_waits_for_the_maintenance_window_only_if_it_opens_in_time() {
    let status = running_on("ami-1");
    let mut s = spec("ami-1");
    // Saturday 02:00; now is Monday noon.
    s.maintenance_window = Some(crate::api::MaintenanceWindow {
        days: vec!["Sat".into()],
        start: "02:00".into(),
        duration: "4h".into(),
    });
    let in_two_weeks = retirement("i-1", 14 * 24 * 3600);
    let view = StartView {
        scheduled_event: Some(&in_two_weeks),
        ..start_view(&s, &status)
    };
    match should_start(&view) {
        Start::Waiting { why, .. } => {
            assert!(why.contains("instance-retirement"), "{why}");
            assert!(why.contains("2026-11-28T02:00:00Z"), "{why}");
        }
        other => panic!("waits for Saturday's window, not {other:?}"),
    }
    // Due on Friday: Saturday's window is too late, the move starts now.
    let on_friday = retirement("i-1", 4 * 24 * 3600);
    let early = StartView {
        scheduled_event: Some(&on_friday),
        ..start_view(&s, &status)
    };
    assert_eq!(goes_to(&should_start(&early)).as_deref(), Some("ami-1"));
    // Due just after the window opens, within the lead a move needs: now, too.
    let tight = retirement("i-1", (4 * 24 + 14) * 3600 + 1800);
    let late = StartView {
        scheduled_event: Some(&tight),
        ..start_view(&s, &status)
    };
    assert!(matches!(should_start(&late), Start::Go(_)));
    // A move the spec asks for waits for its window without an event, as before.
    let s2 = crate::api::NodeSpec {
        image: "ami-2".into(),
        ..s.clone()
    };
    assert!(matches!(
        should_start(&start_view(&s2, &status)),
        Start::Waiting { .. }
    ));
    // With an early event, that move (to the spec's new image) is the one that starts.
    let both = StartView {
        scheduled_event: Some(&on_friday),
        ..start_view(&s2, &status)
    };
    assert_eq!(goes_to(&should_start(&both)).as_deref(), Some("ami-2"));
}

/// The harm: a spec target that failed (an AMI that never joins) would be launched again as
/// the replacement and fail again, and AWS then stops the only good node.
#[test]
fn a_replacement_for_an_event_uses_the_node_that_works_when_the_specs_target_failed() {
    let mut status = running_on("ami-1");
    status.node_move = Some(NodeMoveStatus {
        phase: NodeMovePhase::Aborted,
        to_image: Some("ami-bad".into()),
        to_instance_type: Some("m6i.large".into()),
        reason: Some(NodeMoveReason::NodeNeverJoined),
        ..Default::default()
    });
    let s = spec("ami-bad");
    assert_eq!(start(&s, &status, true), Start::No);
    let event = retirement("i-1", 3 * 24 * 3600);
    let view = StartView {
        scheduled_event: Some(&event),
        ..start_view(&s, &status)
    };
    let Start::Go(record) = should_start(&view) else {
        panic!("a replacement starts");
    };
    assert_eq!(record.to_image.as_deref(), Some("ami-1"));
    assert!(replaces_node(&record));
    // It is not superseded by the spec that asks for the failed image.
    assert!(!superseded(&record, &s));
    assert_eq!(target_spec(&record, &s).image, "ami-1");
}

#[test]
fn a_failed_replacement_is_tried_again_after_a_while_while_the_event_stands() {
    let now: Timestamp = "2026-11-23T12:00:00Z".parse().unwrap();
    let event = retirement("i-1", 3 * 24 * 3600);
    let mut status = running_on("ami-1");
    status.node_move = Some(NodeMoveStatus {
        phase: NodeMovePhase::Aborted,
        from_image: Some("ami-1".into()),
        to_image: Some("ami-1".into()),
        from_instance_type: Some("m6i.large".into()),
        to_instance_type: Some("m6i.large".into()),
        reason: Some(NodeMoveReason::LaunchFailed),
        message: Some("no capacity".into()),
        finished_at: Some(Time(
            now.checked_sub(SignedDuration::from_secs(60)).unwrap(),
        )),
        scheduled_event: Some(crate::api::ScheduledEventRecord {
            code: event.code.clone(),
            event_id: event.id.clone(),
            instance_id: "i-1".into(),
            not_before: None,
        }),
        ..Default::default()
    });
    let s = spec("ami-1");
    let view = StartView {
        scheduled_event: Some(&event),
        ..start_view(&s, &status)
    };
    match should_start(&view) {
        Start::Waiting { why, retry } => {
            assert!(why.contains("no capacity"), "{why}");
            assert_eq!(retry, SCHEDULED_EVENT_RETRY - Duration::from_secs(60));
        }
        other => panic!("waits, not {other:?}"),
    }
    let later = StartView {
        now: now.checked_add(SignedDuration::from_secs(600)).unwrap(),
        ..view
    };
    assert!(matches!(should_start(&later), Start::Go(_)));
    // Without the event (canceled), nothing is tried again.
    let canceled = StartView {
        scheduled_event: None,
        ..later
    };
    assert_eq!(should_start(&canceled), Start::No);
}

/// A replacement's old node is the one AWS takes: no rollback to it is offered, and it is
/// released once resolvers dropped its address.
#[test]
fn a_replacements_old_node_is_released_after_the_dns_ttl_not_the_rollback_window() {
    let s = spec("ami-1");
    let mut u = upgrade(NodeMovePhase::Retaining);
    u.from_image = Some("ami-1".into());
    u.to_image = Some("ami-1".into());
    u.from_instance_type = Some("m6i.large".into());
    u.to_instance_type = Some("m6i.large".into());
    u.scheduled_event = Some(crate::api::ScheduledEventRecord {
        code: "instance-stop".into(),
        instance_id: "i-old".into(),
        ..Default::default()
    });
    let waiting = StepView {
        dns_ttl_over: false,
        ..view(&u, &s, None)
    };
    match next_step(&waiting) {
        Step::Wait(why) => assert!(why.contains("no rollback"), "{why}"),
        other => panic!("waits for the TTL, not {other:?}"),
    }
    // retainUntil says the TTL, not the rollback window.
    let mut started = u.clone();
    started.phase_started_at = Some(Time("2026-11-23T12:00:00Z".parse().unwrap()));
    assert_eq!(
        retention_end(&started, &s, Duration::from_secs(60)),
        Some("2026-11-23T12:01:00Z".parse().unwrap())
    );
    assert_eq!(next_step(&view(&u, &s, None)), Step::Release);
    // A move the spec asked for keeps its old node for the rollback window.
    let mut asked = u.clone();
    asked.scheduled_event = None;
    asked.from_image = Some("ami-0".into());
    assert!(matches!(next_step(&view(&asked, &s, None)), Step::Wait(_)));
}

/// The harm: `kubectl drain` (or the Node Termination Handler) of a dedicated node waits for
/// ever on the database's disruption budget, or, allowed, leaves the pod Pending on the
/// cordoned node. A cordoned node of a Ready database is replaced now, whatever the window.
#[test]
fn a_cordoned_node_is_replaced_at_once_even_outside_the_maintenance_window() {
    let status = running_on("ami-1");
    let mut s = spec("ami-1");
    s.maintenance_window = Some(crate::api::MaintenanceWindow {
        days: vec!["Sat".into()],
        start: "02:00".into(),
        duration: "4h".into(),
    });
    assert_eq!(should_start(&start_view(&s, &status)), Start::No);
    let drained = StartView {
        cordoned_node: Some("node-1"),
        ..start_view(&s, &status)
    };
    let Start::Go(record) = should_start(&drained) else {
        panic!("a replacement starts");
    };
    assert_eq!(record.drained_node.as_deref(), Some("node-1"));
    assert_eq!(record.to_image.as_deref(), Some("ami-1"));
    assert!(replaces_node(&record) && !reverts(&record, &s));
    // A database that is not Ready is not moved off it (it would not be Ready on the new node
    // either): the drain waits, and its disruption budget keeps the pod where it can start.
    let not_ready = StartView {
        database_ready: false,
        ..drained
    };
    assert!(matches!(should_start(&not_ready), Start::Waiting { .. }));
}

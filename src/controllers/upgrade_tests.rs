use super::*;
use crate::cloud::InstanceState;

fn spec(image: &str) -> NodeSpec {
    NodeSpec {
        image: image.into(),
        instance_type: "m6i.large".into(),
        zone: "z-a".into(),
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

fn start(spec: &NodeSpec, status: &QuestDBStatus, ready: bool) -> Start {
    should_start(&StartView {
        spec,
        status,
        database_ready: ready,
        failover_in_progress: false,
    })
}

#[test]
fn a_new_image_or_instance_type_starts_a_move_from_a_healthy_database_only() {
    let status = running_on("ami-1");
    assert_eq!(start(&spec("ami-1"), &status, true), Start::No);
    assert_eq!(start(&spec("ami-2"), &status, true), Start::Go);
    let mut bigger = spec("ami-1");
    bigger.instance_type = "m6i.xlarge".into();
    assert_eq!(start(&bigger, &status, true), Start::Go);
    assert!(matches!(
        start(&spec("ami-2"), &status, false),
        Start::Waiting(_)
    ));
    let mut unrecorded = status.clone();
    unrecorded.node_instance_type = None;
    assert_eq!(start(&bigger, &unrecorded, true), Start::No);
}

#[test]
fn an_aborted_target_is_not_retried_in_a_loop_but_a_new_edit_is() {
    let mut status = running_on("ami-1");
    status.upgrade = Some(UpgradeStatus {
        phase: phase::ABORTED.into(),
        to_image: Some("ami-bad".into()),
        to_instance_type: Some("m6i.large".into()),
        ..Default::default()
    });
    assert_eq!(start(&spec("ami-bad"), &status, true), Start::No);
    assert_eq!(start(&spec("ami-2"), &status, true), Start::Go);
}

fn upgrade(phase: &str) -> UpgradeStatus {
    UpgradeStatus {
        phase: phase.into(),
        to_image: Some("ami-2".into()),
        to_instance_type: Some("m6i.large".into()),
        new_instance_id: Some("i-2".into()),
        ..Default::default()
    }
}

fn view<'a>(u: &'a UpgradeStatus, spec: &'a NodeSpec, new: Option<&'a Instance>) -> StepView<'a> {
    StepView {
        upgrade: u,
        spec,
        new_instance: new,
        launch_error: None,
        new_node: None,
        new_node_dedicated: false,
        new_node_ready: false,
        in_phase_for: Duration::from_secs(1),
        node_timeout: Duration::from_secs(600),
        pod_on_old_node: true,
        volume_on_old_node: true,
        pod_running_on_new_node: false,
        pod_ready: false,
        dns_follows: false,
    }
}

/// Until the new node is Ready, nothing touches the running database: every failure aborts.
#[test]
fn failures_before_the_database_stops_abort_without_touching_it() {
    let s = spec("ami-2");
    let u = upgrade(phase::PROVISIONING);
    let bad = StepView {
        launch_error: Some("InvalidAMIID.NotFound"),
        ..view(&u, &s, None)
    };
    assert!(matches!(
        next_step(&bad),
        Step::Abort {
            reason: "LaunchFailed",
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
            reason: "NodeNeverJoined",
            ..
        }
    ));
    let mut dead = instance("i-2", "ami-2", InstanceState::Terminated);
    dead.state_reason = Some("Server.InternalError".into());
    assert!(matches!(
        next_step(&view(&u, &s, Some(&dead))),
        Step::Abort {
            reason: "InstanceGone",
            ..
        }
    ));
    let u = upgrade(phase::NODE_READY);
    let not_ready = StepView {
        in_phase_for: Duration::from_secs(601),
        new_node: Some("n2".into()),
        ..view(&u, &s, Some(&pending))
    };
    assert!(matches!(
        next_step(&not_ready),
        Step::Abort {
            reason: "NodeNeverReady",
            ..
        }
    ));
}

#[test]
fn setting_the_field_back_before_the_database_stops_aborts_the_move() {
    let back = spec("ami-1");
    for p in [phase::PROVISIONING, phase::NODE_READY] {
        let u = upgrade(p);
        assert!(matches!(
            next_step(&view(&u, &back, None)),
            Step::Abort {
                reason: "Superseded",
                ..
            }
        ));
    }
    // After the stop the move finishes; going back is then a move of its own.
    let u = upgrade(phase::MOVING);
    assert!(matches!(next_step(&view(&u, &back, None)), Step::Wait(_)));
}

#[test]
fn the_move_walks_launch_dedicate_ready_switch_stop_move_verify_finish() {
    let s = spec("ami-2");
    let new = instance("i-2", "ami-2", InstanceState::Running);
    let mut u = upgrade(phase::PROVISIONING);
    u.new_instance_id = None;
    assert_eq!(next_step(&view(&u, &s, Some(&new))), Step::Launch);
    let u = upgrade(phase::PROVISIONING);
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
    let dedicated = StepView {
        new_node_dedicated: true,
        ..joined
    };
    assert_eq!(next_step(&dedicated), Step::Advance(phase::NODE_READY));
    let u = upgrade(phase::NODE_READY);
    let ready = StepView {
        new_node: Some("n2".into()),
        new_node_dedicated: true,
        new_node_ready: true,
        ..view(&u, &s, Some(&new))
    };
    assert_eq!(next_step(&ready), Step::Switch);
    let u = upgrade(phase::STOPPING);
    assert!(matches!(
        next_step(&view(&u, &s, Some(&new))),
        Step::Wait(_)
    ));
    let stopped = StepView {
        pod_on_old_node: false,
        volume_on_old_node: false,
        ..view(&u, &s, Some(&new))
    };
    assert_eq!(next_step(&stopped), Step::Advance(phase::MOVING));
    let u = upgrade(phase::MOVING);
    let running = StepView {
        pod_running_on_new_node: true,
        ..view(&u, &s, Some(&new))
    };
    assert_eq!(next_step(&running), Step::Advance(phase::VERIFYING));
    let u = upgrade(phase::VERIFYING);
    let answers = StepView {
        pod_ready: true,
        dns_follows: true,
        ..view(&u, &s, Some(&new))
    };
    assert_eq!(next_step(&answers), Step::Finish);
}

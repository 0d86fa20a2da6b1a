use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec as K8sNodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::api::NodeReadyReason;
use crate::cloud::{desired_instance_tags, provider_id};

const UID: &str = "uid-1";

fn spec() -> NodeSpec {
    NodeSpec {
        image: "ami-1".into(),
        instance_type: "m6i.large".into(),
        zone: "z-a".into(),
        ..Default::default()
    }
}

const JOIN_TIMEOUT: Duration = Duration::from_secs(900);
/// A fixed wall clock: the planner takes the time as input.
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn dedicated() -> DedicatedNode {
    DedicatedNode {
        label_value: "ns.db".into(),
        instance: None,
        host_ports: false,
    }
}

fn instance(id: &str, generation: i64, state: InstanceState) -> Instance {
    Instance {
        id: id.into(),
        state,
        zone: "z-a".into(),
        image: "ami-1".into(),
        instance_type: "m6i.large".into(),
        private_ip: Some("10.0.0.4".into()),
        public_ip: None,
        tags: desired_instance_tags("c", "ns", "db", UID, generation),
        launched_at: None,
        state_reason: None,
        private_dns_name: None,
        pod_addresses: Default::default(),
    }
}

fn foreign(id: &str) -> Instance {
    let mut i = instance(id, 1, InstanceState::Running);
    i.tags = desired_instance_tags("c", "ns", "other", "uid-other", 1);
    i
}

fn node(instance_id: &str, labelled: bool, ready: bool) -> Arc<Node> {
    let d = dedicated();
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(format!("node-{instance_id}")),
            labels: labelled.then(|| {
                BTreeMap::from([
                    (DEDICATED_LABEL_KEY.to_string(), d.label_value.clone()),
                    (PIN_LABEL_KEY.to_string(), instance_id.to_string()),
                ])
            }),
            ..ObjectMeta::default()
        },
        spec: Some(K8sNodeSpec {
            provider_id: Some(provider_id("z-a", instance_id)),
            taints: labelled.then(|| {
                vec![Taint {
                    key: DEDICATED_TAINT_KEY.into(),
                    value: Some(d.label_value.clone()),
                    effect: DEDICATED_TAINT_EFFECT.into(),
                    time_added: None,
                }]
            }),
            ..K8sNodeSpec::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    })
}

fn status(generation: Option<i64>, instance_id: Option<&str>) -> QuestDBStatus {
    QuestDBStatus {
        node_generation: generation,
        instance_id: instance_id.map(str::to_string),
        ..QuestDBStatus::default()
    }
}

struct Case {
    spec: Option<NodeSpec>,
    release: bool,
    status: QuestDBStatus,
    instances: Vec<Instance>,
    nodes: Vec<Arc<Node>>,
    failure: Option<&'static str>,
    failover: bool,
    /// Other databases of the namespace on nodes of their own, and the cap.
    namespace: (usize, Option<usize>),
}

impl Case {
    fn new(status: QuestDBStatus) -> Self {
        Self {
            spec: Some(spec()),
            release: false,
            status,
            instances: vec![],
            nodes: vec![],
            failure: None,
            failover: true,
            namespace: (0, None),
        }
    }
    fn plan(&self) -> NodeStep {
        let d = dedicated();
        plan(&NodeView {
            uid: UID,
            spec: self.spec.as_ref(),
            release: self.release,
            status: &self.status,
            instances: &self.instances,
            nodes: &self.nodes,
            dedicated: &d,
            recent_permanent_failure: self.failure,
            join_timeout: JOIN_TIMEOUT,
            now: now(),
            failover_replaces: self.failover,
            namespace_nodes: self.namespace.0,
            namespace_node_cap: self.namespace.1,
        })
    }
}

/// One tenant cannot take the account's whole vCPU quota: at the namespace's cap a first node
/// waits, saying why; a replacement of a database that already had one never waits.
#[test]
fn a_namespace_at_its_node_cap_launches_no_first_node_but_still_replaces_one() {
    let mut first = Case::new(status(Some(1), None));
    first.namespace = (3, Some(3));
    match first.plan() {
        NodeStep::Wait(v) => {
            assert_eq!(v.reason, NodeReadyReason::NamespaceQuota);
            assert!(
                v.message.contains("--max-dedicated-nodes-per-namespace"),
                "{}",
                v.message
            );
        }
        other => panic!("waits at the cap, not {other:?}"),
    }
    first.namespace = (2, Some(3));
    assert_eq!(first.plan(), NodeStep::Launch(1));
    // The second generation replaces a node the database had.
    let mut replacement = Case::new(status(Some(2), None));
    replacement.namespace = (3, Some(3));
    assert_eq!(replacement.plan(), NodeStep::Launch(2));
}

fn reason(step: &NodeStep) -> Option<NodeReadyReason> {
    match step {
        NodeStep::Wait(d) | NodeStep::Failed(d) => Some(d.reason),
        _ => None,
    }
}

#[test]
fn the_generation_is_persisted_before_anything_is_launched() {
    assert_eq!(
        Case::new(status(None, None)).plan(),
        NodeStep::PersistGeneration(1)
    );
}

#[test]
fn a_persisted_generation_without_an_instance_is_launched() {
    let mut c = Case::new(status(Some(1), None));
    c.instances = vec![foreign("i-9")];
    assert_eq!(c.plan(), NodeStep::Launch(1));
}

#[test]
fn after_a_crash_the_instance_of_the_generation_is_recorded_not_launched_again() {
    let mut c = Case::new(status(Some(2), None));
    let live = instance("i-2", 2, InstanceState::Pending);
    c.instances = vec![instance("i-1", 1, InstanceState::Terminated), live.clone()];
    assert_eq!(c.plan(), NodeStep::RecordInstance(Box::new(live)));
}

#[test]
fn a_spent_generation_moves_on_to_the_next() {
    let mut c = Case::new(status(Some(1), None));
    let mut gone = instance("i-1", 1, InstanceState::Terminated);
    gone.state_reason = Some("Client.VolumeLimitExceeded: Volume limit exceeded".into());
    c.instances = vec![gone];
    assert_eq!(
        c.plan(),
        NodeStep::Replace {
            next_generation: 2,
            gone: "i-1".into(),
            reason: Some("Client.VolumeLimitExceeded: Volume limit exceeded".into()),
        }
    );
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::ShuttingDown)];
    assert_eq!(
        c.plan(),
        NodeStep::Replace {
            next_generation: 2,
            gone: "i-1".into(),
            reason: None,
        }
    );
}

/// An instance that dies while pending (a KMS key policy, a volume limit) must not become a
/// launch loop: replacements back off exponentially and stop at the hourly cap.
#[test]
fn replacements_back_off_and_are_capped_per_hour() {
    use std::time::Duration;
    let t0 = std::time::Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    assert_eq!(relaunch(&[], t0), Relaunch::Now);
    assert_eq!(
        relaunch(&[t0], at(10)),
        Relaunch::Backoff(Duration::from_secs(20))
    );
    assert_eq!(relaunch(&[t0], at(30)), Relaunch::Now);
    assert_eq!(
        relaunch(&[t0, at(30)], at(40)),
        Relaunch::Backoff(Duration::from_secs(50))
    );
    assert_eq!(
        relaunch(&[t0, at(30), at(90)], at(150)),
        Relaunch::Backoff(Duration::from_secs(60))
    );
    // The bound: however fast instances die, at most MAX_RELAUNCHES_PER_HOUR per hour.
    let mut history = Vec::new();
    let mut now = t0;
    let mut launched = 0;
    while now < t0 + Duration::from_secs(3600) {
        match relaunch(&history, now) {
            Relaunch::Now => {
                history.push(now);
                launched += 1;
            }
            Relaunch::Backoff(_) | Relaunch::Capped(_) => {}
        }
        now += Duration::from_secs(1);
    }
    assert_eq!(launched, MAX_RELAUNCHES_PER_HOUR);
    assert!(matches!(
        relaunch(&history, now - Duration::from_secs(1)),
        Relaunch::Capped(_)
    ));
    // An hour after the first, one more is allowed.
    assert!(!matches!(
        relaunch(&history, t0 + Duration::from_secs(3601)),
        Relaunch::Capped(_)
    ));
}

#[test]
fn a_recent_permanent_failure_is_shown_instead_of_launching_again() {
    let mut c = Case::new(status(Some(1), None));
    c.failure = Some("The image id '[ami-1]' does not exist");
    let step = c.plan();
    assert_eq!(reason(&step), Some(NodeReadyReason::LaunchFailed));
    assert!(matches!(&step, NodeStep::Failed(d) if d.message.contains("ami-1")));
}

#[test]
fn an_instance_missing_from_the_cache_is_looked_up_by_id() {
    let c = Case::new(status(Some(1), Some("i-1")));
    assert_eq!(c.plan(), NodeStep::LookUp("i-1".into()));
}

#[test]
fn a_pending_instance_waits_as_launching() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::Pending)];
    assert_eq!(reason(&c.plan()), Some(NodeReadyReason::Launching));
}

#[test]
fn a_stopped_instance_is_reported_not_replaced() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::Stopped)];
    assert_eq!(reason(&c.plan()), Some(NodeReadyReason::InstanceStopped));
}

#[test]
fn a_running_instance_waits_for_its_node() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::Running)];
    c.nodes = vec![node("i-2", true, true)];
    assert_eq!(reason(&c.plan()), Some(NodeReadyReason::WaitingForNode));
}

/// A kubelet that cannot register (no instance profile, no access entry, refused user data)
/// is not waited on in silence: past the join timeout the database says so and what to check.
#[test]
fn an_instance_whose_node_never_registers_is_reported_after_the_join_timeout() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    let mut running = instance("i-1", 1, InstanceState::Running);
    running.launched_at = Some(now() - JOIN_TIMEOUT + Duration::from_secs(1));
    c.instances = vec![running.clone()];
    assert_eq!(
        reason(&c.plan()),
        Some(NodeReadyReason::WaitingForNode),
        "still joining"
    );

    running.launched_at = Some(now() - JOIN_TIMEOUT);
    c.instances = vec![running.clone()];
    let step = c.plan();
    assert_eq!(reason(&step), Some(NodeReadyReason::NodeNeverJoined));
    let NodeStep::Wait(v) = &step else {
        unreachable!()
    };
    assert!(
        v.message.contains("i-1") && v.message.contains("access entry"),
        "{}",
        v.message
    );
    // The same message an hour later: reported once, not once a minute.
    running.launched_at = Some(now() - JOIN_TIMEOUT - Duration::from_secs(3600));
    c.instances = vec![running.clone()];
    assert_eq!(c.plan(), step);

    // Its Node registers after all: dedicated as usual.
    c.nodes = vec![node("i-1", false, true)];
    assert!(matches!(c.plan(), NodeStep::Dedicate { .. }));
    // A launch time EC2 did not give never times out.
    running.launched_at = None;
    c.instances = vec![running];
    c.nodes = vec![];
    assert_eq!(reason(&c.plan()), Some(NodeReadyReason::WaitingForNode));
}

/// With failover off nothing else would ever replace it: the instance is terminated (no pod or
/// volume can be on a node that never registered) and the usual replacement follows.
#[test]
fn an_instance_that_never_joins_is_terminated_when_failover_is_off() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.failover = false;
    let mut running = instance("i-1", 1, InstanceState::Running);
    running.launched_at = Some(now() - JOIN_TIMEOUT);
    c.instances = vec![running];
    match c.plan() {
        NodeStep::TerminateNeverJoined { instance, message } => {
            assert_eq!(instance, "i-1");
            assert!(message.contains("access entry"), "{message}");
        }
        other => panic!("expected a termination, got {other:?}"),
    }
    // Once it is gone, the next generation is launched the usual way (backoff and cap).
    c.instances = vec![instance("i-1", 1, InstanceState::Terminated)];
    assert!(matches!(
        c.plan(),
        NodeStep::Replace {
            next_generation: 2,
            ..
        }
    ));
}

#[test]
fn a_node_without_label_or_taint_is_dedicated() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::Running)];
    c.nodes = vec![node("i-1", false, true)];
    assert_eq!(
        c.plan(),
        NodeStep::Dedicate {
            node: "node-i-1".into(),
            instance: "i-1".into()
        }
    );
}

/// The user data labels and taints the node as it joins, but only the operator, having matched
/// the Node to its instance, may pin it: a node that labelled itself is not yet dedicated.
#[test]
fn a_self_labelled_node_is_pinned_by_the_operator_before_it_counts() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::Running)];
    let mut n = (*node("i-1", true, true)).clone();
    if let Some(l) = n.metadata.labels.as_mut() {
        l.remove(PIN_LABEL_KEY);
    }
    c.nodes = vec![Arc::new(n.clone())];
    assert!(matches!(c.plan(), NodeStep::Dedicate { .. }));
    // A pin naming another instance (copied labels, a reused name) is not this node's pin.
    if let Some(l) = n.metadata.labels.as_mut() {
        l.insert(PIN_LABEL_KEY.to_string(), "i-0".to_string());
    }
    c.nodes = vec![Arc::new(n)];
    assert!(matches!(c.plan(), NodeStep::Dedicate { .. }));
}

#[test]
fn a_dedicated_node_is_ready_or_not_as_its_condition_says() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::Running)];
    c.nodes = vec![node("i-1", true, true)];
    assert_eq!(
        c.plan(),
        NodeStep::Ready {
            node: "node-i-1".into(),
            ready: true
        }
    );
    c.nodes = vec![node("i-1", true, false)];
    assert_eq!(
        c.plan(),
        NodeStep::Ready {
            node: "node-i-1".into(),
            ready: false
        }
    );
}

#[test]
fn a_new_node_image_is_left_to_the_move_and_never_replaces_the_node_here() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::Running)];
    c.nodes = vec![node("i-1", true, true)];
    if let Some(s) = c.spec.as_mut() {
        s.image = "ami-2".into();
    }
    assert!(matches!(c.plan(), NodeStep::Ready { .. }));
}

#[test]
fn releasing_terminates_every_live_instance_of_this_questdb_only() {
    let mut c = Case::new(status(Some(2), Some("i-2")));
    c.release = true;
    c.instances = vec![
        instance("i-1", 1, InstanceState::Terminated),
        instance("i-2", 2, InstanceState::Running),
        instance("i-3", 2, InstanceState::Pending),
        foreign("i-9"),
    ];
    assert_eq!(
        c.plan(),
        NodeStep::Terminate(vec!["i-2".into(), "i-3".into()])
    );
}

#[test]
fn released_once_everything_is_gone_and_the_next_node_is_a_new_generation() {
    let mut c = Case::new(status(Some(2), Some("i-2")));
    c.release = true;
    c.instances = vec![instance("i-2", 2, InstanceState::Terminated)];
    assert_eq!(
        c.plan(),
        NodeStep::Released {
            next_generation: Some(3)
        }
    );
}

#[test]
fn releasing_an_instance_the_cache_never_saw_asks_ec2_first() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.release = true;
    assert_eq!(c.plan(), NodeStep::LookUp("i-1".into()));
}

#[test]
fn without_spec_node_and_nothing_recorded_there_is_nothing_to_do() {
    let mut c = Case::new(status(None, None));
    c.spec = None;
    c.instances = vec![foreign("i-9")];
    assert_eq!(c.plan(), NodeStep::Nothing);
}

#[test]
fn removing_spec_node_releases_the_node() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.spec = None;
    c.instances = vec![instance("i-1", 1, InstanceState::Running)];
    assert_eq!(c.plan(), NodeStep::Terminate(vec!["i-1".into()]));
}

#[test]
fn release_waits_until_ec2_says_terminated() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.release = true;
    c.instances = vec![instance("i-1", 1, InstanceState::ShuttingDown)];
    assert_eq!(reason(&c.plan()), Some(NodeReadyReason::Releasing));
}

fn impostor(claimed_instance: &str, name: &str) -> Arc<Node> {
    let mut n = (*node(claimed_instance, false, true)).clone();
    n.metadata.name = Some(name.into());
    Arc::new(n)
}

/// A compromised node registers claiming another instance's providerID (a kubelet sets its
/// own): with two claimants neither gets the database's label and pin, and the conflict says so.
#[test]
fn two_nodes_claiming_one_instance_are_neither_dedicated() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::Running)];
    c.nodes = vec![node("i-1", false, true), impostor("i-1", "evil")];
    let step = c.plan();
    assert_eq!(
        reason(&step),
        Some(NodeReadyReason::NodeIdentityConflict),
        "{step:?}"
    );
    assert!(
        matches!(&step, NodeStep::Wait(v) if v.message.contains("evil") && v.message.contains("node-i-1")),
        "{step:?}"
    );
}

/// The Node of an instance bears the instance's private DNS name (the name its kubelet
/// registers under on EKS); a Node of another name that claims it is not trusted.
#[test]
fn a_node_whose_name_is_not_the_instances_is_not_dedicated() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    let mut i = instance("i-1", 1, InstanceState::Running);
    i.private_dns_name = Some("node-i-1".into());
    c.instances = vec![i.clone()];
    c.nodes = vec![impostor("i-1", "evil")];
    assert_eq!(
        reason(&c.plan()),
        Some(NodeReadyReason::NodeIdentityConflict)
    );
    c.nodes = vec![node("i-1", false, true)];
    assert!(matches!(c.plan(), NodeStep::Dedicate { node, .. } if node == "node-i-1"));
}

/// Once the operator pinned the right Node, an impostor registering later changes nothing:
/// the pinned Node stays the database's (and its silence, not the impostor's, would count).
#[test]
fn a_late_impostor_never_displaces_the_pinned_node() {
    let mut c = Case::new(status(Some(1), Some("i-1")));
    c.instances = vec![instance("i-1", 1, InstanceState::Running)];
    c.nodes = vec![impostor("i-1", "evil"), node("i-1", true, true)];
    assert_eq!(
        c.plan(),
        NodeStep::Ready {
            node: "node-i-1".into(),
            ready: true
        }
    );
    assert_eq!(
        node_for(&c.nodes, "i-1").and_then(|n| n.metadata.name.as_deref()),
        Some("node-i-1")
    );
}

/// The replacement of a failover gets the image and type the database last ran on, whatever
/// `spec.node` names now; any other launch (a first node, a replacement outside a failover)
/// gets the spec's.
#[test]
fn a_failovers_replacement_is_launched_as_the_node_that_last_worked_not_as_the_spec_says() {
    let mut qdb = crate::desired::testing::questdb("db", "ns");
    qdb.spec.node = Some(NodeSpec {
        image: "ami-refused".into(),
        instance_type: "m9z.huge".into(),
        ..spec()
    });
    let req = launch_request(&qdb, "uid", 2, &dedicated()).expect("request");
    let mut ran = status(Some(2), None);
    ran.node_image = Some("ami-1".into());
    ran.node_instance_type = Some("m6i.large".into());
    // No failover: the spec decides (a first launch, a node move's target).
    let plain = for_failover(req.clone(), &ran);
    assert_eq!(
        (plain.image.as_str(), plain.instance_type.as_str()),
        ("ami-refused", "m9z.huge")
    );
    ran.failover = Some(crate::api::FailoverStatus {
        phase: crate::api::FailoverPhase::Fencing,
        ..Default::default()
    });
    let replacement = for_failover(req.clone(), &ran);
    assert_eq!(
        (
            replacement.image.as_str(),
            replacement.instance_type.as_str()
        ),
        ("ami-1", "m6i.large")
    );
    assert_eq!(replacement.node_generation, 2, "nothing else changes");
    assert_eq!(replacement.zone, req.zone);
    // An instance type not recorded (an older operator's record) keeps the spec's.
    ran.node_instance_type = None;
    assert_eq!(for_failover(req, &ran).instance_type, "m9z.huge");
}

/// A failover's replacement that EC2 refuses for want of capacity waited ten minutes a try,
/// the database down meanwhile: a shortage is tried again within a minute and a half, any
/// other refusal of the request still after ten.
#[test]
fn a_capacity_shortage_is_tried_again_within_minutes_and_a_bad_request_after_ten() {
    for code in CAPACITY_CODES {
        assert_eq!(launch_retry(Some(code)), CAPACITY_RETRY, "{code}");
    }
    assert!(CAPACITY_RETRY <= Duration::from_secs(120));
    for code in [
        Some("InvalidAMIID.NotFound"),
        Some("InsufficientFreeAddressesInSubnet"),
        Some("UnauthorizedOperation"),
        None,
    ] {
        assert_eq!(launch_retry(code), PERMANENT_FAILURE_RETRY, "{code:?}");
    }
}

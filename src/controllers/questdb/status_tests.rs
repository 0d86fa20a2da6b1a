//! What `kubectl get qdb` and the conditions say in every situation the reconcile can observe.

use crate::api::{
    CredentialsReason, EventReason, IlpAuthReason, NodeReadyReason, ReadyReason, SpecValidReason,
};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeStatus, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use super::{compute, StatusInputs};
use crate::api::{FailoverPhase, Phase, QuestDB};
use crate::cache::compacted::{CachedStatefulSet, OwnedChild};
use crate::controllers::cached_pod::CachedPod;
use crate::controllers::questdb::apply::Report;
use crate::desired::testing;
use crate::plan::conditions::Verdict;

fn now() -> Timestamp {
    Timestamp::from_second(1_700_000_000).unwrap()
}

fn sts(ready: i32, rolled: bool) -> CachedStatefulSet {
    StatefulSet::to_cached(StatefulSet {
        metadata: ObjectMeta {
            generation: Some(2),
            ..Default::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            ..Default::default()
        }),
        status: Some(StatefulSetStatus {
            observed_generation: Some(2),
            replicas: 1,
            ready_replicas: Some(ready),
            updated_replicas: Some(if rolled { 1 } else { 0 }),
            current_revision: Some("r1".into()),
            update_revision: Some(if rolled { "r1" } else { "r2" }.into()),
            ..Default::default()
        }),
    })
}

fn pod(ready: bool, node: &str) -> CachedPod {
    CachedPod {
        node_name: Some(node.into()),
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(ready: &str, ip: &str) -> Node {
    Node {
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..Default::default()
            }]),
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ready_condition(qdb: &QuestDB, obs: &StatusInputs) -> (String, String, Option<Phase>) {
    let st = compute(qdb, obs, now());
    let c = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    (c.status.clone(), c.reason.clone(), st.phase)
}

#[test]
fn fresh_questdb_is_pending_while_creating() {
    let q = testing::questdb("db", "ns");
    let obs = StatusInputs::default();
    assert_eq!(
        ready_condition(&q, &obs),
        ("False".into(), "Creating".into(), Some(Phase::Pending))
    );
}

#[test]
fn running_when_rolled_out_and_pod_ready() {
    let q = testing::questdb("db", "ns");
    let (s, p, n) = (sts(1, true), pod(true, "node-a"), node("True", "10.0.0.7"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        node: Some(&n),
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    assert_eq!(st.phase, Some(Phase::Running));
    assert_eq!(st.node_name.as_deref(), Some("node-a"));
    assert_eq!(st.node_ready, Some(true));
    assert_eq!(st.node_ip.as_deref(), Some("10.0.0.7"));
    assert_eq!(st.version.as_deref(), Some("9.0.0"));
    assert_eq!(st.observed_generation, Some(1));
    assert!(st.endpoints.unwrap().pgwire.contains(":8812"));
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Running")
    );
}

/// A namespaced install reads no Nodes: on-call still sees where the database runs.
#[test]
fn without_a_node_read_the_node_ip_column_comes_from_the_pod() {
    let q = testing::questdb("db", "ns");
    let (s, mut p) = (sts(1, true), pod(true, "node-a"));
    p.status.as_mut().unwrap().host_ip = Some("10.0.0.9".into());
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    assert_eq!(st.phase, Some(Phase::Running));
    assert_eq!(st.node_ip.as_deref(), Some("10.0.0.9"));
    assert_eq!(st.node_name.as_deref(), Some("node-a"));
    assert_eq!(st.node_ready, None, "unknown, not a guess");
}

#[test]
fn rolling_out_while_template_not_yet_applied() {
    let q = testing::questdb("db", "ns");
    let (s, p) = (sts(1, false), pod(true, "node-a"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        ..Default::default()
    };
    let (status, reason, _) = ready_condition(&q, &obs);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "RollingOut"));
}

/// A database being created says the same thing from its first status until its pod is
/// ready: the StatefulSet just created (no status yet), then its first pod, unscheduled, then
/// placed. Each different word would be one more status write per database.
#[test]
fn a_new_database_waits_for_its_pod_in_the_same_words_until_it_runs() {
    let q = testing::questdb("db", "ns");
    let mut just_created = sts(0, true);
    just_created.kept.status = None;
    let created = Report {
        changed: vec!["ConfigMap db-config".into(), "StatefulSet db".into()],
        applied: vec![
            (EventReason::Created, "ConfigMap db-config".into()),
            (EventReason::Created, "StatefulSet db".into()),
        ],
        ..Report::default()
    };
    let first = compute(
        &q,
        &StatusInputs {
            statefulset: Some(&just_created),
            children: created,
            ..Default::default()
        },
        now(),
    );
    let mut unscheduled = pod(false, "");
    unscheduled.node_name = None;
    let mut on_its_way = sts(0, true);
    on_its_way.kept.status.as_mut().unwrap().updated_replicas = Some(1);
    let ready = |st: &crate::api::QuestDBStatus| {
        let c = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        (
            st.phase,
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
        )
    };
    for p in [None, Some(&unscheduled), Some(&pod(false, "node-a"))] {
        let later = compute(
            &q,
            &StatusInputs {
                statefulset: Some(&on_its_way),
                pod: p,
                ..Default::default()
            },
            now(),
        );
        assert_eq!(
            ready(&later),
            ready(&first),
            "pod {:?}",
            p.map(|p| &p.node_name)
        );
    }
    assert_eq!(ready(&first).2, "PodNotReady");
}

/// A rollout of a changed template over a database that ran still says so.
#[test]
fn a_changed_template_over_an_existing_pod_is_rolling_out() {
    let q = testing::questdb("db", "ns");
    let (s, p) = (sts(0, false), pod(false, "node-a"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        children: Report {
            changed: vec!["StatefulSet db".into()],
            applied: vec![(EventReason::Updated, "StatefulSet db".into())],
            ..Report::default()
        },
        ..Default::default()
    };
    let (status, reason, _) = ready_condition(&q, &obs);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "RollingOut"));
}

#[test]
fn a_change_made_by_this_reconcile_is_not_ready_yet() {
    let q = testing::questdb("db", "ns");
    let (s, p) = (sts(1, true), pod(true, "node-a"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        children: Report {
            changed: vec!["ConfigMap db-config".into()],
            ..Report::default()
        },
        ..Default::default()
    };
    let (status, reason, _) = ready_condition(&q, &obs);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "RollingOut"));
}

/// A config roll: `Running` while the old pod still answers, `Unavailable` while the new one
/// starts (the column never says Running for a database that does not answer), `Running` again
/// once it is ready.
#[test]
fn a_config_roll_says_running_only_while_a_pod_answers() {
    let mut q = testing::questdb("db", "ns");
    q.status = Some(crate::api::QuestDBStatus {
        phase: Some(Phase::Running),
        ..Default::default()
    });
    let s = sts(1, false);
    let old = pod(true, "node-a");
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&old),
        ..Default::default()
    };
    assert_eq!(ready_condition(&q, &obs).2, Some(Phase::Running));
    let s = sts(0, false);
    let obs = StatusInputs {
        statefulset: Some(&s),
        ..Default::default()
    };
    assert_eq!(ready_condition(&q, &obs).2, Some(Phase::Unavailable));
    q.status.as_mut().unwrap().phase = Some(Phase::Unavailable);
    let (s, new) = (sts(1, true), pod(true, "node-a"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&new),
        ..Default::default()
    };
    assert_eq!(ready_condition(&q, &obs).2, Some(Phase::Running));
}

#[test]
fn pod_not_ready_is_reported() {
    let q = testing::questdb("db", "ns");
    let (s, p) = (sts(1, true), pod(false, "node-a"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        ..Default::default()
    };
    assert_eq!(ready_condition(&q, &obs).1, "PodNotReady");
}

#[test]
fn invalid_spec_wins_over_everything() {
    let q = testing::questdb("db", "ns");
    let s = sts(1, true);
    let obs = StatusInputs {
        statefulset: Some(&s),
        invalid: vec!["image \"Bad Image\" is not a valid image reference".into()],
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, ReadyReason::InvalidSpec);
    assert!(ready.message.contains("Bad Image"));
    assert_eq!(st.phase, Some(Phase::Failed));
}

#[test]
fn an_invalid_edit_of_a_running_database_keeps_its_columns_and_ready() {
    let mut q = testing::questdb("db", "ns");
    let (s, p) = (sts(1, true), pod(true, "node-a"));
    let running = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        ..Default::default()
    };
    q.status = Some(compute(&q, &running, now()));
    let before = q.status.clone().unwrap();
    assert_eq!(before.phase, Some(Phase::Running));

    q.spec.image = "questdb/QuestDB:::9".into();
    q.metadata.generation = Some(2);
    let invalid = StatusInputs {
        invalid: vec!["image \"questdb/QuestDB:::9\" is not a valid image reference".into()],
        ..Default::default()
    };
    let st = compute(&q, &invalid, now());
    assert_eq!(st.phase, Some(Phase::Running), "no outage reported");
    assert_eq!(st.version, before.version, "the version that runs");
    assert_eq!(st.node_name, before.node_name);
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Running")
    );
    let valid = st
        .conditions
        .iter()
        .find(|c| c.type_ == "SpecValid")
        .unwrap();
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", SpecValidReason::InvalidSpec.as_str())
    );
    assert!(valid.message.contains("QuestDB:::9"));

    // Fixed again: SpecValid turns True, the rest follows what is observed.
    q.spec.image = "questdb/questdb:9.0.0".into();
    q.status = Some(st);
    let st = compute(&q, &running, now());
    let valid = st
        .conditions
        .iter()
        .find(|c| c.type_ == "SpecValid")
        .unwrap();
    assert_eq!(valid.status, "True");
}

#[test]
fn foreign_children_are_named_in_the_condition() {
    let q = testing::questdb("db", "ns");
    let obs = StatusInputs {
        children: Report {
            blocked: vec!["Service db".into()],
            ..Report::default()
        },
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, ReadyReason::ChildConflict);
    assert!(ready.message.contains("Service db"));
}

#[test]
fn paused_reports_paused_and_no_node() {
    let mut q = testing::questdb("db", "ns");
    q.spec.paused = true;
    let (s, p, n) = (sts(0, true), pod(true, "node-a"), node("True", "10.0.0.7"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        node: Some(&n),
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    assert_eq!(st.phase, Some(Phase::Paused));
    assert_eq!(st.node_name, None);
    assert_eq!(st.node_ip, None);
}

#[test]
fn unknown_node_is_not_ready() {
    let q = testing::questdb("db", "ns");
    let (s, p, n) = (
        sts(1, true),
        pod(true, "node-a"),
        node("Unknown", "10.0.0.7"),
    );
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        node: Some(&n),
        ..Default::default()
    };
    assert_eq!(compute(&q, &obs, now()).node_ready, Some(false));
}

#[test]
fn ilp_condition_is_included() {
    let q = testing::questdb("db", "ns");
    let obs = StatusInputs {
        ilp_auth: Some(Verdict::new(false, IlpAuthReason::NoKeys, "no keys")),
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    assert!(st
        .conditions
        .iter()
        .any(|c| c.type_ == "IlpAuthReady" && c.reason == "NoKeys"));
}

#[test]
fn recomputing_a_converged_status_is_identical() {
    // The reconcile writes status only when it differs: a second pass must produce the same value.
    let mut q = testing::questdb("db", "ns");
    let (s, p, n) = (sts(1, true), pod(true, "node-a"), node("True", "10.0.0.7"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        node: Some(&n),
        ..Default::default()
    };
    let first = compute(&q, &obs, now());
    q.status = Some(first.clone());
    let later = Timestamp::from_second(1_700_000_999).unwrap();
    assert_eq!(compute(&q, &obs, later), first);
}

#[test]
fn cloud_conditions_follow_the_cloud_part_and_vanish_with_their_spec_field() {
    use crate::controllers::questdb::outcome::CloudOutcome;
    let mut q = crate::desired::testing::questdb("db1", "ns");
    q.spec.node = Some(crate::api::NodeSpec {
        image: "ami-1".into(),
        instance_type: "m6i.large".into(),
        zone: "z".into(),
        ..Default::default()
    });
    let waiting = CloudOutcome {
        node_condition: Some(Verdict::new(false, NodeReadyReason::Launching, "starting")),
        ..CloudOutcome::default()
    };
    let obs = StatusInputs {
        cloud: Some(&waiting),
        ..StatusInputs::default()
    };
    let st = compute(&q, &obs, Timestamp::now());
    assert_eq!(st.phase, Some(crate::api::Phase::Provisioning));
    assert!(st
        .conditions
        .iter()
        .any(|c| c.type_ == "NodeReady" && c.reason == "Launching"));

    // spec.node removed and released: the condition goes away.
    q.status = Some(st);
    q.spec.node = None;
    let released = CloudOutcome::default();
    let obs = StatusInputs {
        cloud: Some(&released),
        ..StatusInputs::default()
    };
    let st = compute(&q, &obs, Timestamp::now());
    assert!(
        st.conditions.iter().all(|c| c.type_ != "NodeReady"),
        "{:?}",
        st.conditions
    );
}

/// A pod that stops being Ready because its node died is not a rollout: on-call must read the
/// node, not "RollingOut".
#[test]
fn a_pod_on_a_dead_node_is_reported_as_such_not_as_a_rollout() {
    let mut q = testing::questdb("db", "ns");
    q.status = Some(crate::api::QuestDBStatus {
        phase: Some(Phase::Running),
        ..Default::default()
    });
    let mut s = sts(1, true);
    s.kept.status.as_mut().unwrap().ready_replicas = Some(0);
    let (p, mut n) = (pod(false, "node-a"), node("Unknown", "10.0.0.7"));
    n.metadata.name = Some("node-a".into());
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        node: Some(&n),
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "NodeNotReady")
    );
    assert!(ready.message.contains("node-a"), "{}", ready.message);
    // Before any failover starts (below the threshold, or held back by the breaker): the
    // phase column says the database does not answer, not `Running`.
    assert_eq!(st.phase, Some(Phase::Unavailable));
}

/// A database that exits at start during a rollout (a bad value in the new config): on-call
/// reads the exit code in Ready and the phase, not "rolling out" forever.
#[test]
fn a_crash_looping_database_is_failed_with_its_exit_code_even_mid_rollout() {
    let qdb = testing::questdb("db1", "ns");
    let mut p = pod(false, "worker-a1");
    p.status.as_mut().unwrap().container_statuses = Some(vec![serde_json::from_value(
        serde_json::json!({"name": "questdb", "image": "questdb/questdb:9.2.0", "imageID": "",
            "ready": false, "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 55, "message": "invalid configuration value"}}}),
    )
    .unwrap()]);
    for rolled in [true, false] {
        let s = sts(0, rolled);
        let obs = StatusInputs {
            statefulset: Some(&s),
            pod: Some(&p),
            ..Default::default()
        };
        let (status, reason, phase) = ready_condition(&qdb, &obs);
        assert_eq!((status.as_str(), reason.as_str()), ("False", "CrashLoop"));
        assert_eq!(phase, Some(Phase::Failed));
        let st = compute(&qdb, &obs, now());
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(ready.message.contains("code 55"), "{}", ready.message);
        assert!(ready.message.contains("invalid configuration value"));
    }
}

#[test]
fn status_names_the_credentials_secret_and_its_condition() {
    let qdb = testing::questdb("db1", "ns");
    let obs = StatusInputs {
        credentials: Some(Verdict::new(
            false,
            CredentialsReason::MissingKeys,
            "Secret db1-credentials lacks QDB_PG_PASSWORD",
        )),
        credentials_secret: Some("db1-credentials".into()),
        ..Default::default()
    };
    let st = compute(&qdb, &obs, now());
    assert_eq!(st.credentials_secret.as_deref(), Some("db1-credentials"));
    assert!(st.conditions.iter().any(|c| c.type_ == "CredentialsReady"
        && c.status == "False"
        && c.reason == "MissingKeys"));
}

/// A pod the apiserver refused never reaches a kubelet: without this, `RollingOut` forever.
#[test]
fn a_refused_pod_is_reported_in_the_apiservers_words_until_a_pod_exists() {
    let q = testing::questdb("db", "ns");
    let s = sts(0, false);
    let refusal = r#"create Pod db-0 in StatefulSet db failed error: pods "db-0" is forbidden: violates PodSecurity "baseline:latest": host ports"#;
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod_refused: Some(refusal.into()),
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    assert_eq!(st.phase, Some(Phase::Failed));
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "PodRefused")
    );
    assert!(
        ready.message.contains("violates PodSecurity"),
        "{}",
        ready.message
    );

    // A pod exists after all (the refusal was old news): the pod's own state decides.
    let p = pod(true, "node-a");
    let s = sts(1, true);
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        pod_refused: Some(refusal.into()),
        ..Default::default()
    };
    assert_eq!(compute(&q, &obs, now()).phase, Some(Phase::Running));
}

/// A claim that cannot bind leaves the pod unscheduled with the scheduler saying only "unbound
/// PersistentVolumeClaims": the claim's own events say why, and status carries them.
#[test]
fn an_unbound_volume_is_reported_in_the_volume_controllers_words_while_the_pod_waits() {
    let q = testing::questdb("db", "ns");
    let s = sts(1, false);
    let mut waiting = pod(false, "");
    waiting.node_name = None;
    let why = "no persistent volumes available for this claim and no storage class is set";
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&waiting),
        volume_pending: Some(why.into()),
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    assert_eq!(st.phase, Some(Phase::Pending));
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "VolumePending")
    );
    assert!(ready.message.contains(why), "{}", ready.message);

    // Once the pod is scheduled the volume is no longer what it waits for.
    let placed = pod(false, "node-a");
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&placed),
        volume_pending: Some(why.into()),
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_ne!(ready.reason, "VolumePending");
}

/// Each look at the events is an uncached list: a pod on its way (creation, a restart) is not
/// looked for until `Ready` has been False a few seconds, and a Ready database never is.
#[test]
fn events_are_read_only_once_the_database_has_waited_a_while() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let with_ready = |status: &str, since: i64| {
        let mut q = testing::questdb("db", "ns");
        q.status = Some(crate::api::QuestDBStatus {
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: status.into(),
                reason: "Creating".into(),
                message: String::new(),
                last_transition_time: Time(Timestamp::from_second(since).unwrap()),
                observed_generation: None,
            }],
            ..Default::default()
        });
        q
    };
    let t = now().as_second();
    assert!(!crate::controllers::questdb::waited_long_enough(
        &testing::questdb("db", "ns"),
        now()
    ));
    assert!(!crate::controllers::questdb::waited_long_enough(
        &with_ready("False", t - 1),
        now()
    ));
    assert!(crate::controllers::questdb::waited_long_enough(
        &with_ready("False", t - 3),
        now()
    ));
    assert!(crate::controllers::questdb::waited_long_enough(
        &with_ready("Unknown", t - 60),
        now()
    ));
    assert!(!crate::controllers::questdb::waited_long_enough(
        &with_ready("True", t - 60),
        now()
    ));
}

/// Progress within a phase may wait for the next piece (one write instead of two); a phase
/// change, a condition that flips, a first status or a failover's step never waits.
#[test]
fn only_progress_within_a_phase_waits_to_be_written() {
    use super::progress_only;
    use crate::api::{FailoverStatus, QuestDBStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let cond = |status: &str, reason: &str| Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: reason.into(),
        last_transition_time: Time(now()),
        observed_generation: Some(1),
    };
    let pending = QuestDBStatus {
        phase: Some(Phase::Pending),
        conditions: vec![cond("False", "RollingOut")],
        ..Default::default()
    };
    let scheduled = QuestDBStatus {
        conditions: vec![cond("False", "PodNotReady")],
        node_name: Some("worker-a1".into()),
        node_ip: Some("10.0.0.2".into()),
        node_ready: Some(true),
        ..pending.clone()
    };
    assert!(progress_only(&pending, &scheduled));
    let running = QuestDBStatus {
        phase: Some(Phase::Running),
        conditions: vec![cond("True", "Running")],
        ..scheduled.clone()
    };
    assert!(!progress_only(&scheduled, &running), "a phase change");
    let flipped = QuestDBStatus {
        conditions: vec![cond("True", "Running")],
        ..scheduled.clone()
    };
    assert!(!progress_only(&scheduled, &flipped), "Ready flips");
    assert!(
        !progress_only(&QuestDBStatus::default(), &pending),
        "the first status"
    );
    let failing_over = QuestDBStatus {
        failover: Some(FailoverStatus {
            phase: FailoverPhase::Fencing,
            ..Default::default()
        }),
        ..scheduled.clone()
    };
    assert!(!progress_only(&scheduled, &failing_over), "a failover step");
    let running_node_not_ready = QuestDBStatus {
        node_ready: Some(false),
        ..running.clone()
    };
    assert!(
        !progress_only(&running, &running_node_not_ready),
        "news of a database that ran"
    );
}

/// An operator before the node-move rename left a `NodeUpgrade` condition: kept, it would say
/// forever whatever it said last beside the `NodeMove` condition that replaced it.
#[test]
fn a_node_upgrade_condition_left_by_an_earlier_operator_is_dropped() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let mut q = testing::questdb("db", "ns");
    q.status = Some(crate::api::QuestDBStatus {
        conditions: vec![Condition {
            type_: "NodeUpgrade".into(),
            status: "False".into(),
            reason: "Waiting".into(),
            message: "the maintenance window opens at 02:00".into(),
            observed_generation: Some(1),
            last_transition_time: Time(now()),
        }],
        ..Default::default()
    });
    let (s, p, n) = (sts(1, true), pod(true, "node-a"), node("True", "10.0.0.7"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        node: Some(&n),
        ..Default::default()
    };
    let st = compute(&q, &obs, now());
    let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert!(!types.contains(&"NodeUpgrade"), "{types:?}");
    assert!(types.contains(&"Ready"), "{types:?}");
}

/// A waiting database is woken by its pod's, claim's and refusals' events; only a grace
/// running out comes without one, so it is looked at again just after that, and not before.
#[test]
fn a_waiting_database_is_looked_at_again_when_a_refusals_grace_ends() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use std::time::Duration;
    let t = now().as_second();
    let at = |s: i64| Time(Timestamp::from_second(s).unwrap());
    let mut q = testing::questdb("db", "ns");
    q.status = Some(crate::api::QuestDBStatus {
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "PodNotReady".into(),
            message: String::new(),
            last_transition_time: at(t - 1),
            observed_generation: None,
        }],
        ..Default::default()
    });
    let ripen = |q: &QuestDB, pod: Option<&CachedPod>| {
        crate::controllers::questdb::refusals_ripen_in(q, pod, now())
    };
    // Ready False for 1 s of its 3: 2 s left, and a little.
    let left = ripen(&q, None).expect("a grace runs");
    assert!(
        left > Duration::from_secs(2) && left < Duration::from_secs(3),
        "{left:?}"
    );

    // The scheduler refused the pod this second: its 3 s grace ends later than Ready's.
    let mut unscheduled = pod(false, "");
    unscheduled.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        last_transition_time: Some(at(t)),
        ..Default::default()
    }]);
    let left = ripen(&q, Some(&unscheduled)).expect("two graces run");
    assert!(left < Duration::from_secs(3), "the sooner one: {left:?}");

    // Both graces over: nothing to wait for but events (and the backstop).
    q.status.as_mut().unwrap().conditions[0].last_transition_time = at(t - 60);
    unscheduled
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[0]
        .last_transition_time = Some(at(t - 60));
    assert_eq!(ripen(&q, Some(&unscheduled)), None);
    // A Ready database waits out no grace.
    q.status.as_mut().unwrap().conditions[0].status = "True".into();
    q.status.as_mut().unwrap().conditions[0].last_transition_time = at(t);
    assert_eq!(ripen(&q, None), None);
}

#[test]
fn a_refusal_names_its_questdb_only_for_objects_the_operator_names() {
    use crate::controllers::refusals::Refusal;
    let refusal = |kind: &str, name: &str| Refusal {
        kind: kind.into(),
        name: name.into(),
        ..Default::default()
    };
    assert_eq!(refusal("StatefulSet", "db1").questdb_name(), Some("db1"));
    assert_eq!(
        refusal("PersistentVolumeClaim", "db1-data").questdb_name(),
        Some("db1")
    );
    assert_eq!(
        refusal("PersistentVolumeClaim", "logs").questdb_name(),
        None
    );
    assert_eq!(
        refusal("PersistentVolumeClaim", "-data").questdb_name(),
        None
    );
    assert_eq!(refusal("Deployment", "db1").questdb_name(), None);
}

/// The phase column names what is under way: a move to another node is `MovingNode`, a QuestDB
/// version upgrade `Upgrading` (on-call reads them apart; one name for both hid which).
#[test]
fn a_node_move_and_a_version_upgrade_have_phases_of_their_own() {
    use crate::api::{NodeMovePhase, NodeMoveStatus, VersionUpgradeStatus, VersionUpgradeStep};
    let (s, p, n) = (sts(1, true), pod(true, "node-a"), node("True", "10.0.0.7"));
    let obs = StatusInputs {
        statefulset: Some(&s),
        pod: Some(&p),
        node: Some(&n),
        ..Default::default()
    };
    let with = |moving: bool, upgrading: bool| {
        let mut q = testing::questdb("db", "ns");
        let status = q.status.get_or_insert_with(Default::default);
        status.node_move = moving.then(|| NodeMoveStatus {
            phase: NodeMovePhase::Stopping,
            ..Default::default()
        });
        status.version_upgrade = upgrading.then(|| VersionUpgradeStatus {
            step: VersionUpgradeStep::Starting,
            ..Default::default()
        });
        compute(&q, &obs, now()).phase
    };
    assert_eq!(with(false, false), Some(Phase::Running));
    assert_eq!(with(true, false), Some(Phase::MovingNode));
    assert_eq!(with(false, true), Some(Phase::Upgrading));
    // A version upgrade waits for a move: the move is what is under way.
    assert_eq!(with(true, true), Some(Phase::MovingNode));
}

//! Failover on the real control plane: a dedicated node that stops answering is fenced and
//! replaced, the database comes back on the same volume, and the volume is never attached to
//! the replacement while the old instance may still run.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use questdb_operator::api::QuestDB;
use questdb_operator::cloud::InstanceState;
use tokio_util::sync::CancellationToken;

use super::{node_name_for, settings, CloudEnv, NS};
use crate::harness::{is_ready, is_running, wait_for, wait_for_within, wait_until};

/// Detection (10 s) + the cluster's own timings: node grace, pod GC period (20 s), detach,
/// attach, pod start; generous for a loaded 2-core machine.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(240);

fn failover_phase(q: &QuestDB) -> Option<String> {
    q.status
        .as_ref()?
        .failover
        .as_ref()
        .map(|f| f.phase.to_string())
}

/// The record of `db1`'s failover, once one has started.
async fn failover_started(env: &CloudEnv) -> questdb_operator::api::FailoverStatus {
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "failover started",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| q.and_then(failover_phase).is_some(),
    )
    .await;
    q.status.and_then(|s| s.failover).expect("record")
}

/// `db1`, running with a 10 s failover threshold.
struct Running {
    uid: String,
    instance: String,
    node: String,
    pvc_uid: String,
}

/// Creates `db1` with a 10 s threshold and waits until it runs.
async fn running_database(env: &CloudEnv) -> Running {
    env.create("db1", |q| q.spec.failover.unhealthy_after_seconds = 10)
        .await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let uid = q.uid().expect("uid");
    let id = q
        .status
        .and_then(|s| s.instance_id)
        .expect("instance recorded");
    let pvc = Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), NS)
        .get("db1-data")
        .await
        .expect("pvc");
    Running {
        uid,
        node: node_name_for(&id),
        instance: id,
        pvc_uid: pvc.uid().expect("uid"),
    }
}

/// Watches every VolumeAttachment of the cluster for the whole test and, once the volume has
/// been attached to `old_node`, records a violation whenever it is attached to another node
/// while the old instance is not yet stopped or terminated (two writers possible).
fn two_writer_watch(
    env: &CloudEnv,
    old_node: String,
    old_instance: String,
    stop: CancellationToken,
) -> Arc<Mutex<Vec<String>>> {
    let violations = Arc::new(Mutex::new(Vec::new()));
    let api: Api<VolumeAttachment> = Api::all(env.client.clone());
    let ec2 = env.cloud.ec2.clone();
    let out = violations.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
        let mut armed = false;
        loop {
            let va = tokio::select! {
                _ = stop.cancelled() => return,
                next = stream.next() => match next {
                    Some(Ok(va)) => va,
                    Some(Err(_)) => continue,
                    None => return,
                },
            };
            let attached = va.status.as_ref().is_some_and(|s| s.attached);
            if attached && va.spec.node_name == old_node {
                armed = true;
            }
            if !armed || !attached || va.spec.node_name == old_node {
                continue;
            }
            let old_state = ec2
                .instances()
                .into_iter()
                .find(|i| i.id == old_instance)
                .map(|i| i.state);
            if !matches!(
                old_state,
                Some(InstanceState::Stopped | InstanceState::Terminated) | None
            ) {
                out.lock().unwrap().push(format!(
                    "{} attached to {} while {old_instance} is {old_state:?}",
                    va.name_any(),
                    va.spec.node_name
                ));
            }
        }
    });
    violations
}

/// After a failover: the database answers on a new instance with the same volume, DNS names
/// the new node, the fenced instance is terminated.
async fn assert_moved(env: &CloudEnv, old_id: &str, pvc_uid: &str) {
    assert_moved_within(env, old_id, pvc_uid, FAILOVER_TIMEOUT).await
}

async fn assert_moved_within(env: &CloudEnv, old_id: &str, pvc_uid: &str, timeout: Duration) {
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "failover finished",
        timeout,
        |q: Option<&QuestDB>| q.and_then(failover_phase).as_deref() == Some("Healthy"),
    )
    .await;
    let status = q.status.clone().expect("status");
    let new_id = status.instance_id.clone().expect("new instance");
    assert_ne!(new_id, old_id);
    // Figures, not assertions: detection latency and each step's share of the downtime.
    let metrics = env.handle.metrics.render();
    for line in metrics.lines().filter(|l| {
        (l.starts_with("questdb_operator_failover_step_duration_seconds_sum")
            || l.starts_with("questdb_operator_failover_detection_latency_seconds_sum")
            || l.starts_with("questdb_operator_failover_downtime_seconds_sum"))
            && !l.starts_with('#')
    }) {
        eprintln!("failover figure: {line}");
    }
    let failover = status.failover.clone().expect("failover record");
    assert_eq!(failover.old_instance_id.as_deref(), Some(old_id));
    assert_eq!(failover.new_instance_id.as_deref(), Some(new_id.as_str()));
    assert!(failover.downtime_seconds.is_some(), "{failover:?}");
    eprintln!(
        "failover figure: downtime {:?} s from fencing to the database answering",
        failover.downtime_seconds
    );
    env.assert_runs_on(&new_id, pvc_uid).await;
    env.wait_terminated(old_id, "fenced instance terminated")
        .await;
}

/// The partition case, the dangerous one: the old instance still runs (and could still write)
/// while its kubelet is cut off. The volume must not reach the replacement before EC2 reports
/// the old instance stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_node_is_fenced_before_its_volume_moves() {
    let env = partition_and_move(Fault::None, FAILOVER_TIMEOUT).await;
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 1,
        "the fence is a stop"
    );
    env.stop().await;
}

/// A fence whose stop hangs in `stopping` (a stuck EBS detach, a host problem) would hold the
/// failover for as long as EC2 likes: the stop is forced again after a minute, as AWS advises,
/// and the volume still moves only once the instance is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_whose_stop_hangs_is_forced_again_and_the_failover_completes() {
    // The stop is forced again after 15 s (`--fence-stop-escalation` in these tests).
    let env = partition_and_move(Fault::HangStops, FAILOVER_TIMEOUT).await;
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 2,
        "the hung stop was sent again"
    );
    env.stop().await;
}

/// An instance that EC2's filtered answers leave out (eventual consistency) still runs: the
/// fence must not take "not in the answer" for "gone", or the volume would move while the
/// partitioned instance still writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_missing_from_a_filtered_ec2_answer_is_still_fenced_before_its_volume_moves() {
    let env = partition_and_move(Fault::OmittedFromFilters, FAILOVER_TIMEOUT).await;
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 1,
        "the fence is a stop"
    );
    env.stop().await;
}

/// A volume stuck detaching from the fenced node (EBS can leave one `detaching`) would hold
/// the failover in Releasing, and the database down, for as long as EBS likes: the fenced
/// instance, already stopped, is terminated, which detaches the volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_stuck_detaching_from_the_fenced_node_is_freed_by_terminating_that_instance() {
    // The operator escalates after 30 s here (`--fence-detach-escalation`; 2 minutes by
    // default).
    let env = partition_and_move(Fault::DetachSticks, FAILOVER_TIMEOUT).await;
    env.stop().await;
}

/// What EC2 or EBS does wrong during a partition test.
enum Fault {
    None,
    HangStops,
    OmittedFromFilters,
    DetachSticks,
}

/// Partitions `db1`'s node (with the EC2 `fault`) and returns once the database moved, the
/// volume never attached elsewhere while the old instance could write.
async fn partition_and_move(fault: Fault, timeout: Duration) -> CloudEnv {
    let env = CloudEnv::start(settings()).await;
    let Running {
        instance: old_id,
        node: old_node,
        pvc_uid,
        ..
    } = running_database(&env).await;
    match fault {
        Fault::None => {}
        Fault::HangStops => env.cloud.ec2.set_hang_stops(true),
        Fault::OmittedFromFilters => env.cloud.ec2.omit_from_filters(&old_id, true),
        Fault::DetachSticks => {
            env.cp
                .csi
                .detach_sticks_on
                .lock()
                .unwrap()
                .insert(old_node.clone());
        }
    }
    let stop = CancellationToken::new();
    let violations = two_writer_watch(&env, old_node.clone(), old_id.clone(), stop.clone());
    env.cp
        .node(&old_node)
        .expect("kubelet of the dedicated node")
        .partition();
    assert_moved_within(&env, &old_id, &pvc_uid, timeout).await;
    stop.cancel();
    let v = violations.lock().unwrap().clone();
    assert!(v.is_empty(), "two writers possible: {v:?}");
    env
}

/// The power-off case, as EC2 shows a hardware failure: the kubelet and the database are dead
/// but the instance is still `running` (failed status checks, not a stopped state), so it is
/// fenced like a partitioned one before its volume moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedicated_node_that_loses_power_is_replaced_on_the_same_volume() {
    let env = lose_power(false).await;
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 1,
        "a running instance is fenced by a stop"
    );
    env.stop().await;
}

/// An instance stopped outside the operator (a user, a scheduled EC2 event): EC2 already
/// reports it stopped, and the database comes back elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedicated_instance_stopped_by_someone_else_is_replaced_on_the_same_volume() {
    lose_power(true).await.stop().await;
}

/// `db1`'s node loses power (and its instance is stopped for EC2 too when `stopped`); returns
/// once the database was moved.
async fn lose_power(stopped: bool) -> CloudEnv {
    let env = CloudEnv::start(settings()).await;
    let Running {
        instance: old_id,
        node: old_node,
        pvc_uid,
        ..
    } = running_database(&env).await;
    env.cp
        .node(&old_node)
        .expect("kubelet of the dedicated node")
        .power_off();
    if stopped {
        assert!(env.cloud.ec2.power_off(&old_id));
    }
    assert_moved(&env, &old_id, &pvc_uid).await;
    env
}

/// A node that misses a few heartbeats and comes back before the threshold keeps its database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_that_returns_before_the_threshold_causes_no_failover() {
    let env = CloudEnv::start(settings()).await;
    env.create("db1", |q| q.spec.failover.unhealthy_after_seconds = 30)
        .await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let id = q.status.and_then(|s| s.instance_id).expect("instance");
    let node = env.cp.node(&node_name_for(&id)).expect("kubelet");
    node.partition();
    // The operator saw the node unhealthy (its gauge says so) ...
    let metrics = env.handle.metrics.clone();
    wait_until("node counted unhealthy", || {
        let m = metrics.render();
        async move { m.contains("questdb_operator_unhealthy_dedicated_nodes 1") }
    })
    .await;
    // ... and healthy again once the heartbeat returned, well before 30 s.
    node.heal();
    wait_until("node counted healthy again", || {
        let m = metrics.render();
        async move { m.contains("questdb_operator_unhealthy_dedicated_nodes 0") }
    })
    .await;
    let q = env.qdbs().get("db1").await.expect("db1");
    let status = q.status.expect("status");
    assert_eq!(status.failover, None, "no failover started");
    assert_eq!(status.instance_id.as_deref(), Some(id.as_str()));
    assert_eq!(env.cloud.ec2.call_count("StopInstances"), 0);
    env.stop().await;
}

/// A kubelet restart (an upgrade, a crash systemd restarts) is a short silence followed by a
/// moment of NotReady while its containers run on: shorter than the threshold, it fences
/// nothing, moves nothing, and the same pod serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restart_within_the_threshold_fences_nothing_and_the_same_pod_serves_on() {
    let env = CloudEnv::start(settings()).await;
    let Running { instance, node, .. } = running_database(&env).await;
    let pods = Api::<Pod>::namespaced(env.client.clone(), NS);
    let pod_uid = pods.get("db1-0").await.expect("pod").uid();
    let kubelet = env.cp.node(&node).expect("kubelet");
    let lease = questdb_testenv::timings::node_lease_duration();
    // Down for half the Lease: silent, but well inside the threshold (at least the Lease).
    kubelet.restart(lease / 2).await;
    wait_for(&env.qdbs(), "db1", "Ready after the restart", is_ready()).await;
    // Three thresholds go by: nothing acts on a node that came back.
    let deadline = tokio::time::Instant::now() + lease * 3;
    while tokio::time::Instant::now() < deadline {
        let q = env.qdbs().get("db1").await.expect("db1");
        let status = q.status.clone().expect("status");
        assert_eq!(status.failover, None, "no failover of a restarted kubelet");
        assert_eq!(status.instance_id.as_deref(), Some(instance.as_str()));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(env.cloud.ec2.call_count("StopInstances"), 0);
    assert_eq!(
        pods.get("db1-0").await.expect("pod").uid(),
        pod_uid,
        "the same pod serves on"
    );
    env.stop().await;
}

/// A kubelet that reports NotReady while it renews its Lease (a container runtime or CNI
/// restart, PLEG) is alive, and so is its database: nothing is fenced, the pod is not evicted
/// (the not-ready taint's default 15 s toleration here, 300 s on a real cluster, would), and
/// the same pod serves on once the node is Ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_not_ready_while_its_lease_renews_is_never_fenced_and_its_database_is_not_evicted() {
    let env = CloudEnv::start(settings()).await;
    let Running { instance, node, .. } = running_database(&env).await;
    let pods = Api::<Pod>::namespaced(env.client.clone(), NS);
    let pod_uid = pods.get("db1-0").await.expect("pod").uid();
    let kubelet = env.cp.node(&node).expect("kubelet");
    // Converged: nothing but the transition itself can wake the database now.
    super::writes_settle(&env.cp).await;
    kubelet.set_fault(questdb_testenv::NodeFault::NotReady);
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone());
    let not_ready = wait_for(
        &nodes,
        &node,
        "node NotReady",
        |n: Option<&k8s_openapi::api::core::v1::Node>| {
            n.and_then(|n| {
                n.status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .find(|c| c.type_ == "Ready")
                    .cloned()
            })
            .is_some_and(|c| {
                c.status == "False" && c.message.as_deref().is_some_and(|m| m.contains("PLEG"))
            })
        },
    )
    .await;
    // NotReady while alive: the Lease was renewed within one renewal interval of the node
    // turning NotReady (a silent kubelet's would have stopped a whole Lease before).
    let not_ready_at = not_ready
        .status
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time)
        .map(|t| t.0.as_millisecond())
        .expect("the Ready condition has a transition time");
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        env.client.clone(),
        "kube-node-lease",
    );
    let renew_ms = questdb_testenv::timings::node_lease_renew().as_millis() as i64;
    wait_until(
        "the NotReady node's Lease renews after it turned NotReady",
        || {
            let (leases, node) = (leases.clone(), node.clone());
            async move {
                leases
                    .get(&node)
                    .await
                    .ok()
                    .and_then(|l| l.spec?.renew_time)
                    .is_some_and(|t| t.0.as_millisecond() > not_ready_at + renew_ms / 2)
            }
        },
    )
    .await;
    // Not a reason to fail over, but what `kubectl get qdb` shows an on-call engineer.
    // The transition itself wakes the database, not a resync minutes later.
    wait_for_within(
        &env.qdbs(),
        "db1",
        "NODEREADY false soon after the node",
        Duration::from_secs(10),
        |q: Option<&QuestDB>| q.and_then(|q| q.status.as_ref()?.node_ready) == Some(false),
    )
    .await;
    // The node-lifecycle controller taints it not-ready:NoExecute; pods that do not tolerate
    // that are evicted 15 s later here. Watch three thresholds and the toleration go by.
    let window = Duration::from_secs(10 * 3) + Duration::from_secs(15);
    let deadline = tokio::time::Instant::now() + window;
    let mut saw_taint = false;
    while tokio::time::Instant::now() < deadline {
        let q = env.qdbs().get("db1").await.expect("db1");
        let status = q.status.clone().expect("status");
        assert_eq!(status.failover, None, "no failover of a live node");
        assert_eq!(status.instance_id.as_deref(), Some(instance.as_str()));
        assert_eq!(
            env.cloud.ec2.call_count("StopInstances"),
            0,
            "nothing fenced"
        );
        let pod = pods.get("db1-0").await.expect("pod stays");
        assert_eq!(pod.uid(), pod_uid);
        assert!(pod.metadata.deletion_timestamp.is_none(), "pod not evicted");
        saw_taint |= nodes
            .get(&node)
            .await
            .expect("node")
            .spec
            .and_then(|s| s.taints)
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key == "node.kubernetes.io/not-ready" && t.effect == "NoExecute")
            });
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        saw_taint,
        "the control plane tainted the node not-ready:NoExecute"
    );
    kubelet.heal();
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    assert_eq!(
        q.status.and_then(|s| s.instance_id).as_deref(),
        Some(instance.as_str())
    );
    let pod = pods.get("db1-0").await.expect("pod");
    assert_eq!(pod.uid(), pod_uid, "the same pod, never restarted");
    env.stop().await;
}

/// `kubectl delete node` of a dedicated node whose instance still runs (or a kubelet that never
/// re-registers): its kubelet runs on and may even renew its Lease, but no Node says anything
/// and a node with no Node object serves nothing, and without this the database waits for a
/// Node forever. It is fenced and replaced; its volume is released by Kubernetes' own
/// timers (pod GC, then the attach-detach controller's force detach: there is no Node to take
/// the out-of-service taint), never before the old instance is stopped. Here the force detach
/// comes after 30 s, as upstream's own integration tests shorten it; the full tier also runs
/// it at upstream's 6 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_whose_instance_still_runs_is_fenced_and_replaced() {
    let wait = Duration::from_secs(30);
    deleted_node_is_fenced_and_replaced(Some(wait), Duration::from_secs(300)).await;
}

/// The same at the attach-detach controller's real timer (6 minutes): what a cluster does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_whose_instance_still_runs_is_fenced_and_replaced_at_the_real_force_detach()
{
    deleted_node_is_fenced_and_replaced(None, Duration::from_secs(720)).await;
}

async fn deleted_node_is_fenced_and_replaced(force_detach: Option<Duration>, within: Duration) {
    let mut cluster = crate::harness::cluster();
    cluster.attach_detach_max_wait_for_unmount = force_detach;
    let env = CloudEnv::start_on(settings(), cluster, Default::default()).await;
    let Running {
        instance: old_id,
        node: old_node,
        pvc_uid,
        ..
    } = running_database(&env).await;
    let stop = CancellationToken::new();
    let violations = two_writer_watch(&env, old_node.clone(), old_id.clone(), stop.clone());
    Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .delete(&old_node, &Default::default())
        .await
        .expect("kubectl delete node");
    let record = failover_started(&env).await;
    assert_eq!(
        record.reason.map(|r| r.to_string()).as_deref(),
        Some("NodeDeleted"),
        "{record:?}"
    );
    assert_eq!(record.old_node.as_deref(), Some(old_node.as_str()));
    // Pod GC (40 s) and the attach-detach controller's force detach come first.
    assert_moved_within(&env, &old_id, &pvc_uid, within).await;
    stop.cancel();
    let v = violations.lock().unwrap().clone();
    assert!(v.is_empty(), "two writers possible: {v:?}");
    env.stop().await;
}

/// An instance whose kubelet never registers (on EKS: no instance profile, no EC2_LINUX access
/// entry, user data the kubelet refuses) is not waited on in silence: past `--node-join-timeout`
/// the database says what to check, once, and failover fences the instance and launches
/// another, which joins once the cause is fixed.
/// db1 once `NodeReady` says its node never joined.
async fn never_joined(env: &CloudEnv) -> QuestDB {
    wait_for_within(
        &env.qdbs(),
        "db1",
        "NodeReady says the node never joined",
        FAILOVER_TIMEOUT,
        crate::harness::has_condition("NodeReady", "NodeNeverJoined"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_node_never_joins_is_reported_and_replaced() {
    let env = CloudEnv::start(settings()).await;
    env.cloud.ec2.set_never_joins(super::AMI, true);
    env.create("db1", |q| q.spec.failover.unhealthy_after_seconds = 10)
        .await;
    let q = never_joined(&env).await;
    let status = q.status.clone().expect("status");
    let first = status.instance_id.clone().expect("the first instance");
    let message = crate::harness::condition_message(&q, "NodeReady");
    assert!(
        message.contains(&first) && message.contains("access entry"),
        "{message}"
    );
    assert!(
        status.failover.is_none(),
        "said before any failover: {status:?}"
    );
    // The user adds the access entry: instances launched from now on join.
    env.cloud.ec2.set_never_joins(super::AMI, false);

    let record = failover_started(&env).await;
    assert_eq!(
        record.reason.map(|r| r.to_string()).as_deref(),
        Some("NodeNeverJoined"),
        "{record:?}"
    );
    assert_eq!(record.old_instance_id.as_deref(), Some(first.as_str()));
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "Ready on the replacement",
        FAILOVER_TIMEOUT,
        is_ready(),
    )
    .await;
    let now_on = q.status.and_then(|s| s.instance_id).expect("instance");
    assert_ne!(now_on, first);
    env.wait_terminated(&first, "the instance that never joined is terminated")
        .await;
    let events: Vec<k8s_openapi::api::events::v1::Event> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(env.client.clone(), NS)
            .list(&Default::default())
            .await
            .expect("events")
            .items;
    // Repeats of one Event are counted in its series.
    let never: i32 = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("NodeNeverJoined"))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    assert_eq!(never, 1, "one event for the instance that never joined");
    env.stop().await;
}

/// With failover off nothing else would replace an instance whose Node never registers: it is
/// terminated after the join timeout (no pod or volume can be on it), with a Warning, and the
/// next one is launched; once the cause is fixed the database runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_never_joins_is_replaced_even_with_failover_off() {
    let env = CloudEnv::start(settings()).await;
    env.cloud.ec2.set_never_joins(super::AMI, true);
    env.create("db1", |q| q.spec.failover.enabled = false).await;
    let q = never_joined(&env).await;
    let first = q
        .status
        .as_ref()
        .and_then(|s| s.instance_id.clone())
        .expect("the first instance");
    env.wait_terminated(&first, "the instance that never joined is terminated")
        .await;
    env.cloud.ec2.set_never_joins(super::AMI, false);
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "Ready on a later instance",
        FAILOVER_TIMEOUT,
        is_ready(),
    )
    .await;
    let status = q.status.expect("status");
    assert_ne!(status.instance_id.as_deref(), Some(first.as_str()));
    assert!(
        status.failover.is_none(),
        "no failover ran: {:?}",
        status.failover
    );
    env.stop().await;
}

/// An outage between every kubelet and the apiserver (a control-plane network fault) silences
/// every Lease at once. With one database its node is the only dedicated one, so counting
/// dedicated nodes alone would fence it: the breaker also counts every node's Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_that_silences_every_kubelet_fences_no_lone_database() {
    let env = CloudEnv::start(settings()).await;
    let Running { instance, .. } = running_database(&env).await;
    let kubelets = env.cp.kubelets().clone();
    let names = kubelets.names();
    assert!(
        names.len() >= 4,
        "workers and the dedicated node: {names:?}"
    );
    for name in &names {
        kubelets.get(name).expect("kubelet").partition();
    }
    let status = held_back_by_the_breaker(&env).await;
    assert_eq!(status.failover, None, "no failover started");
    assert_eq!(status.instance_id.as_deref(), Some(instance.as_str()));
    assert_eq!(env.cloud.ec2.call_count("StopInstances"), 0);
    for name in &names {
        kubelets.get(name).expect("kubelet").heal();
    }
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    assert_eq!(
        q.status.and_then(|s| s.instance_id).as_deref(),
        Some(instance.as_str())
    );
    env.stop().await;
}

/// Pausing waits for the database pod to stop before the node goes; a silent kubelet never
/// stops it, so without a fence the pause would wait forever with the instance running. Past
/// the failover threshold the node is fenced (stopped, then tainted out-of-service) and the
/// release completes; the instance is terminated only after it was stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_database_whose_node_died_fences_the_node_instead_of_waiting_forever() {
    let (env, uid) = database_on_a_dead_node().await;
    pause_until_released(&env, FAILOVER_TIMEOUT).await;
    assert_fenced_and_released(env, &uid).await;
}

/// The same for a deletion: its finalizer waits for the node's release, which waits for the
/// pod; with the node fenced the QuestDB goes, and so does its instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_database_whose_node_died_fences_the_node_and_the_finalizer_goes() {
    let (env, uid) = database_on_a_dead_node().await;
    env.qdbs()
        .delete("db1", &Default::default())
        .await
        .expect("delete");
    let qdbs = env.qdbs();
    wait_until("QuestDB gone", || {
        let qdbs = qdbs.clone();
        async move { qdbs.get_opt("db1").await.is_ok_and(|q| q.is_none()) }
    })
    .await;
    assert_fenced_and_released(env, &uid).await;
}

/// The failover the sandbox stranded: the first node loses power, and its replacement is cut
/// off as soon as it registers. The replacement is fenced in turn once the first node has let
/// the volume go, and the database reaches a third node on the same volume; the volume is
/// never attached elsewhere while either fenced instance could still write, and both are
/// terminated at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_cut_off_mid_failover_is_fenced_in_turn_and_the_database_reaches_a_third_node(
) {
    let env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: first,
        node: first_node,
        pvc_uid,
    } = running_database(&env).await;
    let stop = CancellationToken::new();
    let first_watch = two_writer_watch(&env, first_node.clone(), first.clone(), stop.clone());
    env.cp.node(&first_node).expect("kubelet").power_off();
    let replaced = first.clone();
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "a replacement launched",
        FAILOVER_TIMEOUT,
        move |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                s.failover.is_some() && s.instance_id.as_deref().is_some_and(|i| i != replaced)
            })
        },
    )
    .await;
    let second = q.status.and_then(|s| s.instance_id).expect("replacement");
    let second_node = node_name_for(&second);
    wait_until("the replacement's kubelet registered", || {
        let up = env.cp.node(&second_node).is_some();
        async move { up }
    })
    .await;
    let second_watch = two_writer_watch(&env, second_node.clone(), second.clone(), stop.clone());
    env.cp.node(&second_node).expect("kubelet").partition();
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "the failover finished on its second replacement",
        FAILOVER_TIMEOUT * 2,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref())
                .and_then(|s| s.failover.as_ref())
                .is_some_and(|f| {
                    f.attempt() == 2 && f.phase == questdb_operator::api::FailoverPhase::Healthy
                })
        },
    )
    .await;
    let status = q.status.expect("status");
    let third = status.instance_id.clone().expect("third instance");
    assert!(third != first && third != second, "{third}");
    let record = status.failover.expect("record");
    assert_eq!(record.fenced_instance_ids, vec![first.clone()]);
    assert_eq!(record.old_instance_id.as_deref(), Some(second.as_str()));
    assert_eq!(record.new_instance_id.as_deref(), Some(third.as_str()));
    env.assert_runs_on(&third, &pvc_uid).await;
    env.wait_terminated(&first, "the first fenced instance terminated")
        .await;
    env.wait_terminated(&second, "the fenced replacement terminated")
        .await;
    stop.cancel();
    for watch in [first_watch, second_watch] {
        let v = watch.lock().unwrap().clone();
        assert!(v.is_empty(), "two writers possible: {v:?}");
    }
    assert_eq!(env.live_instances_of(&uid), vec![third]);
    env.stop().await;
}

/// A move to an image EC2 does not know aborts and leaves the database where it runs, with
/// that image still in the spec. When its node later dies, the replacement is launched with
/// the image the database last ran on, not the refused one: launched from the spec, no
/// replacement could ever start and the database would stay down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_aborted_move_a_dead_node_is_replaced_with_the_image_that_last_worked() {
    let env = CloudEnv::start(settings()).await;
    let Running {
        instance: old_id,
        node: old_node,
        pvc_uid,
        ..
    } = running_database(&env).await;
    let worked = env
        .cloud
        .ec2
        .instances()
        .into_iter()
        .find(|i| i.id == old_id)
        .expect("instance")
        .image;
    env.qdbs()
        .patch(
            "db1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"node": {"image": "ami-00000000000000bad"}}}),
            ),
        )
        .await
        .expect("image edit");
    wait_for(
        &env.qdbs(),
        "db1",
        "the move to an unknown image aborted",
        crate::harness::has_condition("NodeMove", "InvalidNode"),
    )
    .await;
    env.cp.node(&old_node).expect("kubelet").power_off();
    assert_moved(&env, &old_id, &pvc_uid).await;
    let q = env.qdbs().get("db1").await.expect("db1");
    let new_id = q.status.and_then(|s| s.instance_id).expect("instance");
    let replacement = env
        .cloud
        .ec2
        .instances()
        .into_iter()
        .find(|i| i.id == new_id)
        .expect("replacement");
    assert_eq!(replacement.image, worked, "the image that last worked");
    env.stop().await;
}

/// The breaker the sandbox poisoned: a worker powered off minutes before a dedicated node died
/// was counted with it as an outage (two of four nodes silent), and the database stayed down for
/// as long as the worker did. Silences that did not begin together are not one outage: the
/// dead dedicated node is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_dead_for_minutes_does_not_hold_back_the_failover_of_a_later_lone_death() {
    let env = CloudEnv::start(settings()).await;
    let Running {
        instance,
        node,
        pvc_uid,
        ..
    } = running_database(&env).await;
    env.cp.node("worker-a2").expect("worker").power_off();
    // Dead for three Lease durations: no outage silences its nodes that far apart.
    lease_silent_for(&env, "worker-a2", 3).await;
    env.cp.node(&node).expect("kubelet").power_off();
    assert_moved(&env, &instance, &pvc_uid).await;
    env.stop().await;
}

/// `db1`'s node cut off with every stop hanging until it is forced again, so the failover sits
/// in `Fencing`; returns once it does, with the uid and the fenced instance.
async fn failover_held_in_fencing() -> (CloudEnv, String, String) {
    let env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance,
        node,
        ..
    } = running_database(&env).await;
    env.cloud.ec2.set_hang_stops(true);
    env.cp.node(&node).expect("kubelet").partition();
    wait_for_within(
        &env.qdbs(),
        "db1",
        "failover fencing, its stop sent",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref())
                .and_then(|s| s.failover.as_ref())
                .is_some_and(|f| {
                    f.phase == questdb_operator::api::FailoverPhase::Fencing
                        && f.fence_stop.is_some()
                })
        },
    )
    .await;
    (env, uid, instance)
}

/// A pause that lands while a failover is still stopping a partitioned node used to end the
/// failover's steps there: the old instance was never stopped and kept serving, and the pause
/// waited for ever on a pod its kubelet could not stop. The fence finishes first, then the
/// failover ends, every instance it fenced is terminated, and the pause releases the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_during_fencing_finishes_the_fence_and_releases_everything() {
    let (env, uid, old) = failover_held_in_fencing().await;
    pause_until_released(&env, FAILOVER_TIMEOUT).await;
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "the failover ended by the pause",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| q.and_then(failover_phase).as_deref() == Some("Healthy"),
    )
    .await;
    let record = q.status.and_then(|s| s.failover).expect("record");
    assert!(
        record
            .message
            .as_deref()
            .is_some_and(|m| m.contains("paused")),
        "{record:?}"
    );
    env.wait_terminated(&old, "the fenced instance terminated")
        .await;
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 2,
        "the hung stop was forced again: the fence finished"
    );
    wait_until("nothing of the database left running", || {
        let live = env.live_instances_of(&uid);
        async move { live.is_empty() }
    })
    .await;
    env.stop().await;
}

/// The same for a deletion: its finalizer used to wait for ever; now the fence finishes, and
/// the QuestDB goes with every instance it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_during_fencing_finishes_the_fence_and_the_finalizer_goes() {
    let (env, uid, old) = failover_held_in_fencing().await;
    env.qdbs()
        .delete("db1", &Default::default())
        .await
        .expect("delete");
    let qdbs = env.qdbs();
    wait_until("QuestDB gone", || {
        let qdbs = qdbs.clone();
        async move { qdbs.get_opt("db1").await.is_ok_and(|q| q.is_none()) }
    })
    .await;
    env.wait_terminated(&old, "the fenced instance terminated")
        .await;
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 2,
        "the hung stop was forced again: the fence finished"
    );
    wait_until("nothing of the database left running", || {
        let live = env.live_instances_of(&uid);
        async move { live.is_empty() }
    })
    .await;
    env.stop().await;
}

/// Pauses `db1` and waits until its node is released.
async fn pause_until_released(env: &CloudEnv, timeout: Duration) {
    env.qdbs()
        .patch(
            "db1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"paused": true}})),
        )
        .await
        .expect("pause");
    wait_for_within(
        &env.qdbs(),
        "db1",
        "node released",
        timeout,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref())
                .is_some_and(|s| s.instance_id.is_none())
        },
    )
    .await;
}

/// `db1` running, then its node partitioned (silent kubelet, instance running); with its uid.
async fn database_on_a_dead_node() -> (CloudEnv, String) {
    let env = CloudEnv::start(settings()).await;
    let Running { uid, node, .. } = running_database(&env).await;
    env.cp.node(&node).expect("kubelet").partition();
    (env, uid)
}

/// Removing `spec.node` moves the database to a shared node once the dedicated one lets the
/// pod go; a dead one never would. It is fenced like a failover fences, and the database runs
/// on a shared node with its volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_node_of_a_database_whose_node_died_fences_it_and_runs_the_database_elsewhere()
{
    let (env, uid) = database_on_a_dead_node().await;
    env.qdbs()
        .patch(
            "db1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"node": null, "dns": null}})),
        )
        .await
        .expect("spec.node removed");
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "Ready on a shared node, the dedicated one released",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| {
            use kube::runtime::wait::Condition as _;
            is_ready().matches_object(q)
                && q.and_then(|q| q.status.as_ref())
                    .is_some_and(|s| s.instance_id.is_none())
        },
    )
    .await;
    assert!(q.spec.node.is_none());
    assert_fenced_and_released(env, &uid).await;
}

async fn assert_fenced_and_released(env: CloudEnv, uid: &str) {
    assert!(env.live_instances_of(uid).is_empty());
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 1,
        "fenced first"
    );
    env.stop().await;
}

/// Three of five dedicated nodes silent at once is a partition or an outage, not three dead
/// nodes: fencing them would turn a network blip into three outages. Nothing is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_silent_nodes_trip_the_breaker_and_nothing_is_fenced() {
    let env = CloudEnv::start(settings()).await;
    let names = ["db1", "db2", "db3", "db4", "db5"];
    for name in names {
        env.create(name, |q| q.spec.failover.unhealthy_after_seconds = 10)
            .await;
    }
    let mut nodes = Vec::new();
    for name in names {
        let q = wait_for(&env.qdbs(), name, "QuestDB Ready", is_ready()).await;
        let id = q.status.and_then(|s| s.instance_id).expect("instance");
        nodes.push(node_name_for(&id));
    }
    for node in &nodes[..3] {
        env.cp.node(node).expect("kubelet").partition();
    }
    held_back_by_the_breaker(&env).await;
    assert_eq!(env.cloud.ec2.call_count("StopInstances"), 0);
    assert_eq!(env.cloud.ec2.call_count("TerminateInstances"), 0);
    for name in names {
        let q = env.qdbs().get(name).await.expect("qdb");
        assert_eq!(
            q.status.and_then(|s| s.failover),
            None,
            "{name}: no failover started"
        );
    }
    env.stop().await;
}

/// Waits until `db1`'s failover is held back by the breaker; its status then.
async fn held_back_by_the_breaker(env: &CloudEnv) -> questdb_operator::api::QuestDBStatus {
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "failover held back",
        FAILOVER_TIMEOUT,
        crate::harness::has_condition("Failover", "FailoverSuppressed"),
    )
    .await;
    let message = crate::harness::condition_message(&q, "Failover");
    let status = q.status.expect("status");
    assert!(message.contains("TooManyUnhealthyNodes"), "{message}");
    status
}

/// A crash at any step resumes where it was: the manager is killed (its future dropped
/// wherever it is) each time the failover enters a new step, and restarted. The end is still
/// exactly one live instance, one attachment and one pod, on the same volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_manager_at_every_failover_step_still_ends_with_one_of_everything() {
    let mut env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        node: old_node,
        pvc_uid,
    } = running_database(&env).await;
    env.cp.node(&old_node).expect("kubelet").partition();

    let killed = env
        .kill_at_every_step(failover_phase, "Healthy", &[], FAILOVER_TIMEOUT)
        .await;
    assert_killed_at(&killed, FAILOVER_STEPS);
    assert_one_of_everything(&env, &uid, &old_id, &pvc_uid).await;
    env.stop().await;
}

/// Every step a failover records on its way to `Healthy`.
const FAILOVER_STEPS: &[&str] = &[
    "Fencing",
    "Releasing",
    "Reattaching",
    "Recovering",
    "Draining",
];

/// The manager was killed right after recording each of `steps` (kill-at-every-step kills at
/// every step the machine records: a step missing here was never recorded, or skipped).
fn assert_killed_at(killed: &std::collections::BTreeSet<String>, steps: &[&str]) {
    let missing: Vec<&&str> = steps.iter().filter(|s| !killed.contains(**s)).collect();
    assert!(
        missing.is_empty(),
        "never killed at {missing:?}; killed at {killed:?}"
    );
}

/// The same, killed in the middle of each step: after the step's side effects and before the
/// record of the next one (the stop sent, the out-of-service taint set, the pod placed on the
/// new node, the pod running but not yet verified): the record of each new step is held before
/// the apiserver sees it and dropped, and the manager killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_manager_in_the_middle_of_every_failover_step_still_ends_with_one_of_everything(
) {
    let mut env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        node: old_node,
        pvc_uid,
    } = running_database(&env).await;
    env.cp.node(&old_node).expect("kubelet").partition();

    let killed = env
        .kill_before_every_step(failover_phase, "Healthy", FAILOVER_TIMEOUT)
        .await;
    assert_killed_at(&killed, FAILOVER_STEPS);
    assert_one_of_everything(&env, &uid, &old_id, &pvc_uid).await;
    env.stop().await;
}

/// The end of a failover that survived kills: moved, one live instance, one attachment, one
/// pod.
async fn assert_one_of_everything(env: &CloudEnv, uid: &str, old_id: &str, pvc_uid: &str) {
    assert_moved(env, old_id, pvc_uid).await;
    let live = env.live_instances_of(uid);
    assert_eq!(live.len(), 1, "one live instance: {live:?}");
    let pv = Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), NS)
        .get("db1-data")
        .await
        .expect("pvc")
        .spec
        .and_then(|s| s.volume_name)
        .expect("bound");
    let attachments: Vec<String> = Api::<VolumeAttachment>::all(env.client.clone())
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str()))
        .map(|va| va.spec.node_name)
        .collect();
    assert_eq!(attachments, vec![node_name_for(&live[0])], "one attachment");
    let pods = Api::<Pod>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("pods")
        .items;
    assert_eq!(pods.len(), 1, "one pod");
}

/// A failover goes first: a node-image move that has not stopped the database yet is aborted
/// (its new instance terminated), and the failover brings the database back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_during_a_node_move_pre_empts_the_move() {
    let env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        node: old_node,
        pvc_uid,
    } = running_database(&env).await;
    // A move that stays in Provisioning a while: new instances take 40 s to boot. The
    // failover's replacement boots from the image the database last ran on (the move's target
    // is untried), and the move starts again once the database runs there.
    env.cloud
        .ec2
        .set_pending_to_running(Duration::from_secs(40));
    env.qdbs()
        .patch(
            "db1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                // No rollback window: the move completes once the database runs there.
                serde_json::json!({"spec": {"node": {"image": "ami-0fedcba9876543210", "rollbackWindow": "0s"}}}),
            ),
        )
        .await
        .expect("patch image");
    wait_for(&env.qdbs(), "db1", "move started", |q: Option<&QuestDB>| {
        q.and_then(|q| {
            q.status
                .as_ref()?
                .node_move
                .as_ref()
                .map(|u| u.phase.to_string())
        })
        .as_deref()
            == Some("Provisioning")
    })
    .await;
    env.cp.node(&old_node).expect("kubelet").partition();
    wait_for_within(
        &env.qdbs(),
        "db1",
        "the move pre-empted by the failover",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()?.node_move.clone())
                .is_some_and(|u| {
                    u.phase == "Aborted"
                        && u.reason.map(|r| r.to_string()).as_deref() == Some("Preempted")
                })
        },
    )
    .await;
    assert_moved(&env, &old_id, &pvc_uid).await;
    let record = env
        .qdbs()
        .get("db1")
        .await
        .expect("db1")
        .status
        .and_then(|s| s.failover)
        .expect("failover record");
    let replacement = record.new_instance_id.expect("replacement");
    let image_of = |id: &str| {
        env.cloud
            .ec2
            .instances()
            .into_iter()
            .find(|i| i.id == id)
            .map(|i| i.image)
    };
    assert_eq!(
        image_of(&replacement),
        image_of(&old_id),
        "the replacement runs the image that worked, not the move's untried target"
    );
    // The move starts again from the database running on its replacement, and ends on the
    // image the spec asks for (its new node boots at the usual pace now: the slow boot was to
    // keep the first move in Provisioning).
    env.cloud
        .ec2
        .set_pending_to_running(Duration::from_millis(100));
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "the move started again and completed",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()?.node_move.clone())
                .is_some_and(|u| {
                    u.phase == "Completed" && u.to_image.as_deref() == Some("ami-0fedcba9876543210")
                })
        },
    )
    .await;
    let now_on = q.status.and_then(|s| s.instance_id).expect("instance");
    assert_eq!(image_of(&now_on).as_deref(), Some("ami-0fedcba9876543210"));
    wait_until("one instance left: the move's", || {
        let live = env.live_instances_of(&uid);
        let want = vec![now_on.clone()];
        async move { live == want }
    })
    .await;
    env.stop().await;
}

/// Benchmark, not a test (`--ignored`): the operator-added latency from a node crossing its
/// threshold to the fencing call, and each step's share of the downtime, over three power-off
/// failovers of three databases (five dedicated nodes, so the breaker lets one through at a
/// time) on this control plane. Prints figures; asserts only that each failover finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: QDB_TESTENV_TIMINGS=kubelet cargo test --test integration -- --ignored --nocapture failover_benchmark"]
async fn failover_benchmark_detection_latency_and_step_shares() {
    use questdb_operator::cloud::Ec2Api;
    let env = CloudEnv::start(settings()).await;
    let names: Vec<String> = (1..=5).map(|i| format!("bench{i}")).collect();
    for name in &names {
        env.create(name, |q| q.spec.failover.unhealthy_after_seconds = 10)
            .await;
    }
    eprintln!(
        "failover benchmark: node timings {} (Lease {} s; QDB_TESTENV_TIMINGS=kubelet for a real kubelet's), threshold {} s",
        if questdb_testenv::timings::real_node_timings() { "of a real kubelet" } else { "shortened" },
        questdb_testenv::timings::node_lease_duration().as_secs(),
        questdb_testenv::timings::node_lease_duration().as_secs().max(10),
    );
    let kinds = ["partition", "power-off", "terminated"];
    let mut downtimes = Vec::new();
    for (name, kind) in names.iter().zip(kinds) {
        let q = wait_for(&env.qdbs(), name, "QuestDB Ready", is_ready()).await;
        let id = q.status.and_then(|s| s.instance_id).expect("instance");
        let kubelet = env.cp.node(&node_name_for(&id)).expect("kubelet");
        let cut = std::time::Instant::now();
        match kind {
            "partition" => kubelet.partition(),
            // A hardware failure: EC2 keeps the instance running.
            "power-off" => kubelet.power_off(),
            _ => env
                .cloud
                .ec2
                .terminate_instances(std::slice::from_ref(&id))
                .await
                .expect("terminate"),
        }
        let q = wait_for_within(
            &env.qdbs(),
            name,
            "failover finished",
            FAILOVER_TIMEOUT,
            |q: Option<&QuestDB>| q.and_then(failover_phase).as_deref() == Some("Healthy"),
        )
        .await;
        let f = q.status.and_then(|s| s.failover).expect("record");
        let started = f.started_at.as_ref().map(|t| t.0);
        eprintln!(
            "failover benchmark: {kind:<10} reason {:<18} fault -> failover start ~{:>5.1} s, downtime {:?} s, fault -> Healthy {:>5.1} s",
            f.reason.map(|r| r.to_string()).unwrap_or_default(),
            started
                .map(|t| {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    cut.elapsed().as_secs_f64() - now.duration_since(t).as_secs_f64()
                })
                .unwrap_or(f64::NAN),
            f.downtime_seconds,
            cut.elapsed().as_secs_f64(),
        );
        downtimes.extend(f.downtime_seconds);
    }
    let text = env.handle.metrics.render();
    let value = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let detection = value("questdb_operator_failover_detection_latency_seconds_sum")
        / value("questdb_operator_failover_detection_latency_seconds_count").max(1.0);
    eprintln!(
        "failover benchmark: {} failovers, downtime (s, whole seconds) {downtimes:?}",
        downtimes.len()
    );
    eprintln!("failover benchmark: threshold crossed -> fencing call: mean {detection:.3} s (goal <= 1 s)");
    let steps = ["Fencing", "Releasing", "Reattaching", "Recovering"];
    let sums: Vec<f64> = steps
        .iter()
        .map(|s| {
            value(&format!(
                "questdb_operator_failover_step_duration_seconds_sum{{step=\"{s}\"}}"
            ))
        })
        .collect();
    let total: f64 = sums.iter().sum();
    for (step, sum) in steps.iter().zip(&sums) {
        eprintln!(
            "failover benchmark: {step:<12} mean {:>6.2} s  share {:>5.1} %",
            sum / downtimes.len().max(1) as f64,
            100.0 * sum / total.max(f64::EPSILON)
        );
    }
    env.stop().await;
}

const NEW_AMI: &str = "ami-0fedcba9876543210";

fn node_move_of(q: Option<&QuestDB>) -> Option<questdb_operator::api::NodeMoveStatus> {
    q?.status.as_ref()?.node_move.clone()
}

/// Starts a node-image move of `db1` and holds its new node NotReady (as a joining node whose
/// runtime is not up yet) until the move waits for it in `NodeReady`: the test then decides
/// what happens at the switch. Returns the new instance and its kubelet.
async fn move_held_before_the_switch(env: &CloudEnv) -> (String, questdb_testenv::NodeHandle) {
    env.qdbs()
        .patch(
            "db1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"node": {"image": NEW_AMI}}})),
        )
        .await
        .expect("patch image");
    let q = wait_for(
        &env.qdbs(),
        "db1",
        "new instance launched",
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.new_instance_id.is_some()),
    )
    .await;
    let new_id = node_move_of(Some(&q))
        .and_then(|u| u.new_instance_id)
        .expect("new instance");
    let name = node_name_for(&new_id);
    // A joined node is NotReady for its first 1.5 s: the fault lands before it says Ready.
    wait_until("the new node's kubelet starts", || {
        let found = env.cp.node(&name).is_some();
        async move { found }
    })
    .await;
    let kubelet = env.cp.node(&name).expect("kubelet");
    kubelet.set_fault(questdb_testenv::NodeFault::NotReady);
    wait_for(
        &env.qdbs(),
        "db1",
        "move waits for the new node",
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "NodeReady"),
    )
    .await;
    (new_id, kubelet)
}

/// Lets the held new node of a move go Ready, and waits until its Node says so.
async fn heal_until_ready(env: &CloudEnv, kubelet: &questdb_testenv::NodeHandle, id: &str) {
    kubelet.heal();
    wait_for(
        &Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone()),
        &node_name_for(id),
        "new node Ready",
        |n: Option<&k8s_openapi::api::core::v1::Node>| {
            n.and_then(|n| n.status.as_ref()?.conditions.clone())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        },
    )
    .await;
}

/// The old node dying just as a node move stops the database on it would hold the move in
/// Stopping until its timeout (the silent kubelet never confirms the pod's end) and then send
/// the database back to the dead node: the move fences the old node (stop, then out-of-service)
/// and completes on the new one, with the volume never attached there while the old instance
/// could still write, and the dead node released, not retained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_node_that_dies_at_the_switch_of_a_move_is_fenced_and_the_move_completes() {
    let env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        node: old_node,
        pvc_uid,
    } = running_database(&env).await;
    let (new_id, new_kubelet) = move_held_before_the_switch(&env).await;
    let stop = CancellationToken::new();
    let violations = two_writer_watch(&env, old_node.clone(), old_id.clone(), stop.clone());
    env.cp.node(&old_node).expect("old kubelet").partition();
    new_kubelet.heal();
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "move completed, the dead old node released",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "Completed"),
    )
    .await;
    stop.cancel();
    let status = q.status.expect("status");
    assert_eq!(status.instance_id.as_deref(), Some(new_id.as_str()));
    assert_eq!(status.failover, None, "no failover: the move handled it");
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 1,
        "the old node was fenced by a stop"
    );
    let v = violations.lock().unwrap().clone();
    assert!(v.is_empty(), "two writers possible: {v:?}");
    env.wait_terminated(&old_id, "the dead old node is terminated")
        .await;
    env.assert_runs_on(&new_id, &pvc_uid).await;
    assert_eq!(env.live_instances_of(&uid), vec![new_id], "one instance");
    env.stop().await;
}

/// The new node dying right after a move switched to it would leave the database on a dead
/// node, and a failover started then would resume the move's record with stale instance ids
/// (a second outage, a leaked instance): the move returns the database to its old node, which
/// still runs, fencing the dead one first, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_that_dies_after_the_switch_sends_the_database_back_to_its_old_node() {
    let env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        node: old_node,
        pvc_uid,
    } = running_database(&env).await;
    let (new_id, new_kubelet) = move_held_before_the_switch(&env).await;
    let new_node = node_name_for(&new_id);
    heal_until_ready(&env, &new_kubelet, &new_id).await;
    // Silent from now on, but Ready for the node-lifecycle controller's grace: the move
    // switches to it.
    new_kubelet.partition();
    let stop = CancellationToken::new();
    let violations = two_writer_watch(&env, new_node.clone(), new_id.clone(), stop.clone());
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "move rolled back",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "RolledBack"),
    )
    .await;
    stop.cancel();
    let status = q.status.expect("status");
    let upgrade = status.node_move.clone().expect("record");
    assert_eq!(
        upgrade.reason.map(|r| r.to_string()).as_deref(),
        Some("TargetNodeFailed"),
        "{upgrade:?}"
    );
    assert!(
        upgrade.stopped_at.is_some(),
        "the move had switched: {upgrade:?}"
    );
    assert_eq!(status.instance_id.as_deref(), Some(old_id.as_str()));
    assert_eq!(status.failover, None, "no failover: the move handled it");
    let v = violations.lock().unwrap().clone();
    assert!(v.is_empty(), "two writers possible: {v:?}");
    env.wait_terminated(&new_id, "the dead new node is terminated")
        .await;
    env.assert_runs_on(&old_id, &pvc_uid).await;
    assert_eq!(env.live_instances_of(&uid), vec![old_id], "one instance");
    assert_eq!(
        env.cloud.ec2.call_count("RunInstances"),
        2,
        "no launch beyond the move's"
    );
    let _ = old_node;
    env.stop().await;
}

/// An instance terminated by someone else (a person, a script, a spot reclaim): the cloud
/// controller deletes its Node once NotReady, before any Lease threshold a real kubelet allows,
/// and a deleted Node cannot take the out-of-service taint, so the volume would wait for the
/// attach-detach controller's 6-minute force detach while a replacement was launched outside
/// the failover (no breaker, no event, no metrics). EC2's word is proof enough: the failover
/// starts as soon as the silence is news, taints the Node while it exists, and the database
/// answers again well within those 6 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_terminated_by_someone_else_is_failed_over_before_its_node_is_deleted() {
    use questdb_operator::cloud::Ec2Api;
    let env = CloudEnv::start(settings()).await;
    // A threshold past the node-lifecycle controller's grace (12 s here, 40 s on EKS): the
    // Node is NotReady, then deleted, before Lease silence alone would act.
    env.create("db1", |q| q.spec.failover.unhealthy_after_seconds = 30)
        .await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let old_id = q
        .status
        .as_ref()
        .and_then(|s| s.instance_id.clone())
        .expect("instance");
    let pvc_uid = Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), NS)
        .get("db1-data")
        .await
        .expect("pvc")
        .uid()
        .expect("uid");
    env.cloud
        .ec2
        .terminate_instances(std::slice::from_ref(&old_id))
        .await
        .expect("terminate");
    // Well under 6 minutes: a volume left to the force detach would miss this.
    assert_moved_within(&env, &old_id, &pvc_uid, Duration::from_secs(150)).await;
    let q = env.qdbs().get("db1").await.expect("db1");
    let failover = q.status.and_then(|s| s.failover).expect("failover record");
    assert_eq!(
        failover.reason.map(|r| r.to_string()).as_deref(),
        Some("InstanceTerminated")
    );
    let metrics = env.handle.metrics.render();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("questdb_operator_failovers_total{result=\"succeeded\"} 1")),
        "counted as a failover"
    );
    env.stop().await;
}

/// A crash at any step of a move whose old node dies at the switch resumes where it was: the
/// manager is killed each time the move enters a new step and restarted; the old node is still
/// fenced before the volume moves, the move completes on the new node, and nothing is left on
/// the dead one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_manager_at_every_step_of_a_move_whose_old_node_dies_completes_on_the_new_node()
{
    let mut env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        node: old_node,
        pvc_uid,
    } = running_database(&env).await;
    let (new_id, new_kubelet) = move_held_before_the_switch(&env).await;
    let stop = CancellationToken::new();
    let violations = two_writer_watch(&env, old_node.clone(), old_id.clone(), stop.clone());
    env.cp.node(&old_node).expect("old kubelet").partition();
    new_kubelet.heal();
    let killed = env
        .kill_at_every_step(
            move_step,
            "Completed",
            &["Aborted", "RolledBack", "RolledBack (back)"],
            FAILOVER_TIMEOUT,
        )
        .await;
    stop.cancel();
    assert_killed_at(
        &killed,
        &["NodeReady", "Stopping", "Moving", "Verifying", "Retaining"],
    );
    let v = violations.lock().unwrap().clone();
    assert!(v.is_empty(), "two writers possible: {v:?}");
    env.wait_terminated(&old_id, "the dead old node is terminated")
        .await;
    env.assert_runs_on(&new_id, &pvc_uid).await;
    assert_eq!(env.live_instances_of(&uid), vec![new_id], "one instance");
    env.stop().await;
}

/// A crash at any step of the failover of an instance terminated by someone else (the pod on
/// its doomed Node deleted without a grace period, the out-of-service taint raced against the
/// cloud controller's Node deletion) still ends with one of everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_manager_at_every_step_of_a_terminated_instances_failover_still_ends_with_one_of_everything(
) {
    use questdb_operator::cloud::Ec2Api;
    let mut env = CloudEnv::start(settings()).await;
    env.create("db1", |q| q.spec.failover.unhealthy_after_seconds = 30)
        .await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let uid = q.uid().expect("uid");
    let old_id = q
        .status
        .as_ref()
        .and_then(|s| s.instance_id.clone())
        .expect("instance");
    let pvc_uid = Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), NS)
        .get("db1-data")
        .await
        .expect("pvc")
        .uid()
        .expect("uid");
    env.cloud
        .ec2
        .terminate_instances(std::slice::from_ref(&old_id))
        .await
        .expect("terminate");
    let killed = env
        .kill_at_every_step(failover_phase, "Healthy", &[], FAILOVER_TIMEOUT)
        .await;
    assert_killed_at(&killed, FAILOVER_STEPS);
    assert_one_of_everything(&env, &uid, &old_id, &pvc_uid).await;
    let q = env.qdbs().get("db1").await.expect("db1");
    let failover = q.status.and_then(|s| s.failover).expect("failover record");
    assert_eq!(
        failover.reason.map(|r| r.to_string()).as_deref(),
        Some("InstanceTerminated")
    );
    env.stop().await;
}

/// Both nodes of a move going silent at the switch look like a partition, not two deaths (the
/// breaker opens at two silent nodes of this small cluster), and the database may still be
/// running on the old one: nothing is fenced or terminated while they are silent; the move
/// goes back once its step times out, and when the nodes answer again the database is back on
/// its old node, on its volume, with one instance left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_nodes_of_a_move_going_silent_fence_nothing_and_the_database_returns_when_they_answer()
{
    let env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        node: old_node,
        pvc_uid,
    } = running_database(&env).await;
    let (new_id, new_kubelet) = move_held_before_the_switch(&env).await;
    heal_until_ready(&env, &new_kubelet, &new_id).await;
    new_kubelet.partition();
    wait_for_within(
        &env.qdbs(),
        "db1",
        "the move switched",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.stopped_at.is_some()),
    )
    .await;
    let old_kubelet = env.cp.node(&old_node).expect("old kubelet");
    old_kubelet.partition();
    wait_for_within(
        &env.qdbs(),
        "db1",
        "the move goes back",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.rolling_back),
    )
    .await;
    assert_eq!(
        env.cloud.ec2.call_count("StopInstances"),
        0,
        "nothing fenced while the breaker holds"
    );
    assert_eq!(env.cloud.ec2.call_count("TerminateInstances"), 0);
    old_kubelet.heal();
    new_kubelet.heal();
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "the move rolled back",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "RolledBack"),
    )
    .await;
    assert_eq!(
        q.status.and_then(|s| s.instance_id).as_deref(),
        Some(old_id.as_str())
    );
    env.assert_runs_on(&old_id, &pvc_uid).await;
    env.wait_terminated(&new_id, "the new node is released")
        .await;
    assert_eq!(env.live_instances_of(&uid), vec![old_id], "one instance");
    env.stop().await;
}

/// The step of a node move, its way back told apart.
fn move_step(q: &QuestDB) -> Option<String> {
    let u = q.status.as_ref()?.node_move.as_ref()?;
    Some(if u.rolling_back {
        format!("{} (back)", u.phase)
    } else {
        u.phase.to_string()
    })
}

/// A crash at any step of a move whose new node dies after the switch resumes where it was:
/// the manager is killed each time the move enters a new step (forward and back) and
/// restarted; the end is the database on its old instance, one live instance, one pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_manager_at_every_step_of_a_move_whose_new_node_dies_ends_on_the_old_node() {
    let mut env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        pvc_uid,
        ..
    } = running_database(&env).await;
    let (new_id, new_kubelet) = move_held_before_the_switch(&env).await;
    heal_until_ready(&env, &new_kubelet, &new_id).await;
    new_kubelet.partition();
    let killed = env
        .kill_at_every_step(
            move_step,
            "RolledBack (back)",
            &["Completed", "Aborted", "Retaining"],
            FAILOVER_TIMEOUT,
        )
        .await;
    assert_killed_at(
        &killed,
        &[
            "Stopping",
            "Moving",
            "Stopping (back)",
            "Moving (back)",
            "Verifying (back)",
        ],
    );
    env.wait_terminated(&new_id, "the dead new node is terminated")
        .await;
    env.assert_runs_on(&old_id, &pvc_uid).await;
    assert_eq!(env.live_instances_of(&uid), vec![old_id], "one instance");
    let pods = Api::<Pod>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("pods")
        .items;
    assert_eq!(pods.len(), 1, "one pod");
    env.stop().await;
}

/// The database's node dies while a finished move keeps the old node for a rollback: the
/// failover replaces the dead node as any failover does (the retained node is no target), the
/// retained node stays until its window ends and is then released, and the dead node is
/// terminated: one database on one instance, nothing left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_while_a_moves_old_node_is_retained_leaves_one_database_and_no_instance_behind()
{
    let env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        pvc_uid,
        ..
    } = running_database(&env).await;
    env.qdbs()
        .patch(
            "db1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"node": {
                "image": NEW_AMI, "rollbackWindow": "45s"
            }}})),
        )
        .await
        .expect("patch image");
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "moved, the old node retained",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "Retaining"),
    )
    .await;
    let moved_to = q.status.and_then(|s| s.instance_id).expect("new instance");
    assert_ne!(moved_to, old_id);
    env.cp
        .node(&node_name_for(&moved_to))
        .expect("kubelet")
        .partition();
    assert_moved(&env, &moved_to, &pvc_uid).await;
    wait_for_within(
        &env.qdbs(),
        "db1",
        "the retained node released at the end of its window",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "Completed"),
    )
    .await;
    env.wait_terminated(&old_id, "the retained old node is terminated")
        .await;
    env.wait_terminated(&moved_to, "the dead node is terminated")
        .await;
    let q = env.qdbs().get("db1").await.expect("db1");
    let now_on = q.status.and_then(|s| s.instance_id).expect("instance");
    assert_eq!(env.live_instances_of(&uid), vec![now_on], "one instance");
    env.stop().await;
}

/// A resolver that cached the old record may send clients to the fenced instance's address for
/// up to the record's TTL: the instance (and with it that private address) is kept until the
/// TTL has passed since DNS named the new node, and only then terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fenced_instance_outlives_the_old_records_ttl_before_it_is_terminated() {
    let env = CloudEnv::start(settings()).await;
    env.create("db1", |q| {
        q.spec.failover.unhealthy_after_seconds = 10;
        q.spec.dns.as_mut().expect("dns").ttl = 30;
    })
    .await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let old = q.status.and_then(|s| s.instance_id).expect("instance");
    env.cp
        .node(&node_name_for(&old))
        .expect("kubelet")
        .partition();
    wait_for_within(
        &env.qdbs(),
        "db1",
        "the database answers on the new node; the old address drains",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| q.and_then(failover_phase).as_deref() == Some("Draining"),
    )
    .await;
    // Two thirds of the TTL from when that was seen (the step began at most a poll earlier).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        let state = env
            .cloud
            .ec2
            .instances()
            .into_iter()
            .find(|i| i.id == old)
            .map(|i| i.state);
        assert!(
            !matches!(
                state,
                Some(InstanceState::ShuttingDown | InstanceState::Terminated)
            ),
            "the fenced instance went before the old record's TTL: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    env.wait_terminated(&old, "terminated once the TTL has passed")
        .await;
    env.stop().await;
}

/// A move still checking its image and instance type (EC2 throttles DescribeImages, as it
/// does each action by its own token bucket) must not hold the database on a dead node: the
/// failover goes first, the move ends pre-empted without a launch, and the database answers
/// on a replacement once EC2 answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_during_a_moves_validation_pre_empts_the_move() {
    let env = CloudEnv::start(settings()).await;
    let Running {
        uid,
        instance: old_id,
        node: old_node,
        pvc_uid,
    } = running_database(&env).await;
    env.cloud.ec2.set_throttled("DescribeImages", true);
    env.qdbs()
        .patch(
            "db1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"node": {"image": NEW_AMI}}})),
        )
        .await
        .expect("patch image");
    wait_for(
        &env.qdbs(),
        "db1",
        "move validating",
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "Validating"),
    )
    .await;
    let validating_calls = env.cloud.ec2.call_count("DescribeImages");
    wait_until("the validation was refused by EC2", || {
        let n = env.cloud.ec2.call_count("DescribeImages");
        async move { n > validating_calls }
    })
    .await;
    env.cp.node(&old_node).expect("kubelet").partition();
    let record = failover_started(&env).await;
    assert_eq!(record.old_instance_id.as_deref(), Some(old_id.as_str()));
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "the move pre-empted",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "Aborted"),
    )
    .await;
    let upgrade = node_move_of(Some(&q)).expect("move record");
    assert_eq!(
        upgrade.reason.map(|r| r.to_string()).as_deref(),
        Some("Preempted"),
        "{upgrade:?}"
    );
    assert_eq!(upgrade.new_instance_id, None, "the move launched nothing");
    // The replacement's launch reads the image too: EC2 answers again.
    env.cloud.ec2.set_throttled("DescribeImages", false);
    assert_moved(&env, &old_id, &pvc_uid).await;
    let live = env.live_instances_of(&uid);
    assert_eq!(live.len(), 1, "one instance: {live:?}");
    env.stop().await;
}

/// Both nodes of a move dead after the switch, in a cluster large enough that two silent
/// nodes are deaths and not an outage (the breaker stays closed): waiting for either would be
/// an outage for good. Nothing of the database is left on the old node, so its instance goes,
/// the move ends (`NodesFailed`), and a failover replaces the new node: the database answers
/// on a third instance, on its volume, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_nodes_of_a_move_dying_after_the_switch_hand_the_database_to_a_failover() {
    // Ten kubelets in all with the move's two: two silent ones are not more than a fifth.
    let env = with_more_workers(5).await;
    let Running {
        uid,
        instance: old_id,
        node: old_node,
        pvc_uid,
    } = running_database(&env).await;
    let (new_id, new_kubelet) = move_held_before_the_switch(&env).await;
    heal_until_ready(&env, &new_kubelet, &new_id).await;
    wait_for_within(
        &env.qdbs(),
        "db1",
        "the move switched",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.stopped_at.is_some()),
    )
    .await;
    // Alive but not starting pods: the database does not answer on the new node yet.
    new_kubelet.set_fault(questdb_testenv::NodeFault::NotReady);
    let vas = Api::<VolumeAttachment>::all(env.client.clone());
    let pods = Api::<Pod>::namespaced(env.client.clone(), NS);
    wait_until("the old node holds nothing of the database", || {
        let (vas, pods, old_node) = (vas.clone(), pods.clone(), old_node.clone());
        async move {
            let attached = vas
                .list(&Default::default())
                .await
                .is_ok_and(|l| l.items.iter().any(|va| va.spec.node_name == old_node));
            let bound = pods.list(&Default::default()).await.is_ok_and(|l| {
                l.items.iter().any(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&old_node)
                })
            });
            !attached && !bound
        }
    })
    .await;
    // The old node dies first, so the new one's death finds nothing to go back to.
    let old_kubelet = env.cp.node(&old_node).expect("old kubelet");
    old_kubelet.partition();
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        env.client.clone(),
        "kube-node-lease",
    );
    let threshold_ms = questdb_testenv::timings::node_lease_duration().as_millis() as i64;
    wait_until("the old node's Lease is silent past the threshold", || {
        let (leases, old_node) = (leases.clone(), old_node.clone());
        async move {
            leases.get(&old_node).await.is_ok_and(|l| {
                l.spec.and_then(|s| s.renew_time).is_some_and(|t| {
                    k8s_openapi::jiff::Timestamp::now().as_millisecond() - t.0.as_millisecond()
                        > threshold_ms
                })
            })
        }
    })
    .await;
    new_kubelet.partition();
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "the move handed over",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "Aborted"),
    )
    .await;
    let upgrade = node_move_of(Some(&q)).expect("move record");
    assert_eq!(
        upgrade.reason.map(|r| r.to_string()).as_deref(),
        Some("NodesFailed"),
        "{upgrade:?}"
    );
    env.wait_terminated(&old_id, "the dead old node is terminated")
        .await;
    assert_moved(&env, &new_id, &pvc_uid).await;
    env.wait_terminated(&new_id, "the dead new node is terminated")
        .await;
    let q = env.qdbs().get("db1").await.expect("db1");
    let now_on = q.status.and_then(|s| s.instance_id).expect("instance");
    assert!(now_on != old_id && now_on != new_id, "a third instance");
    assert_eq!(env.live_instances_of(&uid), vec![now_on], "one instance");
    env.stop().await;
}

/// A pause of a database whose node died fences the node; if that stop hangs in `stopping`
/// (as EC2 stops can), the release would wait as long as EC2 likes with the paused
/// database's node still billed: the stop is forced again, and the release completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_whose_fence_stop_hangs_forces_the_stop_again_and_the_node_goes() {
    let (env, uid) = database_on_a_dead_node().await;
    env.cloud.ec2.set_hang_stops(true);
    // The forced stop is sent again a minute after the first.
    pause_until_released(&env, FAILOVER_TIMEOUT + Duration::from_secs(90)).await;
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 2,
        "the hung stop was sent again"
    );
    assert_fenced_and_released(env, &uid).await;
}

/// The breaker under a real kubelet's timings (chosen for its own process: a 40 s Lease
/// renewed every 10 s, the schema's minimum threshold of 40 s), which the shortened timings of
/// the other tests only scale down. Healthy kubelets are silent up to 10 s between renewals:
/// were they counted as suspects, one dead node among five would be held back and never
/// replaced. Nodes that die together are never in step: two deaths one renewal apart must
/// still trip the breaker before the first one's threshold, or both would be fenced in a
/// partition. Ten kubelets in all, so two silent ones are not the cluster-wide outage rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubelet_timings_one_death_is_replaced_and_two_staggered_deaths_trip_the_breaker() {
    use questdb_testenv::timings;
    timings::choose_real_node_timings();
    let env = with_more_workers(2).await;
    let names = ["db1", "db2", "db3", "db4", "db5"];
    for name in names {
        env.create(name, |q| q.spec.failover.unhealthy_after_seconds = 40)
            .await;
    }
    let mut ids = Vec::new();
    for name in names {
        let q = wait_for_within(
            &env.qdbs(),
            name,
            "QuestDB Ready",
            FAILOVER_TIMEOUT,
            is_ready(),
        )
        .await;
        ids.push(q.status.and_then(|s| s.instance_id).expect("instance"));
    }
    env.cp
        .node(&node_name_for(&ids[0]))
        .expect("kubelet")
        .partition();
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "db1 failed over and Ready",
        FAILOVER_TIMEOUT * 2,
        |q: Option<&QuestDB>| {
            use kube::runtime::wait::Condition as _;
            q.and_then(failover_phase).as_deref() == Some("Healthy") && is_ready().matches_object(q)
        },
    )
    .await;
    let now_on = q.status.and_then(|s| s.instance_id).expect("instance");
    assert_ne!(now_on, ids[0], "db1 runs on a replacement");
    env.wait_terminated(&ids[0], "the fenced instance is terminated")
        .await;
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone());
    let gone = node_name_for(&ids[0]);
    wait_until("the fenced node is gone", || {
        let (nodes, gone) = (nodes.clone(), gone.clone());
        async move { nodes.get_opt(&gone).await.is_ok_and(|n| n.is_none()) }
    })
    .await;
    let stops = env.cloud.ec2.call_count("StopInstances");

    let first = node_name_for(&ids[1]);
    env.cp.node(&first).expect("kubelet").partition();
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        env.client.clone(),
        "kube-node-lease",
    );
    let renew_ms = timings::node_lease_renew().as_millis() as i64;
    let renewed_ms = |lease: k8s_openapi::api::coordination::v1::Lease| {
        lease
            .spec
            .and_then(|s| s.renew_time)
            .map(|t| t.0.as_millisecond())
    };
    // The first node's last renewal, once it is certainly its last.
    let seen = Arc::new(std::sync::atomic::AtomicI64::new(0));
    wait_until("the first node's Lease is silent", || {
        let (leases, first, seen) = (leases.clone(), first.clone(), seen.clone());
        async move {
            let t = leases.get(&first).await.ok().and_then(renewed_ms);
            seen.store(t.unwrap_or(0), Ordering::SeqCst);
            t.is_some_and(|t| k8s_openapi::jiff::Timestamp::now().as_millisecond() - t > renew_ms)
        }
    })
    .await;
    let first_last = seen.load(Ordering::SeqCst);
    // The second dies just after a renewal a whole interval later: the two deaths are one
    // renewal apart on the operator's clock too, never in step by chance.
    let second = node_name_for(&ids[2]);
    wait_until(
        "the second node renews a renewal interval after the first's last",
        || {
            let (leases, second) = (leases.clone(), second.clone());
            async move {
                leases
                    .get(&second)
                    .await
                    .ok()
                    .and_then(renewed_ms)
                    .is_some_and(|t| t >= first_last + renew_ms)
            }
        },
    )
    .await;
    env.cp
        .node(&node_name_for(&ids[2]))
        .expect("kubelet")
        .partition();
    for name in ["db2", "db3"] {
        let q = wait_for_within(
            &env.qdbs(),
            name,
            "failover held back",
            FAILOVER_TIMEOUT,
            crate::harness::has_condition("Failover", "FailoverSuppressed"),
        )
        .await;
        let message = crate::harness::condition_message(&q, "Failover");
        assert!(
            message.contains("TooManyUnhealthyNodes"),
            "{name}: {message}"
        );
    }
    assert_eq!(
        env.cloud.ec2.call_count("StopInstances"),
        stops,
        "nothing fenced while two staggered deaths hold the breaker"
    );
    for name in ["db2", "db3"] {
        let q = env.qdbs().get(name).await.expect("qdb");
        assert_eq!(q.status.and_then(|s| s.failover), None, "{name}");
    }
    env.stop().await;
}

/// A zone cut off from the control plane silences every dedicated node in it at once: their
/// fences are held back naming the zone (fencing them all would stop databases that may still
/// serve), while a lone death in another zone, later, still fails over. Ten nodes in all, so
/// the zone's two silent nodes are not the cluster-wide outage rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_zone_fences_nothing_in_it_while_a_lone_death_in_another_zone_fails_over() {
    let env = with_more_workers(4).await;
    let placed = [
        ("db1", "sim-zone-a"),
        ("db2", "sim-zone-a"),
        ("db3", "sim-zone-b"),
    ];
    for (name, zone) in placed {
        env.create(name, move |q| {
            q.spec.failover.unhealthy_after_seconds = 10;
            q.spec.node.as_mut().expect("node").zone = zone.into();
        })
        .await;
    }
    let mut ids = Vec::new();
    for (name, _) in placed {
        let q = wait_for_within(
            &env.qdbs(),
            name,
            "QuestDB Ready",
            FAILOVER_TIMEOUT,
            is_ready(),
        )
        .await;
        ids.push(q.status.and_then(|s| s.instance_id).expect("instance"));
    }
    for id in &ids[..2] {
        env.cp
            .node(&node_name_for(id))
            .expect("kubelet")
            .partition();
    }
    for name in ["db1", "db2"] {
        let q = wait_for_within(
            &env.qdbs(),
            name,
            "failover held back",
            FAILOVER_TIMEOUT,
            crate::harness::has_condition("Failover", "FailoverSuppressed"),
        )
        .await;
        let message = crate::harness::condition_message(&q, "Failover");
        assert!(
            message.contains("TooManyUnhealthyNodes") && message.contains("zone sim-zone-a"),
            "{name}: {message}"
        );
    }
    assert_eq!(
        env.cloud.ec2.call_count("StopInstances"),
        0,
        "nothing fenced"
    );
    // The lone death comes well after the zone went silent: silences that begin within a Lease
    // duration of one another are one outage for the cluster-wide rule too, and would hold it
    // back (the safe side). Three Lease durations apart, it is a death of its own.
    lease_silent_for(&env, &node_name_for(&ids[1]), 3).await;
    env.cp
        .node(&node_name_for(&ids[2]))
        .expect("kubelet")
        .power_off();
    wait_for_within(
        &env.qdbs(),
        "db3",
        "db3 failed over and Ready",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| {
            use kube::runtime::wait::Condition as _;
            q.and_then(failover_phase).as_deref() == Some("Healthy") && is_ready().matches_object(q)
        },
    )
    .await;
    for (name, id) in ["db1", "db2"].into_iter().zip(&ids) {
        let q = env.qdbs().get(name).await.expect("qdb");
        assert_eq!(q.status.and_then(|s| s.failover), None, "{name}");
        let state = env
            .cloud
            .ec2
            .instances()
            .into_iter()
            .find(|i| &i.id == id)
            .map(|i| i.state);
        assert_eq!(state, Some(InstanceState::Running), "{name} never fenced");
    }
    env.stop().await;
}

/// Waits until `node`'s Lease has not been renewed for `leases` Lease durations (by the
/// apiserver's record of its last renewal).
async fn lease_silent_for(env: &CloudEnv, node: &str, leases: i64) {
    let api = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        env.client.clone(),
        "kube-node-lease",
    );
    let silent_ms = questdb_testenv::timings::node_lease_duration().as_millis() as i64 * leases;
    wait_until(
        &format!("{node}'s Lease silent for {leases} Lease durations"),
        || {
            let api = api.clone();
            async move {
                api.get(node)
                    .await
                    .ok()
                    .and_then(|l| l.spec?.renew_time)
                    .is_some_and(|t| {
                        k8s_openapi::jiff::Timestamp::now().as_millisecond() - t.0.as_millisecond()
                            > silent_ms
                    })
            }
        },
    )
    .await;
}

/// The usual cluster with `n` more shared workers: a larger cluster's breaker lets two
/// silent nodes through where the small one's counts them an outage.
async fn with_more_workers(n: usize) -> CloudEnv {
    let mut cluster = crate::harness::cluster();
    cluster.nodes.extend(
        (1..=n).map(|i| {
            questdb_testenv::NodeRegistration::worker(&format!("worker-c{i}"), "sim-zone-b")
        }),
    );
    CloudEnv::start_on(
        settings(),
        cluster,
        questdb_operator::cloud::memory::MemoryEc2Options::default(),
    )
    .await
}

/// A database whose node went silent, with failover turned off, is down and nothing will
/// bring it back by itself: once the control plane marks its pod not ready, the phase column
/// says `Unavailable` (never `Running`), `Ready` says the node is why, and `Running` returns
/// when the node answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_with_failover_off_shows_its_database_unavailable_until_it_answers() {
    let env = CloudEnv::start(settings()).await;
    env.create("db1", |q| q.spec.failover.enabled = false).await;
    wait_for(&env.qdbs(), "db1", "QuestDB Running", is_running()).await;
    // Not `Armed`: an on-call engineer reading that expects a dead node to be replaced.
    let q = wait_for(
        &env.qdbs(),
        "db1",
        "Failover False Disabled",
        crate::harness::has_condition("Failover", "Disabled"),
    )
    .await;
    let id = q.status.and_then(|s| s.instance_id).expect("instance");
    let kubelet = env.cp.node(&node_name_for(&id)).expect("kubelet");
    kubelet.partition();
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "phase Unavailable",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()?.phase)
                .is_some_and(|p| p.as_str() == "Unavailable")
        },
    )
    .await;
    let ready = q
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned())
        .expect("Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, "NodeNotReady", "{ready:?}");
    assert_eq!(
        env.cloud.ec2.call_count("StopInstances"),
        0,
        "failover is off"
    );
    kubelet.heal();
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Running again", is_running()).await;
    assert_eq!(q.status.and_then(|s| s.instance_id), Some(id));
    env.stop().await;
}

/// The process's resident memory, from /proc.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The harm: one tenant's image turning its database's answers against the operator. An
/// endless body read into memory would get the leader OOM-killed, then the standby, and
/// nobody's failover, move or backup would progress. A database in another namespace answers
/// every request on its HTTP port without end; the operator hangs up on each at its cap, its
/// memory stays bounded, and a dedicated node that loses power meanwhile is still replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_answers_without_end_neither_exhausts_the_operator_nor_holds_back_a_failover(
) {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::PostParams;
    use questdb_testenv::hostile;
    let mut env = CloudEnv::start(settings()).await;
    // Polled every 2 s rather than every minute: the endless answers come while the failover
    // runs.
    env.stop_manager().await;
    env.write_health_interval = Duration::from_secs(2);
    env.start_manager().await;

    let ns = "hostile";
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(env.client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    let mut endless = questdb_operator::desired::testing::questdb("endless", ns);
    endless.metadata.uid = None;
    endless.metadata.resource_version = None;
    endless.metadata.generation = None;
    endless.spec.image = format!("{}:9.2.0", hostile::ENDLESS_ANSWER_IMAGE);
    let hostile_qdbs = Api::<QuestDB>::namespaced(env.client.clone(), ns);
    hostile_qdbs
        .create(&PostParams::default(), &endless)
        .await
        .expect("the endless database");
    wait_for(
        &hostile_qdbs,
        "endless",
        "the endless database runs",
        is_running(),
    )
    .await;

    let Running {
        instance: old_id,
        node: old_node,
        pvc_uid,
        ..
    } = running_database(&env).await;
    wait_until("the operator asked the endless database", || async {
        hostile::requests_answered() >= 3
    })
    .await;
    let rss_before = rss_bytes();
    let (asked_before, sent_before) = (hostile::requests_answered(), hostile::bytes_sent());

    env.cp
        .node(&old_node)
        .expect("kubelet of the dedicated node")
        .power_off();
    assert_moved(&env, &old_id, &pvc_uid).await;

    let asked = hostile::requests_answered() - asked_before;
    let sent = hostile::bytes_sent() - sent_before;
    let growth = rss_bytes().saturating_sub(rss_before);
    eprintln!(
        "endless answers during the failover: {asked} requests, {} MiB sent in all, {} MiB per request; resident memory {} MiB -> growth {} MiB",
        sent >> 20,
        (sent / asked.max(1)) >> 20,
        rss_before >> 20,
        growth >> 20
    );
    assert!(
        asked >= 3,
        "the operator went on polling the endless database during the failover ({asked} requests)"
    );
    // The operator reads at most 4 MiB of an answer and hangs up: what was sent per request is
    // that plus the sockets' buffers. A client without the cap reads for the whole request
    // limit (10 s of loopback: gigabytes each).
    assert!(
        sent / asked < 32 << 20,
        "{} MiB sent per request: the operator read on past its cap",
        (sent / asked) >> 20
    );
    assert!(
        growth < 256 << 20,
        "resident memory grew {} MiB while the endless database was polled",
        growth >> 20
    );
    env.stop().await;
}

/// The silence tracker lives in the operator's memory: an operator restarted more often than
/// the failover threshold (a crash loop, an upgrade, leadership moving between replicas) met
/// every node anew and counted its silence from zero each time, so a dead node was never
/// failed over. A restarted operator counts a Lease's silence from its renewTime, less one
/// Lease duration for the kubelet's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_restarted_faster_than_the_threshold_still_fails_over_a_dead_node() {
    let mut env = CloudEnv::start(settings()).await;
    env.create("db1", |q| q.spec.failover.unhealthy_after_seconds = 30)
        .await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let id = q.status.and_then(|s| s.instance_id).expect("instance");
    env.cp
        .node(&node_name_for(&id))
        .expect("kubelet")
        .power_off();
    let powered_off = std::time::Instant::now();
    // The fault: a restart every 12 s, well under the 30 s threshold, for as long as no
    // failover has started (the schedule of the restarts, not a wait for a state).
    let restart_every = Duration::from_secs(12);
    let started = loop {
        tokio::time::sleep(restart_every).await;
        let q = env.qdbs().get("db1").await.expect("db1");
        if q.status
            .as_ref()
            .and_then(|s| s.failover.as_ref())
            .is_some()
        {
            break powered_off.elapsed();
        }
        assert!(
            powered_off.elapsed() < Duration::from_secs(150),
            "no failover 150 s after the power-off: the operator restarted every {restart_every:?} counted the silence from zero each time"
        );
        env.kill_manager().await;
        env.start_manager().await;
    };
    eprintln!(
        "failover started {:.0} s after the power-off, the operator restarted every {} s (threshold 30 s)",
        started.as_secs_f64(),
        restart_every.as_secs()
    );
    wait_for_within(
        &env.qdbs(),
        "db1",
        "failover done",
        FAILOVER_TIMEOUT,
        |q: Option<&QuestDB>| q.and_then(failover_phase).as_deref() == Some("Healthy"),
    )
    .await;
    env.stop().await;
}

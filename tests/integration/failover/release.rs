//! A pause, a deletion or a removed spec.node of a database whose node died or is being fenced: the fence finishes and everything is released.

use super::*;

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

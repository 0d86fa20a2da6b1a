//! Failovers meeting node moves: a failover pre-empts a move before its switch, a node that dies at or after the switch, both nodes of a move silent or dead, a retained old node.

use super::*;

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
    let (new_id, new_kubelet) = move_launched_onto_a_node_not_ready(&env).await;
    let stop = CancellationToken::new();
    let violations = two_writer_watch(&env, old_node.clone(), old_id.clone(), stop.clone());
    // The old node dies and the new one goes Ready once the move waits for it, while the
    // manager is killed at every step: the move's record of NodeReady included (it would be
    // before the kills if the test waited for it first).
    let old_kubelet = env.cp.node(&old_node).expect("old kubelet");
    let qdbs = env.qdbs();
    let switch = tokio::spawn(async move {
        wait_for_within(
            &qdbs,
            "db1",
            "move waits for the new node",
            FAILOVER_TIMEOUT,
            |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "NodeReady"),
        )
        .await;
        old_kubelet.partition();
        new_kubelet.heal();
    });
    let killed = env
        .kill_at_every_step(
            move_step,
            "Completed",
            &["Aborted", "RolledBack", "RolledBack (back)"],
            FAILOVER_TIMEOUT,
        )
        .await;
    stop.cancel();
    switch.await.expect("the switch's faults");
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

/// Starts a node-image move of `db1` and holds its new node NotReady (as a joining node whose
/// runtime is not up yet) until the move waits for it in `NodeReady`: the test then decides
/// what happens at the switch. Returns the new instance and its kubelet.
async fn move_held_before_the_switch(env: &CloudEnv) -> (String, questdb_testenv::NodeHandle) {
    let (new_id, kubelet) = move_launched_onto_a_node_not_ready(env).await;
    wait_for(
        &env.qdbs(),
        "db1",
        "move waits for the new node",
        |q: Option<&QuestDB>| node_move_of(q).is_some_and(|u| u.phase == "NodeReady"),
    )
    .await;
    (new_id, kubelet)
}

/// An image move of `db1` whose new node joins NotReady (and stays so until healed); the new
/// instance and its kubelet.
async fn move_launched_onto_a_node_not_ready(
    env: &CloudEnv,
) -> (String, questdb_testenv::NodeHandle) {
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

/// The step of a node move, its way back told apart.
fn move_step(q: &QuestDB) -> Option<String> {
    let u = q.status.as_ref()?.node_move.as_ref()?;
    Some(if u.rolling_back {
        format!("{} (back)", u.phase)
    } else {
        u.phase.to_string()
    })
}

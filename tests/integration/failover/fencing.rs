//! The fence and the replacement: the old instance stopped (forced again when a stop hangs) before the volume moves, power loss and stops by others, a replacement that dies in turn, the fenced instance terminated only after the old record's TTL.

use super::*;

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

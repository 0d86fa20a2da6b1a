//! What is and is not a dead node: silences that heal, a kubelet that restarts, a node not Ready whose Lease renews, a deleted Node, an instance that never joins, outages, the breaker, zones, real kubelet timings, a database that still answers.

use super::*;

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
    super::super::writes_settle(&env.cp).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_node_never_joins_is_reported_and_replaced() {
    let env = CloudEnv::start(settings()).await;
    env.cloud.ec2.set_never_joins(super::super::AMI, true);
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
    env.cloud.ec2.set_never_joins(super::super::AMI, false);

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
    env.cloud.ec2.set_never_joins(super::super::AMI, true);
    env.create("db1", |q| q.spec.failover.enabled = false).await;
    let q = never_joined(&env).await;
    let first = q
        .status
        .as_ref()
        .and_then(|s| s.instance_id.clone())
        .expect("the first instance");
    env.wait_terminated(&first, "the instance that never joined is terminated")
        .await;
    env.cloud.ec2.set_never_joins(super::super::AMI, false);
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

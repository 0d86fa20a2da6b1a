//! The manager killed at every failover step (and in the middle of each): the failover still ends with one database, one volume attachment, one instance.

use super::*;

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

/// Every step a failover records on its way to `Healthy`.
const FAILOVER_STEPS: &[&str] = &[
    "Fencing",
    "Releasing",
    "Reattaching",
    "Recovering",
    "Draining",
];

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

//! Node image moves on the real control plane: one field changes, the database moves to a node
//! of the new image with its volume; a move that cannot work aborts before the database stops.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use questdb_operator::api::QuestDB;
use serde_json::json;

use super::{settings, CloudEnv, NS};
use crate::harness::{has_condition, is_ready, is_running, wait_for, wait_for_within, wait_until};

const NEW_AMI: &str = "ami-0fedcba9876543210";
const NEVER_JOINS: &str = "ami-0000000000000dead";
const UNKNOWN: &str = "ami-00000000000000bad";
const MOVE_TIMEOUT: Duration = Duration::from_secs(240);

async fn set_image(env: &CloudEnv, image: &str) {
    env.qdbs()
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": {"image": image}}})),
        )
        .await
        .expect("patch spec.node.image");
}

async fn pod_uid(env: &CloudEnv) -> String {
    Api::<Pod>::namespaced(env.client.clone(), NS)
        .get("db1-0")
        .await
        .expect("pod")
        .uid()
        .expect("uid")
}

fn upgrade_phase(q: &QuestDB) -> Option<String> {
    q.status.as_ref()?.upgrade.as_ref().map(|u| u.phase.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_image_moves_the_database_to_a_new_node_with_the_same_volume() {
    let env = CloudEnv::start(settings()).await;
    env.create("db1", |_| {}).await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let old_id = q.status.and_then(|s| s.instance_id).expect("instance");
    let pvc_uid = Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), NS)
        .get("db1-data")
        .await
        .expect("pvc")
        .uid()
        .expect("uid");

    set_image(&env, NEW_AMI).await;
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "move completed",
        MOVE_TIMEOUT,
        |q: Option<&QuestDB>| q.and_then(upgrade_phase).as_deref() == Some("Completed"),
    )
    .await;
    let status = q.status.clone().expect("status");
    let new_id = status.instance_id.clone().expect("new instance");
    assert_ne!(new_id, old_id);
    assert_eq!(status.node_image.as_deref(), Some(NEW_AMI));
    let upgrade = status.upgrade.clone().expect("record");
    assert_eq!(upgrade.old_instance_id.as_deref(), Some(old_id.as_str()));
    assert_eq!(upgrade.new_instance_id.as_deref(), Some(new_id.as_str()));
    eprintln!(
        "node move: downtime {:?} s (stopped at {:?}, finished at {:?})",
        upgrade.downtime_seconds, upgrade.stopped_at, upgrade.finished_at
    );
    assert!(upgrade.downtime_seconds.is_some());
    let new = env
        .cloud
        .ec2
        .instances()
        .into_iter()
        .find(|i| i.id == new_id)
        .expect("new instance");
    assert_eq!(new.image, NEW_AMI);

    env.assert_runs_on(&new_id, &pvc_uid).await;
    env.wait_terminated(&old_id, "old instance terminated")
        .await;
    env.stop().await;
}

/// Until the new node is Ready the database is not touched: an image EC2 does not know, and one
/// whose node never joins, both abort with the same pod still running, and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_that_cannot_work_aborts_without_stopping_the_database() {
    let env = CloudEnv::start(settings()).await;
    env.create("db1", |_| {}).await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let id = q.status.and_then(|s| s.instance_id).expect("instance");
    let pod = pod_uid(&env).await;

    set_image(&env, UNKNOWN).await;
    wait_for(
        &env.qdbs(),
        "db1",
        "unknown image aborts",
        has_condition("NodeUpgrade", "LaunchFailed"),
    )
    .await;
    assert_eq!(pod_uid(&env).await, pod, "the database never stopped");

    set_image(&env, NEVER_JOINS).await;
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "a node that never joins aborts",
        MOVE_TIMEOUT,
        has_condition("NodeUpgrade", "NodeNeverJoined"),
    )
    .await;
    let status = q.status.expect("status");
    assert_eq!(status.instance_id.as_deref(), Some(id.as_str()));
    assert_eq!(pod_uid(&env).await, pod, "the database never stopped");
    let tried = status
        .upgrade
        .and_then(|u| u.new_instance_id)
        .expect("a new instance was tried");
    env.wait_terminated(&tried, "the instance that never joined is terminated")
        .await;
    wait_for(&env.qdbs(), "db1", "still Running", is_running()).await;
    env.stop().await;
}

/// A crash at any step of a move resumes where it was: the manager is killed each time the
/// move enters a new step and restarted; the end is one live instance (the new one), one pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_manager_at_every_move_step_leaves_one_instance_and_one_pod() {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    let mut env = CloudEnv::start(settings()).await;
    env.create("db1", |_| {}).await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let uid = q.uid().expect("uid");
    set_image(&env, NEW_AMI).await;
    let mut killed = std::collections::BTreeSet::new();
    let cfg = watcher::Config::default().fields("metadata.name=db1");
    let mut events = std::pin::pin!(watcher(env.qdbs(), cfg).applied_objects());
    let deadline = tokio::time::Instant::now() + MOVE_TIMEOUT;
    loop {
        let q = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("move finishes in time")
            .expect("watch open")
            .expect("watch event");
        match upgrade_phase(&q).as_deref() {
            Some("Completed") => break,
            Some("Aborted") => panic!("move aborted: {:?}", q.status),
            Some(step) if killed.insert(step.to_string()) => {
                env.kill_manager().await;
                env.start_manager().await;
            }
            _ => {}
        }
    }
    assert!(killed.len() >= 3, "killed at {killed:?}");
    let q = wait_for(&env.qdbs(), "db1", "Ready after the move", is_ready()).await;
    let new_id = q.status.and_then(|s| s.instance_id).expect("instance");
    wait_until("only the new instance lives", || {
        let live = env.live_instances_of(&uid);
        let want = vec![new_id.clone()];
        async move { live == want }
    })
    .await;
    let pods = Api::<Pod>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("pods")
        .items;
    assert_eq!(pods.len(), 1, "one pod");
    env.stop().await;
}

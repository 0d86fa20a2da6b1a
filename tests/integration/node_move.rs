//! Node image moves on the real control plane: one field changes, the database moves to a node
//! of the new image with its volume; a move that cannot work aborts before the database stops.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use questdb_operator::api::QuestDB;
use questdb_operator::cloud::TAG_UID;
use questdb_testenv::node_name_for_instance as node_name_for;
use serde_json::json;

use super::{is_ready_now, settings, CloudEnv, NS};
use crate::harness::{has_condition, is_ready, is_running, wait_for, wait_for_within, wait_until};

const NEW_AMI: &str = "ami-0fedcba9876543210";
const NEVER_JOINS: &str = "ami-0000000000000dead";
const UNKNOWN: &str = "ami-00000000000000bad";
const MOVE_TIMEOUT: Duration = Duration::from_secs(240);

async fn set_image(env: &CloudEnv, image: &str) {
    set_image_of(env, NS, "db1", image).await
}

async fn pod_uid(env: &CloudEnv) -> String {
    Api::<Pod>::namespaced(env.client.clone(), NS)
        .get("db1-0")
        .await
        .expect("pod")
        .uid()
        .expect("uid")
}

fn node_move_phase(q: &QuestDB) -> Option<String> {
    q.status
        .as_ref()?
        .node_move
        .as_ref()
        .map(|u| u.phase.to_string())
}

async fn patch_node(env: &CloudEnv, node: serde_json::Value) {
    env.qdbs()
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": node}})),
        )
        .await
        .expect("patch spec.node");
}

/// Creates `db1` and waits until it is Ready: its uid and instance.
async fn ready_db1(env: &CloudEnv, edit: impl FnOnce(&mut QuestDB)) -> (String, String) {
    env.create("db1", edit).await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let uid = q.uid().expect("uid");
    let instance = q.status.and_then(|s| s.instance_id).expect("instance");
    (uid, instance)
}

async fn pvc_uid(env: &CloudEnv) -> String {
    Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), NS)
        .get("db1-data")
        .await
        .expect("pvc")
        .uid()
        .expect("uid")
}

fn instance(env: &CloudEnv, id: &str) -> questdb_operator::cloud::Instance {
    env.cloud
        .ec2
        .instances()
        .into_iter()
        .find(|i| i.id == id)
        .expect("instance known to EC2")
}

/// Every instance ever launched for the QuestDB `uid`, any state.
fn launched_for(env: &CloudEnv, uid: &str) -> BTreeSet<String> {
    env.cloud
        .ec2
        .instances()
        .into_iter()
        .filter(|i| i.tags.get(TAG_UID).map(String::as_str) == Some(uid))
        .map(|i| i.id)
        .collect()
}

async fn node_of(env: &CloudEnv, instance: &str) -> Node {
    Api::<Node>::all(env.client.clone())
        .get(&node_name_for(instance))
        .await
        .expect("node")
}

/// The move's record reaches `phase` with `image` as its target.
async fn wait_move(
    env: &CloudEnv,
    what: &str,
    phase: &'static str,
    image: &'static str,
) -> QuestDB {
    wait_move_of(env, "db1", what, phase, image).await
}

/// [`wait_move`] for the QuestDB `name` in [`NS`].
async fn wait_move_of(
    env: &CloudEnv,
    name: &str,
    what: &str,
    phase: &'static str,
    image: &'static str,
) -> QuestDB {
    wait_for_within(
        &env.qdbs(),
        name,
        what,
        MOVE_TIMEOUT,
        move |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()?.node_move.clone())
                .is_some_and(|u| u.phase == phase && u.to_image.as_deref() == Some(image))
        },
    )
    .await
}

/// The whole life of a move: the database moves to a node of the new image with its volume,
/// the old node is kept cordoned; setting the image back moves it back to that node without a
/// launch; shortening the window releases the node it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_image_moves_the_database_and_setting_it_back_returns_without_a_launch() {
    let env = CloudEnv::start(settings()).await;
    let (uid, old_id) = ready_db1(&env, |_| {}).await;
    let pvc = pvc_uid(&env).await;

    set_image(&env, NEW_AMI).await;
    let q = wait_move(&env, "moved, old node retained", "Retaining", NEW_AMI).await;
    let status = q.status.clone().expect("status");
    let new_id = status.instance_id.clone().expect("new instance");
    assert_ne!(new_id, old_id);
    assert_eq!(status.node_image.as_deref(), Some(NEW_AMI));
    assert_eq!(status.previous_node_image.as_deref(), Some(super::AMI));
    let upgrade = status.node_move.clone().expect("record");
    assert_eq!(upgrade.old_instance_id.as_deref(), Some(old_id.as_str()));
    assert_eq!(upgrade.new_instance_id.as_deref(), Some(new_id.as_str()));
    assert!(upgrade.retain_until.is_some(), "{upgrade:?}");
    eprintln!(
        "node move: downtime {:?} s (stopped at {:?}, finished at {:?})",
        upgrade.downtime_seconds, upgrade.stopped_at, upgrade.finished_at
    );
    assert!(upgrade.downtime_seconds.is_some());
    let new = instance(&env, &new_id);
    assert_eq!(new.image, NEW_AMI);
    env.assert_runs_on(&new_id, &pvc).await;
    let live: BTreeSet<String> = env.live_instances_of(&uid).into_iter().collect();
    assert_eq!(
        live,
        [old_id.clone(), new_id.clone()].into(),
        "old node retained"
    );
    let old_node = node_of(&env, &old_id).await;
    assert_eq!(
        old_node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "the retained node is cordoned"
    );

    set_image(&env, super::AMI).await;
    let q = wait_move(
        &env,
        "moved back, new node retained",
        "Retaining",
        super::AMI,
    )
    .await;
    let status = q.status.expect("status");
    assert_eq!(status.instance_id.as_deref(), Some(old_id.as_str()));
    assert_eq!(status.node_image.as_deref(), Some(super::AMI));
    assert_eq!(
        launched_for(&env, &uid),
        [old_id.clone(), new_id.clone()].into(),
        "no launch to move back"
    );
    env.assert_runs_on(&old_id, &pvc).await;
    let back = node_of(&env, &old_id).await;
    assert_ne!(back.spec.and_then(|s| s.unschedulable), Some(true));

    patch_node(&env, json!({"rollbackWindow": "1s"})).await;
    wait_move(&env, "window over", "Completed", super::AMI).await;
    env.wait_terminated(&new_id, "the node it left is terminated")
        .await;
    env.assert_runs_on(&old_id, &pvc).await;
    env.stop().await;
}

/// A database that cannot start on the new node (its volume will not attach there) goes back
/// to the old node, which is still there: one more stop, no data left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_cannot_start_on_the_new_node_goes_back_to_the_old_one() {
    let env = CloudEnv::start(settings()).await;
    let (_, old_id) = ready_db1(&env, |_| {}).await;
    let pvc = pvc_uid(&env).await;
    *env.cp.csi.attach_only_to.lock().unwrap() = Some(node_name_for(&old_id));

    set_image(&env, NEW_AMI).await;
    let q = wait_move(&env, "rolled back", "RolledBack", NEW_AMI).await;
    let status = q.status.clone().expect("status");
    assert_eq!(status.instance_id.as_deref(), Some(old_id.as_str()));
    assert_eq!(status.node_image.as_deref(), Some(super::AMI));
    let upgrade = status.node_move.expect("record");
    assert_eq!(
        upgrade.reason.map(|r| r.to_string()).as_deref(),
        Some("MoveFailed"),
        "{upgrade:?}"
    );
    eprintln!("rollback: downtime {:?} s", upgrade.downtime_seconds);
    let failed = upgrade.old_instance_id.expect("the instance it failed on");
    assert_ne!(failed, old_id);
    env.wait_terminated(&failed, "the failed node is terminated")
        .await;
    env.assert_runs_on(&old_id, &pvc).await;
    let q = wait_for(
        &env.qdbs(),
        "db1",
        "rollback reported",
        has_condition("NodeMove", "MoveFailed"),
    )
    .await;
    assert!(is_ready_now(Some(&q)));
    env.stop().await;
}

/// Setting the image back while the database is being moved (stopped, or starting on the new
/// node) returns it to the old node, which is still there: no further launch, same volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setting_the_image_back_during_a_move_returns_to_the_old_node_without_a_launch() {
    let env = CloudEnv::start(settings()).await;
    let (uid, old_id) = ready_db1(&env, |_| {}).await;
    let pvc = pvc_uid(&env).await;
    set_image(&env, NEW_AMI).await;
    let q = wait_move(&env, "the database stops", "Stopping", NEW_AMI).await;
    let new_id = q
        .status
        .and_then(|s| s.node_move?.new_instance_id)
        .expect("new instance");
    set_image(&env, super::AMI).await;
    // Back on the old node either way: rolled back mid-move, or moved back from retention.
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "back on the old node",
        MOVE_TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                s.node_image.as_deref() == Some(super::AMI)
                    && s.node_move
                        .as_ref()
                        .is_some_and(|u| matches!(u.phase.as_str(), "RolledBack" | "Retaining"))
            })
        },
    )
    .await;
    let status = q.status.expect("status");
    eprintln!("set back during the move: {:?}", status.node_move);
    assert_eq!(status.instance_id.as_deref(), Some(old_id.as_str()));
    assert_eq!(
        launched_for(&env, &uid),
        [old_id.clone(), new_id].into(),
        "no launch to go back"
    );
    env.assert_runs_on(&old_id, &pvc).await;
    env.stop().await;
}

/// An instance type change moves the database the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_type_change_moves_the_database_to_a_node_of_that_type() {
    let env = CloudEnv::start(settings()).await;
    let (_, old_id) = ready_db1(&env, |q| {
        q.spec.node.as_mut().unwrap().rollback_window = Some("0s".into());
    })
    .await;
    let pvc = pvc_uid(&env).await;
    patch_node(&env, json!({"instanceType": "m6i.xlarge"})).await;
    let q = wait_move(&env, "resized", "Completed", super::AMI).await;
    let status = q.status.expect("status");
    let new_id = status.instance_id.expect("instance");
    assert_eq!(status.node_instance_type.as_deref(), Some("m6i.xlarge"));
    let new = instance(&env, &new_id);
    assert_eq!(new.instance_type, "m6i.xlarge");
    env.wait_terminated(&old_id, "the old node is terminated (no rollback window)")
        .await;
    env.assert_runs_on(&new_id, &pvc).await;
    env.stop().await;
}

/// Until the new node is Ready the database is not touched: an image EC2 does not know, and one
/// whose node never joins, both abort with the same pod still running, and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_that_cannot_work_aborts_without_stopping_the_database() {
    let env = CloudEnv::start(settings()).await;
    let (_, id) = ready_db1(&env, |_| {}).await;
    let pod = pod_uid(&env).await;

    set_image(&env, UNKNOWN).await;
    wait_for(
        &env.qdbs(),
        "db1",
        "unknown image aborts",
        has_condition("NodeMove", "InvalidNode"),
    )
    .await;
    assert_eq!(pod_uid(&env).await, pod, "the database never stopped");

    set_image(&env, NEVER_JOINS).await;
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "a node that never joins aborts",
        MOVE_TIMEOUT,
        has_condition("NodeMove", "NodeNeverJoined"),
    )
    .await;
    let status = q.status.expect("status");
    assert_eq!(status.instance_id.as_deref(), Some(id.as_str()));
    assert_eq!(pod_uid(&env).await, pod, "the database never stopped");
    let tried = status
        .node_move
        .and_then(|u| u.new_instance_id)
        .expect("a new instance was tried");
    env.wait_terminated(&tried, "the instance that never joined is terminated")
        .await;
    wait_for(&env.qdbs(), "db1", "still Running", is_running()).await;

    // Outside its maintenance window a move waits, and says when it will start.
    let closed_today = json!({"days": [tomorrow()], "start": "00:00", "duration": "1h"});
    patch_node(
        &env,
        json!({"maintenanceWindow": closed_today, "image": NEW_AMI}),
    )
    .await;
    let q = wait_for(
        &env.qdbs(),
        "db1",
        "move waits for its window",
        has_condition("NodeMove", "Waiting"),
    )
    .await;
    let message = crate::harness::condition_message(&q, "NodeMove");
    assert!(
        message.contains("maintenance window") && message.contains("T00:00:00Z"),
        "{message}"
    );
    assert_eq!(pod_uid(&env).await, pod, "the database never stopped");
    env.stop().await;
}

/// The three-letter name of tomorrow (UTC): a window on that day only is closed now.
fn tomorrow() -> &'static str {
    let days = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // 1970-01-01 was a Thursday.
    days[((secs / 86_400 + 1) % 7) as usize]
}

/// A crash at any step of a move resumes where it was: the manager is killed each time the
/// move enters a new step and restarted; the end is one live instance (the new one), one pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_manager_at_every_move_step_leaves_one_instance_and_one_pod() {
    let mut env = CloudEnv::start(settings()).await;
    let (uid, _) = ready_db1(&env, |q| {
        q.spec.node.as_mut().unwrap().rollback_window = Some("0s".into());
    })
    .await;
    set_image(&env, NEW_AMI).await;
    let killed = env
        .kill_at_every_step(
            node_move_phase,
            "Completed",
            &["Aborted", "RolledBack"],
            MOVE_TIMEOUT,
        )
        .await;
    let steps = [
        "Validating",
        "Provisioning",
        "NodeReady",
        "Stopping",
        "Moving",
        "Verifying",
        "Retaining",
    ];
    let missing: Vec<&str> = steps.into_iter().filter(|s| !killed.contains(*s)).collect();
    assert!(
        missing.is_empty(),
        "never killed at {missing:?}; killed at {killed:?}"
    );
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

/// A fleet rollout: 50 QuestDBs, their specs edited one after another. Moves queue behind
/// `--node-move-concurrency` (a watch over every QuestDB fails the test the moment more are under
/// way), every database ends on a node of its own built from the new image, and no instance
/// is ever recorded by two QuestDBs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_databases_upgraded_one_edit_after_another_never_exceed_the_concurrency_flag() {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    use std::collections::BTreeMap;
    const FLEET: usize = 50;
    const CONCURRENCY: usize = 4;
    let mut fleet_settings = settings();
    fleet_settings.node_move_concurrency = CONCURRENCY;
    fleet_settings.node_move_concurrency_per_namespace = CONCURRENCY;
    let env = CloudEnv::start(fleet_settings).await;
    let names: Vec<String> = (0..FLEET).map(|i| format!("db{i:02}")).collect();
    for name in &names {
        env.create(name, |q| {
            q.spec.node.as_mut().unwrap().rollback_window = Some("0s".into());
            q.spec.dns = None;
        })
        .await;
    }
    let started = std::time::Instant::now();
    for name in &names {
        wait_for_within(&env.qdbs(), name, "QuestDB Ready", MOVE_TIMEOUT, is_ready()).await;
    }
    eprintln!("fleet: {FLEET} databases Ready in {:?}", started.elapsed());

    let started = std::time::Instant::now();
    for name in &names {
        env.qdbs()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"node": {"image": NEW_AMI}}})),
            )
            .await
            .expect("patch spec.node.image");
    }
    let moving = |q: &QuestDB| {
        q.status
            .as_ref()
            .and_then(|s| s.node_move.as_ref())
            .is_some_and(|u| {
                !matches!(
                    u.phase.as_str(),
                    "Completed" | "Aborted" | "RolledBack" | "Retaining"
                )
            })
    };
    let mut state: BTreeMap<String, QuestDB> = BTreeMap::new();
    let mut most = 0;
    let mut events =
        std::pin::pin!(watcher(env.qdbs(), watcher::Config::default()).applied_objects());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(900);
    loop {
        let q = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("rollout finishes in time")
            .expect("watch open")
            .expect("watch event");
        if let Some(u) = q.status.as_ref().and_then(|s| s.node_move.as_ref()) {
            assert!(
                !matches!(u.phase.as_str(), "Aborted" | "RolledBack"),
                "{}: {u:?}",
                q.name_any()
            );
        }
        state.insert(q.name_any(), q);
        let now = state.values().filter(|q| moving(q)).count();
        most = most.max(now);
        assert!(now <= CONCURRENCY, "{now} moves under way at once");
        let done = state
            .values()
            .filter(|q| {
                q.status.as_ref().is_some_and(|s| {
                    s.node_image.as_deref() == Some(NEW_AMI)
                        && s.node_move.as_ref().is_some_and(|u| u.phase == "Completed")
                })
            })
            .count();
        if done == FLEET {
            break;
        }
    }
    eprintln!(
        "fleet: {FLEET} moves done in {:?}, at most {most} at once (flag {CONCURRENCY})",
        started.elapsed()
    );
    assert!(most >= 2, "moves ran side by side: {most}");
    let mut seen = BTreeSet::new();
    for q in state.values() {
        let s = q.status.as_ref().expect("status");
        let u = s.node_move.as_ref().expect("record");
        for id in [u.old_instance_id.clone(), u.new_instance_id.clone()] {
            let id = id.expect("ids recorded");
            assert!(seen.insert(id.clone()), "{id} recorded by two QuestDBs");
        }
        let id = s.instance_id.as_deref().expect("instance");
        assert_eq!(instance(&env, id).image, NEW_AMI);
    }
    env.stop().await;
}

/// On EKS the EBS CSI node plugin registers its driver after the Node is Ready; an attach
/// before that fails ("CSINode ... does not contain driver") and backs off for up to minutes,
/// stretching the downtime of a move (or the start of a new database). A dedicated node takes
/// its database only once the driver is registered, so no attach is ever refused for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_volume_attach_is_tried_before_the_csi_driver_registers_on_the_node() {
    use futures::StreamExt;
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::runtime::{watcher, WatchStreamExt};
    let env = CloudEnv::start(settings()).await;
    let refused = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = refused.clone();
    let stop = tokio_util::sync::CancellationToken::new();
    let cancelled = stop.clone();
    let vas: Api<VolumeAttachment> = Api::all(env.client.clone());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(vas, watcher::Config::default()).applied_objects());
        loop {
            let va = tokio::select! {
                _ = cancelled.cancelled() => return,
                next = stream.next() => match next {
                    Some(Ok(va)) => va,
                    Some(Err(_)) => continue,
                    None => return,
                },
            };
            let error = va
                .status
                .as_ref()
                .and_then(|s| s.attach_error.as_ref())
                .and_then(|e| e.message.clone());
            if let Some(e) = error.filter(|e| e.contains("does not contain driver")) {
                seen.lock().unwrap().push(e);
            }
        }
    });
    let (_, old_id) = ready_db1(&env, |_| {}).await;
    set_image(&env, NEW_AMI).await;
    let q = wait_move(&env, "moved", "Retaining", NEW_AMI).await;
    stop.cancel();
    let new_id = q.status.and_then(|s| s.instance_id).expect("instance");
    assert_ne!(new_id, old_id);
    let refused = refused.lock().unwrap().clone();
    assert!(refused.is_empty(), "attaches refused: {refused:?}");
    env.stop().await;
}

/// A retained old node that dies during the rollback window can no longer take the database
/// back; keeping it until the window ends (30 minutes by default) only leaves a dead instance
/// running up the bill, and a rollback onto it would fail: it is released once dead and past
/// the DNS TTL, and no revert is offered onto it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_node_that_dies_during_the_rollback_window_is_released() {
    let env = CloudEnv::start(settings()).await;
    let (uid, old_id) = ready_db1(&env, |q| q.spec.failover.unhealthy_after_seconds = 10).await;
    set_image(&env, NEW_AMI).await;
    let q = wait_move(&env, "moved, old node retained", "Retaining", NEW_AMI).await;
    let new_id = q.status.and_then(|s| s.instance_id).expect("instance");
    // Converged and asleep until its next look at the window: only the node's death wakes it.
    super::writes_settle(&env.cp).await;
    env.cp
        .node(&node_name_for(&old_id))
        .expect("kubelet of the retained node")
        .power_off();
    // Well before the window's next look (5 minutes at most): the death itself wakes it.
    wait_for_within(
        &env.qdbs(),
        "db1",
        "the dead retained node released",
        Duration::from_secs(90),
        |q: Option<&QuestDB>| q.and_then(node_move_phase).as_deref() == Some("Completed"),
    )
    .await;
    env.wait_terminated(&old_id, "the dead retained node is terminated")
        .await;
    assert_eq!(env.live_instances_of(&uid), vec![new_id], "one instance");
    env.stop().await;
}

/// A database granted a grace period longer than the move's step timeout (a large table to
/// flush) would be sent back to its old node in the middle of the stop it was granted, and
/// the move wasted: the stop is waited for through the whole grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_takes_its_whole_grace_period_to_stop_is_not_sent_back_mid_stop() {
    let env = CloudEnv::start(settings()).await;
    // 40 s to stop, against a 30 s step timeout in these settings.
    let (_, old_id) = ready_db1(&env, |q| {
        q.spec.pod.termination_grace_period_seconds = Some(40)
    })
    .await;
    env.cp
        .node(&node_name_for(&old_id))
        .expect("old kubelet")
        .stops_take_the_grace_period();
    set_image(&env, NEW_AMI).await;
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "the move ends its stop one way or the other",
        MOVE_TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()?.node_move.clone())
                .is_some_and(|u| u.phase == "Retaining" || u.rolling_back)
        },
    )
    .await;
    let upgrade = q.status.and_then(|s| s.node_move).expect("record");
    assert_eq!(upgrade.phase, "Retaining", "{upgrade:?}");
    assert!(!upgrade.rolling_back, "{upgrade:?}");
    assert!(
        upgrade.downtime_seconds.unwrap_or_default() >= 40,
        "the stop took the grace period: {upgrade:?}"
    );
    env.stop().await;
}

/// An unmount that fails on the node a move leaves ("device or resource busy") keeps the pod
/// Terminating there for good: going back cannot work (the pod leaves for neither node), and
/// waiting is an outage with no end. Past the grace period and the step timeout, that node
/// is fenced as a dead one is (its instance stopped before anything is released), the move
/// goes on, and a Warning event says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_unmount_fails_is_fenced_and_the_move_goes_on() {
    let env = CloudEnv::start(settings()).await;
    let (uid, old_id) = ready_db1(&env, |q| {
        q.spec.pod.termination_grace_period_seconds = Some(5)
    })
    .await;
    let pvc = pvc_uid(&env).await;
    env.cp
        .node(&node_name_for(&old_id))
        .expect("old kubelet")
        .fail_unmounts();
    set_image(&env, NEW_AMI).await;
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "the move goes on past the stuck node, or goes back",
        MOVE_TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()?.node_move.clone())
                .is_some_and(|u| {
                    u.rolling_back || matches!(u.phase.as_str(), "Retaining" | "Completed")
                })
        },
    )
    .await;
    let status = q.status.expect("status");
    let upgrade = status.node_move.clone().expect("record");
    assert!(!upgrade.rolling_back, "{upgrade:?}");
    let new_id = status.instance_id.clone().expect("instance");
    assert_ne!(new_id, old_id);
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 1,
        "the stuck node was fenced by a stop"
    );
    env.assert_runs_on(&new_id, &pvc).await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), NS);
    let stuck = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("NodeMoveStuck"))
        .count();
    assert_eq!(stuck, 1, "one Warning says why the node was fenced");
    assert!(
        launched_for(&env, &uid).len() == 2,
        "no launch beyond the move's"
    );
    env.stop().await;
}

/// `name`'s node image set to `image` in `ns`.
async fn set_image_of(env: &CloudEnv, ns: &str, name: &str, image: &str) {
    Api::<QuestDB>::namespaced(env.client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": {"image": image}}})),
        )
        .await
        .expect("patch spec.node.image");
}

/// `name`'s move to `image`, from the edit until the database runs on the new node.
async fn timed_move(env: &CloudEnv, name: &str, image: &'static str) -> Duration {
    let started = std::time::Instant::now();
    set_image_of(env, NS, name, image).await;
    wait_move_of(env, name, &format!("{name} moved"), "Retaining", image).await;
    started.elapsed()
}

/// Node moves share a global concurrency: one tenant whose moves cannot work (their nodes
/// never join, each waits out the join timeout before it aborts) must not hold back another
/// tenant's move beyond twice its normal time. Production's defaults: two moves at once, one
/// per namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_stuck_moves_do_not_hold_back_another_tenants_move() {
    const NOISY: &str = "tenant-noisy";
    let mut cloud = settings();
    cloud.node_move_concurrency = 2;
    cloud.node_move_concurrency_per_namespace = 1;
    let env = CloudEnv::start(cloud).await;
    let quick = |q: &mut QuestDB| {
        q.spec.node.as_mut().expect("node").rollback_window = Some("0s".into());
    };
    env.create("quiet-a", quick).await;
    env.create("quiet-b", quick).await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": NOISY}})).expect("namespace"),
        )
        .await
        .expect("noisy namespace");
    let noisy = Api::<QuestDB>::namespaced(env.client.clone(), NOISY);
    let hogs = ["hog-1", "hog-2", "hog-3"];
    for hog in hogs {
        let mut q = questdb_operator::desired::testing::questdb(hog, NOISY);
        q.metadata.uid = None;
        q.metadata.resource_version = None;
        q.metadata.generation = None;
        q.spec.node = env.qdbs().get("quiet-a").await.expect("quiet-a").spec.node;
        noisy
            .create(&Default::default(), &q)
            .await
            .expect("hog created");
    }
    for (api, name) in [(&env.qdbs(), "quiet-a"), (&env.qdbs(), "quiet-b")]
        .into_iter()
        .chain(hogs.iter().map(|h| (&noisy, *h)))
    {
        wait_for(api, name, &format!("{name} Ready"), is_ready()).await;
    }

    let normal = timed_move(&env, "quiet-a", NEW_AMI).await;
    // Its slot is free again before the noise starts (quiet-b is in the same namespace).
    wait_move_of(
        &env,
        "quiet-a",
        "quiet-a's move completed",
        "Completed",
        NEW_AMI,
    )
    .await;
    for hog in hogs {
        set_image_of(&env, NOISY, hog, NEVER_JOINS).await;
    }
    wait_for(
        &noisy,
        "hog-1",
        "a noisy move under way",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()?.node_move.clone())
                .is_some_and(|u| u.phase == "Provisioning")
        },
    )
    .await;
    let loaded = timed_move(&env, "quiet-b", NEW_AMI).await;
    eprintln!(
        "another tenant's move: normal {:.1}s, beside three stuck moves {:.1}s",
        normal.as_secs_f64(),
        loaded.as_secs_f64()
    );
    assert!(
        loaded <= normal * 2,
        "{loaded:?} beside stuck moves, {normal:?} normally"
    );
    env.stop().await;
}

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

mod benchmark;
mod detection;
mod fencing;
mod moves;
mod release;
mod restarts;

/// Detection (10 s) + the cluster's own timings: node grace, pod GC period (20 s), detach,
/// attach, pod start; generous for a loaded 2-core machine.
pub(super) const FAILOVER_TIMEOUT: Duration = Duration::from_secs(240);

pub(super) fn failover_phase(q: &QuestDB) -> Option<String> {
    q.status
        .as_ref()?
        .failover
        .as_ref()
        .map(|f| f.phase.to_string())
}

/// The record of `db1`'s failover, once one has started.
pub(super) async fn failover_started(env: &CloudEnv) -> questdb_operator::api::FailoverStatus {
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
pub(super) struct Running {
    uid: String,
    instance: String,
    node: String,
    pvc_uid: String,
}

/// Creates `db1` with a 10 s threshold and waits until it runs.
pub(super) async fn running_database(env: &CloudEnv) -> Running {
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
pub(super) fn two_writer_watch(
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
pub(super) async fn assert_moved(env: &CloudEnv, old_id: &str, pvc_uid: &str) {
    assert_moved_within(env, old_id, pvc_uid, FAILOVER_TIMEOUT).await
}

pub(super) async fn assert_moved_within(
    env: &CloudEnv,
    old_id: &str,
    pvc_uid: &str,
    timeout: Duration,
) {
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

/// What EC2 or EBS does wrong during a partition test.
pub(super) enum Fault {
    None,
    HangStops,
    OmittedFromFilters,
    DetachSticks,
}

/// Pauses `db1` and waits until its node is released.
pub(super) async fn pause_until_released(env: &CloudEnv, timeout: Duration) {
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
pub(super) async fn database_on_a_dead_node() -> (CloudEnv, String) {
    let env = CloudEnv::start(settings()).await;
    let Running { uid, node, .. } = running_database(&env).await;
    env.cp.node(&node).expect("kubelet").partition();
    (env, uid)
}

pub(super) async fn assert_fenced_and_released(env: CloudEnv, uid: &str) {
    assert!(env.live_instances_of(uid).is_empty());
    assert!(
        env.cloud.ec2.call_count("StopInstances") >= 1,
        "fenced first"
    );
    env.stop().await;
}

/// The manager was killed right after recording each of `steps` (kill-at-every-step kills at
/// every step the machine records: a step missing here was never recorded, or skipped).
pub(super) fn assert_killed_at(killed: &std::collections::BTreeSet<String>, steps: &[&str]) {
    let missing: Vec<&&str> = steps.iter().filter(|s| !killed.contains(**s)).collect();
    assert!(
        missing.is_empty(),
        "never killed at {missing:?}; killed at {killed:?}"
    );
}

pub(super) const NEW_AMI: &str = "ami-0fedcba9876543210";

pub(super) fn node_move_of(q: Option<&QuestDB>) -> Option<questdb_operator::api::NodeMoveStatus> {
    q?.status.as_ref()?.node_move.clone()
}

/// The usual cluster with `n` more shared workers: a larger cluster's breaker lets two
/// silent nodes through where the small one's counts them an outage.
pub(super) async fn with_more_workers(n: usize) -> CloudEnv {
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

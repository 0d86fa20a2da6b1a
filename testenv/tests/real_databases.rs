//! With `Databases::Real` the kubelet stand-in runs a real QuestDB for a database pod: data
//! written through it survives the pod moving to another node, a config QuestDB rejects shows
//! as a kubelet shows a crashing container, and node faults act on the process as they would
//! on a machine. Needs Java 17 (the QuestDB jars come from the local Maven repository).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use questdb_testenv::database::http_get;
use questdb_testenv::{ControlPlane, ControlPlaneOptions, Databases, NodeRegistration};
use serde_json::{json, Value};

const IMAGE: &str = "questdb/questdb:9.2.0";
/// A first start on an empty root takes 8-9 s alone; two cores shared with builds, more.
const START_TIMEOUT: Duration = Duration::from_secs(180);
const TIMEOUT: Duration = Duration::from_secs(90);
const SERVER_CONF: &str = "http.net.bind.to=0.0.0.0:9000\nhttp.min.enabled=true\nhttp.min.net.bind.to=0.0.0.0:9003\npg.net.bind.to=0.0.0.0:8812\nline.tcp.net.bind.to=0.0.0.0:9009\n";

async fn start() -> ControlPlane {
    ControlPlane::start(ControlPlaneOptions {
        nodes: vec![
            NodeRegistration::worker("worker-a1", "sim-zone-a"),
            NodeRegistration::worker("worker-a2", "sim-zone-a"),
        ],
        databases: Databases::Real,
        ..ControlPlaneOptions::empty()
    })
    .await
    .unwrap()
}

/// Polls `probe` until it returns `Some`, failing with `what` and the pod's QuestDB log.
async fn wait_for<T, F, Fut>(
    cp: &ControlPlane,
    (ns, pod): (&str, &str),
    what: &str,
    timeout: Duration,
    mut probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}\n{}",
            cp.database_log(ns, pod)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn create<K>(client: &Client, ns: &str, object: Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).unwrap();
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

async fn namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

async fn config(client: &Client, ns: &str, server_conf: &str) {
    create::<ConfigMap>(
        client,
        ns,
        json!({"metadata": {"name": "db"}, "data": {"server.conf": server_conf}}),
    )
    .await;
}

async fn claim(client: &Client, ns: &str) {
    create::<PersistentVolumeClaim>(
        client,
        ns,
        json!({"metadata": {"name": "db-data"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": "gp3", "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
}

fn status_probe(period: i32, timeout: i32, failures: i32) -> Value {
    json!({"httpGet": {"path": "/status", "port": "health"}, "periodSeconds": period,
           "timeoutSeconds": timeout, "failureThreshold": failures})
}

/// The pod the operator's StatefulSet renders (core/src/desired/statefulset.rs), pinned to `node`;
/// the HTTP port is also a host port, as on a dedicated node.
fn database_pod(node: &str, image: &str) -> Value {
    json!({
        "metadata": {"name": "db-0", "labels": {"app": "db"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 60,
            "initContainers": [{"name": "init-conf", "image": image,
                "command": ["mkdir", "-p", "/var/lib/questdb/conf"],
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/questdb"}]}],
            "containers": [{
                "name": "questdb", "image": image,
                "ports": [
                    {"name": "http", "containerPort": 9000, "hostPort": 9000, "protocol": "TCP"},
                    {"name": "pgwire", "containerPort": 8812, "protocol": "TCP"},
                    {"name": "ilp", "containerPort": 9009, "protocol": "TCP"},
                    {"name": "health", "containerPort": 9003, "protocol": "TCP"},
                ],
                "volumeMounts": [
                    {"name": "data", "mountPath": "/var/lib/questdb"},
                    {"name": "config", "mountPath": "/var/lib/questdb/conf/server.conf",
                     "subPath": "server.conf", "readOnly": true},
                ],
                "startupProbe": status_probe(10, 5, 180),
                "readinessProbe": status_probe(5, 3, 3),
                "livenessProbe": status_probe(10, 5, 6),
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "db-data"}},
                {"name": "config", "configMap": {"name": "db"}},
            ],
        },
    })
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod `db-0` once it is Ready (and the pod's uid differs from `not_uid`).
async fn ready_pod(cp: &ControlPlane, pods: &Api<Pod>, ns: &str, not_uid: Option<&str>) -> Pod {
    wait_for(cp, (ns, "db-0"), "db-0 Ready", START_TIMEOUT, || async {
        let p = pods.get_opt("db-0").await.ok().flatten()?;
        (ready(&p) && p.metadata.uid.as_deref() != not_uid).then_some(p)
    })
    .await
}

fn pod_ip(pod: &Pod) -> String {
    pod.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

/// A query through `/exec` on `addr` (`host:port`): the JSON answer.
async fn exec(addr: &str, query: &str) -> anyhow::Result<Value> {
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    // A QuestDB that has just started on a loaded 2-core machine may take a while to answer
    // its first query: unanswered attempts are retried (three in all), an answer never is.
    let path = format!("/exec?query={encoded}");
    let mut attempt = 0;
    let (code, body) = loop {
        attempt += 1;
        match http_get(addr, &path, Duration::from_secs(20)).await {
            Ok(answer) => break answer,
            Err(e) if attempt >= 3 => return Err(e),
            Err(_) => continue,
        }
    };
    anyhow::ensure!(code == 200, "{query}: HTTP {code}: {body}");
    Ok(serde_json::from_str(&body)?)
}

async fn count(addr: &str) -> Option<i64> {
    exec(addr, "select count() from t").await.ok()?["dataset"][0][0].as_i64()
}

async fn gone(pods: &Api<Pod>) -> bool {
    pods.get_opt("db-0").await.ok().flatten().is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_written_before_a_pod_moves_to_another_node_are_all_there_after_the_move() {
    let cp = start().await;
    let client = cp.client().await;
    let ns = "move";
    namespace(&client, ns).await;
    config(&client, ns, SERVER_CONF).await;
    claim(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let started = std::time::Instant::now();
    create::<Pod>(&client, ns, database_pod("worker-a1", IMAGE)).await;
    let first = ready_pod(&cp, &pods, ns, None).await;
    eprintln!(
        "first start Ready after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let ip = pod_ip(&first);
    let http = format!("{ip}:9000");
    exec(
        &http,
        "create table t (x long, ts timestamp) timestamp(ts) partition by day wal",
    )
    .await
    .unwrap();
    for batch in 0..5 {
        exec(
            &http,
            &format!("insert into t select x + {}, timestamp_sequence(0, 1000000) from long_sequence(200)", batch * 200),
        )
        .await
        .unwrap();
    }
    wait_for(&cp, (ns, "db-0"), "1000 rows visible", TIMEOUT, || async {
        (count(&http).await == Some(1000)).then_some(())
    })
    .await;
    let running = cp.database_processes();
    assert_eq!(running.len(), 1, "{running:?}");
    let rss = std::fs::read_to_string(format!("/proc/{}/status", running[0].pid))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or_default()
        .to_string();
    eprintln!("QuestDB with 1000 rows: {rss}");

    // The node's address answers on the host port, for as long as the pod runs there.
    let node_ip = cp.node("worker-a1").unwrap().internal_ip();
    let via_host = exec(&format!("{node_ip}:9000"), "select count() from t")
        .await
        .unwrap();
    assert_eq!(via_host["dataset"][0][0], 1000, "{via_host}");

    let stopping = std::time::Instant::now();
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    wait_for(&cp, (ns, "db-0"), "db-0 deleted", TIMEOUT, || async {
        gone(&pods).await.then_some(())
    })
    .await;
    eprintln!(
        "graceful stop and pod deletion took {:.1}s",
        stopping.elapsed().as_secs_f64()
    );
    let exits = cp.database_exits();
    assert_eq!(exits.len(), 1, "{exits:?}");
    assert_eq!(
        exits[0].signal, None,
        "QuestDB got the time to shut down cleanly (SIGTERM, not SIGKILL): {exits:?}"
    );
    assert!(cp.database_processes().is_empty());
    assert!(
        tokio::net::TcpStream::connect(format!("{node_ip}:9000"))
            .await
            .is_err(),
        "the host port is closed once the pod is gone"
    );

    create::<Pod>(&client, ns, database_pod("worker-a2", IMAGE)).await;
    let second = ready_pod(&cp, &pods, ns, first.metadata.uid.as_deref()).await;
    assert_eq!(
        second.spec.as_ref().unwrap().node_name.as_deref(),
        Some("worker-a2")
    );
    let moved = cp.database_processes();
    assert_eq!(moved.len(), 1);
    assert_eq!(
        moved[0].dir, running[0].dir,
        "the same volume, on another node"
    );
    let http = format!("{}:9000", pod_ip(&second));
    wait_for(
        &cp,
        (ns, "db-0"),
        "all 1000 rows after the move",
        TIMEOUT,
        || async { (count(&http).await == Some(1000)).then_some(()) },
    )
    .await;
    cp.assert_no_two_writers();

    // The claim goes, the volume (reclaim policy Delete) and its directory with it.
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .delete("db-data", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        &cp,
        (ns, "db-0"),
        "the volume's directory deleted",
        TIMEOUT,
        || async { (!moved[0].dir.exists()).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_value_questdb_rejects_shows_exit_55_and_crash_loop_with_the_log_tail() {
    let cp = start().await;
    let client = cp.client().await;
    let ns = "badconf";
    namespace(&client, ns).await;
    config(&client, ns, &format!("{SERVER_CONF}cairo.commit.lag=abc\n")).await;
    claim(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    create::<Pod>(&client, ns, database_pod("worker-a1", IMAGE)).await;
    let status = wait_for(
        &cp,
        (ns, "db-0"),
        "db-0 in CrashLoopBackOff after its second exit",
        START_TIMEOUT,
        || async {
            let p = pods.get_opt("db-0").await.ok().flatten()?;
            let s = p.status.clone()?;
            let c = s.container_statuses.clone()?.into_iter().next()?;
            let waiting = c.state.as_ref()?.waiting.as_ref()?.reason.clone()?;
            (waiting == "CrashLoopBackOff" && c.restart_count >= 2).then_some((s, c))
        },
    )
    .await;
    let (pod_status, container) = status;
    let last = container.last_state.unwrap().terminated.unwrap();
    assert_eq!(last.exit_code, 55, "{last:?}");
    assert_eq!(last.reason.as_deref(), Some("Error"));
    let message = last.message.unwrap_or_default();
    assert!(
        message.contains("invalid configuration value [key=cairo.commit.lag, value=abc]"),
        "the log tail says why: {message}"
    );
    assert!(message.len() <= 2048);
    let waiting = container.state.unwrap().waiting.unwrap();
    assert!(
        waiting.message.as_deref().is_some_and(
            |m| m.starts_with("back-off ") && m.contains("container=questdb pod=db-0_badconf(")
        ),
        "{waiting:?}"
    );
    assert_eq!(pod_status.phase.as_deref(), Some("Running"));
    assert!(!container.ready);
    assert!(cp.database_exits().iter().all(|e| e.code == Some(55)));
    cp.assert_no_two_writers();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_off_kills_questdb_at_once_a_cut_off_kubelet_leaves_it_writing_and_a_partition_unreachable(
) {
    let cp = start().await;
    let client = cp.client().await;
    let ns = "faults";
    namespace(&client, ns).await;
    // Synced commits: the volume layer keeps only what reached it, and the rows are counted
    // after the power cut (QuestDB's default, nosync, can lose them: benches/durability.rs).
    config(
        &client,
        ns,
        &format!("{SERVER_CONF}cairo.commit.mode=sync\n"),
    )
    .await;
    claim(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    create::<Pod>(&client, ns, database_pod("worker-a1", IMAGE)).await;
    let pod = ready_pod(&cp, &pods, ns, None).await;
    let http = format!("{}:9000", pod_ip(&pod));
    exec(
        &http,
        "create table t (x long, ts timestamp) timestamp(ts) partition by day wal",
    )
    .await
    .unwrap();
    let node = cp.node("worker-a1").unwrap();
    let pid = cp.database_processes()[0].pid;

    // The kubelet cut off from the API server: it is silent, but the database goes on serving
    // and writing.
    node.cut_kubelet_off();
    exec(
        &http,
        "insert into t select x, timestamp_sequence(0, 1000) from long_sequence(500)",
    )
    .await
    .unwrap();
    wait_for(
        &cp,
        (ns, "db-0"),
        "rows written during the partition",
        TIMEOUT,
        || async { (count(&http).await == Some(500)).then_some(()) },
    )
    .await;
    let live = cp.database_processes();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].pid, pid, "the same process, never restarted");
    node.heal();

    // Partitioned: nothing outside the node reaches the database (a connection that never
    // answers) until the partition heals; the process is the same throughout.
    node.partition();
    wait_for(
        &cp,
        (ns, "db-0"),
        "the partitioned node's database paused",
        TIMEOUT,
        || async {
            cp.database_processes()
                .iter()
                .all(|p| p.paused())
                .then_some(())
        },
    )
    .await;
    let unanswered = http_get(&http, "/exec?query=select%201", Duration::from_secs(3)).await;
    assert!(
        unanswered.is_err(),
        "a partitioned database answered: {unanswered:?}"
    );
    node.heal();
    wait_for(
        &cp,
        (ns, "db-0"),
        "the database answering again after the partition healed",
        TIMEOUT,
        || async { (count(&http).await == Some(500)).then_some(()) },
    )
    .await;
    assert_eq!(
        cp.database_processes()[0].pid,
        pid,
        "the same process after the partition"
    );

    // Powered off: the process dies at once, without a chance to shut down.
    node.power_off();
    wait_for(
        &cp,
        (ns, "db-0"),
        "QuestDB killed by the power-off",
        TIMEOUT,
        || async { cp.database_processes().is_empty().then_some(()) },
    )
    .await;
    let exits = cp.database_exits();
    assert_eq!(exits.len(), 1, "{exits:?}");
    assert_eq!((exits[0].pid, exits[0].signal), (pid, Some(9)), "{exits:?}");
    assert!(
        !cp.database_log(ns, "db-0").contains("QuestDB is shutdown"),
        "no clean shutdown"
    );

    // Power back: the kubelet starts the pod again; the acknowledged rows are there.
    node.heal();
    let back = wait_for(
        &cp,
        (ns, "db-0"),
        "db-0 Ready again",
        START_TIMEOUT,
        || async {
            let p = pods.get_opt("db-0").await.ok().flatten()?;
            let restarts = p.status.as_ref()?.container_statuses.as_ref()?[0].restart_count;
            (ready(&p) && restarts == 1).then_some(p)
        },
    )
    .await;
    assert_eq!(
        back.metadata.uid, pod.metadata.uid,
        "the same pod, started again"
    );
    assert_eq!(cp.database_processes().len(), 1);
    wait_for(
        &cp,
        (ns, "db-0"),
        "the 500 rows after the power cut",
        TIMEOUT,
        || async { (count(&http).await == Some(500)).then_some(()) },
    )
    .await;

    // The instance stops (EC2): its processes die with it.
    let pid = cp.database_processes()[0].pid;
    cp.kubelets().instance_stopped("worker-a1");
    wait_for(
        &cp,
        (ns, "db-0"),
        "QuestDB killed with its instance",
        TIMEOUT,
        || async { cp.database_exits().into_iter().find(|e| e.pid == pid) },
    )
    .await;
    assert!(cp.database_processes().is_empty());
    let last = cp.database_exits().pop().unwrap();
    assert_eq!(last.signal, Some(9), "{last:?}");
    cp.assert_no_two_writers();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_fails_its_liveness_probe_is_restarted() {
    let cp = start().await;
    let client = cp.client().await;
    let ns = "liveness";
    namespace(&client, ns).await;
    config(&client, ns, SERVER_CONF).await;
    claim(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut pod = database_pod("worker-a1", IMAGE);
    // Nothing answers there: once started, the probe fails twice and the kubelet restarts it.
    pod["spec"]["containers"][0]["livenessProbe"] = json!({"httpGet": {"path": "/status",
        "port": 9999}, "periodSeconds": 1, "failureThreshold": 2});
    create::<Pod>(&client, ns, pod).await;
    let container = wait_for(
        &cp,
        (ns, "db-0"),
        "a restart after failed liveness probes",
        START_TIMEOUT,
        || async {
            let p = pods.get_opt("db-0").await.ok().flatten()?;
            let c = p.status?.container_statuses?.into_iter().next()?;
            (c.restart_count >= 1).then_some(c)
        },
    )
    .await;
    let last = container.last_state.unwrap().terminated.unwrap();
    assert_eq!(last.reason.as_deref(), Some("Error"), "{last:?}");
    let first = &cp.database_exits()[0];
    assert_eq!(
        first.signal, None,
        "stopped with SIGTERM and a clean shutdown: {first:?}"
    );
    assert_eq!(last.exit_code, first.code.unwrap());
    assert!(cp.database_log(ns, "db-0").contains("QuestDB is shutdown"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_pod_that_cannot_start_says_why_as_a_kubelet_does() {
    let cp = start().await;
    let client = cp.client().await;
    let ns = "nostart";
    namespace(&client, ns).await;
    config(&client, ns, SERVER_CONF).await;
    claim(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let waiting = |pods: Api<Pod>| async move {
        let p = pods.get_opt("db-0").await.ok().flatten()?;
        let c = p.status?.container_statuses?.into_iter().next()?;
        let w = c.state?.waiting?;
        Some((w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
    };

    // A version Maven does not serve is an image that cannot be pulled.
    create::<Pod>(
        &client,
        ns,
        database_pod("worker-a1", "questdb/questdb:9.0.0"),
    )
    .await;
    let (reason, message) = wait_for(&cp, (ns, "db-0"), "ImagePullBackOff", TIMEOUT, || async {
        waiting(pods.clone())
            .await
            .filter(|(r, _)| r == "ImagePullBackOff")
    })
    .await;
    assert!(message.contains("9.0.0"), "{reason}: {message}");
    assert!(cp.database_processes().is_empty());
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    wait_for(&cp, (ns, "db-0"), "db-0 deleted", TIMEOUT, || async {
        gone(&pods).await.then_some(())
    })
    .await;

    // A Secret the environment names, missing, then without the key.
    let mut pod = database_pod("worker-a1", IMAGE);
    pod["spec"]["containers"][0]["env"] = json!([{"name": "QDB_PG_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "db-pg", "key": "password"}}}]);
    create::<Pod>(&client, ns, pod).await;
    let (_, message) = wait_for(
        &cp,
        (ns, "db-0"),
        "CreateContainerConfigError",
        TIMEOUT,
        || async {
            waiting(pods.clone())
                .await
                .filter(|(r, _)| r == "CreateContainerConfigError")
        },
    )
    .await;
    assert_eq!(message, "secret \"db-pg\" not found");
    create::<Secret>(
        &client,
        ns,
        json!({"metadata": {"name": "db-pg"}, "stringData": {"user": "admin"}}),
    )
    .await;
    wait_for(
        &cp,
        (ns, "db-0"),
        "the missing key reported",
        TIMEOUT,
        || async {
            waiting(pods.clone())
                .await
                .filter(|(_, m)| m == "couldn't find key password in Secret nostart/db-pg")
        },
    )
    .await;
    assert!(cp.database_processes().is_empty());

    // With the key, it starts and uses it.
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            "db-pg",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "s3cret"}})),
        )
        .await
        .unwrap();
    let pod = ready_pod(&cp, &pods, ns, None).await;
    let params = exec(&format!("{}:9000", pod_ip(&pod)), "show parameters")
        .await
        .unwrap();
    let column = |name: &str| {
        params["columns"]
            .as_array()
            .unwrap()
            .iter()
            .position(|c| c["name"] == name)
            .unwrap()
    };
    let (key, source) = (column("property_path"), column("value_source"));
    let row = params["dataset"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[key] == "pg.password")
        .unwrap();
    assert_eq!(
        row[source], "env",
        "the password came from the Secret: {row}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_service_taint_on_a_partitioned_node_that_still_runs_questdb_is_caught_as_two_writers(
) {
    let cp = start().await;
    let client = cp.client().await;
    let ns = "fence";
    namespace(&client, ns).await;
    config(&client, ns, SERVER_CONF).await;
    claim(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    create::<Pod>(&client, ns, database_pod("worker-a1", IMAGE)).await;
    let first = ready_pod(&cp, &pods, ns, None).await;
    let old = cp.database_processes()[0].clone();

    // Cut off, force-deleted: the API forgets the pod, the node does not. The volume then
    // detaches from under the running database (one of EBS's two outcomes; the other, a
    // detach stuck `busy`, would keep the second writer out).
    cp.csi
        .detach_while_mounted
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let a1 = cp.node("worker-a1").unwrap();
    a1.partition();
    pods.delete(
        "db-0",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(cp.database_processes()[0].pid, old.pid, "still running");

    // Declaring the node shut down while it is not: the volume is detached from under it.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    wait_for(&cp, (ns, "db-0"), "worker-a1 NotReady", TIMEOUT, || async {
        let n = nodes.get("worker-a1").await.ok()?;
        let ready = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status != "True").then_some(())
    })
    .await;
    wait_for(
        &cp,
        (ns, "db-0"),
        "worker-a1 tainted out-of-service",
        TIMEOUT,
        || async { a1.taint_out_of_service(&client).await.then_some(()) },
    )
    .await;
    create::<Pod>(&client, ns, database_pod("worker-a2", IMAGE)).await;
    let violations = wait_for(
        &cp,
        (ns, "db-0"),
        "the second writer recorded",
        TIMEOUT,
        || async {
            let v = cp.two_writer_violations();
            (!v.is_empty()).then_some(v)
        },
    )
    .await;
    assert!(
        violations[0].contains("worker-a1")
            && violations[0].contains("worker-a2")
            && violations[0].contains(&old.dir.display().to_string()),
        "{violations:?}"
    );
    // Nothing holds the second one back: each node mounts the volume through its own layer,
    // as two hosts have two kernels, so QuestDB's lock on the first host's root is not seen
    // on the second (the lock refusal the shared page cache of plain directories used to show
    // here is something no two EC2 instances would show). Both run: only the registry, and
    // the operator's fence in production, stand between them.
    wait_for(
        &cp,
        (ns, "db-0"),
        "both QuestDB processes running on the one volume",
        TIMEOUT,
        || async {
            let live = cp.database_processes();
            (live
                .iter()
                .any(|p| p.pid == old.pid && p.node == "worker-a1")
                && live
                    .iter()
                    .any(|p| p.node == "worker-a2" && p.dir == old.dir))
            .then_some(())
        },
    )
    .await;

    // Back on the network, the old kubelet stops what the API no longer has.
    a1.heal();
    wait_for(
        &cp,
        (ns, "db-0"),
        "the old QuestDB stopped",
        TIMEOUT,
        || async {
            cp.database_exits()
                .iter()
                .any(|e| e.pid == old.pid)
                .then_some(())
        },
    )
    .await;
    assert_ne!(first.metadata.uid, None);
}

/// A token for a new ServiceAccount `<ns>/stats-reader` granted `get` on `nodes/stats`.
async fn stats_reader_token(client: &Client, ns: &str) -> String {
    questdb_testenv::kubelet_api::service_account_token(client, ns, "stats-reader", true)
        .await
        .expect("a ServiceAccount token")
}

/// The `volume` entry of pod `ns/pod`'s claim volume `volume` in the Summary of the node at
/// `ip`, if the kubelet reports one.
async fn volume_stats(
    ip: &str,
    token: &str,
    ca: &str,
    (ns, pod, volume): (&str, &str, &str),
) -> Option<Value> {
    let (code, body) = questdb_testenv::kubelet_api::get(
        ip,
        "/stats/summary",
        Some(token),
        ca,
        Duration::from_secs(20),
    )
    .await
    .ok()?;
    assert_eq!(code, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).unwrap();
    let pods = summary["pods"].as_array()?;
    let entry = pods
        .iter()
        .find(|p| p["podRef"]["namespace"] == ns && p["podRef"]["name"] == pod)?;
    entry["volume"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == volume)
        .cloned()
}

/// `fallocate(2)` of `len` bytes for a new file `path`: the errno when the file system refuses.
fn fallocate(path: &std::path::Path, len: u64) -> Result<(), i32> {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::File::create(path).unwrap();
    // SAFETY: a valid descriptor; no memory is passed.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    drop(file);
    std::fs::remove_file(path).unwrap();
    if r == 0 {
        Ok(())
    } else {
        Err(errno)
    }
}

const MIB: u64 = 1 << 20;

/// A claim of the XFS class has a file system of the claim's size, which the kubelet's Summary
/// API reports (as its statfs does) and which fills up; grown (the claim's request raised),
/// the same running QuestDB sees the larger file system, and what did not fit now fits. Its
/// volume's loop device and image go with its PV, and nothing is left attached after the
/// control plane stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_the_xfs_class_fills_up_and_grows_under_the_running_database() {
    let cp = start().await;
    let client = cp.client().await;
    let ns = "grow";
    namespace(&client, ns).await;
    config(&client, ns, SERVER_CONF).await;
    create::<PersistentVolumeClaim>(
        &client,
        ns,
        json!({"metadata": {"name": "db-data"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": questdb_testenv::csi::SIZED_STORAGE_CLASS,
            "resources": {"requests": {"storage": "320Mi"}}}}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    create::<Pod>(&client, ns, database_pod("worker-a1", IMAGE)).await;
    let pod = ready_pod(&cp, &pods, ns, None).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pv_name = claims
        .get("db-data")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    let csi = pvs.get(&pv_name).await.unwrap().spec.unwrap().csi.unwrap();
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    let dir = cp.volume_dir(&csi.volume_handle).unwrap();
    let pid = cp.database_processes()[0].pid;

    let token = stats_reader_token(&client, ns).await;
    let (ca, ip) = (
        cp.kubelet_ca_pem(),
        cp.node("worker-a1").unwrap().internal_ip(),
    );
    let stats = || volume_stats(&ip, &token, &ca, (ns, "db-0", "data"));
    let before = wait_for(&cp, (ns, "db-0"), "the volume's figures", TIMEOUT, stats).await;
    eprintln!("320Mi volume with QuestDB started: {before}");
    assert_eq!(
        before["pvcRef"],
        json!({"name": "db-data", "namespace": ns})
    );
    let figure = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    let capacity = figure(&before, "capacityBytes");
    // XFS keeps its log (64 MiB here) out of the capacity statfs reports.
    assert!(
        (200 * MIB..=320 * MIB).contains(&capacity),
        "capacity {capacity}"
    );
    // QuestDB allocates its files' space as it starts (~220 MiB: a 320 MiB claim starts with
    // ~15% free).
    let used = figure(&before, "usedBytes");
    assert!(
        used > 100 * MIB && used + figure(&before, "availableBytes") <= capacity,
        "{before}"
    );
    assert!(figure(&before, "inodes") > figure(&before, "inodesFree"));
    let available = figure(&before, "availableBytes");
    let too_much = available + 64 * MIB;
    assert_eq!(
        fallocate(&dir.join("filler"), too_much),
        Err(libc::ENOSPC),
        "{too_much} bytes on a volume with {available} available"
    );

    claims
        .patch(
            "db-data",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "640Mi"}}}})),
        )
        .await
        .unwrap();
    let after = wait_for(&cp, (ns, "db-0"), "the volume grown", TIMEOUT, || async {
        let v = stats().await?;
        (figure(&v, "capacityBytes") >= capacity + 300 * MIB).then_some(v)
    })
    .await;
    eprintln!("grown to 640Mi: {after}");
    // As a real kubelet, the stand-in records the claim's new capacity after the file system
    // grew (node expansion finished): the claim says 640Mi shortly after the mount does.
    let capacity = wait_for(
        &cp,
        (ns, "db-0"),
        "the claim's capacity",
        TIMEOUT,
        || async {
            let claim = claims.get("db-data").await.ok()?;
            let capacity = claim.status?.capacity?.get("storage")?.0.clone();
            (capacity != "320Mi").then_some(capacity)
        },
    )
    .await;
    assert_eq!(capacity, "640Mi");
    let live = cp.database_processes();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].pid, pid, "the same process, never restarted");
    assert_eq!(fallocate(&dir.join("filler"), too_much), Ok(()));
    let http = format!("{}:9000", pod_ip(&pod));
    exec(&http, "create table if not exists t (x long)")
        .await
        .unwrap();
    assert_eq!(
        count(&http).await,
        Some(0),
        "QuestDB answers after the grow"
    );

    // Deleted with its PV: unmounted, detached, its image gone.
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    claims
        .delete("db-data", &DeleteParams::default())
        .await
        .unwrap();
    let images = cp.dir().join("volume-images");
    let image_count = || {
        std::fs::read_dir(&images)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".img"))
            .count()
    };
    wait_for(&cp, (ns, "db-0"), "the volume deleted", TIMEOUT, || async {
        (!dir.exists() && image_count() == 0).then_some(())
    })
    .await;
    cp.assert_no_two_writers();

    // A second volume left in use: the control plane's stop detaches it.
    create::<PersistentVolumeClaim>(
        &client,
        ns,
        json!({"metadata": {"name": "db-data"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": questdb_testenv::csi::SIZED_STORAGE_CLASS,
            "resources": {"requests": {"storage": "300Mi"}}}}),
    )
    .await;
    create::<Pod>(&client, ns, database_pod("worker-a2", IMAGE)).await;
    wait_for(&cp, (ns, "db-0"), "a second image", TIMEOUT, || async {
        (image_count() == 1).then_some(())
    })
    .await;
    let root = cp.dir().to_path_buf();
    drop(cp);
    let attached: Vec<String> = std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|b| b.starts_with(root.to_str().unwrap()))
        .collect();
    assert!(attached.is_empty(), "loop devices left: {attached:?}");
}

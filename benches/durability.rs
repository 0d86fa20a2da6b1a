//! What a power cut costs a real QuestDB under each `cairo.commit.mode` (issue 45): rows
//! acknowledged and rows found after the power comes back, and rows per second, for ILP over
//! HTTP and for pgwire INSERTs, on the test volume layer that loses what the node's kernel had
//! not written back (`lossyfs`, see `questdb_testenv::database::VolumeLayer`).
//!
//! ```text
//! cargo bench --profile dev --bench durability                    # 5 runs per mode and protocol
//! cargo bench --profile dev --bench durability -- --runs 2 --write 6
//! cargo bench --profile dev --bench durability -- --mode nosync --protocol ilp-http
//! QDB_TEST_PLAIN_VOLUMES=1 cargo bench --profile dev --bench durability -- ...  # the layer's cost
//! ```
//!
//! With `QDB_TEST_PLAIN_VOLUMES=1` the volumes are plain directories: nothing is lost at the
//! cut (the host's page cache keeps it), which is what the layer's cost is measured against
//! (each run's line also gives QuestDB's first start to Ready).
//!
//! Each run: a QuestDB 9.2.0 pod on one node (the operator's pod shape, the mode in its
//! `server.conf`), a WAL table, one client that sends a batch, waits for the answer, and sends
//! the next (`--batch` rows each, every row numbered), for `--write` seconds; then the node's
//! power goes while the client writes. The power comes back, the kubelet starts QuestDB again
//! on what reached the volume, and once the WAL is applied the bench counts the acknowledged
//! rows that are there. Acknowledged batches form a prefix (one batch in flight at a time), so
//! "kept" is the rows numbered below the acknowledged count. Rows per second are the
//! acknowledged rows over the writing time: one client, one batch in flight, on this machine.
//!
//! Prints a line per run, then a table per mode and protocol, then one JSON line.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use questdb_testenv::database::http_get;
use questdb_testenv::{ControlPlane, ControlPlaneOptions, Databases, NodeRegistration};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const IMAGE: &str = "questdb/questdb:9.2.0";
const NODE: &str = "worker-a1";
const START_TIMEOUT: Duration = Duration::from_secs(240);
const MODES: [&str; 3] = ["nosync", "async", "sync"];
const PROTOCOLS: [&str; 2] = ["ilp-http", "pgwire"];

struct Args {
    runs: usize,
    write: Duration,
    batch: i64,
    modes: Vec<&'static str>,
    protocols: Vec<&'static str>,
}

fn args() -> Args {
    let mut a = Args {
        runs: 5,
        write: Duration::from_secs(8),
        batch: 100,
        modes: MODES.to_vec(),
        protocols: PROTOCOLS.to_vec(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let next = || argv.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match argv[i].as_str() {
            "--runs" => a.runs = next().expect("--runs N") as usize,
            "--write" => a.write = Duration::from_secs(next().expect("--write SECONDS")),
            "--batch" => a.batch = next().expect("--batch ROWS") as i64,
            "--mode" => {
                let m = argv.get(i + 1).expect("--mode nosync|async|sync");
                a.modes = MODES.into_iter().filter(|x| x == m).collect();
            }
            "--protocol" => {
                let p = argv.get(i + 1).expect("--protocol ilp-http|pgwire");
                a.protocols = PROTOCOLS.into_iter().filter(|x| x == p).collect();
            }
            _ => {}
        }
        i += 1;
    }
    a
}

#[derive(Debug, Clone)]
struct Run {
    mode: &'static str,
    protocol: &'static str,
    acknowledged: i64,
    kept: i64,
    rows_per_second: f64,
    /// From the pod's creation to Ready on an empty volume.
    first_start: Duration,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = args();
    let cp = ControlPlane::start(ControlPlaneOptions {
        nodes: vec![NodeRegistration::worker(NODE, "sim-zone-a")],
        databases: Databases::Real,
        ..ControlPlaneOptions::empty()
    })
    .await?;
    let client = cp.client().await;
    let mut runs = vec![];
    for mode in args.modes.clone() {
        for protocol in args.protocols.clone() {
            for n in 0..args.runs {
                let ns = format!("{mode}-{protocol}-{n}");
                let run = one_run(&cp, &client, &ns, mode, protocol, &args).await?;
                println!(
                    "run {mode:>6} {protocol:>8} #{n}: {} acknowledged, {} kept, {} lost, {:.0} rows/s, first start to Ready {:.1} s",
                    run.acknowledged,
                    run.kept,
                    run.acknowledged - run.kept,
                    run.rows_per_second,
                    run.first_start.as_secs_f64()
                );
                runs.push(run);
            }
        }
    }
    println!();
    println!("| commit mode | protocol | runs | rows acknowledged | rows lost at the cut (min / median / max) | rows per second (median) |");
    println!("|---|---|---|---|---|---|");
    let mut summary = vec![];
    for mode in args.modes.clone() {
        for protocol in args.protocols.clone() {
            let of: Vec<&Run> = runs
                .iter()
                .filter(|r| r.mode == mode && r.protocol == protocol)
                .collect();
            let mut lost: Vec<i64> = of.iter().map(|r| r.acknowledged - r.kept).collect();
            lost.sort();
            let mut rate: Vec<f64> = of.iter().map(|r| r.rows_per_second).collect();
            rate.sort_by(f64::total_cmp);
            let acknowledged: i64 = of.iter().map(|r| r.acknowledged).sum();
            let median = |v: &[i64]| v.get(v.len() / 2).copied().unwrap_or_default();
            println!(
                "| {mode} | {protocol} | {} | {acknowledged} | {} / {} / {} | {:.0} |",
                of.len(),
                lost.first().copied().unwrap_or_default(),
                median(&lost),
                lost.last().copied().unwrap_or_default(),
                rate.get(rate.len() / 2).copied().unwrap_or_default()
            );
            summary.push(json!({"mode": mode, "protocol": protocol, "runs": of.len(),
                "acknowledged": acknowledged, "lost": lost, "rows_per_second": rate}));
        }
    }
    println!("{}", json!({"durability": summary}));
    drop(cp);
    Ok(())
}

async fn one_run(
    cp: &ControlPlane,
    client: &Client,
    ns: &str,
    mode: &'static str,
    protocol: &'static str,
    args: &Args,
) -> anyhow::Result<Run> {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let conf = format!(
        "http.net.bind.to=0.0.0.0:9000\nhttp.min.enabled=true\nhttp.min.net.bind.to=0.0.0.0:9003\npg.net.bind.to=0.0.0.0:8812\nline.tcp.net.bind.to=0.0.0.0:9009\ncairo.commit.mode={mode}\n"
    );
    create::<ConfigMap>(
        client,
        Some(ns),
        json!({"metadata": {"name": "db"}, "data": {"server.conf": conf}}),
    )
    .await?;
    create::<PersistentVolumeClaim>(
        client,
        Some(ns),
        json!({"metadata": {"name": "db-data"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": "gp3", "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await?;
    let created = Instant::now();
    create::<Pod>(client, Some(ns), database_pod()).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = ready(cp, &pods, ns, 0).await?;
    let first_start = created.elapsed();
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    let http = format!("{ip}:9000");
    exec(
        &http,
        "create table t (id long, ts timestamp) timestamp(ts) partition by hour wal",
    )
    .await?;
    let started = Instant::now();
    let acknowledged = match protocol {
        "ilp-http" => write_ilp(&http, args).await?,
        _ => write_pgwire(&ip, args).await?,
    };
    let wrote_for = started.elapsed();
    let node = cp.node(NODE).expect("the node");
    // The cut: while the last batch may still be in flight (the writers return at once).
    node.power_off();
    wait(cp, ns, "QuestDB gone with the power", || async {
        cp.database_processes().is_empty()
    })
    .await?;
    node.heal();
    ready(cp, &pods, ns, 1).await?;
    wait(cp, ns, "the WAL applied after the restart", || async {
        exec(
            &http,
            "select * from wal_tables() where writerTxn = sequencerTxn and not suspended",
        )
        .await
        .is_ok_and(|v| v["dataset"].as_array().is_some_and(|d| !d.is_empty()))
    })
    .await?;
    let kept = exec(
        &http,
        &format!("select count() from t where id < {acknowledged}"),
    )
    .await?["dataset"][0][0]
        .as_i64()
        .unwrap_or_default();
    Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await?;
    wait(cp, ns, "the pod gone", || async {
        pods.get_opt("db-0").await.ok().flatten().is_none()
    })
    .await?;
    Ok(Run {
        mode,
        protocol,
        acknowledged,
        kept,
        rows_per_second: acknowledged as f64 / wrote_for.as_secs_f64(),
        first_start,
    })
}

/// Batches over ILP/HTTP until `args.write` has passed; the rows acknowledged (204).
async fn write_ilp(http: &str, args: &Args) -> anyhow::Result<i64> {
    let until = Instant::now() + args.write;
    let mut acknowledged = 0i64;
    while Instant::now() < until {
        let lines: String = (acknowledged..acknowledged + args.batch)
            .map(|i| format!("t id={i}i {}\n", 1_700_000_000_000_000_000i64 + i * 1000))
            .collect();
        let (code, body) =
            support::http::post(http, "/write", None, &lines, Duration::from_secs(30)).await?;
        anyhow::ensure!(code == 204, "ILP/HTTP answered {code}: {body}");
        acknowledged += args.batch;
    }
    Ok(acknowledged)
}

/// Multi-row INSERTs through one `psql` session (pgwire), one statement in flight: each
/// `INSERT 0 n` it prints is an acknowledgement, in order.
async fn write_pgwire(ip: &str, args: &Args) -> anyhow::Result<i64> {
    let mut psql = tokio::process::Command::new("psql")
        .args([
            "-h",
            ip,
            "-p",
            "8812",
            "-U",
            "admin",
            "-d",
            "qdb",
            "-v",
            "ON_ERROR_STOP=1",
            "-q",
            "-o",
            "/dev/stdout",
        ])
        .env("PGPASSWORD", "quest")
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = psql.stdin.take().expect("stdin");
    let mut out = BufReader::new(psql.stdout.take().expect("stdout")).lines();
    let until = Instant::now() + args.write;
    let mut acknowledged = 0i64;
    while Instant::now() < until {
        let values: Vec<String> = (acknowledged..acknowledged + args.batch)
            .map(|i| format!("({i}, {})", 1_700_000_000_000_000i64 + i * 1000))
            .collect();
        // `\echo` after the statement: its line arrives once the INSERT was answered.
        let sql = format!("INSERT INTO t VALUES {};\n\\echo ack\n", values.join(","));
        stdin.write_all(sql.as_bytes()).await?;
        stdin.flush().await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(30), out.next_line()).await {
                Ok(Ok(Some(line))) if line.trim() == "ack" => break,
                Ok(Ok(Some(_))) => continue,
                other => anyhow::bail!("psql ended or hung: {other:?}"),
            }
        }
        acknowledged += args.batch;
    }
    drop(stdin);
    Ok(acknowledged)
}

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
    let (code, body) = http_get(
        addr,
        &format!("/exec?query={encoded}"),
        Duration::from_secs(20),
    )
    .await?;
    anyhow::ensure!(code == 200, "{query}: HTTP {code}: {body}");
    Ok(serde_json::from_str(&body)?)
}

async fn create<K>(client: &Client, ns: Option<&str>, object: Value) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object)?;
    let api: Api<K> = Api::namespaced(client.clone(), ns.unwrap_or("default"));
    api.create(&PostParams::default(), &object).await?;
    Ok(())
}

/// `db-0` Ready with `restarts` restarts.
async fn ready(cp: &ControlPlane, pods: &Api<Pod>, ns: &str, restarts: i32) -> anyhow::Result<Pod> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(p) = pods.get_opt("db-0").await.ok().flatten() {
            let s = p.status.clone().unwrap_or_default();
            let is_ready = s
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let count = s
                .container_statuses
                .iter()
                .flatten()
                .map(|c| c.restart_count)
                .next()
                .unwrap_or_default();
            if is_ready && count == restarts {
                return Ok(p);
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "db-0 not Ready after {restarts} restarts:\n{}",
            cp.database_log(ns, "db-0")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait<F, Fut>(cp: &ControlPlane, ns: &str, what: &str, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + START_TIMEOUT;
    while !probe().await {
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            cp.database_log(ns, "db-0")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The operator's pod shape (core/src/desired/statefulset.rs), pinned to the node.
fn database_pod() -> Value {
    support::pod::database_pod(IMAGE, NODE, json!([]), json!({}))
}

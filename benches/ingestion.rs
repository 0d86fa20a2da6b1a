//! The database is as fast under the operator as by hand (issue 51): ILP over HTTP ingestion
//! (rows per second) and a few queries against a QuestDB the operator runs with a memory limit,
//! and against a bare QuestDB pod tuned by hand to the same limit, side by side in one run on
//! the same machine, the same stand-in kubelet and the same volume layer. Rounds alternate the
//! two (operator, bare, operator, bare, ...) so that the machine's drift falls on both.
//!
//! ```text
//! cargo bench --profile dev --bench ingestion                  # 3 rounds, sync and nosync
//! cargo bench --profile dev --bench ingestion -- --rounds 1 --rows 1000000 --mode sync
//! cargo bench --profile dev --bench ingestion -- --writers 4 --batch 5000 --limit-mib 4096
//! ```
//!
//! The operator's database: a `QuestDB` with `resources.limits.memory` (and the same request),
//! as a user writes it; the operator derives the heap and QuestDB's RAM limit
//! (`desired::memory`), generates credentials and everything else it always does. The bare
//! one: the operator's pod shape without the operator (as `benches/durability.rs`), no login,
//! the same container limit, and by hand the heap and `ram.usage.limit.bytes` a person would
//! read off the same split. Both get the same `cairo.commit.mode` (the operator's through
//! `spec.config.commitMode`; its default is `sync`, QuestDB's `nosync`, and the two differ by
//! about 3x in rows per second, so comparing across modes would measure durability, not the
//! operator). The QuestDB binary, the JVM and the volume are the same, so a difference is what
//! the operator adds (its configuration, authentication, probes).
//!
//! Each run: a WAL table, `--rows` rows in all from `--writers` clients, each sending `--batch`
//! rows per ILP/HTTP request, one request in flight per client; rows per second are the rows
//! (all acknowledged, 204) over the time from the first request to the last answer. Once the
//! WAL is applied (the row count checked), each query runs 5 times on the same rows and its
//! median is kept. Prints a line per run, a table, then one JSON line.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use questdb_operator::api::QuestDB;
use questdb_operator::desired::memory::MemorySplit;
use questdb_operator::questdb_http;
use questdb_testenv::{ControlPlane, ControlPlaneOptions, Databases, NodeRegistration};
use serde_json::{json, Value};

use support::operator::{self, Operator};
use support::{cluster, wait};

const IMAGE: &str = "questdb/questdb:9.2.0";
const NODE: &str = "worker-a1";
const TIMEOUT: Duration = Duration::from_secs(300);
const QUERY_RUNS: usize = 5;
const TABLE: &str = "trades";
/// The queries timed once the rows are in: a full count, a time-bucketed aggregate, the latest
/// row per symbol, a filtered scan.
const QUERIES: [(&str, &str); 4] = [
    ("count", "select count() from trades"),
    (
        "sample by",
        "select ts, s, avg(v), max(v) from trades sample by 1m",
    ),
    (
        "latest on",
        "select * from trades latest on ts partition by s",
    ),
    (
        "filter",
        "select count(), sum(v) from trades where id % 7 = 0",
    ),
];

struct Args {
    rounds: usize,
    rows: i64,
    batch: i64,
    writers: usize,
    limit_mib: u64,
    modes: Vec<&'static str>,
}

const MODES: [&str; 2] = ["sync", "nosync"];

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        rounds: 3,
        rows: 3_000_000,
        batch: 2000,
        writers: 2,
        limit_mib: 2048,
        modes: MODES.to_vec(),
    };
    let number = |flag: &str, v: Option<String>| -> anyhow::Result<u64> {
        v.with_context(|| format!("{flag} needs a value"))?
            .parse()
            .with_context(|| format!("{flag}: not a number"))
    };
    for (flag, value) in support::args::flags(&[
        "--rounds",
        "--rows",
        "--batch",
        "--writers",
        "--limit-mib",
        "--mode",
    ])? {
        match flag.as_str() {
            "--rounds" => a.rounds = number(&flag, value)? as usize,
            "--rows" => a.rows = number(&flag, value)? as i64,
            "--mode" => {
                let m = value.context("--mode sync|nosync")?;
                a.modes = MODES.into_iter().filter(|x| *x == m).collect();
                anyhow::ensure!(!a.modes.is_empty(), "--mode: sync or nosync, not {m}");
            }
            "--batch" => a.batch = number(&flag, value)? as i64,
            "--writers" => a.writers = number(&flag, value)?.max(1) as usize,
            "--limit-mib" => a.limit_mib = number(&flag, value)?,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Operator,
    Bare,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Operator => "operator",
            Kind::Bare => "bare",
        }
    }
}

struct Run {
    kind: Kind,
    mode: &'static str,
    rows: i64,
    rows_per_second: f64,
    /// Median milliseconds of each of [`QUERIES`], in order.
    query_ms: Vec<f64>,
}

/// Where a run's database answers, and the login it wants.
struct Database {
    http: String,
    /// The ILP writers' `Authorization` header.
    authorization: Option<String>,
    /// The queries' client, with the same login.
    client: questdb_http::Database,
}

impl Database {
    fn at(ip: &str, login: Option<(&str, &str)>) -> anyhow::Result<Database> {
        let http = format!("{ip}:9000");
        let addr: SocketAddr = http.parse().context("the pod's address")?;
        Ok(Database {
            authorization: login.map(|(user, password)| {
                let token =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                format!("Basic {token}")
            }),
            client: questdb_http::Database::new(addr, login),
            http,
        })
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let split = MemorySplit::of(args.limit_mib << 20);
    println!(
        "memory limit {} MiB: heap {} MiB, ram.usage.limit.bytes {} (the operator's split; the bare pod gets the same by hand)",
        args.limit_mib,
        split.heap >> 20,
        split.native
    );
    let cp = ControlPlane::start(ControlPlaneOptions {
        nodes: vec![NodeRegistration::worker(NODE, "sim-zone-a")],
        databases: Databases::Real,
        ..ControlPlaneOptions::empty()
    })
    .await
    .context("starting the control plane")?;
    let client = cp.direct_client();
    cluster::install_crd(&client, TIMEOUT).await?;

    let mut op = operator::start_ready(
        &operator::binary()?,
        &cp.operator_kubeconfig_yaml(),
        TIMEOUT,
    )
    .await?;

    let mut runs = Vec::new();
    for mode in args.modes.clone() {
        for round in 0..args.rounds {
            for kind in [Kind::Operator, Kind::Bare] {
                let run = one_run(&cp, &client, &mut op, kind, mode, round, &args, &split).await?;
                println!(
                    "{mode} round {round} {:>8}: {} rows, {:.0} rows/s; queries (ms) {}",
                    kind.name(),
                    run.rows,
                    run.rows_per_second,
                    QUERIES
                        .iter()
                        .zip(&run.query_ms)
                        .map(|((name, _), ms)| format!("{name} {ms:.1}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                runs.push(run);
            }
        }
    }

    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or_default()
    };
    println!();
    println!(
        "| `cairo.commit.mode` | measure (median of {} runs each) | operator | bare, by hand | operator / bare |",
        args.rounds
    );
    println!("|---|---|---|---|---|");
    let mut summary = Vec::new();
    for mode in args.modes.clone() {
        let of = |kind: Kind, pick: &dyn Fn(&Run) -> f64| {
            median(
                runs.iter()
                    .filter(|r| r.kind == kind && r.mode == mode)
                    .map(pick)
                    .collect(),
            )
        };
        let ingest = (
            of(Kind::Operator, &|r| r.rows_per_second),
            of(Kind::Bare, &|r| r.rows_per_second),
        );
        println!(
            "| {mode} | ILP/HTTP rows per second ({} writers, {} rows per request) | {:.0} | {:.0} | {:.1}% |",
            args.writers,
            args.batch,
            ingest.0,
            ingest.1,
            100.0 * ingest.0 / ingest.1
        );
        let mut queries = Vec::new();
        for (i, (name, _)) in QUERIES.iter().enumerate() {
            let ms = (
                of(Kind::Operator, &|r| r.query_ms[i]),
                of(Kind::Bare, &|r| r.query_ms[i]),
            );
            // For a time, lower is better: the ratio is bare over operator, so that 100% or
            // more means as fast, as for the rows.
            println!(
                "| {mode} | `{name}` query, ms ({} rows) | {:.1} | {:.1} | {:.1}% |",
                args.rows,
                ms.0,
                ms.1,
                100.0 * ms.1 / ms.0
            );
            queries.push(json!({"query": name, "operator_ms": ms.0, "bare_ms": ms.1}));
        }
        summary.push(json!({"mode": mode,
            "rows_per_second": {"operator": ingest.0, "bare": ingest.1},
            "queries": queries}));
    }
    println!(
        "{}",
        json!({"ingestion": {"limit_mib": args.limit_mib, "rounds": args.rounds,
            "rows": args.rows, "writers": args.writers, "batch": args.batch,
            "modes": summary}})
    );
    drop(op);
    drop(cp);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn one_run(
    cp: &ControlPlane,
    client: &Client,
    op: &mut Operator,
    kind: Kind,
    mode: &'static str,
    round: usize,
    args: &Args,
    split: &MemorySplit,
) -> anyhow::Result<Run> {
    let ns = format!("{}-{mode}-{round}", kind.name());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let db = match kind {
        Kind::Operator => operators_database(client, op, &ns, mode, args).await?,
        Kind::Bare => bare_database(cp, client, &ns, mode, args, split).await?,
    };
    exec(
        &db,
        &format!("create table {TABLE} (id long, v double, s symbol, ts timestamp) timestamp(ts) partition by hour wal"),
    )
    .await?;
    let started = Instant::now();
    let writers: Vec<_> = (0..args.writers)
        .map(|w| {
            let http = db.http.clone();
            let authorization = db.authorization.clone();
            let (batch, writers) = (args.batch, args.writers as i64);
            // The rows split evenly; the first writers take the remainder.
            let rows = args.rows / writers + i64::from((w as i64) < args.rows % writers);
            tokio::spawn(async move {
                write_ilp(
                    &http,
                    authorization.as_deref(),
                    w as i64,
                    writers,
                    rows,
                    batch,
                )
                .await
            })
        })
        .collect();
    let mut rows = 0;
    for w in writers {
        rows += w.await??;
    }
    let wrote_for = started.elapsed();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let applied = exec(
            &db,
            &format!("select * from wal_tables() where name = '{TABLE}' and writerTxn = sequencerTxn and not suspended"),
        )
        .await
        .is_ok_and(|rows| !rows.is_empty());
        if applied {
            break;
        }
        if Instant::now() > deadline {
            bail!("{ns}: the WAL was not applied within {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let counted = exec(&db, &format!("select count() from {TABLE}"))
        .await?
        .first()
        .and_then(|row| row.first()?.as_i64())
        .unwrap_or_default();
    anyhow::ensure!(
        counted == rows,
        "{ns}: {rows} rows acknowledged, {counted} counted"
    );
    let mut query_ms = Vec::new();
    for (_, query) in QUERIES {
        let mut times = Vec::new();
        for _ in 0..QUERY_RUNS {
            let t = Instant::now();
            exec(&db, query).await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        query_ms.push(times[times.len() / 2]);
    }
    // Gone before the next run starts, so that two JVMs never share the machine.
    if kind == Kind::Operator {
        Api::<QuestDB>::namespaced(client.clone(), &ns)
            .delete("db", &DeleteParams::default())
            .await?;
    }
    Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await?;
    wait::until("the run's database pod gone", TIMEOUT, op, || async {
        pods.get_opt("db-0").await.ok().flatten().is_none()
    })
    .await?;
    Ok(Run {
        kind,
        mode,
        rows,
        rows_per_second: rows as f64 / wrote_for.as_secs_f64(),
        query_ms,
    })
}

/// A `QuestDB` as a user writes it, with the memory limit: Ready, and its address and login.
async fn operators_database(
    client: &Client,
    op: &mut Operator,
    ns: &str,
    mode: &str,
    args: &Args,
) -> anyhow::Result<Database> {
    let memory = format!("{}Mi", args.limit_mib);
    let qdb: QuestDB = serde_json::from_value(json!({
        "apiVersion": "crd.questdb.io/v1beta1",
        "kind": "QuestDB",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {
            "image": IMAGE,
            "volume": {"size": "10Gi"},
            "config": {"commitMode": mode},
            "resources": {"limits": {"memory": memory}, "requests": {"memory": memory}},
        },
    }))?;
    let qdbs: Api<QuestDB> = Api::namespaced(client.clone(), ns);
    qdbs.create(&PostParams::default(), &qdb).await?;
    wait::until("the operator's QuestDB Ready", TIMEOUT, op, || async {
        qdbs.get_opt("db").await.ok().flatten().is_some_and(|q| {
            q.status.is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
    })
    .await?;
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get("db-credentials")
        .await?;
    let data = secret.data.unwrap_or_default();
    let text = |k: &str| -> anyhow::Result<String> {
        let v = data.get(k).with_context(|| format!("{k} missing"))?;
        Ok(String::from_utf8(v.0.clone())?)
    };
    let (user, password) = (text("QDB_HTTP_USER")?, text("QDB_HTTP_PASSWORD")?);
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get("db-0")
        .await?;
    Database::at(&pod_ip(&pod)?, Some((&user, &password)))
}

/// The operator's pod shape without the operator, tuned by hand to the same limit.
async fn bare_database(
    cp: &ControlPlane,
    client: &Client,
    ns: &str,
    mode: &str,
    args: &Args,
    split: &MemorySplit,
) -> anyhow::Result<Database> {
    let conf = format!(
        "http.net.bind.to=0.0.0.0:9000\nhttp.min.enabled=true\nhttp.min.net.bind.to=0.0.0.0:9003\npg.net.bind.to=0.0.0.0:8812\nline.tcp.net.bind.to=0.0.0.0:9009\nram.usage.limit.bytes={}\ncairo.commit.mode={mode}\n",
        split.native
    );
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "db"}, "data": {"server.conf": conf}}))?;
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await?;
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "db-data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
                 "resources": {"requests": {"storage": "10Gi"}}},
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await?;
    let pod: Pod = serde_json::from_value(bare_pod(args, split))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod).await?;
    let deadline = Instant::now() + TIMEOUT;
    let pod = loop {
        if let Some(p) = pods.get_opt("db-0").await.ok().flatten() {
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                break p;
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the bare pod is not Ready:\n{}",
                cp.database_log(ns, "db-0")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    Database::at(&pod_ip(&pod)?, None)
}

fn pod_ip(pod: &Pod) -> anyhow::Result<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("the pod has no address")
}

/// The operator's pod shape without the operator, with the memory limit and the heap.
fn bare_pod(args: &Args, split: &MemorySplit) -> Value {
    let memory = format!("{}Mi", args.limit_mib);
    support::pod::database_pod(
        IMAGE,
        NODE,
        json!([{"name": "JVM_PREPEND", "value": format!("-Xmx{}m", split.heap >> 20)}]),
        json!({"limits": {"memory": memory}, "requests": {"memory": memory}}),
    )
}

/// One client: `rows` rows over ILP/HTTP in batches, one request in flight; the rows
/// acknowledged (204), all of them or an error. Client `w` of `writers` numbers its rows
/// `w, w + writers, ...`.
async fn write_ilp(
    http: &str,
    authorization: Option<&str>,
    w: i64,
    writers: i64,
    rows: i64,
    batch: i64,
) -> anyhow::Result<i64> {
    let mut sent = 0i64;
    while sent < rows {
        let n = batch.min(rows - sent);
        let lines: String = (sent..sent + n)
            .map(|k| {
                let id = k * writers + w;
                format!(
                    "{TABLE},s=s{} id={id}i,v={}.5 {}\n",
                    id % 16,
                    id % 1000,
                    1_700_000_000_000_000_000i64 + id * 1_000_000
                )
            })
            .collect();
        let (code, _) = support::http::post(
            http,
            "/write",
            authorization,
            &lines,
            Duration::from_secs(60),
        )
        .await?;
        anyhow::ensure!(code == 204, "ILP/HTTP answered {code}");
        sent += n;
    }
    Ok(sent)
}

/// A query through `/exec` with the database's login: its rows, as JSON values.
async fn exec(db: &Database, query: &str) -> anyhow::Result<Vec<Vec<Value>>> {
    Ok(db
        .client
        .exec_within(query, Duration::from_secs(60))
        .await
        .with_context(|| query.to_string())?
        .dataset)
}

//! `/metrics` as Prometheus scrapes it, after a known sequence of reconciles.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};

use prometheus_parse::{Sample, Scrape, Value};
use questdb_operator::api::QuestDB;
use questdb_operator::manager::ManagerOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{has_condition, is_ready, wait_for, wait_until, Env};

const NS: &str = "metrics";

pub(crate) fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A plain HTTP/1.0 GET, the way a scraper does it.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_string())
}

fn value(s: &Sample) -> f64 {
    match &s.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
        Value::Summary(_) => f64::NAN,
    }
}

fn find<'a>(scrape: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect()
}

fn one(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let found = find(scrape, metric, labels);
    assert_eq!(
        found.len(),
        1,
        "exactly one {metric}{labels:?}, found {}",
        found.len()
    );
    value(found[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_after_a_known_sequence_of_reconciles() {
    let (metrics_addr, health_addr) = (free_port(), free_port());
    let opts = ManagerOptions {
        metrics_addr: Some(metrics_addr),
        health_addr: Some(health_addr),
        questdb_concurrency: 3,
        ..Default::default()
    };
    let env = Env::start_with(opts).await;
    assert_eq!(get(health_addr, "/healthz").await.0, 200);
    assert_eq!(get(health_addr, "/readyz").await.0, 200, "caches synced");
    env.namespace(NS).await;

    env.create_questdb(NS, "good", |_| {}).await;
    env.create_questdb(NS, "bad", |q| q.spec.image = "Not A Valid Image".into())
        .await;
    let qdbs = env.api::<QuestDB>(NS);
    wait_for(&qdbs, "good", "Ready", is_ready()).await;
    wait_for(
        &qdbs,
        "bad",
        "InvalidSpec",
        has_condition("Ready", "InvalidSpec"),
    )
    .await;
    // The phase gauge is computed at scrape time from the cache; wait until it shows both.
    wait_until("phases visible in /metrics", || async move {
        let (_, body) = get(metrics_addr, "/metrics").await;
        body.contains("questdb_operator_questdbs{phase=\"Running\"} 1")
            && body.contains("questdb_operator_questdbs{phase=\"Failed\"} 1")
    })
    .await;

    let (code, body) = get(metrics_addr, "/metrics").await;
    assert_eq!(code, 200);
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("valid exposition");

    let ctrl = [("controller", "questdb")];
    let results: BTreeMap<String, f64> = find(&scrape, "controller_runtime_reconcile_total", &ctrl)
        .into_iter()
        .map(|s| (s.labels.get("result").unwrap().to_string(), value(s)))
        .collect();
    assert_eq!(
        results.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["error", "requeue", "requeue_after", "success"],
        "all four results, pre-created"
    );
    let total: f64 = results.values().sum();
    assert!(
        total >= 2.0,
        "at least one reconcile per QuestDB: {results:?}"
    );
    // A converged QuestDB is requeued after the resync period; an invalid one waits for a change.
    assert!(results["requeue_after"] >= 1.0, "{results:?}");
    assert!(results["success"] >= 1.0, "{results:?}");
    assert_eq!(
        one(&scrape, "controller_runtime_reconcile_errors_total", &ctrl),
        results["error"],
        "errors_total equals result=error"
    );
    assert_eq!(
        one(
            &scrape,
            "controller_runtime_reconcile_time_seconds_count",
            &ctrl
        ),
        total,
        "one reconcile-time observation per reconcile"
    );
    assert_eq!(
        one(
            &scrape,
            "controller_runtime_max_concurrent_reconciles",
            &ctrl
        ),
        3.0
    );
    let active = one(&scrape, "controller_runtime_active_workers", &ctrl);
    assert!(
        (0.0..=3.0).contains(&active),
        "active workers within the limit: {active}"
    );
    assert!(one(&scrape, "questdb_operator_triggers_total", &ctrl) >= 2.0);

    // Six children of "good" were created with POST, and "bad" got none.
    let posts: f64 = find(
        &scrape,
        "rest_client_requests_total",
        &[("method", "POST"), ("code", "201")],
    )
    .into_iter()
    .map(value)
    .sum();
    assert!(posts >= 6.0, "children created: {posts}");
    assert!(
        scrape
            .samples
            .iter()
            .all(|s| s.labels.get("instance").is_none()),
        "no label called instance"
    );
    assert!(
        find(
            &scrape,
            "questdb_operator_condition_transitions_total",
            &[("type", "Ready"), ("reason", "InvalidSpec")]
        )
        .into_iter()
        .map(value)
        .sum::<f64>()
            >= 1.0
    );
    assert!(scrape
        .samples
        .iter()
        .any(|s| s.metric.starts_with("process_")));
    env.stop().await;
}

/// The metric names in a PromQL expression that belong to `prefix` (quoted label values, such
/// as `"$questdb-data"`, left out).
fn series_names(expr: &str, prefix: &str) -> std::collections::BTreeSet<String> {
    let mut unquoted = String::new();
    let mut quoted = false;
    for c in expr.chars() {
        if c == '"' {
            quoted = !quoted;
        } else if !quoted {
            unquoted.push(c);
        }
    }
    unquoted
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with(prefix) && !w.starts_with("questdb_operator_"))
        .map(str::to_string)
        .collect()
}

/// Every `expr` and variable query of a dashboard.
fn dashboard_queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                match (key.as_str(), child) {
                    ("expr" | "definition", serde_json::Value::String(q)) => out.push(q.clone()),
                    _ => dashboard_queries(child, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| dashboard_queries(i, out)),
        _ => {}
    }
}

/// The database dashboard and the `questdb-databases` alerts read QuestDB's own series, as the
/// PodMonitor scrapes them from the health port without the HTTP password and labels them with
/// the pod's `app.kubernetes.io/instance`: a series QuestDB renamed or never had would blank a
/// panel, and an alert on it would never fire. Checked against a real QuestDB 9.2.0 run by the
/// operator.
#[tokio::test]
async fn every_database_series_the_alerts_and_dashboard_read_is_one_questdb_exposes() {
    use crate::database::{pod_ip, ready, real, NS as DB_NS};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut queries = Vec::new();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana/questdb-databases.json")).unwrap(),
    )
    .unwrap();
    dashboard_queries(&dashboard, &mut queries);
    let rules: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root.join("deploy/prometheusrule/prometheusrule.yaml")).unwrap(),
    )
    .unwrap();
    let group = rules["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["name"] == "questdb-databases")
        .expect("the questdb-databases rule group");
    queries.extend(
        group["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["expr"].as_str().map(str::to_string)),
    );
    let wanted: std::collections::BTreeSet<String> = queries
        .iter()
        .flat_map(|q| series_names(q, "questdb_"))
        .collect();
    assert!(wanted.len() >= 15, "{wanted:?}");
    // The kubelet's volume statistics (kubelet `/metrics`, labelled namespace and
    // persistentvolumeclaim), which no test here scrapes: the two the rules and panels read.
    let kubelet: std::collections::BTreeSet<String> = queries
        .iter()
        .flat_map(|q| series_names(q, "kubelet_"))
        .collect();
    assert_eq!(
        kubelet,
        [
            "kubelet_volume_stats_capacity_bytes",
            "kubelet_volume_stats_used_bytes"
        ]
        .map(String::from)
        .into()
    );

    let env = crate::database::env().await;
    env.create_questdb(DB_NS, "db1", real).await;
    ready(&env, "db1").await;
    let pod: k8s_openapi::api::core::v1::Pod = env.api(DB_NS).get("db1-0").await.unwrap();
    assert_eq!(
        pod.metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/instance")
            .map(String::as_str),
        Some("db1"),
        "the PodMonitor's `questdb` label comes from this pod label"
    );
    // As Prometheus scrapes it: HTTP/1.1, the body chunked.
    let health = format!("{}:9003", pod_ip(&env, "db1").await);
    let (code, exposition) = questdb_testenv::database::http_get(
        &health,
        "/metrics",
        std::time::Duration::from_secs(30),
    )
    .await
    .expect("GET /metrics on the health port");
    assert_eq!(
        code, 200,
        "the health port serves /metrics without the password"
    );
    let exposed: std::collections::BTreeSet<&str> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|w| !exposed.contains(w.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "QuestDB does not expose {missing:?}; it exposes {exposed:?}"
    );
    env.stop().await;
}

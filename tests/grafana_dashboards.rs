//! Every metric a dashboard under `grafana/` queries must be exposed by the operator's `/metrics`,
//! so a renamed family cannot silently blank a panel on-call engineers rely on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use questdb_operator::api::Phase;
use questdb_operator::metrics::{
    ApiCall, FailoverResult, Metrics, NodeMoveResult, ReconcileOutcome,
};
use serde_json::Value;

/// PromQL words that look like identifiers but are not metric names.
const PROMQL_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

fn dashboards() -> Vec<(PathBuf, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no dashboards under {}", dir.display());
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
            (path, json)
        })
        .collect()
}

/// Every PromQL expression in a dashboard: panel targets (rows nest panels, so walk the whole
/// tree) and the `label_values(metric, label)` queries of template variables.
fn queries(dashboard: &Value) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    match (key.as_str(), child) {
                        ("expr", Value::String(expr)) => out.push(expr.clone()),
                        _ => walk(child, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let query = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .unwrap_or_default();
        if let Some(args) = query.strip_prefix("label_values(") {
            // The first argument is a series selector only when there are two arguments.
            if let Some((selector, _label)) = args.split_once(',') {
                out.push(selector.to_string());
            }
        }
    }
    out
}

/// Metric names used in a PromQL expression: identifiers outside label matchers, range
/// selectors and strings that are neither functions, keywords, label lists nor Grafana variables.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut skip_next_parens = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' => i = skip_until(&chars, i, '}'),
            '[' => i = skip_until(&chars, i, ']'),
            '"' | '\'' | '`' => i = skip_until(&chars, i, c),
            '(' if skip_next_parens => {
                skip_next_parens = false;
                i = skip_until(&chars, i, ')');
            }
            '$' => {
                // Grafana variable such as $__rate_interval.
                i += 1;
                while i < chars.len() && is_ident_char(chars[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                // Numbers, including exponents like 1e3 and durations like 5m.
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && is_ident_char(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|c| !c.is_whitespace());
                if matches!(
                    word.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) {
                    skip_next_parens = true;
                } else if next == Some(&'(') || PROMQL_KEYWORDS.contains(&word.as_str()) {
                    // A function call or an operator keyword.
                } else {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Index just past the `close` that ends the group opened at `open_at`.
fn skip_until(chars: &[char], open_at: usize, close: char) -> usize {
    let mut i = open_at + 1;
    while i < chars.len() && chars[i] != close {
        if chars[i] == '\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// Family names and types from the exposition's `# TYPE` lines.
fn exposed_families(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let mut parts = rest.split_whitespace();
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        })
        .collect()
}

fn is_exposed(name: &str, families: &BTreeMap<String, String>) -> bool {
    if families.contains_key(name) {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .and_then(|base| families.get(base))
            .is_some_and(|kind| kind == "histogram" || (kind == "summary" && *suffix != "_bucket"))
    })
}

/// The operator's exposition after one of everything, so every labelled family has a series.
fn exposition_after_one_of_everything() -> String {
    let metrics = Metrics::new();
    let controller = metrics.controller("questdb", 4);
    let m = Arc::clone(&metrics);
    let reconcile = controller.instrument(
        "db/q1",
        async move {
            let call = ApiCall {
                verb: "get".into(),
                resource: "statefulsets".into(),
            };
            m.record_rest_request(
                &call,
                "GET",
                "10.0.0.1:443",
                Some(200),
                Duration::from_millis(3),
            );
            m.aws_call("ec2", "DescribeInstances", "ok");
        },
        |_| ReconcileOutcome::Success,
    );
    futures::executor::block_on(reconcile);
    metrics.set_leader("questdb-operator", true);
    metrics.set_questdb_phases([Some(Phase::Running), None]);
    metrics.condition_transition("Ready", "False", "PodNotReady");
    metrics.failover_finished(FailoverResult::Succeeded, Some(Duration::from_secs(80)));
    metrics.node_move_finished(NodeMoveResult::Completed, Some(Duration::from_secs(9)));
    metrics.orphaned_instance_terminated();
    metrics.failover_suppressed("TooManyUnhealthyNodes");
    metrics.set_unhealthy_dedicated_nodes(1);
    metrics.failover_step("Fencing", Duration::from_secs(3));
    metrics.failover_detected(Duration::from_millis(300));
    metrics.node_move_step("Stopping", Duration::from_secs(3));
    metrics.reconcile_error("questdb", "CloudApiError");
    metrics.backup_finished(true, Some(Duration::from_secs(40)));
    metrics.last_successful_backup("team-a", "prod", 1_800_000_000);
    metrics.last_verified_backup("team-a", "prod", 1_800_000_000);
    metrics.set_checkpoint_open_seconds("team-a", "prod", 120);
    metrics.render()
}

/// Dashboards of the databases' own metrics (QuestDB's `/metrics` and the kubelet's volume
/// statistics), not the operator's: the integration test
/// `metrics::every_database_series_the_alerts_and_dashboard_read_is_one_questdb_exposes`
/// checks their names against a real QuestDB.
const DATABASE_DASHBOARDS: &[&str] = &["questdb-databases.json"];

#[test]
fn every_metric_a_dashboard_queries_is_exposed() {
    let families = exposed_families(&exposition_after_one_of_everything());
    let mut missing = BTreeMap::<String, BTreeSet<String>>::new();
    let mut checked = 0;
    for (path, dashboard) in dashboards() {
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let names: BTreeSet<String> = queries(&dashboard)
            .iter()
            .flat_map(|expr| metric_names(expr))
            .collect();
        assert!(!names.is_empty(), "{file} queries no metrics");
        if DATABASE_DASHBOARDS.contains(&file.as_str()) {
            continue;
        }
        for name in names {
            checked += 1;
            if !is_exposed(&name, &families) {
                missing.entry(file.clone()).or_default().insert(name);
            }
        }
    }
    for (file, names) in &missing {
        eprintln!("{file}: not exposed by /metrics: {names:?}");
    }
    assert!(
        missing.is_empty(),
        "dashboards query metrics the operator does not expose: {missing:?}"
    );
    assert!(
        checked > 20,
        "only {checked} metric names found: is the extractor broken?"
    );
}

#[test]
fn dashboards_are_importable_with_a_datasource_variable() {
    let mut uids = BTreeSet::new();
    for (path, dashboard) in dashboards() {
        let file = path.display();
        assert!(
            dashboard["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{file}: title"
        );
        let uid = dashboard["uid"].as_str().unwrap_or_default();
        assert!(!uid.is_empty() && uid.len() <= 40, "{file}: uid {uid:?}");
        assert!(uids.insert(uid.to_string()), "{file}: duplicate uid {uid}");
        assert!(
            dashboard["schemaVersion"].as_u64().is_some(),
            "{file}: schemaVersion"
        );
        assert!(
            dashboard["templating"]["list"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
            "{file}: no datasource variable"
        );
        // Every query panel reads from the variable, never from a datasource of the author's.
        let mut panel_ids = BTreeSet::new();
        for panel in dashboard["panels"].as_array().into_iter().flatten() {
            let id = panel["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{file}: panel without id"));
            assert!(panel_ids.insert(id), "{file}: duplicate panel id {id}");
            for target in panel["targets"].as_array().into_iter().flatten() {
                assert_eq!(
                    target["datasource"]["uid"], "${datasource}",
                    "{file}: panel {:?}",
                    panel["title"]
                );
            }
        }
    }
}

#[test]
fn the_extractor_finds_metric_names_and_nothing_else() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (controller, le) (rate(controller_runtime_reconcile_time_seconds_bucket{namespace="$namespace", job=~"a|b"}[$__rate_interval]))) / on (pod) group_left (name) leader_election_master_status offset 5m"#,
    );
    let expected: BTreeSet<String> = [
        "controller_runtime_reconcile_time_seconds_bucket",
        "leader_election_master_status",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, expected);
    assert_eq!(
        metric_names("time() - process_start_time_seconds{job=\"x\"} > 1e3"),
        BTreeSet::from(["process_start_time_seconds".to_string()])
    );
}

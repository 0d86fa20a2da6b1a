//! The alert rules of `deploy/prometheusrule` (the chart renders the same objects:
//! tests/helm_chart.rs) checked and unit-tested with the real `promtool`, built from its Go
//! module by `hack/promtool/build.sh` (or `QDB_PROMTOOL_BIN`): every rule parses as Prometheus
//! parses it, and every alert is shown firing on the trouble it names, with its labels and its
//! annotations as the on-call engineer reads them, and silent without it
//! (`tests/prometheus_rules.test.yaml`). The names of QuestDB's own series are checked against
//! a real QuestDB's `/metrics` by the integration test
//! `metrics::every_database_series_the_alerts_and_dashboard_read_is_one_questdb_exposes`.
//!
//! Without promtool (no Go to build it) these tests fail with the reason; they never pass
//! unchecked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The promtool binary: `QDB_PROMTOOL_BIN`, else the last line `hack/promtool/build.sh` prints.
fn promtool() -> PathBuf {
    if let Some(bin) = std::env::var_os("QDB_PROMTOOL_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "QDB_PROMTOOL_BIN={} is not a file",
            bin.display()
        );
        return bin;
    }
    let out = Command::new("bash")
        .arg(root().join("hack/promtool/build.sh"))
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .expect("running `bash hack/promtool/build.sh`");
    assert!(
        out.status.success(),
        "hack/promtool/build.sh failed (its reason is printed above): the alert rule tests need the real promtool. Install Go 1.26+ so it can be built, or set QDB_PROMTOOL_BIN to a promtool binary."
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    PathBuf::from(path)
}

/// The `spec` of the PrometheusRule: a Prometheus rules file's content.
fn rule_groups() -> Value {
    let text =
        std::fs::read_to_string(root().join("deploy/prometheusrule/prometheusrule.yaml")).unwrap();
    let rule: Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

fn alert_names(groups: &Value) -> BTreeSet<String> {
    groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

/// The rules file and the unit tests side by side in a fresh directory, as promtool reads them.
fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml_ng::to_string(&rule_groups()).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        root().join("tests/prometheus_rules.test.yaml"),
        dir.path().join("rules.test.yaml"),
    )
    .unwrap();
    dir
}

fn run(args: &[&str], dir: &Path) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn every_alert_rule_is_one_prometheus_accepts() {
    let dir = workdir();
    let out = run(&["check", "rules", "rules.yaml"], dir.path());
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_fires_on_the_trouble_it_names_and_stays_silent_without_it() {
    let dir = workdir();
    run(&["test", "rules", "rules.test.yaml"], dir.path());
    // Every alert has a case where it fires: an alert nobody has seen fire may never fire.
    let tests: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(dir.path().join("rules.test.yaml")).unwrap(),
    )
    .unwrap();
    let shown_firing: BTreeSet<String> = tests["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|c| c["alertname"].as_str().map(str::to_string))
        .collect();
    let never: Vec<_> = alert_names(&rule_groups())
        .difference(&shown_firing)
        .cloned()
        .collect();
    assert!(
        never.is_empty(),
        "alerts tests/prometheus_rules.test.yaml never shows firing: {never:?}"
    );
}

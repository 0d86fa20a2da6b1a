//! The Helm chart (`charts/questdb-operator`) checked with the real `helm`, built from its Go
//! module by `hack/helm/build.sh` (or `QDB_HELM_BIN`): it lints, its schema refuses bad values at
//! `helm install` rather than at the operator's start-up, its default render is the kustomize
//! install of `deploy/` object for object (above all the RBAC: the operator's least privilege
//! must not differ between the two), and every flag it renders is one the operator accepts.
//!
//! Without helm (no Go to build it) these tests fail with the reason; they never pass unchecked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use clap::{CommandFactory, Parser};
use questdb_operator::cli::{Cli, CloudProvider, Command as CliCommand, RunArgs};
use serde::Deserialize;
use serde_json::{json, Value};

const CHART: &str = "charts/questdb-operator";
/// deploy/'s namespace and object names: the chart's for this release name and namespace.
const RELEASE: &str = "questdb-operator";
const NAMESPACE: &str = "questdb-operator";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The helm binary: `QDB_HELM_BIN`, else the last line `hack/helm/build.sh` prints (it builds
/// helm once into a cache, then only prints the path).
fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(bin) = std::env::var_os("QDB_HELM_BIN").filter(|b| !b.is_empty()) {
            let bin = PathBuf::from(bin);
            assert!(
                bin.is_file(),
                "QDB_HELM_BIN={} is not a file: point it at a helm binary or unset it to build one with hack/helm/build.sh",
                bin.display()
            );
            return bin;
        }
        let out = Command::new("bash")
            .arg(root().join("hack/helm/build.sh"))
            .current_dir(root())
            .stderr(Stdio::inherit())
            .output()
            .expect("running `bash hack/helm/build.sh`");
        assert!(
            out.status.success(),
            "hack/helm/build.sh failed ({}; its reason is printed above): the Helm chart tests need the real helm. Install Go 1.26+ so it can be built, or set QDB_HELM_BIN to a helm v3 binary.",
            out.status
        );
        let stdout = String::from_utf8(out.stdout).expect("build.sh prints a UTF-8 path");
        let bin = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(
            bin.is_file(),
            "hack/helm/build.sh's last line is not the helm binary: {stdout:?}"
        );
        bin
    })
}

/// The image every render names unless the test is about `image.repository` itself: the chart
/// has no default (none is published), so every install names one.
const TEST_IMAGE: &str = "registry.example.com/questdb/questdb-operator";

/// The image name deploy/ gives the Deployment, for the tests that compare the two installs.
const DEPLOY_IMAGE: &str = "image.repository=questdb-operator";

/// Runs helm in the repository root, with its config, cache and data directories out of the
/// user's home (nothing there must change a render), naming [`TEST_IMAGE`] in every render,
/// lint and install whose arguments do not set `image.repository` themselves.
fn run_helm(args: &[&str]) -> Output {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    let renders = matches!(
        args.first(),
        Some(&("template" | "lint" | "install" | "upgrade"))
    );
    let image = format!("image.repository={TEST_IMAGE}");
    let default_image: Vec<&str> =
        if renders && !args.iter().any(|a| a.contains("image.repository")) {
            vec!["--set", &image]
        } else {
            Vec::new()
        };
    Command::new(helm())
        .args(args)
        .args(&default_image)
        .current_dir(root())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("running helm")
}

fn helm_ok(args: &[&str]) -> String {
    let out = run_helm(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm {} failed ({}):\n{}\n{stdout}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A file of values next to the test's other temporary files.
fn values_file(name: &str, yaml: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("helm-values");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, yaml).unwrap();
    path
}

/// Every document of a multi-document YAML stream that is an object.
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| v.is_object())
        .collect()
}

fn read_documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    documents(&text)
}

/// `helm template questdb-operator charts/questdb-operator --namespace questdb-operator` with
/// the CRDs and the given extra arguments (`-f`, `--set`).
fn render(extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--include-crds",
    ];
    args.extend_from_slice(extra);
    documents(&helm_ok(&args))
}

/// What `helm install` creates: the rendering without its hooks (the `helm test` Pod is made
/// by `helm test` only).
fn installed(objects: Vec<Value>) -> Vec<Value> {
    objects
        .into_iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect()
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

type Key = (String, String);

fn by_key(objects: Vec<Value>) -> BTreeMap<Key, Value> {
    let mut out = BTreeMap::new();
    for o in objects {
        let key = (kind(&o).to_string(), name(&o).to_string());
        assert!(out.insert(key.clone(), o).is_none(), "{key:?} twice");
    }
    out
}

fn find<'a>(objects: &'a [Value], k: &str, n: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| kind(o) == k && name(o) == n)
        .unwrap_or_else(|| panic!("no {k} {n} among {:?}", keys(objects)))
}

fn keys(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| format!("{}/{}", kind(o), name(o)))
        .collect()
}

// ---- deploy/ as kustomize builds it -------------------------------------------------------

/// Kinds without a namespace: kustomize sets `metadata.namespace` on every other one.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// What `kustomize build <dir>` gives for the features deploy/ uses: `resources` (files, and
/// directories with their own kustomization), `components`, `patches` (strategic merge by kind
/// and name), `images` and `namespace` (on namespaced objects and, as kustomize 5 does, on the
/// ServiceAccount subjects of bindings).
fn kustomize(dir: &Path) -> Vec<Value> {
    let kustomization = read_documents(&dir.join("kustomization.yaml"))
        .pop()
        .unwrap_or_else(|| panic!("{}/kustomization.yaml is empty", dir.display()));
    let list = |field: &str| -> Vec<Value> {
        kustomization[field].as_array().cloned().unwrap_or_default()
    };
    let mut objects = Vec::new();
    for entry in list("resources").iter().chain(list("components").iter()) {
        let path = dir.join(entry.as_str().expect("a resource is a path"));
        if path.is_dir() {
            objects.extend(kustomize(&path));
        } else {
            objects.extend(read_documents(&path));
        }
    }
    for patch in list("patches") {
        let file = patch["path"].as_str().expect("patches: path only");
        for p in read_documents(&dir.join(file)) {
            let target = objects
                .iter_mut()
                .find(|o| kind(o) == kind(&p) && name(o) == name(&p))
                .unwrap_or_else(|| panic!("{file}: no {}/{} to patch", kind(&p), name(&p)));
            strategic_merge(target, &p);
        }
    }
    for image in list("images") {
        let from = image["name"].as_str().unwrap();
        let to = format!(
            "{}:{}",
            image["newName"].as_str().unwrap_or(from),
            image["newTag"].as_str().unwrap()
        );
        for o in &mut objects {
            // pointer_mut: indexing a Value mutably would add the missing fields as nulls.
            for list in ["containers", "initContainers"] {
                let pointer = format!("/spec/template/spec/{list}");
                let containers = o.pointer_mut(&pointer).and_then(Value::as_array_mut);
                for c in containers.into_iter().flatten() {
                    if c["image"].as_str().map(image_name) == Some(from) {
                        c["image"] = json!(to);
                    }
                }
            }
        }
    }
    if let Some(ns) = kustomization["namespace"].as_str() {
        for o in &mut objects {
            if !CLUSTER_SCOPED.contains(&kind(o)) {
                o["metadata"]["namespace"] = json!(ns);
            }
            if kind(o).ends_with("RoleBinding") {
                for s in o["subjects"].as_array_mut().into_iter().flatten() {
                    if s["kind"] == "ServiceAccount" {
                        s["namespace"] = json!(ns);
                    }
                }
            }
        }
    }
    objects
}

/// `registry:5000/a/b:tag` → `registry:5000/a/b`.
fn image_name(image: &str) -> &str {
    let image = image.split('@').next().unwrap();
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => &image[..i],
        _ => image,
    }
}

/// A strategic merge patch as kustomize applies deploy/'s: maps merge, lists of named items
/// merge by name (new items first, as kustomize puts them), other lists are replaced.
fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                match t.get_mut(k) {
                    Some(existing) => strategic_merge(existing, v),
                    None => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(t), Value::Array(p)) if p.iter().all(|i| i.get("name").is_some()) => {
            let mut added = Vec::new();
            for item in p {
                match t.iter_mut().find(|i| i.get("name") == item.get("name")) {
                    Some(existing) => strategic_merge(existing, item),
                    None => added.push(item.clone()),
                }
            }
            added.append(t);
            *t = added;
        }
        (t, p) => *t = p.clone(),
    }
}

// ---- comparison --------------------------------------------------------------------------

/// Labels Helm adds on top of deploy/'s.
const HELM_LABELS: &[&str] = &[
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

/// An object without what only tells who installed it: its labels and annotations (compared
/// apart: deploy/'s labels must all be on the chart's object).
fn comparable(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(meta) = o["metadata"].as_object_mut() {
        meta.remove("labels");
        meta.remove("annotations");
    }
    o
}

/// The JSON paths at which `a` and `b` differ, with both values (`a`'s first).
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                differences(va, vb, &format!("{path}.{k}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                differences(va, vb, &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(format!("{path}: {a} ≠ {b}")),
        _ => {}
    }
}

/// Every object of `deploy` (but the Namespace, which the chart leaves to `helm install
/// --create-namespace` or the cluster's administrator) must be in `chart`, equal but for the
/// labels Helm adds. Returns the chart's objects deploy/ does not have.
fn assert_same_objects(deploy: Vec<Value>, chart: Vec<Value>) -> BTreeSet<Key> {
    let mut deploy = by_key(deploy);
    deploy.retain(|(k, _), _| k != "Namespace");
    let chart = by_key(chart);
    let mut problems = Vec::new();
    for (key, want) in &deploy {
        let Some(got) = chart.get(key) else {
            problems.push(format!(
                "{}/{}: in deploy/, not rendered by the chart",
                key.0, key.1
            ));
            continue;
        };
        let mut diffs = Vec::new();
        differences(&comparable(want), &comparable(got), "", &mut diffs);
        let labels = got["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for (k, v) in want["metadata"]["labels"].as_object().into_iter().flatten() {
            if labels.get(k) != Some(v) {
                diffs.push(format!(
                    "metadata.labels.{k}: deploy/ has {v}, the chart {:?}",
                    labels.get(k)
                ));
            }
        }
        for k in labels.keys() {
            let deploys = want["metadata"]["labels"].get(k).is_some();
            if !deploys && !HELM_LABELS.contains(&k.as_str()) && k != "app.kubernetes.io/name" {
                diffs.push(format!("metadata.labels.{k}: only the chart has it"));
            }
        }
        problems.extend(
            diffs
                .into_iter()
                .map(|d| format!("{}/{} {d}", key.0, key.1)),
        );
    }
    assert!(
        problems.is_empty(),
        "the chart and deploy/ differ (deploy/'s value first):\n  {}",
        problems.join("\n  ")
    );
    chart
        .into_keys()
        .filter(|k| !deploy.contains_key(k))
        .collect()
}

/// Rules equal to the last verb, in order: least privilege is what the chart must not change.
fn assert_same_rules(chart: &Value, deploy: &Value, what: &str) {
    let mut diffs = Vec::new();
    differences(
        &json!(rules(deploy)),
        &json!(rules(chart)),
        "rules",
        &mut diffs,
    );
    assert!(
        diffs.is_empty(),
        "{what} (deploy/'s value first):\n  {}",
        diffs.join("\n  ")
    );
}

fn rules(o: &Value) -> &Vec<Value> {
    o["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("{}/{} has no rules", kind(o), name(o)))
}

fn deployment_args(objects: &[Value], name: &str) -> Vec<String> {
    let d = find(objects, "Deployment", name);
    let container = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "operator");
    container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string argument").to_string())
        .collect()
}

fn parse_run(args: &[String]) -> RunArgs {
    let argv = std::iter::once("questdb-operator".to_string()).chain(args.iter().cloned());
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: CliCommand::Run(run),
            ..
        }) => *run,
        Ok(other) => panic!("{args:?} is not `run`: {other:?}"),
        Err(e) => panic!("the operator refuses the chart's arguments {args:?}:\n{e}"),
    }
}

// ---- tests -------------------------------------------------------------------------------

#[test]
fn chart_that_fails_helm_lint_strict_is_caught_before_release() {
    helm_ok(&["lint", CHART, "--strict"]);
    helm_ok(&[
        "lint",
        CHART,
        "--strict",
        "-f",
        &format!("{CHART}/ci/aws-values.yaml"),
    ]);
    helm_ok(&[
        "lint",
        CHART,
        "--strict",
        "-f",
        &format!("{CHART}/ci/all-values.yaml"),
    ]);
    helm_ok(&["lint", CHART, "--strict", "--set", "rbac.scope=namespace"]);
}

#[test]
fn missing_or_mistyped_values_are_refused_at_helm_install_not_at_start_up() {
    let refused = |file: &str, yaml: &str, names: &[&str]| {
        let path = values_file(file, yaml);
        let out = run_helm(&["template", RELEASE, CHART, "-f", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "helm accepted {file}:\n{yaml}");
        assert!(
            stderr.contains("schema"),
            "{file} was refused, but not by values.schema.json: {stderr}"
        );
        for n in names {
            assert!(
                stderr.contains(n),
                "refusing {file}, helm does not name {n}: {stderr}"
            );
        }
    };
    let aws = |without: &str| {
        let mut values: serde_json::Map<String, Value> = serde_yaml_ng::from_str(
            &std::fs::read_to_string(root().join(CHART).join("ci/aws-values.yaml")).unwrap(),
        )
        .unwrap();
        let (parent, key) = without.rsplit_once('.').unwrap_or(("", without));
        let mut node = values.get_mut("aws").unwrap();
        for p in parent.split('.').filter(|p| !p.is_empty() && *p != "aws") {
            node = node.get_mut(p).unwrap();
        }
        node.as_object_mut().unwrap().remove(key).expect(without);
        serde_yaml_ng::to_string(&values).unwrap()
    };
    refused(
        "no-cluster-name.yaml",
        &aws("aws.clusterName"),
        &["/aws/clusterName"],
    );
    refused("no-region.yaml", &aws("aws.region"), &["/aws/region"]);
    refused(
        "replicas-two.yaml",
        "replicas: \"two\"\n",
        &["/replicas", "want integer"],
    );
    refused("unknown-key.yaml", "replica: 2\n", &["replica"]);
    refused(
        "bad-scope.yaml",
        "rbac:\n  scope: cluster-wide\n",
        &["/rbac/scope"],
    );
    refused(
        "bad-duration.yaml",
        "nodes:\n  orphanGracePeriod: ten minutes\n",
        &["/nodes/orphanGracePeriod"],
    );
    refused(
        "two-leaders.yaml",
        "replicas: 2\nleaderElection:\n  enabled: false\n",
        &["/leaderElection/enabled"],
    );
    refused(
        "comma-in-list.yaml",
        "aws:\n  securityGroupIds: [\"sg-1,sg-2\"]\n",
        &["/aws/securityGroupIds/0"],
    );

    // A first install on EKS names the cluster and its region, nothing of its network: the
    // operator reads the rest from the cluster (tests/integration/eks.rs).
    helm_ok(&[
        "template",
        RELEASE,
        CHART,
        "-f",
        &format!("{CHART}/ci/aws-values.yaml"),
    ]);
}

#[test]
fn default_install_is_deploys_kustomize_install_object_for_object() {
    let deploy = kustomize(&root().join("deploy"));
    // deploy/'s image name (its kustomization's `images:` is where a user sets theirs).
    let chart = installed(render(&["--set", DEPLOY_IMAGE]));
    let extra = assert_same_objects(deploy, chart);
    assert!(
        extra.is_empty(),
        "the chart renders objects deploy/ does not have: {extra:?}"
    );
}

#[test]
fn chart_grants_exactly_deploys_cluster_rbac() {
    let deploy = read_documents(&root().join("deploy/clusterrole.yaml"));
    let chart = render(&[]);
    assert_same_rules(
        find(&chart, "ClusterRole", "questdb-operator"),
        &deploy[0],
        "the chart's ClusterRole must grant exactly deploy/clusterrole.yaml's rules",
    );
    let leader = read_documents(&root().join("deploy/operator/role.yaml"));
    assert_same_rules(
        find(&chart, "Role", "questdb-operator-leader-election"),
        &leader[0],
        "the leader-election Role must grant exactly deploy/operator/role.yaml's rules",
    );
    let binding = find(&chart, "ClusterRoleBinding", "questdb-operator");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "questdb-operator", "namespace": NAMESPACE}])
    );
    // The chart's object list is the whole grant: no other Role or binding.
    let rbac: Vec<String> = keys(&chart)
        .into_iter()
        .filter(|k| k.contains("Role"))
        .collect();
    assert_eq!(
        rbac,
        [
            "ClusterRole/questdb-operator",
            "ClusterRoleBinding/questdb-operator",
            "Role/questdb-operator-leader-election",
            "RoleBinding/questdb-operator-leader-election",
        ]
    );
}

#[test]
fn namespaced_install_is_deploy_namespaced_and_grants_exactly_its_role() {
    let deploy = kustomize(&root().join("deploy/namespaced"));
    let chart = installed(render(&[
        "--set",
        "rbac.scope=namespace",
        "--set",
        DEPLOY_IMAGE,
    ]));
    let role = read_documents(&root().join("deploy/namespaced/role.yaml"));
    assert_same_rules(
        find(&chart, "Role", "questdb-operator"),
        &role[0],
        "rbac.scope=namespace must grant exactly deploy/namespaced/role.yaml's rules",
    );
    assert!(
        !chart
            .iter()
            .any(|o| kind(o) == "ClusterRole" || kind(o) == "ClusterRoleBinding"),
        "a namespaced install without dedicated nodes grants nothing cluster-wide: {:?}",
        keys(&chart)
    );
    let extra = assert_same_objects(deploy, chart);
    // The admission policy, which deploy/namespaced leaves to the cluster's administrator, named
    // after the namespace so that two namespaced installs do not share it.
    let policy = "questdb-operator-questdb-operator-writes-only-its-own";
    assert_eq!(
        extra,
        BTreeSet::from([
            ("ValidatingAdmissionPolicy".to_string(), policy.to_string()),
            (
                "ValidatingAdmissionPolicyBinding".to_string(),
                policy.to_string()
            ),
        ])
    );

    // Dedicated nodes in a namespaced install: the cluster-scoped rules they need, each one of
    // the ClusterRole's, and nothing namespaced.
    let cluster_role = read_documents(&root().join("deploy/clusterrole.yaml"));
    let chart = render(&[
        "--set",
        "rbac.scope=namespace",
        "-f",
        &format!("{CHART}/ci/aws-values.yaml"),
    ]);
    let nodes = find(
        &chart,
        "ClusterRole",
        "questdb-operator-questdb-operator-nodes",
    );
    for rule in rules(nodes) {
        assert!(
            rules(&cluster_role[0]).contains(rule),
            "{rule} is not one of deploy/clusterrole.yaml's rules"
        );
        for resource in rule["resources"].as_array().unwrap() {
            let r = resource.as_str().unwrap();
            assert!(
                ["namespaces", "nodes", "nodes/stats", "csinodes", "leases", "volumeattachments"].contains(&r),
                "{r}: a namespaced install is granted nothing namespaced cluster-wide beyond the kubelets' leases"
            );
        }
    }
}

#[test]
fn monitoring_objects_are_deploys_components_when_enabled() {
    let mut deploy = Vec::new();
    for component in ["servicemonitor", "podmonitor", "prometheusrule"] {
        let mut objects = kustomize(&root().join("deploy").join(component));
        // As part of an overlay of deploy/ with `namespace: questdb-operator`.
        for o in &mut objects {
            o["metadata"]["namespace"] = json!(NAMESPACE);
        }
        deploy.extend(objects);
    }
    let defaults = render(&[]);
    for o in &deploy {
        assert!(
            !defaults.iter().any(|c| kind(c) == kind(o)),
            "{} must be opt-in",
            kind(o)
        );
    }
    let chart = render(&[
        "--set",
        "monitoring.serviceMonitor.enabled=true",
        "--set",
        "monitoring.podMonitor.enabled=true",
        "--set",
        "monitoring.prometheusRule.enabled=true",
    ]);
    let monitoring: Vec<Value> = chart
        .into_iter()
        .filter(|o| {
            o["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .starts_with("monitoring.coreos.com/")
        })
        .collect();
    let extra = assert_same_objects(deploy, monitoring);
    assert!(extra.is_empty(), "{extra:?}");
}

#[test]
fn every_flag_the_chart_renders_is_accepted_by_the_operator() {
    // Defaults: deploy/'s arguments exactly.
    let args = deployment_args(&render(&[]), "questdb-operator");
    assert_eq!(
        args,
        [
            "run",
            "--leader-elect",
            "--metrics-bind-address=:8080",
            "--health-probe-bind-address=:8081"
        ]
    );
    parse_run(&args);

    // Every value set.
    let objects = render(&["-f", &format!("{CHART}/ci/all-values.yaml")]);
    let args = deployment_args(&objects, "qdb-operator");
    let run = parse_run(&args);
    assert_eq!(run.namespace, "team-a");
    assert_eq!(run.leader_election_id, "qdb-leader");
    assert_eq!(run.leader_elect_lease_duration, 20);
    assert_eq!(run.metrics_bind_address, ":9090");
    assert_eq!(run.questdb_concurrency, 8);
    assert_eq!(
        run.allowed_image_registries,
        [
            "docker.io/questdb",
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
        ]
    );
    assert_eq!(run.allowed_priority_classes, ["databases"]);
    assert_eq!(run.allowed_toleration_keys, ["spot", "gpu"]);
    assert_eq!(run.secret_namespaces, ["team-a", "team-b"]);
    assert_eq!(run.backup_schedule_min_interval.as_secs(), 1800);
    assert_eq!(run.backup_retention_max, 50);
    // Secrets are granted in those namespaces only, never cluster-wide.
    let cluster_role = find(&objects, "ClusterRole", "qdb-operator");
    assert!(
        !rules(cluster_role).iter().any(|r| r["resources"]
            .as_array()
            .unwrap()
            .contains(&json!("secrets"))),
        "rbac.secretNamespaces: no cluster-wide Secrets rule"
    );
    for ns in ["team-a", "team-b"] {
        let role = objects
            .iter()
            .find(|o| {
                kind(o) == "Role"
                    && o["metadata"]["name"] == "qdb-operator-secrets"
                    && o["metadata"]["namespace"] == ns
            })
            .unwrap_or_else(|| panic!("a Secrets Role in {ns}"));
        assert_eq!(rules(role)[0]["resources"], json!(["secrets"]));
        assert!(objects.iter().any(|o| kind(o) == "RoleBinding"
            && o["metadata"]["namespace"] == ns
            && o["roleRef"]["name"] == "qdb-operator-secrets"
            && o["subjects"][0]["name"] == "qdb-operator-sa"));
    }
    assert_eq!(
        run.backup_upload_timeout, 1_000_000,
        "a big number must not render as 1e+06"
    );
    let cloud = &run.cloud;
    assert_eq!(cloud.cloud_provider, Some(CloudProvider::Aws));
    assert_eq!(cloud.cluster_name.as_deref(), Some("prod-eu"));
    assert_eq!(
        questdb_operator::cli::parse_subnets(&cloud.aws_subnets)
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        questdb_operator::cli::parse_subnets(&cloud.aws_public_subnets).unwrap()["eu-west-1a"],
        "subnet-1a"
    );
    assert_eq!(cloud.aws_security_group_ids, ["sg-1", "sg-2"]);
    assert_eq!(cloud.allowed_node_instance_types, ["m6i.*", "r7i.large"]);
    assert_eq!(
        cloud.csi_driver, "",
        "csiDriver: \"\" turns the CSI wait off"
    );
    assert_eq!(cloud.node_root_volume_gib, 40);
    assert_eq!(cloud.node_data_volume_gib, Some(80));
    assert_eq!(cloud.orphan_grace_period.as_secs(), 3600);
    assert_eq!(cloud.node_move_concurrency, 3);
    assert_eq!(cloud.node_move_concurrency_per_namespace, 2);
    assert_eq!(cloud.max_dedicated_nodes_per_namespace, 12);
    assert!(cloud.dns_names_first_come);
    assert_eq!(cloud.node_join_timeout.as_secs(), 1200);
    assert_eq!(
        questdb_operator::cloud::parse_node_tags(&cloud.node_tags).unwrap()["cost-center"],
        "42"
    );

    // The user-data template is the file the ConfigMap is mounted as.
    let template = cloud
        .node_user_data_template
        .as_ref()
        .expect("--node-user-data-template");
    let spec = &find(&objects, "Deployment", "qdb-operator")["spec"]["template"]["spec"];
    let mount = &spec["containers"][0]["volumeMounts"][0];
    assert_eq!(
        template,
        &Path::new(mount["mountPath"].as_str().unwrap()).join("bottlerocket.toml")
    );
    assert_eq!(spec["volumes"][0]["name"], mount["name"]);
    assert_eq!(
        spec["volumes"][0]["configMap"]["name"],
        "questdb-node-user-data"
    );

    // The kubelet CA is the file its ConfigMap is mounted as.
    let kubelet_ca = run.kubelet_ca_file.as_ref().expect("--kubelet-ca-file");
    let mount = &spec["containers"][0]["volumeMounts"][1];
    assert_eq!(
        kubelet_ca,
        &Path::new(mount["mountPath"].as_str().unwrap()).join("kubelet-ca.pem")
    );
    assert_eq!(spec["volumes"][1]["name"], mount["name"]);
    assert_eq!(spec["volumes"][1]["configMap"]["name"], "kubelet-ca");

    // Every flag of `run` a user sets is reachable from a value: a flag added to RunArgs
    // without a value fails here.
    let rendered: BTreeSet<&str> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap())
        .collect();
    let cli = Cli::command();
    let run_cmd = cli.find_subcommand("run").expect("a run subcommand");
    // Not values: the in-cluster config replaces a kubeconfig; the Lease's namespace is the
    // pod's (POD_NAMESPACE, as the leader-election Role is there); the Lease identity is the
    // pod name; the log format is LOG_FORMAT (logFormat).
    let not_values = [
        "kubeconfig",
        "leader-election-namespace",
        "leader-elect-identity",
        "log-format",
    ];
    let missing: Vec<&str> = run_cmd
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| !["help", "version"].contains(l) && !not_values.contains(l))
        .filter(|l| !rendered.contains(l))
        .collect();
    assert!(
        missing.is_empty(),
        "`run` flags no chart value renders (add them to values.yaml, the schema and the args helper): {missing:?}"
    );
    let env = &spec["containers"][0]["env"];
    let env_names: Vec<&str> = env
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(env_names.contains(&"POD_NAMESPACE") && env_names.contains(&"LOG_FORMAT"));
}

#[test]
fn aws_values_the_schema_accepts_start_the_operator() {
    // What the schema requires with `cloudProvider: aws` is what the operator checks at start-up:
    // values that pass `helm install` must not crash-loop on a missing flag.
    let objects = render(&["-f", &format!("{CHART}/ci/aws-values.yaml")]);
    let run = parse_run(&deployment_args(&objects, "questdb-operator"));
    let config = questdb_operator::app::cloud_config(&run.cloud, CloudProvider::Aws)
        .unwrap_or_else(|e| panic!("the operator refuses ci/aws-values.yaml's flags: {e:#}"));
    assert_eq!(config.cluster_name, "prod-eu");
    // What the values leave out is what the operator asks the EKS cluster for at start.
    let wanted = questdb_operator::cloud::discovery::wanted(&config);
    assert!(
        wanted.eks && wanted.subnets && wanted.public_subnets && wanted.security_groups,
        "{wanted:?}"
    );
    assert_eq!(
        config.instance_profile.as_deref(),
        Some("prod-eu-questdb-node"),
        "the stack's instance profile"
    );
    let sa = find(&objects, "ServiceAccount", "questdb-operator");
    assert!(sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].is_string());
}

#[test]
fn namespaced_install_never_watches_another_namespace() {
    let out = run_helm(&[
        "template",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--set",
        "rbac.scope=namespace",
        "--set",
        "watchNamespace=team-b",
    ]);
    assert!(
        !out.status.success(),
        "a Role in one namespace cannot watch another"
    );
    let args = deployment_args(
        &render(&["--set", "rbac.scope=namespace"]),
        "questdb-operator",
    );
    assert!(
        !args.iter().any(|a| a.starts_with("--namespace")),
        "{args:?}"
    );
}

#[test]
fn chart_crds_are_the_generated_ones() {
    let chart = std::fs::read(root().join(CHART).join("crds/questdb.yaml")).unwrap();
    let generated = std::fs::read(root().join("crds/questdb.yaml")).unwrap();
    assert!(
        chart == generated,
        "{CHART}/crds/questdb.yaml differs from crds/questdb.yaml: cp crds/questdb.yaml {CHART}/crds/"
    );
}

#[test]
fn chart_installs_the_operator_version_of_this_crate() {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Chart {
        api_version: String,
        app_version: String,
    }
    let chart: Chart = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root().join(CHART).join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(chart.api_version, "v2");
    assert_eq!(chart.app_version, env!("CARGO_PKG_VERSION"));
    let image = find(&render(&[]), "Deployment", "questdb-operator")["spec"]["template"]["spec"]
        ["containers"][0]["image"]
        .clone();
    assert_eq!(
        image,
        json!(format!("{TEST_IMAGE}:{}", env!("CARGO_PKG_VERSION")))
    );
    // No default image: an install without one is refused, saying where the image comes from.
    let out = run_helm(&["template", RELEASE, CHART, "--set", "image.repository="]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("image.repository is required"),
        "{stderr}"
    );
}

/// `v` with every run of whitespace in its strings made one space. kustomize 5.5 reads a folded
/// scalar (`>-`) with more-indented lines, as the admission policy's CEL has, with one newline
/// too many; CEL does not care, and neither does this cross-check.
fn squeezed(v: &Value) -> Value {
    match v {
        Value::String(s) => json!(s.split_whitespace().collect::<Vec<_>>().join(" ")),
        Value::Array(a) => Value::Array(a.iter().map(squeezed).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), squeezed(v))).collect())
        }
        other => other.clone(),
    }
}

#[test]
fn kustomize_reading_of_deploy_is_what_kubectl_kustomize_builds() {
    // The parity tests read deploy/ with the small kustomize above; check that reading against
    // the real one (cluster-scoped objects' metadata.namespace aside: kustomize 5.5 does not know
    // ValidatingAdmissionPolicy is cluster-scoped, and the apiserver drops it). kubectl is
    // required: .ci/test builds it from the control plane's Go module when it is missing.
    let version = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .expect("kubectl on the PATH (.ci/test builds it when it is missing)");
    assert!(version.status.success());
    for dir in ["deploy", "deploy/namespaced"] {
        let out = Command::new("kubectl")
            .args(["kustomize", dir])
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let strip = |objects: Vec<Value>| -> BTreeMap<Key, Value> {
            by_key(objects)
                .into_iter()
                .map(|(k, mut o)| {
                    if CLUSTER_SCOPED.contains(&k.0.as_str()) {
                        o["metadata"].as_object_mut().unwrap().remove("namespace");
                    }
                    (k, o)
                })
                .collect()
        };
        let real = strip(documents(&String::from_utf8(out.stdout).unwrap()));
        let ours = strip(kustomize(&root().join(dir)));
        assert_eq!(
            real.keys().collect::<Vec<_>>(),
            ours.keys().collect::<Vec<_>>(),
            "{dir}: objects"
        );
        for (key, o) in &real {
            let mut diffs = Vec::new();
            differences(&squeezed(o), &squeezed(&ours[key]), "", &mut diffs);
            assert!(
                diffs.is_empty(),
                "{dir} {key:?}: kubectl kustomize vs ours: {diffs:?}"
            );
        }
    }
}

/// The harm: a backup or snapshot object deleted by mistake (or with its namespace) taking the
/// EBS snapshot with it. The chart can install a class whose snapshots are retained.
#[test]
fn the_chart_installs_a_retaining_volume_snapshot_class_only_when_asked() {
    let none = render(&[]);
    assert!(
        !none.iter().any(|o| o["kind"] == "VolumeSnapshotClass"),
        "not by default: the snapshot CRDs may not be installed"
    );
    let objects = render(&["-f", &format!("{CHART}/ci/all-values.yaml")]);
    let class = find(&objects, "VolumeSnapshotClass", "ebs-retain");
    assert_eq!(class["deletionPolicy"], "Retain");
    assert_eq!(class["driver"], "ebs.csi.aws.com");
    assert_eq!(
        class["metadata"]["annotations"]["snapshot.storage.kubernetes.io/is-default-class"],
        "true"
    );
}

/// `helm test` runs the operator's preflight with exactly the flags the Deployment runs with
/// (for every value set: `ci/all-values.yaml`), its ServiceAccount (its AWS identity) and its
/// image: a test that checked another configuration than the one running would pass a broken
/// install. What the preflight finds is tested where it runs (tests/integration/eks.rs runs
/// this Pod's command against the control plane and moto).
#[test]
fn helm_test_runs_the_preflight_with_the_deployments_own_flags() {
    for extra in [
        vec!["--set", DEPLOY_IMAGE],
        vec![
            "-f",
            &format!("{CHART}/ci/aws-values.yaml"),
            "--set",
            DEPLOY_IMAGE,
        ],
        vec!["-f", &format!("{CHART}/ci/all-values.yaml")],
    ] {
        let objects = render(&extra);
        let deployment = objects
            .iter()
            .find(|o| kind(o) == "Deployment")
            .expect("a Deployment");
        let name = deployment["metadata"]["name"].as_str().unwrap().to_string();
        let run_args = deployment_args(&objects, &name);
        let pod = find(&objects, "Pod", &format!("{name}-preflight"));
        assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
        let spec = &pod["spec"];
        let template = &deployment["spec"]["template"]["spec"];
        assert_eq!(spec["serviceAccountName"], template["serviceAccountName"]);
        let container = &spec["containers"][0];
        assert_eq!(container["image"], template["containers"][0]["image"]);
        let args: Vec<String> = container["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        assert_eq!(args[0], "preflight");
        assert_eq!(
            args[1..],
            run_args[1..],
            "the Deployment's flags, {extra:?}"
        );
        let argv = std::iter::once("questdb-operator".to_string()).chain(args.iter().cloned());
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                command: CliCommand::Preflight(p),
                ..
            }) => assert_eq!(
                format!("{:?}", p.run),
                format!("{:?}", parse_run(&run_args)),
                "preflight reads the flags as run does"
            ),
            other => panic!("the operator refuses the helm test's arguments {args:?}: {other:?}"),
        }
    }
}

/// Values written before node moves were called so (`nodes.upgrade.*`) still set the node-move
/// flags for one release, and `nodes.move.*` wins where both are set.
#[test]
fn values_under_the_old_upgrade_name_still_set_the_node_move_flags() {
    let path = values_file(
        "old-upgrade-values.yaml",
        "nodes:\n  upgrade:\n    nodeTimeout: 7m\n    concurrency: 5\n  move:\n    concurrency: 4\n",
    );
    let objects = render(&["--set", DEPLOY_IMAGE, "-f", path.to_str().unwrap()]);
    let run = parse_run(&deployment_args(&objects, "questdb-operator"));
    assert_eq!(run.cloud.node_move_join_timeout.as_secs(), 420);
    assert_eq!(run.cloud.node_move_concurrency, 4, "nodes.move wins");
}

//! The Helm chart on the real control plane: `helm install` (the real helm, built from its Go
//! module) is the operator's whole install, and the operator then runs under the chart's RBAC
//! and admission policy alone. A rule the chart lacks, or an object the apiserver refuses,
//! fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use questdb_operator::manager::ManagerOptions;
use questdb_testenv::rbac::{Install, OPERATOR_NAMESPACE};
use questdb_testenv::ControlPlaneOptions;

use crate::harness::{cluster, is_ready, questdb_crd, wait_for, Env};

const NS: &str = "tenant-helm";

/// The real helm: `QDB_HELM_BIN`, else built (once, then cached) by hack/helm/build.sh.
fn helm() -> PathBuf {
    if let Some(bin) = std::env::var_os("QDB_HELM_BIN") {
        return bin.into();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("hack/helm/build.sh"))
        .output()
        .expect("running hack/helm/build.sh");
    assert!(
        out.status.success(),
        "building helm failed (the chart tests need the real helm): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().expect("helm's path").trim().into()
}

/// A control plane with the test cluster's CRD and no operator RBAC: the chart installs it.
pub(crate) async fn env_for_the_chart() -> Env {
    Env::without_manager(
        ControlPlaneOptions {
            rbac: Install::Nothing,
            ..cluster()
        },
        questdb_crd(),
    )
    .await
}

/// `helm install questdb-operator charts/questdb-operator` into the operator's namespace with
/// `extra` arguments (values files), the CRD left to the test cluster; fails the test on error.
pub(crate) async fn helm_install(env: &Env, extra: &[&Path]) {
    helm_install_with(env, extra, false).await
}

/// [`helm_install`], with the chart's CRDs (`crds`: as a first install on a cluster does).
async fn helm_install_with(env: &Env, extra: &[&Path], crds: bool) {
    let kubeconfig = env.cp.dir().join("admin.kubeconfig");
    std::fs::write(&kubeconfig, env.cp.kubeconfig_yaml()).expect("kubeconfig written");
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/questdb-operator");
    let helm = helm();
    let values: Vec<PathBuf> = extra.iter().map(|p| p.to_path_buf()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(helm);
        cmd.args(["install", "questdb-operator"])
            .arg(&chart)
            .args([
                "--namespace",
                OPERATOR_NAMESPACE,
                "--create-namespace",
                // The chart has no default image (none is published); the tests run the
                // operator in-process, so any name serves.
                "--set",
                "image.repository=registry.example.com/questdb/questdb-operator",
                "--kubeconfig",
            ])
            .arg(&kubeconfig);
        if !crds {
            cmd.arg("--skip-crds");
        }
        for file in &values {
            cmd.arg("-f").arg(file);
        }
        cmd.output().expect("running helm")
    })
    .await
    .expect("helm ran");
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_alone_grants_the_operator_what_it_needs_to_run_a_database() {
    let mut env = env_for_the_chart().await;
    // The CRD is the test cluster's (its failover floor is the test kubelets' Lease); the
    // chart's own is byte for byte crds/questdb.yaml (tests/helm_chart.rs).
    helm_install(&env, &[]).await;
    assert!(
        Api::<Deployment>::namespaced(env.client.clone(), OPERATOR_NAMESPACE)
            .get_opt("questdb-operator")
            .await
            .expect("deployment read")
            .is_some(),
        "the operator's Deployment is installed"
    );
    assert!(
        Api::<ValidatingAdmissionPolicy>::all(env.client.clone())
            .list(&Default::default())
            .await
            .expect("policies")
            .items
            .len()
            == 1,
        "the admission policy is installed"
    );

    // The operator's identity is the chart's ServiceAccount, bound by nothing but the chart.
    env.start_synced_manager(ManagerOptions::default()).await;
    env.namespace(NS).await;
    env.create_questdb(NS, "db1", |_| {}).await;
    wait_for(
        &env.api::<questdb_operator::api::QuestDB>(NS),
        "db1",
        "db1 Ready under the chart's RBAC",
        is_ready(),
    )
    .await;
    env.stop().await;
}

/// The harm: a stolen operator token reading every Secret of the cluster (other tenants'
/// credentials, service-account tokens). Installed with `rbac.secretNamespaces`, the
/// operator's identity lists Secrets in those namespaces only, still runs a database there with
/// its generated credentials and ILP keys, and refuses a database elsewhere naming the flag
/// instead of waiting on a Secret it cannot read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_with_secret_namespaces_reads_no_other_namespaces_secrets() {
    use k8s_openapi::api::core::v1::Secret;
    use questdb_operator::api::QuestDB;
    use questdb_operator::desired::TenancyPolicy;

    let mut env = env_for_the_chart().await;
    env.namespace(NS).await;
    let elsewhere = "tenant-elsewhere";
    env.namespace(elsewhere).await;
    let values = env.cp.dir().join("secret-namespaces.yaml");
    std::fs::write(&values, format!("rbac:\n  secretNamespaces: [{NS}]\n")).unwrap();
    helm_install(&env, &[&values]).await;

    let operator = kube::Client::try_from(env.cp.operator_config().await).unwrap();
    let forbidden = |what: &str, r: kube::Result<kube::core::ObjectList<Secret>>| match r {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("{what}: forbidden, not {:?}", other.map(|l| l.items.len())),
    };
    forbidden(
        "every Secret of the cluster",
        Api::<Secret>::all(operator.clone())
            .list(&Default::default())
            .await,
    );
    forbidden(
        "another namespace's Secrets",
        Api::<Secret>::namespaced(operator.clone(), elsewhere)
            .list(&Default::default())
            .await,
    );
    forbidden(
        "kube-system's Secrets",
        Api::<Secret>::namespaced(operator.clone(), "kube-system")
            .list(&Default::default())
            .await,
    );
    Api::<Secret>::namespaced(operator, NS)
        .list(&Default::default())
        .await
        .expect("its databases' namespace");

    env.start_synced_manager(ManagerOptions {
        tenancy: TenancyPolicy {
            secret_namespaces: vec![NS.to_string()],
            ..Default::default()
        },
        ..ManagerOptions::default()
    })
    .await;
    env.create_questdb(NS, "db1", |_| {}).await;
    env.create_questdb(elsewhere, "db2", |_| {}).await;
    wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "db1 Ready with its Secrets read in its namespace only",
        is_ready(),
    )
    .await;
    let refused = wait_for(
        &env.api::<QuestDB>(elsewhere),
        "db2",
        "db2 refused: the operator may not read its namespace's Secrets",
        crate::harness::has_condition("SpecValid", "InvalidSpec"),
    )
    .await;
    let message = crate::harness::condition_message(&refused, "SpecValid");
    assert!(
        message.contains("--secret-namespaces") && message.contains(NS),
        "{message}"
    );
    env.stop().await;
}

/// The README's CRD upgrade after a Helm install: Helm created the CRD, so its field manager
/// owns the CRD's fields, and a server-side apply of a newer CRD is refused with a conflict
/// unless it forces, as the README's command does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_crd_upgrade_applies_after_a_helm_install() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    const CRD: &str = "questdbs.crd.questdb.io";
    let env = env_for_the_chart().await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    crds.delete(CRD, &Default::default())
        .await
        .expect("the test cluster's CRD deleted");
    crate::harness::wait_until("the test cluster's CRD is gone", || {
        let crds = crds.clone();
        async move { crds.get_opt(CRD).await.is_ok_and(|c| c.is_none()) }
    })
    .await;
    helm_install_with(&env, &[], true).await;

    // The next chart version's CRD: this one with a changed description.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let chart_crd = "charts/questdb-operator/crds/questdb.yaml";
    let text = std::fs::read_to_string(root.join(chart_crd)).unwrap();
    let newer: Vec<String> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            use serde::Deserialize;
            let mut crd = serde_json::Value::deserialize(doc).expect("a CRD");
            if crd["metadata"]["name"] == CRD {
                crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] =
                    "A QuestDB database (the next chart version).".into();
            }
            serde_yaml_ng::to_string(&crd).unwrap()
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let newer_file = dir.path().join("questdb.yaml");
    std::fs::write(&newer_file, newer.join("---\n")).unwrap();
    let kubeconfig = env.cp.dir().join("admin.kubeconfig");
    let kubectl = |args: Vec<String>| {
        let out = Command::new("kubectl")
            .args(&args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .expect("kubectl on the PATH (.ci/test builds it when it is missing)");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let plain = ["apply", "--server-side", "-f"]
        .iter()
        .map(|a| a.to_string())
        .chain([newer_file.display().to_string()])
        .collect();
    let (ok, said) = kubectl(plain);
    assert!(!ok && said.contains("conflict"), "without forcing: {said}");

    // The documented command (docs/operations/install.md, "Upgrades"), on the newer file.
    let install = std::fs::read_to_string(root.join("docs/operations/install.md")).unwrap();
    let command = install
        .split('`')
        .find(|c| c.starts_with("kubectl apply --server-side") && c.ends_with(chart_crd))
        .expect("the documented CRD upgrade command");
    let args: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .map(|a| {
            if a == chart_crd {
                newer_file.display().to_string()
            } else {
                a.to_string()
            }
        })
        .collect();
    let (ok, said) = kubectl(args);
    assert!(ok, "{command}: {said}");
    let applied = crds.get(CRD).await.expect("CRD");
    let description = applied.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.description.clone());
    assert_eq!(
        description.as_deref(),
        Some("A QuestDB database (the next chart version).")
    );
}

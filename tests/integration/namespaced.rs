//! The namespaced install (`deploy/namespaced/`): a cluster that grants the operator one
//! namespace and nothing cluster-wide. The operator runs under exactly that Role here, so a
//! read it is not granted (a Node, a StorageClass, another namespace) fails the test.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::api::{Patch, PatchParams, PostParams};
use kube::ResourceExt;
use questdb_operator::api::QuestDB;
use questdb_operator::ilp_auth::testing::TestKey;
use questdb_operator::manager::ManagerOptions;
use questdb_testenv::rbac::{Install, OPERATOR_NAMESPACE};
use questdb_testenv::ControlPlaneOptions;
use serde_json::json;

use crate::harness::{cluster, has_condition, is_ready, wait_for, Env};

const OTHER: &str = "not-granted";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_only_install_runs_its_databases_without_reading_anything_cluster_wide() {
    let env = Env::start_on(
        ControlPlaneOptions {
            rbac: Install::Namespaced,
            ..cluster()
        },
        ManagerOptions {
            namespace: Some(OPERATOR_NAMESPACE.into()),
            ..Default::default()
        },
        crate::harness::questdb_crd(),
    )
    .await;
    let ns = OPERATOR_NAMESPACE;
    env.namespace(OTHER).await;
    let key = TestKey::derived("ingest-1", 7);
    env.api(ns)
        .create(
            &PostParams::default(),
            &key.json_secret_for(ns, "client-key", "db"),
        )
        .await
        .expect("key Secret");
    env.create_questdb(ns, "db", |q| {
        q.spec.volume.storage_class_name = Some("gp3-fixed".into());
        q.spec.volume.size = "1Gi".into();
    })
    .await;
    env.create_questdb(OTHER, "db", |_| {}).await;

    let qdbs = env.api::<QuestDB>(ns);
    let q = wait_for(&qdbs, "db", "QuestDB Ready", is_ready()).await;
    let status = q.status.unwrap_or_default();
    // No Node read: where the database runs still shows, from the pod.
    assert!(status.node_name.is_some(), "{status:?}");
    assert!(status.node_ip.is_some(), "{status:?}");
    assert_eq!(status.node_ready, None, "unknown without a Node read");
    let auth = env
        .api::<ConfigMap>(ns)
        .get("db-ilp-auth")
        .await
        .expect("the key Secret of its own namespace became the auth file");
    let txt = auth.data.unwrap_or_default();
    assert_eq!(txt.get("auth.txt"), Some(&key.auth_line()));

    // Growing on a class without expansion: no StorageClass read here, the apiserver's resize
    // admission refuses, and that refusal is reported rather than retried forever.
    qdbs.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"volume": {"size": "2Gi"}}})),
    )
    .await
    .expect("grow");
    wait_for(
        &qdbs,
        "db",
        "not expandable",
        has_condition("VolumeSizeReady", "NotExpandable"),
    )
    .await;
    let pvc = env
        .api::<PersistentVolumeClaim>(ns)
        .get("db-data")
        .await
        .expect("pvc");
    assert_eq!(
        questdb_operator::desired::requested_size(&pvc).as_deref(),
        Some("1Gi")
    );

    // The namespace it was not granted is not its business: the QuestDB there got nothing.
    let other = env
        .api::<QuestDB>(OTHER)
        .get("db")
        .await
        .expect("other QuestDB");
    assert!(other.status.is_none(), "{:?}", other.status);
    assert!(other.finalizers().is_empty());
    let sts = env
        .api::<StatefulSet>(OTHER)
        .get_opt("db")
        .await
        .expect("list");
    assert!(sts.is_none(), "a StatefulSet appeared in {OTHER}");
    env.stop().await;
}

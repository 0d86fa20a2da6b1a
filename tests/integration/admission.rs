//! The operator's writes, confined by the apiserver (`deploy/admission/`): what the token may
//! do is what the operator owns, whatever its RBAC grants.

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::harness::{wait_until, Env};

/// A stolen operator token (or a bug) writes nothing the operator does not own: the apiserver's
/// admission policy (`deploy/admission/`) refuses, whatever the ClusterRole grants. Every other
/// test runs the operator under the same policy, so what it does still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_token_writes_nothing_it_does_not_own() {
    let env = Env::start().await;
    env.namespace("tenant-a").await;
    let admin = env.client.clone();
    let cm = |name: &str, labelled: bool| -> ConfigMap {
        let labels = if labelled {
            serde_json::json!({"app.kubernetes.io/managed-by": "questdb-operator"})
        } else {
            serde_json::json!({})
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}
        }))
        .unwrap()
    };
    Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &cm("aws-auth", false))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), "tenant-a")
        .create(&PostParams::default(), &cm("theirs", false))
        .await
        .unwrap();
    let operator = kube::Client::try_from(env.cp.operator_config().await).unwrap();
    let refused = |what: &str, result: kube::Result<ConfigMap>| match result {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => e.message,
        other => panic!("{what}: refused, not {other:?}"),
    };
    let patch = Patch::Merge(serde_json::json!({"data": {"mapRoles": "- rolearn: attacker"}}));
    // The policy is enforced once the apiserver has loaded it: wait for its first refusal
    // (a loaded apiserver's timeout or 500 is an error too, but not the policy's answer).
    let system = Api::<ConfigMap>::namespaced(operator.clone(), "kube-system");
    wait_until(
        "the policy refuses the operator's patch of kube-system/aws-auth",
        || {
            let system = system.clone();
            let patch = patch.clone();
            async move {
                matches!(
                    system.patch("aws-auth", &PatchParams::default(), &patch).await,
                    Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422
                )
            }
        },
    )
    .await;
    let message = refused(
        "kube-system/aws-auth",
        system
            .patch("aws-auth", &PatchParams::default(), &patch)
            .await,
    );
    assert!(message.contains("never writes in kube-system"), "{message}");

    let tenant = Api::<ConfigMap>::namespaced(operator.clone(), "tenant-a");
    let message = refused(
        "an unlabelled ConfigMap",
        tenant
            .patch("theirs", &PatchParams::default(), &patch)
            .await,
    );
    assert!(
        message.contains("only writes objects it manages"),
        "{message}"
    );
    refused(
        "creating an unlabelled ConfigMap",
        tenant
            .create(&PostParams::default(), &cm("new", false))
            .await,
    );
    // Its own kind of object it may write.
    tenant
        .create(&PostParams::default(), &cm("ours", true))
        .await
        .expect("a labelled ConfigMap");

    // A QuestDB: only a backup verification's throwaway database (a token that could create
    // any QuestDB could create a privileged database in any namespace... the schema refuses
    // that too, but the operator has no business making tenants' databases).
    let qdb = |name: &str, verifies: bool| {
        let mut q = questdb_operator::desired::testing::questdb(name, "tenant-a");
        q.metadata.uid = None;
        q.metadata.resource_version = None;
        q.metadata.labels = Some(
            [(
                "app.kubernetes.io/managed-by".to_string(),
                "questdb-operator".to_string(),
            )]
            .into_iter()
            .chain(verifies.then(|| ("crd.questdb.io/verifies".to_string(), "b1".to_string())))
            .collect(),
        );
        q
    };
    let qdbs = Api::<questdb_operator::api::QuestDB>::namespaced(operator.clone(), "tenant-a");
    match qdbs
        .create(&PostParams::default(), &qdb("anything", false))
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => assert!(
            e.message
                .contains("only creates and deletes the QuestDBs a backup's verification"),
            "{}",
            e.message
        ),
        other => panic!("a QuestDB that verifies nothing: refused, not {other:?}"),
    }
    qdbs.create(&PostParams::default(), &qdb("verify-b1", true))
        .await
        .expect("a verification's throwaway database");

    // A node that is no database's.
    let nodes = Api::<Node>::all(operator.clone());
    let label = Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}}));
    match nodes
        .patch("worker-a1", &PatchParams::default(), &label)
        .await
    {
        Err(kube::Error::Api(e)) => {
            assert!(
                e.message.contains("only updates dedicated nodes"),
                "{}",
                e.message
            )
        }
        other => panic!("refused, not {other:?}"),
    }
    env.stop().await;
}

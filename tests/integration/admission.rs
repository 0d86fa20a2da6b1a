//! The operator's writes, confined by the apiserver (`deploy/admission/`): what the token may
//! do is what the operator owns, whatever its RBAC grants.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

use crate::harness::{wait_until, Env};

/// The apiserver's refusal of `what` (its message), failing the test when it was not refused.
fn refusal<T: std::fmt::Debug>(what: &str, result: kube::Result<T>) -> String {
    match result {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => e.message,
        other => panic!("{what}: refused, not {other:?}"),
    }
}

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
    let message = refusal(
        "kube-system/aws-auth",
        system
            .patch("aws-auth", &PatchParams::default(), &patch)
            .await,
    );
    assert!(message.contains("never writes in kube-system"), "{message}");

    let tenant = Api::<ConfigMap>::namespaced(operator.clone(), "tenant-a");
    let message = refusal(
        "an unlabelled ConfigMap",
        tenant
            .patch("theirs", &PatchParams::default(), &patch)
            .await,
    );
    assert!(
        message.contains("only writes objects it manages"),
        "{message}"
    );
    refusal(
        "creating an unlabelled ConfigMap",
        tenant
            .create(&PostParams::default(), &cm("new", false))
            .await,
    );
    // Deleting what is not its own: judged on the object as it is, not as the request says.
    let message = refusal(
        "deleting an unlabelled ConfigMap",
        tenant.delete("theirs", &DeleteParams::default()).await,
    );
    assert!(
        message.contains("only writes objects it manages"),
        "{message}"
    );
    // Its own kind of object it may write.
    tenant
        .create(&PostParams::default(), &cm("ours", true))
        .await
        .expect("a labelled ConfigMap");

    // Secrets: a database's Opaque credentials only. A service-account-token Secret, even
    // labelled as the operator's, would be a token of whichever ServiceAccount it names.
    let secret = |name: &str, type_: &str| -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "questdb-operator"},
                "annotations": {"kubernetes.io/service-account.name": "default"},
            },
            "type": type_,
        }))
        .unwrap()
    };
    let secrets = Api::<Secret>::namespaced(operator.clone(), "tenant-a");
    for (name, type_) in [
        ("stolen-token", "kubernetes.io/service-account-token"),
        ("db1-credentials", "kubernetes.io/service-account-token"),
        ("anything", "Opaque"),
    ] {
        let message = refusal(
            &format!("a {type_} Secret named {name}"),
            secrets
                .create(&PostParams::default(), &secret(name, type_))
                .await,
        );
        assert!(
            message.contains("only creates Secrets of type Opaque"),
            "{message}"
        );
    }
    secrets
        .create(&PostParams::default(), &secret("db1-credentials", "Opaque"))
        .await
        .expect("a database's credentials");

    // StatefulSets: a labelled one still runs as no other ServiceAccount, never privileged,
    // never on the host's network or filesystem.
    let statefulset = |name: &str, pod: serde_json::Value| -> StatefulSet {
        let mut spec = serde_json::json!({
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "questdb/questdb:9.2.0"}],
        });
        for (k, v) in pod.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "questdb-operator"},
            },
            "spec": {
                "serviceName": name,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
            },
        }))
        .unwrap()
    };
    let statefulsets = Api::<StatefulSet>::namespaced(operator.clone(), "tenant-a");
    for (name, pod, expected) in [
        (
            "as-admin",
            serde_json::json!({"serviceAccountName": "cluster-admin-sa"}),
            "run as the default ServiceAccount",
        ),
        (
            "with-token",
            serde_json::json!({"automountServiceAccountToken": true}),
            "run as the default ServiceAccount",
        ),
        (
            "privileged",
            serde_json::json!({"containers": [{"name": "c", "image": "questdb/questdb:9.2.0",
                "securityContext": {"privileged": true}}]}),
            "never run privileged",
        ),
        (
            "host-network",
            serde_json::json!({"hostNetwork": true}),
            "never run privileged",
        ),
        (
            "host-root",
            serde_json::json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
            "never run privileged",
        ),
    ] {
        let message = refusal(
            &format!("a StatefulSet {name}"),
            statefulsets
                .create(&PostParams::default(), &statefulset(name, pod))
                .await,
        );
        assert!(message.contains(expected), "{name}: {message}");
    }
    let ours = statefulsets
        .create(
            &PostParams::default(),
            &statefulset("plain", serde_json::json!({})),
        )
        .await
        .expect("a StatefulSet as the operator builds them");
    // An update is judged on what it leaves: turning its own StatefulSet privileged is refused.
    let escalate = Patch::Merge(serde_json::json!({"spec": {"template": {"spec": {
        "serviceAccountName": "cluster-admin-sa"}}}}));
    let message = refusal(
        "an update naming a ServiceAccount",
        statefulsets
            .patch(
                ours.metadata.name.as_deref().unwrap(),
                &PatchParams::default(),
                &escalate,
            )
            .await,
    );
    assert!(
        message.contains("run as the default ServiceAccount"),
        "{message}"
    );

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

//! Deletion: finalizers, garbage collection, namespace termination, pod grace periods.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

use crate::support::*;

async fn owned_configmap(cms: &Api<ConfigMap>, name: &str, owners: &[&ConfigMap]) -> ConfigMap {
    let mut cm = configmap(name);
    let refs: Vec<_> = owners
        .iter()
        .map(|o| {
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "name": o.metadata.name, "uid": o.metadata.uid,
            })
        })
        .collect();
    cm.metadata.owner_references = Some(serde_json::from_value(json!(refs)).unwrap());
    cms.create(&PostParams::default(), &cm).await.unwrap()
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let mut cm = configmap("f");
    cm.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();

    cms.delete("f", &DeleteParams::default()).await.unwrap();
    let terminating = cms
        .get("f")
        .await
        .expect("still there while a finalizer remains");
    assert!(terminating.metadata.deletion_timestamp.is_some());

    let add = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}});
    let err = cms
        .patch("f", &PatchParams::default(), &Patch::Merge(&add))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422, "no new finalizers on a terminating object");

    let clear = json!({"metadata": {"finalizers": null}});
    cms.patch("f", &PatchParams::default(), &Patch::Merge(&clear))
        .await
        .unwrap();
    assert_eq!(code(&cms.get("f").await.unwrap_err()), 404);
    sim.shutdown().await;
}

#[tokio::test]
async fn background_deletion_collects_dependents_whose_owners_are_all_gone() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let owner = cms
        .create(&PostParams::default(), &configmap("owner"))
        .await
        .unwrap();
    let other = cms
        .create(&PostParams::default(), &configmap("other"))
        .await
        .unwrap();
    owned_configmap(&cms, "child", &[&owner]).await;
    owned_configmap(&cms, "shared", &[&owner, &other]).await;
    let grandchild_owner = cms.get("child").await.unwrap();
    owned_configmap(&cms, "grandchild", &[&grandchild_owner]).await;

    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    assert_eq!(code(&cms.get("child").await.unwrap_err()), 404);
    assert_eq!(code(&cms.get("grandchild").await.unwrap_err()), 404);
    let shared = cms
        .get("shared")
        .await
        .expect("another owner keeps it alive");
    let refs = shared.metadata.owner_references.unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!(refs[0].name, "other");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_dependent_written_after_its_owner_is_gone_is_collected() {
    // A controller acting on a stale cache recreates a child of an owner that was just deleted;
    // the garbage collector must take it, or it blocks the owner's successor forever.
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let owner = cms
        .create(&PostParams::default(), &configmap("gone-owner"))
        .await
        .unwrap();
    cms.delete("gone-owner", &DeleteParams::default())
        .await
        .unwrap();
    owned_configmap(&cms, "late-child", &[&owner]).await;
    assert_eq!(code(&cms.get("late-child").await.unwrap_err()), 404);
    let alive = cms
        .create(&PostParams::default(), &configmap("live-owner"))
        .await
        .unwrap();
    owned_configmap(&cms, "kept-child", &[&owner, &alive]).await;
    cms.get("kept-child")
        .await
        .expect("one live owner keeps it");
    sim.shutdown().await;
}

#[tokio::test]
async fn orphan_deletion_removes_owner_references() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let owner = cms
        .create(&PostParams::default(), &configmap("owner"))
        .await
        .unwrap();
    owned_configmap(&cms, "child", &[&owner]).await;
    cms.delete("owner", &DeleteParams::orphan()).await.unwrap();
    let child = cms.get("child").await.expect("orphaned, not deleted");
    assert!(child.metadata.owner_references.is_none());
    sim.shutdown().await;
}

#[tokio::test]
async fn foreground_deletion_removes_dependents_before_the_owner() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let owner = cms
        .create(&PostParams::default(), &configmap("owner"))
        .await
        .unwrap();
    owned_configmap(&cms, "child", &[&owner]).await;
    cms.delete("owner", &DeleteParams::foreground())
        .await
        .unwrap();
    assert_eq!(code(&cms.get("child").await.unwrap_err()), 404);
    assert_eq!(code(&cms.get("owner").await.unwrap_err()), 404);
    sim.shutdown().await;
}

async fn namespace(client: &Client, name: &str) {
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_content() {
    let sim = sim().await;
    let client = sim.client().await;
    namespace(&client, "team").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    cms.create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(&cms.get("a").await.unwrap_err()), 404);
    assert_eq!(code(&nss.get("team").await.unwrap_err()), 404);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_running_pod_terminates_gracefully_until_a_zero_grace_delete() {
    let sim = sim().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await, "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"nodeName": "absent-node", "terminationGracePeriodSeconds": 20,
                 "containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    let terminating = pods
        .get("p")
        .await
        .expect("a bound pod waits for its kubelet");
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(20));
    pods.delete(
        "p",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(code(&pods.get("p").await.unwrap_err()), 404);
    sim.shutdown().await;
}

//! create / update / patch semantics.

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn create_stamps_server_fields_and_honours_generate_name() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let mut cm = configmap("");
    cm.metadata.name = None;
    cm.metadata.generate_name = Some("gen-".into());
    let created = cms
        .create(&PostParams::default(), &cm)
        .await
        .expect("created");
    let name = created.metadata.name.clone().expect("name generated");
    assert!(
        name.starts_with("gen-") && name.len() == "gen-".len() + 5,
        "{name}"
    );
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert!(created.metadata.resource_version.is_some());
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));

    let again = cms
        .create(&PostParams::default(), &created)
        .await
        .unwrap_err();
    assert_eq!(
        (code(&again), reason(&again).as_str()),
        (409, "AlreadyExists")
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn create_in_a_missing_namespace_is_not_found() {
    let sim = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await, "nowhere");
    let err = cms
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap_err();
    assert_eq!((code(&err), reason(&err).as_str()), (404, "NotFound"));
    sim.shutdown().await;
}

#[tokio::test]
async fn update_with_a_stale_resource_version_conflicts() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let v1 = cms
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let mut v2 = v1.clone();
    v2.data = Some([("k".to_string(), "v2".to_string())].into());
    let v2 = cms
        .replace("a", &PostParams::default(), &v2)
        .await
        .expect("fresh update");
    assert_ne!(v1.metadata.resource_version, v2.metadata.resource_version);

    let err = cms
        .replace("a", &PostParams::default(), &v1)
        .await
        .unwrap_err();
    assert_eq!((code(&err), reason(&err).as_str()), (409, "Conflict"));

    // An empty resourceVersion is an unconditional update.
    let mut blind = v1.clone();
    blind.metadata.resource_version = None;
    blind.data = Some([("k".to_string(), "v3".to_string())].into());
    let v3 = cms
        .replace("a", &PostParams::default(), &blind)
        .await
        .expect("unconditional");
    assert_eq!(v3.data.unwrap()["k"], "v3");

    // A merge patch carrying a stale resourceVersion is a precondition too.
    let stale =
        json!({"metadata": {"resourceVersion": v2.metadata.resource_version}, "data": {"k": "x"}});
    let err = cms
        .patch("a", &PatchParams::default(), &Patch::Merge(&stale))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 409);
    sim.shutdown().await;
}

#[tokio::test]
async fn no_op_update_does_not_bump_the_resource_version() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let v1 = cms
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let same = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v"}})),
        )
        .await
        .unwrap();
    assert_eq!(v1.metadata.resource_version, same.metadata.resource_version);
    sim.shutdown().await;
}

#[tokio::test]
async fn generation_changes_only_with_the_spec() {
    let sim = sim().await;
    let client = sim.client().await;
    let widgets = install_widgets(&client).await;
    let w = widgets
        .create(&PostParams::default(), &widget("w", json!({"size": 1})))
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(1));
    let w = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        w.metadata.generation,
        Some(1),
        "metadata changes keep the generation"
    );
    let w = widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        w.metadata.generation,
        Some(1),
        "status changes keep the generation"
    );
    let w = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(2));
    sim.shutdown().await;
}

#[tokio::test]
async fn status_subresource_is_isolated_from_the_main_resource() {
    let sim = sim().await;
    let client = sim.client().await;
    let widgets = install_widgets(&client).await;
    let mut w = widget("w", json!({"size": 1}));
    w.data["status"] = json!({"phase": "Forged"});
    let created = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create"
    );

    let both = json!({"spec": {"size": 5}, "status": {"phase": "Ready"}});
    let via_main = widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .unwrap();
    assert_eq!(via_main.data["spec"]["size"], 5);
    assert!(
        via_main.data.get("status").is_none(),
        "main resource ignores status"
    );

    let both = json!({"spec": {"size": 9}, "status": {"phase": "Ready"}});
    let via_status = widgets
        .patch_status("w", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .unwrap();
    assert_eq!(via_status.data["status"]["phase"], "Ready");
    assert_eq!(
        via_status.data["spec"]["size"], 5,
        "status subresource ignores spec"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn merge_and_json_patches_apply() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    cms.create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let merged = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": null, "n": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.data.unwrap(),
        [("n".to_string(), "1".to_string())].into()
    );

    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/data/m", "value": "2"},
        {"op": "replace", "path": "/data/n", "value": "3"}
    ]))
    .unwrap();
    let patched = cms
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    let data = patched.data.unwrap();
    assert_eq!((data["m"].as_str(), data["n"].as_str()), ("2", "3"));

    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/m", "value": "nope"}]))
            .unwrap();
    let err = cms
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(failing))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    sim.shutdown().await;
}

#[tokio::test]
async fn strategic_merge_patch_merges_containers_by_name() {
    let sim = sim().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await, "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [
            {"name": "a", "image": "a:1"},
            {"name": "b", "image": "b:1"}
        ]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let patch = json!({"spec": {"containers": [{"name": "b", "image": "b:2"}]}});
    let p = pods
        .patch("p", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let images: Vec<_> = p
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.image.unwrap())
        .collect();
    assert_eq!(images, ["a:1", "b:2"]);
    sim.shutdown().await;
}

#[tokio::test]
async fn server_side_apply_creates_merges_and_reports_conflicts() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let mine = PatchParams::apply("mine");
    let cfg = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"owner": "mine"}});
    cms.patch("a", &mine, &Patch::Apply(&cfg))
        .await
        .expect("apply creates");
    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"owner": "theirs"}});
    let err = cms
        .patch("a", &PatchParams::apply("theirs"), &Patch::Apply(&theirs))
        .await
        .unwrap_err();
    assert_eq!(
        code(&err),
        409,
        "a field owned by another manager conflicts"
    );
    let forced = cms
        .patch(
            "a",
            &PatchParams::apply("theirs").force(),
            &Patch::Apply(&theirs),
        )
        .await
        .expect("force takes ownership");
    assert_eq!(forced.data.unwrap()["owner"], "theirs");
    let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"other": "x"}});
    let merged = cms.patch("a", &mine, &Patch::Apply(&other)).await.unwrap();
    assert_eq!(
        merged.data.unwrap().len(),
        2,
        "apply merges into the existing object"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists() {
    let sim = sim().await;
    let client = sim.client().await;
    let cms = configmaps(&client);
    for (name, tier) in [("a", "gold"), ("b", "silver"), ("c", "")] {
        let mut cm = configmap(name);
        if !tier.is_empty() {
            cm.metadata.labels = Some([("tier".to_string(), tier.to_string())].into());
        }
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect()
    };
    let cases = [
        ("tier=gold", vec!["a"]),
        ("tier!=gold", vec!["b", "c"]),
        ("tier in (gold,silver)", vec!["a", "b"]),
        ("tier notin (gold)", vec!["b", "c"]),
        ("tier", vec!["a", "b"]),
        ("!tier", vec!["c"]),
    ];
    for (selector, want) in cases {
        let got = names(
            cms.list(&ListParams::default().labels(selector))
                .await
                .unwrap(),
        );
        assert_eq!(got, want, "labelSelector {selector}");
    }
    let got = names(
        cms.list(&ListParams::default().fields("metadata.name=b"))
            .await
            .unwrap(),
    );
    assert_eq!(got, ["b"]);

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, node) in [("p1", "n1"), ("p2", "n2")] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let on_n2 = pods
        .list(&ListParams::default().fields("spec.nodeName=n2"))
        .await
        .unwrap();
    assert_eq!(on_n2.items.len(), 1);
    assert_eq!(on_n2.items[0].metadata.name.as_deref(), Some("p2"));
    let err = cms
        .list(&ListParams::default().fields("spec.nodeName=n2"))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 400, "spec.nodeName is a pod-only field");
    sim.shutdown().await;
}

#[tokio::test]
async fn lists_paginate_with_limit_and_continue() {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};

    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    for name in ["a", "b", "c", "d", "e"] {
        cms.create(&PostParams::default(), &configmap(name))
            .await
            .unwrap();
    }
    let first = cms.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().expect("a continue token");
    let second = cms
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    let names: Vec<_> = second
        .items
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["c", "d"]);
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );

    // A kube-runtime watcher paging 2 at a time still sees everything.
    let cfg = watcher::Config::default().page_size(2);
    let seen: Vec<ConfigMap> = within(
        "a paged initial list",
        watcher(cms.clone(), cfg)
            .applied_objects()
            .take(5)
            .map(|r| r.unwrap())
            .collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(seen.len(), 5);
    sim.shutdown().await;
}

//! Custom resources: discovery, schema admission, CEL rules, printer columns.

use http::Request;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::discovery::Discovery;
use serde_json::{json, Value};

use crate::support::*;

#[tokio::test]
async fn discovery_serves_builtins_and_an_installed_crd() {
    let sim = sim().await;
    let client = sim.client().await;
    install_widgets(&client).await;
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_string()).collect();
    for g in [
        "",
        "apps",
        "coordination.k8s.io",
        "storage.k8s.io",
        "events.k8s.io",
        "apiextensions.k8s.io",
        "example.com",
    ] {
        assert!(
            groups.iter().any(|x| x == g),
            "group {g:?} missing from {groups:?}"
        );
    }
    let (widget, caps) = discovery
        .groups()
        .find(|g| g.name() == "example.com")
        .and_then(|g| g.recommended_kind("Widget"))
        .expect("Widget discovered");
    assert_eq!(widget.plural, "widgets");
    assert!(caps
        .subresources
        .iter()
        .any(|(s, _)| s.plural == "widgets/status" || s.plural == "status"));
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get("widgets.example.com")
        .await
        .unwrap();
    let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(conditions
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True"));
    sim.shutdown().await;
}

#[tokio::test]
async fn schema_defaults_prunes_and_rejects_invalid_objects() {
    let sim = sim().await;
    let widgets = install_widgets(&sim.client().await).await;
    let w = widgets
        .create(
            &PostParams::default(),
            &widget("w", json!({"size": 1, "junk": true, "extra": {"kept": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(w.data["spec"]["color"], "blue", "default applied");
    assert!(w.data["spec"].get("junk").is_none(), "unknown field pruned");
    assert_eq!(
        w.data["spec"]["extra"]["kept"], 1,
        "preserve-unknown-fields kept"
    );

    for (name, spec, field) in [
        ("missing", json!({"color": "red"}), "spec.size"),
        ("wrongtype", json!({"size": "big"}), "spec.size"),
        (
            "badenum",
            json!({"size": 1, "color": "green"}),
            "spec.color",
        ),
        ("negative", json!({"size": -1}), "spec.size"),
    ] {
        let err = widgets
            .create(&PostParams::default(), &widget(name, spec))
            .await
            .unwrap_err();
        assert_eq!(code(&err), 422, "{name}");
        let kube::Error::Api(status) = &err else {
            unreachable!()
        };
        assert!(status.message.contains(field), "{name}: {}", status.message);
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn cel_rules_run_with_old_self_on_updates() {
    let sim = sim().await;
    let widgets = install_widgets(&sim.client().await).await;
    widgets
        .create(&PostParams::default(), &widget("w", json!({"size": 5})))
        .await
        .unwrap();
    let shrink = json!({"spec": {"size": 4}});
    let err = widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(&shrink))
        .await
        .unwrap_err();
    assert_eq!((code(&err), reason(&err).as_str()), (422, "Invalid"));
    let kube::Error::Api(status) = &err else {
        unreachable!()
    };
    assert!(
        status.message.contains("size may not shrink"),
        "{}",
        status.message
    );

    let grow = json!({"spec": {"size": 6}});
    widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .expect("growing is fine");

    let too_big = json!({"spec": {"size": 10, "max": 7}});
    let err = widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(&too_big))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = &err else {
        unreachable!()
    };
    assert!(
        status.message.contains("size 10 exceeds max"),
        "messageExpression: {}",
        status.message
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn table_output_uses_the_printer_columns() {
    let sim = sim().await;
    let client = sim.client().await;
    let widgets = install_widgets(&client).await;
    widgets
        .create(&PostParams::default(), &widget("w", json!({"size": 3})))
        .await
        .unwrap();
    widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}})),
        )
        .await
        .unwrap();
    let req = Request::get("/apis/example.com/v1/namespaces/default/widgets")
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .unwrap();
    let table: Value = client.request(req).await.expect("table");
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Name", "Size", "Phase", "Age"]);
    let cells = &table["rows"][0]["cells"];
    assert_eq!(
        (cells[0].clone(), cells[1].clone(), cells[2].clone()),
        (json!("w"), json!(3), json!("Ready"))
    );
    assert!(
        cells[3].as_str().is_some_and(|age| age.ends_with('s')),
        "age: {}",
        cells[3]
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn deleting_the_crd_stops_serving_its_resource() {
    let sim = sim().await;
    let client = sim.client().await;
    let widgets = install_widgets(&client).await;
    widgets
        .create(&PostParams::default(), &widget("w", json!({"size": 3})))
        .await
        .unwrap();
    Api::<CustomResourceDefinition>::all(client.clone())
        .delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    let err = widgets.list(&Default::default()).await.unwrap_err();
    assert_eq!(code(&err), 404);
    sim.shutdown().await;
}

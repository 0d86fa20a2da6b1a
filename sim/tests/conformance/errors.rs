//! Bad input gets Kubernetes' answers.

use http::Request;
use kube::api::PostParams;
use kube::Client;

use crate::support::*;

async fn status_of(client: &Client, req: Request<Vec<u8>>) -> (u16, String) {
    match client.request_text(req).await {
        Ok(_) => (200, String::new()),
        Err(e) => (code(&e), reason(&e)),
    }
}

fn post(path: &str, content_type: &str, body: &str) -> Request<Vec<u8>> {
    Request::post(path)
        .header("Content-Type", content_type)
        .body(body.as_bytes().to_vec())
        .unwrap()
}

#[tokio::test]
async fn malformed_json_is_a_bad_request() {
    let sim = sim().await;
    let client = sim.client().await;
    let got = status_of(
        &client,
        post(
            "/api/v1/namespaces/default/configmaps",
            "application/json",
            "{not json",
        ),
    )
    .await;
    assert_eq!(got, (400, "BadRequest".into()));
    sim.shutdown().await;
}

#[tokio::test]
async fn unknown_resources_are_not_found() {
    let sim = sim().await;
    let client = sim.client().await;
    for path in [
        "/api/v1/namespaces/default/gizmos",
        "/apis/nope.example.com/v1/things",
        "/no/such/path",
    ] {
        let got = status_of(&client, Request::get(path).body(vec![]).unwrap()).await;
        assert_eq!(got.0, 404, "{path}");
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn wrong_content_types_are_unsupported() {
    let sim = sim().await;
    let client = sim.client().await;
    configmaps(&client)
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let got = status_of(
        &client,
        post("/api/v1/namespaces/default/configmaps", "text/plain", "{}"),
    )
    .await;
    assert_eq!(got, (415, "UnsupportedMediaType".into()));
    let patch = Request::patch("/api/v1/namespaces/default/configmaps/a")
        .header("Content-Type", "application/xml")
        .body(b"{}".to_vec())
        .unwrap();
    assert_eq!(status_of(&client, patch).await.0, 415);
    sim.shutdown().await;
}

#[tokio::test]
async fn invalid_names_are_rejected() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    for bad in ["Upper", "under_score", "-dash"] {
        let err = cms
            .create(&PostParams::default(), &configmap(bad))
            .await
            .unwrap_err();
        assert_eq!(
            (code(&err), reason(&err).as_str()),
            (422, "Invalid"),
            "{bad}"
        );
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn unsupported_methods_are_not_allowed() {
    let sim = sim().await;
    let client = sim.client().await;
    let req = Request::put("/api/v1/namespaces/default/configmaps")
        .header("Content-Type", "application/json")
        .body(b"{}".to_vec())
        .unwrap();
    assert_eq!(
        status_of(&client, req).await,
        (405, "MethodNotAllowed".into())
    );
    sim.shutdown().await;
}

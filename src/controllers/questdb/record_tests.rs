//! `persist` against a scripted apiserver: what it writes after a 409 decides whether a stale
//! decision can overwrite a step another writer recorded.

use http::{Method, Request, Response};
use kube::client::Body;
use kube::Api;
use tower_test::mock::{self, Handle};

use super::persist_to;
use crate::api::{FailoverPhase, FailoverStatus, QuestDB, QuestDBStatus};
use crate::controllers::Error;
use crate::desired::testing;

const CONFLICT: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the object has been modified; please apply your changes to the latest version and try again","reason":"Conflict","code":409}"#;

fn stored(resource_version: &str, failover: Option<FailoverPhase>, generation: i64) -> QuestDB {
    let mut q = testing::questdb("db", "ns");
    q.metadata.resource_version = Some(resource_version.into());
    q.metadata.generation = Some(generation);
    q.status = Some(QuestDBStatus {
        failover: failover.map(|phase| FailoverStatus {
            phase,
            ..FailoverStatus::default()
        }),
        ..QuestDBStatus::default()
    });
    q
}

fn respond(status: u16, body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("response")
}

async fn body_of(req: Request<Body>) -> Vec<u8> {
    use http_body_util::BodyExt as _;
    req.into_body()
        .collect()
        .await
        .expect("request body")
        .to_bytes()
        .to_vec()
}

fn api() -> (Api<QuestDB>, Handle<Request<Body>, Response<Body>>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (
        Api::namespaced(kube::Client::new(service, "ns"), "ns"),
        handle,
    )
}

/// Another writer (a previous leader, another term) recorded a step after this decision was
/// made: the decision is dropped and made again on the fresh object, never written over it.
#[tokio::test]
async fn a_decision_made_on_a_stale_status_is_made_again_not_written_over_a_newer_step() {
    let (api, mut handle) = api();
    let mut decided_on = stored("1", None, 1);
    let newer = stored("2", Some(FailoverPhase::Fencing), 1);
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("the write");
        assert_eq!(req.method(), Method::PUT);
        assert!(
            req.uri().path().ends_with("/questdbs/db/status"),
            "{}",
            req.uri()
        );
        send.send_response(respond(409, CONFLICT.into()));
        let (req, send) = handle.next_request().await.expect("the re-read");
        assert_eq!(req.method(), Method::GET);
        send.send_response(respond(200, serde_json::to_vec(&newer).unwrap()));
        // Nothing else: no second write.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(200), handle.next_request())
                .await
                .is_err(),
            "a second write after the status changed"
        );
    });
    let result = persist_to(&api, &mut decided_on, |s| {
        s.failover = Some(FailoverStatus {
            phase: FailoverPhase::Releasing,
            ..FailoverStatus::default()
        })
    })
    .await;
    server.await.expect("scripted apiserver");
    assert!(matches!(result, Err(Error::Conflict)), "{result:?}");
    assert_eq!(
        decided_on.status.and_then(|s| s.failover).map(|f| f.phase),
        Some(FailoverPhase::Fencing),
        "the reconcile goes on from the fresh object"
    );
}

/// A user's spec edit between two writes of one reconcile is no reason to lose the record of
/// a side effect already done: the edit is applied again to the object as it is now.
#[tokio::test]
async fn a_spec_edit_under_a_decision_does_not_lose_its_record() {
    let (api, mut handle) = api();
    let mut decided_on = stored("1", None, 1);
    let edited = stored("2", None, 2);
    let server = tokio::spawn(async move {
        let (_, send) = handle.next_request().await.expect("the write");
        send.send_response(respond(409, CONFLICT.into()));
        let (_, send) = handle.next_request().await.expect("the re-read");
        send.send_response(respond(200, serde_json::to_vec(&edited).unwrap()));
        let (req, send) = handle.next_request().await.expect("the write again");
        assert_eq!(req.method(), Method::PUT);
        let written: QuestDB = serde_json::from_slice(&body_of(req).await).expect("a QuestDB");
        assert_eq!(written.metadata.resource_version.as_deref(), Some("2"));
        assert_eq!(
            written
                .status
                .as_ref()
                .and_then(|s| s.failover.as_ref())
                .map(|f| f.phase),
            Some(FailoverPhase::Releasing)
        );
        send.send_response(respond(200, serde_json::to_vec(&written).unwrap()));
    });
    persist_to(&api, &mut decided_on, |s| {
        s.failover = Some(FailoverStatus {
            phase: FailoverPhase::Releasing,
            ..FailoverStatus::default()
        })
    })
    .await
    .expect("written");
    server.await.expect("scripted apiserver");
    assert_eq!(decided_on.metadata.generation, Some(2));
}

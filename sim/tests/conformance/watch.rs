//! Watch protocol: resume, bookmarks, expiry, timeouts, selector transitions.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use questdb_sim::SimConfig;
use serde_json::json;

use crate::support::*;

fn rv(cm: &ConfigMap) -> String {
    cm.metadata
        .resource_version
        .clone()
        .expect("resourceVersion")
}

fn name_of(e: &WatchEvent<ConfigMap>) -> (String, String) {
    match e {
        WatchEvent::Added(o) => ("ADDED".into(), o.metadata.name.clone().unwrap()),
        WatchEvent::Modified(o) => ("MODIFIED".into(), o.metadata.name.clone().unwrap()),
        WatchEvent::Deleted(o) => ("DELETED".into(), o.metadata.name.clone().unwrap()),
        WatchEvent::Bookmark(_) => ("BOOKMARK".into(), String::new()),
        WatchEvent::Error(e) => ("ERROR".into(), e.reason.clone()),
    }
}

#[tokio::test]
async fn watch_resumes_after_a_resource_version() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let a = cms
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &configmap("b"))
        .await
        .unwrap();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    cms.delete("b", &Default::default()).await.unwrap();

    let stream = cms.watch(&WatchParams::default(), &rv(&a)).await.unwrap();
    let events: Vec<_> = within("replayed events", stream.take(3).try_collect::<Vec<_>>())
        .await
        .unwrap();
    let got: Vec<_> = events.iter().map(name_of).collect();
    assert_eq!(
        got,
        [
            ("ADDED".into(), "b".into()),
            ("MODIFIED".into(), "a".into()),
            ("DELETED".into(), "b".into())
        ]
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn watch_past_the_window_is_gone() {
    let sim = sim_with(SimConfig {
        watch_window: 2,
        ..SimConfig::default()
    })
    .await;
    let cms = configmaps(&sim.client().await);
    let first = cms
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    for name in ["b", "c", "d"] {
        cms.create(&PostParams::default(), &configmap(name))
            .await
            .unwrap();
    }
    let mut stream = cms
        .watch(&WatchParams::default(), &rv(&first))
        .await
        .unwrap()
        .boxed();
    let event = within("the expiry", stream.next())
        .await
        .expect("one event")
        .unwrap();
    match event {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    assert!(within("end of stream", stream.next()).await.is_none());
    sim.shutdown().await;
}

#[tokio::test]
async fn bookmarks_are_sent_when_allowed() {
    let sim = sim_with(SimConfig {
        bookmark_interval: Duration::from_millis(50),
        ..SimConfig::default()
    })
    .await;
    let cms = configmaps(&sim.client().await);
    let a = cms
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let stream = cms.watch(&WatchParams::default(), &rv(&a)).await.unwrap();
    let mut stream = stream.boxed();
    let b = cms
        .create(&PostParams::default(), &configmap("b"))
        .await
        .unwrap();
    let bookmark = within("a bookmark", async {
        while let Some(e) = stream.next().await {
            if let WatchEvent::Bookmark(bm) = e.unwrap() {
                return bm;
            }
        }
        panic!("stream ended without a bookmark");
    })
    .await;
    let at: u64 = bookmark.metadata.resource_version.parse().unwrap();
    assert!(
        at >= rv(&b).parse::<u64>().unwrap(),
        "bookmark covers the create of b"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn watch_ends_after_timeout_seconds() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let stream = cms
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap();
    // Only the system's own state could arrive; the stream must end by itself.
    let events: Vec<_> = within("the server-side timeout", stream.collect::<Vec<_>>()).await;
    assert!(events.iter().all(|e| e.is_ok()));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_label_change_moves_objects_in_and_out_of_a_filtered_watch() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    let a = cms
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let stream = cms
        .watch(&WatchParams::default().labels("pick=yes"), &rv(&a))
        .await
        .unwrap();
    let label = |v: Option<&str>| json!({"metadata": {"labels": {"pick": v}}});
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(label(Some("yes"))),
    )
    .await
    .unwrap();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(label(None)))
        .await
        .unwrap();
    let events: Vec<_> = within("transitions", stream.take(2).try_collect::<Vec<_>>())
        .await
        .unwrap();
    let got: Vec<_> = events.iter().map(name_of).map(|(t, _)| t).collect();
    assert_eq!(got, ["ADDED", "DELETED"]);
    sim.shutdown().await;
}

#[tokio::test]
async fn initial_events_are_streamed_and_closed_by_a_bookmark() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    cms.create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let wp = WatchParams::default().initial_events();
    let mut stream = cms.watch(&wp, "").await.unwrap().boxed();
    let first = within("initial ADDED", stream.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name_of(&first), ("ADDED".into(), "a".into()));
    match within("end-of-initial-events bookmark", stream.next())
        .await
        .unwrap()
        .unwrap()
    {
        WatchEvent::Bookmark(b) => {
            assert_eq!(
                b.metadata
                    .annotations
                    .get("k8s.io/initial-events-end")
                    .map(String::as_str),
                Some("true")
            )
        }
        other => panic!("expected the initial-events-end bookmark, got {other:?}"),
    }
    sim.shutdown().await;
}

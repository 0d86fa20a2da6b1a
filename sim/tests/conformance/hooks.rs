//! Test hooks: faults, request counts, cutting watches.

use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{watcher, WatchStreamExt};
use questdb_sim::{Fault, SimConfig, Verb};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn injected_status_codes_hit_matching_requests_a_limited_number_of_times() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    cms.create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    sim.inject_fault(
        Fault::status(500)
            .on(Verb::Get, "configmaps")
            .named("a")
            .times(2),
    );
    for _ in 0..2 {
        assert_eq!(code(&cms.get("a").await.unwrap_err()), 500);
    }
    cms.get("a").await.expect("fault used up");

    // kube-rs retries 429/503/504 by itself: one injected 503 costs one extra request.
    sim.reset_request_counts();
    sim.inject_fault(Fault::status(503).on(Verb::Get, "configmaps").times(1));
    cms.get("a").await.expect("retried past the 503");
    assert_eq!(sim.request_counts().get(Verb::Get, "configmaps"), 2);

    sim.inject_fault(Fault::status(500).on(Verb::Create, "configmaps"));
    cms.list(&ListParams::default())
        .await
        .expect("other verbs unaffected");
    assert_eq!(
        code(
            &cms.create(&PostParams::default(), &configmap("b"))
                .await
                .unwrap_err()
        ),
        500
    );
    sim.clear_faults();
    cms.create(&PostParams::default(), &configmap("b"))
        .await
        .expect("faults cleared");
    sim.shutdown().await;
}

#[tokio::test]
async fn injected_latency_delays_requests() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    sim.inject_fault(
        Fault::latency(Duration::from_millis(300))
            .on(Verb::List, "configmaps")
            .times(1),
    );
    let started = Instant::now();
    cms.list(&ListParams::default()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    sim.shutdown().await;
}

#[tokio::test]
async fn requests_are_counted_by_verb_and_resource_except_the_simulators_own() {
    let sim = sim_with(SimConfig::sandbox()).await;
    let client = sim.client().await;
    sim.reset_request_counts();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // The simulated scheduler binds the pod: internal writes that must not be counted.
    within(
        "the pod to be scheduled",
        await_condition(pods.clone(), "p", |p: Option<&Pod>| {
            p.and_then(|p| p.spec.as_ref()?.node_name.as_ref())
                .is_some()
        }),
    )
    .await
    .unwrap();
    pods.get("p").await.unwrap();
    let counts = sim.request_counts();
    assert_eq!(counts.get(Verb::Create, "pods"), 1);
    assert_eq!(counts.get(Verb::Get, "pods"), 1);
    assert_eq!(
        counts.writes(),
        1,
        "only the test's create is a counted write: {counts:?}"
    );
    assert!(counts.get(Verb::List, "pods") + counts.get(Verb::Watch, "pods") >= 1);
    assert!(
        counts.get(Verb::Update, "pods/status") == 0 && counts.get(Verb::Patch, "pods/status") == 0
    );
    sim.reset_request_counts();
    assert_eq!(sim.request_counts().total(), 0);
    sim.shutdown().await;
}

async fn seen(names: &mut BoxStream<'_, Option<String>>, want: &str) {
    while let Some(n) = names.next().await {
        if n.as_deref() == Some(want) {
            return;
        }
    }
    panic!("watcher ended before {want}");
}

#[tokio::test]
async fn a_kube_watcher_recovers_after_watches_are_cut() {
    let sim = sim().await;
    let client = sim.client().await;
    let cms = configmaps(&client);
    cms.create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let mut names = watcher(cms.clone(), watcher::Config::default())
        .applied_objects()
        .map(|o: Result<ConfigMap, _>| o.ok().and_then(|c| c.metadata.name))
        .boxed();
    within("the first object", seen(&mut names, "a")).await;
    let watches_before = sim.request_counts().get(Verb::Watch, "configmaps");
    sim.cut_watches();
    cms.create(&PostParams::default(), &configmap("b"))
        .await
        .unwrap();
    within("the watcher to recover", seen(&mut names, "b")).await;
    let watches_after = sim.request_counts().get(Verb::Watch, "configmaps");
    assert!(
        watches_after > watches_before,
        "the watcher re-watched ({watches_before} -> {watches_after})"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn sandbox_nodes_register_and_become_ready() {
    let sim = sim_with(SimConfig::sandbox()).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(sim.client().await);
    for name in ["sim-node-a1", "sim-node-a2", "sim-node-b1"] {
        within(
            "a Ready node",
            await_condition(
                nodes.clone(),
                name,
                |n: Option<&k8s_openapi::api::core::v1::Node>| {
                    n.and_then(|n| n.status.as_ref()?.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                },
            ),
        )
        .await
        .unwrap();
    }
    sim.shutdown().await;
}

type Events = BoxStream<'static, Result<watcher::Event<ConfigMap>, watcher::Error>>;

async fn init_done(events: &mut Events) {
    while let Some(e) = events.next().await {
        if matches!(e, Ok(watcher::Event::InitDone)) {
            return;
        }
    }
    panic!("watcher ended");
}

#[tokio::test]
async fn expiring_watches_makes_a_kube_watcher_relist() {
    let sim = sim().await;
    let cms = configmaps(&sim.client().await);
    cms.create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let mut events: Events = watcher(cms.clone(), watcher::Config::default()).boxed();
    within("the initial list", init_done(&mut events)).await;
    let lists_before = sim.request_counts().get(Verb::List, "configmaps");
    sim.expire_watches();
    within("a relist", init_done(&mut events)).await;
    assert!(sim.request_counts().get(Verb::List, "configmaps") > lists_before);
    sim.shutdown().await;
}

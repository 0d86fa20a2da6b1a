use std::collections::BTreeMap;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use prometheus_parse::{Scrape, Value};
use tower::{Layer, Service, ServiceExt};

use super::*;

/// Parses an exposition the way Prometheus would; a parse failure fails the test.
fn scrape(metrics: &Metrics) -> Scrape {
    let text = metrics.render();
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("exposition parses")
}

/// The value of the sample `name` whose labels include all of `labels`.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            other => panic!("{name} is not a scalar: {other:?}"),
        })
}

/// `(count, sum)` of histogram `name` with the given labels (its `_count` and `_sum` samples).
fn histogram(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> (f64, f64) {
    let count = value(scrape, &format!("{name}_count"), labels);
    let sum = value(scrape, &format!("{name}_sum"), labels);
    match (count, sum) {
        (Some(count), Some(sum)) => (count, sum),
        _ => panic!("histogram {name} {labels:?} missing"),
    }
}

const C: &str = "questdb";

fn reconcile(metrics: &ControllerMetrics, key: &str, outcome: ReconcileOutcome) {
    metrics.start(key).finish(outcome);
}

#[test]
fn a_new_controller_exposes_every_result_at_zero() {
    let metrics = Metrics::new();
    metrics.controller(C, 4);
    let s = scrape(&metrics);
    for result in ["success", "error", "requeue", "requeue_after"] {
        assert_eq!(
            value(
                &s,
                "controller_runtime_reconcile_total",
                &[("controller", C), ("result", result)]
            ),
            Some(0.0),
            "result {result}"
        );
    }
    assert_eq!(
        value(
            &s,
            "controller_runtime_max_concurrent_reconciles",
            &[("controller", C)]
        ),
        Some(4.0)
    );
    assert_eq!(
        value(
            &s,
            "workqueue_retries_total",
            &[("name", C), ("controller", C)]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(&s, "questdb_operator_questdbs", &[("phase", "Running")]),
        Some(0.0)
    );
    assert_eq!(
        value(&s, "questdb_operator_triggers_total", &[("controller", C)]),
        Some(0.0)
    );
}

/// Every request a watch hands the controller is counted, merged or not.
#[test]
fn every_trigger_is_counted_as_it_is_handed_over() {
    let metrics = Metrics::new();
    let controller = metrics.controller(C, 1);
    for _ in 0..3 {
        controller.observe_trigger();
    }
    reconcile(&controller, "ns/a", ReconcileOutcome::Success);
    let s = scrape(&metrics);
    assert_eq!(
        value(&s, "questdb_operator_triggers_total", &[("controller", C)]),
        Some(3.0)
    );
}

#[test]
fn no_series_carries_an_instance_label() {
    let metrics = Metrics::new();
    let cm = metrics.controller(C, 1);
    reconcile(&cm, "db/q1", ReconcileOutcome::Success);
    metrics.aws_call("ec2", "RunInstances", "ok");
    metrics.set_leader("questdb-operator", true);
    let s = scrape(&metrics);
    assert!(!s.samples.is_empty());
    for sample in &s.samples {
        assert!(
            sample.labels.get("instance").is_none(),
            "{} has an instance label",
            sample.metric
        );
    }
}

#[test]
fn reconcile_outcomes_are_counted_by_result() {
    let metrics = Metrics::new();
    let cm = metrics.controller(C, 2);
    reconcile(&cm, "db/q1", ReconcileOutcome::Success);
    reconcile(&cm, "db/q1", ReconcileOutcome::Success);
    reconcile(&cm, "db/q2", ReconcileOutcome::Error);
    reconcile(
        &cm,
        "db/q2",
        ReconcileOutcome::RequeueAfter(Duration::from_secs(30)),
    );
    reconcile(&cm, "db/q3", ReconcileOutcome::Requeue);
    drop(cm.start("db/q4")); // a cancelled reconcile is an error

    let s = scrape(&metrics);
    let total = |result| {
        value(
            &s,
            "controller_runtime_reconcile_total",
            &[("controller", C), ("result", result)],
        )
    };
    assert_eq!(total("success"), Some(2.0));
    assert_eq!(total("error"), Some(2.0));
    assert_eq!(total("requeue_after"), Some(1.0));
    assert_eq!(total("requeue"), Some(1.0));
    assert_eq!(
        value(
            &s,
            "controller_runtime_reconcile_errors_total",
            &[("controller", C)]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &s,
            "workqueue_retries_total",
            &[("name", C), ("controller", C)]
        ),
        Some(3.0),
        "errors and plain requeues are retries"
    );
    assert_eq!(
        value(
            &s,
            "controller_runtime_active_workers",
            &[("controller", C)]
        ),
        Some(0.0)
    );
    let (count, _) = histogram(
        &s,
        "controller_runtime_reconcile_time_seconds",
        &[("controller", C)],
    );
    assert_eq!(count, 6.0);
}

#[tokio::test(start_paused = true)]
async fn workqueue_figures_follow_the_reconciles_in_flight() {
    let metrics = Metrics::new();
    let cm = metrics.controller(C, 2);
    let q = |s: &Scrape, name| value(s, name, &[("name", C), ("controller", C)]);
    let labels = &[("name", C), ("controller", C)];

    let first = cm.start("db/q1");
    tokio::time::advance(Duration::from_secs(1)).await;
    let second = cm.start("db/q2");
    tokio::time::advance(Duration::from_secs(3)).await;
    let s = scrape(&metrics);
    assert_eq!(
        value(
            &s,
            "controller_runtime_active_workers",
            &[("controller", C)]
        ),
        Some(2.0)
    );
    assert_eq!(
        q(&s, "workqueue_longest_running_processor_seconds"),
        Some(4.0)
    );
    assert_eq!(q(&s, "workqueue_unfinished_work_seconds"), Some(7.0));

    first.finish(ReconcileOutcome::RequeueAfter(Duration::from_secs(10)));
    let s = scrape(&metrics);
    assert_eq!(
        histogram(&s, "workqueue_work_duration_seconds", labels),
        (1.0, 4.0)
    );
    assert_eq!(
        q(&s, "workqueue_longest_running_processor_seconds"),
        Some(3.0)
    );

    tokio::time::advance(Duration::from_secs(2)).await;
    second.finish(ReconcileOutcome::Success);
    let s = scrape(&metrics);
    assert_eq!(
        histogram(&s, "workqueue_work_duration_seconds", labels),
        (2.0, 9.0)
    );
    assert_eq!(
        q(&s, "workqueue_longest_running_processor_seconds"),
        Some(0.0)
    );
    assert_eq!(q(&s, "workqueue_unfinished_work_seconds"), Some(0.0));
    assert_eq!(q(&s, "workqueue_retries_total"), Some(0.0));
}

/// kube-runtime's scheduler is private: queue depth, adds and the time an object waits could
/// only be approximated, so they are not exported at all, not even after reconciles and requeues.
#[test]
fn approximated_workqueue_families_are_not_exported() {
    let metrics = Metrics::new();
    let cm = metrics.controller(C, 1);
    reconcile(&cm, "db/q1", ReconcileOutcome::Success);
    reconcile(&cm, "db/q1", ReconcileOutcome::Requeue);
    reconcile(
        &cm,
        "db/q2",
        ReconcileOutcome::RequeueAfter(Duration::from_secs(5)),
    );
    let text = metrics.render();
    assert!(
        text.contains("workqueue_work_duration_seconds"),
        "the exact workqueue families are exported:\n{text}"
    );
    for dropped in [
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds",
    ] {
        assert!(
            !text.contains(dropped),
            "{dropped} is an approximation and must not be exported:\n{text}"
        );
    }
}

#[tokio::test]
async fn calls_made_inside_a_reconcile_are_attributed_to_it() {
    let metrics = Metrics::new();
    let cm = metrics.controller(C, 1);
    let call = ApiCall {
        verb: "get".into(),
        resource: "nodes".into(),
    };
    // Outside any reconcile (a watch, leader election): counted globally only.
    metrics.record_rest_request(&call, "GET", "h:1", Some(200), Duration::ZERO);

    let m = Arc::clone(&metrics);
    let returned = cm
        .instrument(
            "db/q1",
            async move {
                m.record_rest_request(&call, "GET", "h:1", Some(200), Duration::ZERO);
                m.record_rest_request(&call, "GET", "h:1", Some(404), Duration::ZERO);
                m.aws_call("ec2", "DescribeInstances", "throttled");
                Ok::<_, std::io::Error>(7)
            },
            |result| match result {
                Ok(_) => ReconcileOutcome::Success,
                Err(_) => ReconcileOutcome::Error,
            },
        )
        .await;
    assert_eq!(returned.expect("reconcile result is passed through"), 7);

    let s = scrape(&metrics);
    let c = &[("controller", C)];
    assert_eq!(
        histogram(&s, "questdb_operator_reconcile_api_calls", c),
        (1.0, 2.0)
    );
    assert_eq!(
        histogram(&s, "questdb_operator_reconcile_aws_calls", c),
        (1.0, 1.0)
    );
    assert_eq!(
        value(
            &s,
            "rest_client_requests_total",
            &[("code", "200"), ("method", "GET"), ("host", "h:1")]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &s,
            "questdb_operator_aws_requests_total",
            &[
                ("service", "ec2"),
                ("operation", "DescribeInstances"),
                ("outcome", "throttled")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(metrics.api_calls().count("get", "nodes"), 3);
}

#[test]
fn questdb_phases_are_counted_from_the_source_at_scrape_time() {
    let metrics = Metrics::new();
    let phases = Arc::new(std::sync::Mutex::new(vec![
        Some(Phase::Running),
        Some(Phase::Running),
        None,
    ]));
    let source = Arc::clone(&phases);
    metrics.set_phase_source(move || source.lock().expect("test lock").clone());
    let s = scrape(&metrics);
    assert_eq!(
        value(&s, "questdb_operator_questdbs", &[("phase", "Running")]),
        Some(2.0)
    );
    assert_eq!(
        value(&s, "questdb_operator_questdbs", &[("phase", PHASE_UNKNOWN)]),
        Some(1.0)
    );

    *phases.lock().expect("test lock") = vec![Some(Phase::FailingOver)];
    let s = scrape(&metrics);
    assert_eq!(
        value(&s, "questdb_operator_questdbs", &[("phase", "Running")]),
        Some(0.0)
    );
    assert_eq!(
        value(&s, "questdb_operator_questdbs", &[("phase", "FailingOver")]),
        Some(1.0)
    );
}

#[test]
fn failovers_node_moves_and_leadership_are_exposed() {
    let metrics = Metrics::new();
    metrics.failover_finished(FailoverResult::Succeeded, Some(Duration::from_secs(95)));
    metrics.failover_finished(FailoverResult::Suppressed, None);
    metrics.node_move_finished(NodeMoveResult::RolledBack, Some(Duration::from_secs(12)));
    metrics.condition_transition("Ready", "False", "NodeNotReady");
    metrics.orphaned_instance_terminated();
    metrics.leaked_instance_terminated();
    metrics.set_leader("questdb-operator", true);
    metrics.set_leader("questdb-operator", false);

    let s = scrape(&metrics);
    let failovers = |r| value(&s, "questdb_operator_failovers_total", &[("result", r)]);
    assert_eq!(failovers("succeeded"), Some(1.0));
    assert_eq!(failovers("suppressed"), Some(1.0));
    assert_eq!(failovers("failed"), Some(0.0));
    assert_eq!(
        histogram(&s, "questdb_operator_failover_downtime_seconds", &[]),
        (1.0, 95.0)
    );
    assert_eq!(
        histogram(&s, "questdb_operator_node_move_downtime_seconds", &[]),
        (1.0, 12.0)
    );
    assert_eq!(
        value(
            &s,
            "questdb_operator_node_moves_total",
            &[("result", "rolled_back")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "questdb_operator_condition_transitions_total",
            &[
                ("type", "Ready"),
                ("status", "False"),
                ("reason", "NodeNotReady")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "questdb_operator_orphaned_instances_terminated_total",
            &[]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "questdb_operator_leaked_instances_terminated_total",
            &[]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "leader_election_master_status",
            &[("name", "questdb-operator")]
        ),
        Some(0.0)
    );
}

#[tokio::test]
async fn the_client_layer_counts_requests_by_code_method_and_verb() {
    let metrics = Metrics::new();
    let layer = RestMetricsLayer::new(
        Arc::clone(&metrics),
        &"https://10.0.0.1:6443".parse().expect("uri"),
    );
    let mut service = layer.layer(tower::service_fn(|req: Request<()>| async move {
        let status = if req.uri().path().ends_with("/missing") {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        };
        Ok::<_, std::convert::Infallible>(
            Response::builder()
                .status(status)
                .body(())
                .expect("response"),
        )
    }));
    let send = |method: Method, path: &str| {
        Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .expect("request")
    };
    for request in [
        send(Method::GET, "/api/v1/namespaces/db/configmaps/missing"),
        send(Method::GET, "/api/v1/namespaces/db/configmaps/c1"),
        send(Method::PATCH, "/api/v1/namespaces/db/configmaps/c1"),
    ] {
        service
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("response");
    }

    let s = scrape(&metrics);
    let requests = |code, method| {
        value(
            &s,
            "rest_client_requests_total",
            &[
                ("code", code),
                ("method", method),
                ("host", "10.0.0.1:6443"),
            ],
        )
    };
    assert_eq!(requests("404", "GET"), Some(1.0));
    assert_eq!(requests("200", "GET"), Some(1.0));
    assert_eq!(requests("200", "PATCH"), Some(1.0));
    let (count, _) = histogram(
        &s,
        "rest_client_request_duration_seconds",
        &[("verb", "GET"), ("host", "10.0.0.1:6443")],
    );
    assert_eq!(count, 2.0);
    let calls = metrics.api_calls();
    assert_eq!(calls.count("get", "configmaps"), 2);
    assert_eq!(calls.writes(), 1);
    let by_verb: BTreeMap<_, _> = calls.iter().map(|(c, n)| (c.verb.clone(), n)).collect();
    assert_eq!(by_verb.get("patch"), Some(&1));
}

#[tokio::test]
async fn an_instrumented_kube_client_counts_its_requests() {
    use crate::http_server::{bind, serve};
    use http_body_util::Full;
    use hyper::body::Bytes;
    use k8s_openapi::api::core::v1::ConfigMap;
    use tokio_util::sync::CancellationToken;

    let listener = bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let shutdown = CancellationToken::new();
    // A stand-in API server that knows one ConfigMap.
    let server = tokio::spawn(serve(listener, shutdown.clone(), |request| {
        let (status, body) = if request.uri().path() == "/api/v1/namespaces/db/configmaps/c1" {
            (
                StatusCode::OK,
                r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c1","namespace":"db"}}"#,
            )
        } else {
            (
                StatusCode::NOT_FOUND,
                r#"{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"NotFound","code":404,"message":"not found"}"#,
            )
        };
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("response")
    }));

    let metrics = Metrics::new();
    let config = kube::Config::new(format!("http://{addr}").parse().expect("cluster url"));
    let client = instrumented_client(config, Arc::clone(&metrics)).expect("client");
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "db");
    let cm = metrics.controller(C, 1);
    let found = cm
        .instrument(
            "db/c1",
            async {
                let found = api.get_opt("c1").await.expect("get c1");
                let missing = api.get_opt("missing").await.expect("get missing");
                (found.is_some(), missing.is_some())
            },
            |_| ReconcileOutcome::Success,
        )
        .await;
    assert_eq!(found, (true, false));

    let s = scrape(&metrics);
    let host = addr.to_string();
    let requests = |code| {
        value(
            &s,
            "rest_client_requests_total",
            &[("code", code), ("method", "GET"), ("host", host.as_str())],
        )
    };
    assert_eq!(requests("200"), Some(1.0));
    assert_eq!(requests("404"), Some(1.0));
    assert_eq!(
        histogram(
            &s,
            "questdb_operator_reconcile_api_calls",
            &[("controller", C)]
        ),
        (1.0, 2.0)
    );
    assert_eq!(metrics.api_calls().count("get", "configmaps"), 2);

    shutdown.cancel();
    server.await.expect("server task").expect("server result");
}

#[test]
fn an_unrepresentable_requeue_delay_is_recorded_without_panicking() {
    let metrics = Metrics::new();
    let cm = metrics.controller(C, 1);
    cm.start("db/q1")
        .finish(ReconcileOutcome::RequeueAfter(Duration::MAX));
    let s = scrape(&metrics);
    assert_eq!(
        value(
            &s,
            "controller_runtime_reconcile_total",
            &[("controller", C), ("result", "requeue_after")]
        ),
        Some(1.0)
    );
}

/// Four families the dashboards and alert rules query had no series until their first event,
/// so `rate()` over them was empty rather than 0: the known label values start at zero.
#[test]
fn families_with_known_labels_have_series_before_the_first_event() {
    let metrics = Metrics::new();
    let before = metrics.render();
    assert!(!before.contains("questdb_operator_failovers_suppressed_total{"));
    metrics.zero_known_labels(&KnownLabels {
        suppression_reasons: &["TooManyUnhealthyNodes"],
        failover_steps: &["Fencing"],
        node_move_steps: &["Moving"],
        controllers: &["questdb"],
        error_reasons: &["CloudApiError"],
    });
    let text = metrics.render();
    for line in [
        "questdb_operator_failovers_suppressed_total{reason=\"TooManyUnhealthyNodes\"} 0",
        "questdb_operator_failover_step_duration_seconds_count{step=\"Fencing\"} 0",
        "questdb_operator_node_move_step_duration_seconds_count{step=\"Moving\"} 0",
        "questdb_operator_reconcile_errors_total{controller=\"questdb\",reason=\"CloudApiError\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
    }
}

//! The failover benchmark: detection latency and the share of each step.

use super::*;

/// Benchmark, not a test (`--ignored`): the operator-added latency from a node crossing its
/// threshold to the fencing call, and each step's share of the downtime, over three power-off
/// failovers of three databases (five dedicated nodes, so the breaker lets one through at a
/// time) on this control plane. Prints figures; asserts only that each failover finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: QDB_TESTENV_TIMINGS=kubelet cargo test --test integration -- --ignored --nocapture failover_benchmark"]
async fn failover_benchmark_detection_latency_and_step_shares() {
    use questdb_operator::cloud::Ec2Api;
    let env = CloudEnv::start(settings()).await;
    let names: Vec<String> = (1..=5).map(|i| format!("bench{i}")).collect();
    for name in &names {
        env.create(name, |q| q.spec.failover.unhealthy_after_seconds = 10)
            .await;
    }
    eprintln!(
        "failover benchmark: node timings {} (Lease {} s; QDB_TESTENV_TIMINGS=kubelet for a real kubelet's), threshold {} s",
        if questdb_testenv::timings::real_node_timings() { "of a real kubelet" } else { "shortened" },
        questdb_testenv::timings::node_lease_duration().as_secs(),
        questdb_testenv::timings::node_lease_duration().as_secs().max(10),
    );
    let kinds = ["partition", "power-off", "terminated"];
    let mut downtimes = Vec::new();
    for (name, kind) in names.iter().zip(kinds) {
        let q = wait_for(&env.qdbs(), name, "QuestDB Ready", is_ready()).await;
        let id = q.status.and_then(|s| s.instance_id).expect("instance");
        let kubelet = env.cp.node(&node_name_for(&id)).expect("kubelet");
        let cut = std::time::Instant::now();
        match kind {
            "partition" => kubelet.partition(),
            // A hardware failure: EC2 keeps the instance running.
            "power-off" => kubelet.power_off(),
            _ => env
                .cloud
                .ec2
                .terminate_instances(std::slice::from_ref(&id))
                .await
                .expect("terminate"),
        }
        let q = wait_for_within(
            &env.qdbs(),
            name,
            "failover finished",
            FAILOVER_TIMEOUT,
            |q: Option<&QuestDB>| q.and_then(failover_phase).as_deref() == Some("Healthy"),
        )
        .await;
        let f = q.status.and_then(|s| s.failover).expect("record");
        let started = f.started_at.as_ref().map(|t| t.0);
        eprintln!(
            "failover benchmark: {kind:<10} reason {:<18} fault -> failover start ~{:>5.1} s, downtime {:?} s, fault -> Healthy {:>5.1} s",
            f.reason.map(|r| r.to_string()).unwrap_or_default(),
            started
                .map(|t| {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    cut.elapsed().as_secs_f64() - now.duration_since(t).as_secs_f64()
                })
                .unwrap_or(f64::NAN),
            f.downtime_seconds,
            cut.elapsed().as_secs_f64(),
        );
        downtimes.extend(f.downtime_seconds);
    }
    let text = env.handle.metrics.render();
    let value = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let detection = value("questdb_operator_failover_detection_latency_seconds_sum")
        / value("questdb_operator_failover_detection_latency_seconds_count").max(1.0);
    eprintln!(
        "failover benchmark: {} failovers, downtime (s, whole seconds) {downtimes:?}",
        downtimes.len()
    );
    eprintln!("failover benchmark: threshold crossed -> fencing call: mean {detection:.3} s (goal <= 1 s)");
    let steps = ["Fencing", "Releasing", "Reattaching", "Recovering"];
    let sums: Vec<f64> = steps
        .iter()
        .map(|s| {
            value(&format!(
                "questdb_operator_failover_step_duration_seconds_sum{{step=\"{s}\"}}"
            ))
        })
        .collect();
    let total: f64 = sums.iter().sum();
    for (step, sum) in steps.iter().zip(&sums) {
        eprintln!(
            "failover benchmark: {step:<12} mean {:>6.2} s  share {:>5.1} %",
            sum / downtimes.len().max(1) as f64,
            100.0 * sum / total.max(f64::EPSILON)
        );
    }
    env.stop().await;
}

//! Behaviour of the policy layer (idempotency, retries, rate limit, permanent errors) on the
//! in-memory backend, which models what moto cannot.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{timeout, Duration, Instant};

use super::*;
use crate::cloud::{
    identity_tags, CallCounter, CloudConfig, CloudError, DnsProvider, InstanceState, LaunchRequest,
    NodeProvider, RateLimit, RetryPolicy, StopMode, Taint, TAG_UID,
};

const AMI: &str = "ami-0123456789abcdef0";

fn config(cluster: &str) -> CloudConfig {
    let mut c = CloudConfig::new(cluster, "us-east-1");
    c.subnets_by_zone = BTreeMap::from([
        ("us-east-1a".to_string(), "subnet-a".to_string()),
        ("us-east-1b".to_string(), "subnet-b".to_string()),
    ]);
    c.security_group_ids = vec!["sg-1".into()];
    c.user_data_template =
        "--node-labels={{node_labels}} --register-with-taints={{node_taints}}".into();
    c.hosted_zone_id = Some("Z123".into());
    c.retry = RetryPolicy {
        min_delay: Duration::from_millis(50),
        max_delay: Duration::from_secs(1),
        max_retries: 5,
        eventual_consistency_window: Duration::from_secs(5),
        ..RetryPolicy::default()
    };
    c.rate_limit = RateLimit {
        per_second: 0.0,
        burst: 1,
    };
    c.route53_rate_limit = c.rate_limit.clone();
    c
}

fn cloud_with(config: CloudConfig, options: MemoryEc2Options) -> (MemoryCloud, CallCounter) {
    let counter = CallCounter::new();
    let cloud = MemoryCloud::new(config, options, Arc::new(counter.clone())).unwrap();
    (cloud, counter)
}

fn cloud() -> (MemoryCloud, CallCounter) {
    cloud_with(config("prod"), MemoryEc2Options::default())
}

fn request(uid: &str, generation: i64) -> LaunchRequest {
    LaunchRequest {
        namespace: "team-a".into(),
        name: format!("db-{uid}"),
        uid: uid.into(),
        node_generation: generation,
        image: AMI.into(),
        instance_type: "m6i.large".into(),
        zone: "us-east-1a".into(),
        labels: BTreeMap::from([("questdb.io/dedicated".to_string(), uid.to_string())]),
        taints: vec![Taint::new("questdb.io/dedicated", Some(uid), "NoSchedule")],
        public_ip: false,
        fallback_instance_types: Vec::new(),
        cluster_id: None,
    }
}

/// Instances of `uid`+`generation` that still count (not shutting down / terminated).
fn live_instances_of(ec2: &MemoryEc2, uid: &str, generation: i64) -> Vec<String> {
    let wanted = identity_tags("prod", uid, generation);
    ec2.instances()
        .into_iter()
        .filter(|i| !i.state.is_gone())
        .filter(|i| wanted.iter().all(|(k, v)| i.tags.get(k) == Some(v)))
        .map(|i| i.id)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn launched_instance_is_tagged_becomes_running_and_is_announced() {
    let (cloud, _) = cloud();
    let mut events = cloud.ec2.subscribe();
    let launched = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();

    assert_eq!(launched.state, InstanceState::Pending);
    assert!(
        launched.id.starts_with("i-") && launched.id.len() == 19,
        "{}",
        launched.id
    );
    assert!(launched.private_ip.as_deref().unwrap().starts_with("10.0."));
    assert_eq!(launched.zone, "us-east-1a");
    assert_eq!(launched.tags[TAG_UID], "uid-1");
    assert_eq!(launched.tags["questdb.io/cluster"], "prod");
    assert_eq!(
        launched.provider_id(),
        format!("aws:///us-east-1a/{}", launched.id)
    );

    let event = timeout(Duration::from_secs(5), events.recv())
        .await
        .unwrap()
        .unwrap();
    match event {
        InstanceEvent::Running(i) => assert_eq!(i.id, launched.id),
        other => panic!("unexpected {other:?}"),
    }
    let seen = cloud
        .nodes
        .describe(std::slice::from_ref(&launched.id))
        .await
        .unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].state, InstanceState::Running);
}

#[tokio::test(start_paused = true)]
async fn relaunch_of_the_same_generation_returns_the_same_instance() {
    let (cloud, _) = cloud();
    let first = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    let again = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    assert_eq!(first.id, again.id);
    assert_eq!(cloud.ec2.call_count("RunInstances"), 1);

    let next = cloud.nodes.launch(&request("uid-1", 2)).await.unwrap();
    assert_ne!(next.id, first.id);
    // Another QuestDB (another uid) never adopts this one's instance.
    let other = cloud.nodes.launch(&request("uid-2", 1)).await.unwrap();
    assert_ne!(other.id, first.id);
}

#[tokio::test(start_paused = true)]
async fn terminated_generation_is_reported_not_replaced() {
    let (cloud, _) = cloud();
    let first = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    cloud.nodes.terminate(&first.id, "uid-1").await.unwrap();
    let again = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    assert_eq!(again.id, first.id);
    assert!(again.state.is_gone());
    assert_eq!(cloud.ec2.call_count("RunInstances"), 1);
}

/// A manager killed at any point of a launch (before the call, while throttled, after EC2
/// created the instance but before the answer, while EC2 still hides the new instance) and
/// restarted: the retried launch ends with exactly one instance, the one it returns.
#[tokio::test(start_paused = true)]
async fn crash_anywhere_in_launch_never_yields_a_second_instance() {
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let (cloud, _) = cloud();
        cloud
            .ec2
            .set_launch_latency(Duration::from_millis(rng.random_range(0..400)));
        cloud.ec2.hide_new_instances_for(rng.random_range(0..4));
        cloud.ec2.throttle_next(rng.random_range(0..3));
        let req = request("uid-1", 1);

        for _crash in 0..rng.random_range(1..4) {
            let deadline = Duration::from_millis(rng.random_range(0..500));
            // Dropping the future at the deadline is the crash.
            let _ = timeout(deadline, cloud.nodes.launch(&req)).await;
            if rng.random_bool(0.3) {
                cloud.ec2.throttle_next(rng.random_range(0..3));
            }
        }
        // Sometimes two reconciles race after the restart.
        let final_id = if rng.random_bool(0.5) {
            let (a, b) = tokio::join!(cloud.nodes.launch(&req), cloud.nodes.launch(&req));
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(a.id, b.id, "seed {seed}: racing launches disagree");
            a.id
        } else {
            cloud.nodes.launch(&req).await.unwrap().id
        };
        let live = live_instances_of(&cloud.ec2, "uid-1", 1);
        assert_eq!(live, vec![final_id], "seed {seed}");
        assert_eq!(cloud.ec2.instances().len(), 1, "seed {seed}");
    }
}

#[tokio::test(start_paused = true)]
async fn throttled_calls_are_retried_until_they_succeed() {
    let (cloud, counter) = cloud();
    cloud.ec2.throttle_next(4);
    let launched = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    assert_eq!(live_instances_of(&cloud.ec2, "uid-1", 1), vec![launched.id]);
    assert_eq!(
        counter.count("DescribeInstances", "throttled")
            + counter.count("RunInstances", "throttled"),
        4
    );
    assert_eq!(counter.count("RunInstances", "ok"), 1);
}

#[tokio::test(start_paused = true)]
async fn throttling_that_never_ends_is_a_retryable_error_not_a_hang() {
    let (cloud, counter) = cloud();
    cloud.ec2.throttle_next(u32::MAX);
    let err = cloud.nodes.describe_cluster().await.unwrap_err();
    assert!(matches!(err, CloudError::Throttled { .. }), "{err:?}");
    assert!(!err.is_permanent());
    // First attempt + max_retries.
    assert_eq!(counter.attempts("DescribeInstances"), 6);
}

#[tokio::test(start_paused = true)]
async fn all_calls_of_a_provider_share_one_rate_limit() {
    let mut c = config("prod");
    c.rate_limit = RateLimit {
        per_second: 5.0,
        burst: 2,
    };
    let (cloud, _) = cloud_with(c, MemoryEc2Options::default());
    let start = Instant::now();
    let nodes = cloud.nodes.clone();
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let nodes = nodes.clone();
            tokio::spawn(async move {
                if i % 2 == 0 {
                    nodes.describe_cluster().await.map(|_| ())
                } else {
                    nodes
                        .describe(&["i-00000000000000abc".to_string()])
                        .await
                        .map(|_| ())
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let mut times: Vec<f64> = cloud
        .ec2
        .calls()
        .iter()
        .map(|(_, at)| at.duration_since(start).as_secs_f64())
        .collect();
    times.sort_by(f64::total_cmp);
    assert_eq!(times.len(), 12);
    for (k, t) in times.iter().enumerate() {
        // Call k may happen no earlier than when the bucket refilled k+1-burst tokens.
        let earliest = (k as f64 + 1.0 - 2.0).max(0.0) / 5.0;
        assert!(
            *t + 1e-6 >= earliest,
            "call {k} at {t}s, before {earliest}s: {times:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn no_capacity_is_permanent_with_the_aws_message_after_one_attempt() {
    let (cloud, counter) = cloud();
    cloud.ec2.set_no_capacity("us-east-1a", true);
    let err = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap_err();
    match &err {
        CloudError::Permanent { code, message, .. } => {
            assert_eq!(code, "InsufficientInstanceCapacity");
            assert!(message.contains("us-east-1a"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(cloud.ec2.call_count("RunInstances"), 1);
    assert_eq!(
        counter.count("RunInstances", "error:InsufficientInstanceCapacity"),
        1
    );

    // Capacity back: the same request now launches.
    cloud.ec2.set_no_capacity("us-east-1a", false);
    cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
}

/// EC2 runs short of one type in one zone: the fallback types are tried in order, each with a
/// ClientToken of its own (a token reused with another type is `IdempotentParameterMismatch`),
/// and a launch repeated after that finds the instance by its tags instead of launching again.
#[tokio::test(start_paused = true)]
async fn no_capacity_for_the_type_falls_back_to_the_next_type_in_the_same_zone() {
    let (cloud, _) = cloud();
    cloud
        .ec2
        .set_no_capacity_for("us-east-1a", "m6i.large", true);
    cloud
        .ec2
        .set_no_capacity_for("us-east-1a", "m6i.xlarge", true);
    let mut req = request("uid-1", 1);
    req.fallback_instance_types = vec!["m6i.xlarge".into(), "r6i.large".into()];
    let launched = cloud.nodes.launch(&req).await.unwrap();
    assert_eq!(launched.instance_type, "r6i.large");
    assert_eq!(launched.zone, "us-east-1a");
    assert_eq!(cloud.ec2.call_count("RunInstances"), 3);
    let again = cloud.nodes.launch(&req).await.unwrap();
    assert_eq!(again.id, launched.id);
    assert_eq!(cloud.ec2.call_count("RunInstances"), 3);

    // Every type short: one error that names the zone and every type tried.
    let mut req = request("uid-2", 1);
    req.fallback_instance_types = vec!["m6i.xlarge".into()];
    let err = cloud.nodes.launch(&req).await.unwrap_err().to_string();
    assert!(
        err.contains("us-east-1a") && err.contains("m6i.large, m6i.xlarge"),
        "{err}"
    );
    // Without fallbacks the message says where alternatives go.
    let err = cloud
        .nodes
        .launch(&request("uid-3", 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("fallbackInstanceTypes"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn unknown_ami_and_instance_type_are_permanent_after_one_attempt() {
    let (cloud, _) = cloud();
    let mut bad_ami = request("uid-1", 1);
    bad_ami.image = "ami-00000000000000bad".into();
    let err = cloud.nodes.launch(&bad_ami).await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidAMIID.NotFound"));
    assert!(err.to_string().contains("ami-00000000000000bad"));

    let mut bad_type = request("uid-2", 1);
    bad_type.instance_type = "m9.gigantic".into();
    let err = cloud.nodes.launch(&bad_type).await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    assert!(err.is_permanent());

    assert_eq!(cloud.ec2.call_count("RunInstances"), 2);
    assert!(cloud.ec2.instances().is_empty());
}

#[tokio::test(start_paused = true)]
async fn zone_without_subnet_fails_before_any_api_call() {
    let (cloud, counter) = cloud();
    let mut req = request("uid-1", 1);
    req.zone = "eu-west-1a".into();
    let err = cloud.nodes.launch(&req).await.unwrap_err();
    assert!(matches!(err, CloudError::Config(_)), "{err:?}");
    assert_eq!(counter.total(), 0);
}

#[tokio::test(start_paused = true)]
async fn describe_right_after_launch_waits_out_eventual_consistency() {
    let (cloud, counter) = cloud();
    cloud.ec2.hide_new_instances_for(3);
    // Hidden from the tag lookup too; the ClientToken still makes this a single instance.
    let launched = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    let seen = cloud
        .nodes
        .describe(std::slice::from_ref(&launched.id))
        .await
        .unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].id, launched.id);
    assert!(counter.count("DescribeInstances", "error:InvalidInstanceID.NotFound") >= 1);
}

#[tokio::test(start_paused = true)]
async fn describe_leaves_out_ids_ec2_does_not_know_without_waiting() {
    let (cloud, _) = cloud();
    let launched = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    let before = cloud.ec2.call_count("DescribeInstances");
    let start = Instant::now();
    let seen = cloud
        .nodes
        .describe(&[launched.id.clone(), "i-00000000000000dead".to_string()])
        .await
        .unwrap();
    assert_eq!(
        seen.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
        vec![launched.id]
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(cloud.ec2.call_count("DescribeInstances") - before, 1);
}

#[tokio::test(start_paused = true)]
async fn terminate_right_after_launch_does_not_leak_an_invisible_instance() {
    let (cloud, _) = cloud();
    cloud.ec2.hide_new_instances_for(3);
    let launched = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    cloud.nodes.terminate(&launched.id, "uid-1").await.unwrap();
    assert!(live_instances_of(&cloud.ec2, "uid-1", 1).is_empty());
}

/// Instance ids come from status records, which a tenant with `questdbs/status` can forge:
/// another QuestDB's instance, or another cluster's, is read first and left alone.
#[tokio::test(start_paused = true)]
async fn an_instance_that_is_not_the_callers_is_never_stopped_or_terminated() {
    let (cloud, _) = cloud();
    let victim = cloud.nodes.launch(&request("uid-victim", 1)).await.unwrap();
    for refused in [
        cloud
            .nodes
            .stop(&victim.id, "uid-attacker", StopMode::Forced)
            .await,
        cloud.nodes.terminate(&victim.id, "uid-attacker").await,
    ] {
        match refused {
            Err(CloudError::Permanent { code, message, .. }) => {
                assert_eq!(code, crate::cloud::INSTANCE_NOT_OWNED);
                assert!(message.contains("uid uid-victim"), "{message}");
            }
            other => panic!("refused, not {other:?}"),
        }
    }
    assert_eq!(cloud.ec2.call_count("StopInstances"), 0);
    assert_eq!(cloud.ec2.call_count("TerminateInstances"), 0);
    assert_eq!(live_instances_of(&cloud.ec2, "uid-victim", 1).len(), 1);

    // The same uid in another cluster's operator is not the owner either.
    let staging = crate::cloud::Ec2NodeProvider::new(
        cloud.ec2.clone(),
        config("staging"),
        crate::cloud::noop_observer(),
    );
    assert!(staging.terminate(&victim.id, "uid-victim").await.is_err());
    assert_eq!(live_instances_of(&cloud.ec2, "uid-victim", 1).len(), 1);

    // Its owner stops it.
    cloud
        .nodes
        .stop(&victim.id, "uid-victim", StopMode::Graceful)
        .await
        .unwrap();
    assert_eq!(cloud.ec2.call_count("StopInstances"), 1);
}

#[tokio::test(start_paused = true)]
async fn terminate_is_idempotent_and_announced() {
    let (cloud, _) = cloud();
    let launched = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    let mut events = cloud.ec2.subscribe();
    cloud.nodes.terminate(&launched.id, "uid-1").await.unwrap();
    cloud.nodes.terminate(&launched.id, "uid-1").await.unwrap();
    cloud
        .nodes
        .terminate("i-00000000000000abc", "uid-1")
        .await
        .unwrap();

    let terminated = timeout(Duration::from_secs(5), async {
        loop {
            if let Ok(InstanceEvent::Terminated(id)) = events.recv().await {
                return id;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(terminated, launched.id);
    let seen = cloud.nodes.describe(&[launched.id]).await.unwrap();
    assert_eq!(seen[0].state, InstanceState::Terminated);
}

#[tokio::test(start_paused = true)]
async fn describe_cluster_pages_through_this_cluster_only() {
    let options = MemoryEc2Options {
        page_size: 2,
        ..Default::default()
    };
    let ec2 = MemoryEc2::new(options);
    let observer = crate::cloud::noop_observer();
    let prod = crate::cloud::Ec2NodeProvider::new(ec2.clone(), config("prod"), observer.clone());
    let staging = crate::cloud::Ec2NodeProvider::new(ec2.clone(), config("staging"), observer);
    for n in 0..5 {
        prod.launch(&request(&format!("uid-{n}"), 1)).await.unwrap();
    }
    staging.launch(&request("uid-s", 1)).await.unwrap();

    let before = ec2.call_count("DescribeInstances");
    let mine = prod.describe_cluster().await.unwrap();
    assert_eq!(mine.len(), 5);
    assert!(mine.iter().all(|i| i.tags["questdb.io/cluster"] == "prod"));
    // 5 instances, 2 per page: one logical describe, three pages.
    assert_eq!(ec2.call_count("DescribeInstances") - before, 3);
}

fn owner(uid: &str) -> crate::cloud::DnsOwner {
    crate::cloud::DnsOwner {
        uid: uid.into(),
        published_ip: None,
    }
}

/// A shared hosted zone: a second QuestDB (another namespace, same `dns.name`) must not take
/// the first one's record, nor delete it when it goes.
#[tokio::test(start_paused = true)]
async fn a_name_another_questdb_owns_is_neither_overwritten_nor_deleted() {
    let (cloud, _) = cloud();
    let dns = cloud.dns.clone();
    dns.upsert_a("db.example.com", "10.0.0.1", 60, &owner("first"))
        .await
        .unwrap();
    let err = dns
        .upsert_a("db.example.com", "10.0.0.2", 60, &owner("second"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CloudError::Permanent { code, .. } if code == "RecordOwnedElsewhere"),
        "{err}"
    );
    dns.delete_a("db.example.com", &owner("second"))
        .await
        .unwrap();
    assert_eq!(cloud.route53.records()[0].ips, vec!["10.0.0.1".to_string()]);
    assert_eq!(
        cloud.route53.txt("db.example.com"),
        vec!["\"heritage=questdb-operator,cluster=prod,uid=first\"".to_string()]
    );
    dns.delete_a("db.example.com", &owner("first"))
        .await
        .unwrap();
    assert!(cloud.route53.records().is_empty());
    assert!(cloud.route53.txt("db.example.com").is_empty());
}

/// A record someone made by hand (or with another tool) is not the operator's to take.
#[tokio::test(start_paused = true)]
async fn an_unmarked_record_is_adopted_only_with_the_ip_this_questdb_published() {
    let (cloud, _) = cloud();
    let dns = cloud.dns.clone();
    cloud.route53.put_foreign(
        "Z123",
        crate::cloud::RecordSet {
            name: "db.example.com".into(),
            kind: "A".into(),
            values: vec!["10.0.0.1".into()],
            ttl: 300,
        },
    );
    let err = dns
        .upsert_a("db.example.com", "10.0.0.5", 60, &owner("q"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("RecordOwnedElsewhere"), "{err}");
    assert_eq!(cloud.route53.records()[0].ips, vec!["10.0.0.1".to_string()]);
    // An earlier operator version published 10.0.0.1 for this QuestDB (status says so): adopt.
    let published = crate::cloud::DnsOwner {
        uid: "q".into(),
        published_ip: Some("10.0.0.1".into()),
    };
    dns.upsert_a("db.example.com", "10.0.0.5", 60, &published)
        .await
        .unwrap();
    assert_eq!(cloud.route53.records()[0].ips, vec!["10.0.0.5".to_string()]);
    assert_eq!(cloud.route53.txt("db.example.com").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn dns_upserts_only_on_change_and_deletes_idempotently() {
    let (cloud, counter) = cloud();
    let dns = cloud.dns.clone();
    dns.upsert_a("DB1.example.com", "10.0.0.4", 60, &owner("uid-1"))
        .await
        .unwrap();
    assert_eq!(
        cloud.route53.records(),
        vec![crate::cloud::ARecord {
            name: "db1.example.com".into(),
            ips: vec!["10.0.0.4".into()],
            ttl: 60
        }]
    );
    // Steady state: a read, no write.
    dns.upsert_a("db1.example.com.", "10.0.0.4", 60, &owner("uid-1"))
        .await
        .unwrap();
    assert_eq!(counter.attempts("ChangeResourceRecordSets"), 1);

    dns.upsert_a("db1.example.com", "10.0.0.9", 30, &owner("uid-1"))
        .await
        .unwrap();
    let read = dns.read_a("db1.example.com").await.unwrap().unwrap();
    assert_eq!((read.ips, read.ttl), (vec!["10.0.0.9".to_string()], 30));
    assert_eq!(counter.attempts("ChangeResourceRecordSets"), 2);

    dns.delete_a("db1.example.com", &owner("uid-1"))
        .await
        .unwrap();
    dns.delete_a("db1.example.com", &owner("uid-1"))
        .await
        .unwrap();
    assert!(cloud.route53.records().is_empty());
    assert_eq!(dns.read_a("db1.example.com").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn dns_throttling_is_retried() {
    let (cloud, counter) = cloud();
    cloud.route53.throttle_next(3);
    cloud
        .dns
        .upsert_a("db1.example.com", "10.0.0.4", 60, &owner("uid-1"))
        .await
        .unwrap();
    assert_eq!(cloud.route53.records().len(), 1);
    assert_eq!(counter.count("ListResourceRecordSets", "throttled"), 3);
}

#[test]
fn dns_needs_a_hosted_zone() {
    let mut c = config("prod");
    c.hosted_zone_id = None;
    let err = MemoryCloud::new(
        c,
        MemoryEc2Options::default(),
        crate::cloud::noop_observer(),
    )
    .err()
    .unwrap();
    assert!(matches!(err, CloudError::Config(_)));
}

/// The AWS bill of one QuestDB: provisioning costs 1 tag lookup + 1 DescribeImages (the image's
/// root device) + 1 RunInstances + 1 DNS read + 1 DNS write; a steady-state sync costs one
/// cluster-wide describe (shared by every QuestDB) plus one DNS read per QuestDB, and no writes.
#[tokio::test(start_paused = true)]
async fn calls_per_provisioned_questdb_and_per_steady_state_sync() {
    let (cloud, counter) = cloud();
    let launched = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    let ip = launched.private_ip.clone().unwrap();
    cloud
        .dns
        .upsert_a("db1.example.com", &ip, 60, &owner("uid-1"))
        .await
        .unwrap();
    assert_eq!(counter.attempts("DescribeInstances"), 1);
    assert_eq!(counter.attempts("DescribeImages"), 1);
    assert_eq!(counter.attempts("RunInstances"), 1);
    assert_eq!(counter.attempts("ListResourceRecordSets"), 1);
    assert_eq!(counter.attempts("ChangeResourceRecordSets"), 1);
    assert_eq!(counter.total(), 5);

    let before = counter.total();
    let all = cloud.nodes.describe_cluster().await.unwrap();
    assert_eq!(all.len(), 1);
    cloud
        .dns
        .upsert_a("db1.example.com", &ip, 60, &owner("uid-1"))
        .await
        .unwrap();
    assert_eq!(counter.total() - before, 2);
    assert_eq!(counter.attempts("ChangeResourceRecordSets"), 1);
}

fn refusal(result: Result<crate::cloud::Instance, CloudError>) -> String {
    match result {
        Err(CloudError::Permanent { code, message, .. }) => {
            assert_eq!(code, crate::cloud::nodes::LAUNCH_NOT_ALLOWED, "{message}");
            message
        }
        other => panic!("refused, not {other:?}"),
    }
}

/// A tenant names the image and the instance type; the operator's allow-list decides what is
/// launched, before any RunInstances: the first launch, a replacement, a fallback type.
#[tokio::test(start_paused = true)]
async fn the_allow_list_refuses_an_image_or_instance_type_before_any_launch() {
    let mut c = config("prod");
    c.allow_list = crate::cloud::LaunchAllowList {
        images: vec![AMI.into()],
        image_owners: Vec::new(),
        instance_types: vec!["m6i.*".into()],
    };
    let options = MemoryEc2Options {
        known_images: [AMI.to_string(), "ami-0badbadbadbadbad0".to_string()].into(),
        ..Default::default()
    };
    let (cloud, _) = cloud_with(c, options);

    let mut foreign_image = request("uid-1", 1);
    foreign_image.image = "ami-0badbadbadbadbad0".into();
    let why = refusal(cloud.nodes.launch(&foreign_image).await);
    assert!(
        why.contains("ami-0badbadbadbadbad0") && why.contains("--allowed-node-images"),
        "{why}"
    );

    let mut big = request("uid-2", 1);
    big.instance_type = "u-24tb1.metal".into();
    let why = refusal(cloud.nodes.launch(&big).await);
    assert!(why.contains("u-24tb1.metal"), "{why}");

    // A fallback type outside the list is refused up front, not tried when capacity runs out.
    let mut fallback = request("uid-3", 1);
    fallback.fallback_instance_types = vec!["x2iedn.32xlarge".into()];
    let why = refusal(cloud.nodes.launch(&fallback).await);
    assert!(why.contains("x2iedn.32xlarge"), "{why}");

    assert_eq!(cloud.ec2.call_count("RunInstances"), 0);
    assert!(cloud.nodes.launch(&request("uid-4", 1)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn an_image_of_an_allowed_owner_passes_and_a_tenants_own_build_does_not() {
    let mut c = config("prod");
    c.allow_list.image_owners = vec![IMAGE_OWNER.into()];
    let tenant_build = "ami-0ten4n7b01d000000";
    let options = MemoryEc2Options {
        known_images: [AMI.to_string(), tenant_build.to_string()].into(),
        image_owners: [(tenant_build.to_string(), "111122223333".to_string())].into(),
        ..Default::default()
    };
    let (cloud, _) = cloud_with(c, options);
    let mut built = request("uid-1", 1);
    built.image = tenant_build.into();
    let why = refusal(cloud.nodes.launch(&built).await);
    assert!(why.contains("111122223333"), "{why}");
    let mut unknown = request("uid-2", 1);
    unknown.image = "ami-0000000000000dead".into();
    refusal(cloud.nodes.launch(&unknown).await);
    assert_eq!(cloud.ec2.call_count("RunInstances"), 0);
    let before = cloud.ec2.call_count("DescribeImages");
    assert!(cloud.nodes.launch(&request("uid-3", 1)).await.is_ok());
    assert_eq!(
        cloud.ec2.call_count("DescribeImages") - before,
        1,
        "one DescribeImages serves the owner rule and the root device"
    );
}

#[tokio::test(start_paused = true)]
async fn an_instance_a_filter_leaves_out_is_still_found_by_id_and_only_not_found_means_gone() {
    let (cloud, _) = cloud();
    let launched = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    // Past the launch's eventual-consistency window, so NotFound is an answer, not a lag.
    tokio::time::advance(Duration::from_secs(600)).await;
    cloud.ec2.omit_from_filters(&launched.id, true);
    let filtered = cloud
        .nodes
        .describe(std::slice::from_ref(&launched.id))
        .await
        .unwrap();
    assert!(filtered.is_empty(), "the fault hides it from filters");
    let found = cloud.nodes.look_up(&launched.id).await.unwrap();
    assert!(found.is_some_and(|i| !i.state.is_gone()), "found by id");
    assert_eq!(
        cloud.nodes.look_up("i-00000000000000dead").await.unwrap(),
        None
    );
    // The ownership check before a stop asks by id too: the stop reaches the instance.
    cloud
        .nodes
        .stop(&launched.id, "uid-1", StopMode::Forced)
        .await
        .unwrap();
    let state = cloud
        .nodes
        .look_up(&launched.id)
        .await
        .unwrap()
        .unwrap()
        .state;
    assert!(matches!(
        state,
        InstanceState::Stopping | InstanceState::Stopped
    ));
}

/// A normal stop lets the OS shut down: EC2 announces it as graceful, keeps the instance
/// `stopping` until the OS has halted (or its timeout passes), and a forced stop sent
/// meanwhile cuts it short as a power cut. Modelled on StopInstances and its `Force`.
#[tokio::test(start_paused = true)]
async fn a_normal_stop_waits_for_the_os_and_a_forced_one_cuts_it_short() {
    let (cloud, _) = cloud();
    let mut events = cloud.ec2.subscribe();
    let a = cloud.nodes.launch(&request("uid-1", 1)).await.unwrap();
    let b = cloud.nodes.launch(&request("uid-2", 1)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let state = |id: String| {
        let ec2 = cloud.ec2.clone();
        async move {
            ec2.instances()
                .into_iter()
                .find(|i| i.id == id)
                .map(|i| i.state)
        }
    };
    cloud
        .nodes
        .stop(&a.id, "uid-1", StopMode::Graceful)
        .await
        .unwrap();
    cloud
        .nodes
        .stop(&b.id, "uid-2", StopMode::Graceful)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(state(a.id.clone()).await, Some(InstanceState::Stopping));
    // The OS of `a` halts: stopped at once.
    assert!(cloud.ec2.os_halted(&a.id));
    assert_eq!(state(a.id.clone()).await, Some(InstanceState::Stopped));
    // `b` hangs in its shutdown: the fence forces it.
    cloud
        .nodes
        .stop(&b.id, "uid-2", StopMode::Forced)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(state(b.id.clone()).await, Some(InstanceState::Stopped));
    let mut stopping = vec![];
    while let Ok(e) = events.try_recv() {
        if let InstanceEvent::Stopping { id, graceful } = e {
            stopping.push((id, graceful));
        }
    }
    assert_eq!(
        stopping,
        vec![
            (a.id.clone(), true),
            (b.id.clone(), true),
            (b.id.clone(), false)
        ]
    );
    // A normal stop nobody reports halted ends after the OS timeout.
    let c = cloud.nodes.launch(&request("uid-3", 1)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    cloud
        .nodes
        .stop(&c.id, "uid-3", StopMode::Graceful)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(state(c.id.clone()).await, Some(InstanceState::Stopped));
}

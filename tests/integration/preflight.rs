//! The operator's preflight against moto's EC2 and Route53 (AWS's APIs through the real SDK)
//! and the real control plane: what an install got wrong is named once, with its fix, in one
//! log line, an Event on the operator's Pod and a metric, and a database that needs a node
//! says so instead of waiting for a launch EC2 would refuse.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams};
use questdb_operator::api::{NodeSpec, QuestDB};
use questdb_operator::cloud::aws::AwsCloud;
use questdb_operator::cloud::{CloudConfig, DnsProvider};
use questdb_operator::manager::{Cloud, ManagerOptions};
use questdb_testenv::moto::Moto;
use questdb_testenv::rbac::OPERATOR_NAMESPACE;

use crate::harness::{
    cluster, condition_message, has_condition, questdb_crd, wait_for, wait_for_event, wait_until,
    Env,
};

const NS: &str = "orders-team";
const OPERATOR_POD: &str = "questdb-operator-7d9f-abcde";

/// The preflight's gauge for `check` in a scrape, once it has run.
pub(crate) fn failures(scrape: &str, check: &str) -> Option<i64> {
    let series = format!("questdb_operator_preflight_failures{{check=\"{check}\"}} ");
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
}

/// The harm: an install with a subnet that does not exist, a security group of another VPC,
/// an allowed instance type EC2 does not have, no snapshot API and an instance profile no one
/// made (a launch EC2 refuses) starts, and every database
/// waits (a launch refused and retried every ten minutes, backups pending) with nothing that
/// names the mistake. Each is named once, with its fix, and a database that needs a node says
/// why none is launched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_subnet_a_foreign_group_an_unknown_type_and_no_snapshot_api_are_each_named_with_their_fix(
) {
    let Some(moto) = Moto::start().await else {
        return;
    };
    let aws = crate::eks::aws_side(&moto).await;
    let mut env = Env::without_manager(cluster(), questdb_crd()).await;

    // No snapshot API: its CRD removed, as on a cluster without the snapshot add-on.
    let crds = Api::<CustomResourceDefinition>::all(env.client.clone());
    crds.delete(
        "volumesnapshots.snapshot.storage.k8s.io",
        &DeleteParams::default(),
    )
    .await
    .expect("the VolumeSnapshot CRD deleted");
    wait_until("the VolumeSnapshot CRD gone", || {
        let crds = crds.clone();
        async move {
            crds.get_opt("volumesnapshots.snapshot.storage.k8s.io")
                .await
                .is_ok_and(|c| c.is_none())
        }
    })
    .await;

    // A security group of another VPC, a subnet that does not exist, a type EC2 does not have.
    let ec2 = aws_sdk_ec2::Client::new(&aws.sdk);
    let other_vpc = ec2
        .create_vpc()
        .cidr_block("10.9.0.0/16")
        .send()
        .await
        .expect("a VPC")
        .vpc()
        .and_then(|v| v.vpc_id())
        .expect("vpc id")
        .to_string();
    let foreign_group = ec2
        .create_security_group()
        .group_name("elsewhere")
        .description("another VPC")
        .vpc_id(&other_vpc)
        .send()
        .await
        .expect("a security group")
        .group_id()
        .expect("group id")
        .to_string();
    let mut config = CloudConfig::new("orders-eks", "us-east-1");
    config.endpoint_url = Some(moto.endpoint());
    config.retry.attempt_timeout = std::time::Duration::from_secs(30);
    // One zone's subnet mistyped, the other's right (which names the VPC the groups are
    // checked against).
    let mut zones = aws.subnets.iter();
    let (zone, _) = zones.next().expect("a subnet");
    let (other_zone, other_subnet) = zones.next().expect("a second subnet");
    let zone = zone.clone();
    config.subnets_by_zone = [
        (zone.clone(), "subnet-0000000000000dead".to_string()),
        (other_zone.clone(), other_subnet.clone()),
    ]
    .into();
    config.security_group_ids = vec![foreign_group.clone()];
    config.instance_profile = Some("questdb-nodes".into());
    config.allow_list.instance_types = vec!["m7i.xlarge".into(), "m9z.huge".into(), "r7i.*".into()];
    config.hosted_zone_id = Some(aws.hosted_zone.clone());
    config.user_data_template = "#!/bin/bash\n# {{node_labels}} {{node_taints}}\n".into();
    let cloud = AwsCloud::from_sdk_config(&aws.sdk, config, env.handle.metrics.aws_observer())
        .expect("AWS cloud");
    let options = ManagerOptions {
        cloud: Some(Cloud {
            nodes: cloud.nodes.clone(),
            dns: cloud.dns.clone().map(|d| d as Arc<dyn DnsProvider>),
            settings: Default::default(),
        }),
        operator_pod: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(OPERATOR_POD.into()),
            namespace: Some(OPERATOR_NAMESPACE.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    // A database on a dedicated node, there before the operator starts: the first preflight
    // dry-runs its launch, which names the instance profile no one made.
    env.namespace(NS).await;
    env.create_questdb(NS, "orders", |q| {
        q.spec.node = Some(NodeSpec {
            image: aws.ami.clone(),
            instance_type: "m7i.xlarge".into(),
            zone: other_zone.clone(),
            ..Default::default()
        });
        // A class no one made here (docs/operations/eks.md's step 2 makes it on EKS).
        q.spec.volume.storage_class_name = Some("questdb-gp3".into());
    })
    .await;
    let mark = crate::log_capture::mark();
    env.start_synced_manager(options).await;

    // The metric: one finding for each of the three checks, none for the readable zone.
    let metrics = env.handle.metrics.clone();
    wait_until("the preflight's gauges", || {
        let scrape = metrics.render();
        async move { failures(&scrape, "network").is_some() }
    })
    .await;
    let scrape = env.handle.metrics.render();
    for (check, expected) in [
        ("network", 1),
        ("instance-types", 1),
        ("snapshot-api", 1),
        ("launch", 1),
        ("storage-class", 1),
        ("hosted-zone", 0),
    ] {
        assert_eq!(failures(&scrape, check), Some(expected), "{check}");
    }

    // The Event on the operator's Pod, one per finding, each naming what is wrong and its fix.
    for (what, needles) in [
        (
            "the subnet that does not exist",
            vec!["subnet-0000000000000dead", "does not exist", "fix:"],
        ),
        (
            "the security group of another VPC",
            vec![foreign_group.as_str(), other_vpc.as_str()],
        ),
        ("the unknown instance type", vec!["m9z.huge", "fix:"]),
        (
            "the missing snapshot API",
            vec!["VolumeSnapshot API", "snapshot-controller"],
        ),
        (
            "the StorageClass no one made",
            vec![
                "questdb-gp3",
                "orders-team/orders",
                "deploy/aws/storageclass.yaml",
            ],
        ),
        (
            "the launch EC2 would refuse: no such instance profile",
            vec!["m7i.xlarge", "questdb-nodes", "aws.instanceProfile"],
        ),
    ] {
        wait_for_event(&env, OPERATOR_NAMESPACE, what, |e| {
            e.reason.as_deref() == Some("PreflightFailed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(OPERATOR_POD)
                && e.note
                    .as_deref()
                    .is_some_and(|n| needles.iter().all(|needle| n.contains(needle)))
        })
        .await;
    }

    // One log line per finding.
    let lines = crate::log_capture::warnings_since(mark, "preflight");
    for needle in [
        "subnet-0000000000000dead",
        "m9z.huge",
        "VolumeSnapshot API",
        "Instance profile questdb-nodes",
    ] {
        assert_eq!(
            lines.iter().filter(|l| l.contains(needle)).count(),
            1,
            "one line naming {needle}: {lines:#?}"
        );
    }
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("m7i.xlarge") && l.contains("check=instance-types")),
        "a type EC2 offers is not reported: {lines:#?}"
    );

    // A database that needs a node says why none is launched, and nothing is launched.
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        "orders",
        "NodeReady=False PreflightFailed",
        has_condition("NodeReady", "PreflightFailed"),
    )
    .await;
    let message = condition_message(&q, "NodeReady");
    assert!(message.contains("subnet-0000000000000dead"), "{message}");
    let running = ec2
        .describe_instances()
        .send()
        .await
        .expect("instances")
        .reservations()
        .len();
    assert_eq!(running, 0, "nothing was launched");
    env.stop().await;
}

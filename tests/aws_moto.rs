//! The `aws` cloud backend against moto (a local AWS API emulator): the real SDK requests and
//! responses for launch / describe by tags / terminate and Route53 upsert / read / delete.
//!
//! moto_server comes from `$MOTO_SERVER` or `<repo>/.venv/bin/moto_server` (`bash .ci/moto.sh
//! install`). Without it these tests fail, unless `SKIP_MOTO=1`. Each test starts its own
//! server on a free loopback port (killed on drop) and resets it before use.
//!
//! Not covered here because moto cannot model them: ClientToken idempotency, throttling,
//! capacity errors, eventual consistency (see the memory backend's tests in `src/cloud/memory`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::config::Credentials;
use questdb_operator::cloud::aws::{sdk_config_loader, AwsCloud};
use questdb_operator::cloud::{
    CallCounter, CloudConfig, CloudError, DnsOwner, DnsProvider, InstanceState, LaunchRequest,
    NodeProvider, RateLimit, RetryPolicy, Taint, TAG_CLUSTER, TAG_NODE_GENERATION, TAG_UID,
};
use questdb_testenv::moto::Moto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const REGION: &str = "us-east-1";
const ZONE: &str = "us-east-1a";

/// Start moto, or `None` when it is absent and `SKIP_MOTO=1` says that is acceptable.
async fn start_moto() -> Option<Moto> {
    Moto::start().await
}

fn base_config(moto: &Moto) -> CloudConfig {
    base_config_at(moto.endpoint())
}

fn base_config_at(endpoint: String) -> CloudConfig {
    let mut config = CloudConfig::new("moto-test", REGION);
    config.endpoint_url = Some(endpoint);
    config.user_data_template =
        "#!/bin/bash\n# --node-labels={{node_labels}} --register-with-taints={{node_taints}}\n"
            .into();
    config.retry = RetryPolicy {
        min_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(200),
        max_retries: 2,
        eventual_consistency_window: Duration::from_secs(1),
        // moto is a Python process answering beside four tests that start control planes on two
        // cores: its first answer (the default VPC built lazily) took over 5 s there. AWS's
        // own latency is what the 5 s default is for.
        attempt_timeout: Duration::from_secs(30),
        ..RetryPolicy::default()
    };
    config.rate_limit = RateLimit {
        per_second: 0.0,
        burst: 1,
    };
    config.route53_rate_limit = config.rate_limit.clone();
    config
}

/// SDK configuration for moto: dummy credentials, only in this test.
async fn sdk(config: &CloudConfig) -> aws_config::SdkConfig {
    sdk_config_loader(config)
        .credentials_provider(Credentials::new(
            "testing",
            "testing",
            None,
            None,
            "moto-test",
        ))
        .load()
        .await
}

/// Subnet per zone of moto's default VPC; looked up because ids change on every reset.
async fn default_subnets(sdk: &aws_config::SdkConfig) -> BTreeMap<String, String> {
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let out = ec2
        .describe_subnets()
        .send()
        .await
        .expect("DescribeSubnets");
    out.subnets()
        .iter()
        .filter_map(|s| {
            Some((
                s.availability_zone()?.to_string(),
                s.subnet_id()?.to_string(),
            ))
        })
        .collect()
}

/// An AMI that moto knows (with AMI validation on, made-up ids are rejected).
async fn some_ami(sdk: &aws_config::SdkConfig) -> String {
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let out = ec2.describe_images().send().await.expect("DescribeImages");
    out.images()
        .iter()
        .find_map(|i| i.image_id().map(str::to_string))
        .expect("moto ships AMIs")
}

async fn ec2_setup(moto: &Moto) -> (CloudConfig, aws_config::SdkConfig, String) {
    let mut config = base_config(moto);
    let sdk = sdk(&config).await;
    config.subnets_by_zone = default_subnets(&sdk).await;
    assert!(
        config.subnets_by_zone.contains_key(ZONE),
        "{:?}",
        config.subnets_by_zone
    );
    let ami = some_ami(&sdk).await;
    (config, sdk, ami)
}

fn request(uid: &str, generation: i64, ami: &str) -> LaunchRequest {
    LaunchRequest {
        namespace: "team-a".into(),
        name: "db1".into(),
        uid: uid.into(),
        node_generation: generation,
        image: ami.into(),
        instance_type: "t3.micro".into(),
        zone: ZONE.into(),
        labels: BTreeMap::from([("questdb.io/dedicated".to_string(), "team-a.db1".to_string())]),
        taints: vec![Taint::new(
            "questdb.io/dedicated",
            Some("team-a.db1"),
            "NoSchedule",
        )],
        public_ip: false,
        fallback_instance_types: Vec::new(),
        cluster_id: None,
    }
}

#[tokio::test]
async fn launch_describe_by_tags_and_terminate() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let (config, sdk, ami) = ec2_setup(&moto).await;
    let counter = CallCounter::new();
    let cloud = AwsCloud::from_sdk_config(&sdk, config, Arc::new(counter.clone())).unwrap();
    let nodes: Arc<dyn NodeProvider> = cloud.nodes.clone();

    let launched = nodes.launch(&request("uid-1", 1, &ami)).await.unwrap();
    assert!(launched.id.starts_with("i-"), "{}", launched.id);
    assert_eq!(launched.zone, ZONE);
    assert_eq!(launched.image, ami);
    assert_eq!(launched.instance_type, "t3.micro");
    assert!(launched.private_ip.is_some());
    assert_eq!(launched.tags[TAG_CLUSTER], "moto-test");
    assert_eq!(launched.tags[TAG_UID], "uid-1");
    assert_eq!(launched.tags[TAG_NODE_GENERATION], "1");
    assert_eq!(launched.tags["Name"], "questdb-team-a-db1-g1");

    // The retried launch finds the instance by its tags (moto ignores ClientToken, so this
    // is the tag lookup at work) and does not call RunInstances again.
    let again = nodes.launch(&request("uid-1", 1, &ami)).await.unwrap();
    assert_eq!(again.id, launched.id);
    assert_eq!(counter.attempts("RunInstances"), 1);

    let other = nodes.launch(&request("uid-2", 1, &ami)).await.unwrap();
    assert_ne!(other.id, launched.id);

    let mut cluster: Vec<String> = nodes
        .describe_cluster()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    cluster.sort();
    let mut expected = vec![launched.id.clone(), other.id.clone()];
    expected.sort();
    assert_eq!(cluster, expected);

    let described = nodes
        .describe(std::slice::from_ref(&launched.id))
        .await
        .unwrap();
    assert_eq!(described.len(), 1);
    assert!(
        matches!(
            described[0].state,
            InstanceState::Pending | InstanceState::Running
        ),
        "{:?}",
        described[0].state
    );

    // Not uid-2's: refused, and the instance runs on.
    assert!(nodes.terminate(&launched.id, "uid-2").await.is_err());
    nodes.terminate(&launched.id, "uid-1").await.unwrap();
    nodes.terminate(&launched.id, "uid-1").await.unwrap();
    nodes
        .terminate("i-0123456789abcdef0", "uid-1")
        .await
        .unwrap();
    let after = nodes
        .describe(std::slice::from_ref(&launched.id))
        .await
        .unwrap();
    assert!(after[0].state.is_gone(), "{:?}", after[0].state);

    // A terminated generation is reported, not silently replaced.
    let relaunch = nodes.launch(&request("uid-1", 1, &ami)).await.unwrap();
    assert_eq!(relaunch.id, launched.id);
    assert!(relaunch.state.is_gone());
    let next = nodes.launch(&request("uid-1", 2, &ami)).await.unwrap();
    assert_ne!(next.id, launched.id);
    assert!(!next.state.is_gone());
    assert_eq!(counter.count("RunInstances", "ok"), 3);
}

/// The request the scheduled-event look makes (DescribeInstanceStatus filtered by every event
/// code) is one EC2's API takes and its answer parses; moto schedules no events, so a running
/// instance has none.
#[tokio::test]
async fn scheduled_events_are_read_with_one_filtered_describe_instance_status() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let (config, sdk, ami) = ec2_setup(&moto).await;
    let counter = CallCounter::new();
    let cloud = AwsCloud::from_sdk_config(&sdk, config, Arc::new(counter.clone())).unwrap();
    let nodes: Arc<dyn NodeProvider> = cloud.nodes.clone();
    nodes.launch(&request("uid-1", 1, &ami)).await.unwrap();
    let events = nodes
        .scheduled_events()
        .await
        .expect("DescribeInstanceStatus answers");
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(counter.count("DescribeInstanceStatus", "ok"), 1);
}

/// What a security review checks on a node: in its volume's zone, IMDSv2 with one hop (pods
/// cannot reach the node role's credentials), an encrypted gp3 root, the cluster's ownership tag.
#[tokio::test]
async fn a_dedicated_node_is_launched_hardened_in_its_volumes_zone() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let (mut config, sdk, ami) = ec2_setup(&moto).await;
    config.security_group_ids = vec![default_security_group(&sdk).await];
    config.volumes.root_size_gib = 30;
    config.node_tags = [("cost-center".to_string(), "42".to_string())].into();
    let cloud = AwsCloud::from_sdk_config(&sdk, config, Arc::new(CallCounter::new())).unwrap();
    let launched = cloud
        .nodes
        .launch(&request("uid-h", 1, &ami))
        .await
        .unwrap();
    assert_eq!(launched.tags["kubernetes.io/cluster/moto-test"], "owned");
    // The user's tags, beside the operator's (a tag policy that requires cost-center passes).
    assert_eq!(launched.tags["cost-center"], "42");
    assert_eq!(launched.tags["questdb.io/uid"], "uid-h");

    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let out = ec2
        .describe_instances()
        .instance_ids(&launched.id)
        .send()
        .await
        .unwrap();
    let instance = &out.reservations()[0].instances()[0];
    assert_eq!(
        instance.placement().and_then(|p| p.availability_zone()),
        Some(ZONE)
    );
    let md = instance.metadata_options().expect("metadata options");
    assert_eq!(md.http_tokens().map(|t| t.as_str()), Some("required"));
    assert_eq!(md.http_put_response_hop_limit(), Some(1));
    assert!(!instance.security_groups().is_empty());
    // The encrypted root volume is mapped where the image has its root (DescribeImages), not at
    // a fixed name that would leave the image's own root unencrypted beside an unused volume.
    let images = ec2.describe_images().image_ids(&ami).send().await.unwrap();
    let root_device = images.images()[0]
        .root_device_name()
        .expect("the image's root device")
        .to_string();
    let mappings = instance.block_device_mappings();
    assert_eq!(mappings.len(), 1, "one volume, the root: {mappings:?}");
    let root = mappings
        .iter()
        .find(|b| b.device_name() == Some(root_device.as_str()))
        .expect("root device mapped");
    let volume_id = root.ebs().and_then(|e| e.volume_id()).expect("root volume");
    let volumes = ec2
        .describe_volumes()
        .volume_ids(volume_id)
        .send()
        .await
        .unwrap();
    let volume = &volumes.volumes()[0];
    assert_eq!(volume.encrypted(), Some(true));
    assert_eq!(volume.size(), Some(30));
    assert_eq!(volume.volume_type().map(|t| t.as_str()), Some("gp3"));
    let tagged = |tags: &[aws_sdk_ec2::types::Tag], key: &str| {
        tags.iter()
            .find(|t| t.key() == Some(key))
            .and_then(|t| t.value())
            .map(str::to_string)
    };
    assert_eq!(tagged(volume.tags(), "cost-center").as_deref(), Some("42"));
    assert_eq!(
        tagged(volume.tags(), "questdb.io/uid").as_deref(),
        Some("uid-h")
    );

    // spec.dns.public: the address the record will name exists from launch on.
    let public = cloud
        .nodes
        .launch(&LaunchRequest {
            public_ip: true,
            fallback_instance_types: Vec::new(),
            cluster_id: None,
            ..request("uid-p", 1, &ami)
        })
        .await
        .unwrap();
    assert!(public.public_ip.is_some(), "{public:?}");
    assert_eq!(public.zone, ZONE);
}

/// A subnet map that names the wrong zone is refused at start-up, naming the subnet.
#[tokio::test]
async fn a_subnet_mapped_to_the_wrong_zone_is_refused_at_start_up() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let (config, sdk, _) = ec2_setup(&moto).await;
    let good =
        AwsCloud::from_sdk_config(&sdk, config.clone(), Arc::new(CallCounter::new())).unwrap();
    good.nodes.check_network().await.unwrap();
    let mut wrong = config.clone();
    let (zone_a, subnet_a) = wrong
        .subnets_by_zone
        .iter()
        .next()
        .map(|(z, s)| (z.clone(), s.clone()))
        .unwrap();
    let (zone_b, subnet_b) = wrong
        .subnets_by_zone
        .iter()
        .nth(1)
        .map(|(z, s)| (z.clone(), s.clone()))
        .unwrap();
    wrong
        .subnets_by_zone
        .insert(zone_a.clone(), subnet_b.clone());
    wrong.subnets_by_zone.insert(zone_b, subnet_a);
    let bad = AwsCloud::from_sdk_config(&sdk, wrong, Arc::new(CallCounter::new())).unwrap();
    let err = bad.nodes.check_network().await.unwrap_err().to_string();
    assert!(err.contains(&subnet_b) && err.contains(&zone_a), "{err}");
}

/// A security group that does not exist, or one of another VPC, is refused at start-up
/// naming it, instead of every launch failing later.
#[tokio::test]
async fn a_missing_or_foreign_security_group_is_refused_at_start_up() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let (mut config, sdk, _) = ec2_setup(&moto).await;
    let good_group = default_security_group(&sdk).await;
    config.security_group_ids = vec![good_group.clone()];
    let good =
        AwsCloud::from_sdk_config(&sdk, config.clone(), Arc::new(CallCounter::new())).unwrap();
    good.nodes.check_network().await.unwrap();

    let mut missing = config.clone();
    missing.security_group_ids = vec![good_group.clone(), "sg-0000000000000dead".into()];
    let bad = AwsCloud::from_sdk_config(&sdk, missing, Arc::new(CallCounter::new())).unwrap();
    let err = bad.nodes.check_network().await.unwrap_err().to_string();
    assert!(
        err.contains("--aws-security-group-ids") && err.contains("sg-0000000000000dead"),
        "{err}"
    );

    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let other_vpc = ec2
        .create_vpc()
        .cidr_block("10.9.0.0/16")
        .send()
        .await
        .unwrap()
        .vpc()
        .and_then(|v| v.vpc_id())
        .unwrap()
        .to_string();
    let foreign = ec2
        .create_security_group()
        .group_name("elsewhere")
        .description("another VPC")
        .vpc_id(&other_vpc)
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_string();
    let mut elsewhere = config;
    elsewhere.security_group_ids = vec![foreign.clone()];
    let bad = AwsCloud::from_sdk_config(&sdk, elsewhere, Arc::new(CallCounter::new())).unwrap();
    let err = bad.nodes.check_network().await.unwrap_err().to_string();
    assert!(err.contains(&foreign) && err.contains(&other_vpc), "{err}");
}

/// Public and private databases of one zone in subnets of their own: a public database's node
/// in the zone's public subnet (routed to the internet gateway), a private one's never there.
#[tokio::test]
async fn public_and_private_databases_of_one_zone_are_launched_into_their_own_subnets() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let (mut config, sdk, ami) = ec2_setup(&moto).await;
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let private = config.subnets_by_zone[ZONE].clone();
    let vpc = ec2
        .describe_subnets()
        .subnet_ids(&private)
        .send()
        .await
        .unwrap()
        .subnets()[0]
        .vpc_id()
        .unwrap()
        .to_string();
    let public = ec2
        .create_subnet()
        .vpc_id(vpc)
        .availability_zone(ZONE)
        .cidr_block("172.31.200.0/24")
        .send()
        .await
        .unwrap()
        .subnet()
        .and_then(|s| s.subnet_id())
        .unwrap()
        .to_string();
    config.public_subnets_by_zone = [(ZONE.to_string(), public.clone())].into();
    let cloud =
        AwsCloud::from_sdk_config(&sdk, config.clone(), Arc::new(CallCounter::new())).unwrap();
    cloud.nodes.check_network().await.unwrap();
    let subnet_of = |id: String| {
        let ec2 = ec2.clone();
        async move {
            let out = ec2
                .describe_instances()
                .instance_ids(id)
                .send()
                .await
                .unwrap();
            out.reservations()[0].instances()[0]
                .subnet_id()
                .unwrap()
                .to_string()
        }
    };
    let on_public = cloud
        .nodes
        .launch(&LaunchRequest {
            public_ip: true,
            ..request("uid-pub", 1, &ami)
        })
        .await
        .unwrap();
    assert_eq!(subnet_of(on_public.id.clone()).await, public);
    assert!(on_public.public_ip.is_some(), "{on_public:?}");
    let on_private = cloud
        .nodes
        .launch(&request("uid-priv", 1, &ami))
        .await
        .unwrap();
    assert_eq!(subnet_of(on_private.id).await, private);

    // A public subnet mapped to the wrong zone is refused at start-up, naming its flag.
    let other_zone = config
        .subnets_by_zone
        .keys()
        .find(|z| *z != ZONE)
        .unwrap()
        .clone();
    let mut wrong = config;
    wrong.public_subnets_by_zone = [(other_zone.clone(), public.clone())].into();
    let bad = AwsCloud::from_sdk_config(&sdk, wrong, Arc::new(CallCounter::new())).unwrap();
    let err = bad.nodes.check_network().await.unwrap_err().to_string();
    assert!(
        err.contains("--aws-public-subnets") && err.contains(&public) && err.contains(&other_zone),
        "{err}"
    );
}

async fn default_security_group(sdk: &aws_config::SdkConfig) -> String {
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let out = ec2.describe_security_groups().send().await.unwrap();
    out.security_groups()
        .iter()
        .find_map(|g| g.group_id().map(str::to_string))
        .expect("moto has a default security group")
}

#[tokio::test]
async fn unknown_ami_and_instance_type_are_permanent_without_retries() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let (config, sdk, ami) = ec2_setup(&moto).await;
    let counter = CallCounter::new();
    let cloud = AwsCloud::from_sdk_config(&sdk, config, Arc::new(counter.clone())).unwrap();

    let err = cloud
        .nodes
        .launch(&request("uid-1", 1, "ami-00000000deadbeef0"))
        .await
        .unwrap_err();
    match &err {
        CloudError::Permanent { code, message, .. } => {
            assert!(code.starts_with("InvalidAMIID."), "{code}");
            assert!(message.contains("ami-00000000deadbeef0"), "{message}");
        }
        other => panic!("expected a permanent error, got {other:?}"),
    }
    assert_eq!(counter.attempts("RunInstances"), 1);

    let mut bad_type = request("uid-2", 1, &ami);
    bad_type.instance_type = "m9.gigantic".into();
    let err = cloud.nodes.launch(&bad_type).await.unwrap_err();
    assert!(err.is_permanent(), "{err:?}");
    assert!(err.to_string().contains("m9.gigantic"), "{err}");
    assert_eq!(counter.attempts("RunInstances"), 2);
    assert!(cloud.nodes.describe_cluster().await.unwrap().is_empty());
}

/// What a node move checks before it launches: DescribeImages, DescribeInstanceTypes and
/// DescribeInstanceTypeOfferings as the SDK sends them, and unknown ids as absent, not errors.
#[tokio::test]
async fn node_facts_read_the_image_and_the_type_offered_in_the_zone() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let (config, sdk, ami) = ec2_setup(&moto).await;
    let cloud = AwsCloud::from_sdk_config(&sdk, config, Arc::new(CallCounter::new())).unwrap();
    let facts = cloud
        .nodes
        .node_facts(&ami, "m6i.large", ZONE)
        .await
        .expect("facts");
    let image = facts.image.expect("moto's image");
    assert_eq!(image.id, ami);
    assert_eq!(image.state, "available");
    assert!(!image.architecture.is_empty() && !image.root_device_type.is_empty());
    let kind = facts.instance_type.expect("m6i.large");
    assert!(
        kind.architectures.contains(&"x86_64".to_string()),
        "{kind:?}"
    );
    assert!(kind.offered_in_zone, "{kind:?}");

    let unknown = cloud
        .nodes
        .node_facts("ami-00000000deadbeef0", "m9.gigantic", ZONE)
        .await
        .expect("unknown ids are an answer, not an error");
    assert_eq!(unknown.image, None);
    assert_eq!(unknown.instance_type, None);
}

#[tokio::test]
async fn dns_upsert_read_and_delete() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let mut config = base_config(&moto);
    let sdk = sdk(&config).await;
    let route53 = aws_sdk_route53::Client::new(&sdk);
    let zone = route53
        .create_hosted_zone()
        .name("example.com")
        .caller_reference("aws-moto-test")
        .send()
        .await
        .expect("CreateHostedZone");
    let zone_id = zone
        .hosted_zone()
        .map(|z| z.id().to_string())
        .expect("zone id");
    config.hosted_zone_id = Some(zone_id.trim_start_matches("/hostedzone/").to_string());

    let counter = CallCounter::new();
    let cloud = AwsCloud::from_sdk_config(&sdk, config, Arc::new(counter.clone())).unwrap();
    let dns: Arc<dyn DnsProvider> = cloud.dns.clone().expect("hosted zone configured");

    let owner = |uid: &str| DnsOwner {
        uid: uid.into(),
        published_ip: None,
    };
    let (ours, theirs) = (owner("uid-1"), owner("uid-2"));
    assert_eq!(dns.read_a("db1.example.com").await.unwrap(), None);
    dns.upsert_a("db1.example.com", "10.0.0.4", 60, &ours)
        .await
        .unwrap();
    let record = dns.read_a("db1.example.com").await.unwrap().unwrap();
    assert_eq!(record.name, "db1.example.com");
    assert_eq!(record.ips, vec!["10.0.0.4".to_string()]);
    assert_eq!(record.ttl, 60);
    // The ownership record beside it, in one batch with the A record.
    let sets = route53
        .list_resource_record_sets()
        .hosted_zone_id(&zone_id)
        .send()
        .await
        .unwrap();
    let txt: Vec<String> = sets
        .resource_record_sets()
        .iter()
        .filter(|s| s.name() == "db1.example.com." && s.r#type().as_str() == "TXT")
        .flat_map(|s| s.resource_records().iter().map(|r| r.value().to_string()))
        .collect();
    assert_eq!(
        txt,
        vec!["\"heritage=questdb-operator,cluster=moto-test,uid=uid-1\"".to_string()]
    );
    assert_eq!(counter.attempts("ChangeResourceRecordSets"), 1);

    // Same value: read only, no change sent.
    dns.upsert_a("db1.example.com.", "10.0.0.4", 60, &ours)
        .await
        .unwrap();
    assert_eq!(counter.attempts("ChangeResourceRecordSets"), 1);

    // Another QuestDB asking for the same name gets a refusal; the record stays.
    let err = dns
        .upsert_a("db1.example.com", "10.9.9.9", 60, &theirs)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("RecordOwnedElsewhere"), "{err}");
    dns.delete_a("db1.example.com", &theirs).await.unwrap();
    let record = dns.read_a("db1.example.com").await.unwrap().unwrap();
    assert_eq!(record.ips, vec!["10.0.0.4".to_string()]);

    // A neighbour record sorts right after ours; it must not be mistaken for it.
    dns.upsert_a("db10.example.com", "10.0.0.7", 60, &theirs)
        .await
        .unwrap();
    dns.upsert_a("db1.example.com", "10.0.0.9", 30, &ours)
        .await
        .unwrap();
    let record = dns.read_a("db1.example.com").await.unwrap().unwrap();
    assert_eq!((record.ips, record.ttl), (vec!["10.0.0.9".to_string()], 30));

    dns.delete_a("db1.example.com", &ours).await.unwrap();
    assert_eq!(dns.read_a("db1.example.com").await.unwrap(), None);
    dns.delete_a("db1.example.com", &ours).await.unwrap();
    assert_eq!(dns.read_a("db2.example.com").await.unwrap(), None);
    let neighbour = dns.read_a("db10.example.com").await.unwrap().unwrap();
    assert_eq!(neighbour.ips, vec!["10.0.0.7".to_string()]);
}

/// A loopback HTTP server that answers with scripted responses, in order, and records each
/// request's first line and body. For the error shapes moto never produces (throttling,
/// capacity), so the SDK's parsing of real AWS error bodies is tested too.
struct ScriptedAws {
    port: u16,
    requests: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedAws {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedAws {
    async fn start(responses: Vec<(u16, &'static str)>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            let mut script = responses.into_iter();
            while let Ok((mut conn, _)) = listener.accept().await {
                let Some(request) = read_request(&mut conn).await else {
                    continue;
                };
                seen.lock().unwrap().push(request);
                let (status, body) = script
                    .next()
                    .unwrap_or((500, "<Response><Errors><Error><Code>ScriptExhausted</Code><Message>no more scripted responses</Message></Error></Errors></Response>"));
                let response = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            }
        });
        Self {
            port,
            requests,
            task,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// First line and body of one HTTP/1.1 request with a Content-Length body (or none).
async fn read_request(conn: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < header_end + length {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let first_line = head.lines().next().unwrap_or_default().to_string();
    let body = String::from_utf8_lossy(&buf[header_end..]).to_string();
    Some(format!("{first_line} {body}"))
}

const EC2_THROTTLED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>req-1</RequestID></Response>";
const EC2_NO_INSTANCES: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>req-2</requestId><reservationSet/></DescribeInstancesResponse>";
const EC2_NO_CAPACITY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>InsufficientInstanceCapacity</Code><Message>We currently do not have sufficient m6i.large capacity in the Availability Zone you requested (us-east-1a).</Message></Error></Errors><RequestID>req-3</RequestID></Response>";
/// DescribeImages of an image whose root is not `/dev/xvda`, with a 50 GiB root snapshot and a
/// second volume as Bottlerocket's images have one (EC2's wire format).
const EC2_IMAGE_ROOT_SDA1: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeImagesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>req-5</requestId><imagesSet><item><imageId>ami-0123456789abcdef0</imageId><imageState>available</imageState><imageOwnerId>602401143452</imageOwnerId><architecture>x86_64</architecture><rootDeviceType>ebs</rootDeviceType><rootDeviceName>/dev/sda1</rootDeviceName><blockDeviceMapping><item><deviceName>/dev/sda1</deviceName><ebs><snapshotId>snap-0root</snapshotId><volumeSize>50</volumeSize><deleteOnTermination>true</deleteOnTermination><volumeType>gp2</volumeType><encrypted>false</encrypted></ebs></item><item><deviceName>/dev/xvdb</deviceName><ebs><snapshotId>snap-0data</snapshotId><volumeSize>20</volumeSize><deleteOnTermination>true</deleteOnTermination><volumeType>gp2</volumeType><encrypted>false</encrypted></ebs></item></blockDeviceMapping></item></imagesSet></DescribeImagesResponse>";
const ROUTE53_THROTTLED: &str = "<?xml version=\"1.0\"?>\n<ErrorResponse xmlns=\"https://route53.amazonaws.com/doc/2013-04-01/\"><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>req-4</RequestId></ErrorResponse>";
const ROUTE53_EMPTY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListResourceRecordSetsResponse xmlns=\"https://route53.amazonaws.com/doc/2013-04-01/\"><ResourceRecordSets></ResourceRecordSets><IsTruncated>false</IsTruncated><MaxItems>1</MaxItems></ListResourceRecordSetsResponse>";

/// Throttling and capacity errors as AWS sends them on the wire: throttling is retried (every
/// attempt counted), no capacity is a permanent error with AWS's message after one attempt.
#[tokio::test]
async fn aws_error_bodies_drive_retries_and_permanent_errors() {
    let server = ScriptedAws::start(vec![
        (503, EC2_THROTTLED),
        (503, EC2_THROTTLED),
        (200, EC2_NO_INSTANCES),
        (200, EC2_NO_INSTANCES),
        (200, EC2_IMAGE_ROOT_SDA1),
        (500, EC2_NO_CAPACITY),
        (400, ROUTE53_THROTTLED),
        (200, ROUTE53_EMPTY),
    ])
    .await;
    let mut config = base_config_at(format!("http://127.0.0.1:{}", server.port));
    config.subnets_by_zone = BTreeMap::from([(ZONE.to_string(), "subnet-1".to_string())]);
    config.hosted_zone_id = Some("Z1".into());
    let sdk = sdk(&config).await;
    let counter = CallCounter::new();
    let cloud = AwsCloud::from_sdk_config(&sdk, config, Arc::new(counter.clone())).unwrap();

    assert!(cloud.nodes.describe_cluster().await.unwrap().is_empty());
    assert_eq!(counter.count("DescribeInstances", "throttled"), 2);
    assert_eq!(counter.count("DescribeInstances", "ok"), 1);

    let err = cloud
        .nodes
        .launch(&request("uid-1", 1, "ami-0123456789abcdef0"))
        .await
        .unwrap_err();
    match &err {
        CloudError::Permanent { code, message, .. } => {
            assert_eq!(code, "InsufficientInstanceCapacity");
            assert!(message.contains("us-east-1a"), "{message}");
        }
        other => panic!("expected a permanent error, got {other:?}"),
    }
    assert_eq!(counter.attempts("RunInstances"), 1);

    let dns = cloud.dns.clone().unwrap();
    assert_eq!(dns.read_a("db1.example.com").await.unwrap(), None);
    assert_eq!(counter.count("ListResourceRecordSets", "throttled"), 1);

    let requests = server.requests();
    assert_eq!(requests.len(), 8, "{requests:#?}");
    assert!(
        requests[4].contains("Action=DescribeImages"),
        "{}",
        requests[4]
    );
    let run = &requests[5];
    assert!(run.contains("Action=RunInstances"), "{run}");
    assert!(
        run.contains(&format!(
            "ClientToken={}",
            questdb_operator::cloud::client_token("uid-1", 1)
        )),
        "{run}"
    );
    assert!(run.contains("SubnetId=subnet-1"), "{run}");
    // The encrypted root volume goes where the image has its root, no smaller than its
    // snapshot (20 GiB asked, 50 in the image: EC2 would refuse 20); the image's second volume
    // is mapped encrypted too instead of booting with the image's unencrypted default.
    for field in [
        "BlockDeviceMapping.1.DeviceName=%2Fdev%2Fsda1",
        "BlockDeviceMapping.1.Ebs.VolumeSize=50",
        "BlockDeviceMapping.1.Ebs.Encrypted=true",
        "BlockDeviceMapping.2.DeviceName=%2Fdev%2Fxvdb",
        "BlockDeviceMapping.2.Ebs.VolumeSize=20",
        "BlockDeviceMapping.2.Ebs.Encrypted=true",
        "BlockDeviceMapping.2.Ebs.VolumeType=gp3",
    ] {
        assert!(run.contains(field), "{field} missing: {run}");
    }
}

/// The harm: an install that names no network and runs against a cluster AWS does not know
/// (a typo in `aws.clusterName`, another region) would otherwise start and leave every
/// database waiting for a node it cannot launch. It stops at start, naming the cluster, the
/// region and the flags that make the question unnecessary; given those flags, the cluster
/// is never asked.
#[tokio::test]
async fn a_cluster_name_eks_does_not_know_stops_the_start_naming_it_and_the_flags() {
    let Some(moto) = start_moto().await else {
        return;
    };
    let mut config = base_config(&moto);
    config.user_data_template =
        questdb_operator::cloud::user_data::AL2023_NODECONFIG_TEMPLATE.into();
    let sdk = sdk(&config).await;
    let err = questdb_operator::cloud::aws::discover(&sdk, &mut config)
        .await
        .expect_err("no EKS cluster is called moto-test")
        .to_string();
    for needle in [
        "no EKS cluster is named moto-test in us-east-1",
        "--cluster-name",
        "--aws-subnets",
        "--aws-security-group-ids",
        "--eks-api-endpoint",
    ] {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
    config.subnets_by_zone = default_subnets(&sdk).await;
    config.security_group_ids = vec![default_security_group(&sdk).await];
    config.eks.api_endpoint = Some("https://example.eks.amazonaws.com".into());
    config.eks.certificate_authority = Some("Y2E=".into());
    config.eks.service_cidr = Some("172.20.0.0/16".into());
    let before = config.clone();
    let taken = questdb_operator::cloud::aws::discover(&sdk, &mut config)
        .await
        .expect("every value given: nothing asked, nothing to fail");
    assert!(taken.is_empty());
    assert_eq!(config, before);
}

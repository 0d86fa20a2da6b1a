//! docs/operations/eks.md ("Deploy on EKS"), step by step with the commands it gives, against moto's EC2
//! and Route53 (AWS's APIs through the real SDK) and the real control plane: the StorageClass
//! of deploy/aws, the chart installed with `cloudProvider: aws` and the AWS side as values,
//! the operator run with exactly the flags the chart renders, and examples/eks-questdb.yaml
//! filled in. The test kubelet joins each instance moto runs from the user data moto holds,
//! as nodeadm would, under the instance's private DNS name. A step of that page that does not
//! lead to a Ready database on its own node, with its record, fails here.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use aws_sdk_ec2::config::Credentials;
use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use questdb_operator::api::QuestDB;
use questdb_operator::cli::{Cli, CloudProvider, Command as CliCommand, RunArgs};
use questdb_operator::cloud::aws::{sdk_config_loader, AwsCloud};
use questdb_operator::cloud::{DnsProvider, NodeProvider as _};
use questdb_operator::manager::{Cloud, ManagerOptions};
use questdb_testenv::moto::Moto;
use questdb_testenv::rbac::OPERATOR_NAMESPACE;
use tokio_util::sync::CancellationToken;

use crate::harness::{is_ready, wait_for, wait_until, Env};

const REGION: &str = "us-east-1";
const ZONE: &str = "us-east-1a";
const NS: &str = "orders-team";
const HOSTED_ZONE: &str = "db.example.com";

/// The AWS side made in moto: the EKS cluster (with a private subnet of its own and a public
/// one of the default VPC, and its cluster security group), the stack's database security
/// group (tagged with the cluster), an AMI, the hosted zone. The operator is told none of the
/// network ids: it reads them from the cluster, as on EKS.
pub(crate) struct AwsSide {
    pub(crate) sdk: aws_config::SdkConfig,
    /// The default VPC's subnets by zone.
    pub(crate) subnets: BTreeMap<String, String>,
    /// The cluster's private subnet, in [`ZONE`]: where a private database's node must go.
    pub(crate) private_subnet: String,
    /// The cluster security group and the database group: what every node must carry.
    pub(crate) security_groups: Vec<String>,
    pub(crate) ami: String,
    pub(crate) ami_owner: String,
    pub(crate) hosted_zone: String,
    /// `eks:DescribeCluster`'s endpoint: what the node's bootstrap must name.
    pub(crate) cluster_endpoint: String,
}

pub(crate) const CLUSTER: &str = "orders-eks";

/// One request to moto outside the SDKs the tests link (IAM's query API, EKS's REST API):
/// moto routes by the credential scope's service and checks no signature.
async fn moto_request(
    moto: &Moto,
    service: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let endpoint = moto.endpoint();
    let addr = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nAuthorization: AWS4-HMAC-SHA256 Credential=testing/20260101/{REGION}/{service}/aws4_request, SignedHeaders=host, Signature=0\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("moto");
    stream.write_all(request.as_bytes()).await.expect("sent");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("answer");
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "{service} {method} {path}: {answer}"
    );
    answer
}

pub(crate) async fn aws_side(moto: &Moto) -> AwsSide {
    let mut config = questdb_operator::cloud::CloudConfig::new(CLUSTER, REGION);
    config.endpoint_url = Some(moto.endpoint());
    // moto's first answer (its default VPC, built lazily) can take over AWS's 5 s beside other
    // tests on two cores.
    config.retry.attempt_timeout = std::time::Duration::from_secs(30);
    let sdk = sdk_config_loader(&config)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "eks"))
        .load()
        .await;
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let subnets = ec2.describe_subnets().send().await.expect("subnets");
    let default_subnet = |zone: &str| {
        subnets
            .subnets()
            .iter()
            .find(|s| s.availability_zone() == Some(zone))
            .expect("a default subnet in the zone")
            .clone()
    };
    let vpc = default_subnet(ZONE).vpc_id().expect("vpc").to_string();
    // The default VPC's subnets give public addresses; a cluster's nodes usually sit in a
    // private subnet of their own, tagged as EKS documents it.
    let private = ec2
        .create_subnet()
        .vpc_id(&vpc)
        .availability_zone(ZONE)
        .cidr_block("172.31.96.0/20")
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::Subnet)
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key("kubernetes.io/role/internal-elb")
                        .value("1")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .expect("private subnet")
        .subnet()
        .and_then(|s| s.subnet_id())
        .expect("subnet id")
        .to_string();
    let public = default_subnet("us-east-1b")
        .subnet_id()
        .expect("id")
        .to_string();
    let cluster_group = ec2
        .describe_security_groups()
        .send()
        .await
        .expect("security groups")
        .security_groups()
        .iter()
        .find(|g| g.vpc_id() == Some(vpc.as_str()) && g.group_name() == Some("default"))
        .and_then(|g| g.group_id())
        .expect("the VPC's default group stands in for the cluster security group")
        .to_string();
    // The stack's DatabaseSecurityGroup, tagged as the stack tags it.
    let database_group = ec2
        .create_security_group()
        .group_name("orders-eks-questdb")
        .description("QuestDB database ports")
        .vpc_id(&vpc)
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup)
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key(questdb_operator::cloud::TAG_CLUSTER)
                        .value(CLUSTER)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .expect("database group")
        .group_id()
        .expect("group id")
        .to_string();
    // The EKS cluster, as DescribeCluster documents it (`resourcesVpcConfig` with the
    // `clusterSecurityGroupId` EKS creates; moto keeps what it is given).
    let created = moto_request(
        moto,
        "eks",
        "POST",
        "/clusters",
        "application/json",
        &serde_json::json!({
            "name": CLUSTER,
            "roleArn": "arn:aws:iam::123456789012:role/eks-cluster",
            "resourcesVpcConfig": {
                "subnetIds": [private, public],
                "clusterSecurityGroupId": cluster_group,
                "vpcId": vpc,
            },
            "kubernetesNetworkConfig": {"serviceIpv4Cidr": "172.20.0.0/16"},
        })
        .to_string(),
    )
    .await;
    let body = &created[created.find("\r\n\r\n").expect("a body") + 4..];
    let cluster: serde_json::Value =
        serde_json::from_str(&body[body.find('{').expect("JSON")..=body.rfind('}').expect("JSON")])
            .expect("CreateCluster's answer");
    let images = ec2.describe_images().send().await.expect("images");
    let image = &images.images()[0];
    let route53 = aws_sdk_route53::Client::new(&sdk);
    let zone = route53
        .create_hosted_zone()
        .name(HOSTED_ZONE)
        .caller_reference("eks-path")
        .send()
        .await
        .expect("hosted zone");
    AwsSide {
        subnets: subnets
            .subnets()
            .iter()
            .filter_map(|s| {
                Some((
                    s.availability_zone()?.to_string(),
                    s.subnet_id()?.to_string(),
                ))
            })
            .collect(),
        private_subnet: private,
        security_groups: vec![cluster_group, database_group],
        ami: image.image_id().expect("ami").to_string(),
        ami_owner: image.owner_id().expect("owner").to_string(),
        hosted_zone: zone
            .hosted_zone()
            .expect("zone")
            .id()
            .trim_start_matches("/hostedzone/")
            .to_string(),
        cluster_endpoint: cluster["cluster"]["endpoint"]
            .as_str()
            .expect("endpoint")
            .trim_end_matches('/')
            .to_string(),
        sdk,
    }
}

/// The documented `eks-values.yaml` block as written (docs/operations/install.md, "Install
/// with Helm").
fn readme_values() -> serde_json::Value {
    let readme = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations/install.md"),
    )
    .expect("docs/operations/install.md");
    let start = readme
        .find("```yaml\n# eks-values.yaml\n")
        .expect("the documented eks-values.yaml block");
    let body = &readme[start + "```yaml\n".len()..];
    let end = body.find("```").expect("the block ends");
    serde_yaml_ng::from_str(&body[..end]).expect("the documented values are YAML")
}

/// The values a user writes after step 1: the documented block with what only moto can say
/// filled in (the cluster's name and region as moto has them, its endpoint, the hosted zone).
/// Nothing of the cluster's network: the operator reads it from the cluster. The launch
/// allow-list stays the page's, so a page whose lists refuse its own example fails here;
/// moto's AMI owner stands in for the EKS account (moto's images carry no `amazon` alias).
fn values(aws: &AwsSide, moto: &Moto) -> serde_json::Value {
    let mut v = readme_values();
    let a = &mut v["aws"];
    for given in ["subnets", "securityGroupIds", "instanceProfile", "eks"] {
        assert!(
            a.get(given).is_none(),
            "the documented first install sets aws.{given}, which the operator reads from the cluster"
        );
    }
    a["clusterName"] = CLUSTER.into();
    a["region"] = REGION.into();
    a["endpointUrl"] = moto.endpoint().into();
    a["route53HostedZoneId"] = aws.hosted_zone.clone().into();
    let owners = v["nodes"]["allowedImageOwners"]
        .as_array()
        .expect("the documented values list image owners")
        .iter()
        .map(|o| match o.as_str() {
            Some("602401143452") => serde_json::Value::from(aws.ami_owner.clone()),
            _ => o.clone(),
        })
        .collect::<Vec<_>>();
    v["nodes"]["allowedImageOwners"] = owners.into();
    // The test kubelets' Lease (the chart says: set it when yours differs).
    v["nodes"]["leaseDuration"] = format!(
        "{}s",
        questdb_testenv::timings::node_lease_duration().as_secs()
    )
    .into();
    v
}

/// examples/eks-questdb.yaml with every `<...>` filled in as its comments say.
fn filled_example(aws: &AwsSide) -> QuestDB {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/eks-questdb.yaml"),
    )
    .expect("example");
    let text = text
        .replace("<team namespace>", NS)
        .replace("<ami-...>", &aws.ami)
        .replace("<eu-west-1a>", ZONE)
        .replace("<db.example.com>", HOSTED_ZONE)
        .replace("<10.0.0.0/16>", "10.0.0.0/16");
    assert!(
        !text
            .lines()
            .any(|l| l.split('#').next().unwrap_or_default().contains('<')),
        "a placeholder is left: {text}"
    );
    serde_yaml_ng::from_str(&text).expect("the example is a QuestDB")
}

/// The arguments the chart gave the operator's Deployment.
async fn chart_args(env: &Env) -> Vec<String> {
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), OPERATOR_NAMESPACE)
        .get("questdb-operator")
        .await
        .expect("the chart's Deployment");
    deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .expect("container args")
}

/// `helm test`'s command (the chart's test Pod: the Deployment's flags with `preflight` for
/// `run`, tests/helm_chart.rs keeps the two equal), run as the operator's binary against the
/// control plane and moto (the chart's endpoint flag), with `extra` flags after the chart's. Its exit status and output.
async fn helm_test_preflight(env: &Env, extra: &[&str]) -> (bool, String) {
    let mut args = chart_args(env).await;
    assert_eq!(args[0], "run");
    args[0] = "preflight".into();
    args.extend(extra.iter().map(|s| s.to_string()));
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, env.cp.kubeconfig_yaml()).expect("kubeconfig");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_questdb-operator"))
        .args(&args)
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", OPERATOR_NAMESPACE)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env_remove("AWS_PROFILE")
        .kill_on_drop(true)
        .output()
        .await
        .expect("the operator binary runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The flags the chart gave the operator's Deployment, as the operator parses them.
async fn chart_run_args(env: &Env) -> RunArgs {
    let args = chart_args(env).await;
    let argv = std::iter::once("questdb-operator".to_string()).chain(args);
    match Cli::try_parse_from(argv).expect("the operator accepts the chart's flags") {
        Cli {
            command: CliCommand::Run(run),
            ..
        } => *run,
        other => panic!("not `run`: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_eks_path_ends_with_a_ready_database_on_its_own_node_and_record() {
    let Some(moto) = Moto::start().await else {
        return;
    };
    let aws = aws_side(&moto).await;
    let mut env = crate::helm::env_for_the_chart().await;

    // Step 2: the StorageClass the example's claim names.
    let class: StorageClass = serde_yaml_ng::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/aws/storageclass.yaml"),
        )
        .expect("storageclass.yaml"),
    )
    .expect("a StorageClass");
    Api::<StorageClass>::all(env.client.clone())
        .create(&PostParams::default(), &class)
        .await
        .expect("StorageClass applied");

    // Step 1's instance profile is not named: the operator assumes the stack's name on AWS,
    // and none with an emulator's endpoint (tests/aws_setup.rs keeps the names equal).

    // Step 5: helm install with the AWS side as values.
    let dir = tempfile::tempdir().expect("tempdir");
    let values_file = dir.path().join("eks-values.yaml");
    std::fs::write(
        &values_file,
        serde_yaml_ng::to_string(&values(&aws, &moto)).expect("values"),
    )
    .expect("values written");
    crate::helm::helm_install(&env, &[&values_file]).await;

    // The operator with the chart's flags: its cloud is built as `run` builds it.
    let run = chart_run_args(&env).await;
    // As `run` starts: the flags, then what they left out read from the EKS cluster.
    let flags = questdb_operator::app::cloud_config(&run.cloud, CloudProvider::Aws)
        .expect("the chart's AWS flags parse");
    let config = questdb_operator::app::aws_cloud_config(flags, &aws.sdk)
        .await
        .expect("the chart's AWS flags and the cluster's answer are a valid configuration");
    assert_eq!(
        config.subnets_by_zone,
        BTreeMap::from([(ZONE.to_string(), aws.private_subnet.clone())]),
        "a private database's node goes in the cluster's private subnet"
    );
    assert_eq!(config.security_group_ids, aws.security_groups);
    let cloud = AwsCloud::from_sdk_config(&aws.sdk, config, env.handle.metrics.aws_observer())
        .expect("AWS cloud");
    cloud
        .nodes
        .check_network()
        .await
        .expect("the subnet map matches EC2");
    let options = ManagerOptions {
        cloud: Some(Cloud {
            nodes: cloud.nodes.clone(),
            dns: cloud.dns.clone().map(|d| d as Arc<dyn DnsProvider>),
            settings: questdb_operator::app::cloud_settings(&run.cloud),
        }),
        ..questdb_operator::app::options_from(&run).expect("manager options")
    };
    let options = ManagerOptions {
        leader_election: None,
        metrics_addr: None,
        health_addr: None,
        ..options
    };
    let stop = CancellationToken::new();
    let boot = questdb_testenv::join_ec2_instances(
        env.cp.kubelets().clone(),
        aws_sdk_ec2::Client::new(&aws.sdk),
        stop.clone(),
    );
    // Step 5, the example (applied before the operator starts, so its first preflight
    // dry-runs the launch the example asks for): a namespace that enforces the restricted Pod Security level (a
    // dedicated database binds no host port), then the QuestDB.
    env.namespace(NS).await;
    let restricted = serde_json::json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
    }}});
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .patch(
            NS,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(restricted),
        )
        .await
        .expect("namespace labelled");
    let q = filled_example(&aws);
    env.api::<QuestDB>(NS)
        .create(&PostParams::default(), &q)
        .await
        .expect("the example applied");
    env.start_synced_manager(options).await;

    // The preflight finds nothing wrong with the documented install (the snapshot API is there:
    // the control plane runs the snapshot-controller, as the documented add-on step installs).
    let metrics = env.handle.metrics.clone();
    wait_until("the preflight ran", || {
        let scrape = metrics.render();
        async move { crate::preflight::failures(&scrape, "network").is_some() }
    })
    .await;
    let scrape = env.handle.metrics.render();
    for check in [
        "network",
        "instance-types",
        "hosted-zone",
        "snapshot-api",
        "launch",
        "storage-class",
    ] {
        assert_eq!(
            crate::preflight::failures(&scrape, check),
            Some(0),
            "the preflight's {check} check fails on the documented install"
        );
    }

    let ready = wait_for(
        &env.api::<QuestDB>(NS),
        "orders",
        "orders Ready",
        is_ready(),
    )
    .await;
    let status = ready.status.expect("status");
    let instance_id = status.instance_id.clone().expect("instance");

    // Its own instance in moto, hardened, in the zone, and a record naming it.
    let ec2 = aws_sdk_ec2::Client::new(&aws.sdk);
    let out = ec2
        .describe_instances()
        .instance_ids(&instance_id)
        .send()
        .await
        .expect("instance");
    let instance = &out.reservations()[0].instances()[0];
    // In the cluster's private subnet, with the cluster's and the database's groups, and a
    // bootstrap naming the endpoint the cluster gave: none of them typed by the user.
    assert_eq!(instance.subnet_id(), Some(aws.private_subnet.as_str()));
    let mut groups: Vec<&str> = instance
        .security_groups()
        .iter()
        .filter_map(|g| g.group_id())
        .collect();
    groups.sort();
    let mut expected: Vec<&str> = aws.security_groups.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(groups, expected);
    let user_data = ec2
        .describe_instance_attribute()
        .instance_id(&instance_id)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
        .send()
        .await
        .expect("user data")
        .user_data()
        .and_then(|u| u.value())
        .map(str::to_string)
        .expect("the instance has user data");
    use base64::Engine as _;
    let user_data = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(user_data)
            .expect("base64 user data"),
    )
    .expect("text");
    assert!(
        user_data.contains(&format!("apiServerEndpoint: \"{}\"", aws.cluster_endpoint)),
        "the bootstrap names the cluster's endpoint {}: {user_data}",
        aws.cluster_endpoint
    );
    assert_eq!(
        instance.placement().and_then(|p| p.availability_zone()),
        Some(ZONE)
    );
    assert_eq!(
        instance
            .metadata_options()
            .and_then(|m| m.http_tokens())
            .map(|t| t.as_str()),
        Some("required")
    );
    // The record names the pod's address, a secondary one of the instance's network
    // interface (the VPC CNI's), not the node's: no host port, no privileged namespace.
    let pod_ip = env
        .api::<k8s_openapi::api::core::v1::Pod>(NS)
        .get("orders-0")
        .await
        .expect("database pod")
        .status
        .and_then(|s| s.pod_ip)
        .expect("pod address");
    let secondary: Vec<&str> = instance
        .network_interfaces()
        .iter()
        .flat_map(|n| n.private_ip_addresses())
        .filter(|a| a.primary() != Some(true))
        .filter_map(|a| a.private_ip_address())
        .collect();
    assert!(
        secondary.contains(&pod_ip.as_str()),
        "{pod_ip} is one of the instance's addresses"
    );
    // `helm test`: the preflight passes on the documented install, the example's launch
    // dry-run included; with an instance profile no one made it fails, naming it.
    let (passed, output) = helm_test_preflight(&env, &[]).await;
    assert!(passed && output.contains("preflight passed"), "{output}");
    let (passed, output) =
        helm_test_preflight(&env, &["--aws-instance-profile=nobody-made-this"]).await;
    assert!(
        !passed && output.contains("FAIL launch") && output.contains("nobody-made-this"),
        "{output}"
    );

    let record = format!("orders.{NS}.{HOSTED_ZONE}");
    assert_eq!(status.dns_name.as_deref(), Some(record.as_str()));
    let dns = cloud.dns.clone().expect("DNS provider");
    let a = dns
        .read_a(&record)
        .await
        .expect("record read")
        .expect("record");
    assert_eq!(a.ips, [pod_ip]);

    // Deleting the QuestDB gives the instance and the record back; the data stays (retainOnDelete).
    env.api::<QuestDB>(NS)
        .delete("orders", &DeleteParams::default())
        .await
        .expect("deleted");
    wait_until("the instance terminated and the record deleted", || {
        let ec2 = ec2.clone();
        let dns = dns.clone();
        let (id, record) = (instance_id.clone(), record.clone());
        async move {
            let terminated = ec2
                .describe_instances()
                .instance_ids(id)
                .send()
                .await
                .ok()
                .and_then(|o| {
                    o.reservations()[0].instances()[0]
                        .state()
                        .and_then(|s| s.name())
                        .map(|n| matches!(n.as_str(), "shutting-down" | "terminated"))
                })
                .unwrap_or(false);
            terminated && dns.read_a(&record).await.is_ok_and(|r| r.is_none())
        }
    })
    .await;
    stop.cancel();
    boot.await
        .expect("the instance join task")
        .expect("every instance moto ran joined");
    env.stop().await;
}

//! The README's "Deploy on EKS", step by step with the commands it gives, against moto's EC2
//! and Route53 (AWS's APIs through the real SDK) and the real control plane: the StorageClass
//! of deploy/aws, the chart installed with `cloudProvider: aws` and the AWS side as values,
//! the operator run with exactly the flags the chart renders, and examples/eks-questdb.yaml
//! filled in. The test kubelet joins each instance moto runs from the user data moto holds,
//! as nodeadm would, under the instance's private DNS name. A step of the README that does not
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

/// What the README's CloudFormation stack and `aws eks describe-cluster` hand the user, made in
/// moto: subnets of the default VPC, a security group, an AMI, the hosted zone.
pub(crate) struct AwsSide {
    pub(crate) sdk: aws_config::SdkConfig,
    pub(crate) subnets: BTreeMap<String, String>,
    pub(crate) security_group: String,
    pub(crate) ami: String,
    pub(crate) ami_owner: String,
    pub(crate) hosted_zone: String,
}

pub(crate) async fn aws_side(moto: &Moto) -> AwsSide {
    let mut config = questdb_operator::cloud::CloudConfig::new("orders-eks", REGION);
    config.endpoint_url = Some(moto.endpoint());
    // moto's first answer (its default VPC, built lazily) can take over AWS's 5 s beside other
    // tests on two cores.
    config.retry.attempt_timeout = std::time::Duration::from_secs(30);
    let sdk = sdk_config_loader(&config)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "eks"))
        .load()
        .await;
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let subnets = ec2
        .describe_subnets()
        .send()
        .await
        .expect("subnets")
        .subnets()
        .iter()
        .filter_map(|s| {
            Some((
                s.availability_zone()?.to_string(),
                s.subnet_id()?.to_string(),
            ))
        })
        .collect();
    let security_group = ec2
        .describe_security_groups()
        .send()
        .await
        .expect("security groups")
        .security_groups()[0]
        .group_id()
        .expect("group id")
        .to_string();
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
        subnets,
        security_group,
        ami: image.image_id().expect("ami").to_string(),
        ami_owner: image.owner_id().expect("owner").to_string(),
        hosted_zone: zone
            .hosted_zone()
            .expect("zone")
            .id()
            .trim_start_matches("/hostedzone/")
            .to_string(),
        sdk,
    }
}

/// Step 1's instance profile, which the stack makes: EC2 (and moto) refuse a RunInstances
/// that names a profile IAM does not have. Through moto's IAM query API (no IAM SDK here);
/// moto routes by the credential scope and checks no signature.
async fn create_instance_profile(moto: &Moto, name: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let endpoint = moto.endpoint();
    let addr = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let body =
        format!("Action=CreateInstanceProfile&InstanceProfileName={name}&Version=2010-05-08");
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nAuthorization: AWS4-HMAC-SHA256 Credential=testing/20260101/{REGION}/iam/aws4_request, SignedHeaders=host, Signature=0\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("moto");
    stream.write_all(request.as_bytes()).await.expect("sent");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("answer");
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "CreateInstanceProfile: {answer}"
    );
}

/// The README's `eks-values.yaml` block as written (README "Install with Helm").
fn readme_values() -> serde_json::Value {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README");
    let start = readme
        .find("```yaml\n# eks-values.yaml\n")
        .expect("the README's eks-values.yaml block");
    let body = &readme[start + "```yaml\n".len()..];
    let end = body.find("```").expect("the block ends");
    serde_yaml_ng::from_str(&body[..end]).expect("the README's values are YAML")
}

/// The values a user writes after step 1: the README's block with what only moto (and the
/// cluster) can say filled in (its region, subnets, security group, hosted zone, endpoint, the
/// cluster's endpoint and CA). The launch
/// allow-list stays the README's, so a README whose lists refuse its own example fails here;
/// moto's AMI owner stands in for the EKS account (moto's images carry no `amazon` alias).
fn values(aws: &AwsSide, moto: &Moto) -> serde_json::Value {
    let mut v = readme_values();
    let a = &mut v["aws"];
    a["region"] = REGION.into();
    a["endpointUrl"] = moto.endpoint().into();
    a["subnets"] = serde_json::json!(aws.subnets);
    a["publicSubnets"] = serde_json::json!({});
    a["securityGroupIds"] = serde_json::json!([aws.security_group]);
    a["route53HostedZoneId"] = aws.hosted_zone.clone().into();
    // `aws eks describe-cluster`'s answer for this cluster (the README shows it elided).
    a["eks"]["apiEndpoint"] = "https://ABCDEF.gr7.us-east-1.eks.amazonaws.com".into();
    a["eks"]["certificateAuthority"] = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==".into();
    let owners = v["nodes"]["allowedImageOwners"]
        .as_array()
        .expect("the README lists image owners")
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

/// The flags the chart gave the operator's Deployment, as the operator parses them.
async fn chart_run_args(env: &Env) -> RunArgs {
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), OPERATOR_NAMESPACE)
        .get("questdb-operator")
        .await
        .expect("the chart's Deployment");
    let args = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .expect("container args");
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

    // Step 1 made the nodes' instance profile the values name.
    let profile = readme_values()["aws"]["instanceProfile"]
        .as_str()
        .expect("the README's values name the instance profile")
        .to_string();
    create_instance_profile(&moto, &profile).await;

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
    let config = questdb_operator::app::cloud_config(&run.cloud, CloudProvider::Aws)
        .expect("the chart's AWS flags are a valid configuration");
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
    env.start_synced_manager(options).await;

    // The preflight finds nothing wrong with the README's install (the snapshot API is there:
    // the control plane runs the snapshot-controller, as the README's add-on step installs).
    let metrics = env.handle.metrics.clone();
    wait_until("the preflight ran", || {
        let scrape = metrics.render();
        async move { crate::preflight::failures(&scrape, "network").is_some() }
    })
    .await;
    let scrape = env.handle.metrics.render();
    for check in ["network", "instance-types", "hosted-zone", "snapshot-api"] {
        assert_eq!(
            crate::preflight::failures(&scrape, check),
            Some(0),
            "the preflight's {check} check fails on the README's install"
        );
    }

    // Step 5, the example: a namespace that enforces the restricted Pod Security level (a
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

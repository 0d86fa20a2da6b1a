//! `eks:DescribeCluster` and the EC2 questions of start-up discovery
//! ([`crate::cloud::discovery`]): asked once, only for what the flags left out.

use aws_config::SdkConfig;
use aws_sdk_eks::Client;

use super::{api_error, AwsEc2};
use crate::cloud::discovery::{self, ClusterFacts, Wanted};
use crate::cloud::{ApiError, CloudConfig, CloudError, TAG_CLUSTER};

/// The EKS client.
#[derive(Clone, Debug)]
pub struct AwsEks {
    client: Client,
}

impl AwsEks {
    pub(crate) fn new(sdk: &SdkConfig) -> Self {
        Self {
            client: Client::new(sdk),
        }
    }

    /// The endpoint, CA, service range, cluster security group and subnet ids of `name`.
    pub(crate) async fn cluster_facts(
        &self,
        name: &str,
    ) -> Result<(ClusterFacts, Vec<String>), ApiError> {
        let out = self
            .client
            .describe_cluster()
            .name(name)
            .send()
            .await
            .map_err(api_error)?;
        let Some(cluster) = out.cluster() else {
            return Ok((ClusterFacts::default(), Vec::new()));
        };
        let vpc = cluster.resources_vpc_config();
        let facts = ClusterFacts {
            endpoint: cluster.endpoint().map(str::to_string),
            certificate_authority: cluster
                .certificate_authority()
                .and_then(|c| c.data())
                .map(str::to_string),
            service_cidr: cluster
                .kubernetes_network_config()
                .and_then(|n| n.service_ipv4_cidr())
                .map(str::to_string),
            cluster_security_group: vpc
                .and_then(|v| v.cluster_security_group_id())
                .map(str::to_string),
            subnets: Vec::new(),
            database_security_groups: Vec::new(),
        };
        let subnet_ids = vpc.map(|v| v.subnet_ids().to_vec()).unwrap_or_default();
        Ok((facts, subnet_ids))
    }
}

/// Fills in what the flags left out of `config` from the EKS cluster named
/// `config.cluster_name`; returns what it took (for the start-up line). Asks nothing when
/// nothing is missing. An answer AWS refuses is an error naming the call, the permission and
/// the flags that make the question unnecessary.
pub async fn discover(
    sdk: &SdkConfig,
    config: &mut CloudConfig,
) -> Result<Vec<String>, CloudError> {
    let wanted = discovery::wanted(config);
    if !wanted.any() {
        return Ok(Vec::new());
    }
    let name = config.cluster_name.clone();
    let (mut facts, subnet_ids) = AwsEks::new(sdk)
        .cluster_facts(&name)
        .await
        .map_err(|e| refused(&name, &config.region, "eks:DescribeCluster", wanted, e))?;
    let ec2 = AwsEc2::new(sdk);
    if wanted.subnets || wanted.public_subnets {
        facts.subnets = ec2
            .cluster_subnets(&subnet_ids)
            .await
            .map_err(|e| refused(&name, &config.region, "ec2:DescribeSubnets", wanted, e))?;
    }
    if wanted.security_groups {
        facts.database_security_groups = ec2
            .security_groups_tagged(TAG_CLUSTER, &name)
            .await
            .map_err(|e| {
                refused(
                    &name,
                    &config.region,
                    "ec2:DescribeSecurityGroups",
                    wanted,
                    e,
                )
            })?;
    }
    let taken = discovery::fill(config, wanted, &facts);
    let missing = discovery::still_missing(config, Some(&facts));
    if !missing.is_empty() {
        return Err(CloudError::Config(format!(
            "the EKS cluster {name} does not say everything a node needs; set {}",
            missing.join("; ")
        )));
    }
    Ok(taken)
}

fn refused(name: &str, region: &str, call: &str, wanted: Wanted, e: ApiError) -> CloudError {
    let mut flags = Vec::new();
    if wanted.eks {
        flags.push("--eks-api-endpoint, --eks-certificate-authority, --eks-service-cidr");
    }
    if wanted.subnets {
        flags.push("--aws-subnets");
    }
    if wanted.security_groups {
        flags.push("--aws-security-group-ids");
    }
    let hint = match e.code.as_str() {
        "ResourceNotFoundException" => format!(
            "no EKS cluster is named {name} in {region}: --cluster-name must be the EKS cluster's name"
        ),
        "AccessDeniedException" | "AccessDenied" | "UnauthorizedOperation" => {
            format!("the operator's role lacks {call} (deploy/aws/iam-policy.json grants it)")
        }
        _ => format!("{call} failed"),
    };
    CloudError::Config(format!(
        "reading the EKS cluster {name} for what the flags left out: {hint} ({}: {}); or set {}",
        e.code,
        e.message,
        flags.join(", ")
    ))
}

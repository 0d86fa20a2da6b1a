//! The operator-wide cloud settings (one per operator, not per QuestDB).

use std::collections::BTreeMap;
use std::time::Duration;

use super::CloudError;

/// Cluster-wide AWS settings. Per-database choices (AMI, instance type, zone) live in the
/// QuestDB's `spec.node`; everything that is the same for every database lives here.
#[derive(Clone, Debug, PartialEq)]
pub struct CloudConfig {
    /// Value of the `questdb.io/cluster` tag: separates operators sharing one AWS account.
    pub cluster_name: String,
    pub region: String,
    /// Availability zone -> subnet id. A database's node must be in its volume's zone.
    pub subnets_by_zone: BTreeMap<String, String>,
    /// Availability zone -> subnet id for databases with a public address (`spec.dns.public`):
    /// a public subnet routes to an internet gateway, which private databases should not sit
    /// behind. Empty: public databases use [`Self::subnets_by_zone`] too.
    pub public_subnets_by_zone: BTreeMap<String, String>,
    pub security_group_ids: Vec<String>,
    /// Instance profile name, or ARN (starts with `arn:`).
    pub instance_profile: Option<String>,
    /// Tags of the operator's user on every instance, root volume and network interface at
    /// launch (`--node-tags`): cost allocation, and accounts whose tag policies deny an untagged
    /// RunInstances. Never one of the operator's own keys ([`super::reserved_tag_key`]).
    pub node_tags: BTreeMap<String, String>,
    /// Node bootstrap script with `{{var}}` placeholders, see [`super::user_data`].
    pub user_data_template: String,
    /// What the default (AL2023 `nodeadm`) bootstrap needs to know about the EKS cluster.
    pub eks: EksCluster,
    /// The root volume (and the image's other EBS devices) of every dedicated node.
    pub volumes: super::NodeVolumes,
    /// The images and instance types a QuestDB may ask for; checked before every launch.
    pub allow_list: super::LaunchAllowList,
    pub hosted_zone_id: Option<String>,
    /// Talk to this endpoint instead of AWS (moto in tests, the sandbox).
    pub endpoint_url: Option<String>,
    pub retry: RetryPolicy,
    /// EC2's client-side budget.
    pub rate_limit: RateLimit,
    /// Route53's, separate: Route53 allows five requests per second per account for all of
    /// its API (Route53 developer guide, "Quotas: API requests"), far below EC2.
    pub route53_rate_limit: RateLimit,
}

impl CloudConfig {
    /// A configuration with sensible retry/rate-limit defaults and nothing cluster-specific.
    pub fn new(cluster_name: impl Into<String>, region: impl Into<String>) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            region: region.into(),
            subnets_by_zone: BTreeMap::new(),
            public_subnets_by_zone: BTreeMap::new(),
            security_group_ids: Vec::new(),
            instance_profile: None,
            node_tags: BTreeMap::new(),
            user_data_template: String::new(),
            eks: EksCluster::default(),
            volumes: super::NodeVolumes::default(),
            allow_list: super::LaunchAllowList::default(),
            hosted_zone_id: None,
            endpoint_url: None,
            retry: RetryPolicy::default(),
            rate_limit: RateLimit::default(),
            route53_rate_limit: RateLimit::route53(),
        }
    }
}

/// The EKS cluster a node joins (`aws eks describe-cluster`: `endpoint`,
/// `certificateAuthority.data`, `kubernetesNetworkConfig.serviceIpv4Cidr`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EksCluster {
    pub api_endpoint: Option<String>,
    /// Base64 PEM bundle, as DescribeCluster returns it.
    pub certificate_authority: Option<String>,
    pub service_cidr: Option<String>,
}

/// How long and how often to retry calls that may succeed later.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// First backoff; doubles each attempt, with full jitter.
    pub min_delay: Duration,
    pub max_delay: Duration,
    /// Attempts after the first for throttling and transient errors.
    pub max_retries: usize,
    /// How long an `InvalidInstanceID.NotFound` is treated as EC2 lagging behind a launch.
    pub eventual_consistency_window: Duration,
    /// One attempt that has not answered by then counts as a transient `Timeout`.
    pub attempt_timeout: Duration,
    /// No retry starts after this much time since the call began: a call always ends well
    /// within the leader Lease (15 s by default), so a deposed leader's AWS calls do not
    /// outlive its leadership by long.
    pub call_deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            max_retries: 6,
            eventual_consistency_window: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(5),
            call_deadline: Duration::from_secs(12),
        }
    }
}

/// Client-side token bucket shared by all calls of one provider, so a burst of reconciles does
/// not spend the account-wide EC2 API budget that other tools need too.
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        // Well below EC2's documented non-mutating bucket refill (20/s) so the operator never
        // starves other clients in the account.
        Self {
            per_second: 10.0,
            burst: 20,
        }
    }
}

impl RateLimit {
    /// Below Route53's five requests per second per account, leaving room for other tools.
    pub(crate) fn route53() -> Self {
        Self {
            per_second: 3.0,
            burst: 5,
        }
    }
}

/// The subnet a node in `zone` is launched into: a public one for a node with a public
/// address when public subnets are configured, the zone's private one otherwise.
pub fn pick_subnet<'a>(
    zone: &str,
    public: bool,
    config: &'a CloudConfig,
) -> Result<&'a str, CloudError> {
    let (subnets, flag) = if public && !config.public_subnets_by_zone.is_empty() {
        (&config.public_subnets_by_zone, "--aws-public-subnets")
    } else {
        (&config.subnets_by_zone, "--aws-subnets")
    };
    subnets.get(zone).map(String::as_str).ok_or_else(|| {
        let known: Vec<&str> = subnets.keys().map(String::as_str).collect();
        CloudError::Config(format!(
            "no subnet configured for zone {zone} in {flag} (configured zones: [{}])",
            known.join(", ")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnet_is_the_one_of_the_zone() {
        let mut c = CloudConfig::new("c1", "us-east-1");
        c.subnets_by_zone
            .insert("us-east-1a".into(), "subnet-a".into());
        c.subnets_by_zone
            .insert("us-east-1b".into(), "subnet-b".into());
        assert_eq!(pick_subnet("us-east-1b", false, &c), Ok("subnet-b"));
        // Without public subnets, a public node shares the zone's subnet.
        assert_eq!(pick_subnet("us-east-1b", true, &c), Ok("subnet-b"));
    }

    #[test]
    fn unknown_zone_is_a_config_error_naming_the_known_zones() {
        let mut c = CloudConfig::new("c1", "us-east-1");
        c.subnets_by_zone
            .insert("us-east-1a".into(), "subnet-a".into());
        let err = pick_subnet("us-east-1c", false, &c).unwrap_err();
        assert!(err.is_permanent());
        let text = err.to_string();
        assert!(
            text.contains("us-east-1c") && text.contains("us-east-1a"),
            "{text}"
        );
    }

    #[test]
    fn a_public_database_never_lands_in_a_private_subnet_when_public_ones_are_configured() {
        let mut c = CloudConfig::new("c1", "us-east-1");
        c.subnets_by_zone = [("us-east-1a".into(), "subnet-private-a".into())].into();
        c.public_subnets_by_zone = [("us-east-1a".into(), "subnet-public-a".into())].into();
        assert_eq!(pick_subnet("us-east-1a", true, &c), Ok("subnet-public-a"));
        assert_eq!(pick_subnet("us-east-1a", false, &c), Ok("subnet-private-a"));
        c.subnets_by_zone
            .insert("us-east-1b".into(), "subnet-private-b".into());
        // A zone with only a private subnet is an error for a public database, not a fallback
        // to a subnet whose route table has no internet gateway.
        let err = pick_subnet("us-east-1b", true, &c).unwrap_err().to_string();
        assert!(
            err.contains("--aws-public-subnets") && err.contains("us-east-1b"),
            "{err}"
        );
    }
}

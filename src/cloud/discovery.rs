//! What a first install does not have to type: the EKS cluster's API endpoint, CA and service
//! range, the subnets a node goes in and the security groups it carries, read from AWS
//! (`eks:DescribeCluster`, `ec2:DescribeSubnets`, `ec2:DescribeSecurityGroups`) when a flag
//! leaves them out. A flag always wins; nothing is asked when every value is given.
//!
//! Pure: [`wanted`] says what to ask, the AWS shell (`aws::eks`) asks, [`fill`] takes the
//! answer into the configuration and says, for the start-up log line, what it took.

// The EKS discovery is the AWS provider's: a build without it (the sandbox's) calls only the
// checks, and the rest stays compiled and unit-tested there.
#![cfg_attr(not(feature = "aws"), allow(dead_code))]

use std::collections::BTreeMap;

use super::CloudConfig;

/// The subnet tag EKS documents for private subnets (internal load balancers): "Subnet
/// requirements and considerations", Amazon EKS user guide.
pub(crate) const INTERNAL_ELB_TAG: &str = "kubernetes.io/role/internal-elb";
/// ... and for public ones (internet-facing load balancers).
pub(crate) const PUBLIC_ELB_TAG: &str = "kubernetes.io/role/elb";

/// The instance profile the CloudFormation stack makes (`deploy/aws`), and so the default of
/// `--aws-instance-profile`: `<cluster>-questdb-node`.
pub fn default_instance_profile(cluster_name: &str) -> String {
    format!("{cluster_name}-questdb-node")
}

/// What AWS says of the cluster the operator runs in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClusterFacts {
    /// `cluster.endpoint`.
    pub endpoint: Option<String>,
    /// `cluster.certificateAuthority.data` (base64 PEM).
    pub certificate_authority: Option<String>,
    /// `cluster.kubernetesNetworkConfig.serviceIpv4Cidr`.
    pub service_cidr: Option<String>,
    /// `cluster.resourcesVpcConfig.clusterSecurityGroupId`: the group EKS made for the cluster,
    /// which lets a node reach the API server and the cluster's DNS.
    pub cluster_security_group: Option<String>,
    /// The cluster's subnets (`resourcesVpcConfig.subnetIds`) as DescribeSubnets tells them.
    pub subnets: Vec<ClusterSubnet>,
    /// Groups tagged `questdb.io/cluster=<cluster>` (the stack's database group: clients reach
    /// the database ports through it).
    pub database_security_groups: Vec<String>,
}

/// One of the cluster's subnets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClusterSubnet {
    pub id: String,
    pub zone: String,
    /// Tagged for internet-facing load balancers, or giving instances public addresses.
    pub public: bool,
    pub free_addresses: i32,
}

impl ClusterSubnet {
    /// From DescribeSubnets' answer: a subnet is public when tagged `kubernetes.io/role/elb`,
    /// private when tagged `.../internal-elb`, and otherwise as `MapPublicIpOnLaunch` says.
    pub(crate) fn classify(
        id: String,
        zone: String,
        tags: &BTreeMap<String, String>,
        maps_public_ip: bool,
        free_addresses: i32,
    ) -> Self {
        let public = if tags.contains_key(PUBLIC_ELB_TAG) {
            true
        } else if tags.contains_key(INTERNAL_ELB_TAG) {
            false
        } else {
            maps_public_ip
        };
        Self {
            id,
            zone,
            public,
            free_addresses,
        }
    }
}

/// The values the flags left out, and so the questions to ask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Endpoint, CA or service range, used by the user-data template and not given.
    pub eks: bool,
    pub subnets: bool,
    pub public_subnets: bool,
    pub security_groups: bool,
}

impl Wanted {
    pub(crate) fn any(self) -> bool {
        self.eks || self.subnets || self.public_subnets || self.security_groups
    }
}

/// What to ask AWS for, given what the flags said.
pub fn wanted(config: &CloudConfig) -> Wanted {
    let used = super::user_data::placeholders(&config.user_data_template);
    let uses = |names: &[&str]| used.iter().any(|u| names.contains(&u.as_str()));
    let eks = &config.eks;
    Wanted {
        eks: (eks.api_endpoint.is_none() && uses(&["api_endpoint"]))
            || (eks.certificate_authority.is_none() && uses(&["certificate_authority"]))
            || (eks.service_cidr.is_none() && uses(&["service_cidr", "cluster_dns_ip"])),
        subnets: config.subnets_by_zone.is_empty(),
        // Given private subnets and no public ones: public databases share the given ones
        // (the flag's documented meaning), so the cluster is not asked.
        public_subnets: config.subnets_by_zone.is_empty()
            && config.public_subnets_by_zone.is_empty(),
        security_groups: config.security_group_ids.is_empty(),
    }
}

/// Per zone, the subnet with the most free addresses (then the lowest id, so two replicas of
/// the operator choose alike) among the private or the public ones.
pub(crate) fn subnets_by_zone(subnets: &[ClusterSubnet], public: bool) -> BTreeMap<String, String> {
    let mut best: BTreeMap<String, &ClusterSubnet> = BTreeMap::new();
    for s in subnets.iter().filter(|s| s.public == public) {
        let better = match best.get(&s.zone) {
            None => true,
            Some(b) => {
                (s.free_addresses, std::cmp::Reverse(&s.id))
                    > (b.free_addresses, std::cmp::Reverse(&b.id))
            }
        };
        if better {
            best.insert(s.zone.clone(), s);
        }
    }
    best.into_iter().map(|(z, s)| (z, s.id.clone())).collect()
}

/// Takes what the flags left out from `facts`; returns one phrase per value taken (for the
/// start-up line: ids and addresses only, nothing secret; the CA is named, not printed).
pub(crate) fn fill(config: &mut CloudConfig, wanted: Wanted, facts: &ClusterFacts) -> Vec<String> {
    let mut taken = Vec::new();
    if wanted.eks {
        let eks = &mut config.eks;
        if eks.api_endpoint.is_none() {
            if let Some(e) = &facts.endpoint {
                eks.api_endpoint = Some(e.trim_end_matches('/').to_string());
                taken.push(format!("API endpoint {}", e.trim_end_matches('/')));
            }
        }
        if eks.certificate_authority.is_none() && facts.certificate_authority.is_some() {
            eks.certificate_authority = facts.certificate_authority.clone();
            taken.push("certificate authority".to_string());
        }
        if eks.service_cidr.is_none() {
            if let Some(c) = &facts.service_cidr {
                eks.service_cidr = Some(c.clone());
                taken.push(format!("service range {c}"));
            }
        }
    }
    let show = |m: &BTreeMap<String, String>| {
        m.iter()
            .map(|(z, s)| format!("{z}={s}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    if wanted.subnets {
        let private = subnets_by_zone(&facts.subnets, false);
        if !private.is_empty() {
            taken.push(format!("private subnets {}", show(&private)));
            config.subnets_by_zone = private;
        }
    }
    if wanted.public_subnets {
        let public = subnets_by_zone(&facts.subnets, true);
        if !public.is_empty() {
            taken.push(format!("public subnets {}", show(&public)));
            config.public_subnets_by_zone = public;
        }
    }
    if wanted.security_groups {
        // Both or neither: the cluster's group alone leaves clients outside, the database's
        // alone leaves the node without its API server.
        if let Some(cluster_group) = &facts.cluster_security_group {
            if !facts.database_security_groups.is_empty() {
                let mut groups = vec![cluster_group.clone()];
                for g in &facts.database_security_groups {
                    if !groups.contains(g) {
                        groups.push(g.clone());
                    }
                }
                taken.push(format!("security groups {}", groups.join(",")));
                config.security_group_ids = groups;
            }
        }
    }
    taken
}

/// What is still missing after discovery, each naming its flag and where discovery looked.
pub(crate) fn still_missing(config: &CloudConfig, facts: Option<&ClusterFacts>) -> Vec<String> {
    let mut out = Vec::new();
    if config.subnets_by_zone.is_empty() {
        out.push(match facts {
            Some(_) => "--aws-subnets: none of the EKS cluster's subnets is private (tagged kubernetes.io/role/internal-elb, or not giving public addresses)".to_string(),
            None => "--aws-subnets: no node can be launched without a subnet".to_string(),
        });
    }
    if config.security_group_ids.is_empty() {
        out.push(match facts {
            Some(f) if f.cluster_security_group.is_none() => "--aws-security-group-ids: the EKS cluster names no cluster security group".to_string(),
            Some(_) => format!(
                "--aws-security-group-ids: no security group is tagged questdb.io/cluster={} (the stack's database group carries it; without a group EC2 gives nodes the VPC's default group, which does not let them reach the cluster)",
                config.cluster_name
            ),
            None => "--aws-security-group-ids: without it EC2 gives nodes the VPC's default group, which does not let them reach the cluster".to_string(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subnet(id: &str, zone: &str, public: bool, free: i32) -> ClusterSubnet {
        ClusterSubnet {
            id: id.into(),
            zone: zone.into(),
            public,
            free_addresses: free,
        }
    }

    fn config() -> CloudConfig {
        let mut c = CloudConfig::new("prod-eu", "eu-west-1");
        c.user_data_template = crate::cloud::user_data::AL2023_NODECONFIG_TEMPLATE.to_string();
        c
    }

    fn facts() -> ClusterFacts {
        ClusterFacts {
            endpoint: Some("https://ABC.gr7.eu-west-1.eks.amazonaws.com/".into()),
            certificate_authority: Some("LS0tLS1CRUdJTg==".into()),
            service_cidr: Some("172.20.0.0/16".into()),
            cluster_security_group: Some("sg-cluster".into()),
            subnets: vec![
                subnet("subnet-a-private", "eu-west-1a", false, 200),
                subnet("subnet-a-public", "eu-west-1a", true, 4000),
                subnet("subnet-b-private", "eu-west-1b", false, 100),
            ],
            database_security_groups: vec!["sg-db".into()],
        }
    }

    #[test]
    fn a_first_install_with_only_the_cluster_name_gets_every_network_value_from_the_cluster() {
        let mut c = config();
        let w = wanted(&c);
        assert_eq!(
            w,
            Wanted {
                eks: true,
                subnets: true,
                public_subnets: true,
                security_groups: true
            }
        );
        let taken = fill(&mut c, w, &facts());
        assert_eq!(
            c.eks.api_endpoint.as_deref(),
            Some("https://ABC.gr7.eu-west-1.eks.amazonaws.com")
        );
        assert_eq!(c.eks.service_cidr.as_deref(), Some("172.20.0.0/16"));
        assert_eq!(
            c.subnets_by_zone,
            BTreeMap::from([
                ("eu-west-1a".to_string(), "subnet-a-private".to_string()),
                ("eu-west-1b".to_string(), "subnet-b-private".to_string()),
            ]),
            "a private database never lands in a public subnet, however roomy"
        );
        assert_eq!(
            c.public_subnets_by_zone,
            BTreeMap::from([("eu-west-1a".to_string(), "subnet-a-public".to_string())])
        );
        assert_eq!(c.security_group_ids, ["sg-cluster", "sg-db"]);
        assert!(still_missing(&c, Some(&facts())).is_empty());
        crate::cloud::user_data::check_template(&c).expect("the default bootstrap has its values");
        let line = taken.join("; ");
        assert!(
            !line.contains("LS0tLS1CRUdJTg=="),
            "the CA is named, not printed: {line}"
        );
    }

    #[test]
    fn a_value_given_by_flag_is_never_replaced_by_what_the_cluster_says() {
        let mut c = config();
        c.eks.api_endpoint = Some("https://mine".into());
        c.eks.certificate_authority = Some("bWluZQ==".into());
        c.eks.service_cidr = Some("10.100.0.0/16".into());
        c.subnets_by_zone = BTreeMap::from([("eu-west-1a".into(), "subnet-mine".into())]);
        c.public_subnets_by_zone = BTreeMap::from([("eu-west-1a".into(), "subnet-pub".into())]);
        c.security_group_ids = vec!["sg-mine".into()];
        let w = wanted(&c);
        assert!(!w.any(), "nothing asked, no permission needed: {w:?}");
        let before = c.clone();
        assert!(fill(&mut c, w, &facts()).is_empty());
        assert_eq!(c, before);
        // One value left out: only that one is taken.
        c.eks.service_cidr = None;
        let w = wanted(&c);
        assert!(w.eks && !w.subnets && !w.security_groups);
        fill(&mut c, w, &facts());
        assert_eq!(c.eks.api_endpoint.as_deref(), Some("https://mine"));
        assert_eq!(c.eks.service_cidr.as_deref(), Some("172.20.0.0/16"));
    }

    #[test]
    fn a_template_that_needs_no_cluster_values_asks_for_none() {
        let mut c = config();
        c.user_data_template = "labels={{node_labels}} taints={{node_taints}}".into();
        c.subnets_by_zone = BTreeMap::from([("a".into(), "subnet-1".into())]);
        c.public_subnets_by_zone = BTreeMap::from([("a".into(), "subnet-2".into())]);
        c.security_group_ids = vec!["sg-1".into()];
        assert!(!wanted(&c).any());
    }

    #[test]
    fn one_security_group_alone_is_never_taken_and_the_missing_one_is_named() {
        let mut c = config();
        let mut f = facts();
        f.database_security_groups.clear();
        let w = wanted(&c);
        fill(&mut c, w, &f);
        assert!(c.security_group_ids.is_empty());
        let missing = still_missing(&c, Some(&f)).join("\n");
        assert!(
            missing.contains("--aws-security-group-ids")
                && missing.contains("questdb.io/cluster=prod-eu"),
            "{missing}"
        );
        let mut c = config();
        let mut f = facts();
        f.cluster_security_group = None;
        let w = wanted(&c);
        fill(&mut c, w, &f);
        assert!(c.security_group_ids.is_empty());
        assert!(still_missing(&c, Some(&f))
            .join("\n")
            .contains("no cluster security group"));
    }

    #[test]
    fn a_cluster_of_public_subnets_only_leaves_the_private_ones_to_the_flag() {
        let mut c = config();
        let mut f = facts();
        f.subnets.retain(|s| s.public);
        let w = wanted(&c);
        fill(&mut c, w, &f);
        assert!(c.subnets_by_zone.is_empty());
        assert!(still_missing(&c, Some(&f))[0].starts_with("--aws-subnets"));
    }

    #[test]
    fn subnets_are_told_apart_by_eks_tags_before_public_addresses() {
        let tags = |k: &str| BTreeMap::from([(k.to_string(), "1".to_string())]);
        let s = |t: &BTreeMap<String, String>, maps| {
            ClusterSubnet::classify("s".into(), "z".into(), t, maps, 1).public
        };
        assert!(s(&tags(PUBLIC_ELB_TAG), false));
        assert!(!s(&tags(INTERNAL_ELB_TAG), true));
        assert!(s(&BTreeMap::new(), true));
        assert!(!s(&BTreeMap::new(), false));
    }

    #[test]
    fn the_roomiest_subnet_of_a_zone_is_chosen_and_ties_choose_alike() {
        let subnets = [
            subnet("subnet-2", "a", false, 50),
            subnet("subnet-1", "a", false, 50),
            subnet("subnet-3", "a", false, 10),
        ];
        assert_eq!(subnets_by_zone(&subnets, false)["a"], "subnet-1");
        let mut reversed = subnets.to_vec();
        reversed.reverse();
        assert_eq!(subnets_by_zone(&reversed, false)["a"], "subnet-1");
    }

    #[test]
    fn the_stacks_instance_profile_is_the_default() {
        assert_eq!(default_instance_profile("prod-eu"), "prod-eu-questdb-node");
    }
}

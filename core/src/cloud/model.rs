//! Plain data exchanged with the providers: what to launch, what exists, what DNS says.

use std::collections::BTreeMap;
use std::time::SystemTime;

/// One dedicated node to launch: generation `node_generation` of the QuestDB `uid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchRequest {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Bumped by the controller whenever a *new* node is wanted (failover, image upgrade,
    /// unpause): the same generation always means the same instance.
    pub node_generation: i64,
    /// AMI id (`spec.node.image`).
    pub image: String,
    pub instance_type: String,
    pub zone: String,
    /// Labels the kubelet registers the Node with.
    pub labels: BTreeMap<String, String>,
    /// Taints the kubelet registers the Node with, so nothing lands on it before the operator
    /// has seen it.
    pub taints: Vec<Taint>,
    /// Give the node a public IPv4 address (`spec.dns.public`: the record names it). Decided at
    /// launch: EC2 does not add one to a running instance's primary interface.
    pub public_ip: bool,
    /// Tried in order when EC2 has no capacity for `instance_type` in the zone.
    pub fallback_instance_types: Vec<String>,
    /// The cluster's identity (see [`super::TAG_CLUSTER_ID`]), when the operator knows it.
    pub cluster_id: Option<String>,
}

/// What EC2 says about an AMI (`DescribeImages`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFacts {
    pub id: String,
    /// `available`, `pending`, `failed`, `deregistered`, ...
    pub state: String,
    /// `x86_64`, `arm64`, ...
    pub architecture: String,
    /// `ebs` or `instance-store`.
    pub root_device_type: String,
    /// Where the image's root volume is mapped (`RootDeviceName`: `/dev/xvda` on AL2023 and
    /// Bottlerocket, `/dev/sda1` on many others).
    pub root_device_name: Option<String>,
    /// The EBS devices the image maps (its `BlockDeviceMappings` with a snapshot), root
    /// included: Bottlerocket maps a data volume at `/dev/xvdb` beside its OS volume.
    pub ebs_devices: Vec<ImageDevice>,
    /// The AWS account that owns the image (`OwnerId`).
    pub owner: String,
    /// DescribeImages' `ImageOwnerAlias` (`amazon`, `aws-marketplace`), when the image has one:
    /// what IAM's `ec2:Owner` condition compares for Amazon-owned images.
    pub owner_alias: Option<String>,
}

/// One EBS device of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageDevice {
    pub device_name: String,
    /// The snapshot's size: the smallest volume EC2 accepts for the device.
    pub size_gib: Option<i32>,
}

/// What EC2 says about an instance type in one zone (`DescribeInstanceTypes`,
/// `DescribeInstanceTypeOfferings`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceTypeFacts {
    pub name: String,
    pub architectures: Vec<String>,
    pub offered_in_zone: bool,
}

/// The facts a node move checks before it launches anything; `None` where EC2 does not know
/// the image or the type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub image: Option<ImageFacts>,
    pub instance_type: Option<InstanceTypeFacts>,
}

/// A Node taint as the kubelet's `--register-with-taints` expects it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl Taint {
    pub fn new(key: impl Into<String>, value: Option<&str>, effect: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.map(str::to_string),
            effect: effect.into(),
        }
    }
}

/// EC2 instance lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
}

impl InstanceState {
    /// EC2's own spelling (`shutting-down`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Running => "running",
            InstanceState::ShuttingDown => "shutting-down",
            InstanceState::Terminated => "terminated",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
        }
    }

    pub fn parse(state: &str) -> Option<Self> {
        Some(match state {
            "pending" => InstanceState::Pending,
            "running" => InstanceState::Running,
            "shutting-down" => InstanceState::ShuttingDown,
            "terminated" => InstanceState::Terminated,
            "stopping" => InstanceState::Stopping,
            "stopped" => InstanceState::Stopped,
            _ => return None,
        })
    }

    /// The instance is gone or going; it can never serve a database again.
    pub fn is_gone(&self) -> bool {
        matches!(
            self,
            InstanceState::ShuttingDown | InstanceState::Terminated
        )
    }
}

/// What EC2 reports about one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    pub state: InstanceState,
    pub zone: String,
    pub image: String,
    pub instance_type: String,
    pub private_ip: Option<String>,
    pub public_ip: Option<String>,
    pub tags: BTreeMap<String, String>,
    pub launched_at: Option<SystemTime>,
    /// EC2's `StateReason` message once the instance stopped or ended (e.g.
    /// `Client.VolumeLimitExceeded: Volume limit exceeded`): why it went away.
    pub state_reason: Option<String>,
    /// EC2's private DNS name (`PrivateDnsName`): the name the node's kubelet registers under
    /// on EKS, so a Node that claims this instance by providerID must also bear it.
    pub private_dns_name: Option<String>,
    /// The secondary private IPv4 addresses and delegated /28 prefixes of its network
    /// interfaces (`NetworkInterfaces[].PrivateIpAddresses[]` not `Primary`, and
    /// `Ipv4Prefixes[]`): where the VPC CNI's ipamd draws pod addresses from, so a pod address
    /// EC2 does not show here is not one of this instance's pods.
    pub pod_addresses: PodAddresses,
}

/// The addresses EC2 has assigned an instance for its pods (see [`Instance::pod_addresses`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodAddresses {
    pub secondary_ips: Vec<String>,
    /// CIDR blocks, e.g. `10.0.3.16/28`.
    pub prefixes: Vec<String>,
}

impl PodAddresses {
    /// `ip` is one of the secondary addresses or inside one of the prefixes.
    pub fn contains(&self, ip: &str) -> bool {
        let Ok(addr) = ip.parse::<std::net::Ipv4Addr>() else {
            return false;
        };
        self.secondary_ips.iter().any(|s| s.parse() == Ok(addr))
            || self.prefixes.iter().any(|p| in_prefix(addr, p))
    }
}

fn in_prefix(addr: std::net::Ipv4Addr, cidr: &str) -> bool {
    let Some((net, len)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(len)) = (net.parse::<std::net::Ipv4Addr>(), len.parse::<u32>()) else {
        return false;
    };
    if len > 32 {
        return false;
    }
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(addr) & mask == u32::from(net) & mask
}

impl Instance {
    /// The `providerID` its Node will carry.
    pub fn provider_id(&self) -> String {
        super::provider_id(&self.zone, &self.id)
    }
}

/// One scheduled event of an instance, as `DescribeInstanceStatus` reports it
/// (`InstanceStatusEvent`, EC2 API reference): AWS will stop, retire or reboot the instance,
/// or reboot or cut off its host, at a time of its choosing after `not_before`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledEvent {
    pub instance_id: String,
    /// `instanceEventId`.
    pub id: Option<String>,
    /// `instance-stop`, `instance-retirement`, `instance-reboot`, `system-reboot`,
    /// `system-maintenance`.
    pub code: String,
    /// Starts with `[Completed]` once it took place (it is still described for up to a week)
    /// and `[Canceled]` once AWS called it off.
    pub description: String,
    /// The earliest time the event may start.
    pub not_before: Option<SystemTime>,
    /// The latest time it may end.
    pub not_after: Option<SystemTime>,
}

/// Every event code EC2 schedules (`InstanceStatusEvent.code`). Each costs the database its
/// node for a while: a stop or retirement stops the instance, a reboot restarts it, and power
/// maintenance reboots it ("unavailable for a brief period of time and then rebooted"); none
/// lets QuestDB close its tables the way a planned move does, and a reboot loses what the
/// kernel had not written back.
pub const SCHEDULED_EVENT_CODES: [&str; 5] = [
    "instance-stop",
    "instance-retirement",
    "instance-reboot",
    "system-reboot",
    "system-maintenance",
];

impl ScheduledEvent {
    /// Still to come: not `[Completed]` nor `[Canceled]`.
    pub fn pending(&self) -> bool {
        let d = self.description.trim_start();
        !(d.starts_with("[Completed]") || d.starts_with("[Canceled]"))
    }
}

/// One A record as DNS holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ARecord {
    /// Fully qualified, without the trailing dot.
    pub name: String,
    pub ips: Vec<String>,
    pub ttl: i64,
}

/// Fully qualified name as Route53 stores it: lower case, with a trailing dot.
pub fn fqdn(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    if lower.ends_with('.') {
        lower
    } else {
        format!("{lower}.")
    }
}

/// Name as the operator writes it in status: lower case, no trailing dot.
pub fn display_name(name: &str) -> String {
    fqdn(name).trim_end_matches('.').to_string()
}

/// How an instance is stopped (`StopInstances` and its `Force`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    strum::Display,
)]
pub enum StopMode {
    /// The OS shuts down: containers get their termination signal and its grace period, and
    /// the kernel writes its file system caches to the volumes. What a database acknowledged
    /// is kept even when it never synced (QuestDB's default `nosync`).
    Graceful,
    /// `Force`: "the instances do not have an opportunity to flush file system caches or file
    /// system metadata" (EC2 API reference, StopInstances, in the wording of most SDKs; the
    /// newest says a forced stop first tries a graceful shutdown within a timeout). Taken as
    /// a power cut: what the database wrote and did not sync is lost.
    Forced,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_ec2_spelling() {
        for s in [
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::ShuttingDown,
            InstanceState::Terminated,
            InstanceState::Stopping,
            InstanceState::Stopped,
        ] {
            assert_eq!(InstanceState::parse(s.as_str()), Some(s));
        }
        assert_eq!(InstanceState::parse("exploded"), None);
        assert!(InstanceState::ShuttingDown.is_gone());
        assert!(!InstanceState::Stopped.is_gone());
    }

    #[test]
    fn a_completed_or_canceled_event_is_not_pending() {
        let event = |description: &str| ScheduledEvent {
            instance_id: "i-1".into(),
            id: Some("instance-event-1".into()),
            code: "instance-retirement".into(),
            description: description.into(),
            not_before: None,
            not_after: None,
        };
        assert!(event("The instance is running on degraded hardware").pending());
        assert!(!event("[Completed] The instance is running on degraded hardware").pending());
        assert!(!event("[Canceled] Scheduled reboot").pending());
    }

    #[test]
    fn dns_names_compare_case_and_dot_insensitively() {
        assert_eq!(fqdn("DB1.Example.com"), "db1.example.com.");
        assert_eq!(fqdn("db1.example.com."), "db1.example.com.");
        assert_eq!(display_name("db1.example.com."), "db1.example.com");
    }
}

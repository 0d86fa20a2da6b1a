//! The raw cloud APIs, one call per method and no policy: each backend (`aws`, `memory`)
//! implements these; the providers in [`super::nodes`] and [`super::dns`] add idempotency,
//! retries, rate limiting and observation on top, so both backends share that logic.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::{ApiError, Instance};

/// Arguments of one `RunInstances` (always exactly one instance).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    pub image: String,
    pub instance_type: String,
    pub zone: String,
    pub subnet_id: String,
    pub security_group_ids: Vec<String>,
    pub instance_profile: Option<String>,
    /// Base64, as EC2 wants it.
    pub user_data_base64: String,
    pub tags: BTreeMap<String, String>,
    pub client_token: String,
    /// The node's own volumes, root first ([`super::block_devices`]), each encrypted gp3.
    pub block_devices: Vec<super::BlockDevice>,
    pub kms_key_id: Option<String>,
    /// A public IPv4 address on the primary interface.
    pub public_ip: bool,
    /// Ask EC2 whether it would launch, launching nothing: the answer is always an error,
    /// `DryRunOperation` (`DRY_RUN_PASSED`) when the caller may make this launch (the
    /// preflight's launch check).
    pub dry_run: bool,
}

/// The error code of a dry run EC2 would have carried out ("Request would have succeeded, but
/// DryRun flag is set": EC2 API reference, common parameters, `DryRun`).
pub(crate) const DRY_RUN_PASSED: &str = "DryRunOperation";

/// How a dry-run RunInstances is named in the AWS call metrics and counts: apart from the
/// launches.
pub(crate) const DRY_RUN_OPERATION: &str = "RunInstances(DryRun)";

/// What `DescribeSubnets` says of one subnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subnet {
    pub id: String,
    pub zone: String,
    pub vpc_id: String,
}

/// Which instances a `DescribeInstances` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstanceQuery {
    /// Instances carrying all these tags (`tag:<k>=<v>` filters, ANDed).
    Tags(BTreeMap<String, String>),
    /// Exactly these ids (`InstanceIds`): EC2 fails the whole call with
    /// `InvalidInstanceID.NotFound` if it does not know one of them (yet).
    Ids(Vec<String>),
    /// These ids as an `instance-id` filter: unknown ids are silently absent.
    IdFilter(Vec<String>),
}

/// One page of results and the token for the next one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_token: Option<String>,
}

#[async_trait]
pub trait Ec2Api: Send + Sync {
    async fn run_instance(&self, spec: &RunSpec) -> Result<Instance, ApiError>;
    async fn describe_instances(
        &self,
        query: &InstanceQuery,
        next_token: Option<&str>,
    ) -> Result<Page<Instance>, ApiError>;
    async fn terminate_instances(&self, ids: &[String]) -> Result<(), ApiError>;
    /// `StopInstances`, normal (`force` false: the OS shuts down and flushes its caches) or
    /// with `Force` (a hung instance must still be stopped: it is a fence).
    async fn stop_instances(&self, ids: &[String], force: bool) -> Result<(), ApiError>;
    /// `DescribeInstanceStatus` filtered by `event.code` (every code EC2 schedules): the
    /// scheduled events of running instances, completed and canceled ones included, one page.
    async fn describe_instance_events(
        &self,
        next_token: Option<&str>,
    ) -> Result<Page<super::ScheduledEvent>, ApiError>;
    /// `DescribeSubnets` with a `subnet-id` filter: each subnet's availability zone and VPC;
    /// an unknown id is absent, not an error.
    async fn describe_subnets(&self, ids: &[String]) -> Result<Vec<Subnet>, ApiError>;
    /// `DescribeSecurityGroups` with a `group-id` filter: each group's VPC; an unknown id is
    /// absent, not an error.
    async fn security_group_vpcs(&self, ids: &[String]) -> Result<Vec<(String, String)>, ApiError>;
    /// `DescribeImages` with an `image-id` filter: an unknown id is absent, not an error.
    async fn describe_image(&self, id: &str) -> Result<Option<super::ImageFacts>, ApiError>;
    /// `DescribeInstanceTypes` (supported architectures) and `DescribeInstanceTypeOfferings`
    /// in `zone`; `None` for a type EC2 does not know.
    async fn describe_instance_type(
        &self,
        name: &str,
        zone: &str,
    ) -> Result<Option<super::InstanceTypeFacts>, ApiError>;
}

/// A Route53 change action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeAction {
    Create,
    Upsert,
    Delete,
}

/// One record set as Route53 holds it (`name` fully qualified with the trailing dot, `kind`
/// the record type as Route53 spells it, TXT values with their quotes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordSet {
    pub name: String,
    pub kind: String,
    pub values: Vec<String>,
    pub ttl: i64,
}

#[async_trait]
pub trait Route53Api: Send + Sync {
    /// Every record set named `fqdn` (trailing dot) in the zone, whatever its type
    /// (`ListResourceRecordSets` from that name).
    async fn find(&self, zone_id: &str, fqdn: &str) -> Result<Vec<RecordSet>, ApiError>;
    /// One `ChangeResourceRecordSets` batch, applied all or nothing. A DELETE must carry the
    /// current values and TTL exactly, a CREATE fails when the set exists (Route53 API
    /// reference, ChangeResourceRecordSets).
    async fn change(
        &self,
        zone_id: &str,
        changes: &[(ChangeAction, RecordSet)],
    ) -> Result<(), ApiError>;
}

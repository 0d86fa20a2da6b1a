//! The cloud seam: a node provider (dedicated EC2 instances) and a DNS provider (Route53 A
//! records) behind small object-safe traits, with two backends:
//!
//! - [`aws`]: the AWS SDK (standard credential chain, optional endpoint override for moto);
//! - `memory` (the `memory-cloud` feature): an in-process fake for the sandbox and fast tests that models the failure
//!   modes moto cannot (ClientToken idempotency, throttling, capacity, eventual consistency).
//!
//! Both backends share the policy layer ([`Ec2NodeProvider`], [`Route53DnsProvider`]):
//! idempotent launch, retries with jittered backoff, a shared rate limit, and a report of every
//! API attempt to an [`AwsCallObserver`].

mod allow_list;
mod backend;
mod config;
pub mod discovery;
mod dns;
mod node_volumes;
mod nodes;
mod observer;
mod rate_limit;
mod retry;
pub mod user_data;

#[cfg(feature = "aws")]
pub mod aws;
#[cfg(any(test, feature = "memory-cloud"))]
pub mod memory;

use async_trait::async_trait;

pub use questdb_core::cloud::*;

pub use allow_list::{ImageVerdict, LaunchAllowList};
pub use backend::{
    ChangeAction, Ec2Api, InstanceQuery, Page, RecordSet, Route53Api, RunSpec, Subnet,
};
pub use config::{pick_subnet, CloudConfig, EksCluster, RateLimit, RetryPolicy};
pub(crate) use dns::{Route53DnsProvider, OWNED_ELSEWHERE};
pub(crate) use node_volumes::{block_devices, BlockDevice, NodeVolumes};
pub(crate) use nodes::{Ec2NodeProvider, INSTANCE_NOT_OWNED};
pub use observer::{
    noop_observer, AwsCallObserver, CallCounter, CallKey, NoopObserver, SharedObserver,
};

/// Dedicated nodes. Object safe: the controllers hold an `Arc<dyn NodeProvider>`.
#[async_trait]
pub trait NodeProvider: Send + Sync {
    /// Launch (or find) the instance of `req.uid` + `req.node_generation`. Idempotent: looks
    /// the instance up by its tags first and launches with a ClientToken derived from uid +
    /// generation, so repeating the call after a crash never creates a second instance. If
    /// that generation's instance is already terminated it is returned as is: bump the
    /// generation to get a new one.
    async fn launch(&self, req: &LaunchRequest) -> Result<Instance, CloudError>;

    /// Every instance tagged for this cluster, any state, in one paged `DescribeInstances`.
    /// Meant to be called once per sync and shared across QuestDBs.
    async fn describe_cluster(&self) -> Result<Vec<Instance>, CloudError>;

    /// These instances, any state; ids EC2 does not know are left out. An id this provider
    /// launched moments ago is waited for (bounded by the eventual-consistency window), since
    /// EC2's reads lag its launches.
    async fn describe(&self, ids: &[String]) -> Result<Vec<Instance>, CloudError>;

    /// One instance asked for by id (`InstanceIds`, never a filter), for decisions that a
    /// wrong "gone" would make unsafe (a fence, an ownership check): a filtered answer can
    /// leave out an instance that exists (EC2's reads are eventually consistent), and only
    /// `InvalidInstanceID.NotFound` proves it gone. `Ok(None)`: gone. An id this provider
    /// launched moments ago is waited for; still unknown after that is `Transient`.
    async fn look_up(&self, id: &str) -> Result<Option<Instance>, CloudError>;

    /// Terminate the instance of the QuestDB whose uid is `owner`; an instance that is already
    /// terminated or unknown is `Ok` (except one this provider launched moments ago, which is
    /// waited for, so it cannot leak). The instance is read first: one that does not carry
    /// this cluster's tag and `owner` as its uid tag is refused
    /// (`Permanent { code: InstanceNotOwned }`), so an id from a forged status record never
    /// reaches another team's instance.
    async fn terminate(&self, id: &str, owner: &str) -> Result<(), CloudError>;

    /// Stop: the fence of a failover (an instance that may still write must be down before
    /// its volume moves), normal first, forced once a normal stop has not ended in time. A
    /// stopped, terminating or unknown instance is `Ok`; one that is not `owner`'s is
    /// refused, as for [`NodeProvider::terminate`].
    async fn stop(&self, id: &str, owner: &str, mode: StopMode) -> Result<(), CloudError>;

    /// Start-up check of `--aws-subnets`, `--aws-public-subnets` and
    /// `--aws-security-group-ids`: every subnet exists and lies in the zone it is mapped to (a
    /// node launched with `Placement` in one zone and a subnet of another fails), every
    /// security group exists and lies in the subnets' VPC (EC2 refuses a launch that mixes
    /// networks).
    async fn check_network(&self) -> Result<(), CloudError>;

    /// What EC2 knows of `instance_type` in `zone`; `None` for a type EC2 does not know (the
    /// preflight checks the allow-list's types).
    async fn instance_type_facts(
        &self,
        instance_type: &str,
        zone: &str,
    ) -> Result<Option<InstanceTypeFacts>, CloudError>;

    /// Whether EC2 would carry out `req`'s launch, launching nothing: the same RunInstances a
    /// launch makes (subnet, groups, instance profile, tags, IMDSv2, volumes) with `DryRun`.
    /// EC2 checks the caller's permissions, `iam:PassRole` of the profile included, and answers
    /// UnauthorizedOperation when the policy denies it. `Ok` too when the launch allow-list
    /// refuses `req` (the QuestDB's own condition says so, and nothing is asked).
    async fn check_launch(&self, req: &LaunchRequest) -> Result<(), CloudError>;

    /// The zones `--aws-subnets` maps to a subnet.
    fn zones(&self) -> Vec<String>;

    /// The exact types and family patterns of `--allowed-node-instance-types`.
    fn allowed_instance_types(&self) -> Vec<String>;

    /// The pending scheduled events of running instances (`DescribeInstanceStatus` filtered
    /// by `event.code`, every page): one call for the whole region, whatever the number of
    /// databases; the caller keeps the events of its own instances.
    async fn scheduled_events(&self) -> Result<Vec<ScheduledEvent>, CloudError>;

    /// What EC2 knows of `image` and of `instance_type` in `zone` (a node move checks them
    /// before it launches anything).
    async fn node_facts(
        &self,
        image: &str,
        instance_type: &str,
        zone: &str,
    ) -> Result<NodeFacts, CloudError>;
}

/// DNS A records in the operator's hosted zone. Names are fully qualified, with or without
/// the trailing dot, case-insensitive. A hosted zone is shared (other tenants, other tools,
/// people): every record the operator writes carries an ownership TXT record beside it, and a
/// name whose records are not provably this QuestDB's is never written or deleted.
#[async_trait]
pub trait DnsProvider: Send + Sync {
    /// Point `name` at `ip` only; writes nothing when the record already says exactly that.
    /// A record owned by anyone else is `Permanent { code: RecordOwnedElsewhere }`.
    async fn upsert_a(
        &self,
        name: &str,
        ip: &str,
        ttl: i64,
        owner: &DnsOwner,
    ) -> Result<(), CloudError>;
    async fn read_a(&self, name: &str) -> Result<Option<ARecord>, CloudError>;
    /// Delete the record and its ownership TXT; an absent record is `Ok`, and so is one that
    /// is not ours (left alone: it is someone else's now).
    async fn delete_a(&self, name: &str, owner: &DnsOwner) -> Result<(), CloudError>;
    /// Delete the A record and keep the ownership TXT: while its QuestDB is paused the name
    /// points nowhere but stays reserved, so no other QuestDB (another namespace's, say) can
    /// claim it and receive the clients, and their credentials, meant for this one.
    async fn withdraw_a(&self, name: &str, owner: &DnsOwner) -> Result<(), CloudError>;
    /// The hosted zone's id.
    fn zone_id(&self) -> String;
}

/// Who may write a DNS name: one QuestDB (of the provider's cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsOwner {
    /// The QuestDB's uid (a re-created QuestDB of the same name is another owner).
    pub uid: String,
    /// The IP status records this QuestDB published at this name, if any: an A record with
    /// exactly that value and no TXT was written by an operator version before ownership
    /// records, and is adopted.
    pub published_ip: Option<String>,
}

impl DnsOwner {
    /// The ownership TXT value (unquoted) in the hosted zone of `cluster`'s operator.
    pub(crate) fn txt(&self, cluster: &str) -> String {
        format!(
            "heritage=questdb-operator,cluster={cluster},uid={}",
            self.uid
        )
    }
}

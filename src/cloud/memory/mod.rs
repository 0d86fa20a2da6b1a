//! The in-memory backend: a fake EC2 and Route53 for the sandbox and for fast tests.
//!
//! ```no_run
//! # fn demo() -> Result<(), questdb_operator::cloud::CloudError> {
//! use std::sync::Arc;
//! use questdb_operator::cloud::memory::{MemoryCloud, MemoryEc2Options};
//! use questdb_operator::cloud::{noop_observer, CloudConfig, DnsProvider, NodeProvider};
//!
//! let mut config = CloudConfig::new("sandbox", "us-east-1");
//! config.subnets_by_zone.insert("us-east-1a".into(), "subnet-sandbox-a".into());
//! config.hosted_zone_id = Some("ZSANDBOX".into());
//! let cloud = MemoryCloud::new(config, MemoryEc2Options::default(), noop_observer())?;
//! // Register a Node in the simulated control plane for each InstanceEvent::Running.
//! let _events = cloud.ec2.subscribe();
//! let _nodes: Arc<dyn NodeProvider> = cloud.nodes.clone();
//! let _dns: Arc<dyn DnsProvider> = cloud.dns.clone();
//! # Ok(()) }
//! ```

mod ec2;
mod route53;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use ec2::{InstanceEvent, MemoryEc2, MemoryEc2Options, IMAGE_OWNER};
pub use route53::MemoryRoute53;

use super::{CloudConfig, CloudError, Ec2NodeProvider, Route53DnsProvider, SharedObserver};

/// Both fakes and the providers on top of them, sharing one configuration and observer.
pub struct MemoryCloud {
    pub ec2: Arc<MemoryEc2>,
    pub route53: Arc<MemoryRoute53>,
    pub nodes: Arc<Ec2NodeProvider<MemoryEc2>>,
    pub dns: Arc<Route53DnsProvider<MemoryRoute53>>,
}

impl MemoryCloud {
    /// Fails only if `config` names no hosted zone (the DNS provider needs one).
    pub fn new(
        config: CloudConfig,
        options: MemoryEc2Options,
        observer: SharedObserver,
    ) -> Result<Self, CloudError> {
        let ec2 = MemoryEc2::new(options);
        let route53 = Arc::new(MemoryRoute53::new());
        let dns = Arc::new(Route53DnsProvider::new(
            route53.clone(),
            &config,
            observer.clone(),
        )?);
        let nodes = Arc::new(Ec2NodeProvider::new(ec2.clone(), config, observer));
        Ok(Self {
            ec2,
            route53,
            nodes,
            dns,
        })
    }
}

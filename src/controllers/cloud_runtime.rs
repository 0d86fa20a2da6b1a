//! The cloud side of the manager: the providers it was configured with and the instance cache
//! every QuestDB reconcile shares.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::cloud::{CloudError, DnsProvider, Instance, NodeProvider};

/// Cloud providers and timings handed to the manager (`ManagerOptions::cloud`).
#[derive(Clone)]
pub struct Cloud {
    pub nodes: Arc<dyn NodeProvider>,
    /// `None` when no hosted zone is configured: `spec.dns` then reports `DnsReady=False`.
    pub dns: Option<Arc<dyn DnsProvider>>,
    pub settings: CloudSettings,
}

impl fmt::Debug for Cloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cloud")
            .field("dns", &self.dns.is_some())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CloudSettings {
    /// How old the shared DescribeInstances answer may be before a reconcile refreshes it: the
    /// steady-state cost is one DescribeInstances per this interval for the whole operator.
    pub instance_sync_interval: Duration,
    pub orphan_sweep_interval: Duration,
    /// `--scheduled-event-interval`: how often EC2's scheduled events (retirements, stops,
    /// reboots) of the dedicated instances are read (one DescribeInstanceStatus per look for
    /// the whole operator). AWS announces retirements days or weeks ahead.
    pub scheduled_event_interval: Duration,
    /// How long an instance without a QuestDB is left alone before it is terminated (covers a
    /// QuestDB cache that lags a brand-new object, and a human restoring a deleted QuestDB).
    pub orphan_grace_period: Duration,
    /// `--node-join-timeout`: how long a running instance may go without its Node registering
    /// before it counts as never joined.
    pub node_join_timeout: Duration,
    /// How long a node-image move waits for the new node to join and become Ready before it
    /// aborts (the database is never stopped before that).
    pub node_move_join_timeout: Duration,
    /// How long each node-move step after the database stopped may take before the database
    /// goes back to its old node.
    pub node_move_step_timeout: Duration,
    /// Node moves under way at once, across all QuestDBs (`--node-move-concurrency`).
    pub node_move_concurrency: usize,
    /// Node moves under way at once in one namespace (`--node-move-concurrency-per-namespace`):
    /// one tenant's stuck moves never hold every slot.
    pub node_move_concurrency_per_namespace: usize,
    /// `--max-dedicated-nodes-per-namespace`: databases of one namespace on nodes of their own
    /// (a first launch waits at the cap); `None`: no cap.
    pub max_dedicated_nodes_per_namespace: Option<usize>,
    /// `--csi-driver`: a node is dedicated (and so takes its database) only once this driver
    /// is registered on it.
    pub csi_driver: Option<String>,
    /// The kubelets' `nodeLeaseDurationSeconds` (`--node-lease-duration`): no node counts as
    /// unhealthy before its Lease has been silent this long, whatever a QuestDB asks.
    pub node_lease_duration: Duration,
    /// `--dns-namespace-suffix`: a QuestDB's DNS name must lie under `<namespace>.<suffix>`,
    /// so one namespace can never name (and take clients meant for) another's databases.
    pub dns_namespace_suffix: Option<String>,
    /// `--dns-names-first-come`: without a suffix, any name in the zone (the default is
    /// `<name>.<namespace>.<zone>`).
    pub dns_names_first_come: bool,
    /// `--fence-stop-escalation`, `--fence-detach-escalation`: when a hanging stop is forced
    /// again and a volume stuck on a fenced node has its instance terminated.
    pub escalation: crate::plan::failover::Escalation,
}

impl Default for CloudSettings {
    fn default() -> Self {
        Self {
            instance_sync_interval: Duration::from_secs(30),
            orphan_sweep_interval: Duration::from_secs(300),
            scheduled_event_interval: Duration::from_secs(300),
            orphan_grace_period: Duration::from_secs(600),
            node_move_join_timeout: Duration::from_secs(600),
            // Karpenter's registration TTL: long enough for a slow image pull and nodeadm.
            node_join_timeout: Duration::from_secs(900),
            csi_driver: Some("ebs.csi.aws.com".into()),
            node_move_step_timeout: Duration::from_secs(600),
            node_move_concurrency: 2,
            node_move_concurrency_per_namespace: 2,
            max_dedicated_nodes_per_namespace: None,
            dns_namespace_suffix: None,
            dns_names_first_come: false,
            escalation: crate::plan::failover::Escalation::DEFAULT,
            node_lease_duration:
                crate::controllers::node_health::tracker::DEFAULT_NODE_LEASE_DURATION,
        }
    }
}

/// What the controllers hold: the configuration plus the shared instance cache.
pub(crate) struct CloudRuntime {
    /// The uid of this cluster's `kube-system` namespace, tagged on every instance beside the
    /// cluster name: two clusters can share a name (a small test cluster reusing a big one's),
    /// never this uid. `None` when the operator may not read it: the sweep is then off.
    pub cluster_id: Option<String>,
    pub nodes: Arc<dyn NodeProvider>,
    pub dns: Option<Arc<dyn DnsProvider>>,
    pub settings: CloudSettings,
    pub instances: InstanceCache,
    /// Permanent launch failures by QuestDB uid (in memory: a restart retries once).
    pub launch_failures: LaunchFailures,
    /// When each dedicated node was last seen alive (this leadership term's clock).
    pub health: crate::controllers::node_health::tracker::NodeHealth,
    /// When instances that went away by themselves were replaced, by QuestDB uid (in memory:
    /// a restart allows one more at once, as with `launch_failures`).
    pub relaunches: Mutex<std::collections::HashMap<String, Vec<Instant>>>,
    /// Node moves this process started, by QuestDB uid, until their record reaches the cache
    /// (the concurrency limit counts both).
    pub move_claims: Mutex<std::collections::HashMap<String, Instant>>,
    /// Node moves that ended moments ago, by QuestDB uid: the cache may still show them under
    /// way, and the moves their end wakes must not wait behind them.
    pub move_ends: Mutex<std::collections::HashMap<String, Instant>>,
    /// The pending scheduled event of each dedicated instance that has one (the earliest), as
    /// the last look found them ([`crate::controllers::scheduled_events`]).
    pub scheduled_events: Mutex<HashMap<String, crate::cloud::ScheduledEvent>>,
    /// The dedicated Nodes seen cordoned, so a cordon wakes its database once.
    cordons_seen: Mutex<std::collections::HashSet<String>>,
}

/// The cluster's identity: the uid of `kube-system` (created with the cluster, never deleted).
pub(crate) async fn cluster_id(client: &kube::Client) -> Option<String> {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    match namespaces.get_opt("kube-system").await {
        Ok(Some(ns)) => ns.metadata.uid,
        Ok(None) => None,
        Err(e) => {
            tracing::info!(error = %e, "cannot read the kube-system namespace's uid: instances are tagged without a cluster id and the orphan sweep is off");
            None
        }
    }
}

impl CloudRuntime {
    pub(crate) fn new(cloud: Cloud, cluster_id: Option<String>) -> Self {
        let lease_duration = cloud.settings.node_lease_duration;
        Self {
            cluster_id,
            instances: InstanceCache::new(cloud.settings.instance_sync_interval),
            nodes: cloud.nodes,
            dns: cloud.dns,
            settings: cloud.settings,
            launch_failures: LaunchFailures::default(),
            health: crate::controllers::node_health::tracker::NodeHealth::new(lease_duration),
            relaunches: Default::default(),
            move_claims: Default::default(),
            move_ends: Default::default(),
            scheduled_events: Default::default(),
            cordons_seen: Default::default(),
        }
    }

    /// Whether Node `name` has just been cordoned (true once per cordon).
    pub(crate) fn cordon_news(&self, name: &str, cordoned: bool) -> bool {
        let mut seen = self.cordons_seen.lock().unwrap_or_else(|p| p.into_inner());
        if cordoned {
            seen.insert(name.to_string())
        } else {
            seen.remove(name);
            false
        }
    }

    /// The pending scheduled event of `instance_id`, if the last look found one.
    pub(crate) fn scheduled_event(
        &self,
        instance_id: &str,
    ) -> Option<crate::cloud::ScheduledEvent> {
        self.scheduled_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(instance_id)
            .cloned()
    }
}

struct Snapshot {
    fetched_at: Instant,
    instances: Arc<Vec<Instance>>,
}

/// One `describe_cluster()` answer shared by every reconcile until it is older than `max_age`
/// or invalidated (after a launch or terminate, or by a reconcile waiting for a state change).
/// Concurrent readers of a stale cache wait for a single refresh instead of each calling AWS.
pub(crate) struct InstanceCache {
    max_age: Duration,
    snapshot: Mutex<Option<Snapshot>>,
    refresh: tokio::sync::Mutex<()>,
}

impl InstanceCache {
    pub(crate) fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            snapshot: Mutex::new(None),
            refresh: tokio::sync::Mutex::new(()),
        }
    }

    fn fresh(&self, max_age: Duration, newer_than: Option<Instant>) -> Option<Arc<Vec<Instance>>> {
        let guard = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        let snap = guard.as_ref()?;
        let young = snap.fetched_at.elapsed() < max_age.min(self.max_age);
        let after = newer_than.is_none_or(|t| snap.fetched_at > t);
        (young && after).then(|| snap.instances.clone())
    }

    /// Every instance tagged for this cluster, at most the cache's `max_age` old.
    pub(crate) async fn get(
        &self,
        nodes: &dyn NodeProvider,
    ) -> Result<Arc<Vec<Instance>>, CloudError> {
        self.get_within(nodes, self.max_age).await
    }

    /// Like [`InstanceCache::get`] with a tighter bound, for a reconcile waiting on a state
    /// change: however many QuestDBs wait, the operator asks at most once per `max_age`.
    pub(crate) async fn get_within(
        &self,
        nodes: &dyn NodeProvider,
        max_age: Duration,
    ) -> Result<Arc<Vec<Instance>>, CloudError> {
        if let Some(hit) = self.fresh(max_age, None) {
            return Ok(hit);
        }
        let asked_at = Instant::now();
        let _single_flight = self.refresh.lock().await;
        // Someone else may have refreshed while we waited for the lock.
        if let Some(hit) = self.fresh(max_age, Some(asked_at)) {
            return Ok(hit);
        }
        let instances = Arc::new(nodes.describe_cluster().await?);
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Snapshot {
            fetched_at: Instant::now(),
            instances: instances.clone(),
        });
        Ok(instances)
    }

    /// The next `get` asks AWS again.
    pub(crate) fn invalidate(&self) {
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::memory::{MemoryCloud, MemoryEc2Options};
    use crate::cloud::{noop_observer, CloudConfig};

    fn cloud() -> MemoryCloud {
        let mut config = CloudConfig::new("c1", "r1");
        config.hosted_zone_id = Some("Z1".into());
        MemoryCloud::new(config, MemoryEc2Options::default(), noop_observer()).expect("cloud")
    }

    #[tokio::test]
    async fn concurrent_readers_share_one_describe_until_invalidated() {
        let cloud = cloud();
        let cache = InstanceCache::new(Duration::from_secs(60));
        let nodes: &dyn NodeProvider = cloud.nodes.as_ref();
        let (a, b, c) = tokio::join!(cache.get(nodes), cache.get(nodes), cache.get(nodes));
        assert!(a.is_ok() && b.is_ok() && c.is_ok());
        assert_eq!(cloud.ec2.call_count("DescribeInstances"), 1);
        cache.invalidate();
        cache.get(nodes).await.expect("describe");
        assert_eq!(cloud.ec2.call_count("DescribeInstances"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_answer_is_refreshed() {
        let cloud = cloud();
        let cache = InstanceCache::new(Duration::from_secs(30));
        let nodes: &dyn NodeProvider = cloud.nodes.as_ref();
        cache.get(nodes).await.expect("describe");
        tokio::time::advance(Duration::from_secs(10)).await;
        cache.get(nodes).await.expect("describe");
        assert_eq!(cloud.ec2.call_count("DescribeInstances"), 1);
        tokio::time::advance(Duration::from_secs(31)).await;
        cache.get(nodes).await.expect("describe");
        assert_eq!(cloud.ec2.call_count("DescribeInstances"), 2);
    }
}

/// A permanent launch failure, remembered so the launch is not repeated on every reconcile.
#[derive(Clone, Debug)]
pub(crate) struct LaunchFailure {
    /// `metadata.generation` of the QuestDB when it failed: a spec edit retries at once.
    pub spec_generation: Option<i64>,
    pub node_generation: i64,
    pub at: tokio::time::Instant,
    pub message: String,
    /// How long it stands before the launch is tried again ([`crate::plan::node::launch_retry`]).
    pub retry_after: std::time::Duration,
}

pub(crate) type LaunchFailures = std::sync::Mutex<HashMap<String, LaunchFailure>>;

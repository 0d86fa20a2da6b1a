//! The cloud half of the test harness: the control plane, the memory cloud joined to it (each
//! running instance boots from its user data and registers its Node), and a manager that can
//! be stopped, restarted or killed outright. Used by the cloud, failover, node move, data
//! safety and chaos tests.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use questdb_operator::api::{DnsSpec, NodeSpec, QuestDB};
use questdb_operator::cloud::memory::{InstanceEvent, MemoryEc2};
use questdb_operator::cloud::memory::{MemoryCloud, MemoryEc2Options};
use questdb_operator::cloud::{CloudConfig, InstanceState, RetryPolicy, TAG_UID};
use questdb_operator::desired::{names, testing};
use questdb_operator::manager::{self, Cloud, CloudSettings, ManagerHandle, ManagerOptions};
use questdb_testenv::{
    node_name_for_instance as node_name_for, spawn_instance_join, ControlPlane, InstanceChange,
};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::harness::{is_running, wait_for, wait_until};

pub(crate) const NS: &str = "cloud";
pub(crate) const AMI: &str = "ami-0123456789abcdef0";

/// The control plane, the memory cloud joined to it, and a manager that can be stopped,
/// restarted or killed outright.
pub(crate) struct CloudEnv {
    pub(crate) cp: ControlPlane,
    pub(crate) client: Client,
    pub(crate) cloud: MemoryCloud,
    pub(crate) handle: ManagerHandle,
    pub(crate) settings: CloudSettings,
    pub(crate) manager: Option<(CancellationToken, JoinHandle<anyhow::Result<()>>)>,
    pub(crate) bridge: (CancellationToken, JoinHandle<()>),
    /// `ManagerOptions::write_health_interval` of the next manager started.
    pub(crate) write_health_interval: Duration,
}

/// The groups a kubelet's identity carries.
pub(crate) const NODE_GROUPS: &[&str] = &["system:nodes", "system:authenticated"];

pub(crate) fn cloud_config() -> CloudConfig {
    let mut config = CloudConfig::new("it", "sim-region-1");
    for zone in ["sim-zone-a", "sim-zone-b"] {
        config
            .subnets_by_zone
            .insert(zone.into(), format!("subnet-{zone}"));
    }
    config.hosted_zone_id = Some("ZTEST".into());
    // The shipped default (an AL2023 nodeadm NodeConfig): the test environment's node join
    // parses it as nodeadm would, so a template that cannot join a node fails these tests.
    config.user_data_template = questdb_operator::app::DEFAULT_USER_DATA_TEMPLATE.into();
    config.eks = questdb_operator::cloud::EksCluster {
        api_endpoint: Some("https://it.eks.invalid".into()),
        certificate_authority: Some("aXQtY2E=".into()),
        service_cidr: Some("10.100.0.0/16".into()),
    };
    questdb_operator::cloud::user_data::check_template(&config).expect("template accepted");
    // Fast backoff: the tests throttle on purpose.
    config.retry = RetryPolicy {
        min_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(50),
        max_retries: 3,
        eventual_consistency_window: Duration::from_secs(5),
        ..RetryPolicy::default()
    };
    config
}

/// A loopback /16 per real-database cloud, unique on this machine, so instances of tests that
/// run side by side never share an address (their host ports are bound on it).
pub(crate) fn loopback_prefix() -> String {
    questdb_testenv::database::cloud_loopback_prefix()
}

impl CloudEnv {
    pub(crate) async fn start(settings: CloudSettings) -> CloudEnv {
        Self::start_on(
            settings,
            crate::harness::cluster(),
            MemoryEc2Options::default(),
        )
        .await
    }

    /// With a real QuestDB behind the database pod: instances get loopback addresses, so the
    /// node address (the DNS target) answers on the database ports as a node's does on EKS.
    pub(crate) async fn start_with_real_databases(settings: CloudSettings) -> CloudEnv {
        let ec2 = MemoryEc2Options {
            private_ip_prefix: loopback_prefix(),
            ..MemoryEc2Options::default()
        };
        Self::start_on(
            settings,
            crate::harness::cluster().with_real_databases(),
            ec2,
        )
        .await
    }

    pub(crate) async fn start_on(
        settings: CloudSettings,
        cluster: questdb_testenv::ControlPlaneOptions,
        ec2: MemoryEc2Options,
    ) -> CloudEnv {
        Self::start_with_config(settings, cluster, ec2, cloud_config()).await
    }

    pub(crate) async fn start_with_config(
        settings: CloudSettings,
        cluster: questdb_testenv::ControlPlaneOptions,
        ec2: MemoryEc2Options,
        config: CloudConfig,
    ) -> CloudEnv {
        crate::log_capture::init();
        let (cp, client) = crate::harness::control_plane_with(cluster).await;
        let handle = ManagerHandle::default();
        let cloud =
            MemoryCloud::new(config, ec2, handle.metrics.aws_observer()).expect("memory cloud");
        let stop = CancellationToken::new();
        let bridge = spawn_node_join(&cp, cloud.ec2.clone(), stop.clone());
        let mut env = CloudEnv {
            cp,
            client,
            cloud,
            handle,
            settings,
            manager: None,
            bridge: (stop, bridge),
            write_health_interval: ManagerOptions::default().write_health_interval,
        };
        env.namespace().await;
        env.start_manager().await;
        env
    }

    pub(crate) fn options(&self) -> ManagerOptions {
        ManagerOptions {
            cloud: Some(Cloud {
                nodes: self.cloud.nodes.clone(),
                dns: Some(self.cloud.dns.clone()),
                settings: self.settings.clone(),
            }),
            write_health_interval: self.write_health_interval,
            ..ManagerOptions::default()
        }
    }

    pub(crate) async fn start_manager(&mut self) {
        self.handle = ManagerHandle {
            metrics: self.handle.metrics.clone(),
            ..ManagerHandle::default()
        };
        let token = CancellationToken::new();
        let task = crate::harness::spawn_manager(
            token.clone(),
            manager::run_with(
                self.options(),
                self.cp.operator_config().await,
                token.clone(),
                self.handle.clone(),
            ),
        );
        self.manager = Some((token, task));
        let r = self.handle.readiness.clone();
        wait_until("manager caches synced", || {
            let r = r.clone();
            async move { r.is_ready() }
        })
        .await;
    }

    pub(crate) async fn stop_manager(&mut self) {
        if let Some((token, task)) = self.manager.take() {
            token.cancel();
            crate::harness::stopped_in_time(task, &self.handle)
                .await
                .expect("the manager stopped cleanly");
        }
    }

    /// A crash: the manager's future is dropped wherever it is (mid-launch included).
    pub(crate) async fn kill_manager(&mut self) {
        if let Some((token, task)) = self.manager.take() {
            task.abort();
            let _ = task.await;
            // The caches' own tasks outlive an abort; stop them like a dead process would.
            token.cancel();
        }
    }

    pub(crate) async fn namespace(&self) {
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": NS}})).expect("namespace");
        Api::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace created");
    }

    /// A client that acts as `user` in `groups` through the apiserver's own impersonation: an
    /// attacker's identity (a tenant, a node) under the real authorization and admission.
    pub(crate) async fn client_as(&self, user: &str, groups: &[&str]) -> Client {
        let mut config = self.cp.client_config().await;
        config.auth_info.impersonate = Some(user.into());
        config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
        Client::try_from(config).expect("impersonating client")
    }

    pub(crate) fn qdbs(&self) -> Api<QuestDB> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub(crate) async fn create(&self, name: &str, edit: impl FnOnce(&mut QuestDB)) -> QuestDB {
        let mut q = testing::questdb(name, NS);
        q.metadata.uid = None;
        q.metadata.resource_version = None;
        q.metadata.generation = None;
        q.spec.node = Some(NodeSpec {
            image: AMI.into(),
            instance_type: "m6i.large".into(),
            zone: "sim-zone-a".into(),
            ..Default::default()
        });
        // A short TTL: a failover keeps the fenced instance that long after DNS follows.
        q.spec.dns = Some(DnsSpec {
            name: format!("{name}.{NS}.db.example.com"),
            ttl: 5,
            public: false,
        });
        edit(&mut q);
        self.qdbs()
            .create(&PostParams::default(), &q)
            .await
            .expect("QuestDB created")
    }

    pub(crate) async fn stop(mut self) {
        self.stop_manager().await;
        self.bridge.0.cancel();
        let _ = self.bridge.1.await;
    }

    pub(crate) fn live_instances_of(&self, uid: &str) -> Vec<String> {
        self.cloud
            .ec2
            .instances()
            .into_iter()
            .filter(|i| i.tags.get(TAG_UID).map(String::as_str) == Some(uid))
            .filter(|i| i.state != InstanceState::Terminated)
            .map(|i| i.id)
            .collect()
    }

    /// Waits until EC2 reports `id` terminated.
    pub(crate) async fn wait_terminated(&self, id: &str, what: &str) {
        let ec2 = self.cloud.ec2.clone();
        wait_until(what, || {
            let ec2 = ec2.clone();
            async move {
                ec2.instances()
                    .iter()
                    .any(|i| i.id == id && i.state == InstanceState::Terminated)
            }
        })
        .await;
    }

    /// After a failover or a node move: `db1` is Ready and Running on the node of `instance`,
    /// with the volume whose uid is `pvc_uid`, and its DNS record names that instance's address.
    pub(crate) async fn assert_runs_on(&self, instance: &str, pvc_uid: &str) {
        let q = wait_for(&self.qdbs(), "db1", "Running on the new node", is_running()).await;
        let pod = Api::<Pod>::namespaced(self.client.clone(), NS)
            .get(&names::pod(&q))
            .await
            .expect("pod");
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            Some(node_name_for(instance))
        );
        let pvc = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), NS)
            .get("db1-data")
            .await
            .expect("pvc");
        assert_eq!(pvc.uid().as_deref(), Some(pvc_uid), "the same volume");
        let pod_ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .expect("pod address");
        let assigned = self
            .cloud
            .ec2
            .instances()
            .into_iter()
            .find(|i| i.id == instance)
            .is_some_and(|i| i.pod_addresses.contains(&pod_ip));
        assert!(assigned, "{pod_ip} is an address of instance {instance}");
        let records = self.cloud.route53.records();
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0].ips, vec![pod_ip], "DNS follows the database");
    }

    /// Kills the manager right after it records each new step of `db1` (the step `phase` reads
    /// from the status it writes), before the step's side effect: the status write reaches the
    /// apiserver, its answer is held (the proxy's [`Fault::hold`]) and never given, and the
    /// manager is killed (its future dropped in that request) and started again. Goes on until
    /// a status that reports `done`; a step in `failed` fails the test. Every step the machine
    /// records is a kill: returns them.
    pub(crate) async fn kill_at_every_step(
        &mut self,
        phase: fn(&QuestDB) -> Option<String>,
        done: &str,
        failed: &[&str],
        timeout: Duration,
    ) -> std::collections::BTreeSet<String> {
        self.kill_at_every(questdb_testenv::Fault::hold(), phase, done, failed, timeout)
            .await
    }

    /// Kills the manager right before it records each new step of `db1`: after the last
    /// step's side effects, before the record of the next (the write is held before the
    /// apiserver sees it and never forwarded). The restarted manager must find where it was
    /// from what it had recorded and redo nothing twice. Returns the steps whose first record
    /// was dropped.
    pub(crate) async fn kill_before_every_step(
        &mut self,
        phase: fn(&QuestDB) -> Option<String>,
        done: &str,
        timeout: Duration,
    ) -> std::collections::BTreeSet<String> {
        self.kill_at_every(
            questdb_testenv::Fault::hold_before(),
            phase,
            done,
            &[],
            timeout,
        )
        .await
    }

    pub(crate) async fn kill_at_every(
        &mut self,
        (hold, mut held): (
            questdb_testenv::Fault,
            tokio::sync::mpsc::UnboundedReceiver<questdb_testenv::Held>,
        ),
        phase: fn(&QuestDB) -> Option<String>,
        done: &str,
        failed: &[&str],
        timeout: Duration,
    ) -> std::collections::BTreeSet<String> {
        use questdb_testenv::Verb;
        let hold = hold.on_resource("questdbs/status").named("db1");
        let holds = [
            self.cp.inject_fault(hold.clone().on_verb(Verb::Update)),
            self.cp.inject_fault(hold.on_verb(Verb::Patch)),
        ];
        let mut killed = std::collections::BTreeSet::new();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let write = tokio::time::timeout_at(deadline, held.recv())
                .await
                .unwrap_or_else(|_| panic!("{done} in time; killed in {killed:?}"))
                .expect("the proxy holds status writes");
            // A refused write (a conflict) recorded nothing; one not forwarded yet (0) may.
            let step = write
                .json::<QuestDB>()
                .filter(|_| write.status < 300)
                .as_ref()
                .and_then(phase);
            match step {
                Some(step) if step == done => {
                    write.release();
                    break;
                }
                Some(step) if failed.contains(&step.as_str()) => {
                    write.release();
                    panic!("{step}; killed in {killed:?}");
                }
                Some(step) if killed.insert(step.clone()) => {
                    eprintln!("killing the manager at its record of {step}");
                    drop(write);
                    self.kill_manager().await;
                    self.start_manager().await;
                }
                _ => write.release(),
            }
        }
        for id in holds {
            self.cp.remove_fault(id);
        }
        // Writes held after `done` (none are expected) go on.
        while let Ok(write) = held.try_recv() {
            write.release();
        }
        killed
    }

    pub(crate) fn aws_calls(&self) -> usize {
        self.cloud.ec2.calls().len()
            + ["ListResourceRecordSets", "ChangeResourceRecordSets"]
                .iter()
                .map(|op| self.cloud.route53.call_count(op))
                .sum::<usize>()
    }
}

/// The memory cloud's instances as a cloud reports them: each running one boots from its
/// user data and registers its Node, a terminated one's Node goes.
pub(crate) fn spawn_node_join(
    cp: &ControlPlane,
    ec2: Arc<MemoryEc2>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let ec2_for_halts = ec2.clone();
    let changes = futures::stream::unfold(ec2.subscribe(), move |mut rx| {
        let ec2 = ec2.clone();
        async move {
            loop {
                let change = match rx.recv().await {
                    Ok(InstanceEvent::Running(i)) => InstanceChange::Running {
                        user_data: ec2.user_data(&i.id).unwrap_or_default(),
                        id: i.id,
                        zone: i.zone,
                        private_ip: i.private_ip,
                    },
                    Ok(InstanceEvent::Stopping { id, graceful }) => {
                        InstanceChange::Stopping { id, graceful }
                    }
                    Ok(InstanceEvent::Stopped(id)) => InstanceChange::Stopped { id },
                    Ok(InstanceEvent::Terminated(id)) => InstanceChange::Terminated { id },
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return None,
                };
                return Some((change, rx));
            }
        }
    });
    let (halted, ipamd) = (ec2_for_halts.clone(), ec2_for_halts);
    // Node names are `<instance id>.<region>.compute.internal`.
    cp.kubelets().on_os_halted(move |node| {
        halted.os_halted(node.split('.').next().unwrap_or_default());
    });
    cp.kubelets().on_pod_addresses(move |node, blocks| {
        ipamd.assign_ipv4_prefixes(node.split('.').next().unwrap_or_default(), &blocks);
        Box::pin(async {})
    });
    spawn_instance_join(cp.kubelets().clone(), changes, stop)
}

pub(crate) fn settings() -> CloudSettings {
    CloudSettings {
        instance_sync_interval: Duration::from_secs(30),
        orphan_sweep_interval: Duration::from_secs(3600),
        // Not looked for unless a test is about them: each look is an AWS call the tests that
        // count them would see.
        scheduled_event_interval: Duration::from_secs(3600),
        orphan_grace_period: Duration::from_secs(3600),
        node_move_join_timeout: Duration::from_secs(20),
        node_join_timeout: Duration::from_secs(20),
        node_move_step_timeout: Duration::from_secs(30),
        node_move_concurrency: 2,
        // The tests' databases share a namespace or two: the per-namespace share is the
        // global one unless a test is about it.
        node_move_concurrency_per_namespace: 2,
        max_dedicated_nodes_per_namespace: None,
        // The test kubelets' Lease: renewed every quarter of it, as a real kubelet does.
        node_lease_duration: questdb_testenv::timings::node_lease_duration(),
        dns_namespace_suffix: None,
        dns_names_first_come: false,
        csi_driver: Some(questdb_testenv::csi::DRIVER.into()),
        // Scaled down as the cluster's own timers are (a minute and two by default).
        escalation: questdb_operator::plan::failover::Escalation {
            graceful_stop: Duration::from_secs(10),
            stop: Duration::from_secs(15),
            detach: Duration::from_secs(30),
        },
    }
}

/// AWS calls made inside reconciles, every controller's.
pub(crate) fn aws_calls_in_reconciles(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("questdb_operator_reconcile_aws_calls_sum{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub(crate) fn reconciles(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("controller_runtime_reconcile_total{") && l.contains("questdb"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

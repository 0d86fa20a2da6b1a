//! Simulated cluster behaviour: in-process stand-ins for kube-scheduler, the kubelets, and the
//! kube-controller-manager loops the operator depends on (StatefulSet, node lifecycle, PV
//! provisioning/binding, attach/detach). They are ordinary kube-rs clients of the simulated
//! apiserver, so they meet the same conflicts and watch behaviour as real components.
//!
//! Known differences from Kubernetes are listed in `sim/README.md`.

mod attach_detach;
mod config;
mod kubelet;
mod node_lifecycle;
mod node_object;
mod provisioner;
mod quantity;
mod runtime;
mod scheduler;
mod scheduling;
mod statefulset;
mod volumes;
mod wellknown;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use attach_detach::volume_attachment_name;
pub use config::{ClusterConfig, NodeCapacity, NodeSpec, StorageClassSpec};

use crate::clock::Clock;
use kubelet::Agents;
use runtime::{control_loop, is_status, Changes, Kind, LoopSpec, Reconciler, Shared, Stores};

/// How long `start` waits for the first list of every watched kind.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `shutdown` lets loops finish their current request before aborting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The running simulated cluster. Dropping it without `shutdown` aborts its tasks.
pub struct Cluster {
    shared: Arc<Shared>,
    agents: Arc<Agents>,
    cancel: CancellationToken,
    tasks: Mutex<JoinSet<()>>,
    changes: Changes,
}

impl Cluster {
    /// Starts the watch caches, registers `cfg.nodes` and starts every controller.
    pub async fn start(
        client: Client,
        cfg: ClusterConfig,
        clock: Clock,
    ) -> anyhow::Result<Cluster> {
        ensure_namespace(&client, wellknown::NODE_LEASE_NAMESPACE).await?;
        for class in &cfg.storage_classes {
            ensure_storage_class(&client, class, &cfg.csi_driver).await?;
        }
        let cancel = CancellationToken::new();
        let changes = runtime::changes_channel();
        let mut tasks = JoinSet::new();
        let stores = Stores::start(&client, &mut tasks, &cancel, &changes);
        if tokio::time::timeout(STARTUP_TIMEOUT, stores.wait_until_ready())
            .await
            .is_err()
        {
            cancel.cancel();
            anyhow::bail!(
                "simulated cluster: watch caches did not fill within {STARTUP_TIMEOUT:?}"
            );
        }
        let nodes = cfg.nodes.clone();
        let shared = Arc::new(Shared {
            client,
            config: cfg,
            clock,
            stores,
        });
        let cluster = Cluster {
            shared,
            agents: Arc::new(Agents::default()),
            cancel,
            tasks: Mutex::new(tasks),
            changes,
        };
        for node in nodes {
            cluster.add_node(node).await?;
        }
        cluster.start_controllers();
        Ok(cluster)
    }

    fn start_controllers(&self) {
        use Kind::*;
        let shared = &self.shared;
        self.spawn_loop(
            "scheduler",
            &[Node, Pod, Claim, Volume, StorageClass],
            scheduler::Scheduler::new(shared.clone()),
        );
        self.spawn_loop(
            "kubelet-pods",
            &[Pod, Claim, Volume, Attachment],
            kubelet::PodRunner::new(shared.clone(), self.agents.clone()),
        );
        self.spawn_loop(
            "attach-detach",
            &[Node, Pod, Claim, Volume, Attachment],
            attach_detach::AttachDetach::new(shared.clone()),
        );
        self.spawn_loop(
            "node-lifecycle",
            &[Node, Lease, Pod],
            node_lifecycle::NodeLifecycle::new(shared.clone()),
        );
        // Node changes matter to provisioning only through the selected node's zone, which the
        // cache already holds by the time the scheduler names it; heartbeats need not wake it.
        self.spawn_loop(
            "pv-provisioner",
            &[Claim, Volume, Attachment, StorageClass],
            provisioner::Provisioner::new(shared.clone()),
        );
        self.spawn_loop(
            "statefulset",
            &[StatefulSet, Pod, Claim],
            statefulset::StatefulSetController::new(shared.clone()),
        );
    }

    fn spawn_loop(
        &self,
        name: &'static str,
        interests: &'static [Kind],
        reconciler: impl Reconciler,
    ) {
        let spec = LoopSpec {
            name,
            interests,
            clock: self.shared.clock.clone(),
            resync: self.shared.config.resync_interval,
            cancel: self.cancel.clone(),
        };
        self.spawn(control_loop(spec, self.changes.subscribe(), reconciler));
    }

    /// Stops a node's kubelet from writing anything (heartbeats, pod status), like a dead one.
    pub fn stop_heartbeat(&self, node: &str) {
        if let Some(agent) = self.agents.get(node) {
            agent.set_heartbeat(false);
        }
    }

    pub fn restart_heartbeat(&self, node: &str) {
        if let Some(agent) = self.agents.get(node) {
            agent.set_heartbeat(true);
        }
    }

    /// Registers a Node (labels and taints applied at registration) and starts its kubelet.
    pub async fn add_node(&self, spec: NodeSpec) -> anyhow::Result<()> {
        let agent = self.agents.insert(spec, &self.cancel);
        if let Err(err) = kubelet::register(&self.shared, &agent).await {
            self.agents.remove(&agent.spec.name);
            return Err(
                anyhow::Error::new(err).context(format!("registering node {}", agent.spec.name))
            );
        }
        self.spawn(kubelet::run_heartbeat(self.shared.clone(), agent));
        Ok(())
    }

    /// The instance is gone: its kubelet stops and its Node (and Lease) are deleted.
    pub async fn remove_node(&self, name: &str) -> anyhow::Result<()> {
        self.agents.remove(name);
        let nodes: Api<Node> = Api::all(self.shared.client.clone());
        match nodes.delete(name, &DeleteParams::default()).await {
            Err(err) if !is_status(&err, 404) => return Err(err.into()),
            _ => {}
        }
        let leases: Api<Lease> =
            Api::namespaced(self.shared.client.clone(), wellknown::NODE_LEASE_NAMESPACE);
        match leases.delete(name, &DeleteParams::default()).await {
            Err(err) if !is_status(&err, 404) => Err(err.into()),
            _ => Ok(()),
        }
    }

    /// Stops every loop and waits (bounded) for them to finish.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let mut tasks = match self.tasks.into_inner() {
            Ok(tasks) => tasks,
            Err(poisoned) => poisoned.into_inner(),
        };
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tasks.abort_all();
        }
    }

    fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.spawn(fut);
    }
}

async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Err(err) if !is_status(&err, 409) => {
            Err(anyhow::Error::new(err).context(format!("creating namespace {name}")))
        }
        _ => Ok(()),
    }
}

async fn ensure_storage_class(
    client: &Client,
    spec: &StorageClassSpec,
    driver: &str,
) -> anyhow::Result<()> {
    let api: Api<StorageClass> = Api::all(client.clone());
    let mut annotations = std::collections::BTreeMap::new();
    if spec.default {
        annotations.insert(
            wellknown::DEFAULT_CLASS_ANNOTATION.to_string(),
            "true".to_string(),
        );
    }
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        provisioner: driver.to_string(),
        reclaim_policy: Some(spec.reclaim_policy.clone()),
        volume_binding_mode: Some(
            if spec.wait_for_first_consumer {
                "WaitForFirstConsumer"
            } else {
                "Immediate"
            }
            .to_string(),
        ),
        allow_volume_expansion: Some(spec.allow_volume_expansion),
        parameters: Some(std::collections::BTreeMap::from([(
            "type".to_string(),
            spec.name.clone(),
        )])),
        ..StorageClass::default()
    };
    match api.create(&PostParams::default(), &class).await {
        Err(err) if !is_status(&err, 409) => {
            Err(anyhow::Error::new(err).context(format!("creating StorageClass {}", spec.name)))
        }
        _ => Ok(()),
    }
}

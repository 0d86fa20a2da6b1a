//! Simulated kubelets: node registration, heartbeats (Node status + Lease), and running the pods
//! bound to each node. A kubelet whose heartbeat is stopped behaves like a dead one: it writes
//! nothing at all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, Node, Pod,
    PodCondition, PodIP, PodStatus,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::attach_detach::pod_volumes_attached;
use super::config::NodeSpec;
use super::node_object::{healthy_conditions, node_lease, node_object, pod_cidr};
use super::runtime::{is_status, remaining, time, PassOutcome, Shared, Since};
use super::volumes::pod_is_terminal;
use super::wellknown::NODE_LEASE_NAMESPACE;

/// One running kubelet.
pub(crate) struct NodeAgent {
    pub spec: NodeSpec,
    pub index: u32,
    heartbeat: AtomicBool,
    wake: Notify,
    pub cancel: CancellationToken,
    next_pod_ip: AtomicU32,
}

impl NodeAgent {
    pub fn new(spec: NodeSpec, index: u32, cancel: CancellationToken) -> Self {
        Self {
            spec,
            index,
            heartbeat: AtomicBool::new(true),
            wake: Notify::new(),
            cancel,
            next_pod_ip: AtomicU32::new(0),
        }
    }

    pub fn alive(&self) -> bool {
        self.heartbeat.load(Ordering::SeqCst) && !self.cancel.is_cancelled()
    }

    pub fn set_heartbeat(&self, on: bool) {
        self.heartbeat.store(on, Ordering::SeqCst);
        // A resumed kubelet reports at once rather than at its next tick.
        self.wake.notify_one();
    }

    fn allocate_pod_ip(&self) -> String {
        let (_, prefix) = pod_cidr(self.index);
        let n = self.next_pod_ip.fetch_add(1, Ordering::SeqCst) % 250;
        format!("{prefix}.{}", n + 2)
    }
}

/// The kubelets of the cluster, by node name.
#[derive(Default)]
pub(crate) struct Agents {
    by_node: Mutex<BTreeMap<String, Arc<NodeAgent>>>,
    next_index: AtomicU32,
}

impl Agents {
    pub fn get(&self, node: &str) -> Option<Arc<NodeAgent>> {
        self.lock().get(node).cloned()
    }

    pub fn insert(&self, spec: NodeSpec, parent: &CancellationToken) -> Arc<NodeAgent> {
        let index = self.next_index.fetch_add(1, Ordering::SeqCst) + 1;
        let agent = Arc::new(NodeAgent::new(spec.clone(), index, parent.child_token()));
        if let Some(old) = self.lock().insert(spec.name.clone(), agent.clone()) {
            old.cancel.cancel();
        }
        agent
    }

    pub fn remove(&self, node: &str) -> Option<Arc<NodeAgent>> {
        let agent = self.lock().remove(node);
        if let Some(agent) = &agent {
            agent.cancel.cancel();
        }
        agent
    }

    pub fn snapshot(&self) -> BTreeMap<String, Arc<NodeAgent>> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<NodeAgent>>> {
        // A panic while holding this lock cannot leave the map half-written; keep going.
        self.by_node.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Creates the Node (or adopts an existing one), reports its status and takes its Lease.
pub(crate) async fn register(shared: &Shared, agent: &NodeAgent) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(shared.client.clone());
    let node = node_object(&agent.spec, agent.index, &shared.config, shared.now());
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(err) if is_status(&err, 409) => {}
        Err(err) => return Err(err),
    }
    // Creation may drop status (it is a subresource), so report it separately.
    let status = json!({ "status": node.status });
    nodes
        .patch_status(
            &agent.spec.name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    renew_lease(shared, agent).await?;
    Ok(())
}

async fn renew_lease(shared: &Shared, agent: &NodeAgent) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(shared.client.clone(), NODE_LEASE_NAMESPACE);
    let name = &agent.spec.name;
    let now = shared.now();
    let patch = json!({"spec": {
        "holderIdentity": name,
        "renewTime": super::runtime::micro_time(now),
    }});
    match leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if is_status(&err, 404) => {
            let uid = shared
                .stores
                .node(name)
                .and_then(|n| n.metadata.uid.clone());
            let lease = node_lease(name, uid.as_deref(), &shared.config, now);
            match leases.create(&PostParams::default(), &lease).await {
                Err(err) if !is_status(&err, 409) => Err(err),
                _ => Ok(()),
            }
        }
        Err(err) => Err(err),
    }
}

async fn heartbeat(shared: &Shared, agent: &NodeAgent) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(shared.client.clone());
    let name = &agent.spec.name;
    let previous = shared
        .stores
        .node(name)
        .and_then(|n| n.status.as_ref().and_then(|s| s.conditions.clone()))
        .unwrap_or_default();
    let conditions = healthy_conditions(shared.now(), &previous);
    let patch = json!({"status": {"conditions": conditions}});
    match nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        // A live kubelet whose Node was deleted registers it again, as the real one does.
        Err(err) if is_status(&err, 404) => register(shared, agent).await,
        Err(err) => Err(err),
        Ok(_) => renew_lease(shared, agent).await,
    }
}

/// One node's heartbeat loop: every `heartbeat_interval` while the heartbeat is on.
pub(crate) async fn run_heartbeat(shared: Arc<Shared>, agent: Arc<NodeAgent>) {
    loop {
        if agent.alive() {
            if let Err(err) = heartbeat(&shared, &agent).await {
                tracing::debug!(%err, node = %agent.spec.name, "sim heartbeat failed");
            }
        }
        tokio::select! {
            _ = agent.cancel.cancelled() => return,
            _ = agent.wake.notified() => {}
            _ = shared.clock.sleep(shared.config.heartbeat_interval) => {}
        }
    }
}

/// The status a kubelet reports for a pod whose containers are being created.
pub(crate) fn waiting_status(pod: &Pod, host_ip: &str, now: SystemTime) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let old = pod.status.clone().unwrap_or_default();
    let statuses = spec
        .containers
        .iter()
        .map(|c| ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            ready: false,
            started: Some(false),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".to_string()),
                    message: None,
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        })
        .collect();
    PodStatus {
        phase: Some("Pending".to_string()),
        host_ip: Some(host_ip.to_string()),
        start_time: old.start_time.clone().or_else(|| Some(time(now))),
        conditions: Some(pod_conditions(&old, now, false, false)),
        container_statuses: Some(statuses),
        qos_class: old.qos_class,
        ..PodStatus::default()
    }
}

/// The status of a pod whose containers run (and, without probes, are ready at once).
pub(crate) fn running_status(pod: &Pod, host_ip: &str, pod_ip: &str, now: SystemTime) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let old = pod.status.clone().unwrap_or_default();
    let previous_containers = old.container_statuses.clone().unwrap_or_default();
    let statuses = spec
        .containers
        .iter()
        .map(|c| {
            let started_at = previous_containers
                .iter()
                .find(|s| s.name == c.name)
                .and_then(|s| s.state.as_ref()?.running.as_ref()?.started_at.clone())
                .unwrap_or_else(|| time(now));
            let image = c.image.clone().unwrap_or_default();
            ContainerStatus {
                name: c.name.clone(),
                image_id: format!("{image}@sha256:{}", hex::encode([0u8; 32])),
                image,
                container_id: Some(format!(
                    "containerd://{}",
                    hex::encode(Sha256::digest(format!(
                        "{}/{}",
                        pod.metadata.uid.as_deref().unwrap_or_default(),
                        c.name
                    )))
                )),
                ready: true,
                started: Some(true),
                restart_count: 0,
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(started_at),
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }
        })
        .collect();
    PodStatus {
        phase: Some("Running".to_string()),
        host_ip: Some(host_ip.to_string()),
        host_ips: Some(vec![k8s_openapi::api::core::v1::HostIP {
            ip: host_ip.to_string(),
        }]),
        pod_ip: Some(pod_ip.to_string()),
        pod_ips: Some(vec![PodIP {
            ip: pod_ip.to_string(),
        }]),
        start_time: old.start_time.clone().or_else(|| Some(time(now))),
        conditions: Some(pod_conditions(&old, now, true, true)),
        container_statuses: Some(statuses),
        qos_class: old.qos_class,
        ..PodStatus::default()
    }
}

fn pod_conditions(
    old: &PodStatus,
    now: SystemTime,
    started: bool,
    ready: bool,
) -> Vec<PodCondition> {
    let previous = old.conditions.clone().unwrap_or_default();
    let flag = |b: bool| if b { "True" } else { "False" };
    let wanted = [
        ("PodReadyToStartContainers", flag(started)),
        ("Initialized", "True"),
        ("Ready", flag(ready)),
        ("ContainersReady", flag(ready)),
        ("PodScheduled", "True"),
    ];
    wanted
        .into_iter()
        .map(|(type_, status)| {
            let transition = previous
                .iter()
                .find(|c| c.type_ == type_ && c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| time(now));
            PodCondition {
                type_: type_.to_string(),
                status: status.to_string(),
                last_transition_time: Some(transition),
                reason: (status == "False" && (type_ == "Ready" || type_ == "ContainersReady"))
                    .then(|| "ContainersNotReady".to_string()),
                ..PodCondition::default()
            }
        })
        .collect()
}

/// Whether the reported status already says what `wanted` says (ignoring timestamps), so a
/// steady pod costs no writes.
pub(crate) fn status_matches(current: Option<&PodStatus>, wanted: &PodStatus) -> bool {
    let Some(current) = current else {
        return false;
    };
    let conditions = |s: &PodStatus| -> BTreeSet<(String, String)> {
        s.conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect()
    };
    let containers = |s: &PodStatus| -> Vec<(String, bool, bool)> {
        s.container_statuses
            .iter()
            .flatten()
            .map(|c| {
                let running = c.state.as_ref().is_some_and(|st| st.running.is_some());
                (c.name.clone(), c.ready, running)
            })
            .collect()
    };
    current.phase == wanted.phase
        && current.pod_ip == wanted.pod_ip
        && current.host_ip == wanted.host_ip
        && conditions(current).is_superset(&conditions(wanted))
        && containers(current) == containers(wanted)
}

fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Runs the pods of every live kubelet: start them once their volumes are attached, remove
/// them once deleted.
pub(crate) struct PodRunner {
    shared: Arc<Shared>,
    agents: Arc<Agents>,
    starting: Since<String>,
    stopping: Since<String>,
}

impl PodRunner {
    pub fn new(shared: Arc<Shared>, agents: Arc<Agents>) -> Self {
        Self {
            shared,
            agents,
            starting: Since::new(),
            stopping: Since::new(),
        }
    }

    async fn pass_once(&mut self) -> PassOutcome {
        let mut out = PassOutcome::default();
        let shared = self.shared.clone();
        let agents = self.agents.snapshot();
        let now = shared.now();
        let mut live_uids = BTreeSet::new();
        for pod in shared.stores.pods.state() {
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let Some(agent) = agents.get(&node) else {
                continue;
            };
            if !agent.alive() {
                continue;
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            live_uids.insert(uid.clone());
            self.sync_pod(&shared, agent, &pod, &uid, now, &mut out)
                .await;
        }
        self.starting.retain(|u| live_uids.contains(u));
        self.stopping.retain(|u| live_uids.contains(u));
        out
    }

    async fn sync_pod(
        &mut self,
        shared: &Shared,
        agent: &NodeAgent,
        pod: &Pod,
        uid: &str,
        now: SystemTime,
        out: &mut PassOutcome,
    ) {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(shared.client.clone(), namespace);
        let cfg = &shared.config;
        if pod.metadata.deletion_timestamp.is_some() {
            let grace = pod
                .metadata
                .deletion_grace_period_seconds
                .map(|s| std::time::Duration::from_secs(s.max(0) as u64))
                .unwrap_or(cfg.pod_stop_delay);
            let left = remaining(
                cfg.pod_stop_delay.min(grace),
                self.stopping.observe(&uid.to_string(), now),
            );
            if !left.is_zero() {
                out.requeue(left);
                return;
            }
            // Containers stopped: the kubelet confirms with a zero-grace delete.
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.to_string()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &dp).await {
                Err(err) if is_status(&err, 404) => {}
                other => {
                    out.record("delete stopped pod", other);
                }
            }
            return;
        }
        if pod_is_terminal(pod) {
            return;
        }
        let host_ip = agent
            .spec
            .internal_ip
            .clone()
            .unwrap_or_else(|| super::node_object::default_internal_ip(agent.index));
        let wanted = if is_running(pod) {
            let ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_else(|| agent.allocate_pod_ip());
            running_status(pod, &host_ip, &ip, now)
        } else if !pod_volumes_attached(shared, pod, &agent.spec.name) {
            self.starting.forget(&uid.to_string());
            waiting_status(pod, &host_ip, now)
        } else {
            let left = remaining(
                cfg.pod_start_delay,
                self.starting.observe(&uid.to_string(), now),
            );
            if left.is_zero() {
                running_status(pod, &host_ip, &agent.allocate_pod_ip(), now)
            } else {
                out.requeue(left);
                waiting_status(pod, &host_ip, now)
            }
        };
        if status_matches(pod.status.as_ref(), &wanted) {
            return;
        }
        let patch = json!({
            "metadata": {"resourceVersion": pod.metadata.resource_version},
            "status": wanted,
        });
        out.record(
            "report pod status",
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        );
    }
}

impl super::runtime::Reconciler for PodRunner {
    fn pass(&mut self) -> impl std::future::Future<Output = PassOutcome> + Send {
        self.pass_once()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::time::Duration;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("db-0".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "questdb".into(),
                    image: Some("questdb/questdb:9.0.0".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn condition<'a>(s: &'a PodStatus, t: &str) -> &'a str {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .map(|c| c.status.as_str())
            .unwrap_or("absent")
    }

    #[test]
    fn running_pod_is_ready_with_ip_and_running_containers() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let s = running_status(&pod(), "10.0.0.5", "10.244.1.2", now);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.244.1.2"));
        assert_eq!(condition(&s, "Ready"), "True");
        assert_eq!(condition(&s, "ContainersReady"), "True");
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert!(c.ready && c.state.as_ref().unwrap().running.is_some());
    }

    #[test]
    fn waiting_pod_is_pending_container_creating_and_not_ready() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let s = waiting_status(&pod(), "10.0.0.5", now);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(condition(&s, "Ready"), "False");
        assert_eq!(condition(&s, "PodScheduled"), "True");
        let waiting = s.container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    }

    #[test]
    fn steady_status_needs_no_write_but_a_not_ready_mark_does() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut p = pod();
        let running = running_status(&p, "10.0.0.5", "10.244.1.2", now);
        p.status = Some(running.clone());
        let later = running_status(&p, "10.0.0.5", "10.244.1.2", now + Duration::from_secs(60));
        assert!(status_matches(p.status.as_ref(), &later));
        // The node lifecycle controller flipped Ready to False: the kubelet must correct it.
        let mut marked = running;
        for c in marked.conditions.iter_mut().flatten() {
            if c.type_ == "Ready" {
                c.status = "False".into();
            }
        }
        assert!(!status_matches(Some(&marked), &later));
    }
}

//! The simulated kube-scheduler: binds pending pods to the least-loaded node that fits.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Binding, Node, ObjectReference, PersistentVolumeClaim, Pod, PodCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::runtime::{is_status, time, PassOutcome, Shared};
use super::scheduling::{fits, unschedulable_message, ClaimState, Misfit};
use super::volumes::{
    bound_pv, claim_class, pod_claims, pod_is_terminal, waits_for_first_consumer,
};
use super::wellknown::{DEFAULT_SCHEDULER, SELECTED_NODE_ANNOTATION};

/// Whether this scheduler is responsible for `pod` and it still needs a node.
pub(crate) fn needs_scheduling(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let ours = spec
        .scheduler_name
        .as_deref()
        .is_none_or(|s| s.is_empty() || s == DEFAULT_SCHEDULER);
    ours && spec.node_name.is_none()
        && pod.metadata.deletion_timestamp.is_none()
        && !pod_is_terminal(pod)
}

/// Among the nodes that fit, the one with the fewest pods (ties by name, for determinism).
pub(crate) fn choose<'a>(candidates: &[(&'a str, usize)]) -> Option<&'a str> {
    candidates
        .iter()
        .min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(b.0)))
        .map(|(name, _)| *name)
}

pub(crate) struct Scheduler {
    shared: Arc<Shared>,
}

impl Scheduler {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn claim_states(&self, pod: &Pod) -> (Vec<ClaimState>, Vec<Arc<PersistentVolumeClaim>>) {
        let stores = &self.shared.stores;
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut states = Vec::new();
        let mut delayed = Vec::new();
        for claim in pod_claims(pod) {
            let Some(pvc) = stores.pvc(namespace, claim) else {
                states.push(ClaimState::Missing(claim.to_string()));
                continue;
            };
            if let Some(pv) = bound_pv(stores, &pvc) {
                let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.clone());
                states.push(ClaimState::Bound(affinity));
            } else if pvc
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_ref())
                .is_some()
            {
                // Pre-bound to a PV that is not there (yet): like unbound immediate.
                states.push(ClaimState::UnboundImmediate(claim.to_string()));
            } else if claim_class(stores, &pvc).is_some_and(|c| waits_for_first_consumer(&c)) {
                states.push(ClaimState::UnboundWaitForConsumer);
                delayed.push(pvc);
            } else {
                states.push(ClaimState::UnboundImmediate(claim.to_string()));
            }
        }
        (states, delayed)
    }

    async fn pass_once(&mut self) -> PassOutcome {
        let mut out = PassOutcome::default();
        let shared = self.shared.clone();
        let nodes: Vec<Arc<Node>> = shared.stores.nodes.state();
        let all_pods = shared.stores.pods.state();
        let mut by_node: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for pod in &all_pods {
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                if !pod_is_terminal(pod) {
                    by_node.entry(node).or_default().push(pod.clone());
                }
            }
        }
        let mut pending: Vec<&Arc<Pod>> = all_pods.iter().filter(|p| needs_scheduling(p)).collect();
        // Oldest first, like the scheduling queue's default ordering.
        pending.sort_by(|a, b| {
            (&a.metadata.creation_timestamp, &a.metadata.name)
                .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
        });
        for pod in pending {
            let (claims, delayed) = self.claim_states(pod);
            let mut candidates = Vec::new();
            let mut misfits: Vec<Misfit> = Vec::new();
            for node in &nodes {
                let name = node.metadata.name.as_deref().unwrap_or_default();
                let on_node: Vec<&Pod> = by_node
                    .get(name)
                    .map(|v| v.iter().map(|p| p.as_ref()).collect())
                    .unwrap_or_default();
                match fits(pod, node, &on_node, &claims) {
                    Ok(()) => candidates.push((name, on_node.len())),
                    Err(m) => misfits.push(m),
                }
            }
            match choose(&candidates) {
                Some(node) => {
                    if self.bind(pod, node, &delayed, &mut out).await {
                        by_node
                            .entry(node.to_string())
                            .or_default()
                            .push(pod.clone());
                    }
                }
                None => {
                    let message = unschedulable_message(nodes.len(), &misfits);
                    self.mark_unschedulable(pod, &message, &mut out).await;
                }
            }
        }
        out
    }

    async fn bind(
        &self,
        pod: &Pod,
        node: &str,
        delayed: &[Arc<PersistentVolumeClaim>],
        out: &mut PassOutcome,
    ) -> bool {
        let client = &self.shared.client;
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        // WaitForFirstConsumer: tell the provisioner where the pod goes before binding it.
        for pvc in delayed {
            let selected = pvc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SELECTED_NODE_ANNOTATION));
            if selected.map(String::as_str) == Some(node) {
                continue;
            }
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
            let patch = json!({"metadata": {"annotations": {SELECTED_NODE_ANNOTATION: node}}});
            let claim = pvc.metadata.name.as_deref().unwrap_or_default();
            let written = pvcs
                .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            if out.record("annotate selected node", written).is_none() {
                return false;
            }
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                uid: pod.metadata.uid.clone(),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("Node".to_string()),
                name: Some(node.to_string()),
                ..ObjectReference::default()
            },
        };
        let result: Result<serde_json::Value, _> = pods
            .create_subresource("binding", name, &PostParams::default(), &binding)
            .await;
        match result {
            Ok(_) => true,
            // An apiserver without pods/binding: set the node name directly, guarded by the
            // resourceVersion so a concurrent change is not overwritten.
            Err(err) if is_status(&err, 404) || is_status(&err, 405) => {
                let patch = json!({
                    "metadata": {"resourceVersion": pod.metadata.resource_version},
                    "spec": {"nodeName": node},
                });
                let written = pods
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                out.record("bind pod by nodeName", written).is_some()
            }
            Err(err) => out.record::<()>("bind pod", Err(err)).is_some(),
        }
    }

    async fn mark_unschedulable(&self, pod: &Pod, message: &str, out: &mut PassOutcome) {
        let mut conditions = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let already = conditions.iter().any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
                && c.message.as_deref() == Some(message)
        });
        if already {
            return;
        }
        conditions.retain(|c| c.type_ != "PodScheduled");
        conditions.push(PodCondition {
            type_: "PodScheduled".to_string(),
            status: "False".to_string(),
            reason: Some("Unschedulable".to_string()),
            message: Some(message.to_string()),
            last_transition_time: Some(time(self.shared.now())),
            ..PodCondition::default()
        });
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.shared.client.clone(), namespace);
        let patch = json!({"status": {"phase": "Pending", "conditions": conditions}});
        out.record(
            "mark pod unschedulable",
            pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        );
    }
}

impl super::runtime::Reconciler for Scheduler {
    fn pass(&mut self) -> impl std::future::Future<Output = PassOutcome> + Send {
        self.pass_once()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn least_loaded_node_wins_and_ties_break_by_name() {
        assert_eq!(choose(&[("b", 1), ("a", 1), ("c", 0)]), Some("c"));
        assert_eq!(choose(&[("b", 1), ("a", 1)]), Some("a"));
        assert_eq!(choose(&[]), None);
    }

    #[test]
    fn only_unbound_live_pods_for_the_default_scheduler_are_scheduled() {
        let mut pod = Pod {
            spec: Some(PodSpec::default()),
            ..Pod::default()
        };
        assert!(needs_scheduling(&pod));
        pod.spec.as_mut().unwrap().scheduler_name = Some("other-scheduler".into());
        assert!(!needs_scheduling(&pod));
        pod.spec.as_mut().unwrap().scheduler_name = None;
        pod.spec.as_mut().unwrap().node_name = Some("n1".into());
        assert!(!needs_scheduling(&pod));
        pod.spec.as_mut().unwrap().node_name = None;
        pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(!needs_scheduling(&pod));
    }
}

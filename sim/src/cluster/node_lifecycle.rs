//! The node lifecycle controller (plus the parts of pod GC that follow from it): silent nodes
//! become `Ready=Unknown` and tainted unreachable, their pods not Ready; NoExecute taints evict
//! pods that do not tolerate them; pods on out-of-service nodes and on deleted nodes are
//! force-deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;

use super::node_object::unknown_conditions;
use super::runtime::{is_status, remaining, system_time, time, PassOutcome, Shared, Since};
use super::scheduling::{node_condition, node_taints, pod_tolerations, tolerates};
use super::wellknown::*;

/// The newest sign of life: the Lease renewal or the Ready heartbeat, whichever is later.
pub(crate) fn last_heartbeat(node: &Node, lease: Option<&Lease>) -> Option<SystemTime> {
    let renewed = lease
        .and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
        .map(|t| system_time(&t.0));
    let reported = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .map(|t| system_time(&t.0));
    renewed.max(reported)
}

/// Whether the kubelet has been silent past the grace period. A node that never reported is
/// measured from when it was first seen.
pub(crate) fn is_silent(
    last: Option<SystemTime>,
    seen_for: Duration,
    now: SystemTime,
    grace: Duration,
) -> bool {
    match last {
        Some(last) => now.duration_since(last).unwrap_or_default() > grace,
        None => seen_for > grace,
    }
}

fn taint(key: &str, effect: &str, now: SystemTime) -> Taint {
    Taint {
        key: key.to_string(),
        value: None,
        effect: effect.to_string(),
        time_added: (effect == EFFECT_NO_EXECUTE).then(|| time(now)),
    }
}

/// The node's taints given its Ready status, or `None` when they are already right.
pub(crate) fn desired_taints(
    current: &[Taint],
    ready: Option<&str>,
    now: SystemTime,
) -> Option<Vec<Taint>> {
    let condition_keys = [TAINT_UNREACHABLE, TAINT_NOT_READY];
    let wanted_key = match ready {
        Some("Unknown") => Some(TAINT_UNREACHABLE),
        Some("False") => Some(TAINT_NOT_READY),
        Some(_) => None,
        // No Ready condition yet: leave the node alone.
        None => return None,
    };
    let mut taints: Vec<Taint> = current
        .iter()
        .filter(|t| !condition_keys.contains(&t.key.as_str()) || Some(t.key.as_str()) == wanted_key)
        .cloned()
        .collect();
    if let Some(key) = wanted_key {
        for effect in [EFFECT_NO_SCHEDULE, EFFECT_NO_EXECUTE] {
            if !taints.iter().any(|t| t.key == key && t.effect == effect) {
                taints.push(taint(key, effect, now));
            }
        }
    }
    (taints != current).then_some(taints)
}

/// What the taint manager (and pod GC) does to a pod on a tainted node.
#[derive(Debug, PartialEq)]
pub(crate) enum PodFate {
    Keep,
    /// Graceful delete now.
    Evict,
    /// Graceful delete once this time comes.
    EvictAt(SystemTime),
    /// Delete with grace 0: the node is out of service, nobody will confirm the pod stopped.
    ForceDelete,
}

/// The toleration a pod effectively has for `taint`, including the ones the
/// DefaultTolerationSeconds admission plugin adds for not-ready/unreachable.
fn effective_toleration<'a>(
    tolerations: &'a [Toleration],
    taint: &Taint,
    implied: &'a Toleration,
) -> Option<&'a Toleration> {
    tolerations
        .iter()
        .find(|t| tolerates(t, taint))
        .or_else(|| {
            (taint.effect == EFFECT_NO_EXECUTE
                && (taint.key == TAINT_UNREACHABLE || taint.key == TAINT_NOT_READY))
                .then_some(implied)
        })
}

pub(crate) fn pod_fate(
    pod: &Pod,
    taints: &[Taint],
    default_toleration_seconds: i64,
    first_seen: SystemTime,
) -> PodFate {
    let tolerations = pod_tolerations(pod);
    let out_of_service = taints.iter().any(|t| {
        t.key == TAINT_OUT_OF_SERVICE
            && t.effect == EFFECT_NO_EXECUTE
            && !tolerations.iter().any(|tol| tolerates(tol, t))
    });
    if out_of_service {
        return PodFate::ForceDelete;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return PodFate::Keep;
    }
    let implied = Toleration {
        operator: Some("Exists".to_string()),
        effect: Some(EFFECT_NO_EXECUTE.to_string()),
        toleration_seconds: Some(default_toleration_seconds),
        ..Toleration::default()
    };
    let mut deadline: Option<SystemTime> = None;
    for taint in taints.iter().filter(|t| t.effect == EFFECT_NO_EXECUTE) {
        let Some(toleration) = effective_toleration(tolerations, taint, &implied) else {
            return PodFate::Evict;
        };
        if let Some(seconds) = toleration.toleration_seconds {
            let added = taint
                .time_added
                .as_ref()
                .map(|t| system_time(&t.0))
                .unwrap_or(first_seen);
            let at = added + Duration::from_secs(seconds.max(0) as u64);
            deadline = Some(deadline.map_or(at, |d| d.min(at)));
        }
    }
    match deadline {
        Some(at) => PodFate::EvictAt(at),
        None => PodFate::Keep,
    }
}

pub(crate) struct NodeLifecycle {
    shared: Arc<Shared>,
    nodes_seen: Since<String>,
    taints_seen: Since<String>,
    orphans: Since<String>,
}

impl NodeLifecycle {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            nodes_seen: Since::new(),
            taints_seen: Since::new(),
            orphans: Since::new(),
        }
    }

    async fn pass_once(&mut self) -> PassOutcome {
        let mut out = PassOutcome::default();
        let shared = self.shared.clone();
        let now = shared.now();
        let cfg = &shared.config;
        let nodes_api: Api<Node> = Api::all(shared.client.clone());
        let mut ready_by_node: BTreeMap<String, String> = BTreeMap::new();

        let nodes = shared.stores.nodes.state();
        for node in &nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let seen_for = self.nodes_seen.observe(&name, now);
            let last = last_heartbeat(node, shared.stores.lease(&name).as_deref());
            let mut ready = node_condition(node, "Ready").map(str::to_string);
            if is_silent(last, seen_for, now, cfg.node_grace_period) {
                if ready.as_deref() != Some("Unknown") {
                    let previous = node
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.clone())
                        .unwrap_or_default();
                    let patch =
                        json!({"status": {"conditions": unknown_conditions(now, &previous)}});
                    let written = nodes_api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                    if out.record("mark node Unknown", written).is_some() {
                        ready = Some("Unknown".to_string());
                    }
                }
            } else if let Some(last) = last {
                let silent_at = last + cfg.node_grace_period;
                out.requeue(
                    silent_at.duration_since(now).unwrap_or_default() + Duration::from_millis(10),
                );
            } else {
                out.requeue(remaining(cfg.node_grace_period, seen_for));
            }
            if let Some(taints) = desired_taints(node_taints(node), ready.as_deref(), now) {
                let mut updated = (**node).clone();
                updated.spec.get_or_insert_with(Default::default).taints = Some(taints);
                // Replace, not patch: the resourceVersion guards taints others add concurrently
                // (e.g. the operator's out-of-service taint).
                out.record(
                    "update node taints",
                    nodes_api
                        .replace(&name, &PostParams::default(), &updated)
                        .await,
                );
            }
            if let Some(ready) = ready {
                ready_by_node.insert(name, ready);
            }
        }
        self.nodes_seen
            .retain(|n| nodes.iter().any(|x| x.metadata.name.as_ref() == Some(n)));

        let mut orphan_keys = Vec::new();
        let mut pod_keys = std::collections::BTreeSet::new();
        for pod in shared.stores.pods.state() {
            let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let key = format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            );
            pod_keys.insert(key.clone());
            let Some(node) = shared.stores.node(&node_name) else {
                orphan_keys.push(key.clone());
                let left = remaining(cfg.orphan_pod_grace, self.orphans.observe(&key, now));
                if left.is_zero() {
                    force_delete(&shared, &pod, &mut out).await;
                } else {
                    out.requeue(left);
                }
                continue;
            };
            if ready_by_node.get(&node_name).map(String::as_str) == Some("Unknown") {
                mark_not_ready(&shared, &pod, &mut out).await;
            }
            let first_seen = now - self.taints_seen.observe(&key, now);
            match pod_fate(
                &pod,
                node_taints(&node),
                cfg.default_toleration_seconds,
                first_seen,
            ) {
                PodFate::Keep => self.taints_seen.forget(&key),
                PodFate::ForceDelete => force_delete(&shared, &pod, &mut out).await,
                PodFate::Evict => evict(&shared, &pod, &mut out).await,
                PodFate::EvictAt(at) => match at.duration_since(now) {
                    Ok(left) if !left.is_zero() => out.requeue(left),
                    _ => evict(&shared, &pod, &mut out).await,
                },
            }
        }
        self.orphans.retain(|k| orphan_keys.contains(k));
        self.taints_seen.retain(|k| pod_keys.contains(k));
        out
    }
}

impl super::runtime::Reconciler for NodeLifecycle {
    fn pass(&mut self) -> impl std::future::Future<Output = PassOutcome> + Send {
        self.pass_once()
    }
}

fn pod_api(shared: &Shared, pod: &Pod) -> (Api<Pod>, String) {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    (
        Api::namespaced(shared.client.clone(), namespace),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

async fn mark_not_ready(shared: &Shared, pod: &Pod, out: &mut PassOutcome) {
    let Some(conditions) = pod.status.as_ref().and_then(|s| s.conditions.clone()) else {
        return;
    };
    if !conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
    {
        return;
    }
    let now = time(shared.now());
    let conditions: Vec<_> = conditions
        .into_iter()
        .map(|mut c| {
            if c.type_ == "Ready" {
                c.status = "False".to_string();
                c.reason = Some("NodeNotReady".to_string());
                c.last_transition_time = Some(now.clone());
            }
            c
        })
        .collect();
    let (api, name) = pod_api(shared, pod);
    let patch = json!({
        "metadata": {"resourceVersion": pod.metadata.resource_version},
        "status": {"conditions": conditions},
    });
    out.record(
        "mark pod not ready",
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
}

fn uid_precondition(pod: &Pod) -> Option<Preconditions> {
    Some(Preconditions {
        uid: pod.metadata.uid.clone(),
        resource_version: None,
    })
}

async fn force_delete(shared: &Shared, pod: &Pod, out: &mut PassOutcome) {
    let (api, name) = pod_api(shared, pod);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: uid_precondition(pod),
        ..DeleteParams::default()
    };
    match api.delete(&name, &dp).await {
        Err(err) if is_status(&err, 404) => {}
        other => {
            out.record("force-delete pod", other);
        }
    }
}

async fn evict(shared: &Shared, pod: &Pod, out: &mut PassOutcome) {
    let (api, name) = pod_api(shared, pod);
    let dp = DeleteParams {
        preconditions: uid_precondition(pod),
        ..DeleteParams::default()
    };
    match api.delete(&name, &dp).await {
        Err(err) if is_status(&err, 404) => {}
        other => {
            out.record("evict pod", other);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn pod_with(tolerations: Vec<Toleration>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                tolerations: Some(tolerations),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn silence_is_measured_from_the_newest_heartbeat() {
        let grace = Duration::from_secs(40);
        assert!(!is_silent(Some(at(0)), Duration::ZERO, at(40), grace));
        assert!(is_silent(Some(at(0)), Duration::ZERO, at(41), grace));
        assert!(!is_silent(None, Duration::from_secs(10), at(100), grace));
        assert!(is_silent(None, Duration::from_secs(41), at(100), grace));

        let lease = Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(super::super::runtime::timestamp(at(30)))),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert_eq!(last_heartbeat(&Node::default(), Some(&lease)), Some(at(30)));
        assert_eq!(last_heartbeat(&Node::default(), None), None);
    }

    #[test]
    fn unknown_node_gets_unreachable_taints_and_loses_them_when_ready_again() {
        let custom = taint("dedicated", EFFECT_NO_SCHEDULE, at(0));
        let tainted =
            desired_taints(std::slice::from_ref(&custom), Some("Unknown"), at(5)).unwrap();
        let keys: Vec<_> = tainted
            .iter()
            .map(|t| (t.key.as_str(), t.effect.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("dedicated", "NoSchedule"),
                (TAINT_UNREACHABLE, "NoSchedule"),
                (TAINT_UNREACHABLE, "NoExecute")
            ]
        );
        assert_eq!(desired_taints(&tainted, Some("Unknown"), at(9)), None);
        assert_eq!(
            desired_taints(&tainted, Some("True"), at(9)),
            Some(vec![custom])
        );
        assert_eq!(desired_taints(&tainted, None, at(9)), None);
    }

    #[test]
    fn out_of_service_forces_deletion_even_of_terminating_pods() {
        let oos = Taint {
            key: TAINT_OUT_OF_SERVICE.into(),
            value: Some("nodeshutdown".into()),
            effect: EFFECT_NO_EXECUTE.into(),
            time_added: None,
        };
        let mut pod = pod_with(vec![]);
        pod.metadata.deletion_timestamp = Some(time(at(0)));
        assert_eq!(
            pod_fate(&pod, std::slice::from_ref(&oos), 300, at(0)),
            PodFate::ForceDelete
        );
        let tolerant = pod_with(vec![Toleration {
            key: Some(TAINT_OUT_OF_SERVICE.into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        }]);
        assert_eq!(pod_fate(&tolerant, &[oos], 300, at(0)), PodFate::Keep);
    }

    #[test]
    fn unreachable_pods_are_evicted_after_their_toleration_seconds() {
        let unreachable = taint(TAINT_UNREACHABLE, EFFECT_NO_EXECUTE, at(100));
        // No explicit toleration: the admission default applies.
        assert_eq!(
            pod_fate(
                &pod_with(vec![]),
                std::slice::from_ref(&unreachable),
                300,
                at(0)
            ),
            PodFate::EvictAt(at(400))
        );
        let short = pod_with(vec![Toleration {
            key: Some(TAINT_UNREACHABLE.into()),
            operator: Some("Exists".into()),
            effect: Some(EFFECT_NO_EXECUTE.into()),
            toleration_seconds: Some(30),
            ..Toleration::default()
        }]);
        assert_eq!(
            pod_fate(&short, std::slice::from_ref(&unreachable), 300, at(0)),
            PodFate::EvictAt(at(130))
        );
        let other = taint("maintenance", EFFECT_NO_EXECUTE, at(100));
        assert_eq!(
            pod_fate(&pod_with(vec![]), &[other], 300, at(0)),
            PodFate::Evict
        );
    }
}

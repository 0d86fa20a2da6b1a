//! Pure scheduling predicates: does a pod fit a node? Mirrors the kube-scheduler filter plugins
//! NodeUnschedulable, NodeName, NodeAffinity (nodeSelector + required affinity), TaintToleration,
//! NodeResourcesFit and VolumeZone/VolumeBinding, in that order.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration, VolumeNodeAffinity,
};

use super::quantity;
use super::wellknown::{EFFECT_NO_EXECUTE, EFFECT_NO_SCHEDULE};

/// What the scheduler knows about one PVC volume of a pod.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ClaimState {
    Missing(String),
    /// Unbound, and its class binds immediately: the pod must wait for the binding.
    UnboundImmediate(String),
    /// Unbound with WaitForFirstConsumer: any node will do, the volume follows the pod.
    UnboundWaitForConsumer,
    /// Bound to a PV, which may be restricted to some nodes (its zone).
    Bound(Option<VolumeNodeAffinity>),
}

/// Why a node was rejected; the `Display` texts follow kube-scheduler's messages so that the
/// aggregated `PodScheduled` message reads like the real one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Misfit {
    NotReady,
    Unschedulable,
    NodeName,
    Selector,
    Taint(String),
    Insufficient(&'static str),
    VolumeAffinity,
    ClaimMissing(String),
    ClaimUnbound(String),
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misfit::NotReady => write!(f, "node(s) were not ready"),
            Misfit::Unschedulable => write!(f, "node(s) were unschedulable"),
            Misfit::NodeName => write!(f, "node(s) didn't match the requested node name"),
            Misfit::Selector => write!(f, "node(s) didn't match Pod's node affinity/selector"),
            Misfit::Taint(t) => write!(f, "node(s) had untolerated taint {{{t}}}"),
            Misfit::Insufficient(r) => write!(f, "Insufficient {r}"),
            Misfit::VolumeAffinity => write!(f, "node(s) had volume node affinity conflict"),
            Misfit::ClaimMissing(c) => write!(f, "persistentvolumeclaim \"{c}\" not found"),
            Misfit::ClaimUnbound(c) => {
                write!(f, "pod has unbound immediate PersistentVolumeClaims ({c})")
            }
        }
    }
}

pub(crate) fn node_ready(node: &Node) -> bool {
    node_condition(node, "Ready") == Some("True")
}

pub(crate) fn node_condition<'a>(node: &'a Node, type_: &str) -> Option<&'a str> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.as_str())
}

pub(crate) fn node_taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

pub(crate) fn pod_tolerations(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

/// Kubernetes' `Toleration.ToleratesTaint`.
pub(crate) fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref() {
        if !effect.is_empty() && effect != taint.effect {
            return false;
        }
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            // An empty key with Equal matches nothing (the apiserver rejects it anyway).
            !key.is_empty()
                && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// The first NoSchedule/NoExecute taint of `taints` that `tolerations` do not tolerate.
pub(crate) fn untolerated_taint<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
) -> Option<&'a Taint> {
    taints.iter().find(|taint| {
        (taint.effect == EFFECT_NO_SCHEDULE || taint.effect == EFFECT_NO_EXECUTE)
            && !tolerations.iter().any(|t| tolerates(t, taint))
    })
}

fn requirement_matches(req: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&req.key);
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if req.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn term_matches(
    term: &NodeSelectorTerm,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    // An empty term selects nothing (Kubernetes semantics).
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let field_values = BTreeMap::from([("metadata.name".to_string(), node_name.to_string())]);
    exprs.iter().all(|r| requirement_matches(r, labels))
        && fields.iter().all(|r| requirement_matches(r, &field_values))
}

/// Required node-selector terms are ORed; an absent selector matches every node.
pub(crate) fn terms_match(terms: &[NodeSelectorTerm], node: &Node) -> bool {
    let name = node.metadata.name.as_deref().unwrap_or("");
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    terms.iter().any(|t| term_matches(t, name, labels))
}

fn selector_and_affinity_match(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let selector_ok = spec
        .node_selector
        .as_ref()
        .is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok && required.is_none_or(|sel| terms_match(&sel.node_selector_terms, node))
}

/// Sum of container requests (init containers run before, so only their max counts).
pub(crate) fn pod_requests(pod: &Pod) -> BTreeMap<String, f64> {
    let mut total = BTreeMap::new();
    let Some(spec) = pod.spec.as_ref() else {
        return total;
    };
    let requests = |c: &k8s_openapi::api::core::v1::Container| -> BTreeMap<String, f64> {
        let resources = c.resources.as_ref();
        // Kubernetes defaults requests to limits when only limits are set.
        let source = resources
            .and_then(|r| r.requests.as_ref())
            .or_else(|| resources.and_then(|r| r.limits.as_ref()));
        source
            .map(|m| {
                m.iter()
                    .filter_map(|(k, q)| quantity::parse(&q.0).map(|v| (k.clone(), v)))
                    .collect()
            })
            .unwrap_or_default()
    };
    for c in &spec.containers {
        for (k, v) in requests(c) {
            *total.entry(k).or_insert(0.0) += v;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in requests(c) {
            let entry = total.entry(k).or_insert(0.0);
            *entry = entry.max(v);
        }
    }
    total
}

fn allocatable(node: &Node, resource: &str) -> Option<f64> {
    let q = node.status.as_ref()?.allocatable.as_ref()?.get(resource)?;
    quantity::parse(&q.0)
}

fn resources_fit(pod: &Pod, node: &Node, pods_on_node: &[&Pod]) -> Result<(), Misfit> {
    if let Some(max_pods) = allocatable(node, "pods") {
        if pods_on_node.len() as f64 + 1.0 > max_pods {
            return Err(Misfit::Insufficient("pods"));
        }
    }
    let wanted = pod_requests(pod);
    for (resource, label) in [("cpu", "cpu"), ("memory", "memory")] {
        let Some(want) = wanted.get(resource).copied().filter(|w| *w > 0.0) else {
            continue;
        };
        let Some(capacity) = allocatable(node, resource) else {
            continue;
        };
        let used: f64 = pods_on_node
            .iter()
            .filter_map(|p| pod_requests(p).get(resource).copied())
            .sum();
        if used + want > capacity + 1e-9 {
            return Err(Misfit::Insufficient(label));
        }
    }
    Ok(())
}

fn volumes_fit(claims: &[ClaimState], node: &Node) -> Result<(), Misfit> {
    for claim in claims {
        match claim {
            ClaimState::Missing(name) => return Err(Misfit::ClaimMissing(name.clone())),
            ClaimState::UnboundImmediate(name) => return Err(Misfit::ClaimUnbound(name.clone())),
            ClaimState::UnboundWaitForConsumer => {}
            ClaimState::Bound(affinity) => {
                let terms = affinity
                    .as_ref()
                    .and_then(|a| a.required.as_ref())
                    .map(|r| r.node_selector_terms.as_slice());
                if let Some(terms) = terms {
                    if !terms_match(terms, node) {
                        return Err(Misfit::VolumeAffinity);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Whether `pod` can run on `node`, given the pods already there and its volumes' state.
pub(crate) fn fits(
    pod: &Pod,
    node: &Node,
    pods_on_node: &[&Pod],
    claims: &[ClaimState],
) -> Result<(), Misfit> {
    if node.metadata.deletion_timestamp.is_some() || !node_ready(node) {
        return Err(Misfit::NotReady);
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Err(Misfit::Unschedulable);
    }
    if let Some(wanted) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        if Some(wanted) != node.metadata.name.as_deref() {
            return Err(Misfit::NodeName);
        }
    }
    if !selector_and_affinity_match(pod, node) {
        return Err(Misfit::Selector);
    }
    if let Some(taint) = untolerated_taint(node_taints(node), pod_tolerations(pod)) {
        let value = taint
            .value
            .as_deref()
            .map(|v| format!(": {v}"))
            .unwrap_or_default();
        return Err(Misfit::Taint(format!("{}{value}", taint.key)));
    }
    resources_fit(pod, node, pods_on_node)?;
    volumes_fit(claims, node)
}

/// kube-scheduler's summary, e.g. `0/3 nodes are available: 1 node(s) were unschedulable,
/// 2 node(s) didn't match Pod's node affinity/selector.`
pub(crate) fn unschedulable_message(total_nodes: usize, misfits: &[Misfit]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for m in misfits {
        *counts.entry(m.to_string()).or_insert(0) += 1;
    }
    if counts.is_empty() {
        return format!(
            "0/{total_nodes} nodes are available: no nodes available to schedule pods."
        );
    }
    let parts: Vec<String> = counts.iter().map(|(m, n)| format!("{n} {m}")).collect();
    format!("0/{total_nodes} nodes are available: {}.", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, Container, NodeAffinity, NodeCondition, NodeSelector, NodeSpec, NodeStatus,
        PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, zone: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    ("topology.kubernetes.io/zone".to_string(), zone.to_string()),
                    ("kubernetes.io/hostname".to_string(), name.to_string()),
                ])),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                allocatable: Some(BTreeMap::from([
                    ("cpu".to_string(), Quantity("2".into())),
                    ("memory".to_string(), Quantity("4Gi".into())),
                    ("pods".to_string(), Quantity("3".into())),
                ])),
                ..Default::default()
            }),
        }
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn toleration(
        key: Option<&str>,
        op: &str,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> Toleration {
        Toleration {
            key: key.map(Into::into),
            operator: Some(op.into()),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        }
    }

    fn zone_affinity(op: &str, zones: &[&str]) -> Affinity {
        Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "topology.kubernetes.io/zone".into(),
                            operator: op.into(),
                            values: Some(zones.iter().map(|z| z.to_string()).collect()),
                        }]),
                        match_fields: None,
                    }],
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn toleration_operators_follow_kubernetes_rules() {
        let t = taint("dedicated", Some("questdb"), "NoSchedule");
        assert!(tolerates(
            &toleration(Some("dedicated"), "Equal", Some("questdb"), None),
            &t
        ));
        assert!(!tolerates(
            &toleration(Some("dedicated"), "Equal", Some("other"), None),
            &t
        ));
        assert!(tolerates(
            &toleration(Some("dedicated"), "Exists", None, Some("NoSchedule")),
            &t
        ));
        assert!(!tolerates(
            &toleration(Some("dedicated"), "Exists", None, Some("NoExecute")),
            &t
        ));
        // Empty key + Exists is the wildcard toleration.
        assert!(tolerates(&toleration(None, "Exists", None, None), &t));
        assert!(!tolerates(
            &toleration(Some("other"), "Exists", None, None),
            &t
        ));
    }

    #[test]
    fn untolerated_noschedule_or_noexecute_taint_rejects_node_but_prefer_does_not() {
        let mut n = node("n1", "a");
        n.spec.as_mut().unwrap().taints = Some(vec![taint("soft", None, "PreferNoSchedule")]);
        assert_eq!(fits(&pod(), &n, &[], &[]), Ok(()));
        n.spec.as_mut().unwrap().taints = Some(vec![taint("dedicated", Some("db"), "NoExecute")]);
        assert_eq!(
            fits(&pod(), &n, &[], &[]),
            Err(Misfit::Taint("dedicated: db".into()))
        );
        let mut p = pod();
        p.spec.as_mut().unwrap().tolerations = Some(vec![toleration(
            Some("dedicated"),
            "Equal",
            Some("db"),
            None,
        )]);
        assert_eq!(fits(&p, &n, &[], &[]), Ok(()));
    }

    #[test]
    fn node_selector_and_required_affinity_are_both_enforced() {
        let n = node("n1", "us-east-1a");
        let mut p = pod();
        p.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
            "kubernetes.io/hostname".into(),
            "n2".into(),
        )]));
        assert_eq!(fits(&p, &n, &[], &[]), Err(Misfit::Selector));

        let mut p = pod();
        p.spec.as_mut().unwrap().affinity = Some(zone_affinity("In", &["us-east-1b"]));
        assert_eq!(fits(&p, &n, &[], &[]), Err(Misfit::Selector));
        p.spec.as_mut().unwrap().affinity = Some(zone_affinity("NotIn", &["us-east-1b"]));
        assert_eq!(fits(&p, &n, &[], &[]), Ok(()));
        p.spec.as_mut().unwrap().affinity = Some(zone_affinity("Exists", &[]));
        assert_eq!(fits(&p, &n, &[], &[]), Ok(()));
    }

    #[test]
    fn unready_or_cordoned_nodes_take_no_pods() {
        let mut n = node("n1", "a");
        n.spec.as_mut().unwrap().unschedulable = Some(true);
        assert_eq!(fits(&pod(), &n, &[], &[]), Err(Misfit::Unschedulable));
        let mut n = node("n1", "a");
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "Unknown".into();
        assert_eq!(fits(&pod(), &n, &[], &[]), Err(Misfit::NotReady));
    }

    #[test]
    fn bound_volume_pins_the_pod_to_its_zone() {
        let affinity = VolumeNodeAffinity {
            required: zone_affinity("In", &["us-east-1a"])
                .node_affinity
                .and_then(|a| a.required_during_scheduling_ignored_during_execution),
        };
        let claims = [ClaimState::Bound(Some(affinity))];
        assert_eq!(
            fits(&pod(), &node("a1", "us-east-1a"), &[], &claims),
            Ok(())
        );
        assert_eq!(
            fits(&pod(), &node("b1", "us-east-1b"), &[], &claims),
            Err(Misfit::VolumeAffinity)
        );
        assert_eq!(
            fits(
                &pod(),
                &node("b1", "us-east-1b"),
                &[],
                &[ClaimState::UnboundWaitForConsumer]
            ),
            Ok(())
        );
        assert_eq!(
            fits(
                &pod(),
                &node("b1", "us-east-1b"),
                &[],
                &[ClaimState::Missing("data".into())]
            ),
            Err(Misfit::ClaimMissing("data".into()))
        );
    }

    #[test]
    fn requests_beyond_allocatable_do_not_fit() {
        let mut big = pod();
        big.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "cpu".to_string(),
                Quantity("1500m".into()),
            )])),
            ..Default::default()
        });
        let n = node("n1", "a");
        assert_eq!(fits(&big, &n, &[], &[]), Ok(()));
        assert_eq!(
            fits(&big, &n, &[&big], &[]),
            Err(Misfit::Insufficient("cpu"))
        );
        let small = pod();
        assert_eq!(
            fits(&small, &n, &[&small, &small, &small], &[]),
            Err(Misfit::Insufficient("pods"))
        );
    }

    #[test]
    fn message_counts_reasons_like_kube_scheduler() {
        let msg = unschedulable_message(
            3,
            &[Misfit::Unschedulable, Misfit::Selector, Misfit::Selector],
        );
        assert_eq!(
            msg,
            "0/3 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 1 node(s) were unschedulable."
        );
        assert_eq!(
            unschedulable_message(0, &[]),
            "0/0 nodes are available: no nodes available to schedule pods."
        );
    }
}

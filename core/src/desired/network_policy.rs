//! The NetworkPolicy that admits clients to the database ports.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::labels::{child_meta, selector_labels};
use super::{names, HTTP_PORT, ILP_PORT, PGWIRE_PORT};
use crate::api::QuestDB;

/// `<name>`, selecting the database pod: HTTP, pgwire and ILP from `spec.networkPolicy.from`
/// (default: every pod of the namespace), nothing else. `None` when switched off.
pub fn network_policy(qdb: &QuestDB) -> Option<NetworkPolicy> {
    let spec = &qdb.spec.network_policy;
    if !spec.enabled {
        return None;
    }
    let from = if spec.from.is_empty() {
        // An empty podSelector without namespaceSelector: every pod of this namespace.
        vec![NetworkPolicyPeer {
            pod_selector: Some(LabelSelector::default()),
            ..NetworkPolicyPeer::default()
        }]
    } else {
        spec.from.clone()
    };
    let port = |p: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(p)),
        protocol: Some("TCP".to_string()),
        ..NetworkPolicyPort::default()
    };
    Some(NetworkPolicy {
        metadata: child_meta(qdb, names::network_policy(qdb)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(qdb)),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(from),
                ports: Some(vec![port(HTTP_PORT), port(PGWIRE_PORT), port(ILP_PORT)]),
            }]),
            ..NetworkPolicySpec::default()
        }),
    })
}

/// Label of the operator's own pods (deploy/operator).
pub const OPERATOR_POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "questdb-operator");

/// Adds a rule admitting the operator's pods in `operator_namespace` to the HTTP port only:
/// backups talk to the database (`CHECKPOINT CREATE`/`RELEASE`), and nothing else of the
/// operator's namespace gets in.
pub fn admit_operator(mut np: NetworkPolicy, operator_namespace: &str) -> NetworkPolicy {
    let peer = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(
                [(
                    "kubernetes.io/metadata.name".to_string(),
                    operator_namespace.to_string(),
                )]
                .into(),
            ),
            ..LabelSelector::default()
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(
                [(
                    OPERATOR_POD_LABEL.0.to_string(),
                    OPERATOR_POD_LABEL.1.to_string(),
                )]
                .into(),
            ),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    };
    if let Some(spec) = np.spec.as_mut() {
        spec.ingress
            .get_or_insert_with(Vec::new)
            .push(NetworkPolicyIngressRule {
                from: Some(vec![peer]),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(HTTP_PORT)),
                    protocol: Some("TCP".to_string()),
                    ..NetworkPolicyPort::default()
                }]),
            });
    }
    np
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testing::questdb;
    use crate::desired::HEALTH_PORT;

    fn rule(np: &NetworkPolicy) -> NetworkPolicyIngressRule {
        let spec = np.spec.clone().unwrap_or_default();
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        let rules = spec.ingress.unwrap_or_default();
        assert_eq!(rules.len(), 1);
        rules[0].clone()
    }

    #[test]
    fn by_default_only_the_own_namespace_reaches_the_database_ports() {
        let qdb = questdb("db1", "tenant-a");
        let np = network_policy(&qdb).expect("on by default");
        let selected = np.spec.as_ref().and_then(|s| s.pod_selector.clone());
        assert_eq!(
            selected.and_then(|s| s.match_labels),
            Some(selector_labels(&qdb))
        );
        let r = rule(&np);
        let from = r.from.unwrap_or_default();
        assert_eq!(from.len(), 1);
        assert_eq!(from[0].pod_selector, Some(LabelSelector::default()));
        assert_eq!(from[0].namespace_selector, None, "not other namespaces");
        let ports: Vec<IntOrString> = r
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| p.port)
            .collect();
        assert_eq!(
            ports,
            vec![
                IntOrString::Int(HTTP_PORT),
                IntOrString::Int(PGWIRE_PORT),
                IntOrString::Int(ILP_PORT)
            ]
        );
        assert!(!ports.contains(&IntOrString::Int(HEALTH_PORT)));
    }

    #[test]
    fn listed_peers_replace_the_default_and_off_means_none() {
        let mut qdb = questdb("db1", "tenant-a");
        let peer = NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("team".to_string(), "analytics".to_string())].into()),
                ..LabelSelector::default()
            }),
            ..NetworkPolicyPeer::default()
        };
        qdb.spec.network_policy.from = vec![peer.clone()];
        let np = network_policy(&qdb).expect("on");
        assert_eq!(rule(&np).from, Some(vec![peer]));
        qdb.spec.network_policy.enabled = false;
        assert_eq!(network_policy(&qdb), None);
    }

    #[test]
    fn the_operator_reaches_only_the_http_port_and_only_from_its_own_pods() {
        let qdb = questdb("db1", "tenant-a");
        let np = admit_operator(network_policy(&qdb).expect("on"), "questdb-operator");
        let rules = np.spec.unwrap().ingress.unwrap();
        assert_eq!(rules.len(), 2);
        let op = &rules[1];
        let ports = op.ports.clone().unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].port, Some(IntOrString::Int(HTTP_PORT)));
        let peer = &op.from.clone().unwrap()[0];
        let ns = peer
            .namespace_selector
            .clone()
            .unwrap()
            .match_labels
            .unwrap();
        assert_eq!(ns["kubernetes.io/metadata.name"], "questdb-operator");
        let pods = peer.pod_selector.clone().unwrap().match_labels.unwrap();
        assert_eq!(pods["app.kubernetes.io/name"], "questdb-operator");
    }
}

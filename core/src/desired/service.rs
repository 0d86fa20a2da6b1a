//! The two Services: a headless one that gives the pod a stable DNS name, and the ClusterIP one
//! clients use.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::labels::{child_meta, selector_labels, service_annotations};
use super::{names, port_names, HEALTH_PORT, HTTP_PORT, ILP_PORT, PGWIRE_PORT};
use crate::api::QuestDB;

/// A Service's metadata: as every child's, with only the annotations monitoring reads.
fn service_meta(
    qdb: &QuestDB,
    name: String,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    let annotations = service_annotations(qdb);
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..child_meta(qdb, name)
    }
}

/// `<name>-headless`: the StatefulSet's governing Service. It publishes the pod before it is
/// Ready so the pod's DNS name resolves during a long startup (WAL replay), and carries the
/// health port so monitoring can reach `/status` through it.
pub fn headless_service(qdb: &QuestDB) -> Service {
    Service {
        metadata: service_meta(qdb, names::headless_service(qdb)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(qdb)),
            ports: Some(vec![
                port(port_names::HTTP, HTTP_PORT),
                port(port_names::PGWIRE, PGWIRE_PORT),
                port(port_names::ILP, ILP_PORT),
                port(port_names::HEALTH, HEALTH_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// `<name>`: the ClusterIP Service for clients, with only the protocols clients speak, and only
/// a Ready pod behind it.
pub fn client_service(qdb: &QuestDB) -> Service {
    Service {
        metadata: service_meta(qdb, names::client_service(qdb)),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(selector_labels(qdb)),
            ports: Some(vec![
                port(port_names::HTTP, HTTP_PORT),
                port(port_names::PGWIRE, PGWIRE_PORT),
                port(port_names::ILP, ILP_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// A TCP port that targets the container port of the same name, so a port number change needs
/// no Service edit.
fn port(name: &str, number: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_string()),
        port: number,
        target_port: Some(IntOrString::String(name.to_string())),
        protocol: Some("TCP".to_string()),
        ..ServicePort::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::labels::{child_labels, owner_references};
    use crate::desired::testing::questdb;

    /// The harm: a tenant publishing a DNS name outside the namespaced rule (external-dns
    /// reads a Service's hostname annotation) or opening a cloud load balancer through the
    /// operator's Services. Only monitoring's annotations reach them.
    #[test]
    fn a_tenants_annotations_reach_the_services_only_for_monitoring() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.metadata.annotations = Some(
            [
                (
                    "external-dns.alpha.kubernetes.io/hostname",
                    "bank.example.com",
                ),
                (
                    "service.beta.kubernetes.io/aws-load-balancer-type",
                    "external",
                ),
                ("prometheus.io/scrape", "true"),
                ("team", "payments"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        for svc in [headless_service(&qdb), client_service(&qdb)] {
            let keys: Vec<String> = svc
                .metadata
                .annotations
                .clone()
                .unwrap_or_default()
                .into_keys()
                .collect();
            assert_eq!(keys, ["prometheus.io/scrape"], "{:?}", svc.metadata.name);
        }
        // Without any, no annotations at all (server-side apply then owns none).
        assert_eq!(
            client_service(&questdb("db1", "tenant-a"))
                .metadata
                .annotations,
            None
        );
    }

    fn ports(svc: &Service) -> Vec<(String, i32, Option<IntOrString>)> {
        svc.spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.name.unwrap_or_default(), p.port, p.target_port))
            .collect()
    }

    fn named(name: &str, port: i32) -> (String, i32, Option<IntOrString>) {
        (
            name.to_string(),
            port,
            Some(IntOrString::String(name.to_string())),
        )
    }

    #[test]
    fn headless_service_publishes_not_ready_pods_on_all_four_ports() {
        let qdb = questdb("db1", "tenant-a");
        let svc = headless_service(&qdb);
        assert_eq!(svc.metadata.name.as_deref(), Some("db1-headless"));
        assert_eq!(svc.metadata.owner_references, Some(owner_references(&qdb)));
        assert_eq!(svc.metadata.labels, Some(child_labels(&qdb)));
        let spec = svc.spec.clone().unwrap_or_default();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(spec.selector, Some(selector_labels(&qdb)));
        assert_eq!(
            ports(&svc),
            vec![
                named("http", 9000),
                named("pgwire", 8812),
                named("ilp", 9009),
                named("health", 9003)
            ]
        );
    }

    #[test]
    fn client_service_exposes_the_three_client_protocols() {
        let qdb = questdb("db1", "tenant-a");
        let svc = client_service(&qdb);
        assert_eq!(svc.metadata.name.as_deref(), Some("db1"));
        assert_eq!(svc.metadata.owner_references, Some(owner_references(&qdb)));
        let spec = svc.spec.clone().unwrap_or_default();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.cluster_ip, None);
        assert_eq!(spec.publish_not_ready_addresses, None);
        assert_eq!(spec.selector, Some(selector_labels(&qdb)));
        assert_eq!(
            ports(&svc),
            vec![
                named("http", 9000),
                named("pgwire", 8812),
                named("ilp", 9009)
            ]
        );
    }

    #[test]
    fn user_labels_never_reach_a_service_selector() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.metadata.labels = Some([("team".to_string(), "x".to_string())].into());
        for svc in [headless_service(&qdb), client_service(&qdb)] {
            let selector = svc.spec.and_then(|s| s.selector).unwrap_or_default();
            assert!(!selector.contains_key("team"));
        }
    }
}

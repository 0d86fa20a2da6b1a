//! The `Node` a kubelet registers, its heartbeat conditions and its Lease (pure builders).

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec as K8sNodeSpec, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

use super::config::{ClusterConfig, NodeSpec};
use super::runtime::{micro_time, time};
use super::wellknown::*;

/// The address the simulated node reports when its spec names none: unique per node index.
pub(crate) fn default_internal_ip(index: u32) -> String {
    format!("10.0.{}.{}", index / 250, index % 250 + 4)
}

/// Pod addresses come from a per-node /24, as with a typical CNI.
pub(crate) fn pod_cidr(index: u32) -> (String, String) {
    let prefix = format!("10.{}.{}", 244 + index / 256, index % 256);
    (format!("{prefix}.0/24"), prefix)
}

/// Region of an AWS-style zone name (`us-east-1a` → `us-east-1`); other names are kept whole.
pub(crate) fn region_of(zone: &str) -> &str {
    match zone.char_indices().last() {
        Some((i, c))
            if c.is_ascii_lowercase() && zone[..i].ends_with(|d: char| d.is_ascii_digit()) =>
        {
            &zone[..i]
        }
        _ => zone,
    }
}

pub(crate) fn node_labels(spec: &NodeSpec) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (LABEL_HOSTNAME.to_string(), spec.name.clone()),
        (LABEL_OS.to_string(), "linux".to_string()),
        (LABEL_ARCH.to_string(), "amd64".to_string()),
        (LABEL_ZONE.to_string(), spec.zone.clone()),
        (LABEL_REGION.to_string(), region_of(&spec.zone).to_string()),
    ]);
    labels.extend(spec.labels.clone());
    labels
}

/// Ready=True plus the pressure conditions, keeping transition times when nothing changed.
pub(crate) fn healthy_conditions(
    now: SystemTime,
    previous: &[NodeCondition],
) -> Vec<NodeCondition> {
    let now = time(now);
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        let transition = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        NodeCondition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(transition),
        }
    };
    vec![
        condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        condition(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        condition(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        condition(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
        ),
    ]
}

/// What the node lifecycle controller writes when a kubelet goes silent: every condition
/// Unknown, last heartbeat kept.
pub(crate) fn unknown_conditions(
    now: SystemTime,
    previous: &[NodeCondition],
) -> Vec<NodeCondition> {
    let now: Time = time(now);
    ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .into_iter()
        .map(|type_| {
            let old = previous.iter().find(|c| c.type_ == type_);
            NodeCondition {
                type_: type_.to_string(),
                status: "Unknown".to_string(),
                reason: Some("NodeStatusUnknown".to_string()),
                message: Some("Kubelet stopped posting node status.".to_string()),
                last_heartbeat_time: old.and_then(|c| c.last_heartbeat_time.clone()),
                last_transition_time: Some(now.clone()),
            }
        })
        .collect()
}

pub(crate) fn node_object(
    spec: &NodeSpec,
    index: u32,
    cfg: &ClusterConfig,
    now: SystemTime,
) -> Node {
    let (cidr, _) = pod_cidr(index);
    let ip = spec
        .internal_ip
        .clone()
        .unwrap_or_else(|| default_internal_ip(index));
    let cap = &cfg.node_capacity;
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity(cap.cpu.clone())),
        ("memory".to_string(), Quantity(cap.memory.clone())),
        ("pods".to_string(), Quantity(cap.pods.to_string())),
        (
            "ephemeral-storage".to_string(),
            Quantity(cap.ephemeral_storage.clone()),
        ),
    ]);
    let taints = spec
        .taints
        .iter()
        .cloned()
        .map(|mut t| {
            if t.effect == EFFECT_NO_EXECUTE && t.time_added.is_none() {
                t.time_added = Some(time(now));
            }
            t
        })
        .collect::<Vec<_>>();
    Node {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            labels: Some(node_labels(spec)),
            annotations: Some(BTreeMap::from([(
                "node.alpha.kubernetes.io/ttl".to_string(),
                "0".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(K8sNodeSpec {
            provider_id: spec.provider_id.clone(),
            pod_cidr: Some(cidr.clone()),
            pod_cidrs: Some(vec![cidr]),
            taints: (!taints.is_empty()).then_some(taints),
            ..K8sNodeSpec::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".to_string(),
                    address: ip,
                },
                NodeAddress {
                    type_: "Hostname".to_string(),
                    address: spec.name.clone(),
                },
            ]),
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            conditions: Some(healthy_conditions(now, &[])),
            daemon_endpoints: Some(NodeDaemonEndpoints::default()),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".to_string(),
                boot_id: format!("boot-{index}"),
                container_runtime_version: "containerd://1.7.27".to_string(),
                kernel_version: "6.1.0-sim".to_string(),
                kube_proxy_version: cfg.kubelet_version.clone(),
                kubelet_version: cfg.kubelet_version.clone(),
                machine_id: format!("sim-machine-{index}"),
                operating_system: "linux".to_string(),
                os_image: "Simulated Linux".to_string(),
                system_uuid: format!("sim-uuid-{index}"),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

/// The node's Lease in `kube-node-lease`, owned by the Node so it goes when the Node goes.
pub(crate) fn node_lease(
    node: &str,
    node_uid: Option<&str>,
    cfg: &ClusterConfig,
    now: SystemTime,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            namespace: Some(NODE_LEASE_NAMESPACE.to_string()),
            owner_references: node_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".to_string(),
                    kind: "Node".to_string(),
                    name: node.to_string(),
                    uid: uid.to_string(),
                    ..OwnerReference::default()
                }]
            }),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_string()),
            lease_duration_seconds: Some(cfg.node_grace_period.as_secs() as i32),
            renew_time: Some(micro_time(now)),
            ..LeaseSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn cloud_node_carries_provider_id_zone_labels_and_registration_taints() {
        let spec = NodeSpec::aws_instance("ip-10-0-1-5", "us-east-1b", "i-0abc")
            .with_label("node.kubernetes.io/instance-type", "m6i.large")
            .with_taint("questdb.io/dedicated", Some("db1"), "NoSchedule");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let node = node_object(&spec, 3, &ClusterConfig::default(), now);
        let labels = node.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_ZONE], "us-east-1b");
        assert_eq!(labels[LABEL_REGION], "us-east-1");
        assert_eq!(labels[LABEL_HOSTNAME], "ip-10-0-1-5");
        assert_eq!(labels["node.kubernetes.io/instance-type"], "m6i.large");
        let node_spec = node.spec.unwrap();
        assert_eq!(
            node_spec.provider_id.as_deref(),
            Some("aws:///us-east-1b/i-0abc")
        );
        assert_eq!(node_spec.taints.unwrap()[0].key, "questdb.io/dedicated");
        let status = node.status.unwrap();
        let addresses = status.addresses.unwrap();
        assert_eq!(addresses[0].type_, "InternalIP");
        assert_eq!(addresses[0].address, default_internal_ip(3));
        assert!(status.allocatable.unwrap().contains_key("cpu"));
    }

    #[test]
    fn nodes_get_distinct_addresses_and_pod_ranges() {
        assert_ne!(default_internal_ip(1), default_internal_ip(2));
        assert_ne!(default_internal_ip(1), default_internal_ip(251));
        assert_ne!(pod_cidr(1).0, pod_cidr(257).0);
    }

    #[test]
    fn region_strips_the_zone_letter_only_for_aws_style_zones() {
        assert_eq!(region_of("eu-west-3c"), "eu-west-3");
        assert_eq!(region_of("zone-a"), "zone-a");
        assert_eq!(region_of(""), "");
    }

    #[test]
    fn heartbeat_keeps_transition_time_but_refreshes_heartbeat() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let t1 = t0 + Duration::from_secs(10);
        let first = healthy_conditions(t0, &[]);
        let second = healthy_conditions(t1, &first);
        let ready = second.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.last_transition_time, Some(time(t0)));
        assert_eq!(ready.last_heartbeat_time, Some(time(t1)));
        let unknown = unknown_conditions(t1, &second);
        let ready = unknown.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "Unknown");
        assert_eq!(ready.last_heartbeat_time, Some(time(t1)));
        assert_eq!(ready.last_transition_time, Some(time(t1)));
    }
}

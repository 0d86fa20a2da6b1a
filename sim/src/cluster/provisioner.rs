//! The PV controller plus a CSI external-provisioner: dynamic provisioning in a zone, binding
//! PVCs and PVs both ways, volume expansion, and reclaiming PVs whose claim is gone.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::quantity;
use super::runtime::{is_status, PassOutcome, Shared};
use super::volumes::{claim_class, waits_for_first_consumer};
use super::wellknown::*;

/// Does the PV's claimRef point at this claim (by name, and by uid when it has one)?
pub(crate) fn claim_ref_matches(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let Some(claim) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    claim.name == pvc.metadata.name
        && claim.namespace == pvc.metadata.namespace
        && (claim.uid.is_none() || claim.uid == pvc.metadata.uid)
}

/// The zone to provision in: the selected node's for WaitForFirstConsumer, else the class's
/// allowed topology, else the first zone of the cluster.
pub(crate) fn provision_zone(
    class: &StorageClass,
    selected_node_zone: Option<&str>,
    cluster_zones: &BTreeSet<String>,
) -> Option<String> {
    if waits_for_first_consumer(class) {
        return selected_node_zone.map(str::to_string);
    }
    let allowed = class
        .allowed_topologies
        .iter()
        .flatten()
        .flat_map(|t| t.match_label_expressions.iter().flatten())
        .find(|e| e.key == LABEL_ZONE)
        .and_then(|e| e.values.first().cloned());
    allowed.or_else(|| cluster_zones.iter().next().cloned())
}

fn requested_storage(pvc: &PersistentVolumeClaim) -> Option<Quantity> {
    pvc.spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .cloned()
}

fn pv_storage(pv: &PersistentVolume) -> Option<Quantity> {
    pv.spec.as_ref()?.capacity.as_ref()?.get("storage").cloned()
}

pub(crate) fn new_pv(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    zone: &str,
    volume_handle: &str,
) -> PersistentVolume {
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let spec = pvc.spec.clone().unwrap_or_default();
    let size = requested_storage(pvc).unwrap_or_else(|| Quantity("1Gi".to_string()));
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(format!("pvc-{uid}")),
            annotations: Some(BTreeMap::from([(
                PROVISIONED_BY_ANNOTATION.to_string(),
                class.provisioner.clone(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: spec.access_modes.clone(),
            capacity: Some(BTreeMap::from([("storage".to_string(), size)])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("PersistentVolumeClaim".to_string()),
                name: pvc.metadata.name.clone(),
                namespace: pvc.metadata.namespace.clone(),
                uid: pvc.metadata.uid.clone(),
                resource_version: pvc.metadata.resource_version.clone(),
                ..ObjectReference::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: class.provisioner.clone(),
                volume_handle: volume_handle.to_string(),
                fs_type: Some("ext4".to_string()),
                ..CSIPersistentVolumeSource::default()
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: LABEL_ZONE.to_string(),
                            operator: "In".to_string(),
                            values: Some(vec![zone.to_string()]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            persistent_volume_reclaim_policy: Some(
                class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".to_string()),
            ),
            storage_class_name: class.metadata.name.clone(),
            volume_mode: spec.volume_mode.or_else(|| Some("Filesystem".to_string())),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

/// An EBS-like volume id: `vol-` and 17 hex digits.
fn new_volume_handle() -> String {
    format!("vol-0{:016x}", rand::random::<u64>())
}

pub(crate) struct Provisioner {
    shared: Arc<Shared>,
}

impl Provisioner {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn cluster_zones(&self) -> BTreeSet<String> {
        let from_nodes: BTreeSet<String> = self
            .shared
            .stores
            .nodes
            .state()
            .iter()
            .filter_map(|n| n.metadata.labels.as_ref()?.get(LABEL_ZONE).cloned())
            .collect();
        if from_nodes.is_empty() {
            self.shared
                .config
                .nodes
                .iter()
                .map(|n| n.zone.clone())
                .collect()
        } else {
            from_nodes
        }
    }

    async fn pass_once(&mut self) -> PassOutcome {
        let mut out = PassOutcome::default();
        let shared = self.shared.clone();
        let pvs = shared.stores.pvs.state();
        let pvcs = shared.stores.pvcs.state();
        for pvc in &pvcs {
            self.sync_claim(pvc, &pvs, &mut out).await;
        }
        let claim_uids: HashSet<&str> = pvcs
            .iter()
            .filter_map(|c| c.metadata.uid.as_deref())
            .collect();
        let attached_pvs: HashSet<String> = shared
            .stores
            .attachments
            .state()
            .iter()
            .filter_map(|va| va.spec.source.persistent_volume_name.clone())
            .collect();
        for pv in &pvs {
            self.sync_volume(pv, &claim_uids, &attached_pvs, &mut out)
                .await;
        }
        out
    }

    async fn sync_claim(
        &self,
        pvc: &PersistentVolumeClaim,
        pvs: &[Arc<PersistentVolume>],
        out: &mut PassOutcome,
    ) {
        let shared = &self.shared;
        let namespace = pvc.metadata.namespace.as_deref().unwrap_or("default");
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(shared.client.clone(), namespace);
        let volumes: Api<PersistentVolume> = Api::all(shared.client.clone());

        if let Some(volume_name) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()) {
            let Some(pv) = shared.stores.pv(&volume_name) else {
                return;
            };
            let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
            let claimed_by_us =
                claim_ref.is_some_and(|c| c.uid == pvc.metadata.uid) && claim_ref_matches(&pv, pvc);
            if !claimed_by_us {
                if claim_ref.is_none() || claim_ref_matches(&pv, pvc) {
                    // Pre-bound claim: complete the PV's side.
                    let patch = json!({
                        "metadata": {"resourceVersion": pv.metadata.resource_version},
                        "spec": {"claimRef": {
                            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                            "name": name, "namespace": namespace, "uid": pvc.metadata.uid,
                        }},
                    });
                    out.record(
                        "claim PV for pre-bound PVC",
                        volumes
                            .patch(&volume_name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await,
                    );
                }
                return;
            }
            self.expand_if_requested(pvc, &pv, out).await;
            let pv_phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
            if pv_phase != Some("Bound") {
                let patch = json!({"status": {"phase": "Bound"}});
                out.record(
                    "mark PV Bound",
                    volumes
                        .patch_status(&volume_name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await,
                );
            }
            let status = pvc.status.clone().unwrap_or_default();
            let capacity = pv.spec.as_ref().and_then(|s| s.capacity.clone());
            let access_modes = pv.spec.as_ref().and_then(|s| s.access_modes.clone());
            if status.phase.as_deref() != Some("Bound")
                || status.capacity != capacity
                || status.access_modes != access_modes
            {
                let patch = json!({"status": {
                    "phase": "Bound", "capacity": capacity, "accessModes": access_modes,
                }});
                out.record(
                    "mark PVC Bound",
                    claims
                        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await,
                );
            }
            return;
        }

        if let Some(pv) = pvs.iter().find(|pv| claim_ref_matches(pv, pvc)) {
            let patch = json!({
                "metadata": {
                    "resourceVersion": pvc.metadata.resource_version,
                    "annotations": {BIND_COMPLETED_ANNOTATION: "yes", BOUND_BY_CONTROLLER_ANNOTATION: "yes"},
                },
                "spec": {"volumeName": pv.metadata.name},
            });
            out.record(
                "bind PVC to PV",
                claims
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            );
            return;
        }
        if pvc.metadata.deletion_timestamp.is_some() {
            return;
        }
        let Some(class) = claim_class(&shared.stores, pvc) else {
            return;
        };
        if class.provisioner != shared.config.csi_driver {
            return;
        }
        let selected_zone = pvc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SELECTED_NODE_ANNOTATION))
            .and_then(|node| shared.stores.node(node))
            .and_then(|node| node.metadata.labels.as_ref()?.get(LABEL_ZONE).cloned());
        let Some(zone) = provision_zone(&class, selected_zone.as_deref(), &self.cluster_zones())
        else {
            return;
        };
        let pv = new_pv(pvc, &class, &zone, &new_volume_handle());
        match volumes.create(&PostParams::default(), &pv).await {
            // Already provisioned; the cache just has not shown it yet.
            Err(err) if is_status(&err, 409) => {}
            other => {
                out.record("provision PV", other);
            }
        }
    }

    async fn expand_if_requested(
        &self,
        pvc: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        out: &mut PassOutcome,
    ) {
        let (Some(wanted), Some(current)) = (requested_storage(pvc), pv_storage(pv)) else {
            return;
        };
        let bigger = match (quantity::parse(&wanted.0), quantity::parse(&current.0)) {
            (Some(w), Some(c)) => w > c,
            _ => false,
        };
        let expandable = claim_class(&self.shared.stores, pvc)
            .is_some_and(|c| c.allow_volume_expansion == Some(true));
        if !bigger || !expandable {
            return;
        }
        let volumes: Api<PersistentVolume> = Api::all(self.shared.client.clone());
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let patch = json!({"spec": {"capacity": {"storage": wanted}}});
        out.record(
            "expand PV",
            volumes
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        );
    }

    async fn sync_volume(
        &self,
        pv: &PersistentVolume,
        claim_uids: &HashSet<&str>,
        attached_pvs: &HashSet<String>,
        out: &mut PassOutcome,
    ) {
        let shared = &self.shared;
        let volumes: Api<PersistentVolume> = Api::all(shared.client.clone());
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let Some(claim_uid) = claim_ref.and_then(|c| c.uid.as_ref()) else {
            if claim_ref.is_none() && phase != Some("Available") {
                let patch = json!({"status": {"phase": "Available"}});
                out.record(
                    "mark PV Available",
                    volumes
                        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await,
                );
            }
            return;
        };
        let claim_exists = claim_uids.contains(claim_uid.as_str());
        if claim_exists || pv.metadata.deletion_timestamp.is_some() {
            return;
        }
        let policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            .unwrap_or("Retain");
        let attached = attached_pvs.contains(name);
        if policy == "Delete" && !attached {
            match volumes.delete(name, &DeleteParams::default()).await {
                Err(err) if is_status(&err, 404) => {}
                other => {
                    out.record("delete released PV", other);
                }
            }
        } else if phase != Some("Released") {
            let patch = json!({"status": {"phase": "Released"}});
            out.record(
                "mark PV Released",
                volumes
                    .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            );
        }
    }
}

impl super::runtime::Reconciler for Provisioner {
    fn pass(&mut self) -> impl std::future::Future<Output = PassOutcome> + Send {
        self.pass_once()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, TopologySelectorLabelRequirement, TopologySelectorTerm,
        VolumeResourceRequirements,
    };

    fn class(wait: bool) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("gp3".into()),
                ..Default::default()
            },
            provisioner: "ebs.csi.aws.com".into(),
            volume_binding_mode: Some(
                if wait {
                    "WaitForFirstConsumer"
                } else {
                    "Immediate"
                }
                .into(),
            ),
            reclaim_policy: Some("Retain".into()),
            ..Default::default()
        }
    }

    fn claim() -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data-db-0".into()),
                namespace: Some("prod".into()),
                uid: Some("1234".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity("50Gi".into()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn wait_for_first_consumer_provisions_only_in_the_selected_nodes_zone() {
        let zones = BTreeSet::from(["a".to_string(), "b".to_string()]);
        assert_eq!(provision_zone(&class(true), None, &zones), None);
        assert_eq!(
            provision_zone(&class(true), Some("b"), &zones),
            Some("b".into())
        );
        assert_eq!(
            provision_zone(&class(false), None, &zones),
            Some("a".into())
        );
        let mut pinned = class(false);
        pinned.allowed_topologies = Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: LABEL_ZONE.into(),
                values: vec!["b".into()],
            }]),
        }]);
        assert_eq!(provision_zone(&pinned, None, &zones), Some("b".into()));
    }

    #[test]
    fn provisioned_pv_is_prebound_zonal_and_sized_like_the_claim() {
        let pv = new_pv(&claim(), &class(true), "us-east-1a", "vol-0abc");
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-1234"));
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(
            spec.capacity.as_ref().unwrap()["storage"],
            Quantity("50Gi".into())
        );
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        let csi = spec.csi.as_ref().unwrap();
        assert_eq!(
            (csi.driver.as_str(), csi.volume_handle.as_str()),
            ("ebs.csi.aws.com", "vol-0abc")
        );
        let term = &spec
            .node_affinity
            .as_ref()
            .unwrap()
            .required
            .as_ref()
            .unwrap()
            .node_selector_terms[0];
        let req = &term.match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (req.key.as_str(), req.values.as_ref().unwrap()[0].as_str()),
            (LABEL_ZONE, "us-east-1a")
        );
        assert!(claim_ref_matches(&pv, &claim()));
        let mut other = claim();
        other.metadata.uid = Some("9999".into());
        assert!(!claim_ref_matches(&pv, &other));
    }

    #[test]
    fn volume_handles_look_like_ebs_ids_and_differ() {
        let a = new_volume_handle();
        assert!(a.starts_with("vol-") && a.len() == 21, "{a}");
        assert_ne!(a, new_volume_handle());
    }
}

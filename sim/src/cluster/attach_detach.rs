//! The attach/detach controller plus a CSI external-attacher: VolumeAttachments for the PVs of
//! pods placed on nodes, attached after a delay, detached (finalizer released) after a delay once
//! nothing on a live node uses them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::runtime::{remaining, PassOutcome, Shared, Since};
use super::scheduling::node_taints;
use super::volumes::{csi_source, pod_bound_volumes, pod_is_terminal, pod_volumes};
use super::wellknown::TAINT_OUT_OF_SERVICE;

/// The name Kubernetes' CSI attacher gives a VolumeAttachment (pkg/volume/csi/csi_attacher.go):
/// no separators between the parts, and the node's *name*.
pub fn volume_attachment_name(volume_handle: &str, driver: &str, node_name: &str) -> String {
    let digest = Sha256::digest(format!("{volume_handle}{driver}{node_name}").as_bytes());
    format!("csi-{}", hex::encode(digest))
}

/// The finalizer the external-attacher puts on its VolumeAttachments; removing it is "detached".
pub(crate) fn attacher_finalizer(driver: &str) -> String {
    format!("external-attacher/{}", driver.replace('.', "-"))
}

/// Does a pod on `node` keep its volumes attached there? Not once the node is gone or declared
/// out of service (non-graceful shutdown), and not once the pod has finished.
pub(crate) fn pod_holds_volumes(pod: &Pod, node: Option<&Node>) -> bool {
    let Some(node) = node else {
        return false;
    };
    !pod_is_terminal(pod)
        && !node_taints(node)
            .iter()
            .any(|t| t.key == TAINT_OUT_OF_SERVICE)
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Wanted {
    pub pv: String,
    pub node: String,
    pub handle: String,
}

/// Whether the volume may be attached to `node` now: ReadWriteOnce, so never while any
/// attachment of it to another node (attached, attaching or detaching) still exists.
pub(crate) fn may_attach<'a>(
    pv: &str,
    node: &str,
    mut existing: impl Iterator<Item = (&'a str, &'a str)>,
) -> bool {
    !existing.any(|(other_pv, other_node)| other_pv == pv && other_node != node)
}

pub(crate) struct AttachDetach {
    shared: Arc<Shared>,
    /// Attachments waiting to report `attached`.
    attaching: Since<String>,
    /// Attachments no longer wanted, waiting for their detach delay.
    unneeded: Since<String>,
}

impl AttachDetach {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            attaching: Since::new(),
            unneeded: Since::new(),
        }
    }

    fn desired(&self) -> BTreeSet<Wanted> {
        let stores = &self.shared.stores;
        let driver = &self.shared.config.csi_driver;
        let mut wanted = BTreeSet::new();
        for pod in stores.pods.state() {
            let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
                continue;
            };
            if !pod_holds_volumes(&pod, stores.node(node_name).as_deref()) {
                continue;
            }
            for pv in pod_bound_volumes(stores, &pod) {
                if let Some((d, handle)) = csi_source(&pv) {
                    if d == driver {
                        wanted.insert(Wanted {
                            pv: pv.metadata.name.clone().unwrap_or_default(),
                            node: node_name.to_string(),
                            handle: handle.to_string(),
                        });
                    }
                }
            }
        }
        wanted
    }

    async fn pass_once(&mut self) -> PassOutcome {
        let mut out = PassOutcome::default();
        let shared = self.shared.clone();
        let cfg = &shared.config;
        let now = shared.now();
        let api: Api<VolumeAttachment> = Api::all(shared.client.clone());
        let desired = self.desired();
        let existing: Vec<Arc<VolumeAttachment>> = shared
            .stores
            .attachments
            .state()
            .into_iter()
            .filter(|va| va.spec.attacher == cfg.csi_driver)
            .collect();
        let existing_keys: BTreeMap<(String, String), Arc<VolumeAttachment>> = existing
            .iter()
            .filter_map(|va| {
                let pv = va.spec.source.persistent_volume_name.clone()?;
                Some(((pv, va.spec.node_name.clone()), va.clone()))
            })
            .collect();

        for want in &desired {
            let key = (want.pv.clone(), want.node.clone());
            let name = volume_attachment_name(&want.handle, &cfg.csi_driver, &want.node);
            match existing_keys.get(&key) {
                None => {
                    let others = existing_keys.keys().map(|(p, n)| (p.as_str(), n.as_str()));
                    if !may_attach(&want.pv, &want.node, others) {
                        // Multi-Attach: wait for the other node's attachment to vanish.
                        continue;
                    }
                    let va = new_attachment(&name, &cfg.csi_driver, &want.pv, &want.node);
                    out.record(
                        "create VolumeAttachment",
                        api.create(&PostParams::default(), &va).await,
                    );
                }
                Some(va) if va.metadata.deletion_timestamp.is_none() => {
                    self.unneeded.forget(&name);
                    let attached = va.status.as_ref().is_some_and(|s| s.attached);
                    if attached {
                        self.attaching.forget(&name);
                        continue;
                    }
                    let waited = self.attaching.observe(&name, now);
                    let left = remaining(cfg.attach_delay, waited);
                    if left.is_zero() {
                        let patch = json!({"status": {"attached": true}});
                        let written = api
                            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await;
                        if out
                            .record("mark VolumeAttachment attached", written)
                            .is_some()
                        {
                            self.attaching.forget(&name);
                        }
                    } else {
                        out.requeue(left);
                    }
                }
                // Being detached; the pod has to wait until it is gone and attaches anew.
                Some(_) => {}
            }
        }

        for va in &existing {
            let name = va.metadata.name.clone().unwrap_or_default();
            let key = va
                .spec
                .source
                .persistent_volume_name
                .clone()
                .map(|pv| (pv, va.spec.node_name.clone()));
            let still_wanted = key
                .as_ref()
                .is_some_and(|(pv, node)| desired.iter().any(|w| &w.pv == pv && &w.node == node));
            if still_wanted && va.metadata.deletion_timestamp.is_none() {
                continue;
            }
            self.attaching.forget(&name);
            let waited = self.unneeded.observe(&name, now);
            if va.metadata.deletion_timestamp.is_none() {
                // Like the real controller, delete at once; the attacher's finalizer holds the
                // object until the (simulated) detach is done.
                out.record(
                    "delete VolumeAttachment",
                    api.delete(&name, &DeleteParams::default()).await,
                );
                out.requeue(cfg.detach_delay);
                continue;
            }
            let left = remaining(cfg.detach_delay, waited);
            if !left.is_zero() {
                out.requeue(left);
                continue;
            }
            let finalizer = attacher_finalizer(&cfg.csi_driver);
            let remaining_finalizers: Vec<String> = va
                .metadata
                .finalizers
                .iter()
                .flatten()
                .filter(|f| **f != finalizer)
                .cloned()
                .collect();
            let patch = json!({"metadata": {
                "finalizers": remaining_finalizers,
                "resourceVersion": va.metadata.resource_version,
            }});
            out.record(
                "release VolumeAttachment finalizer",
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            );
        }

        let live: BTreeSet<String> = existing
            .iter()
            .filter_map(|va| va.metadata.name.clone())
            .collect();
        self.attaching.retain(|n| live.contains(n));
        self.unneeded.retain(|n| live.contains(n));
        out
    }
}

fn new_attachment(name: &str, driver: &str, pv: &str, node: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            finalizers: Some(vec![attacher_finalizer(driver)]),
            ..ObjectMeta::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: driver.to_string(),
            node_name: node.to_string(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.to_string()),
                inline_volume_spec: None,
            },
        },
        status: None,
    }
}

/// Whether every PVC volume of `pod` is attached to `node` (what the kubelet waits for before
/// starting containers). Non-CSI volumes need no attachment.
pub(crate) fn pod_volumes_attached(shared: &Shared, pod: &Pod, node: &str) -> bool {
    let Some(pvs) = pod_volumes(&shared.stores, pod) else {
        return false;
    };
    pvs.iter().all(|pv| {
        let Some((driver, handle)) = csi_source(pv) else {
            return true;
        };
        let name = volume_attachment_name(handle, driver, node);
        shared
            .stores
            .attachments
            .get(&kube::runtime::reflector::ObjectRef::new(&name))
            .is_some_and(|va| {
                va.metadata.deletion_timestamp.is_none()
                    && va.status.as_ref().is_some_and(|s| s.attached)
            })
    })
}

impl super::runtime::Reconciler for AttachDetach {
    fn pass(&mut self) -> impl std::future::Future<Output = PassOutcome> + Send {
        self.pass_once()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, PodStatus, Taint};

    #[test]
    fn attachment_name_matches_kubernetes_csi_attacher() {
        // Expected value computed independently: printf %s vol-0123ebs.csi.aws.comnode-a1 | sha256sum
        let name = volume_attachment_name("vol-0123", "ebs.csi.aws.com", "node-a1");
        assert_eq!(
            name,
            "csi-883accc003f45121140aae8f10a1a23be492a797e31b77055295e4254aa171c6"
        );
        assert_ne!(
            name,
            volume_attachment_name("vol-0123", "ebs.csi.aws.com", "node-a2")
        );
    }

    #[test]
    fn read_write_once_volume_waits_for_other_node_to_let_go() {
        let existing = [("pv-1", "node-a"), ("pv-2", "node-b")];
        assert!(!may_attach("pv-1", "node-b", existing.iter().copied()));
        assert!(may_attach("pv-1", "node-a", existing.iter().copied()));
        assert!(may_attach("pv-3", "node-b", existing.iter().copied()));
    }

    #[test]
    fn pods_release_volumes_on_out_of_service_or_deleted_nodes_or_when_finished() {
        let pod = Pod::default();
        let mut node = Node {
            spec: Some(NodeSpec::default()),
            ..Node::default()
        };
        assert!(pod_holds_volumes(&pod, Some(&node)));
        assert!(!pod_holds_volumes(&pod, None));
        node.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: TAINT_OUT_OF_SERVICE.into(),
            value: Some("nodeshutdown".into()),
            effect: "NoExecute".into(),
            time_added: None,
        }]);
        assert!(!pod_holds_volumes(&pod, Some(&node)));
        let finished = Pod {
            status: Some(PodStatus {
                phase: Some("Succeeded".into()),
                ..Default::default()
            }),
            ..Pod::default()
        };
        let live_node = Node::default();
        assert!(!pod_holds_volumes(&finished, Some(&live_node)));
    }

    #[test]
    fn finalizer_name_follows_external_attacher() {
        assert_eq!(
            attacher_finalizer("ebs.csi.aws.com"),
            "external-attacher/ebs-csi-aws-com"
        );
    }
}

//! What the AWS EBS CSI driver's controller side does, for PVCs of the test StorageClasses: the
//! external-provisioner (a PV with a CSI source and a zone nodeAffinity for every claim the
//! scheduler picked a node for; deleting Released volumes) and the external-attacher (owns the
//! VolumeAttachment finalizer, sets `status.attached` after a delay, detaches on deletion).
//! Like EBS, a volume never attaches to a second instance while it is attached to one.
//! With real databases each volume is a directory (`database::Runtime::volume_dir`), made
//! when the volume is provisioned and removed when its PV is deleted (once no process holds it).
//! Sources: kubernetes-csi/external-provisioner (controller.go: selected-node, topology),
//! kubernetes-csi/external-attacher (csi_handler.go: finalizer `external-attacher/<driver>`).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttachment};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::database::Runtime;
use crate::timings;

pub const DRIVER: &str = "ebs.csi.aws.com";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const ATTACHER_FINALIZER: &str = "external-attacher/ebs-csi-aws-com";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Storage classes the test cluster offers: `gp3` (expandable, the default) and `gp3-fixed`
/// (no expansion).
pub const STORAGE_CLASSES: &[(&str, bool)] = &[("gp3", true), ("gp3-fixed", false)];

/// Switches a test flips to make the fake EBS misbehave.
#[derive(Default)]
pub struct Switches {
    /// Every attach fails with an error in `status.attachError`.
    pub fail_attach: AtomicBool,
    /// Attaches never complete.
    pub stall_attach: AtomicBool,
    /// Detaches never complete (the finalizer stays).
    pub stall_detach: AtomicBool,
    /// Attaches to every node but this one fail (a volume that only works where it is).
    pub attach_only_to: Mutex<Option<String>>,
}

/// The CSIDriver (attach required) and the StorageClasses.
pub async fn install(admin: &Client) -> anyhow::Result<()> {
    let pp = PostParams::default();
    let driver: CSIDriver = serde_json::from_value(json!({
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": true, "podInfoOnMount": false},
    }))?;
    Api::<CSIDriver>::all(admin.clone())
        .create(&pp, &driver)
        .await?;
    for (i, (name, expand)) in STORAGE_CLASSES.iter().enumerate() {
        let mut annotations = serde_json::Map::new();
        if i == 0 {
            annotations.insert(
                "storageclass.kubernetes.io/is-default-class".into(),
                "true".into(),
            );
        }
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "provisioner": DRIVER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
            "allowVolumeExpansion": expand,
            "parameters": {"type": "gp3", "encrypted": "true"},
        }))?;
        Api::<StorageClass>::all(admin.clone())
            .create(&pp, &sc)
            .await?;
    }
    Ok(())
}

fn store<K>(
    client: &Client,
    stop: &CancellationToken,
) -> (Store<K>, tokio::sync::mpsc::UnboundedReceiver<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (crate::cache::store(client, stop, tx), rx)
}

/// Starts the provisioner and the attacher; `volumes` holds the volumes' directories when
/// databases are real.
pub fn spawn(
    client: Client,
    switches: Arc<Switches>,
    stop: CancellationToken,
    volumes: Option<Arc<Runtime>>,
) {
    tokio::spawn(provisioner(client.clone(), stop.clone(), volumes));
    tokio::spawn(attacher(client, switches, stop));
}

async fn provisioner(client: Client, stop: CancellationToken, volumes: Option<Arc<Runtime>>) {
    let (pvcs, mut pvc_events) = store::<PersistentVolumeClaim>(&client, &stop);
    let (pvs, mut pv_events) = store::<PersistentVolume>(&client, &stop);
    let (nodes, mut node_events) = store::<Node>(&client, &stop);
    let busy: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = pvc_events.recv() => {}
            _ = pv_events.recv() => {}
            _ = node_events.recv() => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        for pvc in pvcs.state() {
            let ann = pvc.annotations();
            let ours = ann.get(STORAGE_PROVISIONER).map(String::as_str) == Some(DRIVER)
                || ann
                    .get("volume.beta.kubernetes.io/storage-provisioner")
                    .map(String::as_str)
                    == Some(DRIVER);
            let unbound = pvc
                .spec
                .as_ref()
                .is_none_or(|s| s.volume_name.as_deref().unwrap_or("").is_empty());
            if !ours || !unbound || pvc.metadata.deletion_timestamp.is_some() {
                if ours && !unbound {
                    resize(&client, &pvc, &pvs, &busy);
                }
                continue;
            }
            let Some(node) = ann.get(SELECTED_NODE).cloned() else {
                continue;
            };
            let Some(zone) = nodes
                .get(&reflector::ObjectRef::new(&node))
                .and_then(|n| n.labels().get(ZONE_LABEL).cloned())
            else {
                continue;
            };
            let uid = pvc.uid().unwrap_or_default();
            let pv_name = format!("pvc-{uid}");
            if pvs.get(&reflector::ObjectRef::new(&pv_name)).is_some()
                || !busy.lock().unwrap().insert(pv_name.clone())
            {
                continue;
            }
            let (client, busy, volumes) = (client.clone(), busy.clone(), volumes.clone());
            tokio::spawn(async move {
                if let Err(e) = create_pv(&client, &pvc, &pv_name, &zone, volumes.as_deref()).await
                {
                    warn!(pv = %pv_name, error = %e, "fake CSI: provisioning failed");
                }
                busy.lock().unwrap().remove(&pv_name);
            });
        }
        // Released volumes of ours with reclaimPolicy Delete: the provisioner deletes them.
        for pv in pvs.state() {
            let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
            let delete = pv
                .spec
                .as_ref()
                .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
                == Some("Delete");
            let ours = pv.annotations().get(PROVISIONED_BY).map(String::as_str) == Some(DRIVER);
            if released && delete && ours && pv.metadata.deletion_timestamp.is_none() {
                let api: Api<PersistentVolume> = Api::all(client.clone());
                let name = pv.name_any();
                if busy.lock().unwrap().insert(name.clone()) {
                    let busy = busy.clone();
                    let handle = pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.csi.as_ref())
                        .map(|c| c.volume_handle.clone());
                    let volumes = volumes.clone();
                    tokio::spawn(async move {
                        let deleted = api.delete(&name, &Default::default()).await;
                        if let (Ok(_), Some(rt), Some(handle)) = (deleted, volumes, handle) {
                            rt.release(&handle);
                        }
                        busy.lock().unwrap().remove(&name);
                    });
                }
            }
        }
        if let Some(rt) = &volumes {
            rt.sweep();
        }
    }
}

async fn create_pv(
    client: &Client,
    pvc: &PersistentVolumeClaim,
    pv_name: &str,
    zone: &str,
    volumes: Option<&Runtime>,
) -> anyhow::Result<()> {
    let spec = pvc.spec.clone().unwrap_or_default();
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".into());
    let handle = format!(
        "vol-{}",
        &pvc.uid().unwrap_or_default().replace('-', "")[..17]
    );
    if let Some(rt) = volumes {
        rt.provision(&handle)?;
    }
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {
            "name": pv_name,
            "annotations": {PROVISIONED_BY: DRIVER, "volume.kubernetes.io/provisioner-deletion-secret-name": "", "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": spec.storage_class_name,
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "claimRef": {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": pvc.namespace(), "name": pvc.name_any(), "uid": pvc.uid(),
            },
            "csi": {"driver": DRIVER, "volumeHandle": handle, "fsType": "ext4"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": ZONE_LABEL, "operator": "In", "values": [zone]}
            ]}]}},
        },
    }))?;
    match Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
    {
        Ok(_) => {
            debug!(pv = %pv_name, %zone, "fake CSI: provisioned");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Online expansion: the external-resizer grows the volume, then the claim's status.
fn resize(
    client: &Client,
    pvc: &PersistentVolumeClaim,
    pvs: &Store<PersistentVolume>,
    busy: &Arc<Mutex<BTreeSet<String>>>,
) {
    let want = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned();
    let have = pvc
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .cloned();
    let (Some(want), Some(have)) = (want, have) else {
        return;
    };
    if bytes(&want.0) <= bytes(&have.0) {
        return;
    }
    let Some(pv_name) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
        return;
    };
    if pvs.get(&reflector::ObjectRef::new(&pv_name)).is_none() {
        return;
    }
    let key = format!("resize/{}", pvc.uid().unwrap_or_default());
    if !busy.lock().unwrap().insert(key.clone()) {
        return;
    }
    let (client, busy) = (client.clone(), busy.clone());
    let (ns, name) = (pvc.namespace().unwrap_or_default(), pvc.name_any());
    tokio::spawn(async move {
        let pp = PatchParams::default();
        let pv_patch = json!({"spec": {"capacity": {"storage": want.0}}});
        let pvc_patch = json!({"status": {"capacity": {"storage": want.0}}});
        let r1 = Api::<PersistentVolume>::all(client.clone())
            .patch(&pv_name, &pp, &Patch::Merge(&pv_patch))
            .await;
        let r2 = Api::<PersistentVolumeClaim>::namespaced(client, &ns)
            .patch_status(&name, &pp, &Patch::Merge(&pvc_patch))
            .await;
        if let Err(e) = r1.and(r2) {
            warn!(pvc = %name, error = %e, "fake CSI: resize failed");
        }
        busy.lock().unwrap().remove(&key);
    });
}

/// Bytes of a binary-suffixed quantity (enough for storage sizes).
fn bytes(q: &str) -> u128 {
    let (num, mult) = [
        ("Ki", 1u128 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ]
    .iter()
    .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
    .unwrap_or((q, 1));
    num.parse::<u128>().unwrap_or(0) * mult
}

async fn attacher(client: Client, switches: Arc<Switches>, stop: CancellationToken) {
    let (vas, mut events) = store::<VolumeAttachment>(&client, &stop);
    let busy: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = events.recv() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        let all = vas.state();
        for va in all.iter() {
            if va.spec.attacher != DRIVER {
                continue;
            }
            let name = va.name_any();
            let attached = va.status.as_ref().is_some_and(|s| s.attached);
            let deleting = va.metadata.deletion_timestamp.is_some();
            let has_finalizer = va.finalizers().iter().any(|f| f == ATTACHER_FINALIZER);
            let work = if deleting && has_finalizer {
                if switches.stall_detach.load(Ordering::Relaxed) {
                    continue;
                }
                Work::Detach
            } else if !deleting && !attached {
                if switches.stall_attach.load(Ordering::Relaxed) {
                    continue;
                }
                let pv = va.spec.source.persistent_volume_name.clone();
                // EBS: VolumeInUse while the volume is attached to another instance.
                let elsewhere = all.iter().find(|o| {
                    o.name_any() != name
                        && o.spec.source.persistent_volume_name == pv
                        && o.status.as_ref().is_some_and(|s| s.attached)
                });
                let last_error = va
                    .status
                    .as_ref()
                    .and_then(|s| s.attach_error.as_ref())
                    .and_then(|e| e.message.clone());
                if let Some(other) = elsewhere {
                    if last_error
                        .as_deref()
                        .is_some_and(|m| m.contains("VolumeInUse"))
                    {
                        continue;
                    }
                    Work::Refuse(format!(
                        "rpc error: code = Internal desc = Could not attach volume to node {}: VolumeInUse: volume is already attached to node {}",
                        va.spec.node_name, other.spec.node_name
                    ))
                } else if switches.fail_attach.load(Ordering::Relaxed)
                    || switches
                        .attach_only_to
                        .lock()
                        .unwrap()
                        .as_ref()
                        .is_some_and(|only| *only != va.spec.node_name)
                {
                    if last_error
                        .as_deref()
                        .is_some_and(|m| m.contains("injected"))
                    {
                        continue;
                    }
                    Work::Refuse("rpc error: code = Internal desc = Could not attach volume: injected attach failure".into())
                } else {
                    Work::Attach
                }
            } else {
                continue;
            };
            if !busy.lock().unwrap().insert(name.clone()) {
                continue;
            }
            let (client, busy) = (client.clone(), busy.clone());
            tokio::spawn(async move {
                if let Err(e) = act(&client, &name, work).await {
                    debug!(va = %name, error = %e, "fake CSI attacher: retrying");
                }
                busy.lock().unwrap().remove(&name);
            });
        }
    }
}

enum Work {
    Attach,
    Refuse(String),
    Detach,
}

async fn act(client: &Client, name: &str, work: Work) -> anyhow::Result<()> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let pp = PatchParams::default();
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    match work {
        Work::Attach => {
            let Some(va) = api.get_opt(name).await? else {
                return Ok(());
            };
            if !va.finalizers().iter().any(|f| f == ATTACHER_FINALIZER) {
                let mut finalizers = va.finalizers().to_vec();
                finalizers.push(ATTACHER_FINALIZER.into());
                let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": va.resource_version()}});
                api.patch(name, &pp, &Patch::Merge(&patch)).await?;
            }
            tokio::time::sleep(timings::VOLUME_ATTACH).await;
            let patch = json!({"status": {"attached": true, "attachError": null,
                "attachmentMetadata": {"devicePath": "/dev/xvdba"}}});
            api.patch_status(name, &pp, &Patch::Merge(&patch)).await?;
        }
        Work::Refuse(message) => {
            tokio::time::sleep(timings::VOLUME_ATTACH).await;
            let patch = json!({"status": {"attached": false,
                "attachError": {"message": message, "time": now}}});
            api.patch_status(name, &pp, &Patch::Merge(&patch)).await?;
        }
        Work::Detach => {
            tokio::time::sleep(timings::VOLUME_DETACH).await;
            let Some(va) = api.get_opt(name).await? else {
                return Ok(());
            };
            let finalizers: Vec<String> = va
                .finalizers()
                .iter()
                .filter(|f| *f != ATTACHER_FINALIZER)
                .cloned()
                .collect();
            let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": va.resource_version()}});
            api.patch(name, &pp, &Patch::Merge(&patch)).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::bytes("1Gi"), 1 << 30);
        assert!(super::bytes("20Gi") > super::bytes("10Gi"));
    }
}

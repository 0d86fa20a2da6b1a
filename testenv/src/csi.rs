//! What the AWS EBS CSI driver's controller side does, for PVCs of the test StorageClasses: the
//! external-provisioner (a PV with a CSI source and a zone nodeAffinity for every claim the
//! scheduler picked a node for; deleting Released volumes) and the external-attacher (owns the
//! VolumeAttachment finalizer, sets `status.attached` after a delay, detaches on deletion).
//! Like EBS, a volume never attaches to a second instance while it is attached to one.
//! With real databases each volume is a directory (`database::Runtime::volume_dir`), made
//! when the volume is provisioned and removed when its PV is deleted (once no process holds it).
//! A claim whose StorageClass sets `csi.storage.k8s.io/fstype: xfs` ([`SIZED_STORAGE_CLASS`])
//! gets a file system of its own of the claim's size mounted on that directory (see
//! `database::disk`), which an expansion grows online; the PV's `spec.csi.fsType` is the
//! class's (ext4 by default). XFS refuses a claim under 300 MiB: the provisioning fails, with
//! a `ProvisioningFailed` Event on the claim as external-provisioner records it (with fake
//! databases too, so that both modes provision alike).
//!
//! Snapshots: the real snapshot-controller (hack/snapshot-controller) binds VolumeSnapshots to
//! VolumeSnapshotContents; this module plays the csi-snapshotter sidecar and the driver behind
//! it, as kubernetes-csi/external-snapshotter v8 pkg/sidecar-controller/snapshot_controller.go
//! does: `syncContent` (a content of ours with `spec.source.volumeHandle` and no
//! `status.snapshotHandle` is created), `createSnapshotWrapper` (annotation
//! `volumesnapshot-being-created: yes` before CreateSnapshot, removed once it answers),
//! `updateSnapshotContentStatus` (`snapshotHandle`, `creationTime` in ns, `readyToUse`,
//! `restoreSize` in bytes), `updateContentErrorStatusWithEvent` (`status.error`,
//! `readyToUse: false`; retried), `shouldDelete` (deletionTimestamp, not being created,
//! `volumesnapshot-being-deleted` set by the snapshot-controller), DeleteSnapshot when the
//! policy is Delete, then `removeContentFinalizer`; names from pkg/utils/util.go. Like EBS
//! (and the EBS driver), CreateSnapshot answers at once with `readyToUse: false` (`pending`),
//! and the snapshot becomes ready [`timings::SNAPSHOT_COMPLETE`] later (`completed`). With
//! real databases a snapshot is a copy of the volume's directory taken at CreateSnapshot, and
//! a claim restored from it (`dataSource` kind VolumeSnapshot) starts as a copy of that copy,
//! after the checks external-provisioner makes (controller.go `getSnapshotSource`: the
//! snapshot is `readyToUse`, its content is this driver's, the claim is not smaller than the
//! `restoreSize`, the volume mode is the source's). Deviations: the copy is file by file, not
//! one instant (EBS is crash-consistent at one instant; a QuestDB writing during the copy may
//! leave files of different moments); no Events; pre-provisioned contents
//! (`spec.source.snapshotHandle`) and group snapshots are not served; DeleteSnapshot does not
//! clear the content's status before the finalizer goes.
//!
//! Sources: kubernetes-csi/external-provisioner (controller.go: selected-node, topology),
//! kubernetes-csi/external-attacher (csi_handler.go: finalizer `external-attacher/<driver>`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttachment};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::database::{Runtime, VolumeSize};
use crate::timings;

pub const DRIVER: &str = "ebs.csi.aws.com";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const ATTACHER_FINALIZER: &str = "external-attacher/ebs-csi-aws-com";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// One StorageClass the test cluster offers.
#[derive(Clone, Copy, Debug)]
pub struct TestStorageClass {
    pub name: &'static str,
    /// `allowVolumeExpansion`.
    pub expandable: bool,
    /// The `csi.storage.k8s.io/fstype` parameter, when the class sets one (external-provisioner
    /// defaults to ext4).
    pub fs_type: Option<&'static str>,
}

/// The class whose volumes have a real size (see [`SIZED_FS_TYPE`]).
pub const SIZED_STORAGE_CLASS: &str = "gp3-xfs";

/// Storage classes the test cluster offers: `gp3` (expandable, the default), `gp3-fixed` (no
/// expansion) and [`SIZED_STORAGE_CLASS`] (expandable, XFS: with real databases a volume of
/// the claim's size, which fills up and grows online).
pub const STORAGE_CLASSES: &[TestStorageClass] = &[
    TestStorageClass {
        name: "gp3",
        expandable: true,
        fs_type: None,
    },
    TestStorageClass {
        name: "gp3-fixed",
        expandable: false,
        fs_type: None,
    },
    TestStorageClass {
        name: SIZED_STORAGE_CLASS,
        expandable: true,
        fs_type: Some(SIZED_FS_TYPE),
    },
];

/// The StorageClass parameter external-provisioner takes the file system type from (and
/// strips before CreateVolume); the EBS driver also reads a deprecated `fsType`.
pub const FS_TYPE_PARAMETER: &str = "csi.storage.k8s.io/fstype";
/// A claim of a class with this file system type gets, with real databases, a file system of
/// its own of the claim's size (an XFS image on a loop device, mounted on the volume's
/// directory); every other type gets a directory of the host's file system, as before.
pub const SIZED_FS_TYPE: &str = "xfs";
/// external-provisioner's `--default-fstype` as the EBS CSI driver's chart sets it.
const DEFAULT_FS_TYPE: &str = "ext4";

/// Switches a test flips to make the fake EBS misbehave.
#[derive(Default)]
pub struct Switches {
    /// Every attach fails with an error in `status.attachError`.
    pub fail_attach: AtomicBool,
    /// Attaches never complete.
    pub stall_attach: AtomicBool,
    /// Detaches never complete (the finalizer stays).
    pub stall_detach: AtomicBool,
    /// Detaches from these nodes stick in `detaching`, as an EBS volume can (AWS: "volume
    /// stuck in the detaching state"), until the node's instance is terminated: EC2 detaches
    /// every volume of a terminated instance. A stop does not unstick them.
    pub detach_sticks_on: Mutex<BTreeSet<String>>,
    /// What each node's OS has mounted (by unique volume name: volumes attached for a pod the
    /// kubelet started, not every volume in its `volumesInUse`, which also lists volumes a pod
    /// waits to have attached), while its instance runs: a volume mounted on a running instance does not detach (AWS:
    /// "If you try to detach a volume that is mounted, it can get stuck in the busy state";
    /// the EBS driver's ControllerUnpublishVolume waits for `available` and fails). A partitioned
    /// or powered-off node keeps its mounts until its instance is stopped or terminated.
    pub mounted: Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// The other outcome AWS documents for a mounted volume: it detaches from under the
    /// running OS ("which could possibly damage the file system"); a writer there keeps
    /// writing into a volume another instance may attach.
    pub detach_while_mounted: AtomicBool,
    /// Attaches to every node but this one fail (a volume that only works where it is).
    pub attach_only_to: Mutex<Option<String>>,
    /// Every CreateSnapshot fails: `status.error` on the VolumeSnapshotContent, `readyToUse`
    /// false, retried until the switch is off again (as the sidecar retries).
    pub fail_snapshot: AtomicBool,
    /// Snapshots are created but stay `pending`: never `readyToUse`.
    pub stall_snapshot: AtomicBool,
    /// CreateSnapshot is not called while set (the snapshot is not cut yet): a test holds a
    /// backup between `CHECKPOINT CREATE` and the cut.
    pub hold_cut: AtomicBool,
    /// Snapshots taken while set hold this QuestDB table with every file truncated to zero
    /// bytes (`db/<table>~<id>/`): a snapshot damaged in storage, which only a restore finds.
    pub corrupt_table_in_snapshots: Mutex<Option<String>>,
}

impl Switches {
    /// `node`'s kubelet mounts exactly `volumes` now.
    pub(crate) fn set_mounted(&self, node: &str, volumes: &BTreeSet<String>) {
        let mut mounted = self.mounted.lock().unwrap();
        if volumes.is_empty() {
            mounted.remove(node);
        } else {
            mounted.insert(node.to_string(), volumes.clone());
        }
    }

    /// `node`'s instance stopped, terminated or rebooted: its OS holds no mount.
    pub(crate) fn unmount_all(&self, node: &str) {
        self.mounted.lock().unwrap().remove(node);
    }

    fn is_mounted(&self, node: &str, volume: &str) -> bool {
        self.mounted
            .lock()
            .unwrap()
            .get(node)
            .is_some_and(|v| v.contains(volume))
    }
}

/// The kubelet's unique name of a CSI volume (`volumesInUse`, `volumesAttached`).
pub fn unique_volume_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
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
    for (i, class) in STORAGE_CLASSES.iter().enumerate() {
        let mut annotations = serde_json::Map::new();
        if i == 0 {
            annotations.insert(
                "storageclass.kubernetes.io/is-default-class".into(),
                "true".into(),
            );
        }
        let mut parameters = json!({"type": "gp3", "encrypted": "true"});
        if let Some(fs) = class.fs_type {
            parameters[FS_TYPE_PARAMETER] = fs.into();
        }
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": class.name, "annotations": annotations},
            "provisioner": DRIVER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
            "allowVolumeExpansion": class.expandable,
            "parameters": parameters,
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

/// Starts the provisioner, the attacher and the snapshotter; `volumes` holds the volumes'
/// directories when databases are real, `snapshots` what the fake EBS holds.
pub fn spawn(
    client: Client,
    switches: Arc<Switches>,
    stop: CancellationToken,
    volumes: Option<Arc<Runtime>>,
    snapshots: Arc<Snapshots>,
) {
    tokio::spawn(provisioner(
        client.clone(),
        stop.clone(),
        volumes.clone(),
        snapshots.clone(),
    ));
    tokio::spawn(attacher(client.clone(), switches.clone(), stop.clone()));
    tokio::spawn(snapshotter(client, switches, stop, volumes, snapshots));
}

async fn provisioner(
    client: Client,
    stop: CancellationToken,
    volumes: Option<Arc<Runtime>>,
    snapshots: Arc<Snapshots>,
) {
    let (pvcs, mut pvc_events) = store::<PersistentVolumeClaim>(&client, &stop);
    let (pvs, mut pv_events) = store::<PersistentVolume>(&client, &stop);
    let (nodes, mut node_events) = store::<Node>(&client, &stop);
    let busy: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let failed: Arc<Mutex<BTreeSet<String>>> = Arc::default();
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
                    resize(&client, &pvc, &pvs, &busy, volumes.clone(), &failed);
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
            let (snapshots, failed) = (snapshots.clone(), failed.clone());
            tokio::spawn(async move {
                let made = create_pv(
                    &client,
                    &pvc,
                    &pv_name,
                    &zone,
                    volumes.as_deref(),
                    &snapshots,
                );
                if let Err(e) = made.await {
                    // Retried every pass: said once per claim and error.
                    if failed.lock().unwrap().insert(format!("{pv_name}: {e:#}")) {
                        warn!(pv = %pv_name, error = %format!("{e:#}"), "fake CSI: provisioning failed");
                        let class = pvc
                            .spec
                            .as_ref()
                            .and_then(|s| s.storage_class_name.clone())
                            .unwrap_or_default();
                        let message = format!(
                            "failed to provision volume with StorageClass \"{class}\": {e:#}"
                        );
                        claim_event(&client, &pvc, "ProvisioningFailed", &message).await;
                    }
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
                            rt.release(&handle).await;
                        }
                        busy.lock().unwrap().remove(&name);
                    });
                }
            }
        }
        if let Some(rt) = &volumes {
            rt.sweep().await;
        }
    }
}

async fn create_pv(
    client: &Client,
    pvc: &PersistentVolumeClaim,
    pv_name: &str,
    zone: &str,
    volumes: Option<&Runtime>,
    snapshots: &Snapshots,
) -> anyhow::Result<()> {
    let spec = pvc.spec.clone().unwrap_or_default();
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".into());
    let handle = aws_id("vol", &pvc.uid().unwrap_or_default());
    let fs_type = class_fs_type(client, spec.storage_class_name.as_deref()).await?;
    let requested = u64::try_from(bytes(&size)).unwrap_or(u64::MAX);
    let volume_size = if fs_type == SIZED_FS_TYPE {
        if requested < crate::database::XFS_MIN_BYTES {
            bail!(
                "rpc error: code = InvalidArgument desc = {}",
                crate::database::disk_too_small(requested)
            );
        }
        VolumeSize::Xfs(requested)
    } else {
        VolumeSize::Unbounded
    };
    let source = match snapshot_source(client, pvc, bytes(&size)).await? {
        Restore::None => None,
        Restore::NotReady(why) => {
            // external-provisioner fails the attempt and retries with back-off.
            debug!(pv = %pv_name, "fake CSI: {why}; retrying");
            return Ok(());
        }
        Restore::From(snapshot) if snapshots.get(&snapshot).is_none() => {
            bail!("InvalidSnapshot.NotFound: the snapshot '{snapshot}' does not exist")
        }
        Restore::From(snapshot) => Some(snapshot),
    };
    if let Some(rt) = volumes {
        match &source {
            Some(snapshot) => {
                snapshots
                    .restore(snapshot, rt, &handle, volume_size)
                    .await?
            }
            None => rt.provision(&handle, volume_size).await?,
        }
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
            "csi": {"driver": DRIVER, "volumeHandle": handle, "fsType": fs_type},
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
            debug!(pv = %pv_name, %zone, from = ?source, "fake CSI: provisioned");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The file system type a claim of StorageClass `class` gets (external-provisioner: the
/// `csi.storage.k8s.io/fstype` parameter, else its default; the EBS driver's deprecated `fsType`
/// parameter too). A class that does not exist provisions nothing.
async fn class_fs_type(client: &Client, class: Option<&str>) -> anyhow::Result<String> {
    let Some(class) = class.filter(|c| !c.is_empty()) else {
        return Ok(DEFAULT_FS_TYPE.into());
    };
    let Some(sc) = Api::<StorageClass>::all(client.clone())
        .get_opt(class)
        .await?
    else {
        bail!("storageclass.storage.k8s.io \"{class}\" not found");
    };
    let parameters = sc.parameters.unwrap_or_default();
    Ok(parameters
        .get(FS_TYPE_PARAMETER)
        .or_else(|| parameters.get("fsType"))
        .filter(|f| !f.is_empty())
        .map_or_else(|| DEFAULT_FS_TYPE.into(), |f| f.to_lowercase()))
}

/// A Warning Event on the claim, as external-provisioner and external-resizer record their
/// failures (`ProvisioningFailed`, `VolumeResizeFailed`).
async fn claim_event(client: &Client, pvc: &PersistentVolumeClaim, reason: &str, message: &str) {
    let ns = pvc.namespace().unwrap_or_default();
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let event = json!({
        "metadata": {"generateName": format!("{}.", pvc.name_any()), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns,
            "name": pvc.name_any(), "uid": pvc.uid(), "resourceVersion": pvc.resource_version()},
        "reason": reason, "message": message, "type": "Warning",
        "source": {"component": format!("{DRIVER}_ebs-csi-controller")},
        "reportingComponent": format!("{DRIVER}_ebs-csi-controller"),
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    let created = match serde_json::from_value::<k8s_openapi::api::core::v1::Event>(event) {
        Ok(e) => Api::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &e)
            .await
            .map(drop)
            .map_err(anyhow::Error::new),
        Err(e) => Err(e.into()),
    };
    if let Err(e) = created {
        debug!(pvc = %pvc.name_any(), error = %e, "fake CSI: event not recorded");
    }
}

/// Online expansion: the external-resizer grows the volume (with real databases a sized
/// volume's image and then its mounted file system, as NodeExpandVolume does), then the PV's
/// capacity and the claim's status.
fn resize(
    client: &Client,
    pvc: &PersistentVolumeClaim,
    pvs: &Store<PersistentVolume>,
    busy: &Arc<Mutex<BTreeSet<String>>>,
    volumes: Option<Arc<Runtime>>,
    failed: &Arc<Mutex<BTreeSet<String>>>,
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
    let Some(pv) = pvs.get(&reflector::ObjectRef::new(&pv_name)) else {
        return;
    };
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone());
    let key = format!("resize/{}", pvc.uid().unwrap_or_default());
    if !busy.lock().unwrap().insert(key.clone()) {
        return;
    }
    let (client, busy, failed, pvc) = (client.clone(), busy.clone(), failed.clone(), pvc.clone());
    let (ns, name) = (pvc.namespace().unwrap_or_default(), pvc.name_any());
    tokio::spawn(async move {
        if let (Some(rt), Some(handle)) = (volumes, handle) {
            let to = u64::try_from(bytes(&want.0)).unwrap_or(u64::MAX);
            if let Err(e) = rt.expand(&handle, to).await {
                // Tried again every pass, said once per claim and error.
                let message =
                    format!("resize volume \"{pv_name}\" by resizer \"{DRIVER}\" failed: {e:#}");
                if failed
                    .lock()
                    .unwrap()
                    .insert(format!("{pv_name}: {message}"))
                {
                    warn!(pvc = %name, error = %message, "fake CSI: resize failed");
                    claim_event(&client, &pvc, "VolumeResizeFailed", &message).await;
                }
                busy.lock().unwrap().remove(&key);
                return;
            }
        }
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

/// Bytes of a quantity (binary or decimal suffix, or an exponent: `320Mi`, `1G`, `5e8`; a
/// fraction is rounded up, as a volume size is); 0 when it is not one.
pub(crate) fn bytes(q: &str) -> u128 {
    const SUFFIXES: &[(&str, u128)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let q = q.trim();
    let (num, mult) = SUFFIXES
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
        .or_else(|| {
            let (n, e) = q.split_once(['e', 'E'])?;
            Some((n, 10u128.checked_pow(e.parse().ok()?)?))
        })
        .unwrap_or((q, 1));
    if let Ok(n) = num.parse::<u128>() {
        return n.saturating_mul(mult);
    }
    match num.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => (f * mult as f64).ceil() as u128,
        _ => 0,
    }
}

async fn attacher(client: Client, switches: Arc<Switches>, stop: CancellationToken) {
    let (vas, mut events) = store::<VolumeAttachment>(&client, &stop);
    let (pvs, _) = store::<PersistentVolume>(&client, &stop);
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
                if switches.stall_detach.load(Ordering::Relaxed)
                    || switches
                        .detach_sticks_on
                        .lock()
                        .unwrap()
                        .contains(&va.spec.node_name)
                {
                    continue;
                }
                let mounted = va
                    .spec
                    .source
                    .persistent_volume_name
                    .as_deref()
                    .and_then(|pv| pvs.get(&ObjectRef::new(pv)))
                    .and_then(|pv| Some(pv.spec.as_ref()?.csi.as_ref()?.volume_handle.clone()))
                    .map(|h| unique_volume_name(DRIVER, &h))
                    .filter(|v| switches.is_mounted(&va.spec.node_name, v))
                    .filter(|_| !switches.detach_while_mounted.load(Ordering::Relaxed));
                match mounted {
                    Some(volume) => {
                        let told = va
                            .status
                            .as_ref()
                            .and_then(|s| s.detach_error.as_ref())
                            .and_then(|e| e.message.as_deref())
                            .is_some_and(|m| m.contains("busy"));
                        if told {
                            continue;
                        }
                        Work::RefuseDetach(format!(
                            "rpc error: code = Internal desc = Could not detach volume {volume} from node {}: volume is busy: still mounted on the running instance",
                            va.spec.node_name
                        ))
                    }
                    None => Work::Detach,
                }
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
                } else if !driver_registered(&client, &va.spec.node_name).await {
                    // external-attacher: the node's id comes from its CSINode entry.
                    if last_error
                        .as_deref()
                        .is_some_and(|m| m.contains("does not contain driver"))
                    {
                        continue;
                    }
                    Work::Refuse(format!(
                        "rpc error: code = Internal desc = CSINode {} does not contain driver {DRIVER}",
                        va.spec.node_name
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

/// Whether the node's CSINode lists the EBS driver (its node plugin registered).
async fn driver_registered(client: &Client, node: &str) -> bool {
    Api::<k8s_openapi::api::storage::v1::CSINode>::all(client.clone())
        .get_opt(node)
        .await
        .ok()
        .flatten()
        .is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == DRIVER))
}

enum Work {
    Attach,
    Refuse(String),
    Detach,
    /// ControllerUnpublishVolume failed: external-attacher records `status.detachError` and
    /// retries.
    RefuseDetach(String),
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
        Work::RefuseDetach(message) => {
            tokio::time::sleep(timings::VOLUME_DETACH).await;
            let patch = json!({"status": {"detachError": {"message": message, "time": now}}});
            api.patch_status(name, &pp, &Patch::Merge(&patch)).await?;
        }
        Work::Detach => {
            tokio::time::sleep(timings::VOLUME_DETACH).await;
            remove_finalizer(&api, name, ATTACHER_FINALIZER).await?;
        }
    }
    Ok(())
}

/// The API group of VolumeSnapshots (CRDs from kubernetes-csi/external-snapshotter's client
/// module, installed by the control plane with the real snapshot-controller).
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
/// The VolumeSnapshotClass of the test cluster (driver [`DRIVER`], `deletionPolicy: Delete`,
/// the default class).
pub const SNAPSHOT_CLASS: &str = "ebs-snapshots";
/// The CRD files `hack/snapshot-controller/build.sh` puts beside the binary.
pub const SNAPSHOT_CRD_FILES: &[&str] = &[
    "snapshot.storage.k8s.io_volumesnapshotclasses.yaml",
    "snapshot.storage.k8s.io_volumesnapshotcontents.yaml",
    "snapshot.storage.k8s.io_volumesnapshots.yaml",
];
// pkg/utils/util.go of external-snapshotter.
const BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
const BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
const CONTENT_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
const IS_DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
const ALLOW_VOLUME_MODE_CHANGE: &str = "snapshot.storage.kubernetes.io/allow-volume-mode-change";

fn snapshot_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: SNAPSHOT_GROUP.into(),
        version: "v1".into(),
        api_version: format!("{SNAPSHOT_GROUP}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// For `Api::<DynamicObject>::namespaced_with(client, ns, &volume_snapshot_resource())`.
pub fn volume_snapshot_resource() -> ApiResource {
    snapshot_resource("VolumeSnapshot", "volumesnapshots")
}

/// For `Api::<DynamicObject>::all_with(client, &volume_snapshot_content_resource())`.
pub fn volume_snapshot_content_resource() -> ApiResource {
    snapshot_resource("VolumeSnapshotContent", "volumesnapshotcontents")
}

pub fn volume_snapshot_class_resource() -> ApiResource {
    snapshot_resource("VolumeSnapshotClass", "volumesnapshotclasses")
}

/// Applies the three VolumeSnapshot CRDs found in `dir` (server-side apply).
pub async fn apply_snapshot_crds(admin: &Client, dir: &Path) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let pp = PatchParams::apply("questdb-testenv").force();
    let mut crds = vec![];
    for file in SNAPSHOT_CRD_FILES {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading the CRD {}", path.display()))?;
        let crd: serde_json::Value = serde_yaml_ng::from_str(&text)
            .with_context(|| format!("parsing the CRD {}", path.display()))?;
        let name = crd["metadata"]["name"]
            .as_str()
            .with_context(|| format!("{} names no CRD", path.display()))?
            .to_string();
        crds.push((name, crd));
    }
    let patches: Vec<(String, Patch<serde_json::Value>)> = crds
        .into_iter()
        .map(|(name, crd)| (name, Patch::Apply(crd)))
        .collect();
    futures::future::try_join_all(
        patches
            .iter()
            .map(|(name, patch)| api.patch(name, &pp, patch)),
    )
    .await?;
    Ok(())
}

/// Waits until the CRDs [`apply_snapshot_crds`] applied are Established (served), then applies
/// the VolumeSnapshotClass [`SNAPSHOT_CLASS`].
pub async fn install_snapshot_class(admin: &Client, timeout: Duration) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let names: Vec<String> = SNAPSHOT_CRD_FILES
        .iter()
        .map(|f| {
            let plural = f.trim_end_matches(".yaml").rsplit('_').next().unwrap_or(f);
            format!("{plural}.{SNAPSHOT_GROUP}")
        })
        .collect();
    let deadline = Instant::now() + timeout;
    for name in &names {
        loop {
            let established = crds.get_opt(name).await?.is_some_and(|crd| {
                crd.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if established {
                break;
            }
            if Instant::now() > deadline {
                bail!("the CRD {name} is not Established after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{SNAPSHOT_GROUP}/v1"),
        "kind": "VolumeSnapshotClass",
        "metadata": {"name": SNAPSHOT_CLASS, "annotations": {IS_DEFAULT_CLASS: "true"}},
        "driver": DRIVER,
        "deletionPolicy": "Delete",
    }))?;
    // Applied, not created: kube-apiserver holds every create of a custom resource for 2 s
    // while its CRD is younger than that (apiextensions-apiserver customresource_handler.go,
    // `justCreated`); a patch is not held.
    Api::<DynamicObject>::all_with(admin.clone(), &volume_snapshot_class_resource())
        .patch(
            SNAPSHOT_CLASS,
            &PatchParams::apply("questdb-testenv").force(),
            &Patch::Apply(&class),
        )
        .await?;
    Ok(())
}

/// One snapshot the fake EBS holds: made by CreateSnapshot, gone at DeleteSnapshot.
#[derive(Clone, Debug)]
pub struct EbsSnapshot {
    /// Its id, the VolumeSnapshotContent's `status.snapshotHandle` (`snap-…`).
    pub handle: String,
    /// The CSI handle of the volume it was taken of (`vol-…`).
    pub volume_handle: String,
    /// The VolumeSnapshotContent that asked for it.
    pub content: String,
    /// The source volume's capacity (`status.restoreSize`); 0 when unknown.
    pub size_bytes: u64,
    /// `completed` (the content is, or is about to be, `readyToUse`) rather than `pending`.
    pub ready: bool,
    /// With real databases: the copy of the volume's directory taken at CreateSnapshot.
    pub dir: Option<PathBuf>,
    created: Instant,
}

/// What the fake EBS holds in snapshots; with real databases each is a directory under
/// `<control plane dir>/snapshots`.
pub struct Snapshots {
    dir: Option<PathBuf>,
    held: Mutex<BTreeMap<String, EbsSnapshot>>,
}

impl Snapshots {
    /// `dir`: where snapshot copies go (real databases), `None` to keep none.
    pub fn new(dir: Option<PathBuf>) -> anyhow::Result<Arc<Snapshots>> {
        if let Some(d) = &dir {
            std::fs::create_dir_all(d)
                .with_context(|| format!("creating the snapshots' directory {}", d.display()))?;
        }
        Ok(Arc::new(Snapshots {
            dir,
            held: Mutex::default(),
        }))
    }

    /// Every snapshot held now, by handle.
    pub fn list(&self) -> Vec<EbsSnapshot> {
        self.held.lock().unwrap().values().cloned().collect()
    }

    pub fn get(&self, handle: &str) -> Option<EbsSnapshot> {
        self.held.lock().unwrap().get(handle).cloned()
    }

    /// CreateSnapshot: point in time now. Idempotent (the sidecar retries with one handle).
    async fn create(
        &self,
        handle: &str,
        volume_handle: &str,
        content: &str,
        size_bytes: u64,
        volumes: Option<&Runtime>,
        corrupt_table: Option<String>,
    ) -> anyhow::Result<()> {
        if self.get(handle).is_some() {
            return Ok(());
        }
        let dir = match (volumes, &self.dir) {
            (Some(rt), Some(root)) => {
                // What reached the volume: the layer's unflushed pages are not in it.
                let layers = rt.volume_layers(volume_handle);
                let (from, to) = (rt.volume_dir(volume_handle), root.join(handle));
                if !from.is_dir() {
                    bail!("InvalidVolume.NotFound: the volume '{volume_handle}' does not exist");
                }
                let tmp = root.join(format!("{handle}.partial"));
                let copied = tokio::task::spawn_blocking(move || {
                    for layer in layers {
                        layer.settle(std::time::Duration::from_secs(10));
                    }
                    let _ = std::fs::remove_dir_all(&tmp);
                    copy_tree(&from, &tmp)?;
                    if let Some(table) = &corrupt_table {
                        truncate_table(&tmp, table)?;
                    }
                    std::fs::rename(&tmp, &to)?;
                    Ok::<_, std::io::Error>(to)
                });
                Some(copied.await??)
            }
            _ => None,
        };
        self.held.lock().unwrap().insert(
            handle.to_string(),
            EbsSnapshot {
                handle: handle.to_string(),
                volume_handle: volume_handle.to_string(),
                content: content.to_string(),
                size_bytes,
                ready: false,
                dir,
                created: Instant::now(),
            },
        );
        Ok(())
    }

    fn complete(&self, handle: &str) -> bool {
        match self.held.lock().unwrap().get_mut(handle) {
            Some(s) => {
                s.ready = true;
                true
            }
            None => false,
        }
    }

    /// DeleteSnapshot: gone, with its directory. A snapshot not held is already deleted.
    async fn delete(&self, handle: &str) -> anyhow::Result<()> {
        let removed = self.held.lock().unwrap().remove(handle);
        if let Some(dir) = removed.and_then(|s| s.dir) {
            tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            })
            .await??;
        }
        Ok(())
    }

    /// CreateVolume from a snapshot: the new volume's directory starts as the snapshot's copy.
    async fn restore(
        &self,
        handle: &str,
        rt: &Runtime,
        volume_handle: &str,
        size: VolumeSize,
    ) -> anyhow::Result<()> {
        let Some(snapshot) = self.get(handle) else {
            bail!("InvalidSnapshot.NotFound: the snapshot '{handle}' does not exist");
        };
        rt.provision(volume_handle, size).await?;
        if let Some(from) = snapshot.dir {
            let to = rt.volume_dir(volume_handle);
            tokio::task::spawn_blocking(move || copy_tree(&from, &to)).await??;
        }
        Ok(())
    }
}

/// Truncates every file of QuestDB table `table` under the volume copy `root` (its directory is
/// `db/<table>~<id>`) to zero bytes.
fn truncate_table(root: &Path, table: &str) -> std::io::Result<()> {
    let db = root.join("db");
    let prefix = format!("{table}~");
    for entry in std::fs::read_dir(&db)? {
        let entry = entry?;
        // The table's directory; beside it QuestDB keeps files of the same prefix (locks).
        if entry.file_name().to_string_lossy().starts_with(&prefix) && entry.file_type()?.is_dir() {
            truncate_tree(&entry.path())?;
        }
    }
    Ok(())
}

fn truncate_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            truncate_tree(&entry.path())?;
        } else if entry.file_type()?.is_file() {
            std::fs::OpenOptions::new()
                .write(true)
                .open(entry.path())?
                .set_len(0)?;
        }
    }
    Ok(())
}

/// Copies the tree `from` into `to` (made if missing). Files a writer removes meanwhile are
/// skipped, as they would be absent from a snapshot taken a moment later.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        let copied = if kind.is_dir() {
            copy_tree(&src, &dst)
        } else if kind.is_symlink() {
            std::fs::read_link(&src).and_then(|target| std::os::unix::fs::symlink(target, &dst))
        } else {
            std::fs::copy(&src, &dst).map(drop)
        };
        match copied {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// An AWS-style id (`vol-…`, `snap-…`: 17 hex digits) from a Kubernetes uid.
fn aws_id(prefix: &str, uid: &str) -> String {
    let hex = uid.replace('-', "");
    format!("{prefix}-{}", hex.get(..17).unwrap_or(&hex))
}

/// What a claim is provisioned from.
enum Restore {
    /// Nothing: an empty volume.
    None,
    /// A VolumeSnapshot not ready yet (external-provisioner fails the attempt and retries).
    NotReady(String),
    /// The snapshot with this handle.
    From(String),
}

/// external-provisioner `getSnapshotSource` for a claim whose `dataSourceRef` (or
/// `dataSource`) is a VolumeSnapshot; `requested` is the claim's size in bytes.
async fn snapshot_source(
    client: &Client,
    pvc: &PersistentVolumeClaim,
    requested: u128,
) -> anyhow::Result<Restore> {
    let spec = pvc.spec.as_ref();
    let source = spec
        .and_then(|s| s.data_source_ref.as_ref())
        .map(|r| (r.api_group.clone(), r.kind.clone(), r.name.clone()))
        .or_else(|| {
            spec.and_then(|s| s.data_source.as_ref())
                .map(|r| (r.api_group.clone(), r.kind.clone(), r.name.clone()))
        });
    let Some((Some(group), kind, name)) = source else {
        return Ok(Restore::None);
    };
    if group != SNAPSHOT_GROUP || kind != "VolumeSnapshot" {
        return Ok(Restore::None);
    }
    let ns = pvc.namespace().unwrap_or_default();
    let snapshots =
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &volume_snapshot_resource());
    let Some(snapshot) = snapshots.get_opt(&name).await? else {
        bail!("snapshot {ns}/{name} not found");
    };
    let status = &snapshot.data["status"];
    if status["readyToUse"].as_bool() != Some(true) {
        return Ok(Restore::NotReady(format!(
            "snapshot {ns}/{name} is not Ready"
        )));
    }
    let Some(content_name) = status["boundVolumeSnapshotContentName"].as_str() else {
        bail!("snapshot {ns}/{name} is bound to no VolumeSnapshotContent");
    };
    let contents =
        Api::<DynamicObject>::all_with(client.clone(), &volume_snapshot_content_resource());
    let Some(content) = contents.get_opt(content_name).await? else {
        bail!("VolumeSnapshotContent {content_name} of snapshot {ns}/{name} not found");
    };
    let driver = content.data["spec"]["driver"].as_str().unwrap_or_default();
    if driver != DRIVER {
        bail!("driver name {driver} defined in content {content_name} does not match driver name {DRIVER}");
    }
    let Some(handle) = content.data["status"]["snapshotHandle"].as_str() else {
        bail!("VolumeSnapshotContent {content_name} has no snapshot handle");
    };
    let restore_size = content.data["status"]["restoreSize"].as_u64().unwrap_or(0);
    if u128::from(restore_size) > requested {
        bail!("requested volume size {requested} is less than the size {restore_size} for the source snapshot {name}");
    }
    let source_mode = content.data["spec"]["sourceVolumeMode"].as_str();
    let mode = spec
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    if source_mode.is_some_and(|m| m != mode)
        && !content.annotations().contains_key(ALLOW_VOLUME_MODE_CHANGE)
    {
        bail!("requested volume {ns}/{} modifies the mode of the source volume but does not have permission to do so", pvc.name_any());
    }
    Ok(Restore::From(handle.to_string()))
}

/// A reflector over every object of a custom resource (what `crate::cache::store` is for kinds
/// known at compile time).
fn dynamic_store(
    client: &Client,
    stop: &CancellationToken,
    resource: &ApiResource,
) -> (
    Store<DynamicObject>,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
    let reader = writer.as_reader();
    let api = Api::<DynamicObject>::all_with(client.clone(), resource);
    crate::cache::reflect(api, writer, stop, tx);
    (reader, rx)
}

const INJECTED_SNAPSHOT_FAILURE: &str = "injected snapshot failure";

/// What the sidecar does next for one VolumeSnapshotContent (`syncContent`).
enum SnapWork {
    /// CreateSnapshot of `volume`, whose PV says `size` bytes.
    Create { volume: String, size: u64 },
    /// CreateSnapshot answers with an error (the switch).
    Fail,
    /// The EBS snapshot went `completed`: `readyToUse`.
    Complete(String),
    /// Ready, but the being-created annotation is still there.
    Unmark,
    /// DeleteSnapshot (when the policy is Delete and a handle exists), then the finalizer.
    Delete(Option<String>),
}

fn snapshot_work(
    content: &DynamicObject,
    switches: &Switches,
    snapshots: &Snapshots,
    pvs: &Store<PersistentVolume>,
) -> Option<SnapWork> {
    let spec = &content.data["spec"];
    if spec["driver"].as_str() != Some(DRIVER) {
        return None;
    }
    let annotations = content.annotations();
    let status = &content.data["status"];
    let handle = status["snapshotHandle"].as_str();
    if content.metadata.deletion_timestamp.is_some() {
        // shouldDelete
        let delete = !annotations.contains_key(BEING_CREATED)
            && annotations.contains_key(BEING_DELETED)
            && content.finalizers().iter().any(|f| f == CONTENT_FINALIZER);
        let policy_delete = spec["deletionPolicy"].as_str() == Some("Delete");
        return delete
            .then(|| SnapWork::Delete(handle.filter(|_| policy_delete).map(String::from)));
    }
    // Pre-provisioned contents (spec.source.snapshotHandle) are not served.
    let volume = spec["source"]["volumeHandle"].as_str()?;
    match handle {
        None if switches.hold_cut.load(Ordering::Relaxed) => None,
        None if switches.fail_snapshot.load(Ordering::Relaxed) => {
            let failed = status["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(INJECTED_SNAPSHOT_FAILURE));
            (!failed).then_some(SnapWork::Fail)
        }
        None => {
            let size = pvs
                .state()
                .iter()
                .find_map(|pv| {
                    let spec = pv.spec.as_ref()?;
                    (spec.csi.as_ref()?.volume_handle == volume)
                        .then(|| spec.capacity.as_ref()?.get("storage").map(|q| bytes(&q.0)))
                        .flatten()
                })
                .unwrap_or(0);
            Some(SnapWork::Create {
                volume: volume.to_string(),
                size: u64::try_from(size).unwrap_or(u64::MAX),
            })
        }
        Some(_) if status["readyToUse"].as_bool() == Some(true) => annotations
            .contains_key(BEING_CREATED)
            .then_some(SnapWork::Unmark),
        Some(h) => {
            let held = snapshots.get(h).is_some();
            (held && !switches.stall_snapshot.load(Ordering::Relaxed))
                .then(|| SnapWork::Complete(h.to_string()))
        }
    }
}

async fn snapshotter(
    client: Client,
    switches: Arc<Switches>,
    stop: CancellationToken,
    volumes: Option<Arc<Runtime>>,
    snapshots: Arc<Snapshots>,
) {
    let (contents, mut events) = dynamic_store(&client, &stop, &volume_snapshot_content_resource());
    let (pvs, mut pv_events) = store::<PersistentVolume>(&client, &stop);
    let busy: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = events.recv() => {}
            _ = pv_events.recv() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        for content in contents.state() {
            let Some(work) = snapshot_work(&content, &switches, &snapshots, &pvs) else {
                continue;
            };
            let name = content.name_any();
            if !busy.lock().unwrap().insert(name.clone()) {
                continue;
            }
            let uid = content.uid().unwrap_or_default();
            let (client, busy, volumes) = (client.clone(), busy.clone(), volumes.clone());
            let (switches, snapshots) = (switches.clone(), snapshots.clone());
            tokio::spawn(async move {
                let acted = act_snapshot(
                    &client,
                    &name,
                    &uid,
                    work,
                    &switches,
                    &snapshots,
                    volumes.as_deref(),
                );
                if let Err(e) = acted.await {
                    warn!(content = %name, error = %e, "fake CSI snapshotter: retrying");
                }
                busy.lock().unwrap().remove(&name);
            });
        }
    }
}

async fn act_snapshot(
    client: &Client,
    name: &str,
    uid: &str,
    work: SnapWork,
    switches: &Switches,
    snapshots: &Snapshots,
    volumes: Option<&Runtime>,
) -> anyhow::Result<()> {
    let api = Api::<DynamicObject>::all_with(client.clone(), &volume_snapshot_content_resource());
    let pp = PatchParams::default();
    let annotate =
        |value: serde_json::Value| json!({"metadata": {"annotations": {BEING_CREATED: value}}});
    match work {
        SnapWork::Create { volume, size } => {
            api.patch(name, &pp, &Patch::Merge(annotate("yes".into())))
                .await?;
            let handle = aws_id("snap", uid);
            let created = if switches.fail_snapshot.load(Ordering::Relaxed) {
                Err(anyhow::anyhow!(
                    "rpc error: code = Internal desc = Could not create snapshot: {INJECTED_SNAPSHOT_FAILURE}"
                ))
            } else {
                let corrupt = switches.corrupt_table_in_snapshots.lock().unwrap().clone();
                snapshots
                    .create(&handle, &volume, name, size, volumes, corrupt)
                    .await
            };
            if let Err(e) = created {
                // A final error: the annotation goes, the error shows, the sidecar retries.
                let message = format!(
                    "Failed to create snapshot: failed to take snapshot of the volume {volume}: \"{e}\""
                );
                api.patch_status(name, &pp, &Patch::Merge(snapshot_error(&message)))
                    .await?;
                api.patch(name, &pp, &Patch::Merge(annotate(serde_json::Value::Null)))
                    .await?;
                return Ok(());
            }
            let created_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            let mut status = json!({"snapshotHandle": handle, "creationTime": created_ns,
                "readyToUse": false});
            if size > 0 {
                status["restoreSize"] = size.into();
            }
            api.patch_status(name, &pp, &Patch::Merge(json!({ "status": status })))
                .await?;
            api.patch(name, &pp, &Patch::Merge(annotate(serde_json::Value::Null)))
                .await?;
            debug!(content = %name, %handle, %volume, "fake CSI: snapshot created");
        }
        SnapWork::Fail => {
            api.patch(name, &pp, &Patch::Merge(annotate("yes".into())))
                .await?;
            let message = format!("Failed to create snapshot: rpc error: code = Internal desc = Could not create snapshot: {INJECTED_SNAPSHOT_FAILURE}");
            api.patch_status(name, &pp, &Patch::Merge(snapshot_error(&message)))
                .await?;
            api.patch(name, &pp, &Patch::Merge(annotate(serde_json::Value::Null)))
                .await?;
        }
        SnapWork::Complete(handle) => {
            let Some(snapshot) = snapshots.get(&handle) else {
                return Ok(());
            };
            let pending = timings::SNAPSHOT_COMPLETE.saturating_sub(snapshot.created.elapsed());
            tokio::time::sleep(pending).await;
            if switches.stall_snapshot.load(Ordering::Relaxed) || !snapshots.complete(&handle) {
                return Ok(());
            }
            let patch = json!({"status": {"readyToUse": true, "error": null}});
            api.patch_status(name, &pp, &Patch::Merge(patch)).await?;
        }
        SnapWork::Unmark => {
            api.patch(name, &pp, &Patch::Merge(annotate(serde_json::Value::Null)))
                .await?;
        }
        SnapWork::Delete(handle) => {
            if let Some(handle) = handle {
                snapshots.delete(&handle).await?;
                debug!(content = %name, %handle, "fake CSI: snapshot deleted");
            }
            remove_finalizer(&api, name, CONTENT_FINALIZER).await?;
        }
    }
    Ok(())
}

/// `status.error` as `updateContentErrorStatusWithEvent` writes it.
fn snapshot_error(message: &str) -> serde_json::Value {
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    json!({"status": {"readyToUse": false, "error": {"message": message, "time": now}}})
}

/// Removes `finalizer` from the object `name`, guarded by its resourceVersion.
async fn remove_finalizer<K>(api: &Api<K>, name: &str, finalizer: &str) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(object) = api.get_opt(name).await? else {
        return Ok(());
    };
    let finalizers: Vec<String> = object
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": object.resource_version()}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn aws_ids_are_17_hex_digits() {
        let id = super::aws_id("snap", "0b8a4b6e-3f0c-4f61-9d1a-2c6f1d3e4a5b");
        assert_eq!(id, "snap-0b8a4b6e3f0c4f619");
    }

    #[test]
    fn sizes() {
        assert_eq!(super::bytes("1Gi"), 1 << 30);
        assert!(super::bytes("20Gi") > super::bytes("10Gi"));
        assert_eq!(super::bytes("320Mi"), 320 << 20);
        assert_eq!(super::bytes("1G"), 1_000_000_000);
        assert_eq!(super::bytes("500M"), 500_000_000);
        assert_eq!(super::bytes("5e8"), 500_000_000);
        assert_eq!(super::bytes("1.5Gi"), 3 << 29);
        assert_eq!(super::bytes("1073741824"), 1 << 30);
        assert_eq!(super::bytes("lots"), 0);
    }
}

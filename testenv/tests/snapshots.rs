//! VolumeSnapshots work as in a cluster with the EBS CSI driver: the real snapshot-controller
//! binds them, the fake driver takes, completes, restores and deletes the snapshots. With Java
//! (real databases) a snapshot is a copy of the volume's files, so what a restore sees is
//! checked too; without, the API flow alone.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use questdb_testenv::csi::{self, SNAPSHOT_CLASS};
use questdb_testenv::{ControlPlane, ControlPlaneOptions, Databases};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(90);

/// Polls `probe` until it returns `Some`.
async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start() -> (ControlPlane, Client) {
    let cp = ControlPlane::start(ControlPlaneOptions {
        databases: Databases::real_if_java(),
        ..ControlPlaneOptions::sandbox()
    })
    .await
    .unwrap();
    let client = cp.client().await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "snap"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    (cp, client)
}

/// A claim (restored from `snapshot` if given) and a pod using it, so that it binds
/// (the storage classes wait for a consumer).
async fn claim_with_pod(client: &Client, name: &str, snapshot: Option<&str>) {
    let source = snapshot
        .map(|s| json!({"apiGroup": csi::SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": s}));
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
                 "resources": {"requests": {"storage": "1Gi"}}, "dataSource": source},
    }))
    .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "busybox:1.36",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}],
        },
    }))
    .unwrap();
    let pp = PostParams::default();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "snap")
        .create(&pp, &pvc)
        .await
        .unwrap();
    Api::<Pod>::namespaced(client.clone(), "snap")
        .create(&pp, &pod)
        .await
        .unwrap();
}

/// The CSI handle of the volume bound to claim `name`, once it is Bound.
async fn bound_volume(client: &Client, name: &str) -> String {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "snap");
    let pv = wait_for(&format!("claim {name} Bound"), || async {
        let pvc = pvcs.get_opt(name).await.ok().flatten()?;
        let bound = pvc.status.as_ref()?.phase.as_deref() == Some("Bound");
        bound.then(|| pvc.spec?.volume_name).flatten()
    })
    .await;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&pv)
        .await
        .unwrap();
    pv.spec.unwrap().csi.unwrap().volume_handle
}

fn snapshots(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), "snap", &csi::volume_snapshot_resource())
}

async fn take_snapshot(client: &Client, name: &str, claim: &str) {
    let snapshot: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{}/v1", csi::SNAPSHOT_GROUP), "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": {"volumeSnapshotClassName": SNAPSHOT_CLASS,
                 "source": {"persistentVolumeClaimName": claim}},
    }))
    .unwrap();
    snapshots(client)
        .create(&PostParams::default(), &snapshot)
        .await
        .unwrap();
}

/// The VolumeSnapshot's status once `accept` holds for it.
async fn snapshot_status(
    client: &Client,
    name: &str,
    what: &str,
    accept: fn(&Value) -> bool,
) -> Value {
    let api = snapshots(client);
    wait_for(&format!("VolumeSnapshot {name}: {what}"), || async {
        let s = api.get_opt(name).await.ok().flatten()?;
        let status = s.data.get("status").cloned()?;
        accept(&status).then_some(status)
    })
    .await
}

fn ready(status: &Value) -> bool {
    status["readyToUse"].as_bool() == Some(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_sees_the_volume_as_it_was_at_the_snapshot_and_a_deleted_snapshot_leaves_nothing()
{
    let (cp, client) = start().await;
    claim_with_pod(&client, "data", None).await;
    let volume = bound_volume(&client, "data").await;
    let files = cp.volume_dir(&volume);
    if let Some(dir) = &files {
        std::fs::write(dir.join("marker"), "before").unwrap();
    }

    take_snapshot(&client, "snap1", "data").await;
    let status = snapshot_status(&client, "snap1", "readyToUse", ready).await;
    let held = cp.ebs_snapshots();
    assert_eq!(
        held.len(),
        1,
        "one EBS snapshot per VolumeSnapshot: {held:?}"
    );
    assert_eq!(held[0].volume_handle, volume);
    assert!(held[0].ready);
    assert_eq!(held[0].size_bytes, 1 << 30);
    let content = status["boundVolumeSnapshotContentName"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(status["restoreSize"], "1Gi");
    if let Some(dir) = &files {
        // Written after the snapshot: a restore must not see it.
        std::fs::write(dir.join("marker"), "after").unwrap();
    }

    claim_with_pod(&client, "restored", Some("snap1")).await;
    let restored = bound_volume(&client, "restored").await;
    assert_ne!(restored, volume, "a restore is a new volume");
    if let Some(dir) = cp.volume_dir(&restored) {
        assert_eq!(
            std::fs::read_to_string(dir.join("marker")).unwrap(),
            "before",
            "the restored volume holds the data of the moment of the snapshot"
        );
    }

    let snapshot_dir = held[0].dir.clone();
    assert_eq!(snapshot_dir.is_some(), files.is_some());
    snapshots(&client)
        .delete("snap1", &DeleteParams::default())
        .await
        .unwrap();
    let contents: Api<DynamicObject> =
        Api::all_with(client.clone(), &csi::volume_snapshot_content_resource());
    wait_for(
        "the VolumeSnapshotContent and the EBS snapshot deleted",
        || async {
            let gone = contents.get_opt(&content).await.ok()?.is_none();
            (gone && cp.ebs_snapshots().is_empty()).then_some(())
        },
    )
    .await;
    if let Some(dir) = snapshot_dir {
        assert!(!dir.exists(), "{} outlived its snapshot", dir.display());
    }
    eprintln!(
        "control plane (with the snapshot-controller) started in {:.1}s",
        cp.started_in.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_snapshot_is_reported_and_retried_and_a_missing_one_is_never_restored_from() {
    let (cp, client) = start().await;
    claim_with_pod(&client, "data", None).await;
    bound_volume(&client, "data").await;

    cp.csi.fail_snapshot.store(true, Ordering::Relaxed);
    take_snapshot(&client, "failing", "data").await;
    let status = snapshot_status(&client, "failing", "an error", |s| {
        s["error"]["message"].is_string()
    })
    .await;
    assert_ne!(status["readyToUse"], true, "{status}");
    assert!(cp.ebs_snapshots().is_empty());

    // A stalled snapshot is taken but stays pending.
    cp.csi.stall_snapshot.store(true, Ordering::Relaxed);
    cp.csi.fail_snapshot.store(false, Ordering::Relaxed);
    wait_for("the retried snapshot taken", || async {
        (cp.ebs_snapshots().len() == 1).then_some(())
    })
    .await;
    let status = snapshot_status(
        &client,
        "failing",
        "taken (a restore size) but pending",
        |s| s["restoreSize"].is_string(),
    )
    .await;
    assert_eq!(status["readyToUse"], false, "{status}");
    assert!(!cp.ebs_snapshots()[0].ready);

    cp.csi.stall_snapshot.store(false, Ordering::Relaxed);
    let status = snapshot_status(&client, "failing", "readyToUse", ready).await;
    assert!(status.get("error").is_none_or(Value::is_null), "{status}");

    // A claim from a snapshot that does not exist gets no volume.
    claim_with_pod(&client, "from-nothing", Some("no-such-snapshot")).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "snap");
    wait_for("from-nothing given a node by the scheduler", || async {
        let pvc = pvcs.get_opt("from-nothing").await.ok().flatten()?;
        let ann = pvc.annotations();
        ann.contains_key("volume.kubernetes.io/selected-node")
            .then_some(())
    })
    .await;
    // A claim given a node after it binds: the provisioner has tried both by then.
    claim_with_pod(&client, "later", Some("failing")).await;
    bound_volume(&client, "later").await;
    let pvc = pvcs.get("from-nothing").await.unwrap();
    assert_eq!(pvc.status.unwrap().phase.as_deref(), Some("Pending"));
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let claims: Vec<_> = pvs
        .items
        .iter()
        .filter_map(|pv| pv.spec.as_ref()?.claim_ref.as_ref()?.name.clone())
        .collect();
    assert!(
        !claims.iter().any(|c| c == "from-nothing"),
        "no volume for a claim whose snapshot does not exist: {claims:?}"
    );
}

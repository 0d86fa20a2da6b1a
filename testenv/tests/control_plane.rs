//! The harness is real: the pinned release answers, RBAC is enforced, and the controllers that
//! failover depends on act as they do in a cluster.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use questdb_testenv::{ControlPlane, ControlPlaneOptions};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

async fn wait_until<F, Fut>(what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !probe().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

fn statefulset(name: &str, node_selector: Option<(&str, &str)>) -> StatefulSet {
    let selector = node_selector.map(|(k, v)| json!({k: v}));
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "serviceName": name, "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": selector,
                    "containers": [{"name": "db", "image": "questdb/questdb:9.0.0",
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/questdb"}]}],
                },
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
                         "resources": {"requests": {"storage": "1Gi"}}}}],
        },
    }))
    .unwrap()
}

async fn running_pod(pods: &Api<Pod>, name: &str) -> Pod {
    wait_until(&format!("{name} Running"), || async {
        pods.get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|p| p.status)
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Running")
    })
    .await;
    pods.get(name).await.unwrap()
}

/// A sandbox control plane with StatefulSet `db` (one pod, one gp3 volume) running in `ns`:
/// the plane, its client, the StatefulSet and pod APIs of `ns`, and the pod's node.
async fn running_statefulset(
    ns: &str,
) -> (ControlPlane, Client, Api<StatefulSet>, Api<Pod>, String) {
    let cp = ControlPlane::start(ControlPlaneOptions::sandbox())
        .await
        .unwrap();
    let client = cp.client().await;
    namespace(&client, ns).await;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    sts.create(&PostParams::default(), &statefulset("db", None))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = running_pod(&pods, "db-0").await;
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    (cp, client, sts, pods, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pinned_release_answers_and_rbac_denies_what_deploy_does_not_grant() {
    let cp = ControlPlane::start(ControlPlaneOptions::empty())
        .await
        .unwrap();
    let client = cp.client().await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.37.2");

    let operator = Client::try_from(cp.operator_config().await).unwrap();
    namespace(&client, "rbac").await;
    // deploy/ grants list on StatefulSets but never delete.
    let sts: Api<StatefulSet> = Api::namespaced(operator.clone(), "rbac");
    sts.list(&ListParams::default())
        .await
        .expect("list is granted");
    let denied = sts
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    match denied {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("deleting StatefulSets must be forbidden, got {other:?}"),
    }
    eprintln!(
        "control plane started in {:.1}s",
        cp.started_in.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_pod_on_a_silent_node_is_evicted_but_not_replaced_while_it_exists() {
    let cp = ControlPlane::start(ControlPlaneOptions::sandbox())
        .await
        .unwrap();
    let client = cp.client().await;
    namespace(&client, "evict").await;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), "evict");
    sts.create(&PostParams::default(), &statefulset("db", None))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "evict");
    let pod = running_pod(&pods, "db-0").await;
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let attached = vas.list(&ListParams::default()).await.unwrap();
    assert!(
        attached
            .items
            .iter()
            .any(|va| va.spec.node_name == node && va.status.as_ref().is_some_and(|s| s.attached)),
        "the pod's volume is attached to its node through a VolumeAttachment"
    );

    cp.node(&node).unwrap().partition();
    // node-lifecycle: Ready Unknown after the grace period, NoExecute taint; taint-eviction:
    // the pod is deleted gracefully but stays Terminating (no kubelet confirms).
    wait_until("db-0 marked for deletion", || async {
        pods.get_opt("db-0")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    let terminating = pods.get("db-0").await.unwrap();
    assert_eq!(terminating.uid(), pod.uid(), "the same pod object stays");
    // The StatefulSet controller keeps at most one pod per ordinal: nothing replaces it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let still = pods.get("db-0").await.unwrap();
    assert_eq!(
        still.uid(),
        pod.uid(),
        "no replacement while the old pod exists"
    );
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
}

/// EBS does not pull a mounted volume from a running instance: a detach of a partitioned
/// node's volume (its pod force-deleted, the node declared out of service) fails `busy` as the
/// EBS driver reports it, and completes only once the instance is stopped. A fake that let it
/// go would let an operator that skips the fence pass its tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_mounted_on_a_running_instance_does_not_detach_until_the_instance_stops() {
    let (cp, client, sts, pods, node) = running_statefulset("busy").await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let on_node = |all: Vec<VolumeAttachment>| all.into_iter().find(|va| va.spec.node_name == node);

    cp.node(&node).unwrap().partition();
    // Nobody may scale the StatefulSet up again while the test looks at the attachment.
    sts.patch(
        "db",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    pods.delete(
        "db-0",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let handle = cp.node(&node).unwrap();
    wait_until("the node tainted out-of-service", || {
        handle.taint_out_of_service(&client)
    })
    .await;
    wait_until("the detach fails busy", || async {
        let all = vas.list(&ListParams::default()).await.unwrap().items;
        on_node(all).is_some_and(|va| {
            va.metadata.deletion_timestamp.is_some()
                && va
                    .status
                    .and_then(|s| s.detach_error)
                    .and_then(|e| e.message)
                    .is_some_and(|m| m.contains("busy"))
        })
    })
    .await;

    cp.kubelets().instance_stopped(&node);
    wait_until("the volume detached once the instance stopped", || async {
        on_node(vas.list(&ListParams::default()).await.unwrap().items).is_none()
    })
    .await;
}

/// A detach the attach-detach controller started before a pod on the same node asked for the
/// volume again must complete: the kubelet lists the volume in `volumesInUse` at once, but
/// mounts it only once it is attached, and EBS refuses a detach only for a mounted volume.
/// Refusing it here deadlocked every restart that landed back on its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_back_on_its_node_while_its_volume_detaches_gets_the_volume_again() {
    let (cp, client, sts, pods, node) = running_statefulset("again").await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let on_node = |all: Vec<VolumeAttachment>| all.into_iter().find(|va| va.spec.node_name == node);
    let scale = |replicas: i32| {
        let sts = sts.clone();
        async move {
            sts.patch(
                "db",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .unwrap();
        }
    };

    // The detach is held where the controller has decided it but EBS has not done it.
    cp.csi
        .stall_detach
        .store(true, std::sync::atomic::Ordering::Relaxed);
    scale(0).await;
    wait_until("the detach started", || async {
        let all = vas.list(&ListParams::default()).await.unwrap().items;
        on_node(all).is_some_and(|va| va.metadata.deletion_timestamp.is_some())
    })
    .await;
    // The pod comes back, on the same node only.
    sts.patch(
        "db",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"template": {"spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.clone()}}}}})),
    )
    .await
    .unwrap();
    scale(1).await;
    wait_until("the new pod is on the node", || async {
        pods.get_opt("db-0")
            .await
            .unwrap()
            .and_then(|p| p.spec?.node_name)
            .as_deref()
            == Some(node.as_str())
    })
    .await;
    cp.csi
        .stall_detach
        .store(false, std::sync::atomic::Ordering::Relaxed);

    let pod = running_pod(&pods, "db-0").await;
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some(node.as_str()));
}

/// A token for a new ServiceAccount `default/<name>`, granted `nodes/stats` with `stats`.
async fn service_account_token(client: &Client, name: &str, stats: bool) -> String {
    questdb_testenv::kubelet_api::service_account_token(client, "default", name, stats)
        .await
        .expect("a ServiceAccount token")
}

/// Each kubelet serves the Summary API on its InternalIP, port 10250, under TLS from the
/// control plane's kubelet CA, and answers as a kubelet with webhook authentication and
/// authorization does: no token or a bad one is 401, a user without `get` on `nodes/stats` is
/// 403 naming the user (at once after a revocation: nothing is cached), a granted one gets the
/// Summary. A powered-off node answers nothing, a stopped kubelet's port is closed. A claim of
/// the XFS class under 300 MiB is never provisioned, and says why on the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_summary_api_answers_only_users_granted_nodes_stats() {
    use questdb_testenv::kubelet_api;
    let cp = ControlPlane::start(ControlPlaneOptions::sandbox())
        .await
        .unwrap();
    let client = cp.client().await;
    let ca = cp.kubelet_ca_pem();
    let node = cp.node("worker-a1").unwrap();
    let ip = node.internal_ip();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let status = nodes.get("worker-a1").await.unwrap().status.unwrap();
    let reported = status.addresses.unwrap();
    assert!(
        reported
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == ip),
        "{reported:?}"
    );
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        i32::from(kubelet_api::KUBELET_PORT)
    );
    let get = |path: &'static str, token: Option<String>| {
        let (ip, ca) = (ip.clone(), ca.clone());
        async move {
            kubelet_api::get(&ip, path, token.as_deref(), &ca, Duration::from_secs(20))
                .await
                .unwrap()
        }
    };

    assert_eq!(
        get("/stats/summary", None).await,
        (401, "Unauthorized".into())
    );
    assert_eq!(
        get("/stats/summary", Some("not-a-token".into())).await.0,
        401
    );
    let nobody = service_account_token(&client, "nobody", false).await;
    assert_eq!(
        get("/stats/summary", Some(nobody)).await,
        (
            403,
            "Forbidden (user=system:serviceaccount:default:nobody, verb=get, resource=nodes, subresource=stats)".into()
        )
    );
    let reader = service_account_token(&client, "stats-reader", true).await;
    let (code, body) = get("/stats/summary", Some(reader.clone())).await;
    assert_eq!(code, 200, "{body}");
    let summary: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(summary["node"]["nodeName"], "worker-a1", "{summary}");
    assert!(summary["node"]["startTime"].is_string(), "{summary}");
    assert_eq!(
        summary["pods"],
        json!([]),
        "fake databases: no pod to report"
    );
    assert_eq!(get("/pods", Some(reader.clone())).await.0, 404);

    // Revoked: refused at once.
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
        .delete("default-stats-reader", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(get("/stats/summary", Some(reader.clone())).await.0, 403);
    let reader = service_account_token(&client, "stats-reader-2", true).await;

    // Another node's API is its own: another address, the same CA.
    let other = cp.node("worker-b1").unwrap().internal_ip();
    let (code, body) = kubelet_api::get(
        &other,
        "/stats/summary",
        Some(&reader),
        &ca,
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"worker-b1\""), "{body}");

    // Powered off: nothing answers; back on: answers again; gone: refused.
    node.power_off();
    let silent = kubelet_api::get(
        &ip,
        "/stats/summary",
        Some(&reader),
        &ca,
        Duration::from_secs(2),
    )
    .await
    .unwrap_err();
    assert!(format!("{silent:#}").contains("no answer"), "{silent:#}");
    node.heal();
    assert_eq!(get("/stats/summary", Some(reader.clone())).await.0, 200);
    cp.kubelets().leave("worker-a1");
    // (A request the kubelet took as it stopped is cut: reset, not refused.)
    wait_until("the stopped kubelet's port closed", || async {
        kubelet_api::get(&ip, "/stats/summary", Some(&reader), &ca, TIMEOUT)
            .await
            .is_err_and(|e| format!("{e:#}").contains("refused"))
    })
    .await;

    // XFS refuses a file system under 300 MiB: the claim stays Pending, and says why.
    namespace(&client, "small").await;
    let pvc = serde_json::from_value(json!({"metadata": {"name": "small"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp3-xfs",
                 "resources": {"requests": {"storage": "256Mi"}}}}))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), "small")
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
    let pod = serde_json::from_value(json!({"metadata": {"name": "user"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "small"}}]}}))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "small")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "small");
    wait_until("a ProvisioningFailed event on the small claim", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ProvisioningFailed")
                    && e.involved_object.name.as_deref() == Some("small")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("gp3-xfs") && m.contains("at least 300Mi"))
            })
    })
    .await;
    let claim = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        client.clone(),
        "small",
    )
    .get("small")
    .await
    .unwrap();
    assert_eq!(
        claim.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
}

//! End-to-end behaviour of the simulated cluster (scheduler, kubelets, node lifecycle,
//! StatefulSets, volumes) observed through the kube client only, with a fast clock.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Affinity, Container, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodTemplateSpec, Taint, Toleration, Volume,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use questdb_sim::cluster::{volume_attachment_name, ClusterConfig, NodeSpec, StorageClassSpec};
use questdb_sim::{Sim, SimConfig};
use serde::de::DeserializeOwned;
use serde_json::json;

const ZONE_A: &str = "us-east-1a";
const ZONE_B: &str = "us-east-1b";
const DRIVER: &str = "ebs.csi.aws.com";
/// Wall-clock bound on any single wait; simulated minutes pass in seconds at speed 20.
const WAIT: Duration = Duration::from_secs(30);

async fn start(nodes: Vec<NodeSpec>) -> (Sim, Client) {
    start_with(nodes, ClusterConfig::default()).await
}

async fn start_with(nodes: Vec<NodeSpec>, cluster: ClusterConfig) -> (Sim, Client) {
    let sim = Sim::start(SimConfig {
        nodes,
        clock_speed: 20.0,
        cluster,
        ..SimConfig::default()
    })
    .await
    .expect("simulator starts");
    let client = sim.client().await;
    (sim, client)
}

fn three_nodes() -> Vec<NodeSpec> {
    vec![
        NodeSpec::new("node-a1", ZONE_A),
        NodeSpec::new("node-a2", ZONE_A),
        NodeSpec::new("node-b1", ZONE_B),
    ]
}

/// Waits (watching) until `cond` holds for the named object; `None` matches absence.
async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    cond: impl Fn(Option<&K>) -> bool + Send + 'static,
) -> Option<K>
where
    K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
{
    match tokio::time::timeout(WAIT, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(obj)) => obj,
        Ok(Err(err)) => panic!("watching {name} for {what}: {err}"),
        Err(_) => panic!(
            "timed out waiting for {name}: {what}; last state: {:?}\nvolumes: {}",
            api.get_opt(name).await,
            volume_summary(api.clone().into_client()).await
        ),
    }
}

/// Claims, volumes and attachments in one line each, for timeout diagnostics.
async fn volume_summary(client: Client) -> String {
    let mut lines = Vec::new();
    let pvcs = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&Default::default())
        .await;
    for c in pvcs.map(|l| l.items).unwrap_or_default() {
        lines.push(format!(
            "pvc {} phase={:?} volume={:?} annotations={:?}",
            c.metadata.name.unwrap_or_default(),
            c.status.and_then(|s| s.phase),
            c.spec.and_then(|s| s.volume_name),
            c.metadata.annotations
        ));
    }
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&Default::default())
        .await;
    for v in pvs.map(|l| l.items).unwrap_or_default() {
        lines.push(format!(
            "pv {} phase={:?} claim={:?}",
            v.metadata.name.unwrap_or_default(),
            v.status.and_then(|s| s.phase),
            v.spec.and_then(|s| s.claim_ref).and_then(|c| c.name)
        ));
    }
    let vas = Api::<VolumeAttachment>::all(client)
        .list(&Default::default())
        .await;
    for a in vas.map(|l| l.items).unwrap_or_default() {
        lines.push(format!(
            "va {} node={} attached={:?} deleting={}",
            a.metadata.name.unwrap_or_default(),
            a.spec.node_name,
            a.status.map(|s| s.attached),
            a.metadata.deletion_timestamp.is_some()
        ));
    }
    lines.join("\n")
}

fn pod_ready(pod: Option<&Pod>) -> bool {
    pod.and_then(|p| p.status.as_ref()).is_some_and(|s| {
        s.phase.as_deref() == Some("Running")
            && s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

fn pod_condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

fn node_ready_status(node: Option<&Node>) -> Option<String> {
    node?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

fn taint_keys(node: &Node) -> BTreeSet<(String, String)> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

fn statefulset(name: &str, image: &str, template: PodSpec) -> StatefulSet {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    let mut spec = template;
    spec.containers = vec![Container {
        name: "questdb".into(),
        image: Some(image.into()),
        ..Container::default()
    }];
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(name.into()),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(spec),
            },
            volume_claim_templates: Some(vec![PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("data".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: Some("gp3".into()),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            Quantity("10Gi".into()),
                        )])),
                        ..VolumeResourceRequirements::default()
                    }),
                    ..PersistentVolumeClaimSpec::default()
                }),
                status: None,
            }]),
            ..StatefulSetSpec::default()
        }),
        status: None,
    }
}

fn zone_affinity(zone: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "topology.kubernetes.io/zone".into(),
                        operator: "In".into(),
                        values: Some(vec![zone.into()]),
                    }]),
                    match_fields: None,
                }],
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    }
}

fn bare_pod(name: &str, spec: PodSpec) -> Pod {
    let mut spec = spec;
    spec.containers = vec![Container {
        name: "c".into(),
        image: Some("busybox".into()),
        ..Container::default()
    }];
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("pod is bound to a node")
}

/// The PV behind a claim, once it is bound.
async fn bound_pv(client: &Client, claim: &str) -> PersistentVolume {
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pvc = wait_for(
        &pvcs,
        claim,
        "claim Bound",
        |c: Option<&PersistentVolumeClaim>| {
            c.and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.phase.as_deref() == Some("Bound"))
        },
    )
    .await
    .expect("claim exists");
    let volume = pvc
        .spec
        .and_then(|s| s.volume_name)
        .expect("volumeName set");
    Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .expect("bound PV exists")
}

fn pv_zone(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required
        .as_ref()
        .unwrap()
        .node_selector_terms[0]
        .match_expressions
        .as_ref()
        .unwrap()[0]
        .values
        .as_ref()
        .unwrap()[0]
        .clone()
}

fn handle(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone()
}

#[tokio::test]
async fn statefulset_pod_runs_ready_with_a_zonal_volume_attached_to_its_node() {
    let (sim, client) = start(three_nodes()).await;
    let sets: Api<StatefulSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    sets.create(
        &PostParams::default(),
        &statefulset("db", "questdb/questdb:9.0.0", PodSpec::default()),
    )
    .await
    .unwrap();

    let pod = wait_for(&pods, "db-0", "Running and Ready", pod_ready)
        .await
        .unwrap();
    let node = node_of(&pod);
    assert!(
        pod.status.as_ref().unwrap().pod_ip.is_some(),
        "pod has an IP"
    );
    let labels = pod.metadata.labels.clone().unwrap();
    assert_eq!(labels["statefulset.kubernetes.io/pod-name"], "db-0");
    assert!(labels["controller-revision-hash"].starts_with("db-"));

    let pv = bound_pv(&client, "data-db-0").await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node_obj = nodes.get(&node).await.unwrap();
    assert_eq!(
        pv_zone(&pv),
        node_obj.metadata.labels.unwrap()["topology.kubernetes.io/zone"],
        "volume provisioned in the pod's zone"
    );
    let va_name = volume_attachment_name(&handle(&pv), DRIVER, &node);
    let va = Api::<VolumeAttachment>::all(client.clone())
        .get(&va_name)
        .await
        .unwrap();
    assert_eq!(va.spec.node_name, node);
    assert_eq!(va.spec.source.persistent_volume_name, pv.metadata.name);
    assert!(va.status.unwrap().attached);

    let sts = wait_for(&sets, "db", "status ready", |s: Option<&StatefulSet>| {
        s.and_then(|s| s.status.as_ref())
            .is_some_and(|st| st.ready_replicas == Some(1) && st.available_replicas == Some(1))
    })
    .await
    .unwrap();
    let status = sts.status.unwrap();
    assert_eq!(status.replicas, 1);
    assert_eq!(status.current_revision, status.update_revision);
    assert_eq!(status.observed_generation, sts.metadata.generation);
    sim.shutdown().await;
}

#[tokio::test]
async fn scheduler_honours_selectors_affinity_taints_and_cordons() {
    let mut nodes = three_nodes();
    nodes[0] = NodeSpec::new("node-a1", ZONE_A).with_taint("dedicated", Some("db"), "NoSchedule");
    let (sim, client) = start(nodes).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let on_a1 = |tolerate: bool| PodSpec {
        node_selector: Some(BTreeMap::from([(
            "kubernetes.io/hostname".into(),
            "node-a1".into(),
        )])),
        tolerations: tolerate.then(|| {
            vec![Toleration {
                key: Some("dedicated".into()),
                operator: Some("Equal".into()),
                value: Some("db".into()),
                effect: Some("NoSchedule".into()),
                toleration_seconds: None,
            }]
        }),
        ..PodSpec::default()
    };
    let pp = PostParams::default();
    pods.create(&pp, &bare_pod("intolerant", on_a1(false)))
        .await
        .unwrap();
    pods.create(&pp, &bare_pod("tolerant", on_a1(true)))
        .await
        .unwrap();
    pods.create(
        &pp,
        &bare_pod(
            "zone-b",
            PodSpec {
                affinity: Some(zone_affinity(ZONE_B)),
                ..PodSpec::default()
            },
        ),
    )
    .await
    .unwrap();

    let tolerant = wait_for(&pods, "tolerant", "Ready", pod_ready)
        .await
        .unwrap();
    assert_eq!(node_of(&tolerant), "node-a1");
    let zone_b = wait_for(&pods, "zone-b", "Ready", pod_ready).await.unwrap();
    assert_eq!(node_of(&zone_b), "node-b1");
    let intolerant = wait_for(&pods, "intolerant", "Unschedulable", |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.conditions.clone())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
    })
    .await
    .unwrap();
    assert!(intolerant.spec.as_ref().unwrap().node_name.is_none());
    let message = intolerant
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .and_then(|c| c.message)
        .unwrap();
    assert!(message.starts_with("0/3 nodes are available"), "{message}");
    assert!(
        message.contains("untolerated taint {dedicated: db}"),
        "{message}"
    );

    // Cordon the only zone-b node: a zone-b pod now has nowhere to go.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "node-b1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    wait_for(
        &nodes,
        "node-b1",
        "cordoned in cache",
        |n: Option<&Node>| n.and_then(|n| n.spec.as_ref()?.unschedulable) == Some(true),
    )
    .await;
    pods.create(
        &pp,
        &bare_pod(
            "zone-b-2",
            PodSpec {
                affinity: Some(zone_affinity(ZONE_B)),
                ..PodSpec::default()
            },
        ),
    )
    .await
    .unwrap();
    let stuck = wait_for(&pods, "zone-b-2", "Unschedulable", |p: Option<&Pod>| {
        p.is_some_and(|p| pod_condition(p, "PodScheduled").as_deref() == Some("False"))
    })
    .await
    .unwrap();
    assert!(stuck.spec.unwrap().node_name.is_none());
    sim.shutdown().await;
}

#[tokio::test]
async fn silent_node_turns_unknown_and_unreachable_then_recovers() {
    let (sim, client) = start(three_nodes()).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let spec = PodSpec {
        node_selector: Some(BTreeMap::from([(
            "kubernetes.io/hostname".into(),
            "node-a2".into(),
        )])),
        ..PodSpec::default()
    };
    pods.create(&PostParams::default(), &bare_pod("web", spec))
        .await
        .unwrap();
    wait_for(&pods, "web", "Ready", pod_ready).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = leases.get("node-a2").await.expect("node lease exists");
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("node-a2")
    );

    sim.cluster().stop_heartbeat("node-a2");
    let node = wait_for(
        &nodes,
        "node-a2",
        "Ready=Unknown and tainted",
        |n: Option<&Node>| {
            node_ready_status(n).as_deref() == Some("Unknown")
                && n.is_some_and(|n| taint_keys(n).len() == 2)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        taint_keys(&node),
        BTreeSet::from([
            (
                "node.kubernetes.io/unreachable".to_string(),
                "NoExecute".to_string()
            ),
            (
                "node.kubernetes.io/unreachable".to_string(),
                "NoSchedule".to_string()
            ),
        ])
    );
    let web = wait_for(&pods, "web", "not Ready", |p: Option<&Pod>| {
        p.is_some_and(|p| pod_condition(p, "Ready").as_deref() == Some("False"))
    })
    .await
    .unwrap();
    assert!(
        web.metadata.deletion_timestamp.is_none(),
        "not evicted before tolerationSeconds"
    );

    sim.cluster().restart_heartbeat("node-a2");
    let node = wait_for(
        &nodes,
        "node-a2",
        "Ready again, untainted",
        |n: Option<&Node>| {
            node_ready_status(n).as_deref() == Some("True")
                && n.is_some_and(|n| taint_keys(n).is_empty())
        },
    )
    .await
    .unwrap();
    assert!(taint_keys(&node).is_empty());
    wait_for(&pods, "web", "Ready again", pod_ready).await;
    sim.shutdown().await;
}

type Violations = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Follows every VolumeAttachment event and records each moment one PV is attached (or
/// attaching, or detaching) to two nodes at once. Abort the task, then read the record.
fn watch_for_double_attach(client: Client) -> (tokio::task::JoinHandle<()>, Violations) {
    let violations = Violations::default();
    let record = violations.clone();
    let task = tokio::spawn(async move {
        let api: Api<VolumeAttachment> = Api::all(client);
        let mut live: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(event) = stream.next().await {
            let Ok(event) = event else { continue };
            match event {
                watcher::Event::Apply(va) | watcher::Event::InitApply(va) => {
                    let pv = va
                        .spec
                        .source
                        .persistent_volume_name
                        .clone()
                        .unwrap_or_default();
                    live.insert(
                        va.metadata.name.clone().unwrap_or_default(),
                        (pv, va.spec.node_name.clone()),
                    );
                }
                watcher::Event::Delete(va) => {
                    live.remove(&va.metadata.name.clone().unwrap_or_default());
                }
                _ => {}
            }
            let mut nodes_by_pv: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
            for (pv, node) in live.values() {
                nodes_by_pv.entry(pv).or_default().insert(node);
            }
            for (pv, nodes) in nodes_by_pv {
                if nodes.len() > 1 {
                    let mut record = record.lock().unwrap_or_else(|e| e.into_inner());
                    record.push(format!("{pv} on {nodes:?}"));
                }
            }
        }
    });
    (task, violations)
}

#[tokio::test]
async fn out_of_service_node_releases_pod_and_volume_to_a_healthy_node() {
    let (sim, client) = start(three_nodes()).await;
    let (checker, violations) = watch_for_double_attach(client.clone());
    let sets: Api<StatefulSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let spec = PodSpec {
        affinity: Some(zone_affinity(ZONE_A)),
        ..PodSpec::default()
    };
    sets.create(
        &PostParams::default(),
        &statefulset("db", "questdb/questdb:9.0.0", spec),
    )
    .await
    .unwrap();
    let first = wait_for(&pods, "db-0", "Ready", pod_ready).await.unwrap();
    let old_node = node_of(&first);
    let pv = bound_pv(&client, "data-db-0").await;
    let old_va = volume_attachment_name(&handle(&pv), DRIVER, &old_node);

    sim.cluster().stop_heartbeat(&old_node);
    wait_for(&nodes, &old_node, "Ready=Unknown", |n: Option<&Node>| {
        node_ready_status(n).as_deref() == Some("Unknown")
    })
    .await;
    // A dead kubelet cannot stop the pod; the volume stays attached to the dead node.
    assert!(vas.get_opt(&old_va).await.unwrap().is_some());

    let mut node = nodes.get(&old_node).await.unwrap();
    node.spec
        .get_or_insert_with(Default::default)
        .taints
        .get_or_insert_with(Vec::new)
        .push(Taint {
            key: "node.kubernetes.io/out-of-service".into(),
            value: Some("nodeshutdown".into()),
            effect: "NoExecute".into(),
            time_added: None,
        });
    nodes
        .replace(&old_node, &PostParams::default(), &node)
        .await
        .unwrap();

    let old_uid = first.metadata.uid.clone();
    wait_for(
        &vas,
        &old_va,
        "old attachment gone",
        |va: Option<&VolumeAttachment>| va.is_none(),
    )
    .await;
    let moved = wait_for(
        &pods,
        "db-0",
        "recreated and Ready elsewhere",
        move |p: Option<&Pod>| pod_ready(p) && p.is_some_and(|p| p.metadata.uid != old_uid),
    )
    .await
    .unwrap();
    let new_node = node_of(&moved);
    assert_ne!(new_node, old_node);
    let new_va = vas
        .get(&volume_attachment_name(&handle(&pv), DRIVER, &new_node))
        .await
        .unwrap();
    assert!(new_va.status.unwrap().attached);
    checker.abort();
    let violations = violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "double attach: {violations:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn volume_follows_a_rescheduled_pod_only_after_detaching() {
    let (sim, client) = start(three_nodes()).await;
    let (checker, violations) = watch_for_double_attach(client.clone());
    let sets: Api<StatefulSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let spec = PodSpec {
        affinity: Some(zone_affinity(ZONE_A)),
        ..PodSpec::default()
    };
    sets.create(
        &PostParams::default(),
        &statefulset("db", "questdb/questdb:9.0.0", spec),
    )
    .await
    .unwrap();
    let first = wait_for(&pods, "db-0", "Ready", pod_ready).await.unwrap();
    let old_node = node_of(&first);
    let pv = bound_pv(&client, "data-db-0").await;

    // Drain: cordon and delete; the replacement must land on the other zone-a node.
    nodes
        .patch(
            &old_node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    wait_for(&nodes, &old_node, "cordoned", |n: Option<&Node>| {
        n.and_then(|n| n.spec.as_ref()?.unschedulable) == Some(true)
    })
    .await;
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    let old_uid = first.metadata.uid.clone();
    let moved = wait_for(
        &pods,
        "db-0",
        "Ready on another node",
        move |p: Option<&Pod>| pod_ready(p) && p.is_some_and(|p| p.metadata.uid != old_uid),
    )
    .await
    .unwrap();
    let new_node = node_of(&moved);
    assert_ne!(new_node, old_node);
    assert!(vas
        .get_opt(&volume_attachment_name(&handle(&pv), DRIVER, &old_node))
        .await
        .unwrap()
        .is_none());
    checker.abort();
    let violations = violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "double attach: {violations:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn rolling_update_and_scale_down_keep_status_truthful() {
    let (sim, client) = start(three_nodes()).await;
    let sets: Api<StatefulSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let mut set = statefulset("db", "questdb/questdb:9.0.0", PodSpec::default());
    set.spec.as_mut().unwrap().replicas = Some(2);
    sets.create(&PostParams::default(), &set).await.unwrap();
    let ready_two = |s: Option<&StatefulSet>| {
        s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
            st.ready_replicas == Some(2)
                && st.updated_replicas == Some(2)
                && st.current_revision == st.update_revision
        })
    };
    let before = wait_for(&sets, "db", "2 ready", ready_two).await.unwrap();
    let old_revision = before.status.unwrap().update_revision.unwrap();

    let image = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "questdb", "image": "questdb/questdb:9.0.1"}
    ]}}}});
    sets.patch("db", &PatchParams::default(), &Patch::Merge(image))
        .await
        .unwrap();
    let old = old_revision.clone();
    let after = wait_for(&sets, "db", "rolled out", move |s: Option<&StatefulSet>| {
        ready_two(s)
            && s.and_then(|s| s.status.as_ref()?.update_revision.clone())
                .is_some_and(|r| r != old)
    })
    .await
    .unwrap();
    let new_revision = after.status.unwrap().update_revision.unwrap();
    for name in ["db-0", "db-1"] {
        let pod = pods.get(name).await.unwrap();
        assert_eq!(
            pod.metadata.labels.unwrap()["controller-revision-hash"],
            new_revision
        );
        let image = pod.spec.unwrap().containers[0].image.clone();
        assert_eq!(image.as_deref(), Some("questdb/questdb:9.0.1"));
    }

    sets.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    wait_for(&pods, "db-1", "scaled away", |p: Option<&Pod>| p.is_none()).await;
    wait_for(&sets, "db", "status shows 1", |s: Option<&StatefulSet>| {
        s.and_then(|s| s.status.as_ref())
            .is_some_and(|st| st.replicas == 1 && st.ready_replicas == Some(1))
    })
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    assert!(
        pvcs.get_opt("data-db-1").await.unwrap().is_some(),
        "claims survive scale down"
    );
    assert!(pods.get_opt("db-0").await.unwrap().is_some());
    sim.shutdown().await;
}

#[tokio::test]
async fn cloud_node_registers_with_provider_id_and_leaves_when_removed() {
    let (sim, client) = start(three_nodes()).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let spec = NodeSpec::aws_instance("ip-10-1-2-3.ec2.internal", ZONE_B, "i-0abc123")
        .with_label("node.kubernetes.io/instance-type", "m6i.large")
        .with_taint("questdb.io/dedicated", Some("db1"), "NoSchedule");
    sim.cluster().add_node(spec).await.unwrap();

    let node = wait_for(
        &nodes,
        "ip-10-1-2-3.ec2.internal",
        "Ready",
        |n: Option<&Node>| node_ready_status(n).as_deref() == Some("True"),
    )
    .await
    .unwrap();
    let node_spec = node.spec.clone().unwrap();
    assert_eq!(
        node_spec.provider_id.as_deref(),
        Some("aws:///us-east-1b/i-0abc123")
    );
    assert!(
        taint_keys(&node).contains(&("questdb.io/dedicated".to_string(), "NoSchedule".to_string()))
    );
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["node.kubernetes.io/instance-type"], "m6i.large");
    assert_eq!(labels["topology.kubernetes.io/zone"], ZONE_B);
    let addresses = node.status.unwrap().addresses.unwrap();
    assert!(addresses.iter().any(|a| a.type_ == "InternalIP"));

    let pinned = PodSpec {
        node_selector: Some(BTreeMap::from([(
            "kubernetes.io/hostname".into(),
            "ip-10-1-2-3.ec2.internal".into(),
        )])),
        tolerations: Some(vec![Toleration {
            key: Some("questdb.io/dedicated".into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        }]),
        ..PodSpec::default()
    };
    pods.create(&PostParams::default(), &bare_pod("db1", pinned))
        .await
        .unwrap();
    wait_for(&pods, "db1", "Ready on the new node", pod_ready).await;

    sim.cluster()
        .remove_node("ip-10-1-2-3.ec2.internal")
        .await
        .unwrap();
    wait_for(
        &nodes,
        "ip-10-1-2-3.ec2.internal",
        "deleted",
        |n: Option<&Node>| n.is_none(),
    )
    .await;
    // Pod GC removes pods bound to a node that no longer exists.
    wait_for(&pods, "db1", "garbage-collected", |p: Option<&Pod>| {
        p.is_none()
    })
    .await;
    sim.shutdown().await;
}

fn claim(name: &str, class: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity("5Gi".into()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

#[tokio::test]
async fn released_volumes_are_retained_or_deleted_by_reclaim_policy() {
    let mut cfg = ClusterConfig::default();
    cfg.storage_classes.push(StorageClassSpec {
        name: "kept".into(),
        default: false,
        wait_for_first_consumer: false,
        reclaim_policy: "Retain".into(),
        allow_volume_expansion: false,
    });
    let (sim, client) = start_with(three_nodes(), cfg).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pp = PostParams::default();

    // Immediate binding: provisioned without a consumer, in the cluster's first zone.
    pvcs.create(&pp, &claim("keep", "kept")).await.unwrap();
    let kept = bound_pv(&client, "keep").await;
    assert_eq!(pv_zone(&kept), ZONE_A);
    let kept_name = kept.metadata.name.clone().unwrap();
    pvcs.delete("keep", &DeleteParams::default()).await.unwrap();
    wait_for(
        &pvs,
        &kept_name,
        "Released and kept",
        |pv: Option<&PersistentVolume>| {
            pv.and_then(|pv| pv.status.as_ref()?.phase.clone())
                .as_deref()
                == Some("Released")
        },
    )
    .await;

    // Delete policy: the PV goes once the claim is gone and the volume detached.
    pvcs.create(&pp, &claim("scratch", "gp3")).await.unwrap();
    let spec = PodSpec {
        volumes: Some(vec![Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: "scratch".into(),
                read_only: None,
            }),
            ..Volume::default()
        }]),
        ..PodSpec::default()
    };
    pods.create(&pp, &bare_pod("user", spec)).await.unwrap();
    let user = wait_for(&pods, "user", "Ready", pod_ready).await.unwrap();
    let scratch = bound_pv(&client, "scratch").await;
    let scratch_name = scratch.metadata.name.clone().unwrap();
    let va = volume_attachment_name(&handle(&scratch), DRIVER, &node_of(&user));
    pods.delete("user", &DeleteParams::default()).await.unwrap();
    wait_for(&pods, "user", "stopped and removed", |p: Option<&Pod>| {
        p.is_none()
    })
    .await;
    wait_for(&vas, &va, "detached", |a: Option<&VolumeAttachment>| {
        a.is_none()
    })
    .await;
    pvcs.delete("scratch", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        &pvs,
        &scratch_name,
        "deleted",
        |pv: Option<&PersistentVolume>| pv.is_none(),
    )
    .await;
    assert!(
        pvs.get_opt(&kept_name).await.unwrap().is_some(),
        "retained PV stays"
    );
    sim.shutdown().await;
}

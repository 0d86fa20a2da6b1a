//! `spec.pod` on the real control plane: each field reaches the database pod, taking it out
//! takes it off the pod, the apiserver refuses what would override the operator, a pod the
//! scheduler cannot place says so in `Ready`, and a database runs where `restricted` Pod
//! Security is enforced.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use questdb_operator::api::QuestDB;
use serde_json::json;

use crate::harness::{is_ready, wait_for, wait_for_event, wait_until, Env};

const NS: &str = "platform";

/// The database pod of `name`, once it exists.
async fn database_pod(env: &Env, ns: &str, name: &str) -> Pod {
    let pods: Api<Pod> = env.api(ns);
    let selector = format!("app.kubernetes.io/instance={name}");
    let list = ListParams::default().labels(&selector);
    wait_until("the database pod exists", || {
        let pods = pods.clone();
        let list = list.clone();
        async move { !pods.list(&list).await.unwrap().items.is_empty() }
    })
    .await;
    pods.list(&list).await.unwrap().items.remove(0)
}

/// A new QuestDB `name` whose `spec.pod` is the JSON `pod` (as a user would write it).
fn with_pod(ns: &str, name: &str, pod: serde_json::Value) -> QuestDB {
    let mut q = questdb_operator::desired::testing::questdb(name, ns);
    q.metadata = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    let mut value = serde_json::to_value(&q).unwrap();
    value["spec"]["pod"] = pod;
    serde_json::from_value(value).unwrap()
}

/// The QuestDB `spec` JSON with `pod` set, through the apiserver's own validation.
async fn create(env: &Env, ns: &str, name: &str, pod: serde_json::Value) -> kube::Result<QuestDB> {
    env.api::<QuestDB>(ns)
        .create(&PostParams::default(), &with_pod(ns, name, pod))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pod_field_reaches_the_database_pod_and_taking_it_out_takes_it_off() {
    let env = Env::start().await;
    env.namespace(NS).await;
    Api::<PriorityClass>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &PriorityClass {
                metadata: ObjectMeta {
                    name: Some("databases".into()),
                    ..Default::default()
                },
                value: 1000,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let pod = json!({
        "labels": {"team": "payments"},
        "annotations": {"sidecar.istio.io/inject": "false"},
        "statefulSetAnnotations": {"backup.velero.io/backup-volumes": "data"},
        "nodeSelector": {"topology.kubernetes.io/zone": "sim-zone-b"},
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "db1"}}
        }],
        "securityContext": {"supplementalGroups": [2000]},
        "containerSecurityContext": {"readOnlyRootFilesystem": false},
        "imagePullSecrets": [{"name": "registry"}],
        "priorityClassName": "databases",
        "terminationGracePeriodSeconds": 120,
        "extraVolumes": [{"name": "import", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "import", "mountPath": "/var/lib/questdb/import"}],
    });
    create(&env, NS, "db1", pod).await.expect("accepted");
    let qdbs = env.api::<QuestDB>(NS);
    wait_for(&qdbs, "db1", "QuestDB Ready", is_ready()).await;

    let p = database_pod(&env, NS, "db1").await;
    let spec = p.spec.clone().unwrap();
    assert_eq!(p.labels().get("team").map(String::as_str), Some("payments"));
    assert_eq!(
        p.annotations()
            .get("sidecar.istio.io/inject")
            .map(String::as_str),
        Some("false")
    );
    assert_eq!(
        spec.node_name.as_deref(),
        Some("worker-b1"),
        "the node selector placed it in zone b"
    );
    assert!(spec
        .tolerations
        .iter()
        .flatten()
        .any(|t| t.key.as_deref() == Some("spot")));
    assert_eq!(spec.topology_spread_constraints.iter().flatten().count(), 1);
    assert_eq!(
        spec.security_context.clone().unwrap().supplemental_groups,
        Some(vec![2000])
    );
    assert_eq!(spec.image_pull_secrets.clone().unwrap()[0].name, "registry");
    assert_eq!(spec.priority_class_name.as_deref(), Some("databases"));
    assert_eq!(spec.priority, Some(1000), "the PriorityClass was resolved");
    assert_eq!(spec.termination_grace_period_seconds, Some(120));
    assert!(spec.volumes.iter().flatten().any(|v| v.name == "import"));
    assert!(spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == "/var/lib/questdb/import"));
    let sts: Api<StatefulSet> = env.api(NS);
    let s = sts.get("db1").await.unwrap();
    assert_eq!(
        s.annotations()
            .get("backup.velero.io/backup-volumes")
            .map(String::as_str),
        Some("data")
    );

    // The user takes the fields out, first those whose absence a "desired is a subset of
    // stored" check cannot see (the stored object keeps a superset), then the rest:
    // server-side apply takes them off the StatefulSet, and the pod that replaces the old one
    // has none of them.
    let old_uid = p.uid();
    qdbs.patch(
        "db1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"pod": {
            "labels": null, "annotations": null, "statefulSetAnnotations": null,
            "nodeSelector": null, "tolerations": null, "topologySpreadConstraints": null,
            "securityContext": null, "imagePullSecrets": null, "priorityClassName": null,
        }}})),
    )
    .await
    .unwrap();
    wait_until("the StatefulSet loses the fields taken out", || {
        let sts = sts.clone();
        async move {
            let s = sts.get("db1").await.unwrap();
            let t = s.spec.unwrap().template;
            let spec = t.spec.unwrap();
            !s.metadata
                .annotations
                .unwrap_or_default()
                .contains_key("backup.velero.io/backup-volumes")
                && !t
                    .metadata
                    .unwrap()
                    .labels
                    .unwrap_or_default()
                    .contains_key("team")
                && spec.node_selector.is_none()
                && spec.tolerations.is_none()
                && spec.topology_spread_constraints.is_none()
                && spec.image_pull_secrets.is_none()
                && spec.priority_class_name.is_none()
                && spec
                    .security_context
                    .is_some_and(|c| c.supplemental_groups.is_none())
        }
    })
    .await;
    qdbs.patch(
        "db1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"pod": null}})),
    )
    .await
    .unwrap();
    wait_until("the StatefulSet loses the rest", || {
        let sts = sts.clone();
        async move {
            let spec = sts
                .get("db1")
                .await
                .unwrap()
                .spec
                .unwrap()
                .template
                .spec
                .unwrap();
            spec.termination_grace_period_seconds == Some(60)
                && spec.volumes.iter().flatten().all(|v| v.name != "import")
        }
    })
    .await;
    wait_until("a new database pod without the fields", || {
        let pods: Api<Pod> = env.api(NS);
        let old_uid = old_uid.clone();
        async move {
            pods.list(&ListParams::default().labels("app.kubernetes.io/instance=db1"))
                .await
                .unwrap()
                .items
                .iter()
                .any(|p| {
                    p.uid() != old_uid
                        && !p.labels().contains_key("team")
                        && p.spec.as_ref().unwrap().priority_class_name.is_none()
                })
        }
    })
    .await;
    wait_for(&qdbs, "db1", "QuestDB Ready again", is_ready()).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apiserver_refuses_pod_fields_that_would_override_the_operator() {
    let env = Env::start().await;
    env.namespace(NS).await;
    let refused = [
        (
            json!({"tolerations": [{"operator": "Exists"}]}),
            "a toleration needs a key",
        ),
        (
            json!({"tolerations": [{"key": "crd.questdb.io/dedicated", "operator": "Exists"}]}),
            "keys under crd.questdb.io/",
        ),
        (
            json!({"labels": {"app.kubernetes.io/instance": "other"}}),
            "pod.labels: app.kubernetes.io/instance is the operator's",
        ),
        (
            json!({"annotations": {"crd.questdb.io/config-hash": "x"}}),
            "keys under crd.questdb.io/ are the operator's",
        ),
        (
            json!({"extraVolumes": [{"name": "data", "emptyDir": {}}]}),
            "the volume names data, config, ilp-auth are the operator's",
        ),
        (
            json!({"extraVolumes": [{"name": "x", "emptyDir": {}}],
                   "extraVolumeMounts": [{"name": "x", "mountPath": "/var/lib/questdb/conf"}]}),
            "/var/lib/questdb and its conf, db, .checkpoint are the operator's",
        ),
        // A mount over the tables (an emptyDir there) would make every table absent from
        // every backup, and every restore empty.
        (
            json!({"extraVolumes": [{"name": "x", "emptyDir": {}}],
                   "extraVolumeMounts": [{"name": "x", "mountPath": "/var/lib/questdb/db"}]}),
            "a mount over the tables or the checkpoint hides them from every backup",
        ),
        (
            json!({"extraVolumeMounts": [{"name": "nowhere", "mountPath": "/mnt"}]}),
            "every mount names one of pod.extraVolumes",
        ),
        // The tables, named around the prefix check.
        (
            json!({"extraVolumes": [{"name": "x", "emptyDir": {}}],
                   "extraVolumeMounts": [{"name": "x", "mountPath": "/var/lib/questdb//db"}]}),
            "a mount path is written plainly",
        ),
    ];
    for (i, (pod, message)) in refused.into_iter().enumerate() {
        let err = create(&env, NS, &format!("bad{i}"), pod.clone())
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(message), "{pod}: {err}");
    }

    // A dedicated database: its placement is the operator's.
    let mut q = questdb_operator::desired::testing::questdb("dedicated", NS);
    q.metadata = ObjectMeta {
        name: Some("dedicated".into()),
        ..Default::default()
    };
    q.spec.node = Some(questdb_operator::api::NodeSpec {
        image: "ami-0abcdef1234567890".into(),
        instance_type: "m6i.large".into(),
        zone: "sim-zone-a".into(),
        ..Default::default()
    });
    let mut value = serde_json::to_value(&q).unwrap();
    value["spec"]["pod"] =
        json!({"tolerations": [{"key": "spot", "operator": "Exists"}], "nodeSelector": {"a": "b"}});
    let q: QuestDB = serde_json::from_value(value).unwrap();
    let err = env
        .api::<QuestDB>(NS)
        .create(&PostParams::default(), &q)
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("pod.tolerations cannot be set on a database with a dedicated node")
            && text.contains("pod.nodeSelector cannot be set on a database with a dedicated node"),
        "{text}"
    );

    // The settings that would make a restore start from whatever the snapshot caught (torn
    // writes included), or put tables outside the snapshotted volume.
    for key in [
        "cairo.checkpoint.recovery.enabled",
        "cairo.snapshot.recovery.enabled",
        "cairo.volumes",
    ] {
        let mut q = questdb_operator::desired::testing::questdb("recovery", NS);
        q.metadata = ObjectMeta {
            name: Some("recovery".into()),
            ..Default::default()
        };
        q.spec.config.server.insert(key.into(), "false".into());
        let err = env
            .api::<QuestDB>(NS)
            .create(&PostParams::default(), &q)
            .await
            .expect_err("refused");
        assert!(
            err.to_string()
                .contains(&format!("server.conf key {key} is managed by the operator")),
            "{key}: {err}"
        );
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_pod_no_node_can_take_says_why_instead_of_pending_silently() {
    let env = Env::start().await;
    env.namespace(NS).await;
    create(
        &env,
        NS,
        "nowhere",
        json!({"nodeSelector": {"topology.kubernetes.io/zone": "no-such-zone"}}),
    )
    .await
    .expect("accepted: the apiserver cannot know the cluster's zones");
    let qdbs = env.api::<QuestDB>(NS);
    // The scheduler's words reach the QuestDB, and follow them: right after the cluster starts
    // they may still name the nodes' not-ready taints, then the selector nothing matches.
    let q = wait_for(
        &qdbs,
        "nowhere",
        "Ready=False Unschedulable naming the node selector",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Ready"
                        && c.reason == "Unschedulable"
                        && c.message.starts_with(
                            "the database pod cannot be scheduled: 0/3 nodes are available",
                        )
                        && c.message.contains("node affinity/selector")
                })
            })
        },
    )
    .await;
    let status = q.status.unwrap();
    assert_eq!(status.phase.map(|p| p.as_str()), Some("Pending"));
    wait_for_event(&env, NS, "an Unschedulable warning", |e| {
        e.reason.as_deref() == Some("Unschedulable")
            && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("QuestDB")
    })
    .await;

    // Fixing the selector schedules it.
    qdbs.patch(
        "nowhere",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"pod": {"nodeSelector": null}}})),
    )
    .await
    .unwrap();
    wait_for(&qdbs, "nowhere", "QuestDB Ready", is_ready()).await;
    env.stop().await;
}

/// A namespace whose Pod Security admission enforces `level`.
async fn namespace_enforcing(env: &Env, ns: &str, level: &str) {
    Api::<Namespace>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    labels: Some(BTreeMap::from([(
                        "pod-security.kubernetes.io/enforce".to_string(),
                        level.to_string(),
                    )])),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_runs_where_restricted_pod_security_is_enforced() {
    let env = Env::start().await;
    let ns = "restricted";
    namespace_enforcing(&env, ns, "restricted").await;
    // The apiserver does enforce it here: a pod that asks for root is refused.
    let pods: Api<Pod> = env.api(ns);
    let root: Pod = serde_json::from_value(json!({
        "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"runAsUser": 0}}]}
    }))
    .unwrap();
    let err = pods
        .create(&PostParams::default(), &root)
        .await
        .expect_err("restricted refuses a root pod");
    assert!(err.to_string().contains("restricted"), "{err}");

    env.create_questdb(ns, "db1", |_| {}).await;
    wait_for(&env.api::<QuestDB>(ns), "db1", "QuestDB Ready", is_ready()).await;
    env.stop().await;
}

/// The harm (from a security review): a tenant who may only edit QuestDBs, in a namespace
/// labelled `privileged` (a dedicated database's host ports need it) or not labelled at all,
/// asks for a privileged pod with the node's filesystem and gets a root shell on the node.
/// The apiserver refuses each such setting by the QuestDB schema itself, whatever the
/// namespace's Pod Security label, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_privileged_or_host_reaching_pod_is_refused_whatever_the_namespace_allows() {
    let env = Env::start().await;
    let ns = "privileged";
    namespace_enforcing(&env, ns, "privileged").await;
    let refused = [
        (
            json!({"containerSecurityContext": {"privileged": true}}),
            "pod.containerSecurityContext.privileged",
        ),
        (
            json!({"containerSecurityContext": {"allowPrivilegeEscalation": true}}),
            "pod.containerSecurityContext.allowPrivilegeEscalation",
        ),
        (
            json!({"containerSecurityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
            "pod.containerSecurityContext.capabilities.add",
        ),
        (
            json!({"securityContext": {"runAsUser": 0}}),
            "pod.securityContext.runAsUser",
        ),
        (
            json!({"containerSecurityContext": {"runAsNonRoot": false}}),
            "pod.containerSecurityContext.runAsNonRoot",
        ),
        (
            json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
            "pod.securityContext.seccompProfile",
        ),
        (
            json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
            "pod.securityContext.sysctls",
        ),
        (
            json!({"extraVolumes": [{"name": "host", "hostPath": {"path": "/"}}]}),
            "pod.extraVolumes: only emptyDir",
        ),
        (
            json!({"extraVolumes": [{"name": "share", "nfs": {"server": "10.0.0.1", "path": "/"}}]}),
            "pod.extraVolumes: only emptyDir",
        ),
        (
            json!({"extraVolumes": [{"name": "disk", "awsElasticBlockStore": {"volumeID": "vol-0123456789abcdef0"}}]}),
            "pod.extraVolumes: only emptyDir",
        ),
        (
            json!({"extraVolumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]}),
            "may not carry a service account token",
        ),
    ];
    for (i, (pod, message)) in refused.into_iter().enumerate() {
        let err = create(&env, ns, &format!("bad{i}"), pod.clone())
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(message), "{pod}: {err}");
    }
    // What a platform team ordinarily sets is accepted.
    create(
        &env,
        ns,
        "fine",
        json!({"securityContext": {"runAsUser": 20000, "fsGroup": 20000},
               "containerSecurityContext": {"readOnlyRootFilesystem": true,
                                            "capabilities": {"add": ["NET_BIND_SERVICE"]}},
               "extraVolumes": [{"name": "import", "emptyDir": {}},
                                {"name": "cfg", "configMap": {"name": "x"}}]}),
    )
    .await
    .expect("a restricted pod is accepted");
    env.stop().await;
}

/// The harm: a tenant, through the role the project ships for tenants, turning a QuestDB edit
/// into a root shell on a node, or forging the operator's records in status. Acting as that
/// tenant (the apiserver's own authentication, authorization and admission), a privileged pod,
/// a host or NFS volume, a root user, the cluster's critical priority classes, tolerations of
/// the control plane's or a fenced node's taint and affinity to other namespaces' pods are
/// refused naming the field, an ordinary database is accepted, and its status cannot be
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_the_shipped_role_gets_a_database_not_a_host_nor_its_status() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
    let env = Env::start().await;
    let ns = "team-a";
    namespace_enforcing(&env, ns, "privileged").await;
    let role: ClusterRole = serde_yaml_ng::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/tenant/clusterrole.yaml"
        ))
        .unwrap(),
    )
    .unwrap();
    Api::<ClusterRole>::all(env.client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("the tenant role installs");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "alice-questdb", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "questdb-tenant"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(env.client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let mut config = env.cp.client_config().await;
    config.auth_info.impersonate = Some("alice".into());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
    let alice = kube::Client::try_from(config).unwrap();
    let qdbs = Api::<QuestDB>::namespaced(alice, ns);

    for (pod, field) in [
        (
            json!({"containerSecurityContext": {"privileged": true}}),
            "pod.containerSecurityContext.privileged",
        ),
        (
            json!({"extraVolumes": [{"name": "host", "hostPath": {"path": "/"}}]}),
            "pod.extraVolumes: only emptyDir",
        ),
        (
            json!({"securityContext": {"runAsUser": 0}}),
            "pod.securityContext.runAsUser",
        ),
        (
            json!({"extraVolumes": [{"name": "share", "nfs": {"server": "10.0.0.2", "path": "/"}}]}),
            "pod.extraVolumes: only emptyDir",
        ),
        // Preempts other tenants' pods and outranks the node's own daemons.
        (
            json!({"priorityClassName": "system-node-critical"}),
            "pod.priorityClassName",
        ),
        // Onto the control plane's nodes, or kept on a node the failover has fenced.
        (
            json!({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}),
            "pod.tolerations",
        ),
        (
            json!({"tolerations": [{"key": "node.kubernetes.io/out-of-service", "operator": "Exists"}]}),
            "pod.tolerations",
        ),
        // Following another tenant's database onto its node.
        (
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "theirs"}},
                "namespaceSelector": {},
            }]}}}),
            "pod.affinity",
        ),
        (
            json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 1,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "namespaces": ["team-b"],
                },
            }]}}}),
            "pod.affinity",
        ),
    ] {
        let err = qdbs
            .create(&PostParams::default(), &with_pod(ns, "bad", pod.clone()))
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(field), "{pod}: {err}");
    }
    // What a tenant legitimately asks for: its own priority class and taint, spreading from
    // its own pods.
    let legitimate = json!({
        "priorityClassName": "databases",
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 1,
            "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "questdb"}},
            },
        }]}},
    });
    qdbs.create(&PostParams::default(), &with_pod(ns, "mine", legitimate))
        .await
        .expect("alice creates a database");
    let forged = json!({"status": {"instanceID": "i-0123456789abcdef0"}});
    let err = qdbs
        .patch_status(
            "mine",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&forged),
        )
        .await
        .expect_err("status is the operator's");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err}"
    );
    env.stop().await;
}

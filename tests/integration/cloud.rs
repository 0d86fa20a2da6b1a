//! Dedicated nodes and DNS end to end: the real manager, the memory cloud, and a kubelet that
//! registers a Node from every running instance's rendered user data.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use questdb_operator::api::QuestDB;
use questdb_operator::cloud::memory::InstanceEvent;
use questdb_operator::cloud::memory::MemoryEc2Options;
use questdb_operator::cloud::{InstanceState, LaunchRequest, NodeProvider};
use questdb_operator::desired::{names, DEDICATED_LABEL_KEY, DEDICATED_TAINT_KEY};
use questdb_operator::manager::CloudSettings;
use questdb_testenv::{node_name_for_instance as node_name_for, Fault, Verb};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::harness::{has_condition, is_ready, wait_for, wait_until};

use crate::harness::cloud::{
    aws_calls_in_reconciles, cloud_config, reconciles, settings, CloudEnv, AMI, NODE_GROUPS, NS,
};

use crate::harness::writes_settle;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_questdb_with_a_node_gets_its_own_instance_node_and_dns_and_releases_them_on_delete() {
    let mut env = CloudEnv::start(settings()).await;
    let created = env.create("db1", |_| {}).await;
    let uid = created.uid().expect("uid");

    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let status = q.status.clone().expect("status");
    let instances = env.cloud.ec2.instances();
    assert_eq!(instances.len(), 1, "one instance: {instances:?}");
    let instance = &instances[0];
    assert_eq!(status.instance_id.as_deref(), Some(instance.id.as_str()));
    assert_eq!(status.node_image.as_deref(), Some(AMI));
    assert_eq!(status.node_generation, Some(1));
    let node_name = node_name_for(&instance.id);
    assert_eq!(status.node_name.as_deref(), Some(node_name.as_str()));
    assert_eq!(status.node_ready, Some(true));
    assert_eq!(status.node_ip, instance.private_ip);
    assert_eq!(
        status.dns_name.as_deref(),
        Some(format!("db1.{NS}.db.example.com").as_str())
    );
    for (type_, reason) in [("NodeReady", "Ready"), ("DnsReady", "Published")] {
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == "True" && c.reason == reason),
            "{type_}: {:?}",
            status.conditions
        );
    }

    // The pod runs on the dedicated node, which carries the label and taint.
    let pod = Api::<Pod>::namespaced(env.client.clone(), NS)
        .get(&names::pod(&q))
        .await
        .expect("pod");
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node_name.as_str())
    );
    let node = Api::<Node>::all(env.client.clone())
        .get(&node_name)
        .await
        .expect("node");
    assert_dedicated(&node);

    // DNS names the pod's own address, one EC2 shows on the instance (the VPC CNI's), and no
    // port is bound on the node: the namespace needs no `privileged` Pod Security level.
    let records = env.cloud.route53.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].name, format!("db1.{NS}.db.example.com"));
    let pod = Api::<Pod>::namespaced(env.client.clone(), NS)
        .get(&names::pod(&q))
        .await
        .expect("pod");
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.pod_ip.as_ref()),
        Some(&records[0].ips[0]),
        "the record names the database pod's address"
    );
    assert!(
        instance.pod_addresses.contains(&records[0].ips[0]),
        "an address EC2 gives the instance: {:?}",
        instance.pod_addresses
    );
    let host_ports: Vec<i32> = pod
        .spec
        .as_ref()
        .map(|s| &s.containers[0])
        .and_then(|c| c.ports.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.host_port)
        .collect();
    assert_eq!(host_ports, Vec::<i32>::new(), "no port on the node address");
    assert_eq!(records[0].ttl, 5);
    // The preflight's own questions (the subnets, the hosted zone: once per start, whatever
    // the number of databases) are not the database's.
    let preflight = [
        "DescribeSubnets",
        "DescribeSecurityGroups",
        "DescribeInstanceTypes",
    ]
    .iter()
    .map(|op| env.cloud.ec2.call_count(op))
    .sum::<usize>()
        + 1;
    let provisioning = env.aws_calls() - preflight;
    eprintln!(
        "AWS calls to provision one QuestDB: {provisioning}, and {preflight} of the preflight (DescribeInstances {}, RunInstances {}, ListResourceRecordSets {}, ChangeResourceRecordSets {})",
        env.cloud.ec2.call_count("DescribeInstances"),
        env.cloud.ec2.call_count("RunInstances"),
        env.cloud.route53.call_count("ListResourceRecordSets"),
        env.cloud.route53.call_count("ChangeResourceRecordSets"),
    );
    assert_eq!(env.cloud.ec2.call_count("RunInstances"), 1);
    assert_eq!(env.cloud.route53.call_count("ChangeResourceRecordSets"), 1);
    assert!(
        provisioning <= 12,
        "provisioning is cheap: {provisioning} calls"
    );

    // Steady state: a full resync (new manager, new instance cache) writes nothing and asks
    // AWS nothing.
    writes_settle(&env.cp).await;
    env.cp.reset_request_counts();
    let aws_before = env.aws_calls();
    let in_reconciles_before = aws_calls_in_reconciles(&env.handle.metrics.render());
    env.stop_manager().await;
    let before = reconciles(&env.handle.metrics.render());
    env.start_manager().await;
    let metrics = env.handle.metrics.clone();
    wait_until("a reconcile after the restart", || {
        let m = metrics.clone();
        async move { reconciles(&m.render()) > before }
    })
    .await;
    writes_settle(&env.cp).await;
    let counts = env.cp.request_counts();
    assert_eq!(
        counts.writes(),
        0,
        "a no-op resync writes nothing: {counts:?}"
    );
    // Counted in the reconciles: the new leader's preflight asks AWS a few questions of its
    // own (the subnets, the hosted zone), once per start, whatever the number of databases.
    assert_eq!(
        aws_calls_in_reconciles(&env.handle.metrics.render()) - in_reconciles_before,
        0.0,
        "a converged QuestDB costs no AWS call ({} in all, the preflight's included)",
        env.aws_calls() - aws_before
    );

    // What an uninstall would leave now: `questdb-operator inventory` names the QuestDB, its
    // instance, record and claim, and says to delete the QuestDBs first.
    let pvc_name = names::pvc(&q);
    let inventory = || async {
        questdb_operator::inventory::collect(
            &env.client,
            None,
            Some(env.cloud.nodes.as_ref()),
            Some(env.cloud.dns.as_ref()),
        )
        .await
        .expect("inventory")
    };
    let before = inventory().await;
    let listed = |inv: &questdb_operator::inventory::Inventory| {
        inv.items
            .iter()
            .map(|i| (i.kind, i.name.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(&before),
        [
            ("QuestDB", format!("{NS}/db1")),
            ("instance", instance.id.clone()),
            ("record", format!("db1.{NS}.db.example.com")),
            ("claim", format!("{NS}/{pvc_name}")),
        ],
        "{}",
        before.render()
    );
    assert!(
        before.items[1]
            .detail
            .contains(&format!("QuestDB {NS}/db1")),
        "the instance's owner: {}",
        before.render()
    );
    assert!(
        before.render().contains("delete the QuestDBs first"),
        "{}",
        before.render()
    );

    // Delete: instance terminated, record gone, Node gone, PVC kept, QuestDB gone.
    env.qdbs()
        .delete("db1", &DeleteParams::default())
        .await
        .expect("delete");
    let qdbs = env.qdbs();
    wait_until("QuestDB deleted", || {
        let qdbs = qdbs.clone();
        async move { qdbs.get_opt("db1").await.ok().flatten().is_none() }
    })
    .await;
    assert!(
        env.live_instances_of(&uid).is_empty(),
        "instance terminated"
    );
    assert!(env.cloud.route53.records().is_empty(), "record deleted");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), NS);
    assert!(
        pvcs.get_opt(&pvc_name).await.expect("get").is_some(),
        "PVC kept"
    );
    // Only the retained claim would remain, and the inventory says it outlives its QuestDB.
    let after = inventory().await;
    assert_eq!(
        listed(&after),
        [("claim", format!("{NS}/{pvc_name}"))],
        "{}",
        after.render()
    );
    assert!(
        after.items[0].detail.contains("retained")
            && after.render().contains("1 item(s) would remain"),
        "{}",
        after.render()
    );
    let nodes: Api<Node> = Api::all(env.client.clone());
    wait_until("the terminated instance's Node is gone", || {
        let nodes = nodes.clone();
        let name = node_name.clone();
        async move { nodes.get_opt(&name).await.ok().flatten().is_none() }
    })
    .await;
    env.stop().await;
}

/// A dedicated database listens on host ports, which the `baseline` and `restricted` Pod
/// Security levels forbid: the apiserver refuses its pod, and only the StatefulSet's events said
/// so. The QuestDB now says it, in the apiserver's words, and runs once the namespace allows it.
/// The Node carries the dedicated label and `NoSchedule` taint.
fn assert_dedicated(node: &Node) {
    assert!(node.labels().contains_key(DEDICATED_LABEL_KEY));
    assert!(node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts
            .iter()
            .any(|t| t.key == DEDICATED_TAINT_KEY && t.effect == "NoSchedule")));
}

/// A platform team on Bottlerocket passes the shipped example as the user-data template: the
/// node joins (the test environment's kubelet reads Bottlerocket's TOML settings as
/// Bottlerocket does, and refuses one without its cluster DNS address), born dedicated,
/// tainted and out of load balancers, and the database runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bottlerocket_node_joins_dedicated_and_runs_its_database() {
    let mut config = cloud_config();
    config.user_data_template = include_str!("../../examples/bottlerocket-user-data.toml").into();
    questdb_operator::cloud::user_data::check_template(&config).expect("template accepted");
    let env = CloudEnv::start_with_config(
        settings(),
        crate::harness::cluster(),
        MemoryEc2Options::default(),
        config,
    )
    .await;
    env.create("rocket", |_| {}).await;
    let q = wait_for(&env.qdbs(), "rocket", "Ready on Bottlerocket", is_ready()).await;
    let node_name = q
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("node name");
    let node = Api::<Node>::all(env.client.clone())
        .get(&node_name)
        .await
        .expect("node");
    assert_dedicated(&node);
    assert_eq!(
        node.labels()
            .get("node.kubernetes.io/exclude-from-external-load-balancers")
            .map(String::as_str),
        Some("true")
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_apiserver_refuses_is_reported_in_the_apiservers_words() {
    let env = CloudEnv::start(settings()).await;
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone());
    let enforce = |level: &'static str| {
        let namespaces = namespaces.clone();
        async move {
            let labels =
                json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}});
            namespaces
                .patch(
                    NS,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(labels),
                )
                .await
                .expect("namespace labelled");
        }
    };
    enforce("baseline").await;
    // Host ports asked for: Pod Security's baseline level refuses them.
    env.create("db1", |q| {
        q.spec.node.as_mut().expect("node").host_ports = Some(true);
    })
    .await;
    let q = wait_for(
        &env.qdbs(),
        "db1",
        "the refusal is reported",
        has_condition("Ready", "PodRefused"),
    )
    .await;
    let message = crate::harness::condition_message(&q, "Ready");
    assert!(
        message.contains("violates PodSecurity") && message.contains("hostPort"),
        "{message}"
    );
    assert_eq!(
        q.status.as_ref().and_then(|s| s.phase),
        Some(questdb_operator::api::Phase::Failed)
    );

    enforce("privileged").await;
    wait_for(&env.qdbs(), "db1", "Ready once allowed", is_ready()).await;
    env.stop().await;
}

/// Host ports need a `privileged` namespace, where any pod a tenant may create could be
/// privileged too. A dedicated database runs where Pod Security enforces `restricted`, and its
/// clients reach it at the record's address (the pod's, which EC2 gives the instance).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedicated_database_needs_no_namespace_that_allows_privileged_pods() {
    let env = CloudEnv::start_with_real_databases(settings()).await;
    let restricted = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .patch(NS, &PatchParams::default(), &Patch::Merge(restricted))
        .await
        .expect("namespace labelled");
    env.create("db1", crate::database::real).await;
    let q = wait_for(&env.qdbs(), "db1", "Ready under restricted", is_ready()).await;
    let records = env.cloud.route53.records();
    assert_eq!(records.len(), 1, "{records:?}");
    let address = records[0].ips[0].clone();
    assert_eq!(
        q.status.as_ref().and_then(|s| s.dns_ip.clone()),
        Some(address.clone())
    );
    let secret: k8s_openapi::api::core::v1::Secret = Api::namespaced(env.client.clone(), NS)
        .get("db1-credentials")
        .await
        .expect("credentials Secret");
    let data = secret.data.unwrap_or_default();
    let text = |k: &str| String::from_utf8(data[k].0.clone()).expect("utf-8");
    let (user, password) = (
        text(questdb_operator::desired::credentials::HTTP_USER),
        text(questdb_operator::desired::credentials::HTTP_PASSWORD),
    );
    let login = Some((user.as_str(), password.as_str()));
    let at_record = format!("{address}:9000");
    let status = crate::db_client::ilp_http(&at_record, "ticks v=1i\nticks v=2i\n", login)
        .await
        .expect("the database answers at the record's address");
    assert_eq!(status, 204, "rows committed through the record's address");
    wait_until("the rows are visible at the record's address", || {
        let at_record = at_record.clone();
        let (user, password) = (user.clone(), password.clone());
        async move {
            crate::db_client::count(&at_record, "ticks", Some((&user, &password))).await == Some(2)
        }
    })
    .await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_ami_is_reported_with_the_aws_message_without_a_retry_storm() {
    let env = CloudEnv::start(settings()).await;
    env.create("bad", |q| {
        if let Some(n) = q.spec.node.as_mut() {
            n.image = "ami-00000000000000bad".into();
        }
    })
    .await;
    let q = wait_for(
        &env.qdbs(),
        "bad",
        "NodeReady=LaunchFailed",
        has_condition("NodeReady", "LaunchFailed"),
    )
    .await;
    let status = q.status.clone().expect("status");
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == "NodeReady")
        .expect("NodeReady");
    assert!(c.message.contains("ami-00000000000000bad"), "{}", c.message);
    assert_eq!(status.phase.map(|p| p.as_str()), Some("Provisioning"));

    // More reconciles (label edits) must not launch again.
    let before = reconciles(&env.handle.metrics.render());
    for i in 0..3 {
        env.qdbs()
            .patch(
                "bad",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"poke": i.to_string()}}})),
            )
            .await
            .expect("label");
    }
    let metrics = env.handle.metrics.clone();
    wait_until("three more reconciles", || {
        let m = metrics.clone();
        async move { reconciles(&m.render()) >= before + 3.0 }
    })
    .await;
    assert_eq!(env.cloud.ec2.call_count("RunInstances"), 1);
    assert!(env.cloud.ec2.instances().is_empty());
    env.stop().await;
}

/// A tenant asks for an image the operator does not allow (one they built, say) and for an
/// instance type outside the list: refused before any launch, with `NodeReady=False` naming
/// the rule; the allowed one next to it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_image_or_type_outside_the_allow_list_is_never_launched() {
    let mut config = cloud_config();
    config.allow_list = questdb_operator::cloud::LaunchAllowList {
        images: vec![AMI.into()],
        image_owners: Vec::new(),
        instance_types: vec!["m6i.*".into()],
    };
    let tenant_build = "ami-0ten4n7b01d000000";
    let ec2 = MemoryEc2Options::default();
    let env = CloudEnv::start_with_config(settings(), crate::harness::cluster(), ec2, config).await;
    env.cloud.ec2.add_image(tenant_build);
    env.create("built", |q| {
        q.spec.node.as_mut().expect("node").image = tenant_build.into();
    })
    .await;
    env.create("huge", |q| {
        q.spec.node.as_mut().expect("node").instance_type = "u-24tb1.metal".into();
    })
    .await;
    env.create("allowed", |_| {}).await;
    for (name, what) in [("built", tenant_build), ("huge", "u-24tb1.metal")] {
        let q = wait_for(
            &env.qdbs(),
            name,
            "NodeReady=False, the launch refused",
            |q: Option<&QuestDB>| {
                q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "NodeReady"
                            && c.status == "False"
                            && c.message.contains("--allowed-node-")
                    })
                })
            },
        )
        .await;
        let message = q
            .status
            .expect("status")
            .conditions
            .into_iter()
            .find(|c| c.type_ == "NodeReady")
            .expect("NodeReady")
            .message;
        assert!(message.contains(what), "{message}");
    }
    wait_for(&env.qdbs(), "allowed", "the allowed one Ready", is_ready()).await;
    assert_eq!(
        env.cloud.ec2.call_count("RunInstances"),
        1,
        "only the allowed launch"
    );
    env.stop().await;
}

/// EC2 has no m6i.large in the volume's zone: the database runs on the first fallback type
/// that launches, says so in its status, and is not moved off it in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_shortage_falls_back_to_the_next_instance_type_without_moving_back() {
    let env = CloudEnv::start(settings()).await;
    env.cloud
        .ec2
        .set_no_capacity_for("sim-zone-a", "m6i.large", true);
    env.create("db1", |q| {
        if let Some(n) = q.spec.node.as_mut() {
            n.fallback_instance_types = vec!["m6i.xlarge".into()];
        }
    })
    .await;
    let q = wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let status = q.status.expect("status");
    assert_eq!(status.node_instance_type.as_deref(), Some("m6i.xlarge"));
    assert_eq!(env.cloud.ec2.instances().len(), 1);
    assert_eq!(env.cloud.ec2.instances()[0].instance_type, "m6i.xlarge");
    writes_settle(&env.cp).await;
    let q = env.qdbs().get("db1").await.expect("db1");
    let status = q.status.expect("status");
    assert!(status.node_move.is_none(), "{:?}", status.node_move);
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "NodeMove" && c.status == "True"),
        "{:?}",
        status.conditions
    );
    assert_eq!(env.cloud.ec2.instances().len(), 1, "no second launch");

    // A node move while the shortage lasts lands on the fallback too, and says so.
    env.qdbs()
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": {
                "image": "ami-0fedcba9876543210", "rollbackWindow": "0s"
            }}})),
        )
        .await
        .expect("patch image");
    let q = wait_for(&env.qdbs(), "db1", "moved", |q: Option<&QuestDB>| {
        q.and_then(|q| q.status.as_ref()?.node_move.clone())
            .is_some_and(|u| u.phase == "Completed")
    })
    .await;
    let status = q.status.expect("status");
    assert_eq!(status.node_image.as_deref(), Some("ami-0fedcba9876543210"));
    assert_eq!(status.node_instance_type.as_deref(), Some("m6i.xlarge"));
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_backed_off_and_ends_ready() {
    let env = CloudEnv::start(settings()).await;
    env.cloud.ec2.throttle_next(12);
    env.cloud.route53.throttle_next(6);
    env.create("slow", |_| {}).await;
    wait_for(&env.qdbs(), "slow", "QuestDB Ready", is_ready()).await;
    assert_eq!(env.cloud.ec2.instances().len(), 1);
    // On-call sees the failing reconciles: a counter by reason, and one Warning event for the
    // streak (not one per retry).
    let failed = env
        .handle
        .metrics
        .render()
        .lines()
        .filter(|l| {
            l.starts_with("questdb_operator_reconcile_errors_total{")
                && l.contains("reason=\"CloudApiError\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert!(failed >= 1.0, "reconcile errors counted: {failed}");
    let warnings: Vec<_> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(env.client.clone(), NS)
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("CloudApiError"))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("slow"))
            .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let note = warnings[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("DescribeInstances is still throttled"),
        "{note}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_releases_the_node_keeps_the_dns_name_reserved_and_unpause_brings_a_new_node_on_the_same_volume(
) {
    let env = CloudEnv::start(settings()).await;
    let created = env.create("p1", |_| {}).await;
    let uid = created.uid().expect("uid");
    let q = wait_for(&env.qdbs(), "p1", "QuestDB Ready", is_ready()).await;
    let first = q
        .status
        .as_ref()
        .and_then(|s| s.instance_id.clone())
        .expect("instance");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), NS);
    let pvc_uid = pvcs.get(&names::pvc(&q)).await.expect("pvc").uid();

    // Whenever EC2 is asked to terminate the instance, the database pod must already be gone
    // (QuestDB got its termination grace, the kubelet unmounted the volume).
    let pod_at_termination = pod_at_first_termination(&env, names::pod(&q));
    let paused = |p: bool| Patch::Merge(json!({"spec": {"paused": p}}));
    env.qdbs()
        .patch("p1", &PatchParams::default(), &paused(true))
        .await
        .expect("pause");
    let name = q.spec.dns.clone().expect("dns").name;
    wait_for(&env.qdbs(), "p1", "node released", |q: Option<&QuestDB>| {
        q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
            s.instance_id.is_none() && s.dns_ip.is_none() && s.dns_name.as_ref() == Some(&name)
        })
    })
    .await;
    assert!(
        pod_at_termination.await.expect("watcher").is_none(),
        "the instance was terminated while the database pod still existed"
    );
    assert!(env.live_instances_of(&uid).is_empty());
    assert!(env.cloud.route53.records().is_empty());
    // The name stays p1's while it is paused: another QuestDB cannot take it and receive the
    // clients (and credentials) meant for p1.
    assert_eq!(
        env.cloud.route53.txt(&name).len(),
        1,
        "the ownership record stays"
    );
    let claimed = name.clone();
    env.create("claimer", move |q| {
        q.spec.dns.as_mut().expect("dns").name = claimed;
    })
    .await;
    wait_for(
        &env.qdbs(),
        "claimer",
        "the claim refused",
        has_condition("DnsReady", "RecordOwnedElsewhere"),
    )
    .await;
    assert!(env.cloud.route53.records().is_empty());
    env.qdbs()
        .delete("claimer", &DeleteParams::default())
        .await
        .expect("delete claimer");

    env.qdbs()
        .patch("p1", &PatchParams::default(), &paused(false))
        .await
        .expect("unpause");
    let q = wait_for(&env.qdbs(), "p1", "Ready again", |q: Option<&QuestDB>| {
        is_ready_now(q)
            && q.and_then(|q| q.status.as_ref())
                .is_some_and(|s| s.instance_id.is_some())
    })
    .await;
    let status = q.status.clone().expect("status");
    let second = status.instance_id.expect("instance");
    assert_ne!(first, second, "a new node");
    // The predecessor's Node stays registered a while after its instance terminates (as on
    // EKS until the cloud controller removes it); the pod must never be placed there.
    let pod = Api::<Pod>::namespaced(env.client.clone(), NS)
        .get(&names::pod(&q))
        .await
        .expect("pod");
    assert_eq!(
        pod.spec.and_then(|s| s.node_name).as_deref(),
        status.node_name.as_deref(),
        "the database runs on the node of the new instance"
    );
    assert!(status
        .node_name
        .as_deref()
        .is_some_and(|n| n.starts_with(second.as_str())));
    assert_eq!(status.node_generation, Some(2));
    assert_eq!(env.live_instances_of(&uid), vec![second]);
    assert_eq!(
        pvcs.get(&names::pvc(&q)).await.expect("pvc").uid(),
        pvc_uid,
        "same volume"
    );
    assert_eq!(env.cloud.route53.records().len(), 1);
    env.stop().await;
}

/// The database pod as it is at the moment EC2 is first asked to terminate an instance.
fn pod_at_first_termination(env: &CloudEnv, pod_name: String) -> JoinHandle<Option<Pod>> {
    let mut terminations = env.cloud.ec2.subscribe();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), NS);
    tokio::spawn(async move {
        loop {
            if let Ok(InstanceEvent::Terminated(_)) = terminations.recv().await {
                return pods.get_opt(&pod_name).await.expect("pod read");
            }
        }
    })
}

fn is_ready_now(q: Option<&QuestDB>) -> bool {
    q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// An instance launched behind the operator's back, tagged as one of QuestDB `name`'s.
fn launch_request(
    name: &str,
    uid: &str,
    node_generation: i64,
    cluster_id: Option<String>,
) -> LaunchRequest {
    LaunchRequest {
        namespace: NS.into(),
        name: name.into(),
        uid: uid.into(),
        node_generation,
        image: AMI.into(),
        instance_type: "t3.micro".into(),
        zone: "sim-zone-b".into(),
        labels: Default::default(),
        taints: vec![],
        public_ip: false,
        fallback_instance_types: Vec::new(),
        cluster_id,
    }
}

/// The sweep takes only this cluster's instances: a cluster name can be reused (a small test
/// cluster named like the big one), the uid of the cluster's kube-system namespace cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_terminates_instances_whose_questdb_is_gone_and_leaked_older_generations() {
    let env = CloudEnv::start(CloudSettings {
        orphan_sweep_interval: Duration::from_millis(200),
        orphan_grace_period: Duration::from_millis(500),
        ..settings()
    })
    .await;
    // A QuestDB that stays, and an instance nobody claims.
    env.create("kept", |_| {}).await;
    let kept = wait_for(&env.qdbs(), "kept", "QuestDB Ready", is_ready()).await;
    let cluster_id = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .get("kube-system")
        .await
        .expect("kube-system")
        .uid();
    // Another cluster of the same name, sharing the account: its instance is never ours.
    let elsewhere = env
        .cloud
        .nodes
        .launch(&launch_request(
            "another-clusters",
            "00000000-0000-0000-0000-0000000000e1",
            1,
            Some("00000000-0000-0000-0000-0000c1a57e42".into()),
        ))
        .await
        .expect("launch");
    let orphan = env
        .cloud
        .nodes
        .launch(&launch_request(
            "deleted-long-ago",
            "00000000-0000-0000-0000-00000000dead",
            1,
            cluster_id.clone(),
        ))
        .await
        .expect("launch");
    let ec2 = env.cloud.ec2.clone();
    let terminated = |id: String| {
        let ec2 = ec2.clone();
        async move {
            ec2.instances()
                .iter()
                .any(|i| i.id == id && i.state == InstanceState::Terminated)
        }
    };
    wait_until("orphan terminated", || terminated(orphan.id.clone())).await;
    // An instance of the live QuestDB's older node generation that none of its records names:
    // what a lost step leaves behind. (After the orphan: one pass terminates at most
    // max(1, 10%) of the managed instances.)
    let kept_uid = kept.uid().expect("uid");
    let current = kept
        .status
        .as_ref()
        .and_then(|s| s.node_generation)
        .unwrap_or(1);
    let leaked = env
        .cloud
        .nodes
        .launch(&launch_request("kept", &kept_uid, current - 1, cluster_id))
        .await
        .expect("launch");
    wait_until("leak terminated", || terminated(leaked.id.clone())).await;
    let metrics = env.handle.metrics.render();
    for counter in [
        "questdb_operator_orphaned_instances_terminated_total",
        "questdb_operator_leaked_instances_terminated_total",
    ] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(counter) && l.ends_with(" 1")),
            "{counter}"
        );
    }
    assert_eq!(
        env.live_instances_of(&kept_uid).len(),
        1,
        "the claimed one stays"
    );
    assert_eq!(
        env.live_instances_of("00000000-0000-0000-0000-0000000000e1"),
        vec![elsewhere.id],
        "another cluster's instance of the same cluster name stays"
    );
    env.stop().await;
}

/// Kill the manager while RunInstances is in flight (the instance exists, its id is not
/// recorded anywhere yet), many times over: every QuestDB still ends with exactly one instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_manager_between_launch_and_status_write_never_yields_a_second_instance() {
    let mut env = CloudEnv::start(settings()).await;
    env.cloud.ec2.set_launch_latency(Duration::from_millis(300));
    let mut uids = Vec::new();
    const ROUNDS: usize = 6;
    for round in 0..ROUNDS {
        // EC2's eventual consistency: new instances stay invisible to the first describes,
        // so the ClientToken (not only the tag lookup) has to catch the repeat.
        env.cloud.ec2.hide_new_instances_for(2);
        let before = env.cloud.ec2.call_count("RunInstances");
        for i in 0..2 {
            let created = env.create(&format!("c{round}-{i}"), |_| {}).await;
            uids.push(created.uid().expect("uid"));
        }
        let ec2 = env.cloud.ec2.clone();
        wait_until("a launch in flight", || {
            let ec2 = ec2.clone();
            async move { ec2.call_count("RunInstances") > before }
        })
        .await;
        env.kill_manager().await;
        env.start_manager().await;
    }
    env.cloud.ec2.set_launch_latency(Duration::ZERO);
    let list = env.qdbs().list(&Default::default()).await.expect("list");
    for q in &list.items {
        wait_for(&env.qdbs(), &q.name_any(), "QuestDB Ready", is_ready()).await;
    }
    for uid in &uids {
        assert_eq!(
            env.live_instances_of(uid).len(),
            1,
            "exactly one instance for {uid}"
        );
    }
    assert_eq!(env.cloud.ec2.instances().len(), uids.len());
    eprintln!(
        "{ROUNDS} kills mid-launch, {} QuestDBs: RunInstances calls {}, DescribeInstances calls {}",
        uids.len(),
        env.cloud.ec2.call_count("RunInstances"),
        env.cloud.ec2.call_count("DescribeInstances")
    );
    env.stop().await;
}

/// The status write after a launch fails (apiserver 500s): the instance is found again, never
/// launched twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_status_writes_after_a_launch_never_yield_a_second_instance() {
    let env = CloudEnv::start(settings()).await;
    env.cloud.ec2.hide_new_instances_for(3);
    // The launch is still in flight when the fault goes in.
    env.cloud.ec2.set_launch_latency(Duration::from_millis(500));
    let created = env.create("f1", |_| {}).await;
    let uid = created.uid().expect("uid");
    // Once the generation is persisted, every status write fails for a while.
    wait_for(
        &env.qdbs(),
        "f1",
        "generation persisted",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref())
                .is_some_and(|s| s.node_generation.is_some())
        },
    )
    .await;
    let fault = env
        .cp
        .inject_fault(Fault::status(500).on(Verb::Update, "questdbs/status"));
    env.cloud.ec2.set_launch_latency(Duration::ZERO);
    let ec2 = env.cloud.ec2.clone();
    wait_until("several launch attempts", || {
        let ec2 = ec2.clone();
        async move { ec2.call_count("DescribeInstances") >= 4 }
    })
    .await;
    env.cp.remove_fault(fault);
    wait_for(&env.qdbs(), "f1", "QuestDB Ready", is_ready()).await;
    assert_eq!(env.live_instances_of(&uid).len(), 1);
    assert_eq!(env.cloud.ec2.instances().len(), 1);
    env.stop().await;
}

/// Removing `spec.node` must unpin the pod (a merge patch used to leave the nodeSelector
/// naming a node about to be terminated: an outage), and the node goes only once the pod has
/// left it. Its DNS record must go with it: the apiserver refuses a removal that keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_spec_node_unpins_the_pod_and_then_releases_the_node() {
    let env = CloudEnv::start(settings()).await;
    let created = env.create("un", |_| {}).await;
    let uid = created.uid().expect("uid");
    let q = wait_for(&env.qdbs(), "un", "QuestDB Ready", is_ready()).await;
    let node_name = q
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("node");

    // Removing only the node would leave the record pointing at an address EC2 reuses.
    let refused = env
        .qdbs()
        .patch(
            "un",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": null}})),
        )
        .await
        .expect_err("the apiserver refuses a record without a node");
    assert!(
        refused.to_string().contains("dns needs a dedicated node"),
        "{refused}"
    );

    let pod_at_termination = pod_at_first_termination(&env, names::pod(&q));
    env.qdbs()
        .patch(
            "un",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": null, "dns": null}})),
        )
        .await
        .expect("remove spec.node");
    let stss: Api<StatefulSet> = Api::namespaced(env.client.clone(), NS);
    wait_for(&stss, "un", "pod unpinned", |s: Option<&StatefulSet>| {
        s.and_then(|s| s.spec.as_ref())
            .and_then(|s| s.template.spec.as_ref())
            .is_some_and(|p| p.node_selector.is_none() && p.tolerations.is_none())
    })
    .await;
    wait_until("the dedicated instance is terminated", || {
        let live = env.live_instances_of(&uid);
        async move { live.is_empty() }
    })
    .await;
    let pod = pod_at_termination.await.expect("watcher");
    assert_ne!(
        pod.and_then(|p| p.spec).and_then(|s| s.node_name),
        Some(node_name),
        "the node was terminated while the database pod still ran on it"
    );
    env.stop().await;
}

/// A hosted zone is shared: a second QuestDB asking for the name the first one holds must not
/// take its record (clients of the first would reach the wrong database), nor remove it when it
/// goes; it says why in its condition and one Warning event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_questdb_cannot_take_or_delete_another_ones_dns_record() {
    let env = CloudEnv::start(settings()).await;
    let shared = |q: &mut QuestDB| {
        q.spec.dns.as_mut().expect("dns").name = format!("shared.{NS}.db.example.com");
    };
    env.create("first", shared).await;
    let first = wait_for(&env.qdbs(), "first", "first Ready", is_ready()).await;
    let first_ip = first.status.and_then(|s| s.dns_ip).expect("published");

    env.create("second", shared).await;
    let second = wait_for(
        &env.qdbs(),
        "second",
        "name refused",
        has_condition("DnsReady", "RecordOwnedElsewhere"),
    )
    .await;
    assert_eq!(second.status.and_then(|s| s.dns_name), None);
    let records = env.cloud.route53.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].ips, vec![first_ip.clone()]);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), NS);
    let warnings = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("RecordOwnedElsewhere")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("second")
        })
        .map(|e| e.series.map_or(1, |s| s.count))
        .sum::<i32>();
    assert_eq!(
        warnings, 1,
        "one Warning for the refusal, not one per requeue"
    );

    env.qdbs()
        .delete("second", &DeleteParams::default())
        .await
        .expect("delete second");
    let qdbs = env.qdbs();
    wait_until("second gone", || {
        let qdbs = qdbs.clone();
        async move { matches!(qdbs.get_opt("second").await, Ok(None)) }
    })
    .await;
    let records = env.cloud.route53.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].ips, vec![first_ip]);
    env.stop().await;
}

/// A tenant allowed to write `questdbs/status` (a user bound to a Role that grants it, through
/// the apiserver's own authorization) forges a failover record on their own QuestDB
/// that names another team's instance as the one to fence: the operator reads the instance
/// first, finds another QuestDB's uid on it, and neither stops nor terminates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_status_record_never_stops_another_questdbs_instance() {
    let env = CloudEnv::start(settings()).await;
    env.create("victim", |q| {
        q.spec.dns.as_mut().expect("dns").name = format!("victim.{NS}.db.example.com");
    })
    .await;
    env.create("attacker", |q| {
        q.spec.dns.as_mut().expect("dns").name = format!("attacker.{NS}.db.example.com");
    })
    .await;
    env.create("mover", |q| {
        q.spec.dns.as_mut().expect("dns").name = format!("mover.{NS}.db.example.com");
    })
    .await;
    let victim = wait_for(&env.qdbs(), "victim", "victim Ready", is_ready()).await;
    let mut attacker = wait_for(&env.qdbs(), "attacker", "attacker Ready", is_ready()).await;
    let mut mover = wait_for(&env.qdbs(), "mover", "mover Ready", is_ready()).await;
    let victim_instance = victim
        .status
        .as_ref()
        .and_then(|s| s.instance_id.clone())
        .expect("victim's instance");

    let status = attacker.status.as_mut().expect("status");
    status.failover = Some(questdb_operator::api::FailoverStatus {
        phase: questdb_operator::api::FailoverPhase::Fencing,
        reason: Some(questdb_operator::api::FailoverCause::NodeLeaseExpired),
        started_at: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        phase_started_at: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        old_instance_id: Some(victim_instance.clone()),
        message: Some("forged".into()),
        ..Default::default()
    });
    // The tenant: a user bound to a Role that (wrongly) includes questdbs/status.
    let roles: Api<Role> = Api::namespaced(env.client.clone(), NS);
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "questdb-editor"},
        "rules": [{"apiGroups": ["crd.questdb.io"], "resources": ["questdbs", "questdbs/status"],
                   "verbs": ["get", "list", "watch", "update", "patch"]}]
    }))
    .expect("role");
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "tenant-edits-questdbs"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "questdb-editor"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tenant"}]
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    let as_tenant: Api<QuestDB> =
        Api::namespaced(env.client_as("tenant", &["system:authenticated"]).await, NS);
    as_tenant
        .replace_status("attacker", &PostParams::default(), &attacker)
        .await
        .expect("the tenant's status write");
    // And a node move whose rollback window is over, whose "old" node is the victim's.
    let status = mover.status.as_mut().expect("status");
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    status.node_move = Some(questdb_operator::api::NodeMoveStatus {
        phase: questdb_operator::api::NodeMovePhase::Retaining,
        from_image: Some("ami-00000000000000001".into()),
        to_image: mover.spec.node.as_ref().map(|n| n.image.clone()),
        started_at: Some(now.clone()),
        phase_started_at: Some(Time("2020-01-01T00:00:00Z".parse().expect("a time"))),
        old_instance_id: Some(victim_instance.clone()),
        new_instance_id: status.instance_id.clone(),
        ..Default::default()
    });
    as_tenant
        .replace_status("mover", &PostParams::default(), &mover)
        .await
        .expect("the tenant's status write");
    wait_for(
        &env.qdbs(),
        "mover",
        "NodeUpgrade=False InstanceNotOwned",
        has_condition("NodeMove", "InstanceNotOwned"),
    )
    .await;

    crate::harness::wait_for_event_in(
        &env.client,
        NS,
        "a Warning event says the instance is not the attacker's",
        |e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("attacker")
                && e.reason.as_deref() == Some("InstanceNotOwned")
                && e.note.as_deref().is_some_and(|n| {
                    n.contains(&victim_instance) && n.contains("is not this QuestDB's")
                })
        },
    )
    .await;
    wait_for(
        &env.qdbs(),
        "attacker",
        "Failover=False InstanceNotOwned",
        has_condition("Failover", "InstanceNotOwned"),
    )
    .await;
    assert_eq!(env.cloud.ec2.call_count("StopInstances"), 0);
    assert_eq!(env.cloud.ec2.call_count("TerminateInstances"), 0);
    assert_eq!(
        env.live_instances_of(&victim.uid().expect("uid")),
        vec![victim_instance]
    );
    let victim = env.qdbs().get("victim").await.expect("victim");
    assert!(is_ready_now(Some(&victim)), "{:?}", victim.status);
    env.stop().await;
}

/// `db1` Ready, then `forge` writes, as its dedicated node's own identity (NodeRestriction lets a
/// kubelet write its Node's status and its pods'), a report naming `forged`. A Warning names the
/// address as not trusted, and the record keeps the address it was published with.
async fn a_forged_report_leaves_the_record<F, Fut>(forged: &str, forge: F)
where
    F: FnOnce(Client, String, QuestDB) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let env = CloudEnv::start(settings()).await;
    env.create("db1", |_| {}).await;
    let q = wait_for(&env.qdbs(), "db1", "Ready", is_ready()).await;
    let status = q.status.clone().expect("status");
    let published = status.dns_ip.clone().expect("published");
    let node = status.node_name.clone().expect("node");
    let as_node = env
        .client_as(&format!("system:node:{node}"), NODE_GROUPS)
        .await;
    forge(as_node, node, q).await;
    // A Node's status is not a QuestDB event: the reconcile is asked for.
    env.qdbs()
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"poke": "1"}}})),
        )
        .await
        .expect("poke");
    crate::harness::wait_for_event_in(
        &env.client,
        NS,
        "a Warning that the reported address is not trusted",
        |e| {
            e.reason.as_deref() == Some("NodeAddressUntrusted")
                && e.note.as_deref().is_some_and(|n| n.contains(forged))
        },
    )
    .await;
    let records = env.cloud.route53.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].ips, vec![published.clone()]);
    let q = env.qdbs().get("db1").await.expect("db1");
    assert_eq!(q.status.and_then(|s| s.dns_ip), Some(published));
    env.stop().await;
}

/// A compromised dedicated node rewrites the addresses in its own Node status. DNS follows EC2's
/// word for the instance, never the node's report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_forged_address_never_reaches_route53() {
    a_forged_report_leaves_the_record("10.66.66.66", |as_node, node, _| async move {
        let forged = json!({"status": {"addresses": [
            {"type": "InternalIP", "address": "10.66.66.66"},
            {"type": "Hostname", "address": node},
        ]}});
        Api::<Node>::all(as_node)
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&forged))
            .await
            .expect("the node rewrites its own addresses");
    })
    .await;
}

/// A compromised dedicated node rewrites its database pod's address. The record names only an
/// address EC2 shows assigned to the instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_forged_address_never_reaches_route53() {
    a_forged_report_leaves_the_record("10.66.66.67", |as_node, _, q| async move {
        let forged = json!({"status": {"podIP": "10.66.66.67", "podIPs": [{"ip": "10.66.66.67"}]}});
        Api::<Pod>::namespaced(as_node, NS)
            .patch_status(
                &names::pod(&q),
                &PatchParams::default(),
                &Patch::Merge(&forged),
            )
            .await
            .expect("the node rewrites its pod's address");
    })
    .await;
}

/// A compromised machine joins as a node (its own identity, `system:node:evil`, under
/// NodeRestriction) claiming the providerID of a running database's instance. It does not get
/// the database's pin, and the database stays on its own node. (Before the operator pinned
/// the real node, two claimants leave both unpinned: the unit tests of the node planner.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_claiming_another_instance_never_gets_its_database() {
    let env = CloudEnv::start(settings()).await;
    env.create("db1", |_| {}).await;
    let q = wait_for(&env.qdbs(), "db1", "Ready", is_ready()).await;
    let status = q.status.clone().expect("status");
    let instance = status.instance_id.clone().expect("instance");
    let real = status.node_name.clone().expect("node");
    let nodes: Api<Node> = Api::all(env.client.clone());
    let provider = nodes
        .get(&real)
        .await
        .expect("the real node")
        .spec
        .and_then(|s| s.provider_id)
        .expect("providerID");

    let as_node: Api<Node> = Api::all(env.client_as("system:node:evil", NODE_GROUPS).await);
    let evil: Node = serde_json::from_value(json!({
        "metadata": {"name": "evil", "labels": {DEDICATED_LABEL_KEY: "tenant-a.db1"}},
        "spec": {"providerID": provider},
    }))
    .expect("node");
    as_node
        .create(&PostParams::default(), &evil)
        .await
        .expect("NodeRestriction lets a node register itself with any providerID");

    env.qdbs()
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"poke": "1"}}})),
        )
        .await
        .expect("poke");
    let metrics = env.handle.metrics.clone();
    let before = reconciles(&metrics.render());
    wait_until("another reconcile", || {
        let m = metrics.clone();
        async move { reconciles(&m.render()) > before }
    })
    .await;
    let evil = nodes.get("evil").await.expect("evil");
    let labels = evil.metadata.labels.unwrap_or_default();
    assert!(
        !labels.contains_key(questdb_operator::desired::PIN_LABEL_KEY),
        "{labels:?}"
    );
    let q = wait_for(&env.qdbs(), "db1", "still Ready", is_ready()).await;
    let status = q.status.clone().expect("status");
    assert_eq!(status.node_name.as_deref(), Some(real.as_str()));
    assert_eq!(status.instance_id.as_deref(), Some(instance.as_str()));
    let pod = Api::<Pod>::namespaced(env.client.clone(), NS)
        .get(&names::pod(&q))
        .await
        .expect("pod");
    assert_eq!(pod.spec.and_then(|s| s.node_name), Some(real));
    env.stop().await;
}

/// With `--dns-namespace-suffix`, a namespace names only its own databases: a name outside
/// `<namespace>.<suffix>` is never written, one inside is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_name_outside_the_namespaces_zone_is_never_written() {
    let env = CloudEnv::start(CloudSettings {
        dns_namespace_suffix: Some("db.example.com".into()),
        ..settings()
    })
    .await;
    env.create("outside", |q| {
        q.spec.dns.as_mut().expect("dns").name = "payments.db.example.com".into();
    })
    .await;
    let inside = format!("inside.{NS}.db.example.com");
    let name = inside.clone();
    env.create("inside", move |q| {
        q.spec.dns.as_mut().expect("dns").name = name;
    })
    .await;
    wait_for(
        &env.qdbs(),
        "outside",
        "DnsReady=False DnsRejected",
        has_condition("DnsReady", "DnsRejected"),
    )
    .await;
    wait_for(&env.qdbs(), "inside", "inside Ready", is_ready()).await;
    let records = env.cloud.route53.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].name, inside);
    env.stop().await;
}

/// The harm: one tenant taking the DNS name another namespace's clients connect to (or
/// squatting it while that database is deleted and restored). By default a name's second label
/// is its namespace: another namespace's name is never written, the database's own is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_namespace_cannot_take_another_namespaces_dns_name() {
    let env = CloudEnv::start(settings()).await;
    env.create("squatter", |q| {
        q.spec.dns.as_mut().expect("dns").name = "payments.team-b.db.example.com".into();
    })
    .await;
    env.create("own", |_| {}).await;
    let refused = wait_for(
        &env.qdbs(),
        "squatter",
        "DnsReady=False DnsRejected",
        has_condition("DnsReady", "DnsRejected"),
    )
    .await;
    let message = crate::harness::condition_message(&refused, "DnsReady");
    assert!(
        message.contains(&format!("<name>.{NS}.<zone>")),
        "{message}"
    );
    wait_for(&env.qdbs(), "own", "own Ready", is_ready()).await;
    let records = env.cloud.route53.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].name, format!("own.{NS}.db.example.com"));
    env.stop().await;
}

/// The harm: an operator upgrade that tightens the DNS rule deleting the records clients
/// resolve. A database holding a name under the first-come rule keeps its record when the
/// operator restarts with the namespaced default; a new database asking for such a name is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_before_the_namespaced_rule_keeps_its_record_after_the_upgrade() {
    let mut env = CloudEnv::start(CloudSettings {
        dns_names_first_come: true,
        ..settings()
    })
    .await;
    env.create("legacy", |q| {
        q.spec.dns.as_mut().expect("dns").name = "legacy.db.example.com".into();
    })
    .await;
    wait_for(&env.qdbs(), "legacy", "legacy Ready", is_ready()).await;
    let names = |env: &CloudEnv| -> Vec<String> {
        env.cloud
            .route53
            .records()
            .into_iter()
            .map(|r| r.name)
            .collect()
    };
    assert_eq!(names(&env), ["legacy.db.example.com"]);

    env.stop_manager().await;
    env.settings.dns_names_first_come = false;
    let before = reconciles(&env.handle.metrics.render());
    env.start_manager().await;
    let metrics = env.handle.metrics.clone();
    wait_until("the upgraded operator reconciled legacy", || {
        let metrics = metrics.clone();
        async move { reconciles(&metrics.render()) > before }
    })
    .await;
    let legacy = env.qdbs().get("legacy").await.expect("legacy");
    assert!(
        legacy.status.as_ref().is_some_and(|s| s
            .conditions
            .iter()
            .any(|c| c.type_ == "DnsReady" && c.status == "True")),
        "{:?}",
        legacy.status.map(|s| s.conditions)
    );
    assert_eq!(names(&env), ["legacy.db.example.com"]);

    env.create("newcomer", |q| {
        q.spec.dns.as_mut().expect("dns").name = "newcomer.db.example.com".into();
    })
    .await;
    wait_for(
        &env.qdbs(),
        "newcomer",
        "DnsReady=False DnsRejected",
        has_condition("DnsReady", "DnsRejected"),
    )
    .await;
    assert_eq!(names(&env), ["legacy.db.example.com"]);
    env.stop().await;
}

#[path = "failover/mod.rs"]
mod failover;

#[path = "node_move.rs"]
mod node_move;

#[path = "data_safety.rs"]
mod data_safety;

/// `kubectl drain` of a dedicated node evicts nothing: the database's pod would come back
/// pinned to the cordoned node and stay Pending, so its PodDisruptionBudget refuses the
/// eviction (the drain waits and says why); without a dedicated node the budget goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_dedicated_node_is_refused_instead_of_stranding_the_database() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let env = CloudEnv::start(settings()).await;
    env.create("db1", |_| {}).await;
    wait_for(&env.qdbs(), "db1", "QuestDB Ready", is_ready()).await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), NS);
    // The disruption controller (kube-controller-manager) has counted the healthy pod.
    wait_for(
        &pdbs,
        "db1",
        "the budget observed the Ready pod",
        |p: Option<&PodDisruptionBudget>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.current_healthy == 1 && s.observed_generation.is_some())
        },
    )
    .await;
    // As kubectl drain asks: once, reading the 429 (a retrying client would wait it out).
    let mut config = env.cp.client_config().await;
    config.default_retry = false;
    let once = Client::try_from(config).expect("client");
    let pods: Api<Pod> = Api::namespaced(once, NS);
    match pods.evict("db1-0", &Default::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "{s:?}"),
        other => panic!("the eviction was not refused: {other:?}"),
    }
    let pod: Pod = pods.get("db1-0").await.expect("pod");
    assert!(pod.metadata.deletion_timestamp.is_none(), "still running");

    // spec.node removed: the database moves to a shared node and the budget goes.
    env.qdbs()
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": null, "dns": null}})),
        )
        .await
        .expect("spec.node removed");
    wait_until("the budget is gone", || {
        let pdbs = pdbs.clone();
        async move { pdbs.get_opt("db1").await.ok().flatten().is_none() }
    })
    .await;
}

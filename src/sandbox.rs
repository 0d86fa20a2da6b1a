//! `questdb-operator sandbox`: a simulated control plane with three nodes in two zones, the real
//! manager against it, and the example QuestDB applied — the README's first command.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{CustomResourceExt, ResourceExt};
use questdb_sim::cluster::{Cluster, NodeSpec};
use questdb_sim::{Sim, SimConfig};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::QuestDB;
use crate::build::{
    dedicated_label_value, DEDICATED_LABEL_KEY, DEDICATED_TAINT_EFFECT, DEDICATED_TAINT_KEY,
};
use crate::cli::{CloudProvider, SandboxArgs};
use crate::cloud::memory::InstanceEvent;
use crate::cloud::{Instance, TAG_NAME, TAG_NAMESPACE};
use crate::http_server::parse_bind_address;
use crate::manager::{self, ManagerHandle, ManagerOptions};

pub async fn run(args: SandboxArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let cfg = SimConfig {
        clock_speed: args.clock_speed,
        bind: Some(([127, 0, 0, 1], args.port).into()),
        ..SimConfig::sandbox()
    };
    let sim = Arc::new(
        Sim::start(cfg)
            .await
            .context("starting the simulated control plane")?,
    );
    std::fs::write(&args.kubeconfig, sim.kubeconfig_yaml())
        .with_context(|| format!("writing {}", args.kubeconfig.display()))?;
    info!(url = %sim.url(), kubeconfig = %args.kubeconfig.display(), "simulated control plane is up (3 nodes, 2 zones)");

    let client = sim.client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &QuestDB::crd())
        .await
        .context("installing the QuestDB CRD")?;

    let handle = ManagerHandle::default();
    let built = crate::app::build_cloud(
        &args.cloud,
        CloudProvider::Memory,
        handle.metrics.aws_observer(),
    )
    .await?;
    let bridge_token = shutdown.child_token();
    let bridge = built
        .as_ref()
        .and_then(|b| b.memory.as_ref())
        .map(|(ec2, _)| {
            info!("memory cloud: a simulated Node joins for every running instance");
            spawn_memory_bridge(ec2.subscribe(), sim.clone(), bridge_token.clone())
        });
    let opts = ManagerOptions {
        questdb_concurrency: args.questdb_concurrency,
        metrics_addr: parse_bind_address(&args.metrics_bind_address)?,
        health_addr: parse_bind_address(&args.health_probe_bind_address)?,
        cloud: built.map(|b| b.cloud),
        ..Default::default()
    };
    let manager_token = shutdown.child_token();
    let manager = tokio::spawn(manager::run_with(
        opts,
        sim.client_config(),
        manager_token.clone(),
        ManagerHandle {
            metrics: handle.metrics.clone(),
            readiness: handle.readiness.clone(),
            in_flight: handle.in_flight.clone(),
        },
    ));

    let example = apply_example(&client, &args.example).await?;
    println!(
        "sandbox: kubectl --kubeconfig {} get qdb   (Ctrl-C to stop)",
        args.kubeconfig.display()
    );
    let progress = report_progress(client.clone(), example, args.exit_when_ready);
    tokio::select! {
        ready = progress => {
            if args.exit_when_ready {
                ready?;
                shutdown.cancel();
            } else {
                shutdown.cancelled().await;
            }
        }
        _ = shutdown.cancelled() => {}
    }

    manager_token.cancel();
    match tokio::time::timeout(Duration::from_secs(30), manager).await {
        Ok(Ok(Err(e))) => warn!(error = format!("{e:#}"), "manager stopped with an error"),
        Err(_) => warn!("manager did not stop within 30s"),
        _ => {}
    }
    bridge_token.cancel();
    if let Some(b) = bridge {
        let _ = b.await;
    }
    match Arc::try_unwrap(sim) {
        Ok(sim) => sim.shutdown().await,
        Err(_) => warn!("simulated control plane still in use; dropping it"),
    }
    info!("sandbox stopped");
    Ok(())
}

/// Creates the QuestDB of the example manifest; returns its (namespace, name).
async fn apply_example(
    client: &kube::Client,
    path: &std::path::Path,
) -> anyhow::Result<Option<(String, String)>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        info!(path = %path.display(), "no example manifest; apply your own with kubectl");
        return Ok(None);
    };
    let mut qdb: QuestDB =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let ns = qdb.namespace().unwrap_or_else(|| "default".into());
    qdb.metadata.namespace = Some(ns.clone());
    let api: Api<QuestDB> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &qdb)
        .await
        .with_context(|| format!("creating the QuestDB from {}", path.display()))?;
    info!(questdb = %qdb.name_any(), namespace = %ns, "applied {}", path.display());
    Ok(Some((ns, qdb.name_any())))
}

/// Prints each change of the example's phase and Ready condition until it is Ready.
async fn report_progress(
    client: kube::Client,
    example: Option<(String, String)>,
    stop_when_ready: bool,
) -> anyhow::Result<()> {
    let Some((ns, name)) = example else {
        if stop_when_ready {
            anyhow::bail!("--exit-when-ready needs an example manifest");
        }
        return futures::future::pending().await;
    };
    let api: Api<QuestDB> = Api::namespaced(client, &ns);
    let mut stream = std::pin::pin!(watcher::watch_object(api, &name).boxed());
    let mut last = String::new();
    while let Some(event) = stream.next().await {
        let Ok(Some(q)) = event else { continue };
        let status = q.status.clone().unwrap_or_default();
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
        let line = format!(
            "{}/{}: phase={} ready={} ({})",
            ns,
            name,
            status.phase.map(|p| p.as_str()).unwrap_or("-"),
            ready.map(|c| c.status.as_str()).unwrap_or("-"),
            ready.map(|c| c.message.as_str()).unwrap_or("-"),
        );
        if line != last {
            println!("{line}");
            last = line;
        }
        if ready.is_some_and(|c| c.status == "True") {
            println!(
                "{ns}/{name} is Ready: node {} ({}), instance {}, DNS {}, version {}",
                status.node_name.unwrap_or_default(),
                status.node_ip.unwrap_or_default(),
                status.instance_id.as_deref().unwrap_or("-"),
                status.dns_name.as_deref().unwrap_or("-"),
                status.version.unwrap_or_default()
            );
            return Ok(());
        }
    }
    anyhow::bail!("the watch on {ns}/{name} ended")
}

/// Plays the kubelet for the memory cloud: registers a simulated Node for each instance that
/// reaches `running` and removes it when the instance terminates, until `stop`.
///
/// The Node registers with the dedicated label and taint, as the kubelet would from the
/// user data's `--node-labels` / `--register-with-taints` (the fake keeps no user data, so
/// they are derived from the instance's namespace and name tags, which is what the operator
/// renders into the user data).
pub async fn bridge_memory_cloud(
    mut events: broadcast::Receiver<InstanceEvent>,
    cluster: &Cluster,
    stop: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            e = events.recv() => e,
        };
        match event {
            Ok(InstanceEvent::Running(instance)) => {
                let spec = node_spec_for(&instance);
                let name = spec.name.clone();
                match cluster.add_node(spec).await {
                    Ok(()) => info!(node = %name, instance = %instance.id, "simulated node joined"),
                    Err(e) => {
                        warn!(node = %name, error = format!("{e:#}"), "simulated node could not join")
                    }
                }
            }
            Ok(InstanceEvent::Terminated(id)) => {
                let name = node_name_for(&id);
                match cluster.remove_node(&name).await {
                    Ok(()) => info!(node = %name, instance = %id, "simulated node removed"),
                    Err(e) => {
                        warn!(node = %name, error = format!("{e:#}"), "simulated node removal failed")
                    }
                }
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                warn!(
                    missed = n,
                    "memory cloud bridge fell behind; some nodes may be missing"
                );
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// [`bridge_memory_cloud`] on its own task, for callers that share the simulator.
pub fn spawn_memory_bridge(
    events: broadcast::Receiver<InstanceEvent>,
    sim: Arc<Sim>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { bridge_memory_cloud(events, sim.cluster(), stop).await })
}

/// The simulated Node's name for an instance (EC2's are private DNS names; the id is unique).
pub fn node_name_for(instance_id: &str) -> String {
    format!("sim-{instance_id}")
}

fn node_spec_for(instance: &Instance) -> NodeSpec {
    let mut spec =
        NodeSpec::aws_instance(node_name_for(&instance.id), &instance.zone, &instance.id);
    spec.internal_ip = instance.private_ip.clone();
    let tag = |k: &str| instance.tags.get(k).cloned();
    if let Some(value) = tag(TAG_NAMESPACE)
        .zip(tag(TAG_NAME))
        .and_then(|(ns, name)| dedicated_value(&ns, &name))
    {
        spec = spec
            .with_label(DEDICATED_LABEL_KEY, value.clone())
            .with_taint(DEDICATED_TAINT_KEY, Some(&value), DEDICATED_TAINT_EFFECT);
    }
    spec
}

/// The dedicated label value of QuestDB `namespace/name` (the builder takes a whole QuestDB;
/// only its name and namespace matter).
fn dedicated_value(namespace: &str, name: &str) -> Option<String> {
    let probe: QuestDB = serde_json::from_value(serde_json::json!({
        "apiVersion": "crd.questdb.io/v1beta1",
        "kind": "QuestDB",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"image": "-", "volume": {"size": "1Gi"}},
    }))
    .ok()?;
    Some(dedicated_label_value(&probe))
}

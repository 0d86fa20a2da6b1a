//! The fallback when Go is missing (no real control plane can be built): `questdb-sim`, a
//! simulated control plane with three nodes in two zones. Its deviations from Kubernetes are
//! listed in sim/README.md; nothing here is a reference for how a cluster behaves.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use questdb_operator::cli::CloudProvider;
use questdb_operator::cloud::memory::InstanceEvent;
use questdb_operator::cloud::{Instance, TAG_NAME, TAG_NAMESPACE};
use questdb_operator::desired::{
    dedicated_label_value_for, DEDICATED_LABEL_KEY, DEDICATED_TAINT_EFFECT, DEDICATED_TAINT_KEY,
};
use questdb_operator::http_server::parse_bind_address;
use questdb_operator::manager::{self, ManagerHandle, ManagerOptions};
use questdb_sim::cluster::{Cluster, NodeSpec};
use questdb_sim::{Sim, SimConfig};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::SandboxArgs;

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
    crate::progress::install_crd(&client).await?;

    let handle = ManagerHandle::default();
    // Nodes here join by the rendered NodeConfig, not a real EKS cluster: the default
    // template gets the sandbox's stand-in endpoint, CA and service CIDR unless given.
    let mut cloud_args = args.cloud.clone();
    cloud_args
        .eks_api_endpoint
        .get_or_insert_with(|| questdb_operator::app::SANDBOX_EKS_ENDPOINT.to_string());
    cloud_args
        .eks_certificate_authority
        .get_or_insert_with(|| questdb_operator::app::SANDBOX_EKS_CA.to_string());
    cloud_args
        .eks_service_cidr
        .get_or_insert_with(|| questdb_operator::app::SANDBOX_SERVICE_CIDR.to_string());
    // The simulator registers no CSINodes: a dedicated node there takes its database without
    // waiting for a CSI driver.
    cloud_args.csi_driver = String::new();
    let built = questdb_operator::app::build_cloud(
        &cloud_args,
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
        })
        .or_else(|| {
            let nodes = built.as_ref()?.cloud.nodes.clone();
            info!("AWS endpoint: a simulated Node joins for every running instance it reports");
            let (sim, stop) = (sim.clone(), bridge_token.clone());
            Some(tokio::spawn(async move {
                bridge_polled_cloud(nodes.as_ref(), sim.cluster(), stop).await
            }))
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
        handle.clone(),
    ));

    crate::progress::run_until_stopped(&client, &args, &shutdown, manager_token, manager).await?;
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
            // The simulator has no stopped-instance model; its fallback sandbox keeps the Node.
            Ok(InstanceEvent::Stopped(id)) => {
                info!(instance = %id, "instance stopped (the simulated node stays)");
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

/// Plays the kubelet for a real EC2 API (moto through `--aws-endpoint-url`), which has no event
/// stream: every few seconds, one `describe_cluster` and the simulated Nodes are brought in line
/// with the running instances.
pub async fn bridge_polled_cloud(
    nodes: &dyn questdb_operator::cloud::NodeProvider,
    cluster: &Cluster,
    stop: CancellationToken,
) {
    let mut joined: std::collections::BTreeSet<String> = Default::default();
    loop {
        match nodes.describe_cluster().await {
            Ok(instances) => {
                let running: std::collections::BTreeMap<&str, &Instance> = instances
                    .iter()
                    .filter(|i| i.state == questdb_operator::cloud::InstanceState::Running)
                    .map(|i| (i.id.as_str(), i))
                    .collect();
                for (id, instance) in &running {
                    if !joined.contains(*id)
                        && cluster.add_node(node_spec_for(instance)).await.is_ok()
                    {
                        info!(instance = %id, "simulated node joined");
                        joined.insert(id.to_string());
                    }
                }
                let gone: Vec<String> = joined
                    .iter()
                    .filter(|id| !running.contains_key(id.as_str()))
                    .cloned()
                    .collect();
                for id in gone {
                    if cluster.remove_node(&node_name_for(&id)).await.is_ok() {
                        info!(instance = %id, "simulated node removed");
                        joined.remove(&id);
                    }
                }
            }
            Err(e) => warn!(error = %e, "describing instances for the simulated nodes failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
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
        .map(|(ns, name)| dedicated_label_value_for(&ns, &name))
    {
        spec = spec
            .with_label(DEDICATED_LABEL_KEY, value.clone())
            .with_taint(DEDICATED_TAINT_KEY, Some(&value), DEDICATED_TAINT_EFFECT);
    }
    spec
}

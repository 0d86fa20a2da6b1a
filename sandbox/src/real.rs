//! The sandbox on the real control plane (questdb-testenv): kube-apiserver,
//! kube-controller-manager, kube-scheduler and etcd, three worker nodes in two zones, the
//! in-memory cloud (or an EC2 endpoint such as moto) whose instances join as Nodes from their
//! user data, and the operator under `deploy/`'s RBAC.

use std::sync::Arc;

use anyhow::{bail, Context as _};
use questdb_operator::cli::CloudProvider;
use questdb_operator::cloud::memory::{InstanceEvent, MemoryEc2, MemoryEc2Options};
use questdb_operator::http_server::parse_bind_address;
use questdb_operator::manager::{self, ManagerHandle, ManagerOptions};
use questdb_testenv::{
    spawn_instance_join, ControlPlane, ControlPlaneOptions, Databases, InstanceChange,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::SandboxArgs;

pub async fn run(mut args: SandboxArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let aws = args.cloud.cloud_provider == Some(CloudProvider::Aws);
    if aws && !cfg!(feature = "moto") {
        bail!("--cloud-provider aws needs the sandbox built with the moto feature: cargo run -p questdb-sandbox --features moto -- --cloud-provider aws --aws-endpoint-url ...");
    }
    if aws && args.cloud.aws_endpoint_url.is_none() {
        bail!("--cloud-provider aws needs --aws-endpoint-url (moto on 127.0.0.1): the sandbox's nodes are local processes and cannot join a cluster from real EC2 instances");
    }
    if aws {
        // The cluster the instances join is the sandbox's, which moto's EKS does not know:
        // its bootstrap values are the sandbox's own, as with the in-memory cloud.
        let cloud = &mut args.cloud;
        cloud
            .eks_api_endpoint
            .get_or_insert_with(|| questdb_operator::app::SANDBOX_EKS_ENDPOINT.to_string());
        cloud
            .eks_certificate_authority
            .get_or_insert_with(|| questdb_operator::app::SANDBOX_EKS_CA.to_string());
        cloud
            .eks_service_cidr
            .get_or_insert_with(|| questdb_operator::app::SANDBOX_SERVICE_CIDR.to_string());
    }
    let databases = databases(&args.databases)?;
    eprintln!("sandbox: starting a real control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd)");
    let options = ControlPlaneOptions {
        databases,
        // A first sandbox is Ready without waiting for the snapshot-controller's build, which
        // only backups need: it joins once built.
        snapshot_controller_when_built: true,
        ..ControlPlaneOptions::sandbox()
    };
    let cp = ControlPlane::start(options)
        .await
        .context("starting the control plane")?;
    std::fs::write(&args.kubeconfig, cp.kubeconfig_yaml())
        .with_context(|| format!("writing {}", args.kubeconfig.display()))?;
    info!(kubeconfig = %args.kubeconfig.display(), logs = %cp.dir().display(), "control plane is up (3 worker nodes, 2 zones)");

    let client = cp.client().await;
    crate::progress::install_crd(&client).await?;

    let handle = ManagerHandle::default();
    // Real databases listen on loopback addresses (the pods', which the DNS record names): so
    // do the instances' nodes, whose host ports (when a database binds them) forward to them.
    let memory = MemoryEc2Options {
        private_ip_prefix: match databases {
            // A prefix of its own on this machine: a test run beside the sandbox draws others.
            Databases::Real => questdb_testenv::database::cloud_loopback_prefix(),
            Databases::Fake => MemoryEc2Options::default().private_ip_prefix,
        },
        ..MemoryEc2Options::default()
    };
    // The sandbox's kubelets hold shorter Leases than real ones (renewed every quarter, as a
    // real kubelet does): the operator is told so, as a cluster's admin would tell it.
    args.cloud
        .node_lease_duration
        .get_or_insert(questdb_testenv::timings::node_lease_duration());
    // A scheduled event annotated from kubectl is seen within seconds, not the production
    // default's five minutes (unless the flag says otherwise).
    if args.cloud.scheduled_event_interval == std::time::Duration::from_secs(300) {
        args.cloud.scheduled_event_interval = std::time::Duration::from_secs(5);
    }
    let built = questdb_operator::app::build_cloud_with(
        &args.cloud,
        CloudProvider::Memory,
        handle.metrics.aws_observer(),
        memory,
    )
    .await?;
    let join_token = shutdown.child_token();
    let join = built
        .as_ref()
        .and_then(|b| b.memory.as_ref())
        .map(|(ec2, _)| {
            info!(
                "memory cloud: each running instance boots from its user data and joins as a Node"
            );
            let (halted, ipamd) = (ec2.clone(), ec2.clone());
            // Node names are `<instance id>.<region>.compute.internal`.
            cp.kubelets().on_os_halted(move |node| {
                halted.os_halted(node.split('.').next().unwrap_or_default());
            });
            // The VPC CNI's address pool: a pod's address is one EC2 shows on its instance.
            cp.kubelets().on_pod_addresses(move |node, blocks| {
                ipamd.assign_ipv4_prefixes(node.split('.').next().unwrap_or_default(), &blocks);
                Box::pin(async {})
            });
            spawn_instance_join(
                cp.kubelets().clone(),
                instance_changes(ec2.clone()),
                join_token.clone(),
            )
        });
    #[cfg(feature = "moto")]
    let ec2_join = match &built {
        Some(b) if aws && b.memory.is_none() => {
            info!("EC2 endpoint: each running instance it reports boots from its user data and joins as a Node");
            let config = questdb_operator::app::cloud_config(&args.cloud, CloudProvider::Aws)?;
            let sdk = questdb_operator::cloud::aws::sdk_config_loader(&config)
                .load()
                .await;
            Some(questdb_testenv::join_ec2_instances(
                cp.kubelets().clone(),
                aws_sdk_ec2::Client::new(&sdk),
                join_token.clone(),
            ))
        }
        _ => None,
    };
    #[cfg(not(feature = "moto"))]
    let ec2_join: Option<tokio::task::JoinHandle<anyhow::Result<()>>> = None;
    let memory_ec2 = built
        .as_ref()
        .and_then(|b| b.memory.as_ref())
        .map(|(ec2, _)| ec2.clone());
    let faults = crate::faults::spawn(&cp, client.clone(), memory_ec2, join_token.clone());
    let opts = ManagerOptions {
        questdb_concurrency: args.questdb_concurrency,
        metrics_addr: parse_bind_address(&args.metrics_bind_address)?,
        health_addr: parse_bind_address(&args.health_probe_bind_address)?,
        cloud: built.map(|b| b.cloud),
        kubelet_ca: Some(cp.kubelet_ca_pem()),
        ..Default::default()
    };
    let manager_token = shutdown.child_token();
    let manager = tokio::spawn(manager::run_with(
        opts,
        cp.operator_config().await,
        manager_token.clone(),
        handle.clone(),
    ));

    crate::progress::run_until_stopped(&client, &args, &shutdown, manager_token, manager).await?;
    join_token.cancel();
    if let Some(j) = join {
        let _ = j.await;
    }
    if let Some(j) = ec2_join {
        match j.await {
            Ok(Err(e)) => warn!(error = format!("{e:#}"), "an instance could not join"),
            Err(e) => warn!(error = %e, "the instance join task failed"),
            Ok(Ok(())) => {}
        }
    }
    let _ = faults.await;
    drop(cp);
    info!("sandbox stopped");
    Ok(())
}

/// What runs in database pods, said in one line either way.
fn databases(flag: &str) -> anyhow::Result<Databases> {
    let chosen = match flag {
        "real" => Databases::Real,
        "fake" => Databases::Fake,
        "auto" => Databases::real_if_java(),
        other => bail!("--databases must be auto, real or fake, not {other:?}"),
    };
    match (flag, chosen) {
        (_, Databases::Real) => eprintln!(
            "sandbox: database pods run a real QuestDB (the Maven jar of the image's version, fetched once into ~/.m2)"
        ),
        ("auto", Databases::Fake) => eprintln!(
            "sandbox: Java is not installed, so database pods are FAKE (reported Ready, no QuestDB runs): {}",
            questdb_testenv::database::NEEDS_JAVA
        ),
        _ => eprintln!("sandbox: database pods are FAKE (--databases fake): no QuestDB runs"),
    }
    Ok(chosen)
}

/// The memory cloud's instance events as a cloud reports them.
pub fn instance_changes(
    ec2: Arc<MemoryEc2>,
) -> impl futures::Stream<Item = InstanceChange> + Send + 'static {
    futures::stream::unfold(ec2.subscribe(), move |mut rx| {
        let ec2 = ec2.clone();
        async move {
            loop {
                let change = match rx.recv().await {
                    Ok(InstanceEvent::Running(i)) => InstanceChange::Running {
                        user_data: ec2.user_data(&i.id).unwrap_or_default(),
                        id: i.id,
                        zone: i.zone,
                        private_ip: i.private_ip,
                    },
                    Ok(InstanceEvent::Stopping { id, graceful }) => {
                        InstanceChange::Stopping { id, graceful }
                    }
                    Ok(InstanceEvent::Stopped(id)) => InstanceChange::Stopped { id },
                    Ok(InstanceEvent::Terminated(id)) => InstanceChange::Terminated { id },
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return None,
                };
                return Some((change, rx));
            }
        }
    })
}

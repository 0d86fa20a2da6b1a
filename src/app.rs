//! Process entry: logging, the runtime, signals and the subcommands.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use crate::cli::{parse_subnets, Cli, CloudArgs, CloudProvider, Command, LogFormat, RunArgs};
#[cfg(feature = "aws")]
use crate::cloud::aws::AwsCloud;
#[cfg(feature = "memory-cloud")]
use crate::cloud::memory::{MemoryCloud, MemoryEc2, MemoryEc2Options, MemoryRoute53};
use crate::cloud::{user_data, CloudConfig, DnsProvider, EksCluster, NodeVolumes, SharedObserver};
use crate::http_server::parse_bind_address;
use crate::manager::{self, Cloud, CloudSettings, LeaderElection, ManagerHandle, ManagerOptions};

pub fn main() -> ExitCode {
    let deprecated = crate::cli::adopt_deprecated_env();
    let cli = Cli::parse();
    crate::metrics::install_crypto_provider();
    init_logging(cli.log.log_format);
    for old in deprecated {
        tracing::warn!(
            variable = old,
            "deprecated: {old} is read for one more release; node moves' settings are NODE_MOVE_* now"
        );
    }
    crate::runtime::heap::limit_arenas();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(dispatch(cli.command));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = format!("{e:#}"), "exiting");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Crd(args) => {
            let lease = args
                .node_lease_duration
                .unwrap_or(crate::crd::DEFAULT_NODE_LEASE_DURATION);
            print!("{}", crate::crd::yaml_for_lease(lease)?);
            Ok(())
        }
        Command::Version => {
            println!("questdb-operator {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Run(args) => run(*args).await,
        Command::Inventory(args) => inventory(*args).await,
        Command::Preflight(args) => preflight(*args).await,
    }
}

async fn kube_config(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    })
}

/// The cluster client and the cloud providers of a one-off command (`inventory`,
/// `preflight`), from the same flags `run` takes.
async fn one_off_client_and_cloud(
    kubeconfig: Option<&std::path::Path>,
    cloud: &CloudArgs,
) -> anyhow::Result<(kube::Client, Option<Cloud>)> {
    let client = kube::Client::try_from(kube_config(kubeconfig).await?)?;
    let built = build_cloud(
        cloud,
        CloudProvider::None,
        crate::metrics::Metrics::new().aws_observer(),
    )
    .await?;
    Ok((client, built.map(|b| b.cloud)))
}

async fn inventory(args: crate::cli::InventoryArgs) -> anyhow::Result<()> {
    let (client, cloud) = one_off_client_and_cloud(args.kubeconfig.as_deref(), &args.cloud).await?;
    let found = crate::inventory::collect(
        &client,
        args.namespace.as_deref(),
        cloud.as_ref().map(|c| c.nodes.as_ref()),
        cloud.as_ref().and_then(|c| c.dns.as_deref()),
    )
    .await?;
    print!("{}", found.render());
    Ok(())
}

/// `questdb-operator preflight`: the checks once, each finding on a line; an error (exit 1)
/// when one fails.
async fn preflight(args: crate::cli::PreflightArgs) -> anyhow::Result<()> {
    let run = args.run;
    let (client, cloud) = one_off_client_and_cloud(run.kubeconfig.as_deref(), &run.cloud).await?;
    // As the operator reads them: the watched namespace, a QuestDB it cannot parse skipped.
    let api: kube::Api<crate::controllers::keys::GuardedQuestDB> = if run.namespace.is_empty() {
        kube::Api::all(client.clone())
    } else {
        kube::Api::namespaced(client.clone(), &run.namespace)
    };
    let questdbs: Vec<crate::api::QuestDB> = api
        .list(&Default::default())
        .await
        .context("listing QuestDBs (the launches they ask for are dry-run)")?
        .items
        .into_iter()
        .filter_map(|q| q.0.ok())
        .collect();
    // Where the running operator asks for the snapshot API: its own namespace, else the
    // watched one.
    let snapshot_namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| Some(run.namespace.clone()).filter(|n| !n.is_empty()))
        .unwrap_or_else(|| "default".into());
    let findings = crate::controllers::preflight::check(
        cloud.as_ref().map(|c| c.nodes.as_ref()),
        cloud.as_ref().and_then(|c| c.dns.as_deref()),
        &client,
        &snapshot_namespace,
        &questdbs.iter().collect::<Vec<_>>(),
    )
    .await;
    for f in &findings {
        println!("FAIL {}", f.line());
    }
    if findings.is_empty() {
        println!(
            "preflight passed: {} ({} QuestDBs read)",
            if cloud.is_some() {
                "network, instance types, launches, hosted zone, snapshot API"
            } else {
                "snapshot API (no cloud provider)"
            },
            questdbs.len()
        );
        Ok(())
    } else {
        anyhow::bail!("the preflight found {} problem(s)", findings.len())
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // The default timer prints RFC 3339 / ISO-8601 UTC timestamps.
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// A token cancelled on SIGTERM or SIGINT (Ctrl-C).
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("installing the SIGTERM handler");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        info!("shutdown requested");
        t.cancel();
    });
    token
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = kube_config(args.kubeconfig.as_deref()).await?;
    let mut opts = options_from(&args)?;
    // The metrics exist before the providers so every AWS call is counted in /metrics.
    let handle = ManagerHandle::default();
    let built = build_cloud(
        &args.cloud,
        CloudProvider::None,
        handle.metrics.aws_observer(),
    )
    .await?;
    opts.cloud = built.map(|b| b.cloud);
    let shutdown = shutdown_on_signal();
    // The process's heap is the binary's to manage, not each manager's (tests run several
    // managers in one process).
    tokio::spawn(crate::runtime::heap::trim_until(shutdown.clone()));
    manager::run_with(opts, config, shutdown, handle).await
}

/// The node bootstrap used when `--node-user-data-template` is not given.
pub const DEFAULT_USER_DATA_TEMPLATE: &str = crate::cloud::user_data::AL2023_NODECONFIG_TEMPLATE;

/// The EKS cluster the sandbox's in-memory instances "join" (the test environment's node
/// join parses the rendered NodeConfig, so the default template is exercised there too).
pub const SANDBOX_EKS_ENDPOINT: &str = "https://sandbox.eks.invalid";
/// base64 of `sandbox-ca`.
pub const SANDBOX_EKS_CA: &str = "c2FuZGJveC1jYQ==";
pub const SANDBOX_SERVICE_CIDR: &str = "10.100.0.0/16";

/// Providers built from the flags; `memory` is set for the memory provider so the sandbox and
/// tests can join its instances as Nodes and inject faults.
pub struct BuiltCloud {
    pub cloud: Cloud,
    #[cfg(feature = "memory-cloud")]
    pub memory: Option<(Arc<MemoryEc2>, Arc<MemoryRoute53>)>,
}

/// The sandbox's memory provider: subnets for the simulator's zones and a hosted zone, unless
/// the flags say otherwise.
#[cfg(feature = "memory-cloud")]
pub(crate) const SANDBOX_ZONES: [&str; 2] = ["sim-zone-a", "sim-zone-b"];
#[cfg(feature = "memory-cloud")]
pub(crate) const SANDBOX_HOSTED_ZONE: &str = "ZSANDBOX";

/// The operator-wide cloud configuration the flags describe.
pub fn cloud_config(args: &CloudArgs, provider: CloudProvider) -> anyhow::Result<CloudConfig> {
    let region = match (&args.aws_region, provider) {
        (Some(r), _) => r.clone(),
        (None, CloudProvider::Aws) => {
            anyhow::bail!("--aws-region (or AWS_REGION) is required with --cloud-provider aws")
        }
        (None, _) => "sim-region-1".to_string(),
    };
    let cluster_name = match (&args.cluster_name, provider) {
        (Some(name), _) if !name.trim().is_empty() => name.clone(),
        (_, CloudProvider::Aws) => anyhow::bail!(
            "--cluster-name (or CLUSTER_NAME) is required with --cloud-provider aws: it tags every instance, and the orphan sweep of another cluster in the same account must never see them as its own"
        ),
        _ => "sandbox".to_string(),
    };
    let mut config = CloudConfig::new(cluster_name, region);
    config.subnets_by_zone =
        parse_subnets(&args.aws_subnets).map_err(|e| anyhow::anyhow!("--aws-subnets: {e}"))?;
    config.public_subnets_by_zone = parse_subnets(&args.aws_public_subnets)
        .map_err(|e| anyhow::anyhow!("--aws-public-subnets: {e}"))?;
    config.security_group_ids = args.aws_security_group_ids.clone();
    config.eks = EksCluster {
        api_endpoint: args.eks_api_endpoint.clone(),
        certificate_authority: args.eks_certificate_authority.clone(),
        service_cidr: args.eks_service_cidr.clone(),
    };
    config.volumes = NodeVolumes {
        root_device_name: args
            .node_root_device_name
            .as_deref()
            .map(str::trim)
            .unwrap_or_default()
            .to_string(),
        root_size_gib: args.node_root_volume_gib,
        data_size_gib: args.node_data_volume_gib,
        kms_key_id: args.node_root_volume_kms_key_id.clone(),
    };
    // Unset: the one the CloudFormation stack makes for this cluster. Not with an endpoint
    // override (moto, LocalStack: an emulator has no stack), as before the default.
    config.instance_profile = match (&args.aws_instance_profile, provider) {
        (Some(p), _) => Some(p.clone()),
        (None, CloudProvider::Aws) if args.aws_endpoint_url.is_none() => Some(
            crate::cloud::discovery::default_instance_profile(&config.cluster_name),
        ),
        (None, _) => None,
    };
    config.node_tags =
        crate::cloud::parse_node_tags(&args.node_tags).map_err(anyhow::Error::msg)?;
    let listed = |v: &[String]| -> Vec<String> {
        v.iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    config.allow_list = crate::cloud::LaunchAllowList {
        images: listed(&args.allowed_node_images),
        image_owners: listed(&args.allowed_node_image_owners),
        instance_types: listed(&args.allowed_node_instance_types),
    };
    if config.allow_list.is_empty() {
        tracing::info!("no launch allow-list: any image and instance type a QuestDB names may be launched (--allowed-node-images, --allowed-node-image-owners, --allowed-node-instance-types)");
    }
    config.hosted_zone_id = args.route53_hosted_zone_id.clone();
    config.endpoint_url = args.aws_endpoint_url.clone();
    config.user_data_template = match &args.node_user_data_template {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the user-data template {}", path.display()))?,
        None => DEFAULT_USER_DATA_TEMPLATE.to_string(),
    };
    #[cfg(feature = "memory-cloud")]
    if provider == CloudProvider::Memory {
        if config.subnets_by_zone.is_empty() {
            for zone in SANDBOX_ZONES {
                config
                    .subnets_by_zone
                    .insert(zone.to_string(), format!("subnet-{zone}"));
            }
        }
        if config.hosted_zone_id.is_none() {
            config.hosted_zone_id = Some(SANDBOX_HOSTED_ZONE.to_string());
        }
        let eks = &mut config.eks;
        eks.api_endpoint
            .get_or_insert_with(|| SANDBOX_EKS_ENDPOINT.to_string());
        eks.certificate_authority
            .get_or_insert_with(|| SANDBOX_EKS_CA.to_string());
        eks.service_cidr
            .get_or_insert_with(|| SANDBOX_SERVICE_CIDR.to_string());
    }
    Ok(config)
}

/// What the operator cannot start without, once the flags (and, on AWS, the EKS cluster:
/// [`crate::cloud::aws::discover`]) have said all they will: subnets, security groups, a
/// bootstrap whose every placeholder has a value, an IPv4 service range.
pub(crate) fn check_cloud_config(
    config: &CloudConfig,
    provider: CloudProvider,
) -> anyhow::Result<()> {
    if provider == CloudProvider::Aws {
        let missing = crate::cloud::discovery::still_missing(config, None);
        if !missing.is_empty() {
            anyhow::bail!(
                "required with --cloud-provider aws (the EKS cluster was not asked): {}",
                missing.join("; ")
            );
        }
    }
    if let Some(cidr) = config.eks.service_cidr.as_deref() {
        // Said here, naming the flag: otherwise the first launch fails on a template
        // placeholder left without a value.
        if user_data::cluster_dns_ip(cidr).is_none() {
            anyhow::bail!(
                "--eks-service-cidr {cidr}: an IPv4 CIDR of at most /28 is needed (`kubernetesNetworkConfig.serviceIpv4Cidr`); IPv6 clusters are not supported: the operator's records are A records and a node's bootstrap takes the IPv4 service range"
            );
        }
    }
    user_data::check_template(config).map_err(|e| anyhow::anyhow!("{e}"))?;
    if !user_data::sets_kernel_limits(&config.user_data_template) {
        // Allowed: the image may set them. Said once, where the operator's start is read.
        tracing::warn!(
            limit = user_data::KERNEL_LIMIT,
            "the node user-data template does not set both vm.max_map_count and the open-file limit QuestDB's docs ask for; unless the node image sets them, a database with many tables or partitions fails to map or open its files (docs/user-guide/dedicated-nodes.md#kernel-limits)"
        );
    }
    Ok(())
}

/// [`cloud_config`] and [`check_cloud_config`] without asking AWS: the flags alone must say
/// everything (offline checks, tests of the flags).
#[cfg(test)]
pub(crate) fn checked_cloud_config(
    args: &CloudArgs,
    provider: CloudProvider,
) -> anyhow::Result<CloudConfig> {
    let config = cloud_config(args, provider)?;
    check_cloud_config(&config, provider)?;
    Ok(config)
}

/// On AWS, the configuration the operator runs with: `config` (the flags, [`cloud_config`]),
/// then what they left out read from the EKS cluster ([`crate::cloud::aws::discover`]), then
/// checked.
#[cfg(feature = "aws")]
pub async fn aws_cloud_config(
    mut config: CloudConfig,
    sdk: &aws_config::SdkConfig,
) -> anyhow::Result<CloudConfig> {
    let taken = crate::cloud::aws::discover(sdk, &mut config)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if !taken.is_empty() {
        info!(
            cluster = %config.cluster_name,
            "read from the EKS cluster (the flags left them out): {}",
            taken.join("; ")
        );
    }
    check_cloud_config(&config, CloudProvider::Aws)?;
    Ok(config)
}

pub fn cloud_settings(args: &CloudArgs) -> CloudSettings {
    CloudSettings {
        instance_sync_interval: args.instance_sync_interval,
        orphan_sweep_interval: args.orphan_sweep_interval,
        scheduled_event_interval: args.scheduled_event_interval,
        orphan_grace_period: args.orphan_grace_period,
        node_move_join_timeout: args.node_move_join_timeout,
        node_join_timeout: args.node_join_timeout,
        node_move_step_timeout: args.node_move_step_timeout,
        escalation: crate::plan::failover::Escalation {
            graceful_stop: args.fence_graceful_stop_timeout,
            stop: args.fence_stop_escalation,
            detach: args.fence_detach_escalation,
        },
        csi_driver: Some(args.csi_driver.trim().to_string()).filter(|d| !d.is_empty()),
        node_move_concurrency: usize::from(args.node_move_concurrency),
        node_move_concurrency_per_namespace: usize::from(args.node_move_concurrency_per_namespace),
        max_dedicated_nodes_per_namespace: Some(args.max_dedicated_nodes_per_namespace as usize)
            .filter(|n| *n > 0),
        node_lease_duration: args
            .node_lease_duration
            .unwrap_or(crate::controllers::node_health::tracker::DEFAULT_NODE_LEASE_DURATION),
        dns_namespace_suffix: args
            .dns_namespace_suffix
            .as_deref()
            .map(|s| s.trim_matches('.').to_ascii_lowercase())
            .filter(|s| !s.is_empty()),
        dns_names_first_come: args.dns_names_first_come,
    }
}

/// Builds the node and DNS providers the flags ask for (`default` when `--cloud-provider` is
/// not given). `observer` is usually `ManagerHandle::metrics.aws_observer()`.
pub(crate) async fn build_cloud(
    args: &CloudArgs,
    default: CloudProvider,
    observer: SharedObserver,
) -> anyhow::Result<Option<BuiltCloud>> {
    build_cloud_with(
        args,
        default,
        observer,
        #[cfg(feature = "memory-cloud")]
        MemoryEc2Options::default(),
    )
    .await
}

/// [`build_cloud`], with the memory cloud's options (the sandbox gives its instances loopback
/// addresses when real databases listen on them).
pub async fn build_cloud_with(
    args: &CloudArgs,
    default: CloudProvider,
    observer: SharedObserver,
    #[cfg(feature = "memory-cloud")] memory: MemoryEc2Options,
) -> anyhow::Result<Option<BuiltCloud>> {
    let provider = args.cloud_provider.unwrap_or(default);
    if provider == CloudProvider::None {
        return Ok(None);
    }
    let config = cloud_config(args, provider)?;
    let settings = cloud_settings(args);
    let built = match provider {
        CloudProvider::None => return Ok(None),
        #[cfg(feature = "memory-cloud")]
        CloudProvider::Memory => {
            check_cloud_config(&config, provider)?;
            let m =
                MemoryCloud::new(config, memory, observer).context("building the memory cloud")?;
            BuiltCloud {
                cloud: Cloud {
                    nodes: m.nodes.clone(),
                    dns: Some(m.dns.clone() as Arc<dyn DnsProvider>),
                    settings,
                },
                memory: Some((m.ec2.clone(), m.route53.clone())),
            }
        }
        #[cfg(not(feature = "aws"))]
        CloudProvider::Aws => {
            let _ = (config, settings, observer);
            anyhow::bail!("this build has no AWS provider (built without the `aws` feature)")
        }
        #[cfg(feature = "aws")]
        CloudProvider::Aws => {
            // The subnets and security groups are checked by the preflight once the operator
            // runs: a mistake is named in a line, an Event and a metric, and holds launches
            // back, instead of a crash loop that also stops every other database's care.
            let sdk = crate::cloud::aws::sdk_config_loader(&config).load().await;
            let config = aws_cloud_config(config, &sdk).await?;
            let aws =
                AwsCloud::from_sdk_config(&sdk, config, observer).context("connecting to AWS")?;
            BuiltCloud {
                cloud: Cloud {
                    nodes: aws.nodes.clone(),
                    dns: aws.dns.clone().map(|d| d as Arc<dyn DnsProvider>),
                    settings,
                },
                #[cfg(feature = "memory-cloud")]
                memory: None,
            }
        }
    };
    info!(provider = ?provider, "cloud provider configured");
    Ok(Some(built))
}

pub fn options_from(args: &RunArgs) -> anyhow::Result<ManagerOptions> {
    let identity = args.leader_elect_identity.clone().unwrap_or_else(hostname);
    Ok(ManagerOptions {
        namespace: Some(args.namespace.clone()).filter(|n| !n.is_empty()),
        questdb_concurrency: args.questdb_concurrency,
        node_health_concurrency: args.node_health_concurrency,
        backup_concurrency: args.backup_concurrency,
        backup_schedule_concurrency: args.backup_schedule_concurrency,
        write_health_interval: std::time::Duration::from_secs(args.write_health_interval),
        backup_timeouts: crate::plan::backup::Timeouts {
            cut: std::time::Duration::from_secs(args.backup_checkpoint_timeout),
            upload: std::time::Duration::from_secs(args.backup_upload_timeout),
            create: std::time::Duration::from_secs(args.backup_checkpoint_create_timeout),
            ..Default::default()
        },
        leader_election: args.leader_elect.then(|| LeaderElection {
            lease_name: args.leader_election_id.clone(),
            namespace: args.leader_election_namespace.clone(),
            identity,
            duration: std::time::Duration::from_secs(args.leader_elect_lease_duration),
            grace: std::time::Duration::from_secs(args.leader_elect_renew_grace),
        }),
        metrics_addr: parse_bind_address(&args.metrics_bind_address)?,
        health_addr: parse_bind_address(&args.health_probe_bind_address)?,
        // Built by the caller: the providers need the manager's metrics.
        cloud: None,
        operator_pod: crate::controllers::preflight::operator_pod_from_env(),
        operator_version: env!("CARGO_PKG_VERSION").into(),
        max_concurrent_operator_rollouts: usize::from(args.max_concurrent_operator_rollouts),
        kubelet_ca: match &args.kubelet_ca_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading --kubelet-ca-file {}", path.display()))?,
            ),
            None => None,
        },
        tenancy: crate::desired::TenancyPolicy {
            allowed_image_registries: args.allowed_image_registries.clone(),
            allowed_priority_classes: args.allowed_priority_classes.clone(),
            allowed_toleration_keys: args.allowed_toleration_keys.clone(),
            secret_namespaces: args.secret_namespaces.clone(),
            backup_schedules: crate::desired::tenancy::ScheduleLimits {
                min_interval: Some(args.backup_schedule_min_interval).filter(|d| !d.is_zero()),
                max_retention: Some(args.backup_retention_max),
            },
        },
    })
}

fn hostname() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("questdb-operator-{}", std::process::id()))
}

//! Command line: `run`, `crd`, `version`. Every flag can also come from an env var.
//! Flag names follow controller-runtime's where one exists.

pub use questdb_core::duration::parse_duration;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "questdb-operator",
    version,
    about = "Runs QuestDB databases on Kubernetes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub log: LogArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the operator against the cluster of the current kubeconfig / in-cluster config.
    Run(Box<RunArgs>),
    /// Print the QuestDB CustomResourceDefinitions as YAML.
    Crd(CrdArgs),
    /// List what the operator owns that costs money or holds data (QuestDBs, instances,
    /// records, volume claims, snapshots): what an uninstall would leave behind. Reads only.
    Inventory(Box<InventoryArgs>),
    /// Run the preflight once (what the operator checks at start: the network, the allowed
    /// instance types, the QuestDBs' launches as a dry run, the hosted zone, the snapshot API),
    /// print each finding with its fix, and exit 1 if there is one. The chart's `helm test`.
    Preflight(Box<PreflightArgs>),
    /// Print the version.
    Version,
}

#[derive(Args, Debug, Clone)]
pub struct InventoryArgs {
    /// Path to a kubeconfig; otherwise KUBECONFIG, ~/.kube/config or the in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Only this namespace; all when unset.
    #[arg(long)]
    pub namespace: Option<String>,

    /// The operator's cloud settings, as given to `run` (the chart's values): without them
    /// only the cluster's objects are listed, not EC2's instances nor Route53's records.
    #[command(flatten)]
    pub cloud: CloudArgs,
}

/// `preflight` takes exactly `run`'s flags (the chart's `helm test` Pod runs the Deployment's
/// arguments with `preflight` for `run`), so it checks the configuration the operator runs with.
#[derive(Args, Debug, Clone)]
pub struct PreflightArgs {
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug, Clone)]
pub struct CrdArgs {
    /// The kubelets' Lease duration, as given to `run`: the floor of
    /// `spec.failover.unhealthyAfterSeconds` in the schema (40s unless changed).
    #[arg(long, env = "NODE_LEASE_DURATION", value_parser = parse_duration)]
    pub node_lease_duration: Option<Duration>,
}

#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// Log format: `text` (human, ISO-8601 timestamps) or `json`. Filter with RUST_LOG.
    #[arg(long, global = true, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Path to a kubeconfig; otherwise KUBECONFIG, ~/.kube/config or the in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Watch only this namespace (all namespaces when empty).
    #[arg(long, env = "WATCH_NAMESPACE", default_value = "")]
    pub namespace: String,

    /// Enable leader election: only the holder of the Lease reconciles.
    #[arg(long, env = "LEADER_ELECT", default_value_t = false)]
    pub leader_elect: bool,

    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "LEADER_ELECTION_ID",
        default_value = "questdb-operator-leader"
    )]
    pub leader_election_id: String,

    /// Namespace of the leader-election Lease (defaults to the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "questdb-operator")]
    pub leader_election_namespace: String,

    /// Seconds a leader's Lease is valid without renewal; a standby takes over after it.
    #[arg(long, env = "LEADER_ELECT_LEASE_DURATION", default_value_t = 15)]
    pub leader_elect_lease_duration: u64,

    /// Seconds before expiry at which the leader renews its Lease.
    #[arg(long, env = "LEADER_ELECT_RENEW_GRACE", default_value_t = 5)]
    pub leader_elect_renew_grace: u64,

    /// Identity in the Lease (defaults to the hostname, i.e. the pod name).
    #[arg(long, env = "LEADER_ELECT_IDENTITY")]
    pub leader_elect_identity: Option<String>,

    /// Address of the Prometheus /metrics endpoint (`0` disables it).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = ":8080")]
    pub metrics_bind_address: String,

    /// Address of /healthz and /readyz (`0` disables it).
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// Concurrent reconciles of the QuestDB controller (never two of one object).
    #[arg(long, env = "QUESTDB_CONCURRENCY", default_value_t = 4)]
    pub questdb_concurrency: u16,

    /// Concurrent reconciles of the node-health controller (never two of one Node).
    #[arg(long, env = "NODE_HEALTH_CONCURRENCY", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub node_health_concurrency: u16,

    /// Concurrent reconciles of the backup controller (never two of one QuestDBBackup).
    #[arg(long, env = "BACKUP_CONCURRENCY", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub backup_concurrency: u16,

    /// Concurrent reconciles of the backup-schedule controller.
    #[arg(long, env = "BACKUP_SCHEDULE_CONCURRENCY", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub backup_schedule_concurrency: u16,

    /// Databases an operator upgrade restarts at once when the new version builds a different
    /// pod template (a database with a maintenance window restarts in it). The user's own
    /// changes, failovers and node moves are never held.
    #[arg(long, env = "MAX_CONCURRENT_OPERATOR_ROLLOUTS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_operator_rollouts: u16,

    /// Seconds a backup may hold the database's checkpoint open before its snapshot is cut;
    /// then it fails and releases the checkpoint.
    #[arg(long, env = "BACKUP_CHECKPOINT_TIMEOUT", default_value_t = 600)]
    pub backup_checkpoint_timeout: u64,

    /// Seconds `CHECKPOINT CREATE` may take to answer (it syncs the database's files first):
    /// an unanswered CREATE is settled by asking the database, never assumed complete.
    #[arg(long, env = "BACKUP_CHECKPOINT_CREATE_TIMEOUT", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub backup_checkpoint_create_timeout: u64,

    /// Seconds a cut snapshot may take to become ready to use (an EBS snapshot's upload)
    /// before the backup fails.
    #[arg(long, env = "BACKUP_UPLOAD_TIMEOUT", default_value_t = 21600)]
    pub backup_upload_timeout: u64,

    /// A PEM file with the CA that signs the kubelets' serving certificates, which the
    /// operator reads the volumes' usage from (`/stats/summary`). Unset: the cluster's CA
    /// (EKS signs kubelet serving certificates with it).
    #[arg(long, env = "KUBELET_CA_FILE")]
    pub kubelet_ca_file: Option<std::path::PathBuf>,

    /// Seconds between reads of each Running database's `wal_tables()` (`WriteHealthy`) and of
    /// its volume's usage (`DiskSpace`).
    #[arg(long, env = "WRITE_HEALTH_INTERVAL", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub write_health_interval: u64,

    /// Registries or repository prefixes a QuestDB's `spec.image` must come from (comma
    /// separated, by whole path segments: `docker.io/questdb`,
    /// `123456789012.dkr.ecr.us-east-1.amazonaws.com`). Unset: any image.
    #[arg(long, env = "ALLOWED_IMAGE_REGISTRIES", value_delimiter = ',')]
    pub allowed_image_registries: Vec<String>,

    /// PriorityClasses a QuestDB's `spec.pod.priorityClassName` may name (comma separated).
    /// Unset: any but the cluster's own `system-` classes, which the schema refuses.
    #[arg(long, env = "ALLOWED_PRIORITY_CLASSES", value_delimiter = ',')]
    pub allowed_priority_classes: Vec<String>,

    /// Taint keys a QuestDB's `spec.pod.tolerations` may tolerate (comma separated). Unset: any
    /// but the operator's, the control plane's, a cordon's and a fence's, which the schema
    /// refuses.
    #[arg(long, env = "ALLOWED_TOLERATION_KEYS", value_delimiter = ',')]
    pub allowed_toleration_keys: Vec<String>,

    /// Read Secrets only in these namespaces (comma separated), one watch each, so the
    /// operator needs no cluster-wide Secret read (the chart's `rbac.secretNamespaces` grants
    /// exactly these). A QuestDB in another namespace is refused (`SpecValid=False`). Unset:
    /// every namespace watched.
    #[arg(long, env = "SECRET_NAMESPACES", value_delimiter = ',')]
    pub secret_namespaces: Vec<String>,

    /// The shortest time a QuestDBBackupSchedule may leave between two backups (e.g. `15m`;
    /// `0s`: no limit). A denser schedule makes no backup and says why in its status.
    #[arg(long, env = "BACKUP_SCHEDULE_MIN_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub backup_schedule_min_interval: std::time::Duration,

    /// The most backups a QuestDBBackupSchedule may keep (`retention`): each is a volume
    /// snapshot in the account's quota.
    #[arg(long, env = "BACKUP_RETENTION_MAX", default_value_t = 200, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub backup_retention_max: i32,

    #[command(flatten)]
    pub cloud: CloudArgs,
}

/// Where dedicated nodes and DNS records come from.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudProvider {
    /// No dedicated nodes: `spec.node` / `spec.dns` report NotConfigured.
    None,
    /// In-process fake EC2 + Route53 (sandbox, tests; not in the shipped binary).
    #[cfg(feature = "memory-cloud")]
    Memory,
    /// EC2 + Route53 through the AWS SDK (standard credential chain).
    Aws,
}

/// Operator-wide cloud settings, shared by `run` and the sandbox.
#[derive(Args, Debug, Clone)]
pub struct CloudArgs {
    /// Node and DNS provider (run: `none` by default; sandbox: `memory`).
    #[arg(long, env = "CLOUD_PROVIDER", value_enum)]
    pub cloud_provider: Option<CloudProvider>,

    /// Value of the `questdb.io/cluster` tag on every instance: separates operators sharing
    /// one AWS account. The orphan sweep only ever looks at instances with this tag. Required
    /// with `--cloud-provider aws`: a shared default would let two clusters sweep each other.
    #[arg(long, env = "CLUSTER_NAME")]
    pub cluster_name: Option<String>,

    /// AWS region. Required with `--cloud-provider aws` (this flag or AWS_REGION; the SDK's
    /// profile and instance metadata are not asked).
    #[arg(long, env = "AWS_REGION")]
    pub aws_region: Option<String>,

    /// Talk to this endpoint instead of AWS (e.g. moto on 127.0.0.1).
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub aws_endpoint_url: Option<String>,

    /// Subnet per availability zone: `zone=subnet-id,zone=subnet-id`. Unset with
    /// `--cloud-provider aws`: per zone, the private subnet of the EKS cluster (DescribeCluster)
    /// with the most free addresses; the preflight checks every subnet against EC2.
    #[arg(long, env = "AWS_SUBNETS", default_value = "")]
    pub aws_subnets: String,

    /// Subnet per availability zone for the nodes of public databases (`spec.dns.public`),
    /// when they must not share the private databases' subnets: `zone=subnet-id,...`. Unset:
    /// the EKS cluster's public subnets (tagged `kubernetes.io/role/elb`, or giving public
    /// addresses) when `--aws-subnets` is unset too; otherwise `--aws-subnets`.
    #[arg(long, env = "AWS_PUBLIC_SUBNETS", default_value = "")]
    pub aws_public_subnets: String,

    /// Security groups of every dedicated node (comma separated). Unset: the EKS cluster's
    /// security group and the groups tagged `questdb.io/cluster=<cluster>` (the stack's
    /// database group).
    #[arg(long, env = "AWS_SECURITY_GROUP_IDS", value_delimiter = ',')]
    pub aws_security_group_ids: Vec<String>,

    /// Tags of your own on every dedicated instance, its volumes and network interface, at
    /// launch (`key=value,key=value`): cost allocation, tag policies. Not `questdb.io/*`,
    /// `kubernetes.io/cluster/*`, `Name` or `aws:*`, which are the operator's or AWS's.
    #[arg(long, env = "NODE_TAGS", value_delimiter = ',')]
    pub node_tags: Vec<String>,

    /// Instance profile (name or ARN) of every dedicated node. Unset: `<cluster>-questdb-node`,
    /// the one the CloudFormation stack makes (none with `--aws-endpoint-url`, an emulator).
    #[arg(long, env = "AWS_INSTANCE_PROFILE")]
    pub aws_instance_profile: Option<String>,

    /// A QuestDB's `spec.dns.name` must lie under `<its namespace>.<this suffix>` (e.g.
    /// `db.example.com`: team-a's databases are `*.team-a.db.example.com`). Unset: the name's
    /// second label must be its namespace (`<name>.<namespace>.<zone>`), unless
    /// `--dns-names-first-come`.
    #[arg(long, env = "DNS_NAMESPACE_SUFFIX")]
    pub dns_namespace_suffix: Option<String>,

    /// Without `--dns-namespace-suffix`, let a QuestDB take any name in the hosted zone, first
    /// come first served (before this flag existed, the only behaviour): one namespace can then
    /// take a name another namespace's clients use. For a single-tenant cluster.
    #[arg(long, env = "DNS_NAMES_FIRST_COME", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub dns_names_first_come: bool,

    /// AMI ids a QuestDB's `spec.node.image` may name (comma separated). With
    /// `--allowed-node-image-owners` too, an image passes if either allows it. Unset with no
    /// owners: any image.
    #[arg(long, env = "ALLOWED_NODE_IMAGES", value_delimiter = ',')]
    pub allowed_node_images: Vec<String>,

    /// Whose images may be launched (checked with DescribeImages; comma separated): AWS
    /// account ids (`OwnerId`) or the owner alias `amazon` (`ImageOwnerAlias`), as IAM's
    /// `ec2:Owner` takes them. `amazon` covers the EKS-optimised AL2023 and the Bottlerocket
    /// AMIs. With `--allowed-node-images` too, an image passes if either allows it. Unset with
    /// no images: any image.
    #[arg(long, env = "ALLOWED_NODE_IMAGE_OWNERS", value_delimiter = ',')]
    pub allowed_node_image_owners: Vec<String>,

    /// Instance types a QuestDB may ask for (comma separated; `m6i.*` for a family). Unset:
    /// any type.
    #[arg(long, env = "ALLOWED_NODE_INSTANCE_TYPES", value_delimiter = ',')]
    pub allowed_node_instance_types: Vec<String>,

    /// User-data template that joins a node to the cluster; `{{node_labels}}` and
    /// `{{node_taints}}` must reach the kubelet. Unset: the built-in Amazon Linux 2023 `nodeadm`
    /// NodeConfig, which needs the EKS cluster's endpoint, CA and service range (the three
    /// `--eks-*` flags, or read from the cluster).
    #[arg(long, env = "NODE_USER_DATA_TEMPLATE")]
    pub node_user_data_template: Option<PathBuf>,

    /// The EKS cluster's API server endpoint (`aws eks describe-cluster` → `endpoint`). Unset:
    /// the operator asks `eks:DescribeCluster` for the cluster `--cluster-name` names.
    #[arg(long, env = "EKS_API_ENDPOINT")]
    pub eks_api_endpoint: Option<String>,

    /// The EKS cluster's CA bundle, base64 (`certificateAuthority.data`). Unset: read from
    /// the cluster.
    #[arg(long, env = "EKS_CERTIFICATE_AUTHORITY")]
    pub eks_certificate_authority: Option<String>,

    /// The EKS cluster's service CIDR (`kubernetesNetworkConfig.serviceIpv4Cidr`). Unset: read
    /// from the cluster.
    #[arg(long, env = "EKS_SERVICE_CIDR")]
    pub eks_service_cidr: Option<String>,

    /// Where the encrypted gp3 root volume is mapped. Unset: the image's own root device
    /// (`RootDeviceName`, read with DescribeImages at each launch).
    #[arg(long, env = "NODE_ROOT_DEVICE_NAME")]
    pub node_root_device_name: Option<String>,

    /// Size of a dedicated node's root volume in GiB (the database's data has its own volume);
    /// raised to the image's root snapshot size when that is larger.
    #[arg(long, env = "NODE_ROOT_VOLUME_GIB", default_value_t = 20, value_parser = clap::value_parser!(i32).range(1..=16384))]
    pub node_root_volume_gib: i32,

    /// Size in GiB of the image's other EBS volumes (Bottlerocket's data volume `/dev/xvdb`:
    /// container images and pod ephemeral storage), encrypted like the root. Unset: the image's
    /// own size.
    #[arg(long, env = "NODE_DATA_VOLUME_GIB", value_parser = clap::value_parser!(i32).range(1..=16384))]
    pub node_data_volume_gib: Option<i32>,

    /// KMS key of the node volumes' encryption (the account's default EBS key when unset).
    #[arg(long, env = "NODE_ROOT_VOLUME_KMS_KEY_ID")]
    pub node_root_volume_kms_key_id: Option<String>,

    /// Route53 hosted zone of `spec.dns` records (DNS is unavailable without it).
    #[arg(long, env = "ROUTE53_HOSTED_ZONE_ID")]
    pub route53_hosted_zone_id: Option<String>,

    /// How often orphaned instances are looked for (`90s`, `5m`, `1h` or seconds).
    #[arg(long, env = "ORPHAN_SWEEP_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub orphan_sweep_interval: Duration,

    /// How often EC2's scheduled events of the dedicated instances (retirement, stop, reboot,
    /// maintenance) are read: each becomes a planned node move in the maintenance window.
    #[arg(long, env = "SCHEDULED_EVENT_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub scheduled_event_interval: Duration,

    /// How long an instance without a QuestDB is left alone before it is terminated.
    #[arg(long, env = "ORPHAN_GRACE_PERIOD", default_value = "10m", value_parser = parse_duration)]
    pub orphan_grace_period: Duration,

    /// The kubelets' Lease duration (their `nodeLeaseDurationSeconds`, 40s unless changed;
    /// they renew every quarter of it). No dedicated node is failed over before its Lease has
    /// been silent this long, whatever `spec.failover.unhealthyAfterSeconds` asks.
    #[arg(long, env = "NODE_LEASE_DURATION", value_parser = parse_duration)]
    pub node_lease_duration: Option<Duration>,

    /// The CSI driver of the databases' volumes: a dedicated node takes its database only once
    /// this driver is registered on it (its CSINode lists it), which on EKS happens after the
    /// Node is Ready; an attach before that fails and backs off. Empty: no such wait.
    #[arg(long, env = "CSI_DRIVER", default_value = "ebs.csi.aws.com")]
    pub csi_driver: String,

    /// How long a running dedicated instance may go without its Node registering (a missing
    /// instance profile or access entry, user data the kubelet refuses, an image for another
    /// Kubernetes version) before the database says so (`NodeReady=False`, `NodeNeverJoined`)
    /// and, with `spec.failover` on, the instance is fenced and another launched.
    #[arg(long, env = "NODE_JOIN_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub node_join_timeout: Duration,

    /// How long a node-image move waits for the new node to join and be Ready before aborting.
    #[arg(long, alias = "upgrade-node-timeout", env = "NODE_MOVE_JOIN_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub node_move_join_timeout: Duration,

    /// How long each node-move step after the database stopped (stop, move, verify) may take
    /// before the database goes back to its old node.
    #[arg(long, alias = "upgrade-step-timeout", env = "NODE_MOVE_STEP_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub node_move_step_timeout: Duration,

    /// Node moves (image or instance type changes) under way at once, across all QuestDBs.
    #[arg(long, alias = "upgrade-concurrency", env = "NODE_MOVE_CONCURRENCY", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub node_move_concurrency: u16,

    /// Node moves under way at once in one namespace, so one tenant's moves (stuck ones
    /// included) never hold every slot of `--node-move-concurrency`.
    #[arg(long, alias = "upgrade-concurrency-per-namespace", env = "NODE_MOVE_CONCURRENCY_PER_NAMESPACE", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub node_move_concurrency_per_namespace: u16,

    /// Databases of one namespace that may run on dedicated nodes at once (a first launch
    /// waits at the cap, `NodeReady=False, NamespaceQuota`; replacements never do), so one
    /// tenant cannot take the account's whole vCPU quota. `0`: no cap.
    #[arg(long, env = "MAX_DEDICATED_NODES_PER_NAMESPACE", default_value_t = 20)]
    pub max_dedicated_nodes_per_namespace: u32,

    /// A fence first stops a dedicated instance normally (the OS shuts down: QuestDB gets
    /// SIGTERM and the kernel writes back what it held); a normal stop not ended after this
    /// long is forced (the power is cut: what QuestDB did not sync is lost). Every second of
    /// it is downtime when the node is really dead.
    #[arg(long, env = "FENCE_GRACEFUL_STOP_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub fence_graceful_stop_timeout: Duration,

    /// A fence's forced stop of a dedicated instance still under way after this long is forced again
    /// (then once per period): a stop can hang on a host problem or a stuck detach.
    #[arg(long, env = "FENCE_STOP_ESCALATION", default_value = "60s", value_parser = parse_duration)]
    pub fence_stop_escalation: Duration,

    /// A volume still attached to a fenced (stopped) instance this long after its pod is gone
    /// is stuck detaching: the fenced instance is terminated, which detaches it.
    #[arg(long, env = "FENCE_DETACH_ESCALATION", default_value = "120s", value_parser = parse_duration)]
    pub fence_detach_escalation: Duration,

    /// Maximum age of the shared DescribeInstances answer for converged databases.
    #[arg(long, env = "INSTANCE_SYNC_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub instance_sync_interval: Duration,
}

/// `90s`, `5m`, `1h` or a plain number of seconds.
/// The node-move flags' names before they were node moves (`--upgrade-*`, `UPGRADE_*`): the
/// flags are hidden aliases, and each old environment variable is read when its new one is
/// unset, for one release. Returns the old names found, for a deprecation line.
pub(crate) const DEPRECATED_ENV: [(&str, &str); 4] = [
    ("UPGRADE_NODE_TIMEOUT", "NODE_MOVE_JOIN_TIMEOUT"),
    ("UPGRADE_STEP_TIMEOUT", "NODE_MOVE_STEP_TIMEOUT"),
    ("UPGRADE_CONCURRENCY", "NODE_MOVE_CONCURRENCY"),
    (
        "UPGRADE_CONCURRENCY_PER_NAMESPACE",
        "NODE_MOVE_CONCURRENCY_PER_NAMESPACE",
    ),
];

/// Copies each deprecated variable to its new name when only the old one is set; call before
/// parsing, while the process is single-threaded. Returns the old names it copied.
pub(crate) fn adopt_deprecated_env() -> Vec<&'static str> {
    let mut adopted = Vec::new();
    for (old, new) in DEPRECATED_ENV {
        if let (Some(value), None) = (std::env::var_os(old), std::env::var_os(new)) {
            // At the top of main, before any thread starts.
            std::env::set_var(new, value);
            adopted.push(old);
        }
    }
    adopted
}

/// `zone=subnet,zone=subnet` as a map.
pub fn parse_subnets(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((zone, subnet)) if !zone.trim().is_empty() && !subnet.trim().is_empty() => {
                Ok((zone.trim().to_string(), subnet.trim().to_string()))
            }
            _ => Err(format!("`{pair}` is not zone=subnet-id")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_defaults_match_controller_runtime() {
        let cli = Cli::try_parse_from(["questdb-operator", "run"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(args.metrics_bind_address, ":8080");
        assert_eq!(args.health_probe_bind_address, ":8081");
        assert_eq!(args.questdb_concurrency, 4);
        assert!(!args.leader_elect);
    }

    #[test]
    fn cloud_flags_parse_durations_and_subnets() {
        let cli = Cli::try_parse_from([
            "questdb-operator",
            "run",
            "--cloud-provider",
            "aws",
            "--aws-subnets",
            "us-east-1a=subnet-a, us-east-1b=subnet-b",
            "--aws-security-group-ids",
            "sg-1,sg-2",
            "--orphan-grace-period",
            "90s",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(args.cloud.cloud_provider, Some(CloudProvider::Aws));
        assert_eq!(args.cloud.aws_security_group_ids, ["sg-1", "sg-2"]);
        assert_eq!(args.cloud.orphan_grace_period, Duration::from_secs(90));
        assert_eq!(args.cloud.orphan_sweep_interval, Duration::from_secs(300));
        assert_eq!(
            args.cloud.scheduled_event_interval,
            Duration::from_secs(300)
        );
        let subnets = parse_subnets(&args.cloud.aws_subnets).unwrap();
        assert_eq!(subnets["us-east-1b"], "subnet-b");
    }

    #[test]
    fn bad_durations_and_subnets_are_rejected_with_the_culprit() {
        assert!(parse_duration("5x").unwrap_err().contains("5x"));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_subnets("us-east-1a")
            .unwrap_err()
            .contains("us-east-1a"));
        assert_eq!(parse_subnets(""), Ok(BTreeMap::new()));
    }

    #[test]
    fn aws_without_cluster_name_or_the_network_values_is_refused_at_start_up_naming_the_flags() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["questdb-operator", "run", "--cloud-provider", "aws"];
            argv.extend_from_slice(extra);
            let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else {
                panic!("expected run")
            };
            crate::app::checked_cloud_config(&args.cloud, CloudProvider::Aws)
        };
        let err = parse(&["--aws-region", "us-east-1"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--cluster-name"), "{err}");
        let base = ["--aws-region", "us-east-1", "--cluster-name", "prod-eu"];
        // Without the EKS cluster's answer (the operator asks it at start: aws::discover),
        // the flags must say where nodes go, all missing ones named at once.
        let err = parse(&base).unwrap_err().to_string();
        assert!(
            err.contains("--aws-subnets") && err.contains("--aws-security-group-ids"),
            "{err}"
        );
        let with_sg = [
            &base[..],
            &[
                "--aws-security-group-ids",
                "sg-1",
                "--aws-subnets",
                "us-east-1a=subnet-1",
            ],
        ]
        .concat();
        let err = parse(&with_sg).unwrap_err().to_string();
        assert!(err.contains("--eks-api-endpoint"), "{err}");
        let eks = [
            "--eks-api-endpoint",
            "https://x.eks.amazonaws.com",
            "--eks-certificate-authority",
            "Y2E=",
            "--eks-service-cidr",
            "172.20.0.0/16",
        ];
        let ipv6 = [
            &with_sg[..],
            &eks[..4],
            &["--eks-service-cidr", "fd00:10:96::/112"],
        ]
        .concat();
        let err = parse(&ipv6).unwrap_err().to_string();
        assert!(
            err.contains("--eks-service-cidr") && err.contains("IPv6"),
            "{err}"
        );
        let ok = parse(&[&with_sg[..], &eks[..]].concat()).unwrap();
        assert_eq!(ok.cluster_name, "prod-eu");
        assert_eq!(
            ok.instance_profile.as_deref(),
            Some("prod-eu-questdb-node"),
            "unset: the instance profile the stack makes for the cluster"
        );
        assert_eq!(
            ok.volumes.root_device_name, "",
            "unset: the image's own root device, read at launch"
        );
    }

    /// A deployment written before node moves were called so keeps its settings for one
    /// release: the old flags are hidden aliases of the new.
    #[test]
    fn the_node_move_flags_old_upgrade_names_still_set_them() {
        let Command::Run(args) = Cli::try_parse_from([
            "questdb-operator",
            "run",
            "--upgrade-concurrency",
            "5",
            "--upgrade-concurrency-per-namespace=3",
            "--upgrade-node-timeout",
            "7m",
            "--upgrade-step-timeout=9m",
        ])
        .unwrap()
        .command
        else {
            panic!("expected run")
        };
        assert_eq!(args.cloud.node_move_concurrency, 5);
        assert_eq!(args.cloud.node_move_concurrency_per_namespace, 3);
        assert_eq!(args.cloud.node_move_join_timeout, Duration::from_secs(420));
        assert_eq!(args.cloud.node_move_step_timeout, Duration::from_secs(540));
        let help = Cli::command()
            .find_subcommand_mut("run")
            .expect("run")
            .render_long_help()
            .to_string();
        assert!(
            help.contains("--node-move-concurrency") && !help.contains("--upgrade-"),
            "the help shows the new names only"
        );
    }

    #[test]
    fn json_logs_can_be_chosen() {
        let cli = Cli::try_parse_from(["questdb-operator", "--log-format", "json", "crd"]).unwrap();
        assert_eq!(cli.log.log_format, LogFormat::Json);
    }
}

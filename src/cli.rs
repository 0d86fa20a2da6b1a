//! Command line: `run`, `crd`, `sandbox`, `version`. Every flag can also come from an env var.
//! Flag names follow controller-runtime's where one exists.

use std::path::PathBuf;

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
    Run(RunArgs),
    /// Print the QuestDB CustomResourceDefinition as YAML.
    Crd,
    /// Start a simulated control plane with three nodes, run the operator against it and apply
    /// examples/questdb.yaml: a local sandbox with no cluster needed.
    Sandbox(SandboxArgs),
    /// Print the version.
    Version,
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
}

#[derive(Args, Debug, Clone)]
pub struct SandboxArgs {
    /// Where to write a kubeconfig for kubectl.
    #[arg(long, env = "SANDBOX_KUBECONFIG", default_value = "sandbox.kubeconfig")]
    pub kubeconfig: PathBuf,

    /// Port of the simulated apiserver on 127.0.0.1 (0 = any free port).
    #[arg(long, env = "SANDBOX_PORT", default_value_t = 0)]
    pub port: u16,

    /// QuestDB manifest applied at start (skipped when the file does not exist).
    #[arg(long, env = "SANDBOX_EXAMPLE", default_value = "examples/questdb.yaml")]
    pub example: PathBuf,

    /// Simulated time runs this many times faster than wall time (grace periods, heartbeats).
    #[arg(long, env = "SANDBOX_CLOCK_SPEED", default_value_t = 1.0)]
    pub clock_speed: f64,

    /// Exit once the example QuestDB is Ready instead of running until Ctrl-C.
    #[arg(long, env = "SANDBOX_EXIT_WHEN_READY", default_value_t = false)]
    pub exit_when_ready: bool,

    /// Address of the operator's /metrics endpoint (`0` disables it).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = "127.0.0.1:8080")]
    pub metrics_bind_address: String,

    /// Address of the operator's /healthz and /readyz (`0` disables it).
    #[arg(
        long,
        env = "HEALTH_PROBE_BIND_ADDRESS",
        default_value = "127.0.0.1:8081"
    )]
    pub health_probe_bind_address: String,

    /// Concurrent reconciles of the QuestDB controller.
    #[arg(long, env = "QUESTDB_CONCURRENCY", default_value_t = 4)]
    pub questdb_concurrency: u16,
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
    fn json_logs_can_be_chosen() {
        let cli = Cli::try_parse_from(["questdb-operator", "--log-format", "json", "crd"]).unwrap();
        assert_eq!(cli.log.log_format, LogFormat::Json);
    }
}

//! `questdb-sandbox`: a local Kubernetes control plane, the real operator against it, the
//! in-memory cloud, and `examples/questdb.yaml` applied: the README's first command. The
//! control plane is the real one: kube-apiserver, kube-controller-manager, kube-scheduler and
//! etcd, built from their Go modules on first use, so Go is needed; without it the sandbox says
//! so in its first line and stops.

mod faults;
mod progress;
mod real;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use questdb_operator::cli::CloudArgs;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "questdb-sandbox",
    version,
    about = "A local QuestDB operator sandbox"
)]
pub struct SandboxArgs {
    /// Where to write a kubeconfig for kubectl.
    #[arg(long, env = "SANDBOX_KUBECONFIG", default_value = "sandbox.kubeconfig")]
    pub kubeconfig: PathBuf,

    /// QuestDB manifest applied at start (skipped when the file does not exist).
    #[arg(long, env = "SANDBOX_EXAMPLE", default_value = "examples/questdb.yaml")]
    pub example: PathBuf,

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

    /// Database pods: `auto` (a real QuestDB when Java is installed), `real` (the Maven jar of
    /// the image's version, fetched once) or `fake` (pods reported Ready, nothing runs).
    #[arg(long, env = "SANDBOX_DATABASES", default_value = "auto")]
    pub databases: String,

    /// Concurrent reconciles of the QuestDB controller.
    #[arg(long, env = "QUESTDB_CONCURRENCY", default_value_t = 4)]
    pub questdb_concurrency: u16,

    #[command(flatten)]
    pub cloud: CloudArgs,
}

fn main() -> ExitCode {
    let args = SandboxArgs::parse();
    questdb_operator::metrics::install_crypto_provider();
    // fuser (the test volumes' FUSE layer) logs an ERROR for every answer to a request the
    // kernel has already dropped (ENOENT: the process that asked was killed, as a power-off
    // or a container stop does): expected, not news for a sandbox user.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,fuser::reply=off"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandbox: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let shutdown = questdb_operator::app::shutdown_on_signal();
        if !questdb_testenv::binaries::go_available() {
            anyhow::bail!(
                "Go 1.26+ is needed: the sandbox builds its control plane (kube-apiserver, \
                 kube-controller-manager, kube-scheduler, etcd) from their Go modules on first \
                 use. Install Go (https://go.dev/doc/install, or your distribution's golang \
                 package) and run again"
            );
        }
        real::run(args, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox: {e:#}");
            ExitCode::FAILURE
        }
    }
}

//! Process entry: logging, the runtime, signals and the subcommands.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command, LogFormat, RunArgs};
use crate::http_server::parse_bind_address;
use crate::manager::{self, LeaderElection, ManagerOptions};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    crate::metrics::install_crypto_provider();
    init_logging(cli.log.log_format);
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
        Command::Crd => {
            print!("{}", crate::crd::yaml()?);
            Ok(())
        }
        Command::Version => {
            println!("questdb-operator {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Run(args) => run(args).await,
        Command::Sandbox(args) => crate::sandbox::run(args, shutdown_on_signal()).await,
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
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let opts = options_from(&args)?;
    manager::run(opts, config, shutdown_on_signal()).await
}

pub fn options_from(args: &RunArgs) -> anyhow::Result<ManagerOptions> {
    let identity = args.leader_elect_identity.clone().unwrap_or_else(hostname);
    Ok(ManagerOptions {
        namespace: Some(args.namespace.clone()).filter(|n| !n.is_empty()),
        questdb_concurrency: args.questdb_concurrency,
        leader_election: args.leader_elect.then(|| LeaderElection {
            lease_name: args.leader_election_id.clone(),
            namespace: args.leader_election_namespace.clone(),
            identity,
            duration: std::time::Duration::from_secs(args.leader_elect_lease_duration),
            grace: std::time::Duration::from_secs(args.leader_elect_renew_grace),
        }),
        metrics_addr: parse_bind_address(&args.metrics_bind_address)?,
        health_addr: parse_bind_address(&args.health_probe_bind_address)?,
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

//! What both control planes share: the example QuestDB and the progress lines.

use anyhow::Context as _;
use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use questdb_operator::api::QuestDB;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::SandboxArgs;

/// Installs the operator's CRDs and waits until the apiserver serves `QuestDB` (the example
/// is applied next).
pub async fn install_crd(client: &kube::Client) -> anyhow::Result<()> {
    questdb_testenv::crds::install(client, std::time::Duration::from_secs(60)).await
}

/// Applies the example, reports progress until it is Ready (and exits then with
/// `--exit-when-ready`) or until Ctrl-C, then stops the manager gracefully.
pub async fn run_until_stopped(
    client: &kube::Client,
    args: &SandboxArgs,
    shutdown: &CancellationToken,
    manager_token: CancellationToken,
    manager: JoinHandle<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let example = apply_example(client, &args.example).await?;
    println!(
        "sandbox: kubectl --kubeconfig {} get qdb   (Ctrl-C to stop)",
        args.kubeconfig.display()
    );
    let progress = report_progress(
        client.clone(),
        example,
        args.exit_when_ready,
        args.kubeconfig.display().to_string(),
    );
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
    match tokio::time::timeout(std::time::Duration::from_secs(30), manager).await {
        Ok(Ok(Err(e))) => warn!(error = format!("{e:#}"), "manager stopped with an error"),
        Err(_) => warn!("manager did not stop within 30s"),
        _ => {}
    }
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
    kubeconfig: String,
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
            // Where clients connect: the record's address (the pod's, or the node's with host
            // ports); the node's without a record.
            let ip = status
                .dns_ip
                .clone()
                .or(status.node_ip.clone())
                .unwrap_or_default();
            println!(
                "{ns}/{name} is Ready at {ip}: node {}, instance {}, DNS {}, version {}",
                status.node_name.unwrap_or_default(),
                status.instance_id.as_deref().unwrap_or("-"),
                status.dns_name.as_deref().unwrap_or("-"),
                status.version.unwrap_or_default()
            );
            if let Some(secret) = status.credentials_secret {
                let field = |key: &str| {
                    format!("$(kubectl --kubeconfig {kubeconfig} -n {ns} get secret {secret} -o jsonpath='{{.data.{key}}}' | base64 -d)")
                };
                println!(
                    "  curl -u \"{}:{}\" 'http://{ip}:9000/exec?query=select%201'",
                    field("QDB_HTTP_USER"),
                    field("QDB_HTTP_PASSWORD")
                );
                println!(
                    "  PGPASSWORD=\"{}\" psql -h {ip} -p 8812 -U admin -d qdb",
                    field("QDB_PG_PASSWORD")
                );
                println!("  web console: http://{ip}:9000 (user and password: QDB_HTTP_USER / QDB_HTTP_PASSWORD of Secret {secret})");
            }
            return Ok(());
        }
    }
    anyhow::bail!("the watch on {ns}/{name} ended")
}

//! The local sandbox (in progress).
pub async fn run(_args: crate::cli::SandboxArgs, _shutdown: tokio_util::sync::CancellationToken) -> anyhow::Result<()> { anyhow::bail!("the sandbox is not wired yet") }

//! Starts a control plane (three worker nodes) and waits for Ctrl-C, for poking at by hand:
//! `cargo run -p questdb-testenv --example up -- /tmp/cp.kubeconfig`, then
//! `kubectl --kubeconfig /tmp/cp.kubeconfig get nodes`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "testenv.kubeconfig".into());
    let cp = questdb_testenv::ControlPlane::start(Default::default()).await?;
    std::fs::write(&path, cp.kubeconfig_yaml())?;
    println!("kubectl --kubeconfig {path} get nodes   (Ctrl-C to stop)");
    tokio::signal::ctrl_c().await?;
    drop(cp);
    Ok(())
}

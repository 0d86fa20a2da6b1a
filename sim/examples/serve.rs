//! Runs a simulated control plane with three nodes until Ctrl-C and writes its kubeconfig, for
//! poking at it with kubectl: `cargo run -p questdb-sim --example serve -- /tmp/sim.kubeconfig`.

use questdb_sim::{Sim, SimConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sim.kubeconfig".into());
    let sim = Sim::start(SimConfig::sandbox()).await?;
    std::fs::write(&path, sim.kubeconfig_yaml())?;
    println!(
        "simulated apiserver on {}; kubeconfig written to {path}",
        sim.url()
    );
    tokio::signal::ctrl_c().await?;
    sim.shutdown().await;
    Ok(())
}

//! The control plane a benchmark runs against: the simulator (in-process, fast, the default)
//! or the real one (questdb-testenv: kube-apiserver, kube-controller-manager, kube-scheduler,
//! etcd, fake kubelets and CSI). Request counts cover the operator's requests only: the bench's
//! own client is uncounted in both.

use std::collections::BTreeMap;

use anyhow::Context as _;
use kube::Client;
use questdb_sim::{Sim, SimConfig};
use questdb_testenv::{ControlPlane, ControlPlaneOptions, NodeRegistration, RequestCounts, Verb};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Simulated,
    Real,
}

impl std::str::FromStr for Kind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Kind> {
        match s {
            "simulated" | "sim" => Ok(Kind::Simulated),
            "real" => Ok(Kind::Real),
            other => anyhow::bail!("--control-plane must be simulated or real, not {other:?}"),
        }
    }
}

pub enum Cluster {
    Simulated(Sim),
    Real(Box<ControlPlane>),
}

fn sim_verb(v: questdb_sim::Verb) -> Verb {
    use questdb_sim::Verb as S;
    match v {
        S::Get => Verb::Get,
        S::List => Verb::List,
        S::Watch => Verb::Watch,
        S::Create => Verb::Create,
        S::Update => Verb::Update,
        S::Patch => Verb::Patch,
        S::Delete => Verb::Delete,
        S::DeleteCollection => Verb::DeleteCollection,
    }
}

impl Cluster {
    /// `nodes`: worker nodes as (name, zone).
    pub async fn start(
        kind: Kind,
        sim: SimConfig,
        nodes: &[(String, String)],
    ) -> anyhow::Result<Cluster> {
        Ok(match kind {
            Kind::Simulated => {
                Cluster::Simulated(Sim::start(sim).await.context("starting the simulator")?)
            }
            Kind::Real => {
                let opts = ControlPlaneOptions {
                    nodes: nodes
                        .iter()
                        .map(|(n, z)| NodeRegistration::worker(n, z))
                        .collect(),
                    ..ControlPlaneOptions::empty()
                };
                Cluster::Real(Box::new(
                    ControlPlane::start(opts)
                        .await
                        .context("starting the control plane")?,
                ))
            }
        })
    }

    /// The bench's own client: never counted.
    pub fn bench_client(&self) -> anyhow::Result<Client> {
        match self {
            Cluster::Simulated(sim) => super::cluster::uncounted_client(sim),
            Cluster::Real(cp) => Ok(cp.direct_client()),
        }
    }

    /// The operator's kubeconfig (on the real control plane: deploy/'s RBAC, through the
    /// counting proxy).
    pub fn operator_kubeconfig(&self) -> String {
        match self {
            Cluster::Simulated(sim) => sim.kubeconfig_yaml(),
            Cluster::Real(cp) => cp.operator_kubeconfig_yaml(),
        }
    }

    pub fn request_counts(&self) -> RequestCounts {
        match self {
            Cluster::Simulated(sim) => {
                let mut out = BTreeMap::new();
                for ((v, r), n) in sim.request_counts().0 {
                    *out.entry((sim_verb(v), r)).or_default() += n;
                }
                RequestCounts(out)
            }
            Cluster::Real(cp) => cp.request_counts(),
        }
    }

    pub fn reset_request_counts(&self) {
        match self {
            Cluster::Simulated(sim) => sim.reset_request_counts(),
            Cluster::Real(cp) => cp.reset_request_counts(),
        }
    }

    pub fn cut_watches(&self) {
        match self {
            Cluster::Simulated(sim) => sim.cut_watches(),
            Cluster::Real(cp) => cp.cut_watches(),
        }
    }

    pub async fn shutdown(self) {
        match self {
            Cluster::Simulated(sim) => sim.shutdown().await,
            Cluster::Real(cp) => drop(cp),
        }
    }
}

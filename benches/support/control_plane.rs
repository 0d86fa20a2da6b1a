//! The control plane a benchmark runs against: the real one (questdb-testenv: kube-apiserver,
//! kube-controller-manager, kube-scheduler, etcd, fake kubelets and CSI). Request counts cover
//! the operator's requests only: the bench's own client goes around the counting proxy.

use anyhow::Context as _;
use kube::Client;
use questdb_testenv::{ControlPlane, ControlPlaneOptions, NodeRegistration, RequestCounts};

pub struct Cluster(Box<ControlPlane>);

impl Cluster {
    /// `nodes`: worker nodes as (name, zone).
    pub async fn start(nodes: &[(String, String)]) -> anyhow::Result<Cluster> {
        let opts = ControlPlaneOptions {
            nodes: nodes
                .iter()
                .map(|(n, z)| NodeRegistration::worker(n, z))
                .collect(),
            ..ControlPlaneOptions::empty()
        };
        Ok(Cluster(Box::new(
            ControlPlane::start(opts)
                .await
                .context("starting the control plane")?,
        )))
    }

    /// The bench's own client: never counted.
    pub fn bench_client(&self) -> Client {
        self.0.direct_client()
    }

    /// A cluster-admin client through the counting proxy: for a baseline counted as the
    /// operator is.
    pub async fn counted_client(&self) -> Client {
        self.0.client().await
    }

    /// The operator's kubeconfig: deploy/'s RBAC, through the counting proxy.
    pub fn operator_kubeconfig(&self) -> String {
        self.0.operator_kubeconfig_yaml()
    }

    pub fn request_counts(&self) -> RequestCounts {
        self.0.request_counts()
    }

    pub fn reset_request_counts(&self) {
        self.0.reset_request_counts()
    }

    pub fn cut_watches(&self) {
        self.0.cut_watches()
    }

    /// The kubelets of every node: joins, faults (a partition silences a node's Lease).
    pub fn kubelets(&self) -> &questdb_testenv::kubelet::Kubelets {
        self.0.kubelets()
    }

    /// The control plane's own processes (etcd, kube-apiserver, ...), for their memory and CPU.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.0.pids()
    }

    pub async fn shutdown(self) {
        drop(self.0)
    }
}

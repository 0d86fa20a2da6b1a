//! A simulated Kubernetes control plane: an apiserver speaking the real REST + watch protocol on
//! 127.0.0.1, plus simulated cluster behaviour (scheduler, kubelets, StatefulSets, volumes).
//!
//! Start one with [`Sim::start`]; point kube-rs at [`Sim::client`] or kubectl at
//! [`Sim::kubeconfig_yaml`]. `sim/README.md` lists where it differs from a real apiserver.

pub mod clock;
pub mod cluster;
pub mod error;
mod events;
mod fields;
pub mod hooks;
mod ops;
mod patch;
pub mod registry;
mod schema;
mod selector;
mod server;
mod store;
mod table;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use hooks::{Fault, FaultId, RequestCounts, Verb};

use crate::hooks::INTERNAL_HEADER;
use crate::server::AppState;

/// How to start a [`Sim`].
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Nodes registered at start (none by default; see [`SimConfig::sandbox`]).
    pub nodes: Vec<cluster::NodeSpec>,
    /// Simulated time runs this many times faster than wall time.
    pub clock_speed: f64,
    /// Events kept per resource for watch resumption; older resourceVersions get 410 Expired.
    pub watch_window: usize,
    /// Listen address; `127.0.0.1:0` (an ephemeral port) when unset.
    pub bind: Option<SocketAddr>,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK (wall time).
    pub bookmark_interval: Duration,
    /// Timings and storage classes of the simulated cluster; its `nodes` are replaced by
    /// [`SimConfig::nodes`].
    pub cluster: cluster::ClusterConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            nodes: vec![],
            clock_speed: 1.0,
            watch_window: 1000,
            bind: None,
            bookmark_interval: Duration::from_secs(10),
            cluster: cluster::ClusterConfig::default(),
        }
    }
}

impl SimConfig {
    /// Three nodes in two zones, what `questdb-operator sandbox` runs.
    pub fn sandbox() -> Self {
        Self {
            nodes: vec![
                cluster::NodeSpec::new("sim-node-a1", "sim-zone-a"),
                cluster::NodeSpec::new("sim-node-a2", "sim-zone-a"),
                cluster::NodeSpec::new("sim-node-b1", "sim-zone-b"),
            ],
            ..Self::default()
        }
    }
}

/// A running simulated control plane. Call [`Sim::shutdown`] to stop it cleanly; dropping it
/// aborts the server.
pub struct Sim {
    app: Arc<AppState>,
    url: String,
    cluster: Option<cluster::Cluster>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

/// Namespaces every cluster has.
const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

impl Sim {
    pub async fn start(cfg: SimConfig) -> anyhow::Result<Sim> {
        install_crypto_provider();
        let clock = clock::Clock::new(cfg.clock_speed);
        let bind = cfg
            .bind
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding the simulated apiserver to {bind}"))?;
        let addr = listener.local_addr()?;
        let app = Arc::new(AppState {
            store: store::Store::new(cfg.watch_window),
            registry: registry::Registry::with_builtins(),
            hooks: hooks::Hooks::default(),
            clock: clock.clone(),
            bookmark_interval: cfg.bookmark_interval,
            address: addr.to_string(),
        });
        create_system_namespaces(&app)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let router = server::router(app.clone());
        let server = tokio::spawn(async move {
            let serve = axum::serve(listener, router).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "simulated apiserver stopped");
            }
        });
        let mut sim = Sim {
            app,
            url: format!("http://{addr}"),
            cluster: None,
            stop: Some(stop),
            server: Some(server),
        };
        let mut cluster_cfg = cfg.cluster.clone();
        cluster_cfg.nodes = cfg.nodes.clone();
        let cluster = cluster::Cluster::start(sim.internal_client()?, cluster_cfg, clock).await?;
        sim.cluster = Some(cluster);
        Ok(sim)
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// A client configuration with the plain-HTTP cluster URL and no credentials.
    pub fn client_config(&self) -> kube::Config {
        // The URL is built from a SocketAddr, so it always parses.
        let uri: http::Uri = self.url.parse().unwrap_or_default();
        kube::Config::new(uri)
    }

    pub async fn client(&self) -> kube::Client {
        // A plain-HTTP config without TLS or auth cannot fail to build.
        kube::Client::try_from(self.client_config()).expect("plain-HTTP kube client")
    }

    /// The client of the simulator's own behaviours: marked so it is neither counted nor
    /// faulted.
    fn internal_client(&self) -> anyhow::Result<kube::Client> {
        let mut config = self.client_config();
        config.headers.push((
            http::HeaderName::from_static(INTERNAL_HEADER),
            http::HeaderValue::from_static("cluster"),
        ));
        Ok(kube::Client::try_from(config)?)
    }

    /// A kubeconfig for `kubectl --kubeconfig`.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: questdb-sim\n  cluster:\n    server: {}\ncontexts:\n- name: questdb-sim\n  context:\n    cluster: questdb-sim\n    user: questdb-sim\n    namespace: default\ncurrent-context: questdb-sim\nusers:\n- name: questdb-sim\n  user: {{}}\n",
            self.url
        )
    }

    pub fn cluster(&self) -> &cluster::Cluster {
        // Set in `start` before the Sim is handed out and only taken by `shutdown(self)`.
        self.cluster
            .as_ref()
            .expect("cluster runs while the Sim exists")
    }

    pub fn clock(&self) -> &clock::Clock {
        &self.app.clock
    }

    pub fn inject_fault(&self, f: Fault) -> FaultId {
        self.app.hooks.inject(f)
    }

    pub fn remove_fault(&self, id: FaultId) {
        self.app.hooks.remove(id)
    }

    pub fn clear_faults(&self) {
        self.app.hooks.clear()
    }

    /// Ends every open watch stream; clients see a normal end of stream and re-watch.
    pub fn cut_watches(&self) {
        self.app.hooks.cut()
    }

    /// Expires every watch's resume point (an etcd compaction) and ends every open watch, so
    /// watchers relist instead of resuming: a full resync of every informer. `cut_watches`
    /// alone lets them resume without a relist, as after a normal watch timeout.
    pub fn expire_watches(&self) {
        self.app.store.write().compact_all();
        self.app.hooks.cut();
    }

    pub fn request_counts(&self) -> RequestCounts {
        self.app.hooks.counts()
    }

    pub fn reset_request_counts(&self) {
        self.app.hooks.reset_counts()
    }

    /// The global resourceVersion (the last write).
    pub fn resource_version(&self) -> u64 {
        self.app.store.read().current_rv()
    }

    pub async fn shutdown(mut self) {
        if let Some(cluster) = self.cluster.take() {
            cluster.shutdown().await;
        }
        self.app.hooks.cut();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut server) = self.server.take() {
            if tokio::time::timeout(Duration::from_secs(5), &mut server)
                .await
                .is_err()
            {
                server.abort();
            }
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// kube's client builds a TLS connector even for `http://` clusters, and rustls refuses to pick
/// a crypto provider when a build links two (kube's ring and the AWS SDK's aws-lc-rs are both
/// present when the whole workspace is built). Losing a race to another installer is fine.
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

fn create_system_namespaces(app: &AppState) -> anyhow::Result<()> {
    let rt = app
        .registry
        .lookup("", "v1", "namespaces")
        .context("namespaces are a built-in resource")?;
    let mut store = app.store.write();
    let mut cx = ops::Ctx {
        store: &mut store,
        registry: &app.registry,
        clock: &app.clock,
    };
    for ns in SYSTEM_NAMESPACES {
        let obj = serde_json::json!({"metadata": {"name": ns}});
        ops::create(&mut cx, &rt, "", obj, &ops::WriteOpts::default())
            .map_err(|e| anyhow::anyhow!("creating namespace {ns}: {e}"))?;
    }
    Ok(())
}

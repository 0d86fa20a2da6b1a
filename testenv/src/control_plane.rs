//! Starts etcd → kube-apiserver → kube-controller-manager → kube-scheduler on loopback in a
//! temporary directory, the CSI snapshot-controller with its CRDs, then the fake CSI driver and
//! kubelets, and a proxy for clients.
//! Everything stops when the [`ControlPlane`] is dropped (also when a test panics, in which case
//! the tail of every component's log is printed).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::database::{self, DatabaseExit, DatabaseProcess, Databases};
use crate::kubelet::{Kubelets, NodeHandle, NodeRegistration};
use crate::process::{free_port, ready_on_a_free_port, tail, Component};
use crate::proxy::{ApiProxy, Fault, FaultId, RequestCounts};
use crate::{binaries, csi, rbac, timings};

/// The controllers kube-controller-manager runs: what a StatefulSet with a volume needs to live,
/// move and die on real semantics. Names: cmd/kube-controller-manager/names/controller_names.go.
pub const CONTROLLERS: &[&str] = &[
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "statefulset-controller",
    "disruption-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-attach-detach-controller",
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    "root-ca-certificate-publisher-controller",
];

pub const REGION: &str = "sim-region-1";

#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// Nodes joined at start (shared workers for pods without a dedicated node).
    pub nodes: Vec<NodeRegistration>,
    /// The RBAC the operator's token is bound by.
    pub rbac: rbac::Install,
    /// Whether database pods run a real QuestDB ([`Databases::Real`], needs Java) or are only
    /// reported running ([`Databases::Fake`], the default).
    pub databases: Databases,
    /// The attach-detach controller's longest wait for a volume to be unmounted from a node
    /// before it detaches it anyway (`--attach-detach-max-wait-for-unmount`, a flag of
    /// hack/control-plane's kube-controller-manager wrapper); `None`: upstream's 6 minutes.
    /// Upstream's own integration tests shorten it the same way.
    pub attach_detach_max_wait_for_unmount: Option<Duration>,
    /// Start without the CSI snapshot-controller while its first build is still under way, and
    /// add it (its CRDs, the VolumeSnapshotClass, the controller) once the build ends: a
    /// newcomer's first sandbox is Ready without waiting for a build only backups need. When
    /// it is built already it starts with the rest, as always.
    pub snapshot_controller_when_built: bool,
}

impl ControlPlaneOptions {
    /// Three worker nodes in two zones, as the sandbox and most tests want.
    pub fn sandbox() -> Self {
        Self {
            nodes: vec![
                NodeRegistration::worker("worker-a1", "sim-zone-a"),
                NodeRegistration::worker("worker-a2", "sim-zone-a"),
                NodeRegistration::worker("worker-b1", "sim-zone-b"),
            ],
            rbac: rbac::Install::ClusterWide,
            databases: Databases::Fake,
            attach_detach_max_wait_for_unmount: None,
            snapshot_controller_when_built: false,
        }
    }

    /// No node at all.
    pub fn empty() -> Self {
        Self {
            nodes: vec![],
            rbac: rbac::Install::ClusterWide,
            databases: Databases::Fake,
            attach_detach_max_wait_for_unmount: None,
            snapshot_controller_when_built: false,
        }
    }

    /// The same, with the attach-detach controller's force detach after `wait` instead of 6
    /// minutes.
    pub fn with_force_detach_after(self, wait: Duration) -> Self {
        Self {
            attach_detach_max_wait_for_unmount: Some(wait),
            ..self
        }
    }

    /// The same, with database pods running a real QuestDB.
    pub fn with_real_databases(self) -> Self {
        Self {
            databases: Databases::Real,
            ..self
        }
    }
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self::sandbox()
    }
}

pub struct ControlPlane {
    // Field order is drop order: agents, then the proxy, then the processes (snapshot-controller
    // first, etcd last), then the directory.
    stop: CancellationToken,
    kubelets: Kubelets,
    databases: Option<Arc<database::Runtime>>,
    proxy: ApiProxy,
    /// `None` until it runs: started later when its build was still under way
    /// ([`ControlPlaneOptions::snapshot_controller_when_built`]).
    snapshot_controller: Arc<std::sync::Mutex<Option<Component>>>,
    scheduler: Component,
    controller_manager: Component,
    apiserver: Component,
    etcd: Component,
    admin_token: String,
    operator_token: String,
    apiserver_url: String,
    admin: Client,
    dir: tempfile::TempDir,
    /// The CSI attacher's and snapshotter's switches (fail or stall attachments, snapshots).
    pub csi: Arc<csi::Switches>,
    snapshots: Arc<csi::Snapshots>,
    kubelet_ca: Arc<crate::kubelet_api::KubeletCa>,
    pub started_in: Duration,
}

/// A kubeconfig for `server`. An `https` server (a component's own port) is trusted through
/// the certificate file it generated, `ca_pem` (its self-signed CA is in it), never by skipping
/// verification; the proxy every client uses speaks plain HTTP on loopback.
fn kubeconfig_yaml(server: &str, token: &str, ca_pem: Option<&[u8]>) -> String {
    use base64::Engine as _;
    let trust = ca_pem
        .map(|pem| {
            format!(
                "    certificate-authority-data: {}\n",
                base64::engine::general_purpose::STANDARD.encode(pem)
            )
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: questdb-testenv\n  cluster:\n    server: {server}\n{trust}users:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: questdb-testenv\n  context: {{cluster: questdb-testenv, user: user, namespace: default}}\ncurrent-context: questdb-testenv\n"
    )
}

async fn config_from(yaml: &str) -> anyhow::Result<Config> {
    let kc = Kubeconfig::from_yaml(yaml)?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.read_timeout = None;
    Ok(config)
}

fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for _ in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(Instant::now().elapsed().as_nanos());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// GET `path` from a loopback HTTPS endpoint whose self-signed certificate (and its CA) the
/// component wrote to `cert`, and report a 200 with `ok`. TLS by hand, verified against that
/// file: a component still starting answers 500, which kube's client would log as an ERROR.
async fn https_ok(url: &str, token: Option<&str>, path: &str, cert: &std::path::Path) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(2), https_get(url, token, path, cert)).await,
        Ok(Ok((200, body))) if body.trim() == "ok"
    )
}

async fn https_get(
    url: &str,
    token: Option<&str>,
    path: &str,
    cert: &std::path::Path,
) -> anyhow::Result<(u16, String)> {
    use rustls_pki_types::pem::PemObject as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = url.trim_start_matches("https://");
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls_pki_types::CertificateDer::pem_file_iter(cert)? {
        roots.add(der?)?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_string();
    let name = rustls_pki_types::ServerName::try_from(host.clone())?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    // A peer that closes without close_notify is fine here: the body is complete by then.
    let _ = tls.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    // Chunked or not, a health body is the single word `ok`.
    let body = body
        .lines()
        .find(|l| l.trim() == "ok")
        .unwrap_or(body)
        .to_string();
    Ok((status, body))
}

/// GET `http://addr/health` from etcd and report it healthy.
async fn etcd_healthy(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(Ok(mut s)) = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    else {
        return false;
    };
    let req = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), s.read_to_string(&mut buf)).await;
    buf.contains("\"health\":\"true\"")
}

/// The VolumeSnapshot CRDs, the VolumeSnapshotClass and the CSI snapshot-controller from
/// `snapshot_bin`. No readiness to wait for: it serves no port, and its informers catch up
/// with whatever a test creates before they sync.
async fn start_snapshot_controller(
    admin: &Client,
    snapshot_bin: &std::path::Path,
    admin_kubeconfig: &std::path::Path,
    dir: &std::path::Path,
) -> anyhow::Result<Component> {
    csi::apply_snapshot_crds(admin, snapshot_bin)
        .await
        .context("applying the VolumeSnapshot CRDs")?;
    csi::install_snapshot_class(admin, Duration::from_secs(30))
        .await
        .context("installing the VolumeSnapshotClass")?;
    Component::spawn(
        "snapshot-controller",
        &snapshot_bin.join("snapshot-controller"),
        &[
            format!("--kubeconfig={}", admin_kubeconfig.display()),
            "--leader-election=false".into(),
            // The group-snapshot CRDs are not installed: without this it waits for them for
            // --retry-crd-interval-max (30 s) before starting.
            "--feature-gates=CSIVolumeGroupSnapshot=false".into(),
            "--v=2".into(),
        ],
        dir,
    )
}

impl ControlPlane {
    pub async fn start(opts: ControlPlaneOptions) -> anyhow::Result<ControlPlane> {
        // kube uses ring; a workspace build also links aws-lc-rs (the AWS SDK), so rustls
        // cannot pick one by itself. Whoever installed one first wins.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let started = Instant::now();
        if opts.databases == Databases::Real && !database::java_available() {
            bail!("{}", database::NEEDS_JAVA);
        }
        let bin = binaries::dir()?;
        let snapshot_bin = if opts.snapshot_controller_when_built {
            binaries::snapshot_dir_if_built()
        } else {
            Some(binaries::snapshot_dir()?)
        };
        let dir = tempfile::Builder::new()
            .prefix("qdb-control-plane-")
            .tempdir()
            .context("creating the control plane's temporary directory")?;
        let d = dir.path();

        let sa_key = d.join("sa.key");
        let out = std::process::Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&sa_key)
            .arg("2048")
            .output()
            .context("control plane: running openssl to make the service-account key")?;
        if !out.status.success() {
            bail!(
                "control plane: openssl genrsa failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let admin_token = random_token();
        let operator_token = random_token();
        let (op_user, op_groups) = rbac::operator_user();
        std::fs::write(
            d.join("tokens.csv"),
            format!(
                "{admin_token},admin,admin-uid,\"system:masters\"\n{operator_token},{op_user},operator-uid,\"{}\"\n",
                op_groups.join(",")
            ),
        )?;

        // Each component is started again on other ports if one was taken between
        // free_port releasing it and the component binding it (as the controller-manager
        // and scheduler are below): seen when several control planes start at once.
        let spawn_etcd = |port: u16| {
            let peer_port = free_port()?;
            // A start that failed on a taken port may have begun a member with other URLs.
            let _ = std::fs::remove_dir_all(d.join("etcd"));
            Component::spawn(
                "etcd",
                &bin.join("etcd"),
                &[
                    "--name=default".into(),
                    format!("--data-dir={}", d.join("etcd").display()),
                    format!("--listen-client-urls=http://127.0.0.1:{port}"),
                    format!("--advertise-client-urls=http://127.0.0.1:{port}"),
                    format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                    format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                    format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                    "--unsafe-no-fsync=true".into(),
                    "--log-level=warn".into(),
                ],
                d,
            )
        };
        let etcd_port = free_port()?;
        let (etcd, etcd_port) = ready_on_a_free_port(
            spawn_etcd(etcd_port)?,
            etcd_port,
            Duration::from_secs(30),
            spawn_etcd,
            etcd_healthy,
        )
        .await?;

        let api_args = |port: u16| {
            let mut args = vec![
                format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", d.join("certs").display()),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", sa_key.display()),
                format!("--service-account-signing-key-file={}", sa_key.display()),
                "--authorization-mode=Node,RBAC".into(),
                format!("--token-auth-file={}", d.join("tokens.csv").display()),
                "--allow-privileged=true".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                "--endpoint-reconciler-type=none".into(),
                "--v=1".into(),
            ];
            args.extend(timings::apiserver_flags());
            args
        };
        let spawn_apiserver = |port: u16| {
            Component::spawn(
                "kube-apiserver",
                &bin.join("kube-apiserver"),
                &api_args(port),
                d,
            )
        };
        let api_cert = d.join("certs").join("apiserver.crt");
        let api_port = free_port()?;
        let (apiserver, api_port) = ready_on_a_free_port(
            spawn_apiserver(api_port)?,
            api_port,
            Duration::from_secs(90),
            spawn_apiserver,
            |port| {
                let (tok, cert) = (admin_token.clone(), api_cert.clone());
                async move {
                    let url = format!("https://127.0.0.1:{port}");
                    https_ok(&url, Some(&tok), "/readyz", &cert).await
                }
            },
        )
        .await?;
        let apiserver_url = format!("https://127.0.0.1:{api_port}");
        let api_ca = std::fs::read(&api_cert).context("reading the apiserver's certificate")?;
        let admin_yaml = kubeconfig_yaml(&apiserver_url, &admin_token, Some(&api_ca));
        let admin_kubeconfig = d.join("admin.kubeconfig");
        std::fs::write(&admin_kubeconfig, &admin_yaml)?;
        let admin = Client::try_from(config_from(&admin_yaml).await?)?;

        let kcm_args = |port: u16| {
            let mut args = vec![
                format!("--kubeconfig={}", admin_kubeconfig.display()),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", d.join("kcm-certs").display()),
                format!("--service-account-private-key-file={}", sa_key.display()),
                format!("--controllers={}", CONTROLLERS.join(",")),
                "--v=1".into(),
            ];
            args.extend(timings::controller_manager_flags());
            if let Some(wait) = opts.attach_detach_max_wait_for_unmount {
                args.push(format!(
                    "--attach-detach-max-wait-for-unmount={}ms",
                    wait.as_millis()
                ));
            }
            args
        };
        let spawn_kcm = |port: u16| {
            Component::spawn(
                "kube-controller-manager",
                &bin.join("kube-controller-manager"),
                &kcm_args(port),
                d,
            )
        };
        let kcm_port = free_port()?;
        let controller_manager = spawn_kcm(kcm_port)?;
        let spawn_scheduler = |port: u16| {
            Component::spawn(
                "kube-scheduler",
                &bin.join("kube-scheduler"),
                &[
                    format!("--kubeconfig={}", admin_kubeconfig.display()),
                    "--leader-elect=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={port}"),
                    format!("--cert-dir={}", d.join("scheduler-certs").display()),
                    "--v=1".into(),
                ],
                d,
            )
        };
        let sched_port = free_port()?;
        let scheduler = spawn_scheduler(sched_port)?;
        // While the controllers start (Established by the time they are ready).
        if let Some(snapshot_bin) = &snapshot_bin {
            csi::apply_snapshot_crds(&admin, snapshot_bin)
                .await
                .context("applying the VolumeSnapshot CRDs")?;
        }
        let (mut controller_manager, _) = ready_on_a_free_port(
            controller_manager,
            kcm_port,
            Duration::from_secs(60),
            spawn_kcm,
            |port| {
                let url = format!("https://127.0.0.1:{port}");
                let cert = d.join("kcm-certs").join("kube-controller-manager.crt");
                async move { https_ok(&url, None, "/healthz", &cert).await }
            },
        )
        .await?;
        let (scheduler, _) = ready_on_a_free_port(
            scheduler,
            sched_port,
            Duration::from_secs(60),
            spawn_scheduler,
            |port| {
                let url = format!("https://127.0.0.1:{port}");
                let cert = d.join("scheduler-certs").join("kube-scheduler.crt");
                async move { https_ok(&url, None, "/healthz", &cert).await }
            },
        )
        .await?;
        let stop = CancellationToken::new();
        // A start that fails from here on stops what it started in the background.
        let stop_on_error = stop.clone().drop_guard();
        let snapshot_controller = Arc::new(std::sync::Mutex::new(None));
        match &snapshot_bin {
            Some(snapshot_bin) => {
                let started =
                    start_snapshot_controller(&admin, snapshot_bin, &admin_kubeconfig, d).await?;
                *snapshot_controller.lock().unwrap() = Some(started);
            }
            None => {
                info!("the CSI snapshot-controller is still being built: the control plane starts without it, and backups wait until it runs");
                let (admin, kubeconfig, dir) =
                    (admin.clone(), admin_kubeconfig.clone(), d.to_path_buf());
                let (slot, stop) = (snapshot_controller.clone(), stop.clone());
                tokio::spawn(async move {
                    let built = tokio::select! {
                        _ = stop.cancelled() => return,
                        b = tokio::task::spawn_blocking(binaries::snapshot_dir) => b,
                    };
                    let snapshot_bin = match built {
                        Ok(Ok(dir)) => dir,
                        Ok(Err(e)) => {
                            return warn!(error = %format!("{e:#}"), "the CSI snapshot-controller could not be built: backups stay unavailable")
                        }
                        Err(e) => return warn!(error = %e, "building the CSI snapshot-controller"),
                    };
                    if stop.is_cancelled() {
                        return;
                    }
                    match start_snapshot_controller(&admin, &snapshot_bin, &kubeconfig, &dir).await
                    {
                        Ok(c) => {
                            info!("the CSI snapshot-controller is built and running: backups can be taken");
                            *slot.lock().unwrap() = Some(c);
                        }
                        Err(e) => {
                            warn!(error = %format!("{e:#}"), "starting the CSI snapshot-controller")
                        }
                    }
                });
            }
        }
        // The serviceaccount controller is running once `default` has its ServiceAccount;
        // pods cannot be admitted before.
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
        controller_manager
            .wait_ready(Duration::from_secs(60), || {
                let sas = sas.clone();
                async move { sas.get_opt("default").await.ok().flatten().is_some() }
            })
            .await?;

        rbac::install(&admin, opts.rbac)
            .await
            .context("installing deploy/'s RBAC")?;
        let databases = match opts.databases {
            Databases::Real => Some(
                database::Runtime::new(d, admin.clone(), stop.clone())
                    .context("creating the databases' directories")?,
            ),
            Databases::Fake => None,
        };
        let switches = Arc::new(csi::Switches::default());
        let snapshots = csi::Snapshots::new(databases.as_ref().map(|_| d.join("snapshots")))?;
        csi::install(&admin)
            .await
            .context("installing the CSI driver objects")?;
        csi::spawn(
            admin.clone(),
            switches.clone(),
            stop.clone(),
            databases.clone(),
            snapshots.clone(),
        );
        let kubelet_ca =
            Arc::new(crate::kubelet_api::KubeletCa::generate().context("making the kubelets' CA")?);
        let kubelets = Kubelets::start(
            admin.clone(),
            stop.clone(),
            databases.clone(),
            switches.clone(),
            kubelet_ca.clone(),
        );
        for node in opts.nodes {
            kubelets.join(node).await?;
        }

        let mut upstream =
            config_from(&kubeconfig_yaml(&apiserver_url, "unused", Some(&api_ca))).await?;
        upstream.auth_info = Default::default();
        upstream.default_retry = false;
        let proxy = ApiProxy::start(Client::try_from(upstream)?, &admin_token).await?;

        let started_in = started.elapsed();
        eprintln!(
            "control plane: kube-apiserver {} ready in {:.1}s ({})",
            apiserver_url,
            started_in.as_secs_f64(),
            d.display()
        );
        stop_on_error.disarm();
        Ok(ControlPlane {
            stop,
            kubelets,
            databases,
            proxy,
            snapshot_controller,
            scheduler,
            controller_manager,
            apiserver,
            etcd,
            admin_token,
            operator_token,
            apiserver_url,
            admin,
            dir,
            csi: switches,
            snapshots,
            kubelet_ca,
            started_in,
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA (PEM) a client verifies the kubelets' serving certificates with: each node's
    /// kubelet serves its API (`GET /stats/summary`) on `https://<InternalIP>:10250` with a
    /// certificate for its address signed by it, as on EKS the kubelets' serving certificates
    /// are signed by the cluster's CA (see [`crate::kubelet_api`]).
    pub fn kubelet_ca_pem(&self) -> String {
        self.kubelet_ca.pem().to_string()
    }

    /// The kube-apiserver's own URL (clients of tests should use the proxy's).
    pub fn apiserver_url(&self) -> &str {
        &self.apiserver_url
    }

    /// A kubeconfig with cluster-admin rights through the proxy (for kubectl and tests).
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&self.proxy.url(), &self.admin_token, None)
    }

    /// A kubeconfig for the operator: through the proxy, under `deploy/`'s RBAC.
    pub fn operator_kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&self.proxy.url(), &self.operator_token, None)
    }

    pub async fn client_config(&self) -> Config {
        config_from(&self.kubeconfig_yaml())
            .await
            .expect("admin config")
    }

    pub async fn operator_config(&self) -> Config {
        config_from(&self.operator_kubeconfig_yaml())
            .await
            .expect("operator config")
    }

    /// A cluster-admin client through the proxy.
    pub async fn client(&self) -> Client {
        Client::try_from(self.client_config().await).expect("admin client")
    }

    /// A cluster-admin client straight to the apiserver (not counted, never faulted).
    pub fn direct_client(&self) -> Client {
        self.admin.clone()
    }

    pub fn request_counts(&self) -> RequestCounts {
        self.proxy.request_counts()
    }

    pub fn reset_request_counts(&self) {
        self.proxy.reset_request_counts()
    }

    pub fn inject_fault(&self, fault: Fault) -> FaultId {
        self.proxy.inject_fault(fault)
    }

    pub fn remove_fault(&self, id: FaultId) {
        self.proxy.remove_fault(id)
    }

    pub fn clear_faults(&self) {
        self.proxy.clear_faults()
    }

    pub fn cut_watches(&self) {
        self.proxy.cut_watches()
    }

    pub fn expire_watches(&self) {
        self.proxy.expire_watches()
    }

    /// Registers a Node the way a kubelet would and keeps it alive.
    pub async fn join_node(&self, node: NodeRegistration) -> anyhow::Result<NodeHandle> {
        self.kubelets.join(node).await
    }

    pub fn node(&self, name: &str) -> Option<NodeHandle> {
        self.kubelets.get(name)
    }

    pub fn kubelets(&self) -> &Kubelets {
        &self.kubelets
    }

    /// Whether database pods run a real QuestDB.
    pub fn databases(&self) -> Databases {
        if self.databases.is_some() {
            Databases::Real
        } else {
            Databases::Fake
        }
    }

    /// The end of the QuestDB log of pod `namespace/name` (its current and previous
    /// container), for test failure messages; a line saying so when databases are fake.
    pub fn database_log(&self, namespace: &str, name: &str) -> String {
        match &self.databases {
            Some(db) => db.log_tail(namespace, name, 40),
            None => format!("(pod {namespace}/{name}: databases are fake, no log)"),
        }
    }

    /// The lines of the database pod's whole log (every start) that contain `needle`.
    pub fn database_log_lines(&self, namespace: &str, name: &str, needle: &str) -> Vec<String> {
        match &self.databases {
            Some(db) => db
                .log_tail(namespace, name, usize::MAX)
                .lines()
                .filter(|l| l.contains(needle))
                .map(str::to_string)
                .collect(),
            None => Vec::new(),
        }
    }

    /// Every start of a QuestDB on a directory another live QuestDB held (pods, nodes,
    /// directory, time). Empty when databases are fake.
    pub fn two_writer_violations(&self) -> Vec<String> {
        self.databases
            .as_ref()
            .map(|db| db.two_writer_violations())
            .unwrap_or_default()
    }

    /// Panics, listing them, if two QuestDBs ever ran on one volume.
    pub fn assert_no_two_writers(&self) {
        let v = self.two_writer_violations();
        assert!(
            v.is_empty(),
            "two QuestDB processes ran on one volume:\n{}",
            v.join("\n")
        );
    }

    /// The QuestDB processes running now.
    pub fn database_processes(&self) -> Vec<DatabaseProcess> {
        self.databases
            .as_ref()
            .map(|db| db.processes())
            .unwrap_or_default()
    }

    /// The QuestDB processes that ended, in order, with how they ended.
    pub fn database_exits(&self) -> Vec<DatabaseExit> {
        self.databases
            .as_ref()
            .map(|db| db.exits())
            .unwrap_or_default()
    }

    /// The directory that holds the data of the volume with CSI handle `handle`.
    pub fn volume_dir(&self, handle: &str) -> Option<PathBuf> {
        self.databases.as_ref().map(|db| db.volume_dir(handle))
    }

    /// The snapshots the fake EBS holds now (made by CreateSnapshot, gone at DeleteSnapshot),
    /// in handle order: one per VolumeSnapshot taken and not deleted.
    pub fn ebs_snapshots(&self) -> Vec<csi::EbsSnapshot> {
        self.snapshots.list()
    }

    /// Process ids, for the benchmarks' memory figures.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        let mut pids: Vec<(&'static str, u32)> = [
            &self.etcd,
            &self.apiserver,
            &self.controller_manager,
            &self.scheduler,
        ]
        .iter()
        .map(|c| (c.name, c.pid()))
        .collect();
        if let Some(c) = self.snapshot_controller.lock().unwrap().as_ref() {
            pids.push((c.name, c.pid()));
        }
        pids
    }

    /// Fails when a component has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        let mut snapshot_controller = self.snapshot_controller.lock().unwrap();
        for c in [
            Some(&mut self.etcd),
            Some(&mut self.apiserver),
            Some(&mut self.controller_manager),
            Some(&mut self.scheduler),
            snapshot_controller.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            if !c.is_running() {
                bail!(
                    "{} exited; log {}:\n{}",
                    c.name,
                    c.log.display(),
                    tail(&c.log, 15)
                );
            }
        }
        Ok(())
    }

    fn logs(&self) -> Vec<(&'static str, PathBuf)> {
        let mut logs: Vec<(&'static str, PathBuf)> = [
            &self.etcd,
            &self.apiserver,
            &self.controller_manager,
            &self.scheduler,
        ]
        .iter()
        .map(|c| (c.name, c.log.clone()))
        .collect();
        if let Some(c) = self.snapshot_controller.lock().unwrap().as_ref() {
            logs.push((c.name, c.log.clone()));
        }
        logs
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(db) = &self.databases {
            // Before the directory goes: nothing may write into it, and nothing may outlive
            // the test.
            if std::thread::panicking() {
                let mut pods: Vec<(String, String)> = db
                    .processes()
                    .into_iter()
                    .map(|p| (p.namespace, p.pod))
                    .chain(db.exits().into_iter().map(|e| (e.namespace, e.pod)))
                    .collect();
                pods.sort();
                pods.dedup();
                for (ns, pod) in pods {
                    eprintln!(
                        "---- QuestDB of pod {ns}/{pod} ----\n{}",
                        db.log_tail(&ns, &pod, 12)
                    );
                }
            }
            db.kill_all();
            // Then what the machine holds for it: the sized volumes' mounts and loop devices.
            db.detach_disks();
        }
        if std::thread::panicking() {
            for (name, log) in self.logs() {
                eprintln!(
                    "---- {name} (last lines of {}) ----\n{}",
                    log.display(),
                    tail(&log, 12)
                );
            }
        }
        if std::env::var_os("QDB_KEEP_CONTROL_PLANE").is_some() {
            let kept = std::mem::replace(
                &mut self.dir,
                tempfile::Builder::new().tempdir().expect("tempdir"),
            );
            eprintln!("control plane: kept {}", kept.keep().display());
        }
    }
}

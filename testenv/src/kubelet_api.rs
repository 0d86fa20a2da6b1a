//! The kubelet's own HTTPS API, as each stand-in kubelet serves it on `<node InternalIP>:10250`
//! (the Node's `status.daemonEndpoints.kubeletEndpoint.Port`) while its kubelet runs: only the
//! Summary API, `GET /stats/summary`, with the volume figures an operator reads to grow a disk
//! before it fills.
//!
//! As a kubelet started with `--authentication-token-webhook --authorization-mode=Webhook`
//! and `--anonymous-auth=false` (as EKS runs it) answers (kubernetes.io/docs/reference/
//! access-authn-authz/kubelet-authn-authz/; pkg/kubelet/server/server.go `InstallAuthFilter`,
//! pkg/kubelet/server/auth.go `GetRequestAttributes`): the bearer token is checked with a
//! TokenReview (no token, or one the apiserver does not authenticate: 401 `Unauthorized`),
//! then the user is checked with a SubjectAccessReview for verb `get` (the HTTP method's) on
//! `nodes/stats` named after the node (denied: 403 `Forbidden (user=<user>, verb=get,
//! resource=nodes, subresource=stats)`; a review that fails: 500 `Authorization error (...)`).
//! Nothing is cached (a kubelet caches allowed decisions 5 minutes, authentications 2), so a
//! revoked grant is refused at once. An unknown path is 404 before any check, as go-restful
//! routes first.
//!
//! The body is the Summary of k8s.io/kubelet/pkg/apis/stats/v1alpha1 (`node`: name and start
//! time; `pods`: one entry per database pod whose claims are mounted on the node, restarts and
//! crash loops included, each with one `volume` entry per PersistentVolumeClaim volume). A
//! volume's figures are `statvfs` of the directory the pod's process sees, as the EBS CSI
//! driver's NodeGetVolumeStats reports them from statfs: capacity `f_blocks * f_frsize`,
//! available `f_bavail * f_frsize`, used `(f_blocks - f_bfree) * f_frsize`, inodes `f_files`,
//! free `f_ffree`, used the difference. A claim of [`crate::csi::SIZED_STORAGE_CLASS`] has a
//! file system of its own; any other claim's directory is on the host's file system, and so are
//! its figures.
//!
//! TLS: the serving certificate names the node's address (an IP SAN) and its name, and is
//! signed by one CA per control plane ([`KubeletCa`], `ControlPlane::kubelet_ca_pem`), as on
//! EKS the kubelets' serving certificates are signed by the cluster's CA.
//!
//! Faults: a node powered off or partitioned answers nothing (connections are accepted by the
//! kernel and never answered, as a silent address's time out); a stopped kubelet's port is
//! closed (refused); a kubelet cut off from the API server cannot review a token, so it
//! answers 401 (nothing is cached); a NotReady or shutting-down node answers.
//!
//! Deviations: figures are read at each request (a kubelet refreshes a volume's every minute,
//! `--volume-stats-agg-period`, so a real figure may be a minute old); behind a node's lossy
//! layer (`database::VolumeLayer::Lossy`) pages written but not yet written back (up to 30 s)
//! are not counted, space allocated (`fallocate`, as QuestDB does) is; only PersistentVolumeClaim
//! volumes are listed (a kubelet also lists ConfigMap, Secret and emptyDir volumes, without
//! `pvcRef`); no container, CPU, memory, network or node file system figures; with fake
//! databases no pod is listed; no client-certificate authentication; a node whose InternalIP
//! is not an address of this machine serves nothing.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::database::{MountedPod, Runtime};
use crate::kubelet::Fault;

/// The kubelet's port (`--port`, and the Node's `daemonEndpoints.kubeletEndpoint.Port`).
pub const KUBELET_PORT: u16 = 10250;

/// The CA that signs every stand-in kubelet's serving certificate.
pub struct KubeletCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl KubeletCa {
    /// A new CA (an ECDSA P-256 key, valid for as long as rcgen's defaults say: decades).
    pub fn generate() -> anyhow::Result<KubeletCa> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "questdb-testenv kubelet CA");
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().context("generating the kubelet CA's key")?;
        let cert = params.self_signed(&key).context("signing the kubelet CA")?;
        Ok(KubeletCa {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A TLS configuration serving a certificate for `ip` and `node`, signed by this CA.
    fn serving_config(&self, ip: IpAddr, node: &str) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
        let mut names = vec![ip.to_string()];
        if node.parse::<IpAddr>().is_err() {
            names.push(node.to_string());
        }
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("system:node:{node}"));
        params
            .distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// What one node's API serves from.
pub(crate) struct NodeApi {
    pub name: String,
    /// Its InternalIP: where it listens.
    pub ip: String,
    pub started: SystemTime,
    pub node_index: u32,
    /// An admin client for the reviews (a kubelet's own credentials may create both).
    pub client: Client,
    pub databases: Option<Arc<Runtime>>,
    pub faults: watch::Receiver<Fault>,
    /// Cancelled when the kubelet stops for good: the port closes.
    pub stop: CancellationToken,
}

/// Faults under which nothing outside the node reaches it.
fn silenced(fault: Fault) -> bool {
    matches!(fault, Fault::PowerOff | Fault::Partition)
}

/// Serves the node's API until its kubelet stops.
pub(crate) fn spawn(node: NodeApi, ca: &KubeletCa) {
    let Ok(ip) = node.ip.parse::<IpAddr>() else {
        debug!(node = %node.name, ip = %node.ip, "kubelet API: not an address; not served");
        return;
    };
    let tls = match ca.serving_config(ip, &node.name) {
        Ok(t) => t,
        Err(e) => {
            warn!(node = %node.name, error = %format!("{e:#}"), "kubelet API: no serving certificate; not served");
            return;
        }
    };
    tokio::spawn(serve(
        Arc::new(node),
        SocketAddr::new(ip, KUBELET_PORT),
        tls,
    ));
}

async fn serve(node: Arc<NodeApi>, addr: SocketAddr, tls: Arc<rustls::ServerConfig>) {
    // The node's previous kubelet (a reboot: the same address joins again) may hold the port
    // for a moment after it was told to stop.
    let mut attempts = 0;
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && attempts < 100 => {
                attempts += 1;
                tokio::select! {
                    _ = node.stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
            Err(e) => {
                debug!(node = %node.name, %addr, error = %e, "kubelet API: cannot listen; not served");
                return;
            }
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut faults = node.faults.clone();
    loop {
        if silenced(*faults.borrow_and_update()) {
            // Connections wait in the kernel's backlog, unanswered.
            tokio::select! {
                _ = node.stop.cancelled() => return,
                changed = faults.changed() => if changed.is_err() { return },
            }
            continue;
        }
        let accepted = tokio::select! {
            _ = node.stop.cancelled() => return,
            changed = faults.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            a = listener.accept() => a,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let (node, acceptor) = (node.clone(), acceptor.clone());
        tokio::spawn(async move {
            let faults = node.faults.clone();
            let stop = node.stop.clone();
            let conn = async move {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                else {
                    return;
                };
                let svc = service_fn(move |req| {
                    let node = node.clone();
                    async move { Ok::<_, Infallible>(handle(&node, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            };
            pausable(conn, faults, stop).await;
        });
    }
}

/// Runs `conn`, not polling it while the node is silenced (what it was doing waits, as a
/// request to a partitioned node does), and dropping it when the kubelet stops.
async fn pausable(
    conn: impl std::future::Future<Output = ()>,
    mut faults: watch::Receiver<Fault>,
    stop: CancellationToken,
) {
    let mut conn = std::pin::pin!(conn);
    loop {
        if silenced(*faults.borrow_and_update()) {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = faults.changed() => if changed.is_err() { return },
            }
            continue;
        }
        tokio::select! {
            _ = &mut conn => return,
            _ = stop.cancelled() => return,
            changed = faults.changed() => if changed.is_err() { return },
        }
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn handle(node: &NodeApi, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/stats/summary" {
        return text(StatusCode::NOT_FOUND, "404 page not found\n");
    }
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "405: Method Not Allowed");
    }
    let unauthorized = || text(StatusCode::UNAUTHORIZED, "Unauthorized");
    let token = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return unauthorized();
    };
    if *node.faults.borrow() == Fault::KubeletCutOff {
        // The webhook cannot reach the apiserver: an authentication error, answered 401.
        return unauthorized();
    }
    let user = match authenticate(&node.client, token).await {
        Ok(Some(user)) => user,
        Ok(None) => return unauthorized(),
        Err(e) => {
            debug!(node = %node.name, error = %format!("{e:#}"), "kubelet API: token review failed");
            return unauthorized();
        }
    };
    let username = user.username.clone().unwrap_or_default();
    let attributes = format!("user={username}, verb=get, resource=nodes, subresource=stats");
    match authorize(&node.client, user, &node.name).await {
        Ok(true) => {}
        Ok(false) => return text(StatusCode::FORBIDDEN, format!("Forbidden ({attributes})")),
        Err(e) => {
            debug!(node = %node.name, error = %format!("{e:#}"), "kubelet API: access review failed");
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Authorization error ({attributes})"),
            );
        }
    }
    let summary = summary(node).await;
    let mut r = Response::new(Full::new(Bytes::from(summary.to_string())));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// The webhook token authenticator: the user the apiserver says the token is, if any.
async fn authenticate(client: &Client, token: &str) -> anyhow::Result<Option<UserInfo>> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: None,
        },
        ..Default::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let status = reviewed.status.unwrap_or_default();
    Ok(status
        .authenticated
        .unwrap_or(false)
        .then_some(status.user)
        .flatten())
}

/// The webhook authorizer: may `user` get `nodes/stats` of `node`?
async fn authorize(client: &Client, user: UserInfo, node: &str) -> anyhow::Result<bool> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username,
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            resource_attributes: Some(ResourceAttributes {
                verb: Some("get".into()),
                group: Some(String::new()),
                version: Some("v1".into()),
                resource: Some("nodes".into()),
                subresource: Some("stats".into()),
                name: Some(node.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviewed = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(reviewed.status.is_some_and(|s| s.allowed))
}

fn time(t: SystemTime) -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::try_from(t)
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now()),
    )
}

/// The Summary of the node now.
async fn summary(node: &NodeApi) -> serde_json::Value {
    let pods = node
        .databases
        .as_ref()
        .map(|db| db.mounted_pods(node.node_index))
        .unwrap_or_default();
    let mut out = vec![];
    for pod in pods {
        out.push(pod_stats(pod).await);
    }
    json!({
        "node": {"nodeName": node.name, "startTime": time(node.started)},
        "pods": out,
    })
}

async fn pod_stats(pod: MountedPod) -> serde_json::Value {
    let mut volumes = vec![];
    for claim in &pod.claims {
        let dir = claim.dir.clone();
        // A file system that does not answer (a cut layer) is left out, as a kubelet leaves
        // out a volume whose metrics it could not get.
        let figures = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::task::spawn_blocking(move || statvfs(&dir)),
        )
        .await;
        let Ok(Ok(Ok(fs))) = figures else {
            debug!(pod = %pod.name, volume = %claim.volume, "kubelet API: no figures for a volume");
            continue;
        };
        volumes.push(json!({
            "name": claim.volume,
            "pvcRef": {"name": claim.claim, "namespace": pod.namespace},
            "time": time(SystemTime::now()),
            "capacityBytes": fs.capacity,
            "availableBytes": fs.available,
            "usedBytes": fs.used,
            "inodes": fs.inodes,
            "inodesFree": fs.inodes_free,
            "inodesUsed": fs.inodes.saturating_sub(fs.inodes_free),
        }));
    }
    let mut stats = json!({
        "podRef": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
        "startTime": time(pod.since),
        "containers": [],
    });
    if !volumes.is_empty() {
        stats["volume"] = volumes.into();
    }
    stats
}

struct FsFigures {
    capacity: u64,
    available: u64,
    used: u64,
    inodes: u64,
    inodes_free: u64,
}

fn statvfs(dir: &std::path::Path) -> std::io::Result<FsFigures> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: `st` is written by statvfs(3) before it is read; `path` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    let (blocks, bfree, bavail) = (st.f_blocks as u64, st.f_bfree as u64, st.f_bavail as u64);
    Ok(FsFigures {
        capacity: blocks * frsize,
        available: bavail * frsize,
        used: blocks.saturating_sub(bfree) * frsize,
        inodes: st.f_files as u64,
        inodes_free: st.f_ffree as u64,
    })
}

/// `GET path` from the kubelet API of the node at `ip` (its InternalIP), trusting only
/// `ca_pem` (`ControlPlane::kubelet_ca_pem`), with `token` as the bearer token: the status and
/// the body. For tests; an error when nothing answers within `timeout` (its message says "no
/// answer") or the connection is refused.
pub async fn get(
    ip: &str,
    path: &str,
    token: Option<&str>,
    ca_pem: &str,
    timeout: Duration,
) -> anyhow::Result<(u16, String)> {
    let url = format!("https://{ip}:{KUBELET_PORT}{path}");
    tokio::time::timeout(timeout, request(ip, path, token, ca_pem))
        .await
        .with_context(|| format!("GET {url}: no answer in {timeout:?}"))?
        .with_context(|| format!("GET {url}"))
}

async fn request(
    ip: &str,
    path: &str,
    token: Option<&str>,
    ca_pem: &str,
) -> anyhow::Result<(u16, String)> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(der?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect((ip, KUBELET_PORT)).await?;
    let name = rustls_pki_types::ServerName::try_from(ip.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let mut req = Request::get(path).header(http::header::HOST, format!("{ip}:{KUBELET_PORT}"));
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = sender
        .send_request(req.body(Empty::<Bytes>::new())?)
        .await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A token (TokenRequest, an hour) for a new ServiceAccount `<namespace>/<name>`; with
/// `read_stats`, the account is first granted `get` on `nodes/stats` (a ClusterRole and its
/// binding, both named `<namespace>-<name>`): what may read a kubelet's Summary API.
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    name: &str,
    read_stats: bool,
) -> anyhow::Result<String> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let pp = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    accounts
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    if read_stats {
        let grant = format!("{namespace}-{name}");
        let role: ClusterRole = serde_json::from_value(json!({"metadata": {"name": grant},
            "rules": [{"apiGroups": [""], "resources": ["nodes/stats"], "verbs": ["get"]}]}))?;
        Api::<ClusterRole>::all(client.clone())
            .create(&pp, &role)
            .await?;
        let binding: ClusterRoleBinding = serde_json::from_value(
            json!({"metadata": {"name": grant},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": grant},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}),
        )?;
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&pp, &binding)
            .await?;
    }
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": 3600}}))?;
    let answer = accounts.create_token_request(name, &pp, &request).await?;
    answer
        .status
        .map(|s| s.token)
        .context("a TokenRequest answered without a token")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_trusting_the_ca_completes_a_handshake_with_a_kubelet() {
        let ca = KubeletCa::generate().unwrap();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let server = ca.serving_config(ip, "node-1").unwrap();
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio_rustls::TlsAcceptor::from(server)
                .accept(tcp)
                .await
                .map(drop)
        });
        use rustls_pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        for der in rustls_pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
            roots.add(der.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect((ip, port)).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1".to_string()).unwrap();
        let client = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await;
        let server = accept.await.unwrap();
        assert!(server.is_ok(), "server: {server:?}");
        assert!(client.is_ok(), "client: {:?}", client.err());
    }
}

//! A proxy in front of the real kube-apiserver: every client a test gives to the operator (and
//! to kubectl) goes through it, so requests can be counted by verb and resource, failed,
//! delayed or cut, and watches can be ended or expired, all against the real server. The
//! control plane's own components and the fake kubelets talk to the apiserver directly.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A Kubernetes API verb, as RBAC and audit logs name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Self::Create | Self::Update | Self::Patch | Self::Delete | Self::DeleteCollection
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }
}

/// What one request is about: its verb, resource (`pods`, or `pods/status` for a subresource)
/// and object name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    pub verb: Verb,
    pub resource: String,
    pub name: Option<String>,
    pub namespace: Option<String>,
}

/// Classifies a request as the apiserver's RequestInfoResolver does
/// (k8s.io/apiserver/pkg/endpoints/request/requestinfo.go); `None` for non-resource paths.
pub fn classify(method: &http::Method, uri: &http::Uri) -> Option<RequestInfo> {
    let segs: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let rest = match *segs.first()? {
        "api" if segs.len() >= 3 => &segs[2..],
        "apis" if segs.len() >= 4 => &segs[3..],
        _ => return None,
    };
    let (namespace, rest) = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let resource = match rest.get(2) {
        Some(sub) => format!("{}/{sub}", rest[0]),
        None => rest[0].to_string(),
    };
    let name = rest.get(1).map(|s| s.to_string());
    let watch = uri
        .query()
        .unwrap_or("")
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match *method {
        http::Method::GET if watch => Verb::Watch,
        http::Method::GET if name.is_some() => Verb::Get,
        http::Method::GET => Verb::List,
        http::Method::POST => Verb::Create,
        http::Method::PUT => Verb::Update,
        http::Method::PATCH => Verb::Patch,
        http::Method::DELETE if name.is_some() => Verb::Delete,
        http::Method::DELETE => Verb::DeleteCollection,
        _ => return None,
    };
    Some(RequestInfo {
        verb,
        resource,
        name,
        namespace,
    })
}

/// Requests seen since the last reset, by verb and resource.
#[derive(Clone, Debug, Default)]
pub struct RequestCounts(pub BTreeMap<(Verb, String), u64>);

impl RequestCounts {
    pub fn get(&self, verb: Verb, resource: &str) -> u64 {
        self.0
            .get(&(verb, resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    pub fn writes(&self) -> u64 {
        self.0
            .iter()
            .filter(|((v, _), _)| v.is_write())
            .map(|(_, n)| n)
            .sum()
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
}

#[derive(Clone, Debug)]
enum Action {
    Status(u16),
    Latency(Duration),
    /// The connection is closed without a response.
    Cut,
    /// Forwarded; the answer waits for the test (see [`Fault::hold`]).
    Hold(HoldSink),
    /// Waits for the test before it is forwarded (see [`Fault::hold_before`]).
    HoldBefore(HoldSink),
}

#[derive(Clone)]
struct HoldSink(tokio::sync::mpsc::UnboundedSender<Held>);

impl std::fmt::Debug for HoldSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HoldSink")
    }
}

/// A request held by the proxy. After the apiserver answered ([`Fault::hold`]): the test reads
/// what was written, then [`Held::release`]s the answer, or drops it, and the client never
/// hears back (its connection is cut, as a crash right after the write would leave it). Before
/// it is forwarded ([`Fault::hold_before`]): released, it goes on to the apiserver; dropped,
/// it never reaches it (as a crash right before the write would leave it).
pub struct Held {
    /// The request's body (the object written).
    pub body: Bytes,
    /// The apiserver's answer's status code (0 while the request was not forwarded yet).
    pub status: u16,
    release: tokio::sync::oneshot::Sender<()>,
}

impl Held {
    /// The request's body as `T` (`None` when it is not).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_slice(&self.body).ok()
    }

    /// Lets the answer go to the client.
    pub fn release(self) {
        let _ = self.release.send(());
    }
}

/// A rule that fails, delays or cuts matching requests.
#[derive(Clone, Debug)]
pub struct Fault {
    action: Action,
    verb: Option<Verb>,
    resource: Option<String>,
    name: Option<String>,
    times: Option<usize>,
}

impl Fault {
    /// Answers with this status code and a Kubernetes `Status` body.
    pub fn status(code: u16) -> Self {
        Self::new(Action::Status(code))
    }

    /// Forwards after this delay.
    pub fn latency(d: Duration) -> Self {
        Self::new(Action::Latency(d))
    }

    /// Closes the connection without answering (a network cut).
    pub fn cut() -> Self {
        Self::new(Action::Cut)
    }

    /// Forwards each matching request and holds its answer until the test, which receives it
    /// from the returned channel, releases it: the write is in etcd and its writer still waits.
    /// A test kills the writer at a point of its choosing, right after a write, this way.
    pub fn hold() -> (Self, tokio::sync::mpsc::UnboundedReceiver<Held>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Self::new(Action::Hold(HoldSink(tx))), rx)
    }

    /// Holds each matching request before it is forwarded, until the test, which receives it
    /// from the returned channel, releases it (then it is forwarded) or drops it (then it never
    /// reaches the apiserver). A test kills the writer right before a write this way.
    pub fn hold_before() -> (Self, tokio::sync::mpsc::UnboundedReceiver<Held>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Self::new(Action::HoldBefore(HoldSink(tx))), rx)
    }

    fn new(action: Action) -> Self {
        Self {
            action,
            verb: None,
            resource: None,
            name: None,
            times: None,
        }
    }

    pub fn on(mut self, verb: Verb, resource: &str) -> Self {
        self.verb = Some(verb);
        self.resource = Some(resource.into());
        self
    }

    pub fn on_verb(mut self, verb: Verb) -> Self {
        self.verb = Some(verb);
        self
    }

    pub fn on_resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.into());
        self
    }

    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Only the first `n` matching requests.
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }

    fn matches(&self, info: &RequestInfo) -> bool {
        self.verb.is_none_or(|v| v == info.verb)
            && self.resource.as_ref().is_none_or(|r| *r == info.resource)
            && self
                .name
                .as_ref()
                .is_none_or(|n| info.name.as_ref() == Some(n))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FaultId(u64);

#[derive(Default)]
struct State {
    counts: Mutex<RequestCounts>,
    faults: Mutex<BTreeMap<FaultId, Fault>>,
    next_fault: AtomicU64,
    /// Cancelled (and replaced) to end every open watch.
    watches: Mutex<CancellationToken>,
    /// Watch paths whose next resumption is answered `410 Expired`.
    expired: Mutex<BTreeSet<String>>,
    open_watches: Mutex<BTreeSet<String>>,
    default_auth: Option<http::HeaderValue>,
}

/// The running proxy; stops when dropped.
pub struct ApiProxy {
    addr: SocketAddr,
    state: Arc<State>,
    stop: CancellationToken,
}

impl ApiProxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream` (a client with no
    /// credentials of its own: each request's Authorization header passes through). Requests
    /// without one get `default_token`'s: kubectl (client-go) never sends a bearer token over
    /// plain HTTP, and the proxy is loopback-only.
    pub async fn start(upstream: kube::Client, default_token: &str) -> anyhow::Result<ApiProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            default_auth: Some(format!("Bearer {default_token}").parse()?),
            ..State::default()
        });
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, upstream, state.clone(), stop.clone()));
        Ok(ApiProxy { addr, state, stop })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn request_counts(&self) -> RequestCounts {
        self.state.counts.lock().unwrap().clone()
    }

    pub fn reset_request_counts(&self) {
        *self.state.counts.lock().unwrap() = RequestCounts::default();
    }

    pub fn inject_fault(&self, fault: Fault) -> FaultId {
        let id = FaultId(self.state.next_fault.fetch_add(1, Ordering::Relaxed));
        self.state.faults.lock().unwrap().insert(id, fault);
        id
    }

    pub fn remove_fault(&self, id: FaultId) {
        self.state.faults.lock().unwrap().remove(&id);
    }

    pub fn clear_faults(&self) {
        self.state.faults.lock().unwrap().clear();
    }

    /// Ends every open watch; clients resume from their last resourceVersion.
    pub fn cut_watches(&self) {
        let mut token = self.state.watches.lock().unwrap();
        token.cancel();
        *token = CancellationToken::new();
    }

    /// Ends every open watch and answers each one's resumption with `410 Expired`, as the
    /// apiserver does once etcd compacted past a client's resourceVersion: clients relist.
    pub fn expire_watches(&self) {
        let open = self.state.open_watches.lock().unwrap().clone();
        self.state.expired.lock().unwrap().extend(open);
        self.cut_watches();
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cut_watches();
    }
}

async fn serve(
    listener: TcpListener,
    upstream: kube::Client,
    state: Arc<State>,
    stop: CancellationToken,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => continue,
            },
        };
        let (upstream, state) = (upstream.clone(), state.clone());
        let stop = stop.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(upstream.clone(), state.clone(), req));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

fn full(status: StatusCode, body: String) -> Response<ProxyBody> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .expect("static response")
}

fn status_body(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
    .to_string()
}

fn watch_key(uri: &http::Uri) -> String {
    uri.path().to_string()
}

fn resumes(uri: &http::Uri) -> bool {
    uri.query().unwrap_or("").split('&').any(|kv| {
        kv.strip_prefix("resourceVersion=")
            .is_some_and(|v| !v.is_empty() && v != "0")
    })
}

async fn handle(
    upstream: kube::Client,
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, BoxError> {
    let info = classify(req.method(), req.uri());
    if let Some(info) = &info {
        *state
            .counts
            .lock()
            .unwrap()
            .0
            .entry((info.verb, info.resource.clone()))
            .or_default() += 1;
        let action = {
            let mut faults = state.faults.lock().unwrap();
            let hit = faults
                .iter_mut()
                .find(|(_, f)| f.matches(info) && f.times != Some(0));
            hit.map(|(_, f)| {
                if let Some(n) = f.times.as_mut() {
                    *n -= 1;
                }
                f.action.clone()
            })
        };
        match action {
            Some(Action::Status(code)) => {
                let status =
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let reason = match code {
                    409 => "Conflict",
                    429 => "TooManyRequests",
                    503 => "ServiceUnavailable",
                    _ => "InternalError",
                };
                let mut resp = full(
                    status,
                    status_body(code, reason, "injected by the test proxy"),
                );
                if code == 429 || code == 503 {
                    resp.headers_mut().insert(
                        http::header::RETRY_AFTER,
                        http::HeaderValue::from_static("1"),
                    );
                }
                return Ok(resp);
            }
            Some(Action::Latency(d)) => tokio::time::sleep(d).await,
            Some(Action::Cut) => return Err("connection cut by the test proxy".into()),
            Some(Action::Hold(sink)) => {
                let info = Some(info.clone());
                return forward(upstream, state, info, req, Some(Hold::After(sink))).await;
            }
            Some(Action::HoldBefore(sink)) => {
                let info = Some(info.clone());
                return forward(upstream, state, info, req, Some(Hold::Before(sink))).await;
            }
            None => {}
        }
        if info.verb == Verb::Watch
            && resumes(req.uri())
            && state.expired.lock().unwrap().remove(&watch_key(req.uri()))
        {
            let event = serde_json::json!({
                "type": "ERROR",
                "object": serde_json::from_str::<serde_json::Value>(&status_body(
                    410, "Expired", "too old resource version (expired by the test proxy)"
                )).expect("json"),
            });
            return Ok(full(StatusCode::OK, format!("{event}\n")));
        }
    }
    forward(upstream, state, info, req, None).await
}

/// Where a held request waits for the test.
enum Hold {
    Before(HoldSink),
    After(HoldSink),
}

async fn forward(
    upstream: kube::Client,
    state: Arc<State>,
    info: Option<RequestInfo>,
    req: Request<Incoming>,
    hold: Option<Hold>,
) -> Result<Response<ProxyBody>, BoxError> {
    let (parts, body) = req.into_parts();
    let bytes = body.collect().await?.to_bytes();
    let hold = match hold {
        Some(Hold::Before(HoldSink(sink))) => {
            let (release, released) = tokio::sync::oneshot::channel();
            let held = Held {
                body: bytes.clone(),
                status: 0,
                release,
            };
            if sink.send(held).is_ok() && released.await.is_err() {
                return Err("request held and dropped by the test proxy".into());
            }
            None
        }
        Some(Hold::After(sink)) => Some(sink),
        None => None,
    };
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let mut out = Request::builder().method(parts.method.clone()).uri(&path);
    for (k, v) in parts.headers.iter() {
        if !matches!(
            k.as_str(),
            "host" | "connection" | "transfer-encoding" | "keep-alive" | "upgrade"
        ) {
            out = out.header(k, v);
        }
    }
    if !parts.headers.contains_key(http::header::AUTHORIZATION) {
        if let Some(auth) = &state.default_auth {
            out = out.header(http::header::AUTHORIZATION, auth);
        }
    }
    let request_body = bytes.clone();
    let out = out.body(kube::client::Body::from(bytes))?;
    let resp = match upstream.send(out).await {
        Ok(r) => r,
        Err(e) => {
            return Ok(full(
                StatusCode::BAD_GATEWAY,
                status_body(
                    502,
                    "BadGateway",
                    &format!("test proxy: upstream error: {e}"),
                ),
            ))
        }
    };
    let (mut rparts, rbody) = resp.into_parts();
    rparts.headers.remove(http::header::CONNECTION);
    rparts.headers.remove(http::header::TRANSFER_ENCODING);
    let is_watch = info.as_ref().is_some_and(|i| i.verb == Verb::Watch);
    if let Some(HoldSink(sink)) = hold.filter(|_| !is_watch) {
        let answer = rbody.collect().await?.to_bytes();
        let (release, released) = tokio::sync::oneshot::channel();
        let held = Held {
            body: request_body,
            status: rparts.status.as_u16(),
            release,
        };
        if sink.send(held).is_ok() && released.await.is_err() {
            return Err("answer held and dropped by the test proxy".into());
        }
        let body = Full::new(answer)
            .map_err(|never| match never {})
            .boxed_unsync();
        return Ok(Response::from_parts(rparts, body));
    }
    let body: ProxyBody = if is_watch {
        let cut = state.watches.lock().unwrap().clone();
        let key = watch_key(&parts.uri);
        state.open_watches.lock().unwrap().insert(key.clone());
        let guard = OpenWatch {
            state: state.clone(),
            key,
        };
        let stream = rbody
            .into_data_stream()
            .take_until(cut.cancelled_owned())
            .map(move |r| {
                let _ = &guard;
                r.map(Frame::data).map_err(|e| Box::new(e) as BoxError)
            });
        BodyExt::boxed_unsync(StreamBody::new(stream))
    } else {
        rbody.map_err(|e| Box::new(e) as BoxError).boxed_unsync()
    };
    Ok(Response::from_parts(rparts, body))
}

struct OpenWatch {
    state: Arc<State>,
    key: String,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.state.open_watches.lock().unwrap().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, uri: &str) -> Option<RequestInfo> {
        classify(&method.parse().unwrap(), &uri.parse().unwrap())
    }

    #[test]
    fn classifies_requests_like_the_apiserver() {
        let i = info(
            "GET",
            "/api/v1/namespaces/a/pods?watch=true&resourceVersion=5",
        )
        .unwrap();
        assert_eq!((i.verb, i.resource.as_str()), (Verb::Watch, "pods"));
        let i = info(
            "PUT",
            "/apis/crd.questdb.io/v1beta1/namespaces/a/questdbs/x/status",
        )
        .unwrap();
        assert_eq!(
            (i.verb, i.resource.as_str()),
            (Verb::Update, "questdbs/status")
        );
        assert_eq!(i.name.as_deref(), Some("x"));
        let i = info("GET", "/api/v1/namespaces/a").unwrap();
        assert_eq!((i.verb, i.resource.as_str()), (Verb::Get, "namespaces"));
        let i = info("GET", "/api/v1/nodes").unwrap();
        assert_eq!((i.verb, i.resource.as_str()), (Verb::List, "nodes"));
        let i = info("DELETE", "/api/v1/namespaces/a/configmaps").unwrap();
        assert_eq!(i.verb, Verb::DeleteCollection);
        let i = info("POST", "/api/v1/namespaces/a/pods/p/eviction").unwrap();
        assert_eq!(
            (i.verb, i.resource.as_str()),
            (Verb::Create, "pods/eviction")
        );
        assert!(info("GET", "/version").is_none());
        assert!(info("GET", "/apis").is_none());
    }
}

//! The operator's two small HTTP endpoints: `/metrics` for Prometheus, and `/healthz` + `/readyz`
//! for the kubelet. They run on separate listeners (as controller-runtime does) so a scrape
//! can never slow down a liveness probe.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, TEXT_CONTENT_TYPE};

/// A client that never finishes its request headers must not hold a connection forever.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Back-off after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Whether the operator is ready to serve: set once its caches have synced. Clones share state.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub(crate) fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Parses a controller-runtime style bind address: `:8080` means all interfaces, `0` disables
/// the endpoint (`None`), anything else must be `ip:port` (`[::1]:8080` for IPv6).
pub fn parse_bind_address(s: &str) -> anyhow::Result<Option<SocketAddr>> {
    let s = s.trim();
    if s == "0" {
        return Ok(None);
    }
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .with_context(|| format!("invalid port in bind address {s:?}"))?;
        return Ok(Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port,
        )));
    }
    s.parse().map(Some).with_context(|| {
        format!("invalid bind address {s:?}: expected \"ip:port\", \":port\" or \"0\"")
    })
}

/// Binds a listener; port 0 picks a free port (read it back with `local_addr`).
pub(crate) async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// Serves `GET /metrics` on `addr` until `shutdown` is cancelled.
pub(crate) async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve_metrics_on(bind(addr).await?, metrics, shutdown).await
}

/// Serves `GET /metrics` on an already bound listener until `shutdown` is cancelled.
pub(crate) async fn serve_metrics_on(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve(listener, shutdown, move |request| {
        metrics_response(request, &metrics)
    })
    .await
}

/// Serves `/healthz` and `/readyz` on `addr` until `shutdown` is cancelled.
pub(crate) async fn serve_health(
    addr: SocketAddr,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve_health_on(bind(addr).await?, readiness, shutdown).await
}

/// Serves `/healthz` and `/readyz` on an already bound listener until `shutdown` is cancelled.
pub(crate) async fn serve_health_on(
    listener: TcpListener,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve(listener, shutdown, move |request| {
        health_response(request, &readiness)
    })
    .await
}

fn metrics_response(request: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    if request.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    response(StatusCode::OK, TEXT_CONTENT_TYPE, metrics.render())
}

fn health_response(request: &Request<Incoming>, readiness: &Readiness) -> Response<Full<Bytes>> {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match request.uri().path() {
        // Alive as long as this task can answer: a wedged runtime fails the probe by timing out.
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        "/readyz" if readiness.is_ready() => plain(StatusCode::OK, "ok\n"),
        "/readyz" => plain(StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n"),
        _ => plain(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", body.to_string())
}

fn response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

/// Accept loop shared by both endpoints. On shutdown it stops accepting and drops open
/// connections: requests here are tiny and idempotent, so nothing worth draining is lost.
pub(crate) async fn serve<H>(
    listener: TcpListener,
    shutdown: CancellationToken,
    handler: H,
) -> anyhow::Result<()>
where
    H: Fn(&Request<Incoming>) -> Response<Full<Bytes>> + Send + Sync + 'static,
{
    let handler = Arc::new(handler);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _peer)) => stream,
                    Err(err) => {
                        tracing::warn!(error = %err, "accepting an HTTP connection failed");
                        tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                        continue;
                    }
                };
                let handler = Arc::clone(&handler);
                connections.spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let response = handler(&request);
                        async move { Ok::<_, Infallible>(response) }
                    });
                    let served = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_READ_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    if let Err(err) = served {
                        tracing::debug!(error = %err, "HTTP connection ended with an error");
                    }
                });
            }
        }
    }
    connections.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ReconcileOutcome;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::task::JoinHandle;

    struct Reply {
        status: u16,
        content_type: Option<String>,
        body: String,
    }

    /// A plain HTTP/1.1 GET: enough to check what a scraper or the kubelet would see.
    async fn get(addr: SocketAddr, path: &str) -> Reply {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.expect("read");
        let (head, body) = raw.split_once("\r\n\r\n").expect("header/body separator");
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|code| code.parse().ok())
            .expect("status line");
        let content_type = lines
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
            .map(|(_, value)| value.trim().to_string());
        Reply {
            status,
            content_type,
            body: body.to_string(),
        }
    }

    async fn start_metrics(
        metrics: Arc<Metrics>,
    ) -> (
        SocketAddr,
        CancellationToken,
        JoinHandle<anyhow::Result<()>>,
    ) {
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve_metrics_on(listener, metrics, shutdown.clone()));
        (addr, shutdown, server)
    }

    #[tokio::test]
    async fn metrics_endpoint_serves_a_parseable_exposition() {
        let metrics = Metrics::new();
        let controller = metrics.controller("questdb", 2);
        controller.start("db/q1").finish(ReconcileOutcome::Success);
        controller.start("db/q1").finish(ReconcileOutcome::Error);
        let (addr, shutdown, server) = start_metrics(metrics).await;

        let reply = get(addr, "/metrics").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.content_type.as_deref(), Some(TEXT_CONTENT_TYPE));
        let scrape = prometheus_parse::Scrape::parse(reply.body.lines().map(|l| Ok(l.to_string())))
            .expect("exposition parses");
        let total = |result: &str| {
            scrape
                .samples
                .iter()
                .find(|s| {
                    s.metric == "controller_runtime_reconcile_total"
                        && s.labels.get("controller") == Some("questdb")
                        && s.labels.get("result") == Some(result)
                })
                .map(|s| match s.value {
                    prometheus_parse::Value::Counter(v) => v,
                    ref other => panic!("not a counter: {other:?}"),
                })
        };
        assert_eq!(total("success"), Some(1.0));
        assert_eq!(total("error"), Some(1.0));
        assert_eq!(total("requeue"), Some(0.0));
        assert_eq!(get(addr, "/other").await.status, 404);

        shutdown.cancel();
        server.await.expect("server task").expect("server result");
    }

    #[tokio::test]
    async fn readyz_turns_ready_once_caches_have_synced() {
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let readiness = Readiness::default();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve_health_on(
            listener,
            readiness.clone(),
            shutdown.clone(),
        ));

        assert_eq!(get(addr, "/healthz").await.status, 200);
        assert_eq!(get(addr, "/readyz").await.status, 503);
        readiness.set_ready();
        let ready = get(addr, "/readyz").await;
        assert_eq!(ready.status, 200);
        assert_eq!(ready.body, "ok\n");

        shutdown.cancel();
        server.await.expect("server task").expect("server result");
    }

    #[tokio::test]
    async fn cancelling_stops_accepting_connections() {
        let (addr, shutdown, server) = start_metrics(Metrics::new()).await;
        assert_eq!(get(addr, "/metrics").await.status, 200);
        shutdown.cancel();
        server.await.expect("server task").expect("server result");
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "listener is closed"
        );
    }

    #[test]
    fn bind_addresses_follow_controller_runtime_conventions() {
        let parse = |s| parse_bind_address(s).expect(s);
        assert_eq!(parse("0"), None);
        assert_eq!(parse(":8080"), Some("0.0.0.0:8080".parse().expect("addr")));
        assert_eq!(
            parse("127.0.0.1:9090"),
            Some("127.0.0.1:9090".parse().expect("addr"))
        );
        assert_eq!(
            parse("[::1]:8081"),
            Some("[::1]:8081".parse().expect("addr"))
        );
        for bad in ["", ":http", "localhost:8080", "8080", ":70000"] {
            assert!(
                parse_bind_address(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }
}

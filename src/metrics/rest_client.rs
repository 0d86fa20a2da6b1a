//! A tower layer on the kube client that counts API server requests: client-go's
//! `rest_client_requests_total{code,method,host}` and `rest_client_request_duration_seconds`,
//! plus a per-verb, per-resource tally that tests and benchmarks read back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use http::{Method, Request, Response};
use tower::{Layer, Service};

use super::{lock, Metrics};

/// Builds a kube client whose every request is counted in `metrics`.
pub fn instrumented_client(
    config: kube::Config,
    metrics: Arc<Metrics>,
) -> kube::Result<kube::Client> {
    install_crypto_provider();
    let layer = RestMetricsLayer::new(metrics, &config.cluster_url);
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build())
}

/// Selects rustls' process-wide crypto provider once. Both `ring` (kube) and `aws-lc-rs` (the
/// AWS SDK) are compiled in, and with two candidates rustls refuses to guess and panics on the
/// first TLS config it builds — including kube's, even for `http://` clusters.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: some provider is then installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// One API call as the API server would authorise it: a verb and a resource.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiCall {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// Plural resource, with the subresource after a slash (`questdbs/status`); discovery and
    /// other non-resource paths are reported as `-`.
    pub resource: String,
}

impl ApiCall {
    /// Classifies a request by method and path, the way the API server's request info does.
    pub(crate) fn classify(method: &Method, uri: &http::Uri) -> ApiCall {
        let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
        let rest = match segments.first() {
            Some(&"api") if segments.len() >= 2 => &segments[2..],
            Some(&"apis") if segments.len() >= 3 => &segments[3..],
            _ => &[][..],
        };
        let (resource, name, subresource) = match rest {
            ["namespaces", _, resource, tail @ ..] => (Some(*resource), tail.first(), tail.get(1)),
            [resource, tail @ ..] => (Some(*resource), tail.first(), tail.get(1)),
            [] => (None, None, None),
        };
        let is_watch = uri.query().is_some_and(|query| {
            query
                .split('&')
                .any(|pair| pair == "watch=true" || pair == "watch=1")
        });
        let verb = match *method {
            Method::GET if is_watch => "watch",
            Method::GET | Method::HEAD if resource.is_some() && name.is_none() => "list",
            Method::GET | Method::HEAD => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if resource.is_some() && name.is_none() => "deletecollection",
            Method::DELETE => "delete",
            _ => "other",
        };
        let resource = match (resource, subresource) {
            (Some(resource), Some(sub)) => format!("{resource}/{sub}"),
            (Some(resource), None) => resource.to_string(),
            (None, _) => "-".to_string(),
        };
        ApiCall {
            verb: verb.to_string(),
            resource,
        }
    }

    #[cfg(test)]
    fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

#[derive(Debug, Default)]
pub(super) struct ApiCallCounter {
    counts: Mutex<BTreeMap<ApiCall, u64>>,
}

impl ApiCallCounter {
    pub(super) fn record(&self, call: &ApiCall) {
        *lock(&self.counts).entry(call.clone()).or_default() += 1;
    }

    #[cfg(test)]
    pub(super) fn snapshot(&self) -> ApiCallSnapshot {
        ApiCallSnapshot {
            counts: lock(&self.counts).clone(),
        }
    }
}

/// Counts of API calls at one moment; subtract an earlier snapshot with `ApiCallSnapshot::since`
/// (in tests) to count what one step did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiCallSnapshot {
    counts: BTreeMap<ApiCall, u64>,
}

#[cfg(test)]
impl ApiCallSnapshot {
    /// Calls of `verb` on `resource` (e.g. `("patch", "questdbs/status")`).
    pub(crate) fn count(&self, verb: &str, resource: &str) -> u64 {
        self.sum(|call| call.verb == verb && call.resource == resource)
    }

    /// Calls of `verb`, any resource.
    pub(crate) fn by_verb(&self, verb: &str) -> u64 {
        self.sum(|call| call.verb == verb)
    }

    /// Calls that change state: create, update, patch, delete, deletecollection.
    pub(crate) fn writes(&self) -> u64 {
        self.sum(ApiCall::is_write)
    }

    pub(crate) fn total(&self) -> u64 {
        self.sum(|_| true)
    }

    /// What happened between `earlier` and this snapshot.
    pub(crate) fn since(&self, earlier: &ApiCallSnapshot) -> ApiCallSnapshot {
        let counts = self
            .counts
            .iter()
            .filter_map(|(call, n)| {
                let before = earlier.counts.get(call).copied().unwrap_or(0);
                (*n > before).then(|| (call.clone(), n - before))
            })
            .collect();
        ApiCallSnapshot { counts }
    }

    /// Every `(call, count)` pair, ordered by verb then resource.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ApiCall, u64)> {
        self.counts.iter().map(|(call, n)| (call, *n))
    }

    fn sum(&self, wanted: impl Fn(&ApiCall) -> bool) -> u64 {
        self.counts
            .iter()
            .filter(|(call, _)| wanted(call))
            .map(|(_, n)| n)
            .sum()
    }
}

/// The tower layer behind [`instrumented_client`]; usable on any client stack.
#[derive(Clone, Debug)]
pub struct RestMetricsLayer {
    metrics: Arc<Metrics>,
    host: Arc<str>,
}

impl RestMetricsLayer {
    /// `cluster_url` gives the `host` label (host:port, as client-go reports it). The layer sits
    /// outside kube's base-URI layer, so requests it sees carry only a path.
    pub(crate) fn new(metrics: Arc<Metrics>, cluster_url: &http::Uri) -> Self {
        let host = cluster_url
            .authority()
            .map_or_else(String::new, |authority| authority.as_str().to_string());
        RestMetricsLayer {
            metrics,
            host: host.into(),
        }
    }
}

impl<S> Layer<S> for RestMetricsLayer {
    type Service = RestMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RestMetricsService {
            inner,
            metrics: Arc::clone(&self.metrics),
            host: Arc::clone(&self.host),
        }
    }
}

/// The service [`RestMetricsLayer`] wraps around the client stack. A watch is counted (and its
/// latency measured) when its response headers arrive, as client-go does.
#[derive(Clone, Debug)]
pub struct RestMetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
    host: Arc<str>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RestMetricsService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let call = ApiCall::classify(request.method(), request.uri());
        let method = request.method().as_str().to_string();
        let metrics = Arc::clone(&self.metrics);
        let host = Arc::clone(&self.host);
        let response = self.inner.call(request);
        // Recorded when the response future is polled, which kube's client does in the calling
        // task (its Buffer only hands the future over): that is what lets a reconcile's scope
        // attribute the call to itself.
        Box::pin(async move {
            let started = Instant::now();
            let result = response.await;
            let code = result.as_ref().ok().map(|r| r.status().as_u16());
            metrics.record_rest_request(&call, &method, &host, code, started.elapsed());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(method: Method, uri: &str) -> (String, String) {
        let call = ApiCall::classify(&method, &uri.parse().expect("test uri"));
        (call.verb, call.resource)
    }

    fn pair(verb: &str, resource: &str) -> (String, String) {
        (verb.to_string(), resource.to_string())
    }

    #[test]
    fn classifies_requests_like_the_api_server() {
        let ns = "/apis/crd.questdb.io/v1beta1/namespaces/db";
        assert_eq!(
            classify(Method::GET, &format!("{ns}/questdbs/q1")),
            pair("get", "questdbs")
        );
        assert_eq!(
            classify(Method::GET, &format!("{ns}/questdbs")),
            pair("list", "questdbs")
        );
        assert_eq!(
            classify(
                Method::GET,
                &format!("{ns}/questdbs?watch=true&resourceVersion=5")
            ),
            pair("watch", "questdbs")
        );
        assert_eq!(
            classify(Method::PATCH, &format!("{ns}/questdbs/q1/status")),
            pair("patch", "questdbs/status")
        );
        assert_eq!(
            classify(Method::POST, "/api/v1/namespaces/db/configmaps"),
            pair("create", "configmaps")
        );
        assert_eq!(
            classify(Method::PUT, "/api/v1/nodes/n1"),
            pair("update", "nodes")
        );
        assert_eq!(
            classify(Method::DELETE, "/api/v1/namespaces/db/pods/p-0"),
            pair("delete", "pods")
        );
        assert_eq!(
            classify(Method::GET, "/api/v1/namespaces/db"),
            pair("get", "namespaces")
        );
        assert_eq!(classify(Method::GET, "/apis"), pair("get", "-"));
    }

    #[test]
    fn snapshot_difference_counts_only_new_calls() {
        let counter = ApiCallCounter::default();
        let get = ApiCall::classify(&Method::GET, &"/api/v1/nodes/n1".parse().expect("uri"));
        let patch = ApiCall::classify(&Method::PATCH, &"/api/v1/nodes/n1".parse().expect("uri"));
        counter.record(&get);
        let before = counter.snapshot();
        counter.record(&get);
        counter.record(&patch);
        let step = counter.snapshot().since(&before);
        assert_eq!(step.count("get", "nodes"), 1);
        assert_eq!(step.writes(), 1);
        assert_eq!(step.total(), 2);
        assert_eq!(counter.snapshot().by_verb("get"), 2);
    }
}

//! Watch streams: newline-delimited JSON events, resumable from a resourceVersion inside the
//! event window, with periodic bookmarks, `timeoutSeconds`, `sendInitialEvents`, and an end
//! when the test hook cuts all watches.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::{broadcast, mpsc};

use super::resource::{metadata_only, Filter};
use super::{render, representation, value_as, AppState, Representation, ResourcePath};
use crate::error::ApiError;
use crate::registry::ResourceType;
use crate::store::{Event, EventType, Stored};

/// What a watch sends: derived per watcher from store events and its selectors.
struct Renderer {
    rt: Arc<ResourceType>,
    filter: Filter,
    representation: Representation,
    /// `includeObject` of Table watches.
    include_object: String,
    clock: crate::clock::Clock,
}

impl Renderer {
    fn line(&self, type_: &str, obj: &Stored) -> Bytes {
        let object = match self.representation {
            Representation::Full => render(obj, &self.rt),
            Representation::Metadata => Bytes::from(metadata_only(&obj.value()).to_string()),
            // `kubectl get -w`: every event carries a one-row Table.
            Representation::Table => Bytes::from(
                crate::table::table(
                    &self.rt,
                    &[value_as(obj, &self.rt)],
                    obj.rv,
                    &self.include_object,
                    self.clock.now(),
                )
                .to_string(),
            ),
        };
        let mut out = Vec::with_capacity(object.len() + 32);
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(type_.as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        out.extend_from_slice(&object);
        out.extend_from_slice(b"}\n");
        Bytes::from(out)
    }

    /// Selector transitions: an object that leaves the selector is DELETED for this watcher.
    fn event(&self, e: &Event) -> Option<Bytes> {
        let now = self.filter.matches(&e.obj);
        let before = e.prev.as_ref().is_some_and(|p| self.filter.matches(p));
        let type_ = match e.type_ {
            EventType::Added if now => EventType::Added,
            EventType::Deleted if before || now => EventType::Deleted,
            EventType::Modified if now && before => EventType::Modified,
            EventType::Modified if now => EventType::Added,
            EventType::Modified if before => EventType::Deleted,
            _ => return None,
        };
        Some(self.line(type_.as_str(), &e.obj))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": metadata});
        Bytes::from(format!("{{\"type\":\"BOOKMARK\",\"object\":{obj}}}\n"))
    }
}

fn error_line(e: &ApiError) -> Bytes {
    Bytes::from(format!(
        "{{\"type\":\"ERROR\",\"object\":{}}}\n",
        e.to_status()
    ))
}

fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let mut rx = rx;
    let stream =
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, Infallible>)));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response()
}

pub fn watch(
    app: &Arc<AppState>,
    rt: Arc<ResourceType>,
    path: &ResourcePath,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let filter = match Filter::from_query(&rt, path, query) {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let rv_param = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or("");
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|b| b == "true");
    let send_initial = query.get("sendInitialEvents").is_some_and(|b| b == "true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let from = match rv_param {
        "" | "0" => None,
        rv if send_initial => {
            let _ = rv;
            None
        }
        rv => match rv.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                return ApiError::bad_request(format!("invalid resourceVersion {rv:?}"))
                    .into_response()
            }
        },
    };
    let renderer = Renderer {
        rt: rt.clone(),
        filter,
        representation: representation(headers),
        include_object: query
            .get("includeObject")
            .cloned()
            .unwrap_or_else(|| "Metadata".into()),
        clock: app.clock.clone(),
    };

    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let mut initial: Vec<Bytes> = vec![];
    let subscription = {
        let mut store = app.store.write();
        match from {
            // No resourceVersion (or 0, or sendInitialEvents): synthetic ADDED for the current
            // state, then changes.
            None => {
                let rv = store.current_rv();
                for o in store.list(&rt.storage_key, renderer.filter.namespace.as_deref()) {
                    if renderer.filter.matches(&o) {
                        initial.push(renderer.line("ADDED", &o));
                    }
                }
                if send_initial && bookmarks {
                    initial.push(renderer.bookmark(rv, true));
                }
                store.subscribe(&rt.storage_key, rv).map(|s| (s, rv))
            }
            Some(rv) => store.subscribe(&rt.storage_key, rv).map(|s| (s, rv)),
        }
    };
    let (subscription, start_rv) = match subscription {
        Ok(s) => s,
        Err(too_old) => {
            // Like the watch cache: 200, one ERROR event carrying 410 Expired, end of stream.
            let e = ApiError::gone(format!(
                "too old resource version: {} ({})",
                too_old.requested, too_old.oldest
            ));
            let _ = tx.try_send(error_line(&e));
            drop(tx);
            return stream_response(rx);
        }
    };
    for e in &subscription.backlog {
        if let Some(line) = renderer.event(e) {
            initial.push(line);
        }
    }
    let last_rv = subscription
        .backlog
        .last()
        .map(|e| e.obj.rv)
        .unwrap_or(start_rv);
    let task = WatchTask {
        app: app.clone(),
        renderer,
        tx,
        rx: subscription.rx,
        last_rv,
        bookmarks,
        timeout,
    };
    tokio::spawn(task.run(initial));
    stream_response(rx)
}

struct WatchTask {
    app: Arc<AppState>,
    renderer: Renderer,
    tx: mpsc::Sender<Bytes>,
    rx: broadcast::Receiver<Arc<Event>>,
    last_rv: u64,
    bookmarks: bool,
    timeout: Option<Duration>,
}

impl WatchTask {
    async fn send(&self, line: Bytes) -> bool {
        self.tx.send(line).await.is_ok()
    }

    async fn run(mut self, initial: Vec<Bytes>) {
        for line in initial {
            if !self.send(line).await {
                return;
            }
        }
        let mut cut = self.app.hooks.cut_watches.subscribe();
        cut.mark_unchanged();
        let deadline = tokio::time::sleep(self.timeout.unwrap_or(Duration::from_secs(24 * 3600)));
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(self.app.bookmark_interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                ev = self.rx.recv() => match ev {
                    Ok(e) => {
                        if !self.deliver(&e).await {
                            return;
                        }
                    }
                    // A watcher that fell behind is ended; the client resumes from its last
                    // resourceVersion (or relists after 410), as with a real apiserver.
                    Err(_) => return,
                },
                _ = ticker.tick(), if self.bookmarks => {
                    if !self.bookmark().await {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = cut.changed() => return,
                _ = self.tx.closed() => return,
            }
        }
    }

    async fn deliver(&mut self, e: &Event) -> bool {
        if e.obj.rv <= self.last_rv {
            return true;
        }
        self.last_rv = e.obj.rv;
        match self.renderer.event(e) {
            Some(line) => self.send(line).await,
            None => true,
        }
    }

    /// Every event up to the store's current resourceVersion is already in our channel (events
    /// are published under the store lock), so after draining it the bookmark is a safe resume
    /// point.
    async fn bookmark(&mut self) -> bool {
        let current = self.app.store.read().current_rv();
        loop {
            match self.rx.try_recv() {
                Ok(e) => {
                    if !self.deliver(&e).await {
                        return false;
                    }
                }
                Err(broadcast::error::TryRecvError::Empty) => break,
                Err(_) => return false,
            }
        }
        self.last_rv = self.last_rv.max(current);
        let line = self.renderer.bookmark(self.last_rv, false);
        self.send(line).await
    }
}

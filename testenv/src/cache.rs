//! A reflector over every object of a kind, with a nudge on each change, for the agents'
//! reconcile loops (the CSI driver, the kubelets).

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

pub fn store<K>(client: &Client, stop: &CancellationToken, changed: UnboundedSender<()>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    reflect(Api::<K>::all(client.clone()), writer, stop, changed);
    reader
}

/// Fills `writer` from a watch of `api` until `stop`, sending `changed` after each event; for
/// kinds known only at run time (a `DynamicObject` writer carries its `ApiResource`).
pub fn reflect<K>(
    api: Api<K>,
    writer: Writer<K>,
    stop: &CancellationToken,
    changed: UnboundedSender<()>,
) where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    let stop = stop.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                item = stream.next() => match item {
                    Some(_) => { let _ = changed.send(()); }
                    None => return,
                },
            }
        }
    });
}

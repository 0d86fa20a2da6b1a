//! The event recorder: kube's `Recorder` semantics (events.k8s.io/v1; a repeat of the same
//! type, reason, action and object within six minutes becomes a series on the first event,
//! `series.count` and `series.lastObservedTime` patched) with a small memory footprint.
//!
//! kube's recorder keeps every event it sent in a map of whole `Event` objects for its series
//! window and never shrinks the map: after a burst of creations (two events per QuestDB at
//! 1,000 QuestDBs) it held about 6 MB for good. Here an entry is the event's name, namespace,
//! count and time, and the map shrinks when the window empties it.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::Client;
use serde_json::json;

/// How long a repeat joins the first event's series (kube's `CACHE_TTL`, and client-go's
/// event correlator window).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

struct Series {
    name: String,
    count: i32,
    last: Timestamp,
}

pub(crate) struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<HashMap<u64, Series>>,
}

impl Recorder {
    pub(crate) fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.to_string(),
            instance: instance.unwrap_or_else(|| controller.to_string()),
            series: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes `ev` about `regarding` (cluster-scoped objects' events go to `default`, as
    /// with kube's recorder).
    pub(crate) async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> kube::Result<()> {
        let now = Timestamp::now();
        let key = series_key(ev, regarding);
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let repeat = {
            let mut series = self.lock();
            expire(&mut series, now);
            series.get(&key).map(|s| (s.name.clone(), s.count + 1))
        };
        if let Some((name, count)) = repeat {
            let patch = json!({"series": EventSeries {
                count,
                last_observed_time: MicroTime(now),
            }});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    if let Some(s) = self.lock().get_mut(&key) {
                        s.count = count;
                        s.last = now;
                    }
                    return Ok(());
                }
                // The first event is gone (deleted, or the apiserver's event TTL): start anew.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.event(ev, regarding, &namespace, now);
        let name = event.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &event).await?;
        self.lock().insert(
            key,
            Series {
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Series>> {
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn event(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
        namespace: &str,
        now: Timestamp,
    ) -> K8sEvent {
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..Default::default()
        }
    }
}

/// kube's `EventKey` without the reporter (one per recorder): type, action, reason, the object
/// and the related one.
fn series_key(ev: &Event, regarding: &ObjectReference) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    matches!(ev.type_, EventType::Warning).hash(&mut h);
    ev.action.hash(&mut h);
    ev.reason.hash(&mut h);
    reference_key(regarding).hash(&mut h);
    ev.secondary.as_ref().map(reference_key).hash(&mut h);
    h.finish()
}

fn reference_key(r: &ObjectReference) -> [Option<&str>; 5] {
    [
        r.api_version.as_deref(),
        r.kind.as_deref(),
        r.namespace.as_deref(),
        r.name.as_deref(),
        r.uid.as_deref(),
    ]
}

/// Drops series past the window and gives the memory back once most are gone.
fn expire(series: &mut HashMap<u64, Series>, now: Timestamp) {
    let window = k8s_openapi::jiff::SignedDuration::try_from(SERIES_WINDOW).unwrap_or_default();
    series.retain(|_, s| s.last + window > now);
    if series.capacity() > 64 && series.len() * 4 < series.capacity() {
        series.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(last: Timestamp) -> Series {
        Series {
            name: "e".into(),
            count: 1,
            last,
        }
    }

    #[test]
    fn a_quiet_window_gives_the_memory_back() {
        let now = Timestamp::now();
        let old = now - k8s_openapi::jiff::SignedDuration::from_mins(7);
        let mut map: HashMap<u64, Series> = (0..2000).map(|i| (i, series(old))).collect();
        map.insert(9999, series(now));
        let before = map.capacity();
        expire(&mut map, now);
        assert_eq!(map.len(), 1, "only the series inside the window stays");
        assert!(
            map.capacity() < before / 8,
            "{} of {before}",
            map.capacity()
        );
    }

    #[test]
    fn the_same_event_about_another_object_is_another_series() {
        let ev = Event {
            type_: EventType::Normal,
            reason: "Created".into(),
            note: Some("created ConfigMap a".into()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let a = ObjectReference {
            name: Some("a".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        };
        let b = ObjectReference {
            name: Some("b".into()),
            ..a.clone()
        };
        assert_eq!(series_key(&ev, &a), series_key(&ev, &a));
        assert_ne!(series_key(&ev, &a), series_key(&ev, &b));
        let other_note = Event {
            type_: EventType::Normal,
            reason: "Created".into(),
            note: Some("another note".into()),
            action: "Reconcile".into(),
            secondary: None,
        };
        assert_eq!(
            series_key(&ev, &a),
            series_key(&other_note, &a),
            "like kube's, the note is not part of the key"
        );
    }
}

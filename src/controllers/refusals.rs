//! The refusals that say why a database waits, cached from one watch per reason (a field
//! selector on `reason`), so a waiting database reads them from memory: at a thousand
//! databases queued at once, looking them up live was ten uncached event lists per database
//! and most of the apiserver's CPU.
//!
//! Only these reasons are watched, each event held as the few fields a lookup reads.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use kube::Resource;

/// The StatefulSet controller refused to create the database pod (Pod Security, a quota).
pub(crate) const FAILED_CREATE: &str = "FailedCreate";
/// The persistent volume controller cannot bind the claim.
pub(crate) const FAILED_BINDING: &str = "FailedBinding";
/// A provisioner failed to make the claim's volume.
pub(crate) const PROVISIONING_FAILED: &str = "ProvisioningFailed";

/// Every reason watched, one watch each.
pub(crate) const REASONS: [&str; 3] = [FAILED_CREATE, FAILED_BINDING, PROVISIONING_FAILED];

/// An event as the refusal caches hold it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Refusal {
    /// Name, namespace and resourceVersion only.
    pub metadata: ObjectMeta,
    /// `involvedObject.kind` and `.name`.
    pub kind: String,
    pub name: String,
    pub reason: String,
    pub message: String,
    /// When it was last seen (a series' last observation, or the event's own time).
    pub at: Option<Timestamp>,
}

impl Refusal {
    /// The name of the QuestDB this refusal would be about, if the refused object is one the
    /// operator names: a StatefulSet is named after its QuestDB, a claim `<name>-data`.
    pub(crate) fn questdb_name(&self) -> Option<&str> {
        match self.kind.as_str() {
            "StatefulSet" => Some(self.name.as_str()),
            "PersistentVolumeClaim" => crate::desired::names::questdb_of_pvc(&self.name),
            _ => None,
        }
    }

    pub(crate) fn from_event(e: Event) -> Self {
        let at = e
            .series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
            .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
            .or_else(|| e.event_time.as_ref().map(|t| t.0));
        Refusal {
            metadata: ObjectMeta {
                name: e.metadata.name,
                namespace: e.metadata.namespace,
                resource_version: e.metadata.resource_version,
                ..ObjectMeta::default()
            },
            kind: e.involved_object.kind.unwrap_or_default(),
            name: e.involved_object.name.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            message: truncated(e.message.unwrap_or_default()),
            at,
        }
    }
}

/// The most of a refusal's message a cache keeps and a condition shows: Events are written by
/// anyone who may create them in a namespace, and the cache is the operator's memory.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;

fn truncated(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(" [...]");
    }
    message
}

impl Resource for Refusal {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Event::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Event::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Event::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Event::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The newest message of one of `reasons` about the `kind` object `name` in `ns`, if it is
/// younger than `fresh` at `now` (events live an hour: an old refusal since resolved must not
/// explain a pod that is merely being replaced). Pure over what the caches hold.
pub(crate) fn newest<'a>(
    refusals: impl IntoIterator<Item = &'a Refusal>,
    ns: &str,
    kind: &str,
    name: &str,
    reasons: &[&str],
    fresh: std::time::Duration,
    now: Timestamp,
) -> Option<String> {
    let (at, refusal) = refusals
        .into_iter()
        .filter(|r| {
            r.metadata.namespace.as_deref() == Some(ns)
                && r.kind == kind
                && r.name == name
                && reasons.contains(&r.reason.as_str())
        })
        .filter_map(|r| Some((r.at?, r)))
        .max_by_key(|(at, _)| *at)?;
    (now.duration_since(at).as_secs() < fresh.as_secs() as i64).then(|| refusal.message.clone())
}

/// [`newest`] over every refusal cache.
pub(crate) fn newest_cached(
    stores: &[Store<Refusal>],
    ns: &str,
    kind: &str,
    name: &str,
    reasons: &[&str],
    fresh: std::time::Duration,
) -> Option<String> {
    let held: Vec<_> = stores.iter().flat_map(|s| s.state()).collect();
    newest(
        held.iter().map(|r| r.as_ref()),
        ns,
        kind,
        name,
        reasons,
        fresh,
        Timestamp::now(),
    )
}

#[cfg(test)]
mod tests {
    /// The harm: a megabyte of event message from any namespace's user kept in the operator.
    #[test]
    fn a_long_refusal_message_is_kept_to_its_first_kilobyte_on_a_char_boundary() {
        let long = "é".repeat(2000);
        let kept = super::truncated(long);
        assert!(kept.len() <= super::MAX_MESSAGE_BYTES + 6, "{}", kept.len());
        assert!(kept.ends_with(" [...]"));
        assert_eq!(super::truncated("short".into()), "short");
    }

    use super::*;

    fn refusal(ns: &str, kind: &str, name: &str, reason: &str, msg: &str, at: i64) -> Refusal {
        Refusal {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                ..ObjectMeta::default()
            },
            kind: kind.into(),
            name: name.into(),
            reason: reason.into(),
            message: msg.into(),
            at: Some(Timestamp::from_second(at).unwrap()),
        }
    }

    #[test]
    fn the_newest_fresh_refusal_of_the_object_explains_the_wait_and_nothing_else_does() {
        let now = Timestamp::from_second(10_000).unwrap();
        let fresh = std::time::Duration::from_secs(120);
        let held = [
            refusal("a", "StatefulSet", "db", FAILED_CREATE, "older", 9_900),
            refusal("a", "StatefulSet", "db", FAILED_CREATE, "newest", 9_950),
            refusal(
                "b",
                "StatefulSet",
                "db",
                FAILED_CREATE,
                "other namespace",
                9_990,
            ),
            refusal(
                "a",
                "StatefulSet",
                "db2",
                FAILED_CREATE,
                "other object",
                9_990,
            ),
            refusal(
                "a",
                "PersistentVolumeClaim",
                "db",
                FAILED_BINDING,
                "other kind",
                9_990,
            ),
        ];
        let find = |reasons: &[&str]| newest(&held, "a", "StatefulSet", "db", reasons, fresh, now);
        assert_eq!(find(&[FAILED_CREATE]).as_deref(), Some("newest"));
        assert_eq!(find(&[FAILED_BINDING]), None, "another reason");
        let stale = [refusal(
            "a",
            "StatefulSet",
            "db",
            FAILED_CREATE,
            "resolved",
            9_800,
        )];
        assert_eq!(
            newest(
                &stale,
                "a",
                "StatefulSet",
                "db",
                &[FAILED_CREATE],
                fresh,
                now
            ),
            None,
            "a refusal older than two minutes explains nothing"
        );
    }

    #[test]
    fn a_series_is_as_new_as_its_last_observation() {
        let e: Event = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "e1", "namespace": "a"},
            "involvedObject": {"kind": "StatefulSet", "name": "db"},
            "reason": "FailedCreate",
            "message": "forbidden",
            "lastTimestamp": "2026-01-01T00:00:00Z",
            "series": {"count": 3, "lastObservedTime": "2026-01-01T00:05:00.000000Z"}
        }))
        .unwrap();
        let r = Refusal::from_event(e);
        assert_eq!(r.at, "2026-01-01T00:05:00Z".parse().ok());
        assert_eq!((r.kind.as_str(), r.name.as_str()), ("StatefulSet", "db"));
    }
}

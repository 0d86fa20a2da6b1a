//! The object store: every object as compact JSON bytes (cheap to hold and to send), one global
//! resourceVersion, and per-resource bounded event logs that watches replay from.
//!
//! All writes happen under one lock, which is what makes the resourceVersion a total order and
//! lets a watch subscribe without missing or repeating events.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use axum::body::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::fields::Owners;
use crate::registry::StorageKey;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One stored version of an object plus the fields requests filter on, so selectors and
/// garbage collection never have to parse the JSON.
#[derive(Debug)]
pub struct Stored {
    pub json: Bytes,
    /// The version it was written as; a read through another served version rewrites it.
    pub api_version: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub rv: u64,
    pub labels: BTreeMap<String, String>,
    pub node_name: String,
    pub phase: String,
    pub owner_uids: Vec<String>,
    /// Extra field-selector values (Events' `involvedObject.*`, `reason`, `type`).
    pub fields: Vec<(String, String)>,
    pub has_finalizers: bool,
    pub deleting: bool,
    /// Only for objects that were ever server-side applied.
    pub field_owners: Option<Arc<Owners>>,
}

impl Stored {
    pub fn value(&self) -> Value {
        // The bytes were produced by serde_json from a Value, so they always parse.
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    fn from_value(v: &Value, rv: u64, field_owners: Option<Arc<Owners>>) -> Self {
        let meta = &v["metadata"];
        let s = |x: &Value| x.as_str().unwrap_or_default().to_string();
        let labels = meta["labels"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), s(v))).collect())
            .unwrap_or_default();
        let owner_uids = meta["ownerReferences"]
            .as_array()
            .map(|a| a.iter().map(|o| s(&o["uid"])).collect())
            .unwrap_or_default();
        Self {
            json: Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
            api_version: s(&v["apiVersion"]),
            namespace: s(&meta["namespace"]),
            name: s(&meta["name"]),
            uid: s(&meta["uid"]),
            rv,
            labels,
            node_name: s(&v["spec"]["nodeName"]),
            phase: s(&v["status"]["phase"]),
            owner_uids,
            fields: crate::events::selectable_fields(v),
            has_finalizers: meta["finalizers"].as_array().is_some_and(|f| !f.is_empty()),
            deleting: meta["deletionTimestamp"].is_string(),
            field_owners,
        }
    }
}

#[derive(Debug)]
pub struct Event {
    pub type_: EventType,
    pub obj: Arc<Stored>,
    /// The version before a MODIFIED, so a filtered watch can turn "left the selector" into
    /// DELETED and "entered the selector" into ADDED.
    pub prev: Option<Arc<Stored>>,
}

/// A reference to one object in the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjRef {
    pub key: StorageKey,
    pub namespace: String,
    pub name: String,
}

struct Bucket {
    objects: BTreeMap<(String, String), Arc<Stored>>,
    log: VecDeque<Arc<Event>>,
    /// Watches may resume from any resourceVersion >= this one.
    compacted: u64,
    tx: broadcast::Sender<Arc<Event>>,
}

impl Bucket {
    fn new(compacted: u64) -> Self {
        let (tx, _) = broadcast::channel(4096);
        Self {
            objects: BTreeMap::new(),
            log: VecDeque::new(),
            compacted,
            tx,
        }
    }
}

/// How dependents are treated when their owner goes away (`propagationPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    #[default]
    Background,
    Foreground,
    Orphan,
}

pub struct StoreInner {
    /// Policies of deletions that wait for finalizers, by uid.
    pub pending_propagation: HashMap<String, Propagation>,
    rv: u64,
    window: usize,
    buckets: HashMap<StorageKey, Bucket>,
    uids: HashMap<String, ObjRef>,
    /// owner uid -> objects that name it in ownerReferences.
    dependents: HashMap<String, HashSet<ObjRef>>,
    namespace_counts: HashMap<String, usize>,
}

pub struct Store {
    inner: RwLock<StoreInner>,
}

/// Why a watch could not start.
#[derive(Debug, PartialEq, Eq)]
pub struct TooOld {
    pub requested: u64,
    pub oldest: u64,
}

pub struct Subscription {
    pub backlog: Vec<Arc<Event>>,
    pub rx: broadcast::Receiver<Arc<Event>>,
}

impl Store {
    pub fn new(window: usize) -> Self {
        Self {
            inner: RwLock::new(StoreInner {
                pending_propagation: HashMap::new(),
                rv: 1,
                window: window.max(1),
                buckets: HashMap::new(),
                uids: HashMap::new(),
                dependents: HashMap::new(),
                namespace_counts: HashMap::new(),
            }),
        }
    }

    pub fn read(&self) -> RwLockReadGuard<'_, StoreInner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, StoreInner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl StoreInner {
    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    fn bucket(&mut self, key: &StorageKey) -> &mut Bucket {
        let rv = self.rv;
        self.buckets
            .entry(key.clone())
            .or_insert_with(|| Bucket::new(rv))
    }

    pub fn get(&self, key: &StorageKey, namespace: &str, name: &str) -> Option<Arc<Stored>> {
        self.buckets
            .get(key)?
            .objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn get_ref(&self, r: &ObjRef) -> Option<Arc<Stored>> {
        self.get(&r.key, &r.namespace, &r.name)
    }

    pub fn uid_exists(&self, uid: &str) -> bool {
        self.uids.contains_key(uid)
    }

    /// Objects of one resource, optionally of one namespace, in (namespace, name) order.
    pub fn list(&self, key: &StorageKey, namespace: Option<&str>) -> Vec<Arc<Stored>> {
        let Some(bucket) = self.buckets.get(key) else {
            return vec![];
        };
        match namespace {
            Some(ns) => bucket
                .objects
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, o)| o.clone())
                .collect(),
            None => bucket.objects.values().cloned().collect(),
        }
    }

    pub fn namespace_is_empty(&self, namespace: &str) -> bool {
        self.namespace_counts.get(namespace).copied().unwrap_or(0) == 0
    }

    /// Every object in a namespace, across resources (for namespace deletion).
    pub fn objects_in_namespace(&self, namespace: &str) -> Vec<ObjRef> {
        let mut out = vec![];
        for (key, bucket) in &self.buckets {
            for (ns, name) in bucket.objects.keys() {
                if ns == namespace {
                    out.push(ObjRef {
                        key: key.clone(),
                        namespace: ns.clone(),
                        name: name.clone(),
                    });
                }
            }
        }
        out
    }

    pub fn dependents_of(&self, uid: &str) -> Vec<ObjRef> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Starts a watch after `from`: the retained events newer than it, then live events.
    pub fn subscribe(&mut self, key: &StorageKey, from: u64) -> Result<Subscription, TooOld> {
        let bucket = self.bucket(key);
        if from < bucket.compacted {
            return Err(TooOld {
                requested: from,
                oldest: bucket.compacted,
            });
        }
        let backlog = bucket
            .log
            .iter()
            .filter(|e| e.obj.rv > from)
            .cloned()
            .collect();
        Ok(Subscription {
            backlog,
            rx: bucket.tx.subscribe(),
        })
    }

    /// Stores `obj` (its metadata.resourceVersion is set here) and emits the event.
    pub fn put(
        &mut self,
        key: &StorageKey,
        mut obj: Value,
        field_owners: Option<Arc<Owners>>,
    ) -> Arc<Stored> {
        self.rv += 1;
        let rv = self.rv;
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let stored = Arc::new(Stored::from_value(&obj, rv, field_owners));
        let id = (stored.namespace.clone(), stored.name.clone());
        let obj_ref = ObjRef {
            key: key.clone(),
            namespace: stored.namespace.clone(),
            name: stored.name.clone(),
        };
        let prev = self.bucket(key).objects.insert(id, stored.clone());
        if let Some(p) = &prev {
            self.unindex_owners(p, &obj_ref);
        } else if !stored.namespace.is_empty() {
            *self
                .namespace_counts
                .entry(stored.namespace.clone())
                .or_default() += 1;
        }
        self.uids.insert(stored.uid.clone(), obj_ref.clone());
        for owner in &stored.owner_uids {
            self.dependents
                .entry(owner.clone())
                .or_default()
                .insert(obj_ref.clone());
        }
        let type_ = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.emit(key, type_, stored.clone(), prev);
        stored
    }

    /// Removes an object for good, emitting DELETED with a fresh resourceVersion.
    pub fn remove(&mut self, r: &ObjRef) -> Option<Arc<Stored>> {
        let old = self
            .buckets
            .get_mut(&r.key)?
            .objects
            .remove(&(r.namespace.clone(), r.name.clone()))?;
        self.rv += 1;
        let mut value = old.value();
        value["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let gone = Arc::new(Stored::from_value(&value, self.rv, None));
        self.unindex_owners(&old, r);
        self.uids.remove(&old.uid);
        if !old.namespace.is_empty() {
            if let Some(c) = self.namespace_counts.get_mut(&old.namespace) {
                *c = c.saturating_sub(1);
            }
        }
        self.emit(&r.key, EventType::Deleted, gone.clone(), Some(old));
        Some(gone)
    }

    fn unindex_owners(&mut self, old: &Stored, r: &ObjRef) {
        for owner in &old.owner_uids {
            if let Some(set) = self.dependents.get_mut(owner) {
                set.remove(r);
                if set.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
    }

    fn emit(
        &mut self,
        key: &StorageKey,
        type_: EventType,
        obj: Arc<Stored>,
        prev: Option<Arc<Stored>>,
    ) {
        let window = self.window;
        let bucket = self.bucket(key);
        let event = Arc::new(Event { type_, obj, prev });
        bucket.log.push_back(event.clone());
        while bucket.log.len() > window {
            if let Some(dropped) = bucket.log.pop_front() {
                bucket.compacted = dropped.obj.rv;
            }
        }
        // No receivers is fine: nobody is watching this resource.
        let _ = bucket.tx.send(event);
    }

    /// Forgets every retained event, like an etcd compaction: watches resuming from any
    /// resourceVersion seen so far get 410 Expired and their clients relist. The counter moves
    /// one step so that a fresh list returns a resourceVersion that can be watched from.
    pub fn compact_all(&mut self) {
        self.rv += 1;
        let rv = self.rv;
        for bucket in self.buckets.values_mut() {
            bucket.log.clear();
            bucket.compacted = rv;
        }
    }

    /// Drops a whole resource (its CRD was deleted), emitting DELETED for each object.
    pub fn drop_resource(&mut self, key: &StorageKey) {
        let refs: Vec<ObjRef> = self
            .list(key, None)
            .iter()
            .map(|o| ObjRef {
                key: key.clone(),
                namespace: o.namespace.clone(),
                name: o.name.clone(),
            })
            .collect();
        for r in refs {
            self.remove(&r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> StorageKey {
        StorageKey {
            group: String::new(),
            plural: "configmaps".into(),
        }
    }

    fn cm(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "uid": name}})
    }

    #[test]
    fn resume_replays_only_newer_events_and_expires_past_the_window() {
        let store = Store::new(2);
        let mut s = store.write();
        let a = s.put(&key(), cm("a"), None);
        s.put(&key(), cm("b"), None);
        let sub = s.subscribe(&key(), a.rv).expect("within window");
        assert_eq!(sub.backlog.len(), 1);
        assert_eq!(sub.backlog[0].obj.name, "b");
        s.put(&key(), cm("c"), None);
        assert!(
            s.subscribe(&key(), a.rv - 1).is_err(),
            "older than the window"
        );
    }

    #[test]
    fn compaction_expires_old_versions_but_not_a_fresh_list() {
        let store = Store::new(10);
        let mut s = store.write();
        let a = s.put(&key(), cm("a"), None);
        s.compact_all();
        assert!(s.subscribe(&key(), a.rv).is_err());
        let fresh = s.current_rv();
        assert!(s.subscribe(&key(), fresh).is_ok());
    }

    #[test]
    fn dependents_index_follows_owner_references() {
        let store = Store::new(10);
        let mut s = store.write();
        let mut child = cm("child");
        child["metadata"]["ownerReferences"] = json!([{"uid": "owner"}]);
        s.put(&key(), child, None);
        assert_eq!(s.dependents_of("owner").len(), 1);
        s.remove(&ObjRef {
            key: key(),
            namespace: "default".into(),
            name: "child".into(),
        });
        assert!(s.dependents_of("owner").is_empty());
    }
}

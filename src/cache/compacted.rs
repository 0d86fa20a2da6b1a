//! "Does this child need a write?" for the controller's write-only-when-different rule.
//!
//! The API server adds defaults (a Service's clusterIP, a volume's defaultMode, a probe's
//! scheme), metadata (uid, resourceVersion, managedFields) and status to every stored object, and
//! canonicalises quantities (`1000m` becomes `1`). Comparing whole objects would therefore write
//! on every reconcile. Instead each kind compares only what the builders set: the desired object
//! must be a *subset* of the existing one.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::runtime::reflector::Lookup;
use kube::Resource;
use kube::ResourceExt;
use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use super::interned::Table;
use super::shared_text::Templated;
use crate::desired::quantity::parse_quantity;

/// Annotation holding a hash of the desired object the operator last applied. A field the
/// operator stops setting (a removed `spec.node`, env var or resource limit) is invisible to
/// the "desired ⊆ existing" comparison; it changes the hash, so the child is applied again and
/// server-side apply removes the field.
pub(crate) const APPLIED_HASH_ANNOTATION: &str = "crd.questdb.io/applied-hash";

/// The metadata of a child as the caches hold it, read the same way whatever the form: a
/// child kept whole, or a [`Compacted`] one whose labels and owner references are shared.
pub(crate) trait CachedMeta {
    fn annotation(&self, key: &str) -> Option<&str>;
    fn label_map(&self) -> &BTreeMap<String, String>;
    fn owners(&self) -> &[OwnerReference];

    fn label(&self, key: &str) -> Option<&str> {
        self.label_map().get(key).map(String::as_str)
    }
}

/// A child kept whole (the PVC) and any object read live.
impl<K: Resource> CachedMeta for K {
    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations().get(key).map(String::as_str)
    }
    fn label_map(&self) -> &BTreeMap<String, String> {
        self.labels()
    }
    fn owners(&self) -> &[OwnerReference] {
        self.owner_references()
    }
}

/// A child kind the operator builds, with its own notion of "already as desired".
pub(crate) trait OwnedChild: Resource<DynamicType = ()> + Sized {
    /// Written with server-side apply, so a field the operator stops setting is removed. False
    /// for the PVC: most of its spec is immutable once bound, and only its size and metadata
    /// are ever written after creation (a JSON merge patch of exactly those).
    const SERVER_SIDE_APPLY: bool = true;

    /// What the caches hold of an existing child: the child itself, or a [`Compacted`] form
    /// of its own type (never the Kubernetes type with fields silently emptied).
    type Cached: Lookup<DynamicType = ()>
        + CachedMeta
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;

    /// The cached form of an existing child (the caches' transform, and a live read that
    /// the decision must be made on).
    fn to_cached(existing: Self) -> Self::Cached;

    /// Whether the spec/data of `existing` already holds everything the operator set in
    /// `desired` (metadata is compared separately by [`needs_update`]).
    fn spec_matches(desired: &Self, existing: &Self::Cached) -> bool;
}

/// An existing child as the caches hold it: its metadata, the part the operator compares as
/// canonical JSON text (or a digest), a fraction of the typed tree's memory, and `E`, the few
/// typed fields the controllers read. A reader gets what is there, or a compile error: there
/// is no empty pod template to be misled by.
#[derive(Clone, Debug)]
pub(crate) struct Compacted<K, E = ()> {
    /// Without labels, owner references and [`APPLIED_HASH_ANNOTATION`], held apart: read
    /// them through [`CachedMeta`]. Private, so no reader finds the fields empty.
    metadata: ObjectMeta,
    /// The labels and owner references, one copy for every child of a QuestDB.
    kin: Arc<Kin>,
    /// The applied hash, out of the annotations: it is most often their only entry, and an
    /// annotation map costs half a KiB before its first entry (six children per QuestDB).
    applied_hash: Option<Box<str>>,
    /// What [`OwnedChild::spec_matches`] compares.
    compared: Compared,
    /// The typed fields kept.
    pub kept: E,
    kind: std::marker::PhantomData<fn() -> K>,
}

/// A child's labels and owner references: every child of one QuestDB carries the same ones
/// (its selector labels and the user's, the controller reference to it), half a KiB a map
/// and a few hundred bytes a reference, held once for all of them.
#[derive(Clone, Debug, Default, PartialEq)]
struct Kin {
    labels: BTreeMap<String, String>,
    owners: Vec<OwnerReference>,
}

impl Eq for Kin {}

impl std::hash::Hash for Kin {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.labels.hash(state);
        for o in &self.owners {
            (&o.api_version, &o.kind, &o.name, &o.uid).hash(state);
            (o.controller, o.block_owner_deletion).hash(state);
        }
    }
}

static KIN: LazyLock<Table<Kin>> = LazyLock::new(Table::default);

#[derive(Clone, Debug)]
enum Compared {
    /// Canonical JSON, shared with the same child of every QuestDB made from the same spec.
    Json(Templated),
    /// SHA-256.
    Digest([u8; 32]),
}

impl<K, E> Compacted<K, E> {
    fn new(mut metadata: ObjectMeta, compared: Compared, kept: E) -> Self {
        let kin = KIN.intern(Kin {
            labels: metadata.labels.take().unwrap_or_default(),
            owners: metadata.owner_references.take().unwrap_or_default(),
        });
        let applied_hash = metadata
            .annotations
            .as_mut()
            .and_then(|a| a.remove(APPLIED_HASH_ANNOTATION))
            .map(Box::from);
        if metadata
            .annotations
            .as_ref()
            .is_some_and(BTreeMap::is_empty)
        {
            metadata.annotations = None;
        }
        Self {
            metadata,
            kin,
            applied_hash,
            compared,
            kept,
            kind: std::marker::PhantomData,
        }
    }

    /// The compared part as JSON.
    fn compared_json(&self) -> Value {
        match &self.compared {
            Compared::Json(text) => serde_json::from_str(&text.text()).unwrap_or(Value::Null),
            Compared::Digest(_) => Value::Null,
        }
    }

    fn compared_digest(&self) -> Option<&[u8; 32]> {
        match &self.compared {
            Compared::Digest(d) => Some(d),
            Compared::Json(_) => None,
        }
    }
}

impl<K, E> CachedMeta for Compacted<K, E> {
    fn annotation(&self, key: &str) -> Option<&str> {
        if key == APPLIED_HASH_ANNOTATION {
            return self.applied_hash.as_deref();
        }
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
    fn label_map(&self) -> &BTreeMap<String, String> {
        &self.kin.labels
    }
    fn owners(&self) -> &[OwnerReference] {
        &self.kin.owners
    }
}

impl<K, E> Compacted<K, E> {
    pub(crate) fn name_any(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }
    /// `metadata.generation`: what a controller's `observedGeneration` is compared with.
    pub(crate) fn generation(&self) -> Option<i64> {
        self.metadata.generation
    }
}

/// The caches' key: a [`Compacted`] is stored and looked up as the kind it was made from.
impl<K, E> Lookup for Compacted<K, E>
where
    K: Resource<DynamicType = ()>,
{
    type DynamicType = ();

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn name(&self) -> Option<Cow<'_, str>> {
        self.metadata.name.as_deref().map(Cow::Borrowed)
    }
    fn namespace(&self) -> Option<Cow<'_, str>> {
        self.metadata.namespace.as_deref().map(Cow::Borrowed)
    }
    fn resource_version(&self) -> Option<Cow<'_, str>> {
        self.metadata.resource_version.as_deref().map(Cow::Borrowed)
    }
    fn uid(&self) -> Option<Cow<'_, str>> {
        self.metadata.uid.as_deref().map(Cow::Borrowed)
    }
}

/// What the caches hold of a StatefulSet besides its metadata and compared spec: the replica
/// count (pausing and deletion read it) and the status (rollout, readiness).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StatefulSetKept {
    pub replicas: Option<i32>,
    pub status: Option<StatefulSetStatus>,
    /// A container of the pod template binds a host port (see
    /// [`crate::desired::statefulset::binds_host_ports`]).
    pub host_ports: bool,
    /// The database container's image: the version a change of `spec.image` upgrades from.
    pub image: Option<String>,
}

/// A StatefulSet as the caches hold it.
pub(crate) type CachedStatefulSet = Compacted<StatefulSet, StatefulSetKept>;

impl CachedStatefulSet {
    /// `spec.replicas` (1 when unset, as the apiserver defaults it).
    pub(crate) fn replicas(&self) -> i32 {
        self.kept.replicas.unwrap_or(1)
    }
}

fn canonical<T: Serialize>(spec: &T) -> Value {
    let mut v = to_json(spec);
    canonicalise_resources(&mut v);
    v
}

fn digest(value: &impl Serialize) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(to_json(value).to_string().as_bytes()).into()
}

/// Whether `existing` must be written to become `desired`: the operator's labels and
/// annotations missing or different, a different controller reference (adoption, or detaching a
/// retained PVC), a missing non-controller owner reference, or [`OwnedChild::spec_matches`] false.
/// Labels and annotations a user added to the child by hand are left alone.
pub(crate) fn needs_update<T: OwnedChild>(desired: &T, existing: &T::Cached) -> bool {
    !(meta_matches(desired.meta(), existing) && T::spec_matches(desired, existing))
}

fn meta_matches(desired: &ObjectMeta, cached: &impl CachedMeta) -> bool {
    let existing = cached.owners();
    map_subset(desired.labels.as_ref(), Some(cached.label_map()))
        && desired
            .annotations
            .iter()
            .flatten()
            .all(|(k, v)| cached.annotation(k) == Some(v.as_str()))
        && controller_ref(desired) == existing.iter().find(|r| is_controller(r))
        && owner_refs(desired)
            .filter(|r| !is_controller(r))
            .all(|r| existing.contains(r))
}

fn map_subset(
    desired: Option<&BTreeMap<String, String>>,
    existing: Option<&BTreeMap<String, String>>,
) -> bool {
    desired
        .into_iter()
        .flatten()
        .all(|(k, v)| existing.and_then(|e| e.get(k)) == Some(v))
}

fn owner_refs(meta: &ObjectMeta) -> impl Iterator<Item = &OwnerReference> {
    meta.owner_references.iter().flatten()
}

fn is_controller(r: &OwnerReference) -> bool {
    r.controller == Some(true)
}

fn controller_ref(meta: &ObjectMeta) -> Option<&OwnerReference> {
    owner_refs(meta).find(|r| is_controller(r))
}

/// Whether every value present in `desired` is equal in `existing`, recursively: objects may
/// have extra keys in `existing`; arrays must have the same length and match element by element;
/// numbers compare by value. A `null`, empty array or empty object in `desired` also matches an
/// absent key, because the API server drops empty fields.
pub(crate) fn json_subset(desired: &Value, existing: &Value) -> bool {
    match (desired, existing) {
        (Value::Object(d), Value::Object(e)) => d.iter().all(|(key, dv)| match e.get(key) {
            Some(ev) => json_subset(dv, ev) || (is_empty(dv) && ev.is_null()),
            None => is_empty(dv),
        }),
        (Value::Array(d), Value::Array(e)) => {
            d.len() == e.len() && d.iter().zip(e).all(|(dv, ev)| json_subset(dv, ev))
        }
        (Value::Number(d), Value::Number(e)) => d == e || d.as_f64() == e.as_f64(),
        (d, e) => d == e,
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn to_json<T: Serialize>(value: &T) -> Value {
    // The k8s-openapi types always serialize; Null would only make the comparison fail safe
    // (a write), never skip one.
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Rewrites every quantity under a `resources.limits`/`resources.requests` map into one
/// canonical spelling, so `1000m` (desired) equals `1` (stored by the API server).
fn canonicalise_resources(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "resources" {
                    for section in ["limits", "requests"] {
                        if let Some(Value::Object(quantities)) = child.get_mut(section) {
                            for q in quantities.values_mut() {
                                if let Some(n) = q.as_str().and_then(parse_quantity) {
                                    *q = Value::String(n.to_string());
                                }
                            }
                        }
                    }
                }
                canonicalise_resources(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(canonicalise_resources),
        _ => {}
    }
}

fn spec_subset<K, E, T: Serialize>(desired: &T, existing: &Compacted<K, E>) -> bool {
    json_subset(&canonical(desired), &existing.compared_json())
}

/// The compacted form of a child whose compared part is its spec, shared between databases
/// with the tokens that differ from one to the next cut out: its QuestDB's name (claim, config
/// map and service names, selector labels) and `tokens`.
fn compact_spec<K, E, T: Serialize>(
    metadata: ObjectMeta,
    spec: &T,
    kept: E,
    tokens: &[&str],
) -> Compacted<K, E> {
    let text = {
        let questdb = metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::api::labels::INSTANCE))
            .map(String::as_str);
        let mut all: Vec<&str> = questdb.into_iter().collect();
        all.extend_from_slice(tokens);
        Templated::new(&canonical(spec).to_string(), all)
    };
    Compacted::new(metadata, Compared::Json(text), kept)
}

/// What differs between the StatefulSets of two databases made from one spec besides their
/// names: the hashes of their config and credentials, the instance a dedicated pod is pinned
/// to, and the uid of the volume (QuestDB's snapshot instance id).
fn statefulset_tokens(spec: Option<&k8s_openapi::api::apps::v1::StatefulSetSpec>) -> Vec<&str> {
    let Some(template) = spec.map(|s| &s.template) else {
        return Vec::new();
    };
    let volume_uid = template
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter(|c| c.name == crate::desired::CONTAINER_NAME)
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == crate::desired::statefulset::SNAPSHOT_INSTANCE_ID_ENV)
        .and_then(|e| e.value.as_ref());
    let annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref());
    let hashes = [
        crate::desired::CONFIG_HASH_ANNOTATION,
        crate::desired::credentials::CREDENTIALS_HASH_ANNOTATION,
    ]
    .into_iter()
    .filter_map(|k| annotations?.get(k));
    let pin = template
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref()?.get(crate::desired::PIN_LABEL_KEY));
    hashes
        .chain(pin)
        .chain(volume_uid)
        .map(String::as_str)
        .collect()
}

impl OwnedChild for StatefulSet {
    /// The pod template is most of a StatefulSet's memory (about 18 KB typed, a few KB as
    /// JSON).
    type Cached = CachedStatefulSet;

    fn to_cached(existing: Self) -> Self::Cached {
        let host_ports = existing
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .is_some_and(|p| {
                p.containers
                    .iter()
                    .flat_map(|c| c.ports.iter().flatten())
                    .any(|p| p.host_port.is_some_and(|h| h > 0))
            });
        let image =
            crate::desired::statefulset::database_image(existing.spec.as_ref()).map(str::to_string);
        let kept = StatefulSetKept {
            image,
            replicas: existing.spec.as_ref().and_then(|s| s.replicas),
            status: existing.status,
            host_ports,
        };
        let tokens = statefulset_tokens(existing.spec.as_ref());
        compact_spec(existing.metadata, &existing.spec, kept, &tokens)
    }

    fn spec_matches(desired: &Self, existing: &Self::Cached) -> bool {
        spec_subset(&desired.spec, existing)
    }
}

impl OwnedChild for PodDisruptionBudget {
    /// Its status (what a drain would be told) is read from the apiserver, not cached.
    type Cached = Compacted<PodDisruptionBudget>;

    fn to_cached(existing: Self) -> Self::Cached {
        compact_spec(existing.metadata, &existing.spec, (), &[])
    }

    fn spec_matches(desired: &Self, existing: &Self::Cached) -> bool {
        spec_subset(&desired.spec, existing)
    }
}

impl OwnedChild for NetworkPolicy {
    type Cached = Compacted<NetworkPolicy>;

    fn to_cached(existing: Self) -> Self::Cached {
        compact_spec(existing.metadata, &existing.spec, (), &[])
    }

    fn spec_matches(desired: &Self, existing: &Self::Cached) -> bool {
        spec_subset(&desired.spec, existing)
    }
}

impl OwnedChild for ConfigMap {
    /// The files as a digest: equality is all the comparison needs.
    type Cached = Compacted<ConfigMap>;

    fn to_cached(existing: Self) -> Self::Cached {
        let data = existing.data.unwrap_or_default();
        Compacted::new(existing.metadata, Compared::Digest(digest(&data)), ())
    }

    /// The files must be exactly the built ones: a stray key would be mounted nowhere, but a
    /// changed one would be served to QuestDB.
    fn spec_matches(desired: &Self, existing: &Self::Cached) -> bool {
        existing.compared_digest() == Some(&digest(&desired.data.clone().unwrap_or_default()))
    }
}

impl OwnedChild for Service {
    type Cached = Compacted<Service>;

    /// The cluster IP the apiserver allocated is the one token of a Service besides its name.
    fn to_cached(existing: Self) -> Self::Cached {
        let ip = existing.spec.as_ref().and_then(|s| s.cluster_ip.as_deref());
        compact_spec(existing.metadata, &existing.spec, (), &Vec::from_iter(ip))
    }

    /// Ports and type as a subset (the server fills in clusterIP, nodePorts, policies), but the
    /// selector exactly: an extra selector label would silently route to nothing.
    fn spec_matches(desired: &Self, existing: &Self::Cached) -> bool {
        let want = canonical(&desired.spec);
        let have = existing.compared_json();
        let selector = |v: &Value| v.get("selector").cloned().filter(|s| !is_empty(s));
        json_subset(&want, &have) && selector(&want) == selector(&have)
    }
}

impl OwnedChild for PersistentVolumeClaim {
    const SERVER_SIDE_APPLY: bool = false;
    /// Kept whole: small, and its spec and status are read in many places.
    type Cached = PersistentVolumeClaim;

    fn to_cached(existing: Self) -> Self::Cached {
        existing
    }

    /// Only the requested size, and only upwards: volumes can be expanded but never shrunk,
    /// and the rest of a bound claim's spec is immutable.
    fn spec_matches(desired: &Self, existing: &Self) -> bool {
        match (requested_storage(desired), requested_storage(existing)) {
            (Some(want), Some(have)) => want <= have,
            // A desired size that does not parse is refused by validation before any build; a
            // stored claim without a size is repaired by a write.
            (None, _) => true,
            (Some(_), None) => false,
        }
    }
}

fn requested_storage(pvc: &PersistentVolumeClaim) -> Option<f64> {
    let quantity = pvc
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?;
    parse_quantity(&quantity.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::QuestDB;
    use crate::desired::testing::questdb;
    use crate::desired::{
        client_service, config_hash, config_map, headless_service, pvc_with_ownership, statefulset,
        PvcOwnership,
    };
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    /// `needs_update` on `existing` as the cache holds it ([`OwnedChild::to_cached`]).
    fn decides_alike<K: OwnedChild + Clone>(desired: &K, existing: &K) -> bool {
        needs_update(desired, &K::to_cached(existing.clone()))
    }

    #[test]
    fn the_cached_statefulset_says_whether_it_binds_host_ports() {
        for bind in [true, false] {
            let mut qdb = questdb("db1", "tenant-a");
            qdb.spec
                .node
                .get_or_insert_with(Default::default)
                .host_ports = Some(bind);
            let node = crate::desired::DedicatedNode::for_questdb(&qdb);
            let sts = statefulset(&qdb, "0f1e2d3c", None, true, Some(&node));
            assert_eq!(StatefulSet::to_cached(sts).kept.host_ports, bind);
        }
    }

    #[test]
    fn the_cached_form_keeps_what_the_controllers_read() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.paused = true;
        let existing = defaulted_sts(&sts(&qdb));
        let cached = StatefulSet::to_cached(existing.clone());
        assert_eq!(cached.replicas(), 0);
        assert_eq!(cached.kept.status, existing.status);
        assert_eq!(cached.label_map(), existing.labels());
        assert_eq!(cached.owners(), existing.owner_references());
        let rest = ObjectMeta {
            labels: None,
            owner_references: None,
            ..existing.metadata.clone()
        };
        assert_eq!(cached.metadata, rest);
        assert!(!needs_update(&sts(&qdb), &cached));
        let Compared::Json(text) = &cached.compared else {
            panic!("a StatefulSet compares its spec")
        };
        assert!(
            text.text().len() < serde_json::to_string(&existing).unwrap().len(),
            "smaller than the object"
        );
    }

    /// The applied hash is held apart from the annotations, and still decides.
    #[test]
    fn the_applied_hash_is_kept_apart_and_still_decides_a_write() {
        let qdb = questdb("db1", "tenant-a");
        let stamped = |hash: &str| {
            let mut cm = config_map(&qdb, true);
            cm.metadata
                .annotations
                .get_or_insert_default()
                .insert(APPLIED_HASH_ANNOTATION.into(), hash.into());
            cm
        };
        let cached = ConfigMap::to_cached(stamped("h1"));
        assert_eq!(cached.annotation(APPLIED_HASH_ANNOTATION), Some("h1"));
        assert_eq!(
            cached.metadata.annotations, None,
            "no map for the hash alone"
        );
        assert!(!needs_update(&stamped("h1"), &cached));
        assert!(needs_update(&stamped("h2"), &cached));
    }

    /// Every child of one database carries the same labels and owner reference: the caches
    /// hold them once for all of its children, and apart from any other database's.
    #[test]
    fn the_children_of_one_database_share_their_labels_and_owner_and_no_other_does() {
        let (one, two) = (
            questdb("payments", "tenant-a"),
            questdb("orders", "tenant-a"),
        );
        let sts_of = |q: &QuestDB| StatefulSet::to_cached(sts(q));
        let cm_of = |q: &QuestDB| ConfigMap::to_cached(config_map(q, true));
        let svc_of = |q: &QuestDB| Service::to_cached(headless_service(q));
        let (s1, c1, v1, s2) = (sts_of(&one), cm_of(&one), svc_of(&one), sts_of(&two));
        assert_eq!(s1.kin, c1.kin);
        assert_eq!(s1.kin, v1.kin);
        assert!(Arc::ptr_eq(&s1.kin, &c1.kin) && Arc::ptr_eq(&s1.kin, &v1.kin));
        assert!(!Arc::ptr_eq(&s1.kin, &s2.kin));
        assert_eq!(s1.label(crate::api::labels::INSTANCE), Some("payments"));
        assert_eq!(s2.label(crate::api::labels::INSTANCE), Some("orders"));
        assert_eq!(s1.owners(), sts(&one).owner_references());
        assert_eq!(s2.owners(), sts(&two).owner_references());
        assert!(!needs_update(&sts(&one), &s1));
        let mut two_as_one = sts(&one);
        two_as_one.metadata.owner_references = sts(&two).metadata.owner_references;
        assert!(
            needs_update(&two_as_one, &s1),
            "a StatefulSet of payments controlled by orders"
        );
    }

    /// The cached spec is shared between databases with its QuestDB's name cut out: each must
    /// still match only its own desired spec, or a database would never get its own fixed.
    #[test]
    fn databases_made_from_one_spec_share_the_cached_text_and_each_matches_only_its_own() {
        let (one, two) = (
            questdb("payments", "tenant-a"),
            questdb("orders", "tenant-a"),
        );
        // As the controller builds them: each on its own volume, whose uid the pod is told.
        let built = |q: &QuestDB| {
            let uid = format!(
                "0b7c{}-5d2e-4f51-9a8e-1c2d3e4f5a6b",
                q.metadata.name.as_deref().unwrap_or_default().len()
            );
            crate::desired::statefulset::with_volume_instance_id(sts(q), &uid)
        };
        let cached = |q: &QuestDB| StatefulSet::to_cached(defaulted_sts(&built(q)));
        let (c1, c2) = (cached(&one), cached(&two));
        let (Compared::Json(t1), Compared::Json(t2)) = (&c1.compared, &c2.compared) else {
            panic!("StatefulSets compare their specs")
        };
        assert_eq!(
            t1.text(),
            canonical(&defaulted_sts(&built(&one)).spec).to_string()
        );
        assert!(t1.shares_with(t2), "one text for both");
        assert!(!needs_update(&built(&one), &c1));
        assert!(!needs_update(&built(&two), &c2));
        let mut two_as_one = built(&one);
        two_as_one.metadata = built(&two).metadata;
        assert!(
            needs_update(&two_as_one, &c2),
            "orders' spec naming payments' volume"
        );
    }

    // ---- json_subset ----

    #[test]
    fn subset_allows_extra_keys_in_existing() {
        assert!(json_subset(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert!(json_subset(&json!({}), &json!({"b": 2})));
        assert!(!json_subset(&json!({"a": 1, "b": 2}), &json!({"a": 1})));
    }

    #[test]
    fn subset_compares_nested_values() {
        let existing = json!({"a": {"b": {"c": "x", "d": true}}});
        assert!(json_subset(&json!({"a": {"b": {"c": "x"}}}), &existing));
        assert!(!json_subset(&json!({"a": {"b": {"c": "y"}}}), &existing));
        assert!(!json_subset(&json!({"a": {"b": {"d": false}}}), &existing));
    }

    #[test]
    fn subset_requires_equal_array_lengths_and_elementwise_subsets() {
        let existing = json!([{"name": "a", "x": 1}, {"name": "b", "x": 2}]);
        assert!(json_subset(
            &json!([{"name": "a"}, {"name": "b"}]),
            &existing
        ));
        assert!(!json_subset(&json!([{"name": "a"}]), &existing));
        assert!(!json_subset(
            &json!([{"name": "b"}, {"name": "a"}]),
            &existing
        ));
        assert!(!json_subset(
            &json!([{"name": "a"}, {"name": "b"}, {"name": "c"}]),
            &existing
        ));
    }

    #[test]
    fn subset_treats_empty_desired_values_as_absent() {
        assert!(json_subset(&json!({"a": null}), &json!({})));
        assert!(json_subset(&json!({"a": []}), &json!({})));
        assert!(json_subset(&json!({"a": {}}), &json!({"a": null})));
        assert!(!json_subset(&json!({"a": [1]}), &json!({})));
        assert!(!json_subset(&json!({"a": "x"}), &json!({})));
        // A non-empty existing value is not "absent": an explicit empty list differs from it.
        assert!(!json_subset(&json!({"a": []}), &json!({"a": [1]})));
    }

    #[test]
    fn subset_compares_scalars_exactly_and_numbers_by_value() {
        assert!(json_subset(&json!(1), &json!(1.0)));
        assert!(!json_subset(&json!(1), &json!("1")));
        assert!(!json_subset(&json!("a"), &json!("A")));
        assert!(!json_subset(&json!(true), &json!(null)));
        assert!(!json_subset(&json!({"a": 1}), &json!([1])));
    }

    // ---- per-kind ----

    /// What the API server stores for a `desired` object: the desired fields plus `extra`
    /// (defaults, server metadata, status) merged in.
    fn stored<T: Serialize + DeserializeOwned>(desired: &T, extra: Value) -> T {
        let mut value = to_json(desired);
        merge(&mut value, extra);
        serde_json::from_value(value).unwrap_or_else(|e| panic!("bad fixture: {e}"))
    }

    fn merge(into: &mut Value, from: Value) {
        match (into, from) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (Value::Array(a), Value::Array(b)) => {
                for (x, y) in a.iter_mut().zip(b) {
                    merge(x, y);
                }
            }
            (slot, v) => *slot = v,
        }
    }

    fn server_metadata() -> Value {
        json!({"metadata": {
            "uid": "1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed",
            "resourceVersion": "4711",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "questdb-operator", "operation": "Update"}],
            "labels": {"added-by-hand": "yes"},
            "annotations": {"note": "added by hand"}
        }})
    }

    fn sts(qdb: &QuestDB) -> StatefulSet {
        let cm = config_map(qdb, true);
        statefulset(qdb, &config_hash(&[&cm]), None, true, None)
    }

    fn defaulted_sts(desired: &StatefulSet) -> StatefulSet {
        let with_meta = stored(desired, server_metadata());
        stored(
            &with_meta,
            json!({
                "spec": {
                    "revisionHistoryLimit": 10,
                    "updateStrategy": {"rollingUpdate": {"partition": 0}},
                    "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                    "template": {"spec": {
                        "restartPolicy": "Always",
                        "dnsPolicy": "ClusterFirst",
                        "schedulerName": "default-scheduler",
                        "containers": [{
                            "terminationMessagePath": "/dev/termination-log",
                            "readinessProbe": {"successThreshold": 1, "httpGet": {"scheme": "HTTP"}}
                        }],
                        "volumes": [{}, {"configMap": {"defaultMode": 420}}, {"configMap": {"defaultMode": 420}}]
                    }}
                },
                "status": {"replicas": 1, "readyReplicas": 1}
            }),
        )
    }

    #[test]
    fn server_defaults_never_make_a_statefulset_differ() {
        let desired = sts(&questdb("db1", "tenant-a"));
        assert!(!decides_alike(&desired, &defaulted_sts(&desired)));
    }

    #[test]
    fn canonicalised_quantities_do_not_make_a_statefulset_differ() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.resources = Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("1000m".to_string())),
                ("memory".to_string(), Quantity("4096Mi".to_string())),
            ])),
            ..ResourceRequirements::default()
        });
        let desired = sts(&qdb);
        let existing = stored(
            &desired,
            json!({"spec": {"template": {"spec": {
                "initContainers": [{"resources": {"requests": {"cpu": "1", "memory": "4Gi"}}}],
                "containers": [{"resources": {"requests": {"cpu": "1", "memory": "4Gi"}}}]
            }}}}),
        );
        assert!(!decides_alike(&desired, &existing));

        let bigger = stored(
            &existing,
            json!({"spec": {"template": {"spec": {
                "containers": [{"resources": {"requests": {"cpu": "2"}}}]
            }}}}),
        );
        assert!(decides_alike(&desired, &bigger));
    }

    #[test]
    fn statefulset_changes_that_matter_are_detected() {
        let qdb = questdb("db1", "tenant-a");
        let desired = sts(&qdb);
        let existing = defaulted_sts(&desired);

        let mut paused = qdb.clone();
        paused.spec.paused = true;
        assert!(decides_alike(&sts(&paused), &existing), "replicas");

        let mut upgraded = qdb.clone();
        upgraded.spec.image = "questdb/questdb:9.0.1".into();
        assert!(decides_alike(&sts(&upgraded), &existing), "image");

        let rehashed = statefulset(&qdb, "another-hash", None, true, None);
        assert!(decides_alike(&rehashed, &existing), "config hash");

        let hand_edited = stored(
            &existing,
            json!({"spec": {"template": {"spec": {"containers": [{"image": "evil/image:1"}]}}}}),
        );
        assert!(decides_alike(&desired, &hand_edited), "hand-edited image");
    }

    #[test]
    fn missing_operator_label_or_annotation_needs_a_write() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.metadata.annotations = Some([("owner".to_string(), "alice".to_string())].into());
        let desired = config_map(&qdb, true);
        let mut existing = stored(&desired, server_metadata());
        assert!(!decides_alike(&desired, &existing));

        existing
            .metadata
            .labels
            .as_mut()
            .map(|l| l.remove("app.kubernetes.io/instance"));
        assert!(decides_alike(&desired, &existing));

        let mut existing = stored(&desired, server_metadata());
        existing
            .metadata
            .annotations
            .as_mut()
            .map(|a| a.insert("owner".into(), "bob".into()));
        assert!(decides_alike(&desired, &existing));
    }

    #[test]
    fn an_orphan_child_needs_the_owner_reference_added() {
        let desired = config_map(&questdb("db1", "tenant-a"), true);
        let mut orphan = stored(&desired, server_metadata());
        orphan.metadata.owner_references = None;
        assert!(decides_alike(&desired, &orphan));
    }

    #[test]
    fn config_map_data_must_match_exactly() {
        let qdb = questdb("db1", "tenant-a");
        let desired = config_map(&qdb, true);
        let existing = stored(&desired, server_metadata());
        assert!(!decides_alike(&desired, &existing));

        assert!(decides_alike(&config_map(&qdb, false), &existing));

        let extra = stored(&desired, json!({"data": {"stray.conf": "x"}}));
        assert!(decides_alike(&desired, &extra));
    }

    #[test]
    fn service_defaults_are_ignored_but_selector_is_exact() {
        let qdb = questdb("db1", "tenant-a");
        let desired = client_service(&qdb);
        let existing = stored(
            &desired,
            json!({"spec": {
                "clusterIP": "10.96.12.7",
                "clusterIPs": ["10.96.12.7"],
                "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack",
                "sessionAffinity": "None",
                "internalTrafficPolicy": "Cluster"
            }}),
        );
        assert!(!decides_alike(&desired, &existing));

        let widened = stored(&existing, json!({"spec": {"selector": {"extra": "x"}}}));
        assert!(decides_alike(&desired, &widened));

        let renumbered = stored(&existing, json!({"spec": {"ports": [{"port": 19000}]}}));
        assert!(decides_alike(&desired, &renumbered));

        let headless = headless_service(&qdb);
        assert!(!decides_alike(
            &headless,
            &stored(&headless, server_metadata())
        ));
    }

    #[test]
    fn pvc_only_grows() {
        let mut qdb = questdb("db1", "tenant-a");
        let desired = pvc_with_ownership(&qdb, PvcOwnership::Owned);
        let existing = stored(
            &desired,
            json!({"spec": {"volumeName": "pvc-0a1b", "volumeMode": "Filesystem"},
                   "status": {"phase": "Bound", "capacity": {"storage": "50Gi"}}}),
        );
        assert!(!decides_alike(&desired, &existing));

        qdb.spec.volume.size = "100Gi".into();
        assert!(decides_alike(
            &pvc_with_ownership(&qdb, PvcOwnership::Owned),
            &existing
        ));

        qdb.spec.volume.size = "20Gi".into();
        assert!(!decides_alike(
            &pvc_with_ownership(&qdb, PvcOwnership::Owned),
            &existing
        ));

        qdb.spec.volume.size = "51200Mi".into();
        assert!(!decides_alike(
            &pvc_with_ownership(&qdb, PvcOwnership::Owned),
            &existing
        ));
    }

    #[test]
    fn detaching_a_retained_pvc_needs_a_write_and_then_is_stable() {
        let qdb = questdb("db1", "tenant-a");
        let owned = stored(
            &pvc_with_ownership(&qdb, PvcOwnership::Owned),
            server_metadata(),
        );
        let detached = pvc_with_ownership(&qdb, PvcOwnership::Detached);
        assert!(decides_alike(&detached, &owned));
        assert!(!decides_alike(
            &detached,
            &stored(&detached, server_metadata())
        ));
    }

    #[test]
    fn a_child_controlled_by_someone_else_differs() {
        let desired = client_service(&questdb("db1", "tenant-a"));
        let mut foreign = stored(&desired, server_metadata());
        if let Some(r) = foreign
            .metadata
            .owner_references
            .as_mut()
            .and_then(|r| r.first_mut())
        {
            r.uid = "someone-else".into();
        }
        assert!(decides_alike(&desired, &foreign));
    }
}

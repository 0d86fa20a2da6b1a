//! What the reconcilers read instead of the apiserver: the reflector stores, the Secrets'
//! metadata by namespace, and the in-memory verdicts the polls leave for the reconciles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::WriteHealthReason;
use crate::cache::compacted::OwnedChild;
use crate::controllers::keys::GuardedQuestDB;
use crate::ilp_auth::{KeyError, PublicKey};

/// A child as its cache holds it.
pub(crate) type Cached<K> = <K as OwnedChild>::Cached;

/// Reflector caches the reconcilers read instead of the apiserver.
#[derive(Clone)]
pub(crate) struct Caches {
    /// Guarded: one QuestDB that does not deserialize must not stop the watch of all others.
    pub questdbs: Store<GuardedQuestDB>,
    /// The operator's children, in the form [`OwnedChild::Cached`] says.
    pub statefulsets: Store<Cached<StatefulSet>>,
    pub configmaps: Store<Cached<ConfigMap>>,
    pub services: Store<Cached<Service>>,
    pub pvcs: Store<PersistentVolumeClaim>,
    pub pods: Store<crate::controllers::cached_pod::CachedPod>,
    pub network_policies: Store<Cached<NetworkPolicy>>,
    pub pdbs: Store<Cached<k8s_openapi::api::policy::v1::PodDisruptionBudget>>,
    pub nodes: Store<Node>,
    /// The kubelets' Leases in `kube-node-lease` (renewTime only), with a cloud provider.
    pub leases: Store<k8s_openapi::api::coordination::v1::Lease>,
    /// The refusal events that say why a database waits, one cache per reason watched.
    pub refusals: Vec<Store<crate::controllers::refusals::Refusal>>,
    /// Secrets, metadata only: Secret data of the whole cluster is never cached.
    pub secrets: SecretIndex,
    /// Dedicated instances by the QuestDB they serve, rebuilt when the QuestDB cache changes.
    pub owner_index: crate::controllers::node_health::owners::OwnerIndexCache,
}

/// The Secrets' metadata: one cache of every Secret the operator may list (the cluster's, or
/// the watched namespace's), or one per namespace of `--secret-namespaces`, so an install
/// grants Secret reads only in the namespaces its databases live in.
#[derive(Clone)]
pub(crate) struct SecretIndex {
    /// Each cache with the namespace it holds (`None`: every namespace it may list).
    stores: Vec<(Option<String>, Store<PartialObjectMeta<Secret>>)>,
}

impl SecretIndex {
    /// One cache of every Secret the operator lists.
    pub(crate) fn single(store: Store<PartialObjectMeta<Secret>>) -> Self {
        Self {
            stores: vec![(None, store)],
        }
    }

    /// One cache per namespace.
    pub(crate) fn per_namespace(stores: Vec<(String, Store<PartialObjectMeta<Secret>>)>) -> Self {
        Self {
            stores: stores.into_iter().map(|(ns, s)| (Some(ns), s)).collect(),
        }
    }

    fn store_of(&self, ns: &str) -> Option<&Store<PartialObjectMeta<Secret>>> {
        self.stores
            .iter()
            .find(|(held, _)| held.as_deref().is_none_or(|h| h == ns))
            .map(|(_, s)| s)
    }

    /// The Secret `r` names, when it is cached (never when its namespace is not read).
    pub(crate) fn get(
        &self,
        r: &ObjectRef<PartialObjectMeta<Secret>>,
    ) -> Option<Arc<PartialObjectMeta<Secret>>> {
        self.store_of(r.namespace.as_deref()?)?.get(r)
    }

    /// Every cached Secret of namespace `ns`.
    pub(crate) fn in_namespace(&self, ns: &str) -> Vec<Arc<PartialObjectMeta<Secret>>> {
        self.store_of(ns).map_or_else(Vec::new, |s| {
            s.state()
                .into_iter()
                .filter(|m| m.metadata.namespace.as_deref() == Some(ns))
                .collect()
        })
    }

    /// Once every cache has listed its Secrets.
    pub(crate) async fn wait_until_ready(&self) {
        for (_, store) in &self.stores {
            let _ = store.wait_until_ready().await;
        }
    }
}

/// Parsed public keys by Secret and resourceVersion, so a resync reads no Secret again. Holds
/// only the public half (`kid`, `x`, `y`) or the problem found.
pub(crate) type KeyCache = Mutex<HashMap<ObjectRef<Secret>, (String, Result<PublicKey, KeyError>)>>;

/// What each credentials Secret's data said, by Secret and resourceVersion: the check and
/// digest only, never a value.
pub(crate) type CredentialsCache =
    Mutex<HashMap<ObjectRef<Secret>, (String, crate::desired::credentials::Check)>>;

/// The newest `WriteHealthy` verdict per QuestDB, written by the write-health poll and read
/// by the QuestDB's reconcile.
pub(crate) type WriteHealth =
    Mutex<HashMap<ObjectRef<GuardedQuestDB>, crate::plan::conditions::Verdict<WriteHealthReason>>>;

/// What the write-health poll last saw of each QuestDB's volume: the file system's usage from
/// its node's kubelet (or why it could not be read) and the WAL tables QuestDB reports
/// suspended (`None`: QuestDB did not answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DiskObservation {
    pub usage: Result<crate::plan::disk::VolumeUsage, String>,
    pub suspended: Option<Vec<crate::plan::disk::SuspendedTable>>,
}

pub(crate) type DiskWatch = Mutex<HashMap<ObjectRef<GuardedQuestDB>, DiskObservation>>;

/// The newest `CheckpointReleased` verdict per QuestDB, written by the same poll.
pub(crate) type CheckpointWatch = Mutex<
    HashMap<
        ObjectRef<GuardedQuestDB>,
        crate::plan::conditions::Verdict<crate::api::CheckpointReason>,
    >,
>;

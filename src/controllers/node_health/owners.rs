//! Which QuestDB each dedicated instance serves, by instance id: built once per change of the
//! QuestDB cache rather than once per Node reconcile, so a kubelet renewal among 1,000
//! dedicated nodes costs lookups, not a walk over every QuestDB.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::QuestDB;
use crate::controllers::keys::{questdb_ref, GuardedQuestDB};

/// The database an instance serves, with the failover threshold it gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub questdb: ObjectRef<GuardedQuestDB>,
    pub threshold: Duration,
    /// The node readiness the QuestDB's status last recorded (`None` for a move's instances).
    pub recorded_ready: Option<bool>,
}

/// Instances by id: those databases run on, and the other instances of node moves under way.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnerIndex {
    /// `status.instanceId` of every QuestDB: databases at risk for the breaker.
    pub owners: HashMap<String, Owner>,
    /// The instances a node move leaves or moves to: not at risk for the breaker, but the move
    /// judges them dead or alive, and nothing else wakes it for them.
    pub movers: HashMap<String, Owner>,
}

impl OwnerIndex {
    /// `threshold`: the threshold a database's `unhealthyAfterSeconds` really gets.
    pub(crate) fn build<'a>(
        questdbs: impl IntoIterator<Item = &'a QuestDB>,
        threshold: impl Fn(i64) -> Duration,
    ) -> OwnerIndex {
        let mut index = OwnerIndex::default();
        for q in questdbs {
            let (Some(status), Some(questdb)) = (q.status.as_ref(), questdb_ref(q)) else {
                continue;
            };
            let threshold = threshold(q.spec.failover.unhealthy_after_seconds);
            if let Some(id) = status.instance_id.as_deref() {
                index.owners.insert(
                    id.to_string(),
                    Owner {
                        questdb: questdb.clone(),
                        threshold,
                        recorded_ready: status.node_ready,
                    },
                );
            }
            let Some(u) = status
                .node_move
                .as_ref()
                .filter(|_| crate::plan::node_move::active(status))
            else {
                continue;
            };
            for id in [u.old_instance_id.as_deref(), u.new_instance_id.as_deref()]
                .into_iter()
                .flatten()
            {
                index.movers.insert(
                    id.to_string(),
                    Owner {
                        questdb: questdb.clone(),
                        threshold,
                        recorded_ready: None,
                    },
                );
            }
        }
        index
    }
}

/// The index, rebuilt only when the QuestDB cache has changed since it was built. Clones share
/// it, as clones of the cache's store share the cache.
#[derive(Clone, Default)]
pub(crate) struct OwnerIndexCache {
    /// Bumped by the QuestDB watch after each event reaches the cache.
    changes: Arc<AtomicU64>,
    built: Arc<Mutex<Option<Built>>>,
}

/// The index and the change count it was built at.
type Built = (u64, Arc<OwnerIndex>);

impl OwnerIndexCache {
    /// What the QuestDB watch bumps.
    pub(crate) fn changes(&self) -> Arc<AtomicU64> {
        self.changes.clone()
    }

    /// The index as of the cache now. The count is read before the cache: an event that lands
    /// in between is in the index and only makes the next call rebuild it once more.
    pub(crate) fn get(
        &self,
        questdbs: &Store<GuardedQuestDB>,
        threshold: impl Fn(i64) -> Duration,
    ) -> Arc<OwnerIndex> {
        let seen = self.changes.load(Ordering::Acquire);
        let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, index)) = built.as_ref() {
            if *at == seen {
                return index.clone();
            }
        }
        let state = questdbs.state();
        let index = Arc::new(OwnerIndex::build(
            state.iter().filter_map(|g| g.0.as_ref().ok()),
            threshold,
        ));
        *built = Some((seen, index.clone()));
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NodeMovePhase, NodeMoveStatus, QuestDBStatus};
    use crate::desired::testing;
    use kube::runtime::watcher;

    fn running_on(name: &str, instance: &str) -> QuestDB {
        let mut q = testing::questdb(name, "ns");
        q.metadata.uid = Some(format!("uid-{name}"));
        q.status = Some(QuestDBStatus {
            instance_id: Some(instance.into()),
            node_ready: Some(true),
            ..QuestDBStatus::default()
        });
        q
    }

    fn threshold(s: i64) -> Duration {
        Duration::from_secs(s.max(40) as u64)
    }

    #[test]
    fn every_database_and_both_instances_of_an_active_move_are_indexed() {
        let a = running_on("a", "i-a");
        let mut b = running_on("b", "i-b");
        b.status.as_mut().unwrap().node_move = Some(NodeMoveStatus {
            phase: NodeMovePhase::Moving,
            old_instance_id: Some("i-b".into()),
            new_instance_id: Some("i-b2".into()),
            ..NodeMoveStatus::default()
        });
        let unplaced = testing::questdb("c", "ns");
        let index = OwnerIndex::build([&a, &b, &unplaced], threshold);
        assert_eq!(
            index
                .owners
                .keys()
                .collect::<std::collections::BTreeSet<_>>(),
            ["i-a", "i-b"]
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .iter()
                .collect()
        );
        assert_eq!(index.owners["i-a"].recorded_ready, Some(true));
        assert_eq!(index.movers["i-b2"].questdb.name, "b");
        assert_eq!(index.movers["i-b2"].recorded_ready, None);
    }

    #[test]
    fn a_database_moved_to_another_instance_is_found_there_once_the_cache_says_so() {
        let (store, mut writer) = kube::runtime::reflector::store::<GuardedQuestDB>();
        let cache = OwnerIndexCache::default();
        let apply = |w: &mut kube::runtime::reflector::store::Writer<GuardedQuestDB>,
                     q: QuestDB| {
            w.apply_watcher_event(&watcher::Event::Apply(kube::core::DeserializeGuard(Ok(q))));
            cache.changes().fetch_add(1, Ordering::AcqRel);
        };
        apply(&mut writer, running_on("a", "i-1"));
        assert!(cache.get(&store, threshold).owners.contains_key("i-1"));
        apply(&mut writer, running_on("a", "i-2"));
        let index = cache.get(&store, threshold);
        assert!(
            !index.owners.contains_key("i-1"),
            "the index kept the old instance"
        );
        assert_eq!(index.owners["i-2"].questdb.name, "a");
        // Unchanged cache: the same index, not a rebuild.
        assert!(Arc::ptr_eq(&index, &cache.get(&store, threshold)));
    }

    /// A kubelet renewal among 1,000 dedicated nodes costs a lookup: the index is built once
    /// per change of the QuestDB cache, never per Node reconcile.
    #[test]
    fn at_1000_databases_renewals_reuse_one_index_until_a_questdb_changes() {
        let (store, mut writer) = kube::runtime::reflector::store::<GuardedQuestDB>();
        let cache = OwnerIndexCache::default();
        let apply = |w: &mut kube::runtime::reflector::store::Writer<GuardedQuestDB>,
                     q: QuestDB| {
            w.apply_watcher_event(&watcher::Event::Apply(kube::core::DeserializeGuard(Ok(q))));
            cache.changes().fetch_add(1, Ordering::AcqRel);
        };
        for i in 0..1000 {
            apply(
                &mut writer,
                running_on(&format!("db-{i}"), &format!("i-{i}")),
            );
        }
        let index = cache.get(&store, threshold);
        assert_eq!(index.owners.len(), 1000);
        for _ in 0..1000 {
            assert!(Arc::ptr_eq(&index, &cache.get(&store, threshold)));
        }
        apply(&mut writer, running_on("db-7", "i-7b"));
        let rebuilt = cache.get(&store, threshold);
        assert!(!Arc::ptr_eq(&index, &rebuilt));
        assert_eq!(rebuilt.owners["i-7b"].questdb.name, "db-7");
        assert!(!rebuilt.owners.contains_key("i-7"));
        assert!(Arc::ptr_eq(&rebuilt, &cache.get(&store, threshold)));
    }
}

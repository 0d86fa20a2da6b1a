//! The controllers' key for a QuestDB, in a module of its own so shared state (the caches and
//! the indexes they hold) and the controllers can both name it without a module cycle.

use kube::runtime::reflector::ObjectRef;

use crate::api::QuestDB;

/// A QuestDB as the watch delivers it: parsed, or the metadata and the parse error.
pub(crate) type GuardedQuestDB = kube::core::DeserializeGuard<QuestDB>;

/// The controller's key for a QuestDB.
pub(crate) fn questdb_ref(qdb: &QuestDB) -> Option<ObjectRef<GuardedQuestDB>> {
    Some(ObjectRef::new(&qdb.metadata.name.clone()?).within(qdb.metadata.namespace.as_deref()?))
}

/// A poll's newest word on `qdb` (write health, the checkpoint watch, the volume's usage), as
/// the pollers keep it per QuestDB.
pub(crate) fn polled<V: Clone>(
    qdb: &QuestDB,
    by_questdb: &std::sync::Mutex<std::collections::HashMap<ObjectRef<GuardedQuestDB>, V>>,
) -> Option<V> {
    let key = questdb_ref(qdb)?;
    by_questdb
        .lock()
        .expect("poll results lock")
        .get(&key)
        .cloned()
}

/// `first`, doubled `n` times, never above `max`: how long a repeated look or write waits.
pub(crate) fn doubling(
    first: std::time::Duration,
    n: u32,
    max: std::time::Duration,
) -> std::time::Duration {
    first.saturating_mul(1u32 << n.min(16)).min(max)
}

//! A table of values held once however many cached objects hold them: the spec texts of
//! children made from one spec, the labels and owner references every child of one QuestDB
//! carries.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// Values no longer held outside the table are dropped when it has doubled since its last
/// sweep, so it never holds more than twice what is alive (and at least this many).
pub(crate) const MIN_SWEEP_AT: usize = 64;

#[derive(Debug)]
pub(crate) struct Table<T: ?Sized>(Mutex<Interned<T>>);

#[derive(Debug)]
struct Interned<T: ?Sized> {
    values: HashSet<Arc<T>>,
    sweep_at: usize,
}

impl<T: ?Sized> Default for Table<T> {
    fn default() -> Self {
        Self(Mutex::new(Interned {
            values: HashSet::new(),
            sweep_at: MIN_SWEEP_AT,
        }))
    }
}

impl<T: ?Sized + Eq + Hash> Table<T> {
    /// The table's copy of `value`, which becomes it if there is none.
    pub(crate) fn intern<V>(&self, value: V) -> Arc<T>
    where
        V: Borrow<T> + Into<Arc<T>>,
    {
        // A panic elsewhere while holding the lock cannot leave the set half-written.
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(shared) = t.values.get(value.borrow()) {
            return shared.clone();
        }
        let shared: Arc<T> = value.into();
        t.values.insert(shared.clone());
        if t.values.len() >= t.sweep_at {
            t.values.retain(|s| Arc::strong_count(s) > 1);
            t.sweep_at = (2 * t.values.len()).max(MIN_SWEEP_AT);
        }
        shared
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.0.lock().unwrap().values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_no_object_holds_are_swept_and_the_table_stays_bounded() {
        let table: Table<str> = Table::default();
        let kept: Vec<_> = (0..10).map(|i| table.intern(format!("kept {i}"))).collect();
        for i in 0..10 * MIN_SWEEP_AT {
            drop(table.intern(format!("gone {i}")));
            assert!(table.held() <= 2 * MIN_SWEEP_AT, "{} values", table.held());
        }
        for (i, k) in kept.iter().enumerate() {
            assert_eq!(&**k, format!("kept {i}"));
        }
    }

    #[test]
    fn equal_values_are_held_once() {
        let table: Table<str> = Table::default();
        let a = table.intern("payments".to_string());
        let b = table.intern("payments".to_string());
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(table.held(), 1);
    }
}

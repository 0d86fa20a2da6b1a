//! An in-process Route53 hosted zone with Route53's change semantics (a DELETE must match the
//! current record exactly; a CREATE of an existing name fails), which moto does not enforce.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::cloud::backend::{ChangeAction, RecordSet, Route53Api};
use crate::cloud::{display_name, fqdn, ARecord, ApiError};

#[derive(Debug, Default)]
struct State {
    /// `(zone id, fqdn, type) -> record set`.
    records: BTreeMap<(String, String, String), RecordSet>,
    throttle_next: u32,
    calls: Vec<&'static str>,
}

/// The fake DNS.
#[derive(Debug, Default)]
pub struct MemoryRoute53 {
    state: Mutex<State>,
}

impl MemoryRoute53 {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every A record of every zone, names without the trailing dot.
    pub fn records(&self) -> Vec<ARecord> {
        self.lock()
            .records
            .values()
            .filter(|r| r.kind == "A")
            .map(|r| ARecord {
                name: display_name(&r.name),
                ips: r.values.clone(),
                ttl: r.ttl,
            })
            .collect()
    }

    /// The TXT values at `name` (quoted, as Route53 stores them).
    pub fn txt(&self, name: &str) -> Vec<String> {
        self.lock()
            .records
            .values()
            .filter(|r| r.kind == "TXT" && r.name == fqdn(name))
            .flat_map(|r| r.values.clone())
            .collect()
    }

    /// Someone else's record set, put there behind the operator's back (another tenant, a
    /// person with the console).
    #[cfg(test)]
    pub(crate) fn put_foreign(&self, zone_id: &str, set: RecordSet) {
        let name = fqdn(&set.name);
        self.lock().records.insert(
            (zone_id.to_string(), name.clone(), set.kind.clone()),
            RecordSet { name, ..set },
        );
    }

    /// The next `n` calls fail with `Throttling`.
    pub fn throttle_next(&self, n: u32) {
        self.lock().throttle_next = n;
    }

    pub fn call_count(&self, operation: &str) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|op| **op == operation)
            .count()
    }

    fn begin(state: &mut State, operation: &'static str) -> Result<(), ApiError> {
        state.calls.push(operation);
        if state.throttle_next > 0 {
            state.throttle_next -= 1;
            return Err(ApiError::new("Throttling", "Rate exceeded"));
        }
        Ok(())
    }
}

#[async_trait]
impl Route53Api for MemoryRoute53 {
    async fn find(&self, zone_id: &str, name: &str) -> Result<Vec<RecordSet>, ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "ListResourceRecordSets")?;
        let name = fqdn(name);
        Ok(state
            .records
            .iter()
            .filter(|((z, n, _), _)| *z == zone_id && *n == name)
            .map(|(_, r)| r.clone())
            .collect())
    }

    /// All or nothing, as Route53 applies a batch: every change is checked against the state
    /// the earlier changes of the batch leave, and nothing is stored when one fails.
    async fn change(
        &self,
        zone_id: &str,
        changes: &[(ChangeAction, RecordSet)],
    ) -> Result<(), ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "ChangeResourceRecordSets")?;
        let mut next = state.records.clone();
        for (action, record) in changes {
            let name = fqdn(&record.name);
            let key = (zone_id.to_string(), name.clone(), record.kind.clone());
            let stored = RecordSet {
                name: name.clone(),
                ..record.clone()
            };
            let what = format!("[name='{name}', type='{}']", record.kind);
            match action {
                ChangeAction::Create if next.contains_key(&key) => {
                    return Err(ApiError::new(
                        "InvalidChangeBatch",
                        format!("Tried to create resource record set {what} but it already exists"),
                    ))
                }
                ChangeAction::Create | ChangeAction::Upsert => {
                    next.insert(key, stored);
                }
                ChangeAction::Delete => match next.get(&key) {
                    Some(current) if *current == stored => {
                        next.remove(&key);
                    }
                    Some(_) => {
                        return Err(ApiError::new(
                            "InvalidChangeBatch",
                            format!("Tried to delete resource record set {what} but the values provided do not match the current values"),
                        ))
                    }
                    None => {
                        return Err(ApiError::new(
                            "InvalidChangeBatch",
                            format!("Tried to delete resource record set {what} but it was not found"),
                        ))
                    }
                },
            }
        }
        state.records = next;
        Ok(())
    }
}

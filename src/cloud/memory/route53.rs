//! An in-process Route53 hosted zone with Route53's change semantics (a DELETE must match the
//! current record exactly; a CREATE of an existing name fails), which moto does not enforce.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::cloud::backend::{ChangeAction, Route53Api};
use crate::cloud::{display_name, fqdn, ARecord, ApiError};

#[derive(Debug, Default)]
struct State {
    /// `(zone id, fqdn) -> record`.
    records: BTreeMap<(String, String), ARecord>,
    throttle_next: u32,
    calls: Vec<&'static str>,
}

/// The fake DNS.
#[derive(Debug, Default)]
pub struct MemoryRoute53 {
    state: Mutex<State>,
}

impl MemoryRoute53 {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every record of every zone, names without the trailing dot.
    pub fn records(&self) -> Vec<ARecord> {
        self.lock()
            .records
            .values()
            .map(|r| ARecord {
                name: display_name(&r.name),
                ..r.clone()
            })
            .collect()
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
    async fn find_a(&self, zone_id: &str, name: &str) -> Result<Option<ARecord>, ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "ListResourceRecordSets")?;
        Ok(state
            .records
            .get(&(zone_id.to_string(), fqdn(name)))
            .cloned())
    }

    async fn change_a(
        &self,
        zone_id: &str,
        action: ChangeAction,
        record: &ARecord,
    ) -> Result<(), ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "ChangeResourceRecordSets")?;
        let key = (zone_id.to_string(), fqdn(&record.name));
        let stored = ARecord {
            name: key.1.clone(),
            ..record.clone()
        };
        match action {
            ChangeAction::Create if state.records.contains_key(&key) => Err(ApiError::new(
                "InvalidChangeBatch",
                format!(
                    "Tried to create resource record set [name='{}', type='A'] but it already exists",
                    key.1
                ),
            )),
            ChangeAction::Create | ChangeAction::Upsert => {
                state.records.insert(key, stored);
                Ok(())
            }
            ChangeAction::Delete => match state.records.get(&key) {
                Some(current) if *current == stored => {
                    state.records.remove(&key);
                    Ok(())
                }
                Some(_) => Err(ApiError::new(
                    "InvalidChangeBatch",
                    format!(
                        "Tried to delete resource record set [name='{}', type='A'] but the values provided do not match the current values",
                        key.1
                    ),
                )),
                None => Err(ApiError::new(
                    "InvalidChangeBatch",
                    format!(
                        "Tried to delete resource record set [name='{}', type='A'] but it was not found",
                        key.1
                    ),
                )),
            },
        }
    }
}

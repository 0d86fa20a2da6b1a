//! Test hooks at the HTTP layer: injected faults, request counting and cutting watches.
//! Requests from the simulator's own cluster behaviour carry [`INTERNAL_HEADER`] and are neither
//! counted nor faulted, so tests see only what the code under test does.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Marks requests made by the simulator itself.
pub const INTERNAL_HEADER: &str = "x-questdb-sim-internal";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Self::Create | Self::Update | Self::Patch | Self::Delete | Self::DeleteCollection
        )
    }
}

/// An injected failure: requests matching `verb`/`resource`/`name` (unset = any) wait `latency`
/// and then, if `status` is set, fail with it (a Kubernetes `Status` body). `times` limits how
/// many requests it hits.
#[derive(Debug, Clone, Default)]
pub struct Fault {
    pub verb: Option<Verb>,
    /// Plural, with `/status` for the subresource, e.g. `questdbs` or `questdbs/status`.
    pub resource: Option<String>,
    pub name: Option<String>,
    pub status: Option<u16>,
    pub latency: Option<Duration>,
    pub times: Option<usize>,
}

impl Fault {
    pub fn status(code: u16) -> Self {
        Self {
            status: Some(code),
            ..Self::default()
        }
    }
    pub fn latency(d: Duration) -> Self {
        Self {
            latency: Some(d),
            ..Self::default()
        }
    }
    pub fn on(mut self, verb: Verb, resource: &str) -> Self {
        self.verb = Some(verb);
        self.resource = Some(resource.to_string());
        self
    }
    pub fn on_resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_string());
        self
    }
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }

    fn matches(&self, verb: Verb, resource: &str, name: Option<&str>) -> bool {
        self.verb.is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
            && self.name.as_deref().is_none_or(|n| Some(n) == name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FaultId(u64);

/// Requests by (verb, resource) since the last reset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestCounts(pub BTreeMap<(Verb, String), u64>);

impl RequestCounts {
    pub fn get(&self, verb: Verb, resource: &str) -> u64 {
        self.0
            .get(&(verb, resource.to_string()))
            .copied()
            .unwrap_or(0)
    }
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
    pub fn writes(&self) -> u64 {
        self.0
            .iter()
            .filter(|((v, _), _)| v.is_write())
            .map(|(_, n)| n)
            .sum()
    }
    pub fn reads(&self) -> u64 {
        self.total() - self.writes()
    }
    /// Writes to one resource (all verbs), e.g. `writes_to("statefulsets")`.
    pub fn writes_to(&self, resource: &str) -> u64 {
        self.0
            .iter()
            .filter(|((v, r), _)| v.is_write() && r == resource)
            .map(|(_, n)| n)
            .sum()
    }
}

pub struct Hooks {
    next_id: AtomicU64,
    faults: Mutex<Vec<(FaultId, Fault)>>,
    counts: Mutex<BTreeMap<(Verb, String), u64>>,
    /// Bumped to make every open watch end.
    pub cut_watches: tokio::sync::watch::Sender<u64>,
}

impl Default for Hooks {
    fn default() -> Self {
        Self {
            next_id: AtomicU64::new(1),
            faults: Mutex::default(),
            counts: Mutex::default(),
            cut_watches: tokio::sync::watch::channel(0).0,
        }
    }
}

/// What an injected fault asks the request to do.
#[derive(Debug, Default, PartialEq)]
pub struct FaultEffect {
    pub latency: Option<Duration>,
    pub status: Option<u16>,
}

impl Hooks {
    pub fn inject(&self, f: Fault) -> FaultId {
        let id = FaultId(self.next_id.fetch_add(1, Ordering::Relaxed));
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, f));
        id
    }

    pub fn remove(&self, id: FaultId) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(i, _)| *i != id);
    }

    pub fn clear(&self) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The first matching fault, consuming one of its `times`.
    pub fn fault_for(&self, verb: Verb, resource: &str, name: Option<&str>) -> FaultEffect {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pos) = faults
            .iter()
            .position(|(_, f)| f.matches(verb, resource, name))
        else {
            return FaultEffect::default();
        };
        let f = &mut faults[pos].1;
        let effect = FaultEffect {
            latency: f.latency,
            status: f.status,
        };
        if let Some(t) = f.times.as_mut() {
            *t = t.saturating_sub(1);
            if *t == 0 {
                faults.remove(pos);
            }
        }
        effect
    }

    pub fn count(&self, verb: Verb, resource: &str) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((verb, resource.to_string()))
            .or_default() += 1;
    }

    pub fn counts(&self) -> RequestCounts {
        RequestCounts(
            self.counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    pub fn reset_counts(&self) {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    pub fn cut(&self) {
        self.cut_watches.send_modify(|n| *n += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limited_faults_expire_and_filters_apply() {
        let h = Hooks::default();
        h.inject(Fault::status(500).on(Verb::Get, "pods").named("a").times(1));
        assert_eq!(h.fault_for(Verb::Get, "pods", Some("b")).status, None);
        assert_eq!(h.fault_for(Verb::List, "pods", None).status, None);
        assert_eq!(h.fault_for(Verb::Get, "pods", Some("a")).status, Some(500));
        assert_eq!(h.fault_for(Verb::Get, "pods", Some("a")).status, None);
    }
}

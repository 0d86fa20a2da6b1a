//! Reconciles in flight, globally and per object, with their high-water marks.
//!
//! kube-runtime promises never to run two reconciles of one object at once; this keeps the
//! promise checked in production (an error is logged if it ever breaks) and lets tests prove it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
pub struct InFlight {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    per_object: HashMap<String, usize>,
    total: usize,
    max_total: usize,
    max_per_object: usize,
}

impl InFlight {
    pub(crate) fn enter(self: &Arc<Self>, key: String) -> InFlightGuard {
        let mut s = self.state.lock().expect("in-flight lock");
        s.total += 1;
        s.max_total = s.max_total.max(s.total);
        let n = s.per_object.entry(key.clone()).or_default();
        *n += 1;
        let n = *n;
        s.max_per_object = s.max_per_object.max(n);
        if n > 1 {
            tracing::error!(object = %key, "two reconciles of one object at once");
        }
        InFlightGuard {
            owner: Arc::clone(self),
            key,
        }
    }

    /// The most reconciles that ever ran at the same time.
    pub fn max_total(&self) -> usize {
        self.state.lock().expect("in-flight lock").max_total
    }

    /// The most reconciles of a single object that ever ran at the same time (must stay 1).
    pub fn max_per_object(&self) -> usize {
        self.state.lock().expect("in-flight lock").max_per_object
    }
}

pub(crate) struct InFlightGuard {
    owner: Arc<InFlight>,
    key: String,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let mut s = self.owner.state.lock().expect("in-flight lock");
        s.total -= 1;
        if let Some(n) = s.per_object.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                s.per_object.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_high_water_marks() {
        let f = Arc::new(InFlight::default());
        let a = f.enter("ns/a".into());
        let b = f.enter("ns/b".into());
        drop(a);
        let a2 = f.enter("ns/a".into());
        assert_eq!(f.max_total(), 2);
        assert_eq!(f.max_per_object(), 1);
        let a3 = f.enter("ns/a".into());
        assert_eq!(f.max_per_object(), 2);
        drop((a2, a3, b));
        assert_eq!(f.state.lock().unwrap().total, 0);
        assert!(f.state.lock().unwrap().per_object.is_empty());
    }
}

//! The QuestDB's status write and its coalescing: the status is computed purely
//! (`status::compute`) and replaced only when it differs; progress within a phase (a pod
//! placed, then ready) waits out a window after the last write, so a database on its way costs
//! a write or two, not one per step.

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::ResourceExt;
use tracing::{debug, warn};

use super::{container_state, status};
use crate::api::{QuestDB, ReadyReason};
use crate::controllers::context::Context;
use crate::controllers::own_writes;
use crate::controllers::Error;

/// A database on its way (a pod created, then placed once the scheduler's retry finds its
/// claim bound, 1-2 s later) passes through states a person at a terminal cannot tell apart;
/// each write is one more for the apiserver and etcd, at a thousand databases thousands.
/// The first such progress waits this long after the last write: past the scheduler's first
/// retry (1-2 s), and as long as a database on an idle cluster takes to start, so most start
/// with one write of progress at most.
pub(crate) const STATUS_COALESCE: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest progress waits: a database that stays on its way (a thousand created at once,
/// a volume slow to attach) still shows where it is twice a minute.
pub(crate) const STATUS_COALESCE_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// How long progress is held back once seen, however long ago the last write was: the steps
/// of a database on its way come in bursts (placed on a node, then ready a second or two later:
/// half of them within 2 s at 200 databases created at once), and a burst is one write.
pub const STATUS_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// A QuestDB's last status write, how many progress-only writes came since the last write of
/// a change (a phase, a condition's status), and since when progress not yet written waits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StatusWrite {
    pub at: std::time::Instant,
    pub progress: u32,
    pub held: Option<std::time::Instant>,
}

impl StatusWrite {
    /// How long progress waits after this write: doubling with each progress-only write
    /// since the last change, from [`STATUS_COALESCE`] up to [`STATUS_COALESCE_MAX`]. A
    /// database that takes a minute to start costs four progress writes, not twelve.
    pub(crate) fn window(&self) -> std::time::Duration {
        crate::controllers::keys::doubling(STATUS_COALESCE, self.progress, STATUS_COALESCE_MAX)
    }

    /// How much longer progress seen `now` waits: until the window after the last write has
    /// passed and the progress has settled for [`STATUS_SETTLE`]. `None`: write it now.
    pub(crate) fn wait(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        let window = self
            .window()
            .checked_sub(now.saturating_duration_since(self.at));
        let held = self.held.unwrap_or(now);
        let settle = STATUS_SETTLE.checked_sub(now.saturating_duration_since(held));
        window.max(settle).filter(|w| !w.is_zero())
    }

    /// Whether this entry still decides anything: a window or a settle not yet over.
    pub(crate) fn live(&self, now: std::time::Instant) -> bool {
        now.saturating_duration_since(self.at) < STATUS_COALESCE_MAX
            || self
                .held
                .is_some_and(|h| now.saturating_duration_since(h) < STATUS_SETTLE)
    }
}

/// Whether a status write may wait (see [`STATUS_COALESCE`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Coalesce {
    /// Progress within a phase waits out the window after the last write.
    Progress,
    /// Written now: the caller does not look again soon.
    Never,
}

/// Replaces the status only when it differs; `replace_status` carries the cached
/// resourceVersion so a concurrent writer yields a conflict instead of being overwritten.
/// `Ok(Some(wait))`: progress held back for `wait` (the caller looks again then).
pub(super) async fn write_status(
    qdb: &QuestDB,
    ctx: &Context,
    inputs: &status::StatusInputs<'_>,
    coalesce: Coalesce,
) -> Result<Option<std::time::Duration>, Error> {
    let new = status::compute(qdb, inputs, Timestamp::now());
    let old = qdb.status.clone().unwrap_or_default();
    if old == new {
        return Ok(None);
    }
    let key = crate::controllers::context::questdb_ref(qdb);
    let last = key.as_ref().and_then(|k| {
        ctx.status_writes
            .lock()
            .expect("status writes lock")
            .get(k)
            .copied()
    });
    let progress = status::progress_only(&old, &new);
    if coalesce == Coalesce::Progress && progress {
        let now = std::time::Instant::now();
        // Nothing remembered (a restart, or the last write long ago): the window is over, the
        // settle starts now.
        let mut entry = last.unwrap_or(StatusWrite {
            at: now.checked_sub(STATUS_COALESCE_MAX).unwrap_or(now),
            progress: 0,
            held: None,
        });
        if let Some(wait) = entry.wait(now) {
            entry.held = entry.held.or(Some(now));
            if let Some(k) = &key {
                remember(ctx, k.clone(), entry);
            }
            return Ok(Some(wait.max(std::time::Duration::from_millis(50))));
        }
    }
    let mut obj = qdb.clone();
    obj.status = Some(new.clone());
    let api: Api<QuestDB> =
        Api::namespaced(ctx.client.clone(), &qdb.namespace().unwrap_or_default());
    own_writes::replace_status(&api, &obj)
        .await
        .map_err(Error::from_status_write)?;
    debug!(
        questdb = %qdb.name_any(),
        phase = ?new.phase,
        changed = %changed_conditions(&old, &new),
        node = new.node_name.as_deref().unwrap_or(""),
        "status written"
    );
    if let Some(k) = key {
        let progress = match last {
            Some(w) if progress => w.progress.saturating_add(1),
            _ => 0,
        };
        let written = StatusWrite {
            at: std::time::Instant::now(),
            progress,
            held: None,
        };
        remember(ctx, k, written);
    }
    // Counted once it is written: a conflict retry would otherwise count the same transition
    // twice.
    ctx.metrics_conditions(&old.conditions, &new.conditions);
    report_container_trouble(qdb, ctx, &old, &new).await;
    Ok(None)
}

fn remember(
    ctx: &Context,
    key: kube::runtime::reflector::ObjectRef<crate::controllers::keys::GuardedQuestDB>,
    write: StatusWrite,
) {
    let mut writes = ctx.status_writes.lock().expect("status writes lock");
    // Only entries whose window or settle still runs matter: the map stays as small as the
    // burst.
    if writes.len() >= 64 {
        let now = std::time::Instant::now();
        writes.retain(|_, w| w.live(now));
    }
    writes.insert(key, write);
}

/// `Type=Status/Reason` of each condition a status write changed, for the debug log.
fn changed_conditions(old: &crate::api::QuestDBStatus, new: &crate::api::QuestDBStatus) -> String {
    new.conditions
        .iter()
        .filter(|n| {
            !old.conditions.iter().any(|o| {
                o.type_ == n.type_
                    && o.status == n.status
                    && o.reason == n.reason
                    && o.message == n.message
            })
        })
        .map(|c| format!("{}={}/{}", c.type_, c.status, c.reason))
        .collect::<Vec<_>>()
        .join(",")
}

/// One Warning event (and log line) per distinct cause of a database that cannot run: the
/// same exit code over and over is one event, a new cause another.
async fn report_container_trouble(
    qdb: &QuestDB,
    ctx: &Context,
    old: &crate::api::QuestDBStatus,
    new: &crate::api::QuestDBStatus,
) {
    let ready = |s: &crate::api::QuestDBStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == crate::api::conditions::READY)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let Some((reason, message)) = ready(new) else {
        return;
    };
    let Some(reason) = ReadyReason::parse(&reason).and_then(container_state::event_reason) else {
        return;
    };
    let cause = container_state::Trouble::cause(&message);
    let seen = ready(old)
        .is_some_and(|(r, m)| r == reason && container_state::Trouble::cause(&m) == cause);
    if seen {
        return;
    }
    warn!(questdb = %qdb.name_any(), %reason, cause, "the database cannot run");
    ctx.event(qdb, EventType::Warning, reason, "Run", message)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_of_a_database_slow_to_start_is_written_ever_less_often_but_at_least_twice_a_minute()
    {
        let at = std::time::Instant::now();
        let windows: Vec<u64> = (0..8)
            .map(|progress| {
                StatusWrite {
                    at,
                    progress,
                    held: None,
                }
                .window()
                .as_secs()
            })
            .collect();
        assert_eq!(windows, [5, 10, 20, 30, 30, 30, 30, 30]);
        assert_eq!(
            StatusWrite {
                at,
                progress: u32::MAX,
                held: None,
            }
            .window(),
            STATUS_COALESCE_MAX
        );
    }

    /// A database placed on its node and ready a second later is one write, not two: progress
    /// waits [`STATUS_SETTLE`] after it is first seen, even long after the last write.
    #[test]
    fn progress_waits_to_settle_even_long_after_the_last_write() {
        let start = std::time::Instant::now();
        let secs = std::time::Duration::from_secs;
        let long_ago = StatusWrite {
            at: start,
            progress: 0,
            held: None,
        };
        let later = start + secs(120);
        assert_eq!(long_ago.wait(later), Some(STATUS_SETTLE));
        let held = StatusWrite {
            held: Some(later),
            ..long_ago
        };
        assert_eq!(held.wait(later + secs(2)), Some(secs(3)));
        assert_eq!(held.wait(later + STATUS_SETTLE), None);
        assert!(held.live(later + secs(4)));
        assert!(!held.live(later + STATUS_SETTLE));

        // Soon after a write, the window decides.
        let just_written = StatusWrite {
            at: later,
            progress: 2,
            held: Some(later + secs(1)),
        };
        assert_eq!(just_written.wait(later + secs(6)), Some(secs(14)));
    }
}

//! EC2's scheduled events of the dedicated instances: a retirement, a stop, a reboot or power
//! maintenance AWS announced for an instance a database runs on. Read every
//! `--scheduled-event-interval` (one `DescribeInstanceStatus` for the whole operator); the
//! earliest pending event of each database's instance is kept in
//! [`CloudRuntime::scheduled_events`](super::cloud_runtime::CloudRuntime) and a change wakes
//! that database's reconcile, whose node move replaces the node in the maintenance window and
//! before the event's start (`plan::node_move::should_start`). Runs on the leader only.
//!
//! Left to happen, each of these events costs the database more than a planned move does: a
//! stop or retirement stops the instance at AWS's time (an unplanned failover, after the
//! failover threshold), and a reboot restarts it with whatever the kernel had not written back
//! lost (QuestDB's default `nosync`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kube::runtime::events::EventType;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::{EventReason, QuestDB};
use crate::cloud::ScheduledEvent;
use crate::controllers::context::Context;
use crate::controllers::keys::questdb_ref;

/// The earliest pending event of each of `ours` (instance ids), from everything EC2 reported.
pub(crate) fn earliest_per_instance(
    events: &[ScheduledEvent],
    ours: &HashSet<String>,
) -> HashMap<String, ScheduledEvent> {
    let mut found: HashMap<String, ScheduledEvent> = HashMap::new();
    for e in events
        .iter()
        .filter(|e| e.pending() && ours.contains(&e.instance_id))
    {
        let earlier = found.get(&e.instance_id).is_none_or(|held| {
            // An event without a start counts as due now: the soonest is the one to plan for.
            e.not_before.unwrap_or(std::time::UNIX_EPOCH)
                < held.not_before.unwrap_or(std::time::UNIX_EPOCH)
        });
        if earlier {
            found.insert(e.instance_id.clone(), e.clone());
        }
    }
    found
}

/// The instances whose event appeared, changed or went away between two looks.
pub(crate) fn changed(
    before: &HashMap<String, ScheduledEvent>,
    after: &HashMap<String, ScheduledEvent>,
) -> Vec<String> {
    let mut ids: Vec<String> = before
        .keys()
        .chain(after.keys())
        .filter(|id| before.get(*id) != after.get(*id))
        .cloned()
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// A line naming the event for conditions, events and logs.
pub(crate) fn describe(e: &ScheduledEvent) -> String {
    format!(
        "{} ({})",
        crate::plan::node_move::describe_event(e),
        e.description
    )
}

/// Reads the events every interval until `token` is cancelled.
pub(crate) async fn run(ctx: Arc<Context>, token: CancellationToken) {
    let Some(cloud) = ctx.cloud.clone() else {
        return;
    };
    let period = cloud.settings.scheduled_event_interval;
    // The first look waits one interval, as the orphan sweep's does: a restart (a new leader)
    // costs no extra AWS call, and AWS announces its events days ahead.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let events = match cloud.nodes.scheduled_events().await {
            Ok(events) => events,
            Err(e) => {
                // The last look stands: an event is announced days ahead, a look missed costs
                // one interval.
                warn!(error = %e, "cannot read EC2's scheduled events; the last look stands");
                continue;
            }
        };
        let questdbs: Vec<QuestDB> = ctx
            .caches
            .questdbs
            .state()
            .iter()
            .filter_map(|g| g.0.as_ref().ok())
            .filter(|q| q.spec.node.is_some())
            .cloned()
            .collect();
        let owner: HashMap<String, &QuestDB> = questdbs
            .iter()
            .filter_map(|q| Some((q.status.as_ref()?.instance_id.clone()?, q)))
            .collect();
        let ours: HashSet<String> = owner.keys().cloned().collect();
        let found = earliest_per_instance(&events, &ours);
        let before = std::mem::replace(
            &mut *cloud
                .scheduled_events
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            found.clone(),
        );
        for id in changed(&before, &found) {
            let Some(qdb) = owner.get(&id) else {
                continue;
            };
            if let Some(e) = found.get(&id) {
                let line = describe(e);
                info!(questdb = %qdb.metadata.name.clone().unwrap_or_default(), event = %line, "scheduled event");
                ctx.event(
                    qdb,
                    EventType::Warning,
                    EventReason::ScheduledEvent,
                    "PlanNodeMove",
                    format!("{line}: the node is replaced by a planned move in the maintenance window, before the event"),
                )
                .await;
            }
            if let Some(key) = questdb_ref(qdb) {
                ctx.wake_questdb(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn event(
        instance: &str,
        id: &str,
        code: &str,
        at_secs: u64,
        description: &str,
    ) -> ScheduledEvent {
        ScheduledEvent {
            instance_id: instance.into(),
            id: Some(id.into()),
            code: code.into(),
            description: description.into(),
            not_before: Some(UNIX_EPOCH + Duration::from_secs(at_secs)),
            not_after: None,
        }
    }

    #[test]
    fn only_pending_events_of_our_instances_are_kept_the_earliest_of_each() {
        let events = [
            event(
                "i-ours",
                "e-late",
                "system-reboot",
                2_000,
                "Scheduled reboot",
            ),
            event(
                "i-ours",
                "e-soon",
                "instance-retirement",
                1_000,
                "Degraded hardware",
            ),
            event("i-ours", "e-done", "instance-stop", 10, "[Completed] Stop"),
            event("i-theirs", "e-other", "instance-stop", 5, "Stop"),
            event(
                "i-second",
                "e-gone",
                "instance-reboot",
                7,
                "[Canceled] Reboot",
            ),
        ];
        let ours: HashSet<String> = ["i-ours".into(), "i-second".into()].into();
        let found = earliest_per_instance(&events, &ours);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found["i-ours"].id.as_deref(), Some("e-soon"));
    }

    #[test]
    fn a_new_a_rescheduled_and_a_vanished_event_each_wake_their_database() {
        let before: HashMap<String, ScheduledEvent> = [
            (
                "i-a".to_string(),
                event("i-a", "e1", "instance-stop", 100, "Stop"),
            ),
            (
                "i-b".to_string(),
                event("i-b", "e2", "system-reboot", 100, "Reboot"),
            ),
            (
                "i-c".to_string(),
                event("i-c", "e3", "instance-stop", 100, "Stop"),
            ),
        ]
        .into();
        let after: HashMap<String, ScheduledEvent> = [
            (
                "i-a".to_string(),
                event("i-a", "e1", "instance-stop", 100, "Stop"),
            ),
            (
                "i-b".to_string(),
                event("i-b", "e2", "system-reboot", 500, "Reboot"),
            ),
            (
                "i-d".to_string(),
                event("i-d", "e4", "instance-retirement", 100, "Retire"),
            ),
        ]
        .into();
        assert_eq!(changed(&before, &after), ["i-b", "i-c", "i-d"]);
        assert!(changed(&after, &after).is_empty());
    }
}

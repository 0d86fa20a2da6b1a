//! Status records of the cloud steps: each is written (with the object's resourceVersion)
//! before the side effect it announces, and an event goes out only when a condition is news.

use kube::api::Api;
use kube::runtime::events::EventType;
use kube::ResourceExt;
use tracing::info;

use crate::api::{
    ConditionReason, EventReason, FailoverPhase, FailoverStatus, NodeMovePhase, NodeMoveStatus,
    QuestDB, QuestDBStatus,
};
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::plan::conditions::Verdict;
use crate::plan::{failover, node_move};
use crate::runtime::clock;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Writes `edit` of the status (with the object's resourceVersion, so a stale view of the
/// status yields a conflict instead of being acted on) and continues with the stored object.
pub(crate) async fn persist(
    qdb: &mut QuestDB,
    ctx: &Context,
    edit: impl FnMut(&mut QuestDBStatus),
) -> Result<(), Error> {
    let api: Api<QuestDB> =
        Api::namespaced(ctx.client.clone(), &qdb.namespace().unwrap_or_default());
    persist_to(&api, qdb, edit).await
}

async fn persist_to(
    api: &Api<QuestDB>,
    qdb: &mut QuestDB,
    mut edit: impl FnMut(&mut QuestDBStatus),
) -> Result<(), Error> {
    // A user's edit of the spec or metadata between two writes of one reconcile bumps
    // resourceVersion: the record of a side effect already done (a DNS record written, an
    // instance switched) must not be lost to that conflict, so the edit is applied again to
    // the object as it is now. But only while its status is the one the edit was decided on:
    // a status written meanwhile (a previous leader finishing a write, a step recorded by
    // another term) makes the decision stale, and the reconcile decides again from the fresh
    // object instead of overwriting it.
    for attempt in 0.. {
        let mut obj = qdb.clone();
        let mut status = obj.status.take().unwrap_or_default();
        edit(&mut status);
        obj.status = Some(status);
        match crate::controllers::own_writes::replace_status(api, &obj).await {
            Ok(written) => {
                *qdb = written;
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 3 => {
                let fresh = api.get(&qdb.name_any()).await.map_err(Error::Kube)?;
                let decided_on = qdb.status.clone();
                *qdb = fresh;
                if !same_status(qdb.status.as_ref(), decided_on.as_ref()) {
                    info!(questdb = %qdb.name_any(), "status changed under a decision; deciding again");
                    return Err(Error::Conflict);
                }
            }
            Err(e) => return Err(Error::from_status_write(e)),
        }
    }
    unreachable!("the loop returns")
}

/// Whether two statuses record the same thing, ignoring `observedGeneration` (a spec edit
/// moves it without changing what the operator recorded).
fn same_status(a: Option<&QuestDBStatus>, b: Option<&QuestDBStatus>) -> bool {
    let strip = |s: Option<&QuestDBStatus>| {
        s.cloned().map(|mut s| {
            s.observed_generation = None;
            s
        })
    };
    strip(a) == strip(b)
}

/// The condition already says this: its event was sent when it first did.
pub(crate) fn already_reported<R: ConditionReason>(status: &QuestDBStatus, c: &Verdict<R>) -> bool {
    status
        .conditions
        .iter()
        .any(|k| k.type_ == R::CONDITION && k.reason == c.reason.into() && k.message == c.message)
}

/// A multi-step operation recorded in status (`status.failover`, `status.nodeMove`): each step
/// is entered by one status write (phase, start time, message cleared), then an event, and the
/// step it leaves is timed into its duration histogram.
pub(crate) trait StepRecord: Clone {
    /// The record's steps.
    type Phase: Copy + std::fmt::Display + Into<&'static str>;
    /// The event action ("Failover", "NodeMove").
    const ACTION: &'static str;
    fn of(status: &mut QuestDBStatus) -> Option<&mut Self>;
    fn phase(&self) -> Self::Phase;
    fn phase_started_at(&self) -> Option<&Time>;
    fn set_phase(&mut self, phase: Self::Phase, started_at: Time);
    fn set_message(&mut self, message: Option<String>);
    /// The event reason of entering `phase`.
    fn step_reason(phase: Self::Phase) -> EventReason;
    /// The event note of entering `phase`.
    fn step_note(&self, phase: Self::Phase) -> String;
    fn time_step(ctx: &Context, phase: Self::Phase, took: std::time::Duration);
}

/// Leaves the record's current step for `next`: times the step left, records `next` (before
/// anything `next` does), then says so in an event.
pub(crate) async fn advance<R: StepRecord>(
    qdb: &mut QuestDB,
    ctx: &Context,
    record: &R,
    next: R::Phase,
) -> Result<(), Error> {
    if let Some(took) = clock::since(record.phase_started_at()) {
        info!(questdb = %qdb.name_any(), step = %record.phase(), seconds = took.as_secs_f64(), "{} step done", R::ACTION);
        R::time_step(ctx, record.phase(), took);
    }
    persist(qdb, ctx, |s| {
        if let Some(r) = R::of(s) {
            r.set_phase(next, clock::now());
            r.set_message(None);
        }
    })
    .await?;
    ctx.event(
        qdb,
        EventType::Normal,
        R::step_reason(next),
        R::ACTION,
        record.step_note(next),
    )
    .await;
    Ok(())
}

/// The two records share their field names; only the phases, the action, the step reasons,
/// the note and the histogram differ.
macro_rules! step_record {
    ($record:ty, $phase_ty:ty, $action:literal, $field:ident, $reasons:path, $metric:ident, |$r:ident, $phase:ident| $note:expr) => {
        impl StepRecord for $record {
            type Phase = $phase_ty;
            const ACTION: &'static str = $action;

            fn of(status: &mut QuestDBStatus) -> Option<&mut Self> {
                status.$field.as_mut()
            }
            fn phase(&self) -> $phase_ty {
                self.phase
            }
            fn phase_started_at(&self) -> Option<&Time> {
                self.phase_started_at.as_ref()
            }
            fn set_phase(&mut self, phase: $phase_ty, started_at: Time) {
                self.phase = phase;
                self.phase_started_at = Some(started_at);
            }
            fn set_message(&mut self, message: Option<String>) {
                self.message = message;
            }
            fn step_reason(phase: $phase_ty) -> EventReason {
                $reasons(phase)
            }
            fn step_note(&self, $phase: $phase_ty) -> String {
                let $r = self;
                $note
            }
            fn time_step(ctx: &Context, phase: $phase_ty, took: std::time::Duration) {
                ctx.metrics.$metric(phase.into(), took);
            }
        }
    };
}

step_record!(
    FailoverStatus,
    FailoverPhase,
    "Failover",
    failover,
    failover::step_reason,
    failover_step,
    |r, phase| format!(
        "failover of {}: {phase}",
        r.old_node.as_deref().unwrap_or_default()
    )
);
step_record!(
    NodeMoveStatus,
    NodeMovePhase,
    "NodeMove",
    node_move,
    node_move::step_reason,
    node_move_step,
    |_r, phase| format!("node move: {phase}")
);

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;

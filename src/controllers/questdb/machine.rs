//! The shape the cloud state machines share (the dedicated node, failover, node move). Each
//! reconcile gives each machine one turn: observe, decide one step (the pure planner in
//! `plan::`), perform it once, and return what to wait for. The step after it is decided by
//! the next reconcile, woken by the watch event of this one's status write or by the requeue
//! the turn asks for; no reconcile loops over steps, so a step's record is always read back
//! from the apiserver before the next step is decided on it.

use crate::controllers::Error;

pub(super) trait StateMachine {
    /// What the step is decided on: the machine's record, and what EC2 and the caches say now.
    type Observed;
    /// The steps the planner chooses from.
    type Step;
    /// What the turn reports: the machine's condition and how soon to look again.
    type Outcome;

    async fn observe(&mut self) -> Result<Self::Observed, Error>;
    /// The one step to take now (no I/O: the planner's call on what was observed).
    fn decide(&self, observed: &Self::Observed) -> Self::Step;
    /// Takes `step`: records a transition, or acts once and records the outcome.
    async fn perform(
        &mut self,
        step: Self::Step,
        observed: Self::Observed,
    ) -> Result<Self::Outcome, Error>;
}

/// One reconcile's turn of `machine`.
pub(super) async fn turn<M: StateMachine>(machine: &mut M) -> Result<M::Outcome, Error> {
    let observed = machine.observe().await?;
    let step = machine.decide(&observed);
    machine.perform(step, observed).await
}

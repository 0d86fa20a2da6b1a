//! What every controller runs on and nothing decides with: the clock, the event recorder,
//! and the guard that proves no object is reconciled twice at once.

pub(crate) use questdb_core::clock;
pub(crate) mod events;
pub mod heap;
pub(crate) mod in_flight;
pub(crate) mod stopping;

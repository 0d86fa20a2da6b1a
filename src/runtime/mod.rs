//! What every controller runs on and nothing decides with: the clock, the event recorder,
//! and the guard that proves no object is reconciled twice at once.

pub use questdb_core::clock;
pub mod events;
pub mod heap;
pub mod in_flight;
pub mod stopping;

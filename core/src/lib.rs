//! questdb-core: what the operator decides, without doing any of it.
//!
//! The `QuestDB` API types and the CRD rendered from them (`api`, `crd`), the builders of the
//! objects a database wants (`desired`), the planners of every state machine (`plan`), ILP
//! auth's key parsing and auth file (`ilp_auth`), and the cloud's model (`cloud`: instances,
//! tags, errors). Nothing here performs I/O: this crate has no Kubernetes client and no async
//! runtime among its dependencies, so a planner that reaches for either does not compile. The
//! operator crate (`questdb-operator`) observes, calls these, and performs.

pub mod api;
pub mod clock;
pub mod cloud;
pub mod crd;
pub mod desired;
pub mod duration;
pub mod ilp_auth;
pub mod plan;

//! questdb-operator: runs the whole lifecycle of QuestDB databases on Kubernetes.
//!
//! What it decides is `questdb_core` (API types, builders, planners), re-exported here under
//! the same paths; this crate observes (caches, EC2, the databases), calls those, and performs.
//!
//! Most of it is crate-private (what a test, bench or the sandbox uses is public): read its
//! documentation with `cargo doc --document-private-items`, where links to private items lead
//! somewhere.
#![allow(rustdoc::private_intra_doc_links)]

pub mod app;
pub mod cache;
pub mod cli;
pub mod cloud;
pub mod controllers;
pub mod http_server;
pub mod ilp_auth;
mod installed_crd;
pub mod inventory;
pub mod kubelet_stats;
pub mod leadership;
pub mod manager;
pub mod metrics;
pub mod questdb_http;
pub mod questdb_pgwire;
pub mod runtime;

pub use questdb_core::{api, crd, desired, plan};

//! Integration tests: the real manager against the simulated control plane. One test binary
//! (one link) for the whole suite; each test starts its own simulator on an ephemeral port.

mod cloud;
mod database;
mod db_client;
mod harness;
mod ilp_auth;
mod leader;
mod metrics;
mod namespaced;
mod questdb;

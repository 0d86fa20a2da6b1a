//! Integration tests: the real manager against a real control plane (kube-apiserver, etcd,
//! kube-controller-manager, kube-scheduler from questdb-testenv). One test binary (one link)
//! for the whole suite; each test starts its own control plane on ephemeral loopback ports.

mod admission;
mod backup;
mod chaos;
mod cloud;
mod database;
mod db_client;
mod disk;
mod eks;
mod harness;
mod helm;
mod ilp_auth;
mod leader;
mod log_capture;
mod metrics;
mod namespaced;
mod pod_fields;
mod preflight;
mod questdb;
mod shutdown;

//! Conformance suite of the simulated apiserver: each test checks one Kubernetes semantic
//! through the unmodified kube client (and kubectl where kubectl's behaviour is the point).

mod clients;
mod crd;
mod errors;
mod hooks;
mod kubectl;
mod lifecycle;
mod support;
mod watch;
mod writes;

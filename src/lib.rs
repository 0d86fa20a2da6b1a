//! questdb-operator: runs the whole lifecycle of QuestDB databases on Kubernetes.

pub mod api;
pub mod app;
pub mod cli;
pub mod cloud;
pub mod controllers;
pub mod crd;
pub mod desired;
pub mod http_server;
pub mod ilp_auth;
pub mod inventory;
pub mod kubelet_stats;
pub mod leadership;
pub mod manager;
pub mod metrics;
pub mod plan;
pub mod questdb_http;
pub mod questdb_pgwire;
pub mod runtime;

//! Pure builders: a `QuestDB` (plus what the controller observed) in, Kubernetes objects out.
//!
//! Nothing here talks to the API server, sleeps or reads the clock, so every function is a plain
//! value-to-value mapping that unit tests pin down. The controller decides *whether* to write
//! (the operator's `cache::compacted` tells it when an existing object already matches what
//! these builders produce).

pub mod children;
pub mod config;
pub mod credentials;
pub mod disruption_budget;
pub mod endpoints;
pub mod image_ref;
pub mod labels;
pub mod memory;
pub mod names;
pub mod network_policy;
pub mod pod_options;
pub mod pvc;
pub mod quantity;
pub mod reload;
pub mod service;
pub mod statefulset;
pub mod tenancy;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod validate;
pub mod version;

pub use children::{children, Children};
pub use config::{config_hash, config_map, ilp_auth_config_map, log_conf, server_conf};
pub use disruption_budget::pod_disruption_budget;
pub use endpoints::{endpoints, version_of};
pub use labels::{child_annotations, child_labels, owner_references, selector_labels};
pub use network_policy::network_policy;
pub use pvc::{
    pvc, pvc_update, pvc_with_ownership, requested_size, size_plan, PvcOwnership, SizePlan,
};
pub use service::{client_service, headless_service};
pub use statefulset::{
    dedicated_label_value, dedicated_label_value_for, statefulset, termination_grace_seconds,
    DedicatedNode, DEDICATED_LABEL_KEY, DEDICATED_TAINT_EFFECT, DEDICATED_TAINT_KEY,
    PIN_AWAITING_INSTANCE, PIN_LABEL_KEY,
};
pub use tenancy::TenancyPolicy;
pub use validate::{validate, validate_with, SpecProblem};

/// QuestDB's HTTP server (REST API and web console): `http.net.bind.to`.
pub const HTTP_PORT: i32 = 9000;
/// PostgreSQL wire protocol: `pg.net.bind.to`.
pub const PGWIRE_PORT: i32 = 8812;
/// InfluxDB line protocol over TCP: `line.tcp.net.bind.to`.
pub const ILP_PORT: i32 = 9009;
/// The minimal HTTP server whose `/status` answers even while the database is busy:
/// `http.min.net.bind.to`.
pub const HEALTH_PORT: i32 = 9003;

/// Port names, shared by the container and the Services so `targetPort` can refer to them.
pub mod port_names {
    pub const HTTP: &str = "http";
    pub const PGWIRE: &str = "pgwire";
    pub const ILP: &str = "ilp";
    pub const HEALTH: &str = "health";
}

/// QuestDB's root directory in the official image; the whole directory lives on the volume so
/// checkpoints and snapshots survive a pod move, not only `db/`.
pub const ROOT_DIR: &str = "/var/lib/questdb";
/// The uid and gid the official image runs as.
pub const QUESTDB_UID: i64 = 10001;
/// Name of the database container in the pod.
pub const CONTAINER_NAME: &str = "questdb";
/// Pod-template annotation carrying [`config_hash`]: a changed hash is a changed template, so
/// the StatefulSet controller restarts the pod whenever a mounted file changes, except for the
/// settings QuestDB reloads in place ([`reload`]).
pub const CONFIG_HASH_ANNOTATION: &str = "crd.questdb.io/config-hash";

/// Pod-template annotation carrying `status.config.restartedFor`: the digest of reloadable
/// settings the running version would not take in place, so the database restarts for them.
pub const CONFIG_RESTART_ANNOTATION: &str = "crd.questdb.io/config-restarted-for";
/// `server.conf` path of the ILP auth file, relative to the root directory (QuestDB resolves it
/// against the root).
pub const ILP_AUTH_DB_PATH: &str = "conf/auth.txt";
/// Key of the ILP auth file in its ConfigMap.
pub const ILP_AUTH_KEY: &str = "auth.txt";
/// Keys of the config ConfigMap.
pub const SERVER_CONF_KEY: &str = "server.conf";
pub const LOG_CONF_KEY: &str = "log.conf";

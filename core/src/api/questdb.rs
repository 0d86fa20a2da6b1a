//! The `QuestDB` custom resource (`crd.questdb.io/v1beta1`).
//!
//! Validation that a single field can express lives in the schema; rules that span fields or
//! compare old and new objects are CEL (`x-kubernetes-validations`) so the apiserver enforces
//! them before the operator ever sees a bad object.

use std::collections::BTreeMap;

use super::pod::PodOptions;
use super::NodeMoveReason;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of one QuestDB database.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
// Client-side CEL (kube's `cel` feature) only for the unit tests; the apiserver is the judge.
#[cfg_attr(test, kube(cel))]
#[kube(
    group = "crd.questdb.io",
    version = "v1beta1",
    kind = "QuestDB",
    plural = "questdbs",
    singular = "questdb",
    shortname = "qdb",
    shortname = "qdbs",
    namespaced,
    status = "QuestDBStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.version"}"#,
    printcolumn = r#"{"name":"NodeReady","type":"boolean","jsonPath":".status.nodeReady"}"#,
    printcolumn = r#"{"name":"NodeIP","type":"string","jsonPath":".status.nodeIP"}"#,
    printcolumn = r#"{"name":"DNS","type":"string","jsonPath":".status.dnsName"}"#,
    printcolumn = r#"{"name":"Failover","type":"string","priority":1,"jsonPath":".status.failover.phase"}"#,
    printcolumn = r#"{"name":"NodeMove","type":"string","priority":1,"jsonPath":".status.nodeMove.phase"}"#,
    printcolumn = r#"{"name":"Disk%","type":"integer","jsonPath":".status.disk.usedPercent"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
// A dedicated database's pod is pinned to its instance: nothing may widen or move its
// placement, and a toleration could keep it on a node fenced for failover. A record without a
// dedicated node would wait forever for an address, and one left behind when `node` is removed
// would keep pointing at a terminated instance's IP, which EC2 hands to someone else.
#[x_kube(
    validation = Rule::new("!has(self.node) || !has(self.pod) || !has(self.pod.tolerations)").message("pod.tolerations cannot be set on a database with a dedicated node (spec.node): the node is its own"),
    validation = Rule::new("!has(self.node) || !has(self.pod) || !has(self.pod.nodeSelector)").message("pod.nodeSelector cannot be set on a database with a dedicated node (spec.node): the pod is pinned to its instance"),
    validation = Rule::new("!has(self.node) || !has(self.pod) || !has(self.pod.affinity) || !has(self.pod.affinity.nodeAffinity)").message("pod.affinity.nodeAffinity cannot be set on a database with a dedicated node (spec.node): the pod is pinned to its instance"),
    validation = Rule::new("!has(self.dns) || has(self.node)").message("dns needs a dedicated node (spec.node): the record points at that node's address; remove dns with node"),
    validation = Rule::new("!has(self.dns) || !has(self.dns.public) || !self.dns.public || !has(self.node) || !has(self.node.hostPorts) || self.node.hostPorts").message("node.hostPorts cannot be false with dns.public: a public address reaches the node, never a pod")
)]
pub struct QuestDBSpec {
    /// Container image of the database, e.g. `questdb/questdb:9.0.0`. Its tag is the version.
    #[x_kube(validation = Rule::new("self.size() > 0").message("image must not be empty"))]
    #[schemars(length(max = 512))]
    pub image: String,

    /// Image pull policy of the database container (Always, IfNotPresent, Never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,

    /// The volume that holds the whole QuestDB root directory.
    pub volume: VolumeSpec,

    /// Compute resources of the database container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// QuestDB configuration files.
    #[serde(default)]
    pub config: ConfigSpec,

    /// Extra environment variables (QuestDB reads `QDB_*` overrides). Variables the operator
    /// owns are rejected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = env_schema)]
    pub env: Vec<EnvVar>,

    /// A dedicated cloud node for this database (AWS). Without it the pod runs on any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.zone == oldSelf.zone").message("node.zone is immutable: the volume lives in that zone"))]
    pub node: Option<NodeSpec>,

    /// Automatic replacement of a dedicated node that stops responding.
    #[serde(default)]
    pub failover: FailoverSpec,

    /// A DNS record that follows the database: its pod's VPC address, or its node's when the
    /// database binds host ports (see `node.hostPorts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsSpec>,

    /// ILP (InfluxDB Line Protocol over TCP) authentication. Keys come from Secrets annotated
    /// `crd.questdb.io/name: <this QuestDB's name>`.
    #[serde(default)]
    pub ilp_auth: IlpAuthSpec,

    /// Release compute (pod and node) and keep the data.
    #[serde(default)]
    pub paused: bool,

    /// Run `image` even when it is an older QuestDB version than the one the data last ran
    /// with (`status.dataVersion`), and restore a backup taken on a newer version. QuestDB does
    /// not support downgrades: an older version may not read what a newer one wrote. Without
    /// this, such an image or restore is refused and the database keeps running as it was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_version_downgrade: bool,

    /// How a change of `image` (the QuestDB version) of a database that has run is made: the
    /// old version is stopped and its volume snapshotted, then the new version starts; one
    /// that is not ready within `readyTimeout` is rolled back to the old version and the data
    /// as it was when the old version stopped.
    #[serde(default, skip_serializing_if = "VersionUpgradeSpec::is_default")]
    pub version_upgrade: VersionUpgradeSpec,

    /// Who may reach the database ports (a NetworkPolicy per QuestDB, on by default).
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,

    /// The database's own credentials (pgwire, read-only pgwire, HTTP basic auth).
    #[serde(default, skip_serializing_if = "CredentialsSpec::is_default")]
    pub credentials: CredentialsSpec,

    /// Fields of the database pod: placement, private registries, annotations, security
    /// context, extra volumes.
    #[serde(default, skip_serializing_if = "PodOptions::is_default")]
    pub pod: PodOptions,
}

/// How an image change of a database that has run is made (`spec.versionUpgrade`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct VersionUpgradeSpec {
    /// `Snapshot` (the default): a VolumeSnapshot of the volume is cut after the old version
    /// stopped (every acknowledged row is in it) and before the new one starts; the image
    /// change waits, saying so, while the snapshot cannot be taken. `Skip`: no snapshot, and no
    /// way back once the new version has run on the data (QuestDB does not support
    /// downgrades); a new version that is not ready is then left for a person to decide.
    #[serde(default)]
    pub backup: UpgradeBackup,
    /// How long the new version may take to become ready before the database goes back to
    /// the old one (e.g. `10m`, the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(s|m|h)$')").message("versionUpgrade.readyTimeout must be a duration such as 90s, 10m or 1h"))]
    pub ready_timeout: Option<String>,
    /// The VolumeSnapshotClass of the pre-upgrade snapshot (unset: the cluster's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 253").message("versionUpgrade.volumeSnapshotClassName must be a VolumeSnapshotClass name"))]
    pub volume_snapshot_class_name: Option<String>,
}

impl VersionUpgradeSpec {
    pub fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

/// Whether an image change takes a snapshot first (`spec.versionUpgrade.backup`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UpgradeBackup {
    #[default]
    Snapshot,
    Skip,
}

/// Where the database's credentials come from. By default the operator generates a Secret
/// `<name>-credentials` once, with random passwords, and never overwrites it; `secretName`
/// names a Secret the user keeps instead. Either holds QuestDB's own variable names as keys:
/// `QDB_PG_USER`, `QDB_PG_PASSWORD`, `QDB_PG_READONLY_USER`, `QDB_PG_READONLY_PASSWORD`,
/// `QDB_HTTP_USER`, `QDB_HTTP_PASSWORD`. QuestDB's default `admin`/`quest` is never accepted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSpec {
    /// A Secret of this namespace that holds the credentials (the user's, never written by the
    /// operator). Unset: `<name>-credentials`, generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 253").message("credentials.secretName must be a Secret name"))]
    pub secret_name: Option<String>,
}

impl CredentialsSpec {
    fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

/// The NetworkPolicy that guards the database ports (HTTP, pgwire, ILP): QuestDB ships with
/// well-known default credentials, so by default only pods of the QuestDB's own namespace may
/// connect. The health port gets no rule: kubelet probes come from the node, which a
/// NetworkPolicy always admits.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Off: no NetworkPolicy (an existing one made by the operator is deleted).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Peers admitted to the database ports, as in a NetworkPolicy ingress rule
    /// (`podSelector`, `namespaceSelector`, `ipBlock`). Empty: every pod of this namespace.
    /// Clients outside the cluster reaching a dedicated node's address need an `ipBlock`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = peers_schema)]
    pub from: Vec<NetworkPolicyPeer>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        Self {
            enabled: true,
            from: Vec::new(),
        }
    }
}

/// Storage of the QuestDB root directory (`/var/lib/questdb`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
// No "never shrink" rule: a size asked of a class that cannot expand must be revertible; the
// operator never shrinks a claim and says so in `VolumeSizeReady`.
#[x_kube(
    validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("volume.storageClassName is immutable"),
    validation = Rule::new("has(self.restoreFrom) == has(oldSelf.restoreFrom) && (!has(self.restoreFrom) || self.restoreFrom == oldSelf.restoreFrom)").message("volume.restoreFrom is immutable: a volume is restored once, when it is created")
)]
pub struct VolumeSpec {
    /// Size of the volume, a Kubernetes quantity such as `50Gi`.
    #[x_kube(validation = Rule::new("isQuantity(self)").message("volume.size must be a quantity such as 50Gi"))]
    pub size: String,
    /// Storage class of the PersistentVolumeClaim; the cluster default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Keep the PersistentVolumeClaim (and its data) when the QuestDB is deleted.
    #[serde(default = "default_true")]
    pub retain_on_delete: bool,
    /// Create the volume from a backup: the database starts with its data as it was at the
    /// backup's checkpoint. Only a volume that does not exist yet is restored; an existing
    /// one is never overwritten (condition `VolumeRestored=False`, reason `RestoreRefused`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<RestoreSource>,
    /// Grow the volume before it fills: a full volume suspends QuestDB's WAL tables and
    /// refuses writes. The operator reads the file system's usage from the kubelet and, past
    /// `thresholdPercent`, expands the claim by `stepPercent` up to `maximum`; tables
    /// suspended while it was full are resumed once there is room. Absent: usage is reported,
    /// nothing grows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_grow: Option<AutoGrowSpec>,
}

/// `spec.volume.autoGrow`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AutoGrowSpec {
    /// Grow once the file system is this full, in percent of its capacity.
    #[serde(default = "default_grow_threshold")]
    #[x_kube(validation = Rule::new("self >= 50 && self <= 95").message("volume.autoGrow.thresholdPercent must be between 50 and 95"))]
    pub threshold_percent: i32,
    /// Each growth adds this much, in percent of the size the claim requests. Generous by
    /// default: EBS takes one modification of a volume per six hours.
    #[serde(default = "default_grow_step")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 400").message("volume.autoGrow.stepPercent must be between 10 and 400"))]
    pub step_percent: i32,
    /// The largest size the operator grows the volume to, a quantity such as `1Ti`.
    #[x_kube(validation = Rule::new("isQuantity(self)").message("volume.autoGrow.maximum must be a quantity such as 1Ti"))]
    pub maximum: String,
}

fn default_grow_threshold() -> i32 {
    80
}
fn default_grow_step() -> i32 {
    50
}

/// Where a restored volume's data comes from: a `QuestDBBackup` or a VolumeSnapshot, in the
/// QuestDB's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.backup) != has(self.volumeSnapshot)").message("volume.restoreFrom names either a backup or a volumeSnapshot"))]
pub struct RestoreSource {
    /// A `QuestDBBackup` that `Succeeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 253").message("volume.restoreFrom.backup must be a QuestDBBackup name"))]
    pub backup: Option<String>,
    /// A VolumeSnapshot of a QuestDB volume taken while a checkpoint was open (what a
    /// backup holds); restored like a backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 253").message("volume.restoreFrom.volumeSnapshot must be a VolumeSnapshot name"))]
    pub volume_snapshot: Option<String>,
}

/// QuestDB configuration files.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConfigSpec {
    /// `server.conf` properties. Keys the operator owns (bind addresses, auth path, root) are
    /// rejected.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = server_schema)]
    pub server: BTreeMap<String, String>,
    /// Raw `log.conf` (at most 64 KiB: it is kept in the operator's cache with every QuestDB).
    /// Logs go to stdout when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub log: Option<String>,
    /// When QuestDB's writes reach the disk (`cairo.commit.mode`). `sync` (the default): every
    /// commit (an ILP/HTTP request, a pgwire INSERT) is fsynced before it is acknowledged, so
    /// no acknowledged row is lost when the node loses power; it costs write throughput (the
    /// durability table in docs/user-guide/questdb-resource.md: about half of ILP/HTTP's rows per second for one client).
    /// `nosync` (QuestDB's own default) and `async` acknowledge rows the kernel has not
    /// written back yet: a process crash or a clean stop loses nothing, a power loss or a
    /// kernel crash loses the last seconds of acknowledged rows (measured there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_mode: Option<CommitMode>,
}

/// QuestDB's `cairo.commit.mode`, spelt as QuestDB spells it.
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    strum::Display,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum CommitMode {
    /// Commits are fsynced before they are acknowledged.
    #[default]
    Sync,
    /// Commits start the write-back (`msync(MS_ASYNC)`) without waiting for it; on Linux that
    /// waits for nothing, so a power cut loses what `nosync` loses.
    Async,
    /// Commits leave the write-back to the kernel (up to 30 s later by default).
    Nosync,
}

/// A dedicated EC2 node for one database.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// Node image (AMI id). Changing it rolls the database onto a new node.
    #[x_kube(validation = Rule::new("self.startsWith('ami-')").message("node.image must be an AMI id (ami-...)"))]
    pub image: String,
    /// EC2 instance type, e.g. `m6i.large`.
    pub instance_type: String,
    /// Availability zone; must match the volume's zone and never changes.
    pub zone: String,
    /// Instance types to try, in order, when EC2 has no capacity for `instanceType` in the
    /// zone (the volume is zonal, so the zone never changes). A database running on a
    /// fallback type is not moved back by itself; editing `instanceType` moves it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub fallback_instance_types: Vec<String>,
    /// How long the old node is kept, cordoned, after a move (e.g. `30m`, the default): setting
    /// `image` back within it moves the database back without launching a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(s|m|h)$')").message("node.rollbackWindow must be a duration such as 90s, 30m or 2h"))]
    pub rollback_window: Option<String>,
    /// When a node move may start (UTC). Without it, a move starts as soon as the spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_window: Option<MaintenanceWindow>,
    /// Bind the database's ports (9000, 8812, 9009) on the node's address too. Unset: only
    /// when `dns.public` needs them (a public address reaches the node, never a pod) or the
    /// database already runs with them (an operator upgrade restarts nothing). Without host
    /// ports the private record names the pod's own VPC address, which EC2 must show assigned
    /// to the instance, and the namespace may enforce the `restricted` Pod Security Standard
    /// (host ports need `privileged`). `false` with `dns.public` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ports: Option<bool>,
}

/// A weekly window in UTC in which node moves may start (a started move runs to its end).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// Days the window opens on (`Mon` ... `Sun`); every day when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    #[x_kube(validation = Rule::new("self.all(d, d in ['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'])").message("maintenanceWindow.days are Mon, Tue, Wed, Thu, Fri, Sat or Sun"))]
    pub days: Vec<String>,
    /// Opening time, `HH:MM` UTC.
    #[schemars(length(max = 5))]
    #[x_kube(validation = Rule::new("self.matches('^([01][0-9]|2[0-3]):[0-5][0-9]$')").message("maintenanceWindow.start must be HH:MM (UTC)"))]
    pub start: String,
    /// How long the window stays open, e.g. `4h` (at most a week).
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(s|m|h)$')").message("maintenanceWindow.duration must be a duration such as 90m or 4h"))]
    pub duration: String,
}

/// Automatic failover of a dedicated node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailoverSpec {
    /// Replace a dedicated node that stops responding.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// How long the node must be unhealthy before it is fenced and replaced.
    #[serde(default = "default_unhealthy_after")]
    // The floor is the kubelets' Lease duration; `crate::crd::questdb` renders it for clusters
    // whose kubelets use another one.
    #[x_kube(validation = Rule::new("self >= 40").message("failover.unhealthyAfterSeconds must be at least 40, the kubelets' Lease duration"))]
    pub unhealthy_after_seconds: i64,
}

impl Default for FailoverSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            unhealthy_after_seconds: default_unhealthy_after(),
        }
    }
}

/// A DNS A record that points at the database's node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DnsSpec {
    /// Fully qualified record name, e.g. `db1.tenant.example.com`.
    #[x_kube(validation = Rule::new("self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?\\\\.)+[a-z]{2,63}\\\\.?$')").message("dns.name must be a lower-case fully qualified domain name"))]
    #[schemars(length(max = 253))]
    pub name: String,
    /// Record TTL in seconds (0 to one week; Route53 takes larger values, but a record that
    /// must follow its database to a new node is useless with a longer one).
    #[x_kube(validation = Rule::new("self >= 0 && self <= 604800").message("dns.ttl must be between 0 and 604800 seconds"))]
    #[serde(default = "default_ttl")]
    pub ttl: i64,
    /// Point the record at the node's public IP instead of its private one.
    #[serde(default)]
    pub public: bool,
}

/// ILP authentication settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IlpAuthSpec {
    /// ILP auth is on unless explicitly turned off. With no key Secrets it stays on and refuses
    /// every client (fail closed): removing the last key never opens the database.
    #[serde(default = "default_true")]
    pub enabled: bool,
}

impl Default for IlpAuthSpec {
    fn default() -> Self {
        Self { enabled: true }
    }
}

fn default_true() -> bool {
    true
}
fn default_unhealthy_after() -> i64 {
    90
}
fn default_ttl() -> i64 {
    60
}

/// `server.conf` keys the operator sets itself; users may not override them.
pub const RESERVED_SERVER_KEYS: &[&str] = &[
    "http.net.bind.to",
    "http.min.net.bind.to",
    "http.min.enabled",
    "pg.net.bind.to",
    "line.tcp.net.bind.to",
    "line.tcp.auth.db.path",
    "cairo.root",
    // Credentials come from the credentials Secret, as env: never from server.conf.
    "pg.user",
    "pg.password",
    "pg.readonly.user.enabled",
    "pg.readonly.user",
    "pg.readonly.password",
    "http.user",
    "http.password",
    // Probes must reach /status without the HTTP password.
    "http.health.check.authentication.required",
    // The volume claim's uid: a restored volume (a new claim) recovers its checkpoint.
    "cairo.snapshot.instance.id",
    // A restore recovers the backup's checkpoint only with these on (QuestDB's defaults): off,
    // a restored volume starts with whatever the snapshot caught, torn writes included.
    "cairo.checkpoint.recovery.enabled",
    "cairo.snapshot.recovery.enabled",
    // Tables placed on other volumes are in no snapshot of the database's volume.
    "cairo.volumes",
    // Durability is `spec.config.commitMode`, typed, with its trade-off in its description.
    "cairo.commit.mode",
];

/// The environment variables QuestDB maps onto [`RESERVED_SERVER_KEYS`].
pub fn reserved_env_vars() -> Vec<String> {
    RESERVED_SERVER_KEYS
        .iter()
        .map(|k| env_name_for(k))
        .collect()
}

/// QuestDB's env override name for a server.conf key: `QDB_` + upper-cased key, `.` → `_`.
pub fn env_name_for(key: &str) -> String {
    format!("QDB_{}", key.to_uppercase().replace('.', "_"))
}

/// Upper bounds the apiserver's CEL cost estimator needs: without them it assumes every list
/// and string as large as a whole request and refuses the CRD ("estimated rule cost exceeds
/// budget"), as the real kube-apiserver did.
pub const MAX_ENV_VARS: u64 = 64;
pub const MAX_ENV_NAME_LENGTH: u64 = 256;
/// An env value: a JVM option string, a URL; not a file (a ConfigMap volume carries those).
pub const MAX_ENV_VALUE_LENGTH: u64 = 16 * 1024;
/// NetworkPolicy peers of `spec.networkPolicy.from`.
pub const MAX_PEERS: u64 = 32;
pub const MAX_SERVER_PROPERTIES: u64 = 256;
pub const MAX_SERVER_VALUE_LENGTH: u64 = 4096;

/// One CEL rule per reserved name, so the message names the key without a `messageExpression`
/// (whose estimated cost over a list of EnvVars the apiserver refuses).
fn reserved_rules(
    check: impl Fn(&str) -> String,
    what: &str,
    names: &[String],
) -> serde_json::Value {
    names
        .iter()
        .map(|n| {
            serde_json::json!({
                "rule": check(n),
                "message": format!("{what} {n} is managed by the operator"),
            })
        })
        .collect()
}

fn env_schema(schema: &mut schemars::Schema) {
    schema.insert("maxItems".into(), MAX_ENV_VARS.into());
    super::pod::bound_item_string(schema, "name", MAX_ENV_NAME_LENGTH as i64);
    // Every QuestDB sits in the operator's cache: a value of up to etcd's 1.5 MiB per object,
    // times many objects, would be the operator's memory to hold.
    super::pod::bound_item_string(schema, "value", MAX_ENV_VALUE_LENGTH as i64);
    schema.insert(
        "x-kubernetes-validations".into(),
        reserved_rules(
            |n| format!("!self.exists(e, e.name == '{n}')"),
            "env var",
            &reserved_env_vars(),
        ),
    );
}

/// At most [`MAX_PEERS`] peers (each a selector or a CIDR block): the same cache bound.
fn peers_schema(schema: &mut schemars::Schema) {
    schema.insert("maxItems".into(), MAX_PEERS.into());
}

/// The status as the schema stores it: `upgrade`, the node move's field before this release, is
/// kept beside `nodeMove` for one release, marked deprecated. The apiserver prunes a field its
/// schema does not name from what it reads out of etcd as well: without it a move an older
/// operator recorded (its instances, its step) would vanish at the CRD's upgrade.
fn status_schema(schema: &mut schemars::Schema) {
    let Some(properties) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) else {
        return;
    };
    let Some(mut legacy) = properties.get("nodeMove").cloned() else {
        return;
    };
    if let Some(legacy) = legacy.as_object_mut() {
        legacy.insert(
            "description".into(),
            format!("Deprecated: `{LEGACY_NODE_MOVE_FIELD}`, the name of `nodeMove` before it; read once and replaced by `nodeMove` at the next status write.").into(),
        );
    }
    properties.insert(LEGACY_NODE_MOVE_FIELD.into(), legacy);
}

/// The stored name of `status.nodeMove` before it was called so (read for one release).
pub const LEGACY_NODE_MOVE_FIELD: &str = "upgrade";

fn server_schema(schema: &mut schemars::Schema) {
    schema.insert("maxProperties".into(), MAX_SERVER_PROPERTIES.into());
    if let Some(values) = schema
        .get_mut("additionalProperties")
        .and_then(|v| v.as_object_mut())
    {
        values.insert("maxLength".into(), MAX_SERVER_VALUE_LENGTH.into());
    }
    let keys: Vec<String> = RESERVED_SERVER_KEYS.iter().map(|k| k.to_string()).collect();
    schema.insert(
        "x-kubernetes-validations".into(),
        reserved_rules(|k| format!("!('{k}' in self)"), "server.conf key", &keys),
    );
}

/// Observed state, written only by the operator.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = status_schema)]
pub struct QuestDBStatus {
    /// Coarse lifecycle phase, see [`Phase`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// QuestDB version (the image tag) that is running or being rolled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The QuestDB version (image tag) the data last ran with, recorded while the database is
    /// Running: an image older than this is refused unless `spec.allowVersionDowngrade`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "nodeIP")]
    pub node_ip: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "instanceID"
    )]
    pub instance_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_image: Option<String>,
    /// Instance type of the recorded instance (a change of `spec.node.instanceType` moves the
    /// database like an image change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_instance_type: Option<String>,
    /// The image of the node the database ran on before its last move (kept for a rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_node_image: Option<String>,
    /// Generation of the dedicated node: written *before* its instance is launched, so a crash
    /// between launch and recording `instanceID` finds the same instance again (tags and
    /// ClientToken are derived from uid + this number). Bumped when a new node is wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_name: Option<String>,
    /// The address `dnsName` was last pointed at; lets a steady-state reconcile skip Route53.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "dnsIP")]
    pub dns_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,
    /// The Secret that holds the database's credentials (keys as in `spec.credentials`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// Kubernetes-style conditions: `Ready`, `IlpAuthReady`, `NodeReady`, ...
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverStatus>,
    /// The last stop of a dead or stuck node's instance that a release or a node move asked
    /// for (a failover records its own in `failover.fenceStop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_stop: Option<FenceStop>,
    /// The node move under way, or the last one.
    // Read from `upgrade` too, the field's name before this release: a move an older operator
    // recorded is taken over, and the next status write (a whole replacement) stores it here.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "upgrade")]
    pub node_move: Option<NodeMoveStatus>,
    /// How the settings QuestDB reloads in place last reached the running database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigStatus>,
    /// The change of QuestDB version under way, held, or rolled back (absent once the new
    /// version ran ready: the `VersionUpgrade` condition keeps what happened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_upgrade: Option<VersionUpgradeStatus>,
    /// The volume's file system as the kubelet last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskStatus>,
}

/// `status.disk`: the database volume's file system, from the kubelet's volume statistics
/// (the operator's metrics carry the exact bytes; status changes only with the percentage).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    /// The file system's size, as a quantity (`Mi` or `Gi`).
    pub capacity: String,
    /// How full it is, in percent of its size.
    pub used_percent: i32,
    /// WAL tables seen suspended while the volume was full (or tagged `DISK FULL`): the ones
    /// the operator resumes once there is room. A table suspended for any other reason is
    /// left to `WriteHealthy` and a person.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspended_when_full: Vec<String>,
    /// The growth asked of the claim, recorded before it is asked, until the file system is
    /// larger than it was: a look at the file system from before the growth never asks for
    /// another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<DiskGrowth>,
}

/// `status.disk.growth`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskGrowth {
    /// The size asked of the claim.
    pub to: String,
    /// The file system's size (bytes) when it was asked.
    pub from_capacity_bytes: i64,
}

/// A change of `spec.image` of a database that has run, recorded before each side effect.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct VersionUpgradeStatus {
    /// The image the database ran before, which it runs again in a rollback.
    pub from_image: String,
    /// The image it is upgraded to.
    pub to_image: String,
    pub step: VersionUpgradeStep,
    /// When `step` began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// The VolumeSnapshot cut after the old version stopped (none with `backup: Skip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// In a rollback: the uid of the claim the new version ran on (deleted, its volume kept)
    /// and the PersistentVolume kept with `Retain` for a person to delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained_volume: Option<String>,
    /// Why it waits, is held, or rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `Held`: the spec generation it was held at; an edit of the spec tries again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// The steps of a version upgrade and its rollback.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, strum::Display,
)]
pub enum VersionUpgradeStep {
    /// The old version runs until nothing else is under way (a failover, a node move, a
    /// pause).
    #[default]
    Waiting,
    /// The old version is stopped (the StatefulSet at zero replicas).
    Stopping,
    /// The volume's snapshot is being cut.
    Snapshotting,
    /// The new version starts and has `readyTimeout` to become ready.
    Starting,
    /// Rollback: the new version is stopped.
    StoppingNew,
    /// Rollback: the claim the new version ran on goes, its volume kept (`Retain`).
    ReleasingVolume,
    /// Rollback: a claim from the snapshot, and the old version on it.
    Restoring,
    /// The old version runs again on the data it left; `spec.image` still names the version
    /// that failed until a person changes it.
    RolledBack,
    /// The snapshot could not be taken: the old version runs; an edit of the spec tries again.
    Held,
}

/// The reloadable settings of `spec.config.server` (those QuestDB's `SHOW PARAMETERS` marks
/// `reloadable`): a change of only those is reloaded into the running database, without a
/// restart, and recorded here once the database reports every new value.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    /// Digest of the reloadable settings the database last reported running with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_digest: Option<String>,
    /// How they reached it: `Reload` (in place, same pod) or `Restart` (read at its start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_by: Option<ConfigApplied>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<Time>,
    /// Digest of the settings being reloaded, and since when: the kubelet refreshes the
    /// mounted file within about a minute, and a change not taken within
    /// 3 minutes restarts the database instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reloading_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reloading_since: Option<Time>,
    /// Digest of the settings the database was restarted for because the running version
    /// would not take them in place; the pod template carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_for: Option<String>,
}

/// How a change of reloadable settings reached the database.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, strum::Display)]
pub enum ConfigApplied {
    /// `reload_config()` in the running database: no restart.
    Reload,
    /// Read from the file at the database's start.
    Restart,
}

/// Coarse lifecycle phase shown by `kubectl get questdb`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Accepted; children are being created.
    Pending,
    /// A dedicated node is being launched or joined.
    Provisioning,
    /// The database pod is Ready.
    Running,
    /// It ran, and does not answer now: its pod is not ready (its node is not ready or gone,
    /// the pod restarts). `Ready` says why; a failover, when one starts, says `FailingOver`.
    Unavailable,
    /// Something the operator cannot fix by itself; see conditions.
    Failed,
    /// Compute released, data kept.
    Paused,
    /// A dedicated node is being replaced after a failure.
    FailingOver,
    /// A version upgrade is under way (or rolling back).
    Upgrading,
    /// The database is moving to another node (another image or instance type, a replacement
    /// for AWS's maintenance, a drain).
    MovingNode,
    /// Deletion in progress (finalizer work).
    Terminating,
}

impl Phase {
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Provisioning => "Provisioning",
            Phase::Running => "Running",
            Phase::Unavailable => "Unavailable",
            Phase::Failed => "Failed",
            Phase::Paused => "Paused",
            Phase::FailingOver => "FailingOver",
            Phase::Upgrading => "Upgrading",
            Phase::MovingNode => "MovingNode",
            Phase::Terminating => "Terminating",
        }
    }
}

/// In-cluster addresses of the database's protocols.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Endpoints {
    pub http: String,
    pub pgwire: String,
    pub ilp: String,
}

/// The steps of a failover, as `status.failover.phase` records them, in order.
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    strum::Display,
    strum::IntoStaticStr,
    strum::EnumIter,
)]
pub enum FailoverPhase {
    /// The old instance is stopped (normally, forced once that has not ended in time) until
    /// EC2 reports it stopped or terminated.
    #[default]
    Fencing,
    /// The old Node is tainted out-of-service so its pod and volume let go.
    Releasing,
    /// The database pod starts on the replacement node with the same volume.
    Reattaching,
    /// Waiting for the database to answer and DNS to follow it.
    Recovering,
    /// The database answers on the new node; the fenced instance keeps its address for the
    /// DNS record's TTL.
    Draining,
    /// Done: the record of the last failover.
    Healthy,
}

/// Why a failover started (`status.failover.reason`).
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::Display,
    strum::IntoStaticStr,
    strum::EnumIter,
)]
pub enum FailoverCause {
    /// The node's kubelet stopped renewing its Lease past the threshold.
    NodeLeaseExpired,
    /// The Node object of a running instance is gone.
    NodeDeleted,
    /// EC2 reports the instance stopped (or impaired) outside the operator.
    InstanceDown,
    /// EC2 reports the instance terminated outside the operator.
    InstanceTerminated,
    /// The instance ran past `--node-join-timeout` without its Node registering.
    NodeNeverJoined,
}

/// Progress of a node failover; persisted before every side effect.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FailoverStatus {
    pub phase: FailoverPhase,
    /// Why it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailoverCause>,
    /// When fencing began (downtime starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the current phase was entered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_started_at: Option<Time>,
    /// When the database answered again (phase `Healthy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Seconds from the start of fencing to the database answering again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_node: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "oldInstanceID"
    )]
    pub old_instance_id: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "newInstanceID"
    )]
    pub new_instance_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The stop of the old instance the fence asked for last (phase `Fencing`), recorded
    /// before it is sent: a normal stop first, which lets the OS flush what the database
    /// wrote, forced once it has not ended within `--fence-graceful-stop-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_stop: Option<FenceStop>,
    /// Which replacement this failover is on: absent or 1 for the first, one more each time a
    /// replacement died, stopped or never joined before the failover ended (at most
    /// `plan::failover::MAX_ATTEMPTS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i64>,
    /// Instances earlier attempts of this failover fenced (stopped, kept until the end like
    /// `oldInstanceID`, then terminated with it).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "fencedInstanceIDs"
    )]
    pub fenced_instance_ids: Vec<String>,
}

impl FailoverStatus {
    /// The attempt this failover is on (1 for the first replacement).
    pub fn attempt(&self) -> u32 {
        self.attempt.unwrap_or(1).clamp(1, i64::from(u32::MAX)) as u32
    }

    /// Every instance this failover fenced and still has to terminate at its end: the earlier
    /// attempts' and the current one's.
    pub fn fenced(&self) -> impl Iterator<Item = &str> {
        self.fenced_instance_ids
            .iter()
            .map(String::as_str)
            .chain(self.old_instance_id.as_deref())
    }
}

/// A stop a fence asked EC2 for.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FenceStop {
    /// The instance stopped.
    #[serde(rename = "instanceID")]
    pub instance: String,
    pub mode: crate::cloud::StopMode,
    /// When it was recorded, just before StopInstances was first sent with this mode.
    pub requested_at: Time,
}

/// The steps of a node move, as `status.nodeMove.phase` records them, in order; the last
/// three end it.
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    strum::Display,
    strum::IntoStaticStr,
    strum::EnumIter,
)]
pub enum NodeMovePhase {
    /// The image and instance type are checked against EC2.
    #[default]
    Validating,
    /// The new node is launched and joins.
    Provisioning,
    /// The new node is dedicated and Ready; the database still runs on the old one.
    NodeReady,
    /// Downtime starts: the database stops on the old node.
    Stopping,
    /// The database pod starts on the new node.
    Moving,
    /// Downtime ends when the pod is Ready and DNS names the new node.
    Verifying,
    /// The database runs on the new node; the old one is kept, cordoned, for a rollback.
    Retaining,
    /// The old node is gone; the move is over.
    Completed,
    /// Ended before the database stopped.
    Aborted,
    /// Ended with the database back on the old node.
    RolledBack,
}

/// A phase spelt, and compared with its spelling (what `kubectl` and the tests read).
macro_rules! phase_eq_str {
    ($($t:ty),*) => {$(
        impl $t {
            pub fn as_str(self) -> &'static str {
                self.into()
            }
        }

        impl PartialEq<&str> for $t {
            fn eq(&self, other: &&str) -> bool {
                <&'static str>::from(*self) == *other
            }
        }
    )*};
}
phase_eq_str!(FailoverPhase, NodeMovePhase, FailoverCause);

/// Progress of a move to a node of another image or instance type; persisted before every
/// side effect. Stored as `status.nodeMove` (`status.upgrade` before; read for one release).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeMoveStatus {
    pub phase: NodeMovePhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_instance_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_instance_type: Option<String>,
    /// Why it was aborted or rolled back (e.g. `LaunchFailed`, `NodeNeverJoined`,
    /// `Superseded`), or `NodeMoveStuck` while the old node is fenced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<NodeMoveReason>,
    /// When the move began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the current phase was entered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_started_at: Option<Time>,
    /// When the database stopped on the old node (downtime starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<Time>,
    /// When the database answered on the node it moved to (or back to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Seconds from the database stopping on the old node to answering on the new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_seconds: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "oldInstanceID"
    )]
    pub old_instance_id: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "newInstanceID"
    )]
    pub new_instance_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The move failed after the database stopped, or the spec was set back then: the
    /// database returns to the old node (`oldInstanceID` and `newInstanceID` swapped).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rolling_back: bool,
    /// When the retained old node is terminated (end of `spec.node.rollbackWindow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_until: Option<Time>,
    /// The EC2 scheduled event (a retirement, stop, reboot or maintenance of the old instance)
    /// this move answers: it replaces the node before AWS acts, in the maintenance window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_event: Option<ScheduledEventRecord>,
    /// The database's node that was cordoned (`kubectl drain`, `kubectl cordon`, the AWS Node
    /// Termination Handler): this move replaces it, so the drain can finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_node: Option<String>,
}

/// An EC2 scheduled event as a node move records it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledEventRecord {
    /// `instance-retirement`, `instance-stop`, `instance-reboot`, `system-reboot` or
    /// `system-maintenance`.
    pub code: String,
    /// EC2's `instanceEventId`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "eventID")]
    pub event_id: Option<String>,
    #[serde(rename = "instanceID")]
    pub instance_id: String,
    /// The earliest time AWS may act.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Time>,
}

#[cfg(test)]
mod legacy_status_tests {
    use super::*;
    use kube::CustomResourceExt;

    /// The harm: a node move an older operator recorded under `status.upgrade` (its new
    /// instance launched, its step half done) forgotten at the operator's upgrade, leaving an
    /// instance nobody releases and a database between two nodes.
    #[test]
    fn a_node_move_recorded_under_its_old_name_is_read_and_written_back_under_the_new_one() {
        let stored = serde_json::json!({
            "phase": "MovingNode",
            "upgrade": {"phase": "Stopping", "fromImage": "ami-1", "toImage": "ami-2", "newInstanceID": "i-2"},
        });
        let status: QuestDBStatus = serde_json::from_value(stored).unwrap();
        let record = status.node_move.as_ref().expect("the old field is read");
        assert_eq!(record.phase, NodeMovePhase::Stopping);
        assert_eq!(record.new_instance_id.as_deref(), Some("i-2"));
        let written = serde_json::to_value(&status).unwrap();
        assert_eq!(written["nodeMove"]["phase"], "Stopping");
        assert!(written.get(LEGACY_NODE_MOVE_FIELD).is_none(), "{written}");
    }

    /// The apiserver prunes what the schema does not name, from etcd's copy as well: the old
    /// field stays in the schema for the release that reads it.
    #[test]
    fn the_schema_keeps_the_old_field_so_the_apiserver_does_not_prune_a_recorded_move() {
        let crd = serde_json::to_value(QuestDB::crd()).unwrap();
        let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
            ["status"]["properties"];
        assert_eq!(
            status["upgrade"]["properties"],
            status["nodeMove"]["properties"]
        );
        assert!(status["upgrade"]["description"]
            .as_str()
            .unwrap()
            .starts_with("Deprecated"));
    }
}

#[cfg(test)]
mod tests {
    //! The schema's CEL rules, evaluated client-side by kube's `cel` feature exactly as the
    //! generated CRD carries them.

    use super::*;
    use crate::desired::testing::questdb;
    use k8s_openapi::api::core::v1::EnvVar;

    /// The harm: a tenant filling the operator's memory through the QuestDB cache (every
    /// object up to etcd's 1.5 MiB). The free-text fields a tenant fills have bounds.
    #[test]
    fn the_fields_a_tenant_fills_are_bounded_in_the_schema() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(QuestDB::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"];
        assert_eq!(spec["image"]["maxLength"], 512);
        assert_eq!(spec["env"]["maxItems"], MAX_ENV_VARS);
        assert_eq!(
            spec["env"]["items"]["properties"]["value"]["maxLength"],
            MAX_ENV_VALUE_LENGTH
        );
        assert_eq!(
            spec["networkPolicy"]["properties"]["from"]["maxItems"],
            MAX_PEERS
        );
    }

    fn node(zone: &str) -> NodeSpec {
        NodeSpec {
            image: "ami-0abcdef1234567890".to_string(),
            instance_type: "m6i.large".to_string(),
            zone: zone.to_string(),
            ..Default::default()
        }
    }

    fn env(name: &str) -> EnvVar {
        EnvVar {
            name: name.to_string(),
            value: Some("1".to_string()),
            ..EnvVar::default()
        }
    }

    /// The messages of every failed rule, or an empty list when `new` is accepted.
    fn update_errors(new: &QuestDB, old: &QuestDB) -> Vec<String> {
        match new.validate_cel_update(old) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
        }
    }

    fn create_errors(qdb: &QuestDB) -> Vec<String> {
        match qdb.validate_cel() {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
        }
    }

    fn good() -> QuestDB {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec
            .config
            .server
            .insert("cairo.commit.lag".into(), "1000".into());
        qdb.spec.env = vec![env("QDB_SHARED_WORKER_COUNT")];
        qdb.spec.node = Some(node("us-east-1a"));
        qdb
    }

    #[test]
    fn a_good_spec_is_accepted_on_create_and_update() {
        let qdb = good();
        assert_eq!(create_errors(&qdb), Vec::<String>::new());
        let mut edited = qdb.clone();
        edited.spec.image = "questdb/questdb:9.0.1".into();
        edited
            .spec
            .config
            .server
            .insert("shared.worker.count".into(), "4".into());
        assert_eq!(update_errors(&edited, &qdb), Vec::<String>::new());
    }

    #[test]
    fn volume_size_may_change_either_way_and_a_growth_in_other_units_too() {
        let old = good();
        for size in ["100Gi", "51200Mi", "20Gi"] {
            let mut edited = old.clone();
            edited.spec.volume.size = size.into();
            assert_eq!(update_errors(&edited, &old), Vec::<String>::new(), "{size}");
        }
    }

    #[test]
    fn volume_size_must_be_a_quantity() {
        let mut qdb = good();
        qdb.spec.volume.size = "50GB".into();
        assert_eq!(
            create_errors(&qdb),
            vec!["volume.size must be a quantity such as 50Gi"]
        );
    }

    #[test]
    fn zone_is_immutable() {
        let old = good();
        let mut moved = old.clone();
        moved.spec.node = Some(node("us-east-1b"));
        assert_eq!(
            update_errors(&moved, &old),
            vec!["node.zone is immutable: the volume lives in that zone"]
        );

        let mut new_image = old.clone();
        if let Some(n) = new_image.spec.node.as_mut() {
            n.image = "ami-0fedcba9876543210".into();
        }
        assert_eq!(update_errors(&new_image, &old), Vec::<String>::new());
    }

    #[test]
    fn storage_class_is_immutable() {
        let old = good();
        let mut changed = old.clone();
        changed.spec.volume.storage_class_name = Some("io2".into());
        assert_eq!(
            update_errors(&changed, &old),
            vec!["volume.storageClassName is immutable"]
        );

        let mut removed = old.clone();
        removed.spec.volume.storage_class_name = None;
        assert_eq!(
            update_errors(&removed, &old),
            vec!["volume.storageClassName is immutable"]
        );
    }

    #[test]
    fn every_reserved_server_key_is_rejected_with_a_message_naming_it() {
        for key in RESERVED_SERVER_KEYS {
            let mut qdb = good();
            qdb.spec.config.server.insert(key.to_string(), "x".into());
            assert_eq!(
                create_errors(&qdb),
                vec![format!("server.conf key {key} is managed by the operator")],
                "{key}"
            );
        }
    }

    #[test]
    fn every_reserved_env_var_is_rejected_with_a_message_naming_it() {
        for name in reserved_env_vars() {
            let mut qdb = good();
            qdb.spec.env.push(env(&name));
            assert_eq!(
                create_errors(&qdb),
                vec![format!("env var {name} is managed by the operator")],
                "{name}"
            );
        }
    }

    #[test]
    fn a_failover_delay_a_live_kubelets_renewals_could_trip_is_rejected() {
        let mut qdb = good();
        qdb.spec.failover.unhealthy_after_seconds = 39;
        assert_eq!(
            create_errors(&qdb),
            vec![
                "failover.unhealthyAfterSeconds must be at least 40, the kubelets' Lease duration"
            ]
        );
        qdb.spec.failover.unhealthy_after_seconds = 40;
        assert!(create_errors(&qdb).is_empty());
    }

    #[test]
    fn a_dns_ttl_route53_would_refuse_or_that_outlives_a_node_is_rejected() {
        for ttl in [-1, 604_801] {
            let mut qdb = good();
            qdb.spec.dns = Some(DnsSpec {
                name: "db.example.com".into(),
                ttl,
                public: false,
            });
            assert_eq!(
                create_errors(&qdb),
                vec!["dns.ttl must be between 0 and 604800 seconds"],
                "{ttl}"
            );
        }
    }

    #[test]
    fn a_dns_record_without_a_dedicated_node_to_point_at_is_rejected() {
        let mut qdb = good();
        qdb.spec.dns = Some(DnsSpec {
            name: "db.example.com".into(),
            ttl: 60,
            public: false,
        });
        assert!(create_errors(&qdb).is_empty());
        qdb.spec.node = None;
        assert_eq!(
            create_errors(&qdb),
            vec!["dns needs a dedicated node (spec.node): the record points at that node's address; remove dns with node"]
        );
    }

    #[test]
    fn a_public_record_without_host_ports_is_rejected() {
        let mut qdb = good();
        qdb.spec.dns = Some(DnsSpec {
            name: "db.example.com".into(),
            ttl: 60,
            public: true,
        });
        for (host_ports, accepted) in [(None, true), (Some(true), true), (Some(false), false)] {
            qdb.spec.node.as_mut().expect("node").host_ports = host_ports;
            let errors = create_errors(&qdb);
            assert_eq!(errors.is_empty(), accepted, "{host_ports:?}: {errors:?}");
            if !accepted {
                assert_eq!(errors, vec!["node.hostPorts cannot be false with dns.public: a public address reaches the node, never a pod"]);
            }
        }
        qdb.spec.dns.as_mut().expect("dns").public = false;
        assert!(
            create_errors(&qdb).is_empty(),
            "a private record names the pod"
        );
    }

    #[test]
    fn a_rollback_window_or_maintenance_window_the_operator_cannot_read_is_rejected() {
        let with = |f: &dyn Fn(&mut NodeSpec)| {
            let mut qdb = good();
            f(qdb.spec.node.as_mut().unwrap());
            create_errors(&qdb)
        };
        assert!(with(&|n| n.rollback_window = Some("45m".into())).is_empty());
        assert_eq!(
            with(&|n| n.rollback_window = Some("half an hour".into())),
            vec!["node.rollbackWindow must be a duration such as 90s, 30m or 2h"]
        );
        let window = |days: &[&str], start: &str, duration: &str| MaintenanceWindow {
            days: days.iter().map(|d| d.to_string()).collect(),
            start: start.into(),
            duration: duration.into(),
        };
        assert!(
            with(&|n| n.maintenance_window = Some(window(&["Sat", "Sun"], "02:00", "4h")))
                .is_empty()
        );
        assert_eq!(
            with(&|n| n.maintenance_window = Some(window(&["Saturday"], "02:00", "4h"))),
            vec!["maintenanceWindow.days are Mon, Tue, Wed, Thu, Fri, Sat or Sun"]
        );
        assert_eq!(
            with(&|n| n.maintenance_window = Some(window(&[], "2am", "4h"))),
            vec!["maintenanceWindow.start must be HH:MM (UTC)"]
        );
        assert_eq!(
            with(&|n| n.maintenance_window = Some(window(&[], "24:00", "4 hours"))),
            vec![
                "maintenanceWindow.duration must be a duration such as 90m or 4h",
                "maintenanceWindow.start must be HH:MM (UTC)"
            ]
        );
    }

    #[test]
    fn env_names_follow_questdbs_override_convention() {
        assert_eq!(env_name_for("http.net.bind.to"), "QDB_HTTP_NET_BIND_TO");
        assert_eq!(
            env_name_for("line.tcp.auth.db.path"),
            "QDB_LINE_TCP_AUTH_DB_PATH"
        );
        assert_eq!(reserved_env_vars().len(), RESERVED_SERVER_KEYS.len());
    }

    /// Every key of `sub` is in `sup`, recursively: a key the types do not know (a typo in the
    /// example) would be dropped silently by the apiserver's pruning.
    fn keys_kept(sub: &serde_json::Value, sup: &serde_json::Value, path: &str) {
        match (sub, sup) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in a {
                    let here = format!("{path}.{k}");
                    let other = b
                        .get(k)
                        .unwrap_or_else(|| panic!("{here} is not a field of QuestDB"));
                    keys_kept(v, other, &here);
                }
            }
            (serde_json::Value::Array(a), serde_json::Value::Array(b)) => {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    keys_kept(x, y, &format!("{path}[{i}]"));
                }
            }
            _ => {}
        }
    }

    /// The EKS example, filled in as its placeholders say, is a QuestDB the apiserver's schema
    /// rules and the operator's validation accept, with no field either would drop.
    #[test]
    fn the_eks_example_filled_in_is_a_valid_questdb() {
        let text = include_str!("../../../examples/eks-questdb.yaml").to_string();
        let filled = text
            .replace("<team namespace>", "team-a")
            .replace("<ami-...>", "ami-0123456789abcdef0")
            .replace("<eu-west-1a>", "eu-west-1a")
            .replace("<db.example.com>", "db.example.com")
            .replace("<10.0.0.0/16>", "10.0.0.0/16");
        let values: String = filled
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default())
            .collect();
        assert!(
            !values.contains('<'),
            "a placeholder the test does not fill: {filled}"
        );
        let raw: serde_json::Value = serde_yaml_ng::from_str(&filled).unwrap();
        let qdb: QuestDB = serde_yaml_ng::from_str(&filled).unwrap();
        keys_kept(
            &raw["spec"],
            &serde_json::to_value(&qdb.spec).unwrap(),
            "spec",
        );
        if let Err(errors) = qdb.validate_cel() {
            panic!("the CRD's rules refuse it: {errors:?}");
        }
        if let Err(problems) = crate::desired::validate(&qdb) {
            panic!("the operator refuses it: {problems:?}");
        }
        assert_eq!(
            qdb.spec.volume.storage_class_name.as_deref(),
            Some("questdb-gp3"),
            "the class of deploy/aws/storageclass.yaml"
        );
        let class: k8s_openapi::api::storage::v1::StorageClass =
            serde_yaml_ng::from_str(include_str!("../../../deploy/aws/storageclass.yaml")).unwrap();
        assert_eq!(class.metadata.name.as_deref(), Some("questdb-gp3"));
    }
}

//! What kubelets do, for nodes that have no real kubelet: register the Node (from the
//! instance's user data for cloud nodes), renew the node Lease, post NodeStatus (Ready,
//! `volumesInUse`), and run pods: wait until their volumes are attached, report them Running
//! and Ready, and on deletion stop them, unmount, and delete the pod object. A node can be
//! powered off (heartbeats and pods stop), partitioned (the same, seen from the cluster; the
//! instance keeps its volume, its databases run but nothing outside reaches them), its kubelet
//! alone cut off from the API server (its databases still answer), and healed.
//! With [`Databases::Real`](crate::database::Databases) a database pod runs a real QuestDB
//! (`crate::database`): it is Running once the process starts, Ready when its readiness probe
//! answers, and its volumes are unmounted only after the process has exited. A power-off or a
//! stopped instance SIGKILLs the node's databases; a partition pauses them, a kubelet cut off
//! leaves them running.
//! Each kubelet serves its HTTPS API (the Summary API: volume figures) on its InternalIP,
//! port 10250, while it runs (`crate::kubelet_api`).
//! Sources: pkg/kubelet/nodelease, kubelet_node_status.go, volumemanager (volumesInUse is
//! reported before mount and dropped after unmount), status_manager.go (the kubelet deletes a
//! terminated pod with grace 0 once its volumes are unmounted).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, Taint};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::csi::{DRIVER, ZONE_LABEL};
use crate::database::{self, Runtime};
use crate::kubelet_api::{self, KubeletCa};
use crate::timings;

pub const KUBELET_VERSION: &str = "v1.37.2";
/// Volumes the EBS CSI driver says a node can attach (`CSINode` `allocatable.count`): on Nitro
/// instances the attachment slots are shared with network interfaces, and the driver reports
/// what is left, 25 to 27 on the common types. The scheduler places no more volumes than this
/// on a node ("node(s) exceed max volume count").
pub const ATTACHABLE_VOLUMES: usize = 25;

/// How a Node joins: what its kubelet registers.
#[derive(Clone, Debug)]
pub struct NodeRegistration {
    pub name: String,
    pub zone: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub provider_id: Option<String>,
    pub internal_ip: Option<String>,
    pub external_ip: Option<String>,
    pub cpu: String,
    pub memory: String,
    pub ready_after: Duration,
    /// What the node's bootstrap set of the kernel limits QuestDB needs.
    pub kernel: KernelLimits,
}

/// The kernel limits a node's containers run under: what its user data set, else the
/// defaults of a node nobody configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLimits {
    /// `vm.max_map_count`: the kernel's default is 65,530 (`DEFAULT_MAX_MAP_COUNT`,
    /// include/linux/mm.h).
    pub max_map_count: u64,
    /// A container's `RLIMIT_NOFILE`: containerd's default OCI spec gives 1,024
    /// (`oci.populateDefaultUnixSpec`).
    pub open_files: u64,
}

impl KernelLimits {
    pub const UNCONFIGURED: KernelLimits = KernelLimits {
        max_map_count: 65_530,
        open_files: 1_024,
    };
}

impl NodeRegistration {
    /// A shared worker node.
    pub fn worker(name: &str, zone: &str) -> Self {
        Self {
            name: name.into(),
            zone: zone.into(),
            labels: BTreeMap::new(),
            taints: vec![],
            provider_id: None,
            internal_ip: None,
            external_ip: None,
            cpu: "16".into(),
            memory: "64Gi".into(),
            ready_after: timings::NODE_READY_DELAY,
            kernel: KernelLimits::UNCONFIGURED,
        }
    }

    /// The Node an EC2 instance's kubelet registers, from its rendered user data: the labels
    /// and taints of `--node-labels` / `--register-with-taints`, wherever the bootstrap
    /// format puts them (AL2023 `NodeConfig` kubelet flags, Bottlerocket's TOML settings, a
    /// shell line). Fails as the kubelet fails to start: no flags, a malformed label or taint,
    /// or a label the kubelet may not set on itself (NodeRestriction).
    pub fn from_user_data(
        name: &str,
        zone: &str,
        instance_id: &str,
        internal_ip: Option<String>,
        user_data: &str,
    ) -> anyhow::Result<Self> {
        let text = decode_user_data(user_data);
        let flags = match nodeadm_kubelet_flags(&text)? {
            Some(flags) => Some(flags),
            None => bottlerocket_kubelet_flags(&text)?,
        };
        let (labels_flag, taints_flag) = match flags {
            Some(flags) => flags,
            None => (
                flag(&text, "--node-labels=")
                    .context("user data: no --node-labels flag for the kubelet")?,
                flag(&text, "--register-with-taints=")
                    .context("user data: no --register-with-taints flag for the kubelet")?,
            ),
        };
        let mut reg = Self::worker(name, zone);
        reg.provider_id = Some(format!("aws:///{zone}/{instance_id}"));
        reg.internal_ip = internal_ip;
        reg.cpu = "2".into();
        reg.memory = "8Gi".into();
        reg.labels = parse_labels(&labels_flag)?;
        reg.taints = parse_taints(&taints_flag)?;
        reg.kernel = kernel_limits(&text)?;
        Ok(reg)
    }
}

/// The kernel limits the user data sets, read as the node would: nodeadm merges
/// `spec.containerd.baseRuntimeSpec` into containerd's default OCI spec (its
/// `process.rlimits` entry of type `RLIMIT_NOFILE`), cloud-init runs a `text/x-shellscript`
/// part (a line that writes `vm.max_map_count = N` to a sysctl file and loads it, or runs
/// `sysctl -w vm.max_map_count=N`), and Bottlerocket applies `settings.kernel.sysctl` and
/// `settings.oci-defaults.resource-limits.max-open-files`. What is not set keeps the
/// defaults; a value that is not a number fails, as nodeadm and Bottlerocket refuse it.
fn kernel_limits(text: &str) -> anyhow::Result<KernelLimits> {
    let mut limits = KernelLimits::UNCONFIGURED;
    if text.contains("application/node.eks.aws") {
        if let Some(body) = nodeconfig_body(text) {
            let doc: serde_json::Value = serde_yaml_ng::from_str(body)
                .context("nodeadm user data: NodeConfig is not YAML")?;
            let rlimits = &doc["spec"]["containerd"]["baseRuntimeSpec"]["process"]["rlimits"];
            for r in rlimits.as_array().into_iter().flatten() {
                if r["type"] == "RLIMIT_NOFILE" {
                    limits.open_files = r["soft"].as_u64().context(
                        "nodeadm user data: an RLIMIT_NOFILE without a numeric soft limit",
                    )?;
                }
            }
        }
        for line in text.lines() {
            if let Some(n) = shell_max_map_count(line) {
                limits.max_map_count = n?;
            }
        }
    } else if text.contains("[settings.") {
        let doc: toml::Table = text
            .parse()
            .context("Bottlerocket user data is not valid TOML")?;
        let settings = doc.get("settings");
        if let Some(v) = settings
            .and_then(|s| s.get("kernel"))
            .and_then(|k| k.get("sysctl"))
            .and_then(|s| s.get("vm.max_map_count"))
        {
            limits.max_map_count = v
                .as_str()
                .and_then(|v| v.parse().ok())
                .context("Bottlerocket user data: vm.max_map_count is not a quoted number")?;
        }
        if let Some(v) = settings
            .and_then(|s| s.get("oci-defaults"))
            .and_then(|o| o.get("resource-limits"))
            .and_then(|r| r.get("max-open-files"))
            .and_then(|m| m.get("soft-limit"))
        {
            limits.open_files = v
                .as_integer()
                .and_then(|v| u64::try_from(v).ok())
                .context("Bottlerocket user data: max-open-files soft-limit is not a number")?;
        }
    }
    Ok(limits)
}

/// The body of the `application/node.eks.aws` part.
fn nodeconfig_body(text: &str) -> Option<&str> {
    let start = text.find("Content-Type: application/node.eks.aws")?;
    let body = text[start..].split_once("\n\n")?.1;
    Some(body.split("\n--").next().unwrap_or(body))
}

/// `vm.max_map_count` as a shell line of user data sets it (`echo "vm.max_map_count = N" >`
/// a sysctl file, or `sysctl -w vm.max_map_count=N`); `None` for any other line.
fn shell_max_map_count(line: &str) -> Option<anyhow::Result<u64>> {
    if line.trim_start().starts_with('#') {
        return None;
    }
    let rest = line.split("vm.max_map_count").nth(1)?;
    let value: String = rest
        .trim_start_matches([' ', '=', '\t'])
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    Some(
        value
            .parse()
            .with_context(|| format!("user data: vm.max_map_count in {line:?} is not a number")),
    )
}

/// AL2023's `nodeadm`: user data that is a MIME multi-part document is searched for a part of
/// type `application/node.eks.aws` holding a `NodeConfig`, whose cluster name, API endpoint, CA
/// and service CIDR are required (awslabs.github.io/amazon-eks-ami/nodeadm). A node whose
/// NodeConfig lacks one never joins, so neither does this one. `None` when the user data is
/// not for nodeadm (a shell script).
fn nodeadm_kubelet_flags(text: &str) -> anyhow::Result<Option<(String, String)>> {
    if !text.contains("application/node.eks.aws") {
        return Ok(None);
    }
    let boundary = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("Content-Type:")?.trim();
            rest.starts_with("multipart/mixed")
                .then(|| rest.split("boundary=").nth(1))
                .flatten()
                .map(|b| b.trim_matches('"').to_string())
        })
        .context("nodeadm user data: no `Content-Type: multipart/mixed; boundary=...` header")?;
    let delimiter = format!("--{boundary}");
    let part = text
        .split(delimiter.as_str())
        .skip(1)
        .map(|p| p.trim_start_matches(['\r', '\n']))
        .find(|p| {
            p.lines()
                .take_while(|l| !l.trim().is_empty())
                .any(|l| l.trim() == "Content-Type: application/node.eks.aws")
        })
        .context("nodeadm user data: no part of type application/node.eks.aws")?;
    let body = part
        .split_once("\n\n")
        .map(|(_, b)| b)
        .context("nodeadm user data: the NodeConfig part has no body")?;
    let doc: serde_json::Value =
        serde_yaml_ng::from_str(body).context("nodeadm user data: NodeConfig is not YAML")?;
    anyhow::ensure!(
        doc["apiVersion"] == "node.eks.aws/v1alpha1" && doc["kind"] == "NodeConfig",
        "nodeadm user data: not a node.eks.aws/v1alpha1 NodeConfig: {doc}"
    );
    let cluster = &doc["spec"]["cluster"];
    let field = |name: &str| -> anyhow::Result<String> {
        cluster[name]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .with_context(|| format!("nodeadm user data: spec.cluster.{name} is missing"))
    };
    field("name")?;
    let endpoint = field("apiServerEndpoint")?;
    anyhow::ensure!(
        endpoint.starts_with("https://"),
        "nodeadm user data: apiServerEndpoint {endpoint:?} is not an https URL"
    );
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(field("certificateAuthority")?)
        .context("nodeadm user data: certificateAuthority is not base64")?;
    let cidr = field("cidr")?;
    let (ip, bits) = cidr
        .split_once('/')
        .with_context(|| format!("nodeadm user data: cidr {cidr:?} is not a CIDR"))?;
    anyhow::ensure!(
        ip.parse::<std::net::IpAddr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 128),
        "nodeadm user data: cidr {cidr:?} is not a CIDR"
    );
    let flags: Vec<&str> = doc["spec"]["kubelet"]["flags"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f.as_str()).collect())
        .unwrap_or_default();
    let value = |prefix: &str| -> anyhow::Result<String> {
        flags
            .iter()
            .find_map(|f| f.strip_prefix(prefix))
            .map(str::to_string)
            .with_context(|| format!("nodeadm user data: no {prefix} in spec.kubelet.flags"))
    };
    Ok(Some((
        value("--node-labels=")?,
        value("--register-with-taints=")?,
    )))
}

/// Bottlerocket: user data that is TOML with a `[settings.kubernetes]` table
/// (bottlerocket.dev/en/os/latest/api/settings/kubernetes). Its labels and taints are tables,
/// a taint's value a list of `value:Effect`; `api-server` and `cluster-certificate` are
/// required to join a cluster that is not auto-configured, and `cluster-dns-ip` is looked up
/// through EKS's DescribeCluster when missing, which a node role without that permission
/// cannot do, so a node without one never runs a pod that needs DNS: refused here. A
/// malformed document stops Bottlerocket's settings from applying at all. Returned in the
/// kubelet's flag syntax; `None` when the user data is not Bottlerocket's.
fn bottlerocket_kubelet_flags(text: &str) -> anyhow::Result<Option<(String, String)>> {
    if !text.contains("[settings.") {
        return Ok(None);
    }
    let doc: toml::Table = text
        .parse()
        .context("Bottlerocket user data is not valid TOML")?;
    let k8s = doc
        .get("settings")
        .and_then(|s| s.get("kubernetes"))
        .and_then(toml::Value::as_table)
        .context("Bottlerocket user data: no [settings.kubernetes]")?;
    let field = |name: &str| -> anyhow::Result<&str> {
        k8s.get(name)
            .and_then(toml::Value::as_str)
            .filter(|v| !v.is_empty())
            .with_context(|| {
                format!("Bottlerocket user data: settings.kubernetes.{name} is missing")
            })
    };
    field("cluster-name")?;
    let endpoint = field("api-server")?;
    anyhow::ensure!(
        endpoint.starts_with("https://"),
        "Bottlerocket user data: api-server {endpoint:?} is not an https URL"
    );
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(field("cluster-certificate")?)
        .context("Bottlerocket user data: cluster-certificate is not base64")?;
    let dns = field("cluster-dns-ip")?;
    anyhow::ensure!(
        dns.parse::<std::net::IpAddr>().is_ok(),
        "Bottlerocket user data: cluster-dns-ip {dns:?} is not an IP address"
    );
    let table = |name: &str| -> anyhow::Result<toml::Table> {
        match k8s.get(name) {
            None => Ok(toml::Table::new()),
            Some(v) => v.as_table().cloned().with_context(|| {
                format!("Bottlerocket user data: settings.kubernetes.{name} is not a table")
            }),
        }
    };
    let mut labels = Vec::new();
    for (k, v) in table("node-labels")? {
        let v = v
            .as_str()
            .with_context(|| format!("Bottlerocket user data: node label {k} is not a string"))?;
        labels.push(format!("{k}={v}"));
    }
    let mut taints = Vec::new();
    for (k, v) in table("node-taints")? {
        // A list of `value:Effect`; older releases took one such string.
        let entries: Vec<&str> = match &v {
            toml::Value::String(one) => vec![one.as_str()],
            toml::Value::Array(many) => many.iter().filter_map(toml::Value::as_str).collect(),
            _ => anyhow::bail!("Bottlerocket user data: node taint {k} is not value:Effect"),
        };
        for entry in entries {
            let (value, effect) = entry.rsplit_once(':').with_context(|| {
                format!("Bottlerocket user data: node taint {k} = {entry:?} is not value:Effect")
            })?;
            taints.push(if value.is_empty() {
                format!("{k}:{effect}")
            } else {
                format!("{k}={value}:{effect}")
            });
        }
    }
    Ok(Some((labels.join(","), taints.join(","))))
}

fn decode_user_data(raw: &str) -> String {
    use base64::Engine as _;
    if raw.contains("--node-labels") {
        return raw.to_string();
    }
    base64::engine::general_purpose::STANDARD
        .decode(raw.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| raw.to_string())
}

fn flag(text: &str, prefix: &str) -> Option<String> {
    let start = text.find(prefix)? + prefix.len();
    let value: String = text[start..]
        .chars()
        .take_while(|c| !c.is_whitespace() && !matches!(c, '"' | '\'' | ']' | '\\'))
        .collect();
    Some(value.trim_end_matches(',').to_string())
}

/// kubelet `--node-labels` validation (cmd/kubelet/app/options: `ValidateNodeLabels`): labels
/// under kubernetes.io / k8s.io only from the allowed list, never `node-restriction.kubernetes.io/`.
fn parse_labels(flag: &str) -> anyhow::Result<BTreeMap<String, String>> {
    const ALLOWED: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
    ];
    let mut out = BTreeMap::new();
    for pair in flag.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("kubelet: malformed --node-labels entry {pair:?}"))?;
        let domain = k.split_once('/').map(|(d, _)| d).unwrap_or("");
        let restricted = domain == "kubernetes.io"
            || domain == "k8s.io"
            || domain.ends_with(".kubernetes.io")
            || domain.ends_with(".k8s.io");
        let allowed = ALLOWED.contains(&k)
            || domain == "kubelet.kubernetes.io"
            || domain.ends_with(".kubelet.kubernetes.io")
            || domain == "node.kubernetes.io"
            || domain.ends_with(".node.kubernetes.io");
        if restricted && !allowed {
            bail!("kubelet: unknown 'kubernetes.io' or 'k8s.io' label {k:?} in --node-labels");
        }
        if k.is_empty() || v.len() > 63 || k.rsplit('/').next().is_none_or(|n| n.len() > 63) {
            bail!("kubelet: invalid label {k}={v}");
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

fn parse_taints(flag: &str) -> anyhow::Result<Vec<Taint>> {
    let mut out = vec![];
    for t in flag.split(',').filter(|p| !p.is_empty()) {
        let (kv, effect) = t
            .rsplit_once(':')
            .with_context(|| format!("kubelet: taint {t:?} has no effect"))?;
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            bail!("kubelet: taint {t:?} has an invalid effect");
        }
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (kv, None),
        };
        out.push(Taint {
            key: key.into(),
            value,
            effect: effect.into(),
            time_added: None,
        });
    }
    Ok(out)
}

/// A node's fault, as a test or a sandbox user sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// The instance is off: no heartbeat, no pod changes.
    PowerOff,
    /// The node's network is cut: no heartbeat, no pod changes, and nothing outside the node
    /// (the operator, the database's clients) reaches its databases; the instance (and
    /// whatever it mounted) keeps running. The databases' processes are paused (SIGSTOP) for
    /// as long as it lasts: from outside, a connection that never answers, as a partitioned
    /// address's does. Unlike a real partition, their own timers pause too (and the local
    /// probes are not run), which no test relies on.
    Partition,
    /// Only the kubelet has lost the API server (an access entry or certificate gone, a
    /// security group, a saturated link): no heartbeat, no pod changes, but the databases run
    /// on and answer their clients and the operator, as under a kubelet restart.
    KubeletCutOff,
    /// Alive but NotReady, as a kubelet whose container runtime or CNI restarts is: it renews
    /// its Lease and reports `Ready=False` (`PLEG is not healthy`) on every status post, skips
    /// pod syncs (kubelet.go `syncLoop`: "skipping pod synchronization"), and its containers
    /// keep running.
    NotReady,
    /// The instance's OS shuts down normally (StopInstances without `Force`): no heartbeat
    /// from now on; every container gets SIGTERM and its grace period, then the volumes are
    /// unmounted cleanly, so the kernel writes back everything it held.
    ShuttingDown,
}

struct NodeState {
    fault: Mutex<Fault>,
    /// The same fault, for the databases that act on it at once.
    faults: watch::Sender<Fault>,
    /// Real databases: pods started on the node (their addresses).
    pods_started: AtomicU32,
    databases: Option<Arc<Runtime>>,
    /// Real databases: the node's loopback network `127.a.b.0/24` (its address is `.1`, its
    /// pods' are the others).
    loopback: (u8, u8),
    /// What the kubelet reports in `volumesInUse`: every volume a pod scheduled here wants,
    /// from before it is attached, so the attach-detach controller leaves it attached.
    volumes_in_use: Mutex<BTreeSet<String>>,
    /// The `volumesInUse` of the newest node status the API accepted. The kubelet mounts a
    /// volume only once it is reported here: the attach-detach controller checks
    /// `volumesInUse` after it has taken the volume out of `volumesAttached` and before it
    /// detaches, so between the two flags a detach and a mount never both go ahead.
    reported_in_use: Mutex<BTreeSet<String>>,
    /// What the node's OS has mounted: only volumes attached for a pod (the kubelet mounts
    /// once `volumesAttached` lists a volume). Unlike `volumes_in_use`, a volume merely
    /// wanted is not mounted, and detaches (a detach the controller decided before a new
    /// pod here asked for it completes; EBS refuses it only for a mounted volume).
    mounts: Mutex<BTreeSet<String>>,
    /// Its containers ignore SIGTERM: each stop takes the whole grace period, until the
    /// kubelet kills them (a JVM flushing a large table, or a hung process).
    stops_take_grace: std::sync::atomic::AtomicBool,
    /// Every unmount fails ("device or resource busy"): a stopped pod's volumes stay mounted
    /// and in use, and the kubelet, which deletes a terminated pod only once its volumes are
    /// unmounted, leaves it Terminating.
    unmounts_fail: std::sync::atomic::AtomicBool,
    changed: Notify,
    stop: CancellationToken,
    index: u32,
    registration: NodeRegistration,
}

/// A joined node, to fault, heal or stop.
#[derive(Clone)]
pub struct NodeHandle {
    pub name: String,
    state: Arc<NodeState>,
}

impl NodeHandle {
    pub fn fault(&self) -> Fault {
        *self.state.fault.lock().unwrap()
    }

    pub fn set_fault(&self, fault: Fault) {
        *self.state.fault.lock().unwrap() = fault;
        self.state.faults.send_replace(fault);
        if fault == Fault::PowerOff {
            self.kill_databases();
        }
        self.state.changed.notify_one();
    }

    /// From now on, a container stopped on this node takes its whole grace period.
    pub fn stops_take_the_grace_period(&self) {
        self.state.stops_take_grace.store(true, Ordering::Relaxed);
    }

    /// From now on, every unmount on this node fails.
    pub fn fail_unmounts(&self) {
        self.state.unmounts_fail.store(true, Ordering::Relaxed);
    }

    pub fn power_off(&self) {
        self.set_fault(Fault::PowerOff)
    }

    pub fn partition(&self) {
        self.set_fault(Fault::Partition)
    }

    /// The kubelet alone loses the API server (see [`Fault::KubeletCutOff`]).
    pub fn cut_kubelet_off(&self) {
        self.set_fault(Fault::KubeletCutOff)
    }

    /// A normal OS shutdown (see [`Fault::ShuttingDown`]).
    pub fn shut_down(&self) {
        self.set_fault(Fault::ShuttingDown)
    }

    /// The network (or the power) comes back. An OS shutdown under way goes on: a partition
    /// that heals does not undo a StopInstances the instance already received.
    pub fn heal(&self) {
        if self.fault() != Fault::ShuttingDown {
            self.set_fault(Fault::None)
        }
    }

    /// The kubelet restarts (a kubelet upgrade, a crash that systemd restarts): for `down` it
    /// renews nothing and reports nothing, as when cut off; started again, it reports NotReady
    /// until its first PLEG relist ([`timings::KUBELET_START`]), then Ready. Its containers
    /// run on throughout: they belong to the container runtime, not to the kubelet. Returns
    /// once the kubelet is back.
    pub async fn restart(&self, down: Duration) {
        self.cut_kubelet_off();
        tokio::time::sleep(down).await;
        self.set_fault(Fault::NotReady);
        tokio::time::sleep(timings::KUBELET_START).await;
        self.heal();
    }

    /// The kubelet stops for good (its instance is gone); the Node object stays, as it does
    /// until something deletes it.
    pub fn stop(&self) {
        self.state.stop.cancel();
        self.kill_databases();
    }

    /// Declares the node shut down as a person or an operator does: the
    /// `node.kubernetes.io/out-of-service` taint, set once (false on a conflict with the
    /// node-lifecycle controller, which edits the taints too: retry).
    pub async fn taint_out_of_service(&self, client: &Client) -> bool {
        let nodes: Api<Node> = Api::all(client.clone());
        let Ok(mut node) = nodes.get(&self.name).await else {
            return false;
        };
        let spec = node.spec.get_or_insert_with(Default::default);
        spec.taints.get_or_insert_with(Vec::new).push(Taint {
            key: "node.kubernetes.io/out-of-service".into(),
            value: Some("nodeshutdown".into()),
            effect: "NoExecute".into(),
            ..Default::default()
        });
        nodes
            .replace(&self.name, &PostParams::default(), &node)
            .await
            .is_ok()
    }

    pub fn internal_ip(&self) -> String {
        node_ip(&self.state)
    }

    pub(crate) fn healthy(&self) -> bool {
        self.fault() == Fault::None && !self.state.stop.is_cancelled()
    }

    /// The instance is gone or off: every QuestDB on it dies at once, before anything else
    /// can happen in the cluster.
    fn kill_databases(&self) {
        if let Some(db) = &self.state.databases {
            db.kill_node(self.state.index);
        }
    }

    pub(crate) fn faults(&self) -> watch::Receiver<Fault> {
        self.state.faults.subscribe()
    }

    /// Cancelled when the kubelet stops for good.
    pub(crate) fn stopped(&self) -> CancellationToken {
        self.state.stop.clone()
    }

    pub(crate) fn index(&self) -> u32 {
        self.state.index
    }

    /// A loopback address of its own for a real database pod, in the node's network.
    pub(crate) fn next_pod_ip(&self) -> String {
        let n = self.state.pods_started.fetch_add(1, Ordering::Relaxed);
        format!("{}.{}", real_pod_net(self.state.loopback), 2 + n % 253)
    }
}

fn node_ip(state: &NodeState) -> String {
    state
        .registration
        .internal_ip
        .clone()
        .unwrap_or_else(|| format!("127.{}.{}.1", state.loopback.0, state.loopback.1))
}

/// The kubelets of one control plane.
#[derive(Clone)]
pub struct Kubelets {
    client: Client,
    nodes: Arc<Mutex<BTreeMap<String, NodeHandle>>>,
    next_index: Arc<AtomicU32>,
    stop: CancellationToken,
    databases: Option<Arc<Runtime>>,
    /// The fake EBS: a terminated instance's stuck detaches complete.
    csi: Arc<crate::csi::Switches>,
    /// Told the Node name once a node's OS has halted after a normal stop (its databases
    /// stopped, its volumes unmounted): the cloud then reports the instance stopped.
    on_halted: Arc<Mutex<Option<HaltedHook>>>,
    /// See [`Kubelets::on_pod_addresses`].
    on_pod_addresses: Arc<Mutex<Option<PodAddressHook>>>,
    /// Signs each kubelet's serving certificate (`crate::kubelet_api`).
    ca: Arc<KubeletCa>,
}

/// See [`Kubelets::on_os_halted`].
pub type HaltedHook = Arc<dyn Fn(&str) + Send + Sync>;

/// See [`Kubelets::on_pod_addresses`].
pub type PodAddressHook =
    Arc<dyn Fn(String, Vec<String>) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

impl Kubelets {
    /// `databases`: run real QuestDB for database pods (else they are only reported running).
    /// `ca` signs the serving certificate of each kubelet's API (`crate::kubelet_api`).
    pub fn start(
        client: Client,
        stop: CancellationToken,
        databases: Option<Arc<Runtime>>,
        csi: Arc<crate::csi::Switches>,
        ca: Arc<KubeletCa>,
    ) -> Kubelets {
        let k = Kubelets {
            client,
            nodes: Arc::default(),
            next_index: Arc::default(),
            stop,
            databases,
            csi,
            on_halted: Arc::default(),
            on_pod_addresses: Arc::default(),
            ca,
        };
        tokio::spawn(run_pods(k.clone()));
        k
    }

    /// `hook(node name)` runs when a node's normal shutdown is done (every database process
    /// on it ended, every volume unmounted), as EC2 learns that an instance's OS halted.
    pub fn on_os_halted(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        *self.on_halted.lock().unwrap() = Some(Arc::new(hook));
    }

    /// `hook(node name, CIDR blocks)` runs when a node joins, before it registers: the
    /// addresses its pods will get, as the VPC CNI's ipamd assigns them to the instance's
    /// network interface ahead of any pod (its warm pool; with prefix delegation, /28
    /// prefixes: `AssignPrivateIpAddresses --ipv4-prefix-count`). The stand-in hands out each
    /// node's pod addresses from two loopback /24s (real database pods, reported pods), so it
    /// assigns those two blocks: EC2 then shows every address a pod of the node can report, and
    /// none of another node's.
    pub fn on_pod_addresses(
        &self,
        hook: impl Fn(String, Vec<String>) -> futures::future::BoxFuture<'static, ()>
            + Send
            + Sync
            + 'static,
    ) {
        *self.on_pod_addresses.lock().unwrap() = Some(Arc::new(hook));
    }

    pub fn get(&self, name: &str) -> Option<NodeHandle> {
        self.nodes.lock().unwrap().get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        self.nodes.lock().unwrap().keys().cloned().collect()
    }

    /// Registers the Node (and its Lease and CSINode) and starts its heartbeat.
    pub async fn join(&self, mut reg: NodeRegistration) -> anyhow::Result<NodeHandle> {
        let index = self.next_index.fetch_add(1, Ordering::Relaxed);
        let loopback = database::node_network();
        if self.databases.is_some() && reg.internal_ip.is_none() {
            // Host ports of real databases are forwarded from the node's address, which must
            // be one this machine answers on.
            reg.internal_ip = Some(format!("127.{}.{}.1", loopback.0, loopback.1));
        }
        let state = Arc::new(NodeState {
            fault: Mutex::new(Fault::None),
            faults: watch::channel(Fault::None).0,
            pods_started: AtomicU32::new(0),
            databases: self.databases.clone(),
            loopback,
            volumes_in_use: Mutex::default(),
            reported_in_use: Mutex::default(),
            mounts: Mutex::default(),
            stops_take_grace: Default::default(),
            unmounts_fail: Default::default(),
            changed: Notify::new(),
            stop: self.stop.child_token(),
            index,
            registration: reg.clone(),
        });
        let handle = NodeHandle {
            name: reg.name.clone(),
            state: state.clone(),
        };
        let hook = self.on_pod_addresses.lock().unwrap().clone();
        if let Some(hook) = hook {
            let blocks = vec![
                format!("{}.0/24", real_pod_net(loopback)),
                format!("{}.0/24", fake_pod_net(index)),
            ];
            hook(reg.name.clone(), blocks).await;
        }
        register(&self.client, &state)
            .await
            .with_context(|| format!("registering node {}", reg.name))?;
        tokio::spawn(register_csi_driver(self.client.clone(), state.clone()));
        if let Some(old) = self
            .nodes
            .lock()
            .unwrap()
            .insert(reg.name.clone(), handle.clone())
        {
            old.stop();
            // Joining again is a reboot: the OS starts with nothing mounted.
            self.csi.unmount_all(&reg.name);
        }
        kubelet_api::spawn(
            kubelet_api::NodeApi {
                name: reg.name.clone(),
                ip: node_ip(&state),
                started: std::time::SystemTime::now(),
                node_index: index,
                client: self.client.clone(),
                databases: self.databases.clone(),
                faults: state.faults.subscribe(),
                stop: state.stop.clone(),
            },
            &self.ca,
        );
        tokio::spawn(heartbeat(self.client.clone(), state));
        info!(node = %reg.name, "node joined");
        Ok(handle)
    }

    /// Stops a node's kubelet and forgets it; its instance holds no mount any more.
    pub fn leave(&self, name: &str) {
        if let Some(h) = self.nodes.lock().unwrap().remove(name) {
            h.stop();
        }
        self.csi.unmount_all(name);
    }

    /// An EC2 instance booted: its kubelet registers from the rendered user data. A bootstrap
    /// the kubelet rejects never registers, as on a real instance (the error says why).
    pub async fn instance_running(
        &self,
        node_name: &str,
        zone: &str,
        instance_id: &str,
        private_ip: Option<String>,
        user_data: &str,
    ) -> anyhow::Result<NodeHandle> {
        let reg =
            NodeRegistration::from_user_data(node_name, zone, instance_id, private_ip, user_data)
                .with_context(|| format!("instance {instance_id} never joins"))?;
        self.join(reg).await
    }

    /// The instance is gone: its kubelet stops, and the Node object is deleted once the
    /// node-lifecycle controller has marked it NotReady, as the AWS cloud-controller-manager's
    /// cloud-node-lifecycle controller does (it deletes only NotReady nodes whose instance no
    /// longer exists; k8s.io/cloud-provider/controllers/nodelifecycle).
    pub fn instance_terminated(&self, node_name: &str) {
        self.leave(node_name);
        self.csi.detach_sticks_on.lock().unwrap().remove(node_name);
        self.once_not_ready(node_name, |nodes, node| async move {
            let name = node.name_any();
            nodes.delete(&name, &DeleteParams::default()).await.is_ok()
        });
    }

    /// EC2 has begun to stop the instance: normally (`graceful`: the OS shuts down, see
    /// [`Fault::ShuttingDown`]) or forced (the power goes at once: what the node's kernel had
    /// not written back is lost). A node already off stays as it is.
    pub fn instance_stopping(&self, node_name: &str, graceful: bool) {
        let Some(node) = self.nodes.lock().unwrap().get(node_name).cloned() else {
            return;
        };
        match (node.fault(), graceful) {
            (Fault::PowerOff, _) => {}
            (_, false) => node.power_off(),
            (Fault::ShuttingDown, true) => {}
            (_, true) => node.shut_down(),
        }
        if !graceful {
            return;
        }
        let Some(hook) = self.on_halted.lock().unwrap().clone() else {
            return;
        };
        let (name, databases, index) =
            (node_name.to_string(), self.databases.clone(), node.index());
        tokio::spawn(async move {
            // An OS that does not halt is stopped by EC2 after its own timeout.
            let deadline = tokio::time::Instant::now() + timings::DATABASE_STOP_MAX * 2;
            while databases.as_ref().is_some_and(|d| !d.node_quiet(index))
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            if databases.as_ref().is_none_or(|d| d.node_quiet(index)) {
                hook(&name);
            }
        });
    }

    /// The instance is stopped (StopInstances, or a power loss EC2 reports as stopped): its
    /// kubelet stops and the Node **stays**; once it is NotReady the cloud controller taints it
    /// `node.cloudprovider.kubernetes.io/shutdown:NoSchedule`, as the AWS
    /// cloud-controller-manager does for a shut-down instance
    /// (k8s.io/cloud-provider/controllers/nodelifecycle: `ShutdownTaint`).
    pub fn instance_stopped(&self, node_name: &str) {
        self.leave(node_name);
        self.once_not_ready(node_name, |nodes, node| async move {
            let mut taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            if taints.iter().any(|t| t.key == SHUTDOWN_TAINT) {
                return true;
            }
            taints.push(Taint {
                key: SHUTDOWN_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            });
            let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version},
                               "spec": {"taints": taints}});
            nodes
                .patch(
                    &node.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .is_ok()
        });
    }

    /// What the cloud controller does to the Node of an instance that stopped or ended, once
    /// the node-lifecycle controller has marked it NotReady (checked every monitor period);
    /// `act` returns false to be tried again. Nothing happens if the Node is gone.
    fn once_not_ready<F, Fut>(&self, node_name: &str, act: F)
    where
        F: Fn(Api<Node>, Node) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send,
    {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let name = node_name.to_string();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                match nodes.get_opt(&name).await {
                    Ok(Some(node)) => {
                        let ready = node
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            });
                        if !ready && act(nodes.clone(), node).await {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(_) => {}
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(timings::node_monitor_period()) => {}
                }
            }
        });
    }
}

/// The cloud controller's taint on the Node of a shut-down instance.
pub const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// A joining node's Ready message.
const JOINING: &str = "container runtime network not ready: NetworkReady=false (CNI not initialized); CSI driver not registered";
/// What a kubelet whose runtime stopped answering reports (pkg/kubelet/pleg/generic.go).
const PLEG_NOT_HEALTHY: &str =
    "PLEG is not healthy: pleg was last seen active 3m5.1s ago; threshold is 3m0s";

fn conditions(ready: bool, not_ready: &str) -> serde_json::Value {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let cond = |t: &str, status: &str, reason: &str, message: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!([
        cond(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available"
        ),
        cond(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure"
        ),
        cond(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available"
        ),
        if ready {
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
            )
        } else {
            cond("Ready", "False", "KubeletNotReady", not_ready)
        },
    ])
}

/// The kubelet's Lease for `node`, renewed now: owned by its Node while the Node exists (the
/// kubelet's lease controller sets the owner only when it knows the Node's uid).
fn node_lease(node: &str, node_uid: Option<&str>) -> Lease {
    let owners = node_uid
        .map(|uid| vec![json!({"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid})]);
    serde_json::from_value(json!({
        "metadata": {"name": node, "namespace": "kube-node-lease", "ownerReferences": owners},
        "spec": {"holderIdentity": node,
                 "leaseDurationSeconds": timings::node_lease_duration().as_secs(),
                 "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())},
    }))
    .expect("a Lease")
}

async fn register(client: &Client, state: &NodeState) -> anyhow::Result<()> {
    let reg = &state.registration;
    let mut labels = reg.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), reg.name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), "amd64".into());
    labels.insert(ZONE_LABEL.into(), reg.zone.clone());
    labels.insert(
        "topology.kubernetes.io/region".into(),
        crate::control_plane::REGION.into(),
    );
    let mut addresses = vec![
        json!({"type": "InternalIP", "address": node_ip(state)}),
        json!({"type": "Hostname", "address": reg.name}),
    ];
    if let Some(ip) = &reg.external_ip {
        addresses.push(json!({"type": "ExternalIP", "address": ip}));
    }
    let resources =
        json!({"cpu": reg.cpu, "memory": reg.memory, "pods": "110", "ephemeral-storage": "100Gi"});
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": reg.name,
            "labels": labels,
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true",
                            "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"providerID": reg.provider_id, "taints": reg.taints},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": conditions(false, JOINING),
            "addresses": addresses,
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "osImage": "Amazon Linux 2023",
                "kernelVersion": "6.1", "containerRuntimeVersion": "containerd://2.1.0", "operatingSystem": "linux",
                "architecture": "amd64", "machineID": "", "systemUUID": "", "bootID": format!("boot-{}", state.index)},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        },
    }))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let created = match nodes.create(&PostParams::default(), &node).await {
        Ok(n) => n,
        Err(kube::Error::Api(e)) if e.code == 409 => nodes.get(&reg.name).await?,
        Err(e) => return Err(e.into()),
    };
    let lease = node_lease(&reg.name, created.uid().as_deref());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    // The kubelet creates the CSINode without drivers; the driver is added once its node
    // plugin registers, after the node is Ready (see `register_csi_driver`).
    let csinode: CSINode = serde_json::from_value(json!({
        "metadata": {"name": reg.name,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": reg.name, "uid": created.uid()}]},
        "spec": {"drivers": []},
    }))?;
    match Api::<CSINode>::all(client.clone())
        .create(&PostParams::default(), &csinode)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// The EBS CSI node plugin starts once the node is Ready and registers its driver a moment
/// later: until then an attach to this node fails.
async fn register_csi_driver(client: Client, state: Arc<NodeState>) {
    let reg = &state.registration;
    tokio::select! {
        _ = state.stop.cancelled() => return,
        _ = tokio::time::sleep(reg.ready_after + timings::CSI_DRIVER_REGISTRATION) => {}
    }
    let driver = json!({"name": DRIVER, "nodeID": reg.provider_id.clone().unwrap_or(reg.name.clone()),
        "topologyKeys": [ZONE_LABEL], "allocatable": {"count": ATTACHABLE_VOLUMES}});
    let patch = json!({"spec": {"drivers": [driver]}});
    let api = Api::<CSINode>::all(client);
    for _ in 0..10 {
        if api
            .patch(&reg.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .is_ok()
        {
            return;
        }
        tokio::select! {
            _ = state.stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
    warn!(node = %reg.name, "CSI driver never registered");
}

/// Lease renewals and NodeStatus posts while the node is healthy.
async fn heartbeat(client: Client, state: Arc<NodeState>) {
    let name = state.registration.name.clone();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::default();
    let joined = Instant::now();
    let mut posted_ready = false;
    let mut posted_volumes: Option<BTreeSet<String>> = None;
    let mut last_status = Instant::now();
    let mut was_faulted = false;
    loop {
        tokio::select! {
            _ = state.stop.cancelled() => return,
            _ = tokio::time::sleep(timings::node_lease_renew()) => {}
            _ = state.changed.notified() => {}
        }
        let fault = *state.fault.lock().unwrap();
        if matches!(
            fault,
            Fault::PowerOff | Fault::Partition | Fault::KubeletCutOff | Fault::ShuttingDown
        ) {
            was_faulted = true;
            continue;
        }
        let renew = json!({"spec": {"renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
                                     "holderIdentity": name}});
        match leases.patch(&name, &pp, &Patch::Merge(&renew)).await {
            Ok(_) => {}
            // Garbage-collected with a deleted Node: the kubelet's lease controller creates it
            // again (without an owner, the Node being gone) and keeps renewing
            // (component-helpers lease controller, `ensureLease`).
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let lease = node_lease(&name, None);
                if let Err(e) = leases.create(&PostParams::default(), &lease).await {
                    debug!(node = %name, error = %e, "lease re-create failed");
                }
            }
            Err(e) => debug!(node = %name, error = %e, "lease renew failed"),
        }
        let ready = joined.elapsed() >= state.registration.ready_after && fault != Fault::NotReady;
        let volumes = state.volumes_in_use.lock().unwrap().clone();
        let due = ready != posted_ready
            || posted_volumes.as_ref() != Some(&volumes)
            || last_status.elapsed() >= timings::node_status_report()
            || was_faulted;
        if !due {
            continue;
        }
        let in_use: Vec<String> = volumes.iter().cloned().collect();
        let not_ready = if fault == Fault::NotReady {
            PLEG_NOT_HEALTHY
        } else {
            JOINING
        };
        let patch =
            json!({"status": {"conditions": conditions(ready, not_ready), "volumesInUse": in_use}});
        match nodes
            .patch_status(&name, &pp, &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {
                posted_ready = ready;
                *state.reported_in_use.lock().unwrap() = volumes.clone();
                posted_volumes = Some(volumes);
                last_status = Instant::now();
                was_faulted = false;
            }
            // A kubelet never registers again once registered (`registrationCompleted` in
            // pkg/kubelet/kubelet_node_status.go, 1.37): it keeps failing to post its status,
            // renewing its Lease and running its pods, with no Node.
            Err(kube::Error::Api(e)) if e.code == 404 => {
                debug!(node = %name, "node object deleted; the kubelet runs on without one");
            }
            Err(e) => debug!(node = %name, error = %e, "node status post failed"),
        }
        if !ready {
            // Ready comes after `ready_after`, not at the next renew.
            let wait = state
                .registration
                .ready_after
                .saturating_sub(joined.elapsed());
            if wait < timings::node_lease_renew() {
                let s = state.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    s.changed.notify_one();
                });
            }
        }
    }
}

#[derive(Debug)]
enum PodPhase {
    /// Volumes requested (in `volumesInUse`), waiting for them to attach.
    Starting,
    /// Volumes attached at this instant; containers start.
    Attached(Instant),
    Running,
    Stopping(Instant),
}

struct PodRun {
    node: String,
    volumes: Vec<String>,
    phase: PodPhase,
    /// Its volumes were attached and mounted on the node.
    mounted: bool,
    busy: bool,
    /// A real database runs the pod's containers.
    db: Option<database::PodHandle>,
    /// The API has shown the pod Ready as this kubelet posted it: a later not-ready is
    /// someone else's word, not this kubelet's own post still on its way to the cache.
    seen_ready: bool,
    /// Its wait for volumes to attach has been logged.
    waits_logged: bool,
}

/// Whether the Node as the API holds it now lists every one of `volumes` in
/// `volumesAttached`: the kubelet's check before it mounts a controller-attached volume (a
/// live GET of the Node, `GenerateVerifyControllerAttachedVolumeFunc` in
/// pkg/volume/util/operationexecutor/operation_generator.go, which also refuses a volume not
/// yet reported in `volumesInUse`).
async fn attached_now(client: &Client, node: &str, volumes: &[String]) -> bool {
    if volumes.is_empty() {
        return true;
    }
    let Ok(Some(n)) = Api::<Node>::all(client.clone()).get_opt(node).await else {
        return false;
    };
    let attached = attached_volumes(n.status);
    volumes.iter().all(|v| attached.contains(v))
}

/// The volumes a Node's status lists in `volumesAttached`.
fn attached_volumes(status: Option<k8s_openapi::api::core::v1::NodeStatus>) -> BTreeSet<String> {
    status
        .and_then(|s| s.volumes_attached)
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect()
}

/// `namespace/name` of a pod, for the debug lines.
fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

impl PodRun {
    /// A real database still runs on the pod's volumes.
    fn processes_live(&self) -> bool {
        self.db.as_ref().is_some_and(|d| !d.finished())
    }
}

/// The pod side of every kubelet: one loop over the shared caches.
async fn run_pods(k: Kubelets) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pods = crate::cache::store::<Pod>(&k.client, &k.stop, tx.clone());
    let nodes = crate::cache::store::<Node>(&k.client, &k.stop, tx.clone());
    let pvcs = crate::cache::store::<PersistentVolumeClaim>(&k.client, &k.stop, tx.clone());
    let pvs = crate::cache::store::<PersistentVolume>(&k.client, &k.stop, tx);
    let runs: Arc<Mutex<BTreeMap<String, PodRun>>> = Arc::default();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    loop {
        tokio::select! {
            _ = k.stop.cancelled() => return,
            _ = rx.recv() => {}
            _ = done_rx.recv() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let all_pods = pods.state();
        let live: BTreeSet<String> = all_pods.iter().filter_map(|p| p.uid()).collect();
        // Pods deleted (by us or force-deleted): their volumes are unmounted by their kubelet.
        let gone: Vec<(String, PodRun)> = {
            let mut r = runs.lock().unwrap();
            // A kubelet cut off from the cluster unmounts only once it is back.
            let ids: Vec<String> = r
                .iter_mut()
                .filter(|(u, run)| {
                    !live.contains(*u) && k.get(&run.node).is_none_or(|h| h.healthy())
                })
                .filter_map(|(u, run)| {
                    // A real database stops first (the kubelet kills the containers of a pod
                    // the API no longer has: pod_workers.go); its volumes go after it exited.
                    if let Some(db) = &run.db {
                        db.stop_with_spec_grace();
                        if !db.finished() {
                            run.phase = PodPhase::Stopping(Instant::now());
                            return None;
                        }
                    }
                    Some(u.clone())
                })
                .collect();
            ids.into_iter()
                .filter_map(|u| r.remove(&u).map(|run| (u, run)))
                .collect()
        };
        for (uid, run) in gone {
            debug!(%uid, node = %run.node, volumes = ?run.volumes, "kubelet: pod gone from the API; unmounting");
            if let Some(h) = k.get(&run.node) {
                if h.healthy() && !h.state.unmounts_fail.load(Ordering::Relaxed) {
                    unmount(&h, &run.volumes, &runs, &k.csi);
                }
            }
        }
        for pod in all_pods.iter() {
            let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let Some(handle) = k.get(&node_name) else {
                continue;
            };
            if !handle.healthy() {
                continue;
            }
            let uid = pod.uid().unwrap_or_default();
            let mut r = runs.lock().unwrap();
            let run = r.entry(uid.clone()).or_insert_with(|| {
                debug!(pod = %pod_key(pod), %uid, node = %node_name, "kubelet: pod admitted");
                PodRun {
                    node: node_name.clone(),
                    volumes: vec![],
                    phase: PodPhase::Starting,
                    mounted: false,
                    busy: false,
                    db: None,
                    seen_ready: false,
                    waits_logged: false,
                }
            });
            if run.busy {
                continue;
            }
            if pod.metadata.deletion_timestamp.is_some() {
                let grace = pod
                    .metadata
                    .deletion_grace_period_seconds
                    .unwrap_or(30)
                    .max(0) as u64;
                let stop_after = if handle.state.stops_take_grace.load(Ordering::Relaxed) {
                    Duration::from_secs(grace)
                } else {
                    timings::CONTAINER_STOP.min(Duration::from_secs(grace))
                };
                if let Some(db) = &run.db {
                    db.stop(Duration::from_secs(grace));
                }
                let stopped = |since: Instant| match &run.db {
                    Some(db) => db.finished(),
                    None => since.elapsed() >= stop_after,
                };
                let unmounts_fail = handle.state.unmounts_fail.load(Ordering::Relaxed);
                match run.phase {
                    // Stopped, but the unmount fails and is retried: the pod stays.
                    PodPhase::Stopping(since) if stopped(since) && unmounts_fail => {}
                    PodPhase::Stopping(since) if stopped(since) => {
                        run.busy = true;
                        let volumes = run.volumes.clone();
                        drop(r);
                        unmount(&handle, &volumes, &runs, &k.csi);
                        let (client, pod, runs, done) =
                            (k.client.clone(), pod.clone(), runs.clone(), done_tx.clone());
                        tokio::spawn(async move {
                            finish_pod(&client, &pod).await;
                            if let Some(run) = runs.lock().unwrap().get_mut(&uid) {
                                run.busy = false;
                            }
                            let _ = done.send(());
                        });
                    }
                    PodPhase::Stopping(_) => {}
                    _ => {
                        debug!(pod = %pod_key(pod), %uid, "kubelet: stopping the pod's containers");
                        run.phase = PodPhase::Stopping(Instant::now())
                    }
                }
                continue;
            }
            match run.phase {
                PodPhase::Starting => {
                    let Some(volumes) = pod_volumes(pod, &pvcs, &pvs) else {
                        continue;
                    };
                    if run.volumes != volumes {
                        run.volumes = volumes.clone();
                        let mut in_use = handle.state.volumes_in_use.lock().unwrap();
                        let before = in_use.len();
                        in_use.extend(volumes.iter().cloned());
                        if in_use.len() != before {
                            handle.state.changed.notify_one();
                        }
                    }
                    let attached = attached_volumes(
                        nodes
                            .get(&ObjectRef::new(&node_name))
                            .and_then(|n| n.status.clone()),
                    );
                    let reported = handle.state.reported_in_use.lock().unwrap().clone();
                    if !volumes
                        .iter()
                        .all(|v| attached.contains(v) && reported.contains(v))
                    {
                        if !run.waits_logged {
                            run.waits_logged = true;
                            debug!(pod = %pod_key(pod), %uid, ?volumes, ?attached, ?reported, "kubelet: waiting for the pod's volumes to be reported in use and attached");
                        }
                        continue;
                    }
                    // The cache may still list a volume the controller has since taken out of
                    // `volumesAttached` to detach it: like the kubelet, ask the API itself.
                    run.busy = true;
                    drop(r);
                    let (client, runs, done, csi, handle, pod_name) = (
                        k.client.clone(),
                        runs.clone(),
                        done_tx.clone(),
                        k.csi.clone(),
                        handle.clone(),
                        pod_key(pod),
                    );
                    tokio::spawn(async move {
                        let attached = attached_now(&client, &node_name, &volumes).await;
                        let mut r = runs.lock().unwrap();
                        if let Some(run) = r.get_mut(&uid) {
                            run.busy = false;
                            if attached && matches!(run.phase, PodPhase::Starting) {
                                debug!(pod = %pod_name, %uid, "kubelet: volumes attached and mounted");
                                let mut mounts = handle.state.mounts.lock().unwrap();
                                mounts.extend(volumes.iter().cloned());
                                csi.set_mounted(&node_name, &mounts);
                                run.mounted = true;
                                run.phase = PodPhase::Attached(Instant::now());
                            }
                        }
                        drop(r);
                        let _ = done.send(());
                    });
                }
                PodPhase::Attached(since) if since.elapsed() >= timings::CONTAINER_START => {
                    if let (Some(rt), Some(_)) = (&k.databases, database::database_container(pod)) {
                        let Some(claims) = pod_claim_handles(pod, &pvcs, &pvs) else {
                            continue;
                        };
                        run.db = Some(database::start(
                            rt.clone(),
                            Pod::clone(pod),
                            handle.clone(),
                            claims,
                            done_tx.clone(),
                        ));
                        run.phase = PodPhase::Running;
                        continue;
                    }
                    run.busy = true;
                    drop(r);
                    let ip = pod_ip(&handle, pod);
                    let (client, pod, runs, done) =
                        (k.client.clone(), pod.clone(), runs.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        let ok = start_pod(&client, &pod, &ip).await;
                        debug!(pod = %pod_key(&pod), %uid, ok, "kubelet: containers started");
                        let endless = pod.spec.as_ref().is_some_and(|s| {
                            s.containers
                                .iter()
                                .any(|c| c.image.as_deref().is_some_and(crate::hostile::is_endless))
                        });
                        if ok && endless {
                            crate::hostile::serve(&ip);
                        }
                        if let Some(run) = runs.lock().unwrap().get_mut(&uid) {
                            run.busy = false;
                            if ok {
                                run.phase = PodPhase::Running;
                            }
                        }
                        let _ = done.send(());
                    });
                }
                // The node-lifecycle controller marked the pod of a silent node not ready; the
                // kubelet, back, finds the API's status differs from its own and posts its own
                // again (status_manager.go `needsReconcile`). A real database's runner does the
                // same for its pod.
                PodPhase::Running if run.db.is_none() && !run.seen_ready => {
                    run.seen_ready = pod_ready(pod);
                }
                PodPhase::Running if run.db.is_none() && !pod_ready(pod) => {
                    run.busy = true;
                    drop(r);
                    let (client, pod, runs, done) =
                        (k.client.clone(), pod.clone(), runs.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        mark_ready(&client, &pod).await;
                        if let Some(run) = runs.lock().unwrap().get_mut(&uid) {
                            run.busy = false;
                        }
                        let _ = done.send(());
                    });
                }
                _ => {}
            }
        }
    }
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The conditions of a pod whose containers run and are ready, all True since `now`.
fn ready_conditions(now: &Time) -> serde_json::Value {
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    json!([
        cond("PodReadyToStartContainers"),
        cond("Initialized"),
        cond("Ready"),
        cond("ContainersReady"),
        cond("PodScheduled")
    ])
}

/// Posts the running pod's conditions as the kubelet sees them (all True).
async fn mark_ready(client: &Client, pod: &Pod) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let patch = json!({"metadata": {"uid": pod.uid()}, "status": {
        "conditions": ready_conditions(&now),
    }});
    if let Err(e) = api
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        debug!(pod = %pod.name_any(), error = %e, "pod status reconcile failed");
    }
}

/// `kubernetes.io/csi/<driver>^<volumeHandle>` for each CSI volume of the pod; `None` while a
/// claim is unbound.
fn pod_volumes(
    pod: &Pod,
    pvcs: &Store<PersistentVolumeClaim>,
    pvs: &Store<PersistentVolume>,
) -> Option<Vec<String>> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out = vec![];
    for v in pod.spec.as_ref()?.volumes.iter().flatten() {
        let Some(claim) = &v.persistent_volume_claim else {
            continue;
        };
        let pvc = pvcs.get(&ObjectRef::new(&claim.claim_name).within(&ns))?;
        let pv_name = pvc
            .spec
            .as_ref()?
            .volume_name
            .clone()
            .filter(|n| !n.is_empty())?;
        let pv = pvs.get(&ObjectRef::new(&pv_name))?;
        let csi = pv.spec.as_ref()?.csi.as_ref()?;
        out.push(crate::csi::unique_volume_name(
            &csi.driver,
            &csi.volume_handle,
        ));
    }
    Some(out)
}

/// The volume handle of each PersistentVolumeClaim volume of the pod, by volume name; `None`
/// while a claim is unbound.
fn pod_claim_handles(
    pod: &Pod,
    pvcs: &Store<PersistentVolumeClaim>,
    pvs: &Store<PersistentVolume>,
) -> Option<BTreeMap<String, String>> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out = BTreeMap::new();
    for v in pod.spec.as_ref()?.volumes.iter().flatten() {
        let Some(claim) = &v.persistent_volume_claim else {
            continue;
        };
        let pvc = pvcs.get(&ObjectRef::new(&claim.claim_name).within(&ns))?;
        let pv_name = pvc
            .spec
            .as_ref()?
            .volume_name
            .clone()
            .filter(|n| !n.is_empty())?;
        let pv = pvs.get(&ObjectRef::new(&pv_name))?;
        let csi = pv.spec.as_ref()?.csi.as_ref()?;
        out.insert(v.name.clone(), csi.volume_handle.clone());
    }
    Some(out)
}

fn unmount(
    handle: &NodeHandle,
    volumes: &[String],
    runs: &Arc<Mutex<BTreeMap<String, PodRun>>>,
    csi: &crate::csi::Switches,
) {
    // A volume another pod on the node still wants (or a database still runs on) stays in
    // use, and mounted if that pod mounted it.
    let (still_wanted, still_mounted) = {
        let runs = runs.lock().unwrap();
        let others: Vec<&PodRun> = runs
            .values()
            .filter(|r| {
                r.node == handle.name
                    && (!matches!(r.phase, PodPhase::Stopping(_)) || r.processes_live())
            })
            .collect();
        let wanted: BTreeSet<String> = others
            .iter()
            .flat_map(|r| r.volumes.iter().cloned())
            .collect();
        let mounted: BTreeSet<String> = others
            .iter()
            .filter(|r| r.mounted)
            .flat_map(|r| r.volumes.iter().cloned())
            .collect();
        (wanted, mounted)
    };
    let mut mounts = handle.state.mounts.lock().unwrap();
    mounts.retain(|v| !volumes.contains(v) || still_mounted.contains(v));
    csi.set_mounted(&handle.name, &mounts);
    drop(mounts);
    let mut in_use = handle.state.volumes_in_use.lock().unwrap();
    let before = in_use.len();
    in_use.retain(|v| !volumes.contains(v) || still_wanted.contains(v));
    if in_use.len() != before {
        handle.state.changed.notify_one();
    }
}

fn pod_ip(handle: &NodeHandle, pod: &Pod) -> String {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        return handle.internal_ip();
    }
    let n = pod
        .uid()
        .unwrap_or_default()
        .bytes()
        .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(b as u32));
    format!("{}.{}", fake_pod_net(handle.state.index), n % 250 + 2)
}

/// The first three octets of a node's real database pods' addresses (its loopback network):
/// what the node's ipamd hook assigns to the instance, and where `next_pod_ip` draws from.
fn real_pod_net(loopback: (u8, u8)) -> String {
    format!("127.{}.{}", loopback.0, loopback.1)
}

/// The first three octets of a node's reported (fake) pods' addresses, as [`real_pod_net`].
fn fake_pod_net(index: u32) -> String {
    format!("127.{FAKE_POD_OCTET}.{}", index % 256)
}

/// Second octet of the fake pods' addresses: loopback, so an operator that connects to a pod
/// (write health, a backup's checkpoint) is refused at once and never reaches out of the
/// machine, and outside both the nodes' networks and the cloud's instance addresses
/// (`database::CLOUD_LOOPBACK_FIRST` up to 254), so nothing real listens there.
const FAKE_POD_OCTET: u8 = 255;

async fn start_pod(client: &Client, pod: &Pod, ip: &str) -> bool {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let containers: Vec<serde_json::Value> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": format!("docker.io/{}", c.image.clone().unwrap_or_default()),
                   "containerID": format!("containerd://{}", pod.uid().unwrap_or_default()),
                   "ready": true, "started": true, "restartCount": 0,
                   "state": {"running": {"startedAt": now}}})
        })
        .collect();
    let host_ip = ip_of_node(client, pod).await;
    let patch = json!({"status": {
        "phase": "Running",
        "conditions": ready_conditions(&now),
        "podIP": ip, "podIPs": [{"ip": ip}],
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "startTime": now,
        "containerStatuses": containers,
    }});
    match api
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => true,
        Err(e) => {
            debug!(pod = %pod.name_any(), error = %e, "pod status update failed");
            false
        }
    }
}

async fn ip_of_node(client: &Client, pod: &Pod) -> String {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return String::new();
    };
    Api::<Node>::all(client.clone())
        .get_opt(&node)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.status)
        .and_then(|s| s.addresses)
        .and_then(|a| a.into_iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address)
        .unwrap_or_default()
}

/// Containers stopped and volumes unmounted: the kubelet deletes the pod object for good.
async fn finish_pod(client: &Client, pod: &Pod) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&pod.name_any(), &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => {
            warn!(pod = %pod.name_any(), error = %e, "kubelet could not delete a stopped pod")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_flags_become_labels_and_taints() {
        let ud = "#!/bin/bash\n/etc/eks/bootstrap.sh c --kubelet-extra-args '--node-labels=a.io/x=1,b=2 --register-with-taints=k=v:NoSchedule'\n";
        let r = NodeRegistration::from_user_data("n", "z", "i-1", None, ud).unwrap();
        assert_eq!(r.labels.get("a.io/x").map(String::as_str), Some("1"));
        assert_eq!(r.taints.len(), 1);
        assert_eq!(r.taints[0].value.as_deref(), Some("v"));
        assert_eq!(r.provider_id.as_deref(), Some("aws:///z/i-1"));
    }

    fn nodeadm(cluster: &str, flags: &str) -> String {
        format!(
            "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"B\"\n\n--B\nContent-Type: application/node.eks.aws\n\n---\napiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  cluster:\n{cluster}  kubelet:\n    flags:\n{flags}\n--B--\n"
        )
    }

    const CLUSTER: &str = "    name: c\n    apiServerEndpoint: https://x.eks.amazonaws.com\n    certificateAuthority: Y2E=\n    cidr: 10.100.0.0/16\n";
    const FLAGS: &str =
        "      - \"--node-labels=q.io/d=x\"\n      - \"--register-with-taints=q.io/d=x:NoSchedule\"\n";

    #[test]
    fn a_nodeadm_node_config_joins_with_its_kubelet_flags() {
        let r = NodeRegistration::from_user_data("n", "z", "i-1", None, &nodeadm(CLUSTER, FLAGS))
            .unwrap();
        assert_eq!(r.labels.get("q.io/d").map(String::as_str), Some("x"));
        assert_eq!(r.taints[0].effect, "NoSchedule");
    }

    #[test]
    fn a_node_config_without_endpoint_ca_or_cidr_never_joins() {
        for drop in ["apiServerEndpoint", "certificateAuthority", "cidr", "name"] {
            let cluster: String = CLUSTER
                .lines()
                .filter(|l| !l.trim_start().starts_with(&format!("{drop}:")))
                .map(|l| format!("{l}\n"))
                .collect();
            let err =
                NodeRegistration::from_user_data("n", "z", "i", None, &nodeadm(&cluster, FLAGS))
                    .unwrap_err();
            assert!(format!("{err:#}").contains(drop), "{err:#}");
        }
        let no_taint = "      - \"--node-labels=q.io/d=x\"\n";
        assert!(
            NodeRegistration::from_user_data("n", "z", "i", None, &nodeadm(CLUSTER, no_taint))
                .is_err()
        );
    }

    const BOTTLEROCKET: &str = "[settings.kubernetes]\ncluster-name = \"c\"\napi-server = \"https://x.eks.amazonaws.com\"\ncluster-certificate = \"Y2E=\"\ncluster-dns-ip = \"10.100.0.10\"\n\n[settings.kubernetes.node-labels]\n\"q.io/d\" = \"x\"\n\"node.kubernetes.io/exclude-from-external-load-balancers\" = \"true\"\n\n[settings.kubernetes.node-taints]\n\"q.io/d\" = [\"x:NoSchedule\"]\n\"q.io/boot\" = \":NoExecute\"\n";

    #[test]
    fn a_bottlerocket_node_joins_with_the_labels_and_taints_of_its_toml_settings() {
        use base64::Engine as _;
        let encoded = base64::engine::general_purpose::STANDARD.encode(BOTTLEROCKET);
        let r = NodeRegistration::from_user_data("n", "z", "i-1", None, &encoded).unwrap();
        assert_eq!(r.labels.get("q.io/d").map(String::as_str), Some("x"));
        assert_eq!(r.labels.len(), 2, "{:?}", r.labels);
        assert_eq!(r.taints.len(), 2, "{:?}", r.taints);
        assert!(r
            .taints
            .iter()
            .any(|t| t.key == "q.io/boot" && t.value.is_none() && t.effect == "NoExecute"));
    }

    #[test]
    fn a_bottlerocket_node_without_its_cluster_settings_or_valid_toml_never_joins() {
        for drop in [
            "api-server",
            "cluster-certificate",
            "cluster-dns-ip",
            "cluster-name",
        ] {
            let text: String = BOTTLEROCKET
                .lines()
                .filter(|l| !l.starts_with(&format!("{drop} =")))
                .map(|l| format!("{l}\n"))
                .collect();
            let err = NodeRegistration::from_user_data("n", "z", "i", None, &text).unwrap_err();
            assert!(format!("{err:#}").contains(drop), "{err:#}");
        }
        let broken = BOTTLEROCKET.replace("cluster-name = \"c\"", "cluster-name = c");
        let err = NodeRegistration::from_user_data("n", "z", "i", None, &broken).unwrap_err();
        assert!(format!("{err:#}").contains("not valid TOML"), "{err:#}");
        let restricted = BOTTLEROCKET.replace(
            "\"q.io/d\" = \"x\"",
            "\"node-restriction.kubernetes.io/x\" = \"y\"",
        );
        assert!(NodeRegistration::from_user_data("n", "z", "i", None, &restricted).is_err());
    }

    #[test]
    fn nodeconfig_flags_in_yaml_lists_parse() {
        let ud = "spec:\n  kubelet:\n    flags:\n      - \"--node-labels=q.io/d=x\"\n      - \"--register-with-taints=q.io/d=x:NoSchedule\"\n";
        let r = NodeRegistration::from_user_data("n", "z", "i-1", None, ud).unwrap();
        assert_eq!(r.labels.len(), 1);
        assert_eq!(r.taints[0].effect, "NoSchedule");
    }

    #[test]
    fn a_kubelet_refuses_restricted_labels_and_missing_flags() {
        let ud =
            "--node-labels=node-restriction.kubernetes.io/x=1 --register-with-taints=a:NoSchedule";
        assert!(NodeRegistration::from_user_data("n", "z", "i", None, ud).is_err());
        assert!(NodeRegistration::from_user_data("n", "z", "i", None, "echo hi").is_err());
        let bad_taint = "--node-labels=a=b --register-with-taints=a=b:Sometimes";
        assert!(NodeRegistration::from_user_data("n", "z", "i", None, bad_taint).is_err());
    }
}

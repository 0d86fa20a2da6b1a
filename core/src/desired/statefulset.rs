//! The StatefulSet that runs the single database pod.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, HTTPGetAction,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    SeccompProfile, SecretVolumeSource, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use sha2::{Digest, Sha256};

use super::credentials;
use super::labels::{
    child_annotations, child_labels, child_meta, non_empty, non_empty_vec, selector_labels,
};
use super::pod_options::overlay;
use super::{
    names, port_names, CONFIG_HASH_ANNOTATION, CONFIG_RESTART_ANNOTATION, CONTAINER_NAME,
    HEALTH_PORT, HTTP_PORT, ILP_AUTH_KEY, ILP_PORT, LOG_CONF_KEY, PGWIRE_PORT, QUESTDB_UID,
    ROOT_DIR, SERVER_CONF_KEY,
};
use crate::api::QuestDB;

/// Label on a dedicated node, and key of its taint; the value is [`dedicated_label_value`].
pub const DEDICATED_LABEL_KEY: &str = "crd.questdb.io/dedicated";
/// Key of the taint that keeps every other pod off a dedicated node.
pub const DEDICATED_TAINT_KEY: &str = "crd.questdb.io/dedicated";
/// Effect of the dedicated-node taint.
pub const DEDICATED_TAINT_EFFECT: &str = "NoSchedule";
/// Label the operator sets on a dedicated node once it has matched the Node to the instance it
/// launched (by providerID); the value is the instance id. The pod selects on it, so it lands
/// only on the node of the instance in `status.instanceId`, never on a predecessor that is
/// still registered while it terminates, nor on a node of an earlier QuestDB of the same name.
/// NodeRestriction forbids kubelets to set `node-restriction.kubernetes.io/` labels on their
/// own Node, so a compromised node cannot attract a database by labelling itself
/// (<https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction>).
pub const PIN_LABEL_KEY: &str = "node-restriction.kubernetes.io/questdb-instance";
/// Pin value while no instance is recorded: no node carries it, so the pod waits in Pending.
pub const PIN_AWAITING_INSTANCE: &str = "awaiting-instance";

/// The most a label value may hold.
const LABEL_VALUE_MAX: usize = 63;
/// Hex digits of the hash that keeps shortened label values unique.
const LABEL_HASH_HEX: usize = 10;

const DATA_VOLUME: &str = "data";
const CONFIG_VOLUME: &str = "config";
const ILP_AUTH_VOLUME: &str = "ilp-auth";
/// QuestDB needs time to flush and close tables; Kubernetes' default 30s is cut close.
const TERMINATION_GRACE_SECONDS: i64 = 60;

/// The dedicated node a database is pinned to (AWS): it carries the label
/// `crd.questdb.io/dedicated=<label_value>`, the taint of the same key and value, and
/// [`PIN_LABEL_KEY`]`=<instance>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedicatedNode {
    pub label_value: String,
    /// The instance in `status.instanceId`; `None` while there is none.
    pub instance: Option<String>,
    /// The database's ports are bound on the node's address too ([`binds_host_ports`]).
    pub host_ports: bool,
}

impl DedicatedNode {
    /// The dedicated node for `qdb`, with [`dedicated_label_value`] as its value and the
    /// instance its status records.
    pub fn for_questdb(qdb: &QuestDB) -> Self {
        Self {
            label_value: dedicated_label_value(qdb),
            instance: qdb.status.as_ref().and_then(|s| s.instance_id.clone()),
            host_ports: binds_host_ports(qdb, None),
        }
    }

    /// With host ports as [`binds_host_ports`] decides for a StatefulSet whose template binds
    /// them now (`running`), if there is one.
    pub fn running_with_host_ports(mut self, qdb: &QuestDB, running: Option<bool>) -> Self {
        self.host_ports = binds_host_ports(qdb, running);
        self
    }

    /// The value of [`PIN_LABEL_KEY`] the pod selects.
    pub fn pin_value(&self) -> &str {
        self.instance.as_deref().unwrap_or(PIN_AWAITING_INSTANCE)
    }
}

/// Whether a dedicated database binds its ports on its node's address (`spec.node.hostPorts`).
/// Unset, only when `dns.public` needs it (a public address reaches the node, never a pod) or
/// the StatefulSet's template binds them now (`running`): an operator upgrade that dropped
/// them would restart every database at once, and move its clients' address. Without host
/// ports the pod needs no `privileged` namespace and the record names the pod's address.
pub fn binds_host_ports(qdb: &QuestDB, running: Option<bool>) -> bool {
    let Some(node) = &qdb.spec.node else {
        return false;
    };
    let public = qdb.spec.dns.as_ref().is_some_and(|d| d.public);
    match node.host_ports {
        // `false` with `dns.public` is refused by the schema; an object stored before keeps
        // the record reachable.
        Some(explicit) => explicit || public,
        None => public || running == Some(true),
    }
}

/// The value that ties a dedicated node to one QuestDB: `<namespace>.<name>`, which is unique
/// across the cluster. When that is longer than a label value may be (63), it is cut and a hash
/// of the full value appended, so two long names never share a node.
pub fn dedicated_label_value(qdb: &QuestDB) -> String {
    dedicated_label_value_for(&qdb.namespace().unwrap_or_default(), &qdb.name_any())
}

/// [`dedicated_label_value`] from a namespace and name (what an instance's tags carry).
pub fn dedicated_label_value_for(namespace: &str, name: &str) -> String {
    let full = format!("{namespace}.{name}");
    if full.len() <= LABEL_VALUE_MAX {
        return full;
    }
    let hash = hex::encode(Sha256::digest(full.as_bytes()));
    // Namespaces and names are ASCII, so byte slicing stays on character boundaries.
    let prefix = full[..LABEL_VALUE_MAX - LABEL_HASH_HEX - 1]
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{prefix}-{}", &hash[..LABEL_HASH_HEX])
}

/// The StatefulSet `<name>`: one replica (none while paused) running QuestDB with its whole root
/// directory on the `<name>-data` PVC and its configuration files mounted from ConfigMaps.
/// `config_hash` (see [`super::config_hash`]) goes into the pod template, so a config change is a
/// template change and restarts the pod. `dedicated` pins the pod to its own node.
/// `credentials` (the digest of [`super::credentials::check`]) does the same for the
/// credentials Secret, read by QuestDB at start only; `None` while the Secret is not readable
/// yet.
/// The seconds the database is given to close its tables when its pod stops.
pub fn termination_grace_seconds(qdb: &QuestDB) -> i64 {
    qdb.spec
        .pod
        .termination_grace_period_seconds
        .unwrap_or(TERMINATION_GRACE_SECONDS)
}

pub fn statefulset(
    qdb: &QuestDB,
    config_hash: &str,
    credentials: Option<credentials::Seen>,
    ilp_auth_enabled: bool,
    dedicated: Option<&DedicatedNode>,
) -> StatefulSet {
    let options = &qdb.spec.pod;
    let mut template_annotations = child_annotations(qdb);
    template_annotations.extend(options.annotations.clone());
    template_annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), config_hash.to_string());
    // The user's pod labels first: the operator's (the selector's) win.
    let mut template_labels = options.labels.clone();
    template_labels.extend(child_labels(qdb));
    let mut metadata = child_meta(qdb, names::statefulset(qdb));
    if !options.stateful_set_annotations.is_empty() {
        metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(options.stateful_set_annotations.clone());
    }
    if let Some(seen) = credentials {
        template_annotations.insert(
            credentials::CREDENTIALS_HASH_ANNOTATION.to_string(),
            seen.digest.to_string(),
        );
        metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                credentials::CREDENTIALS_SEEN_ANNOTATION.to_string(),
                seen.annotation(),
            );
    }

    StatefulSet {
        metadata,
        spec: Some(StatefulSetSpec {
            replicas: Some(if qdb.spec.paused { 0 } else { 1 }),
            service_name: Some(names::headless_service(qdb)),
            selector: LabelSelector {
                match_labels: Some(selector_labels(qdb)),
                ..LabelSelector::default()
            },
            // Parallel: with one replica ordering buys nothing, and OrderedReady would block a
            // replacement pod behind a stuck one.
            pod_management_policy: Some("Parallel".to_string()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".to_string()),
                ..StatefulSetUpdateStrategy::default()
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(template_labels),
                    annotations: Some(template_annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(qdb, ilp_auth_enabled, dedicated)),
            },
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

/// Every database runs under the instance id of its volume: the uid of its claim. QuestDB
/// recovers the checkpoint a volume holds only when it was taken under another, non-empty id,
/// so a volume restored from a backup (a new claim) starts at the backup's checkpoint, while
/// the same volume never rolls back to a checkpoint of its own: not at a restart, a failover
/// or a move, and not under a new QuestDB of the same name that adopts a retained claim (a
/// checkpoint left open by a deleted database stays on that volume). Without ids on both
/// sides QuestDB skips recovery and starts with everything the copy holds, writes after the
/// checkpoint included (checked on 9.2.0).
pub fn with_volume_instance_id(mut sts: StatefulSet, volume_uid: &str) -> StatefulSet {
    let container = sts
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .and_then(|p| p.containers.iter_mut().find(|c| c.name == CONTAINER_NAME));
    if let Some(c) = container {
        let env = c.env.get_or_insert_with(Vec::new);
        env.retain(|e| e.name != SNAPSHOT_INSTANCE_ID_ENV);
        // After the credentials, before the user's env (which may not name it: reserved).
        let at = env.len().min(credentials::HTTP_KEYS.len());
        env.insert(
            at,
            k8s_openapi::api::core::v1::EnvVar {
                name: SNAPSHOT_INSTANCE_ID_ENV.to_string(),
                value: Some(volume_uid.to_string()),
                ..Default::default()
            },
        );
    }
    sts
}

/// Marks the pod template with the digest of reloadable settings the database is restarted for
/// (`status.config.restartedFor`, see `plan::config_reload`); none, no mark.
pub fn with_config_restart(mut sts: StatefulSet, restarted_for: Option<&str>) -> StatefulSet {
    let Some(digest) = restarted_for else {
        return sts;
    };
    if let Some(meta) = sts.spec.as_mut().and_then(|s| s.template.metadata.as_mut()) {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(CONFIG_RESTART_ANNOTATION.to_string(), digest.to_string());
    }
    sts
}

/// The StatefulSet as a version upgrade's step wants it (see
/// [`crate::plan::version_upgrade::template`]): every container built from `spec_image` runs
/// `image` instead, and none at all while `stopped`.
pub fn with_version(
    mut sts: StatefulSet,
    spec_image: &str,
    image: &str,
    stopped: bool,
) -> StatefulSet {
    let Some(spec) = sts.spec.as_mut() else {
        return sts;
    };
    if stopped {
        spec.replicas = Some(0);
    }
    if image != spec_image {
        if let Some(pod) = spec.template.spec.as_mut() {
            let init = pod.init_containers.iter_mut().flatten();
            for c in pod.containers.iter_mut().chain(init) {
                if c.image.as_deref() == Some(spec_image) {
                    c.image = Some(image.to_string());
                }
            }
        }
    }
    sts
}

/// The image of the database container (what runs, for a StatefulSet the caches hold).
pub fn database_image(spec: Option<&StatefulSetSpec>) -> Option<&str> {
    spec?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == CONTAINER_NAME)?
        .image
        .as_deref()
}

/// The template's config hash and restart mark: what a pod made from it carries.
pub fn config_marks(sts: &StatefulSet) -> (Option<&str>, Option<&str>) {
    let annotations = sts
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref());
    let get = |key| annotations.and_then(|a| a.get(key)).map(String::as_str);
    (get(CONFIG_HASH_ANNOTATION), get(CONFIG_RESTART_ANNOTATION))
}

/// QuestDB's `cairo.snapshot.instance.id`.
pub const SNAPSHOT_INSTANCE_ID_ENV: &str = "QDB_CAIRO_SNAPSHOT_INSTANCE_ID";

fn pod_spec(qdb: &QuestDB, ilp_auth_enabled: bool, dedicated: Option<&DedicatedNode>) -> PodSpec {
    let mut volumes = vec![
        Volume {
            name: DATA_VOLUME.to_string(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: names::pvc(qdb),
                ..PersistentVolumeClaimVolumeSource::default()
            }),
            ..Volume::default()
        },
        config_map_volume(CONFIG_VOLUME, names::config_map(qdb)),
        Volume {
            name: SERVER_CONF_VOLUME.to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::server_conf_secret(qdb)),
                // Only the QuestDB user reads it: it holds the pgwire passwords.
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
    ];
    if ilp_auth_enabled {
        volumes.push(config_map_volume(
            ILP_AUTH_VOLUME,
            names::ilp_auth_config_map(qdb),
        ));
    }
    let options = &qdb.spec.pod;
    volumes.extend(options.extra_volumes.iter().cloned());
    PodSpec {
        // QuestDB never calls the Kubernetes API: a mounted token would only be something to
        // steal from a compromised database.
        automount_service_account_token: Some(false),
        init_containers: Some(vec![
            init_conf_container(qdb),
            link_server_conf_container(qdb),
        ]),
        containers: vec![questdb_container(
            qdb,
            ilp_auth_enabled,
            dedicated.is_some_and(|d| d.host_ports),
        )],
        volumes: Some(volumes),
        security_context: Some(overlay(
            PodSecurityContext {
                run_as_user: Some(QUESTDB_UID),
                run_as_group: Some(QUESTDB_UID),
                run_as_non_root: Some(true),
                fs_group: Some(QUESTDB_UID),
                // A large volume would otherwise be chown'ed file by file at every pod start.
                fs_group_change_policy: Some("OnRootMismatch".to_string()),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_string(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            },
            options.security_context.as_deref(),
        )),
        termination_grace_period_seconds: Some(termination_grace_seconds(qdb)),
        image_pull_secrets: non_empty_vec(options.image_pull_secrets.clone()),
        priority_class_name: options.priority_class_name.clone(),
        topology_spread_constraints: non_empty_vec(options.topology_spread_constraints.clone()),
        affinity: options.affinity.as_deref().cloned(),
        // QuestDB reads every QDB_* variable as a config override, and service links would
        // inject QDB_SERVICE_HOST and friends for any Service named `qdb` in the namespace.
        enable_service_links: Some(false),
        // On a dedicated node the pin alone (the schema refuses the user's selector and
        // tolerations there; dropping them here keeps the pin whatever an older schema let in).
        node_selector: match dedicated {
            Some(d) => Some(BTreeMap::from([
                (DEDICATED_LABEL_KEY.to_string(), d.label_value.clone()),
                (PIN_LABEL_KEY.to_string(), d.pin_value().to_string()),
            ])),
            None => non_empty(options.node_selector.clone()),
        },
        // The dedicated taint, never a wildcard: the pod must not land on (or stay on) nodes
        // that are tainted for any other reason, such as an out-of-service node. And, as the
        // DaemonSet controller gives its pods, not-ready and unreachable for good: a pod pinned
        // to its node has nowhere else to go, so evicting it after the default 300 s only
        // stops a database whose kubelet is NotReady but alive (PLEG, a CNI restart). A dead
        // node is the failover's to fence; its out-of-service taint still evicts the pod.
        tolerations: dedicated
            .map(|d| {
                let mut tolerations = vec![Toleration {
                    key: Some(DEDICATED_TAINT_KEY.to_string()),
                    operator: Some("Equal".to_string()),
                    value: Some(d.label_value.clone()),
                    effect: Some(DEDICATED_TAINT_EFFECT.to_string()),
                    ..Toleration::default()
                }];
                for key in [NOT_READY_TAINT, UNREACHABLE_TAINT] {
                    tolerations.push(Toleration {
                        key: Some(key.to_string()),
                        operator: Some("Exists".to_string()),
                        effect: Some("NoExecute".to_string()),
                        ..Toleration::default()
                    });
                }
                tolerations
            })
            .or_else(|| non_empty_vec(options.tolerations.clone())),
        ..PodSpec::default()
    }
}

/// The node-lifecycle controller's taints (`v1.TaintNodeNotReady`, `v1.TaintNodeUnreachable`).
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

fn config_map_volume(name: &str, config_map: String) -> Volume {
    Volume {
        name: name.to_string(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map,
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// On a dedicated node the database ports are also host ports: the DNS record names the
/// node's address, and without them a client resolving it would get "connection refused"
/// (the database listens on the pod IP). The node is the database's alone, so nothing else
/// wants these ports there; the health port stays pod-only (probes come from the kubelet).
fn questdb_container(qdb: &QuestDB, ilp_auth_enabled: bool, on_dedicated_node: bool) -> Container {
    let mut mounts = vec![
        data_mount(),
        server_conf_dir_mount(),
        file_mount(CONFIG_VOLUME, LOG_CONF_KEY),
    ];
    if ilp_auth_enabled {
        mounts.push(file_mount(ILP_AUTH_VOLUME, ILP_AUTH_KEY));
    }
    mounts.extend(qdb.spec.pod.extra_volume_mounts.iter().cloned());
    Container {
        name: CONTAINER_NAME.to_string(),
        image: Some(qdb.spec.image.clone()),
        image_pull_policy: qdb.spec.image_pull_policy.clone(),
        ports: Some(vec![
            container_port(port_names::HTTP, HTTP_PORT, on_dedicated_node),
            container_port(port_names::PGWIRE, PGWIRE_PORT, on_dedicated_node),
            container_port(port_names::ILP, ILP_PORT, on_dedicated_node),
            container_port(port_names::HEALTH, HEALTH_PORT, false),
        ]),
        // The credentials first: the schema refuses a user env var of the same name, and
        // Kubernetes lets a later duplicate win.
        env: non_empty_vec(
            credentials::env(qdb)
                .into_iter()
                .chain(super::memory::env(qdb))
                .chain(qdb.spec.env.iter().cloned())
                .collect(),
        ),
        // A database that exits at start (a bad config value, a malformed auth line: exit
        // code 55) leaves its last log lines in lastState.terminated.message, where status
        // and `kubectl describe` show them.
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        resources: qdb.spec.resources.clone(),
        volume_mounts: Some(mounts),
        // Startup may replay a large WAL: allow up to 30 minutes before liveness takes over.
        startup_probe: Some(status_probe(10, 5, 180)),
        readiness_probe: Some(status_probe(5, 3, 3)),
        // Restart only after a minute of silence: /status answers even under heavy load, so a
        // longer silence means the JVM is wedged.
        liveness_probe: Some(status_probe(10, 5, 6)),
        security_context: Some(container_security(qdb)),
        ..Container::default()
    }
}

/// Creates `conf/` on the volume as the QuestDB user before the database starts. Without it the
/// container runtime creates `conf/` as root while mounting `server.conf` into it, and QuestDB
/// cannot write the files it extracts there (`mime.types`, `date.formats`).
fn init_conf_container(qdb: &QuestDB) -> Container {
    Container {
        name: "init-conf".to_string(),
        image: Some(qdb.spec.image.clone()),
        image_pull_policy: qdb.spec.image_pull_policy.clone(),
        command: Some(vec![
            "mkdir".to_string(),
            "-p".to_string(),
            format!("{ROOT_DIR}/conf"),
        ]),
        // The pod's effective request is the larger of init and main, so copying the main
        // container's resources costs nothing and satisfies quotas that demand limits.
        resources: qdb.spec.resources.clone(),
        volume_mounts: Some(vec![data_mount()]),
        security_context: Some(container_security(qdb)),
        ..Container::default()
    }
}

/// Links `conf/server.conf` to the file of the `server.conf` Secret's directory
/// ([`SERVER_CONF_DIR`]). A Secret mounted as a directory is refreshed in place by the kubelet
/// (a subPath file never is), and QuestDB follows the link at every `reload_config()`: a change
/// of a reloadable setting or a pgwire password reaches the running database without a restart
/// (`super::reload`). `-f` replaces what an earlier pod left there (a subPath mount leaves an
/// empty file behind).
fn link_server_conf_container(qdb: &QuestDB) -> Container {
    Container {
        name: "link-server-conf".to_string(),
        command: Some(vec![
            "ln".to_string(),
            "-sfn".to_string(),
            format!("{SERVER_CONF_DIR}/{SERVER_CONF_KEY}"),
            format!("{ROOT_DIR}/conf/{SERVER_CONF_KEY}"),
        ]),
        ..init_conf_container(qdb)
    }
}

/// Where the `server.conf` Secret is mounted as a directory.
pub const SERVER_CONF_DIR: &str = "/etc/questdb/server-conf";
const SERVER_CONF_VOLUME: &str = "server-conf";

fn server_conf_dir_mount() -> VolumeMount {
    VolumeMount {
        name: SERVER_CONF_VOLUME.to_string(),
        mount_path: SERVER_CONF_DIR.to_string(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

fn data_mount() -> VolumeMount {
    VolumeMount {
        name: DATA_VOLUME.to_string(),
        mount_path: ROOT_DIR.to_string(),
        ..VolumeMount::default()
    }
}

/// One file of a ConfigMap at `conf/<key>`. subPath, because mounting the whole ConfigMap over
/// `conf/` would hide the files QuestDB keeps there; subPath files are not refreshed in place,
/// which is fine for files QuestDB reads at start only (the config hash restarts the pod).
fn file_mount(volume: &str, key: &str) -> VolumeMount {
    VolumeMount {
        name: volume.to_string(),
        mount_path: format!("{ROOT_DIR}/conf/{key}"),
        sub_path: Some(key.to_string()),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

fn container_port(name: &str, port: i32, on_host: bool) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_string()),
        container_port: port,
        host_port: on_host.then_some(port),
        protocol: Some("TCP".to_string()),
        ..ContainerPort::default()
    }
}

/// GET `/status` on the health server, which answers even while the main HTTP server is busy.
fn status_probe(period_seconds: i32, timeout_seconds: i32, failure_threshold: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/status".to_string()),
            port: IntOrString::String(port_names::HEALTH.to_string()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period_seconds),
        timeout_seconds: Some(timeout_seconds),
        failure_threshold: Some(failure_threshold),
        ..Probe::default()
    }
}

/// The `restricted` Pod Security level's container fields, under the user's
/// `containerSecurityContext` (the init container runs as the database does, so the directory
/// it makes is the database's).
fn container_security(qdb: &QuestDB) -> SecurityContext {
    let mut sc = overlay(
        SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        },
        qdb.spec.pod.container_security_context.as_deref(),
    );
    // Whatever `capabilities` the user set: every one is dropped and at most
    // NET_BIND_SERVICE added back, as the restricted Pod Security Standard requires
    // (validation refuses the rest; this holds for objects stored before it did).
    let add: Vec<String> = sc
        .capabilities
        .as_ref()
        .and_then(|c| c.add.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c == "NET_BIND_SERVICE")
        .take(1)
        .collect();
    sc.capabilities = Some(Capabilities {
        drop: Some(vec!["ALL".to_string()]),
        add: (!add.is_empty()).then_some(add),
    });
    sc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::labels::owner_references;
    use crate::desired::testing::questdb;
    use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const HASH: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

    fn spec(sts: &StatefulSet) -> StatefulSetSpec {
        sts.spec.clone().unwrap_or_default()
    }

    fn pod(sts: &StatefulSet) -> PodSpec {
        spec(sts).template.spec.unwrap_or_default()
    }

    fn container(sts: &StatefulSet) -> Container {
        pod(sts)
            .containers
            .into_iter()
            .find(|c| c.name == "questdb")
            .unwrap_or_default()
    }

    fn mounts(c: &Container) -> Vec<(String, String, Option<String>)> {
        c.volume_mounts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|m| (m.name, m.mount_path, m.sub_path))
            .collect()
    }

    #[test]
    fn database_pods_carry_no_service_account_token() {
        let qdb = questdb("db1", "ns");
        let sts = statefulset(&qdb, HASH, None, true, None);
        let pod = sts.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
    }

    #[test]
    fn runs_one_replica_behind_the_headless_service() {
        let qdb = questdb("db1", "tenant-a");
        let sts = statefulset(&qdb, HASH, None, true, None);
        assert_eq!(sts.metadata.name.as_deref(), Some("db1"));
        assert_eq!(sts.metadata.namespace.as_deref(), Some("tenant-a"));
        assert_eq!(sts.metadata.owner_references, Some(owner_references(&qdb)));
        let spec = spec(&sts);
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.service_name.as_deref(), Some("db1-headless"));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(
            spec.update_strategy.and_then(|u| u.type_).as_deref(),
            Some("RollingUpdate")
        );
        assert!(spec.volume_claim_templates.is_none());
    }

    #[test]
    fn paused_database_scales_to_zero() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.paused = true;
        assert_eq!(
            spec(&statefulset(&qdb, HASH, None, true, None)).replicas,
            Some(0)
        );
    }

    #[test]
    fn selector_is_the_operators_labels_and_the_template_carries_user_labels() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.metadata.labels = Some([("team".to_string(), "payments".to_string())].into());
        qdb.metadata.annotations = Some([("owner".to_string(), "alice".to_string())].into());
        let sts = statefulset(&qdb, HASH, None, true, None);
        let spec = spec(&sts);
        assert_eq!(spec.selector.match_labels, Some(selector_labels(&qdb)));
        let meta = spec.template.metadata.unwrap_or_default();
        assert_eq!(meta.labels, Some(child_labels(&qdb)));
        let annotations = meta.annotations.unwrap_or_default();
        assert_eq!(annotations.get("owner").map(String::as_str), Some("alice"));
        assert_eq!(
            annotations
                .get("crd.questdb.io/config-hash")
                .map(String::as_str),
            Some(HASH)
        );
    }

    #[test]
    fn a_different_config_hash_changes_the_pod_template() {
        let qdb = questdb("db1", "tenant-a");
        let a = spec(&statefulset(&qdb, "aaaa", None, true, None)).template;
        let b = spec(&statefulset(&qdb, "bbbb", None, true, None)).template;
        assert_ne!(a, b);
    }

    #[test]
    fn container_runs_the_image_with_named_ports_and_user_env() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.image_pull_policy = Some("IfNotPresent".to_string());
        qdb.spec.env = vec![EnvVar {
            name: "QDB_CAIRO_COMMIT_LAG".to_string(),
            value: Some("1000".to_string()),
            ..EnvVar::default()
        }];
        let resources = ResourceRequirements {
            requests: Some([("memory".to_string(), Quantity("4Gi".to_string()))].into()),
            ..ResourceRequirements::default()
        };
        qdb.spec.resources = Some(resources.clone());
        let c = container(&statefulset(&qdb, HASH, None, true, None));
        assert_eq!(c.image.as_deref(), Some("questdb/questdb:9.0.0"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(c.resources, Some(resources));
        let env = c.env.clone().unwrap_or_default();
        assert_eq!(env[..2], credentials::env(&qdb)[..]);
        // The heap sized from the memory request, then the user's env.
        assert_eq!(env[2].name, crate::desired::memory::JVM_OPTIONS_ENV);
        assert_eq!(env[2].value.as_deref(), Some("-Xmx1024m"));
        assert_eq!(
            env[3..],
            qdb.spec.env[..],
            "the user's env follows the credentials and the heap"
        );
        let keyed = with_volume_instance_id(statefulset(&qdb, HASH, None, true, None), "pvc-uid");
        let env = container(&keyed).env.clone().unwrap_or_default();
        assert_eq!(env[2].name, SNAPSHOT_INSTANCE_ID_ENV);
        assert_eq!(
            env[2].value.as_deref(),
            Some("pvc-uid"),
            "keyed on the volume"
        );
        assert_eq!(env[3].name, crate::desired::memory::JVM_OPTIONS_ENV);
        assert_eq!(env[4..], qdb.spec.env[..]);
        let again = with_volume_instance_id(keyed, "pvc-uid-2");
        let env = container(&again).env.clone().unwrap_or_default();
        assert_eq!(
            env.iter()
                .filter(|e| e.name == SNAPSHOT_INSTANCE_ID_ENV)
                .count(),
            1,
            "set once"
        );
        assert_eq!(
            c.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        let ports: Vec<_> = c
            .ports
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.name.unwrap_or_default(), p.container_port))
            .collect();
        assert_eq!(
            ports,
            vec![
                ("http".to_string(), 9000),
                ("pgwire".to_string(), 8812),
                ("ilp".to_string(), 9009),
                ("health".to_string(), 9003)
            ]
        );
    }

    #[test]
    fn whole_root_dir_is_on_the_volume_and_config_files_are_mounted_into_conf() {
        let qdb = questdb("db1", "tenant-a");
        let sts = statefulset(&qdb, HASH, None, true, None);
        let c = container(&sts);
        assert_eq!(
            mounts(&c),
            vec![
                ("data".into(), "/var/lib/questdb".into(), None),
                (
                    "server-conf".into(),
                    "/etc/questdb/server-conf".into(),
                    None
                ),
                (
                    "config".into(),
                    "/var/lib/questdb/conf/log.conf".into(),
                    Some("log.conf".into())
                ),
                (
                    "ilp-auth".into(),
                    "/var/lib/questdb/conf/auth.txt".into(),
                    Some("auth.txt".into())
                ),
            ]
        );
        let volumes = pod(&sts).volumes.unwrap_or_default();
        let claim = volumes
            .iter()
            .find_map(|v| v.persistent_volume_claim.as_ref())
            .map(|p| p.claim_name.as_str());
        assert_eq!(claim, Some("db1-data"));
        let config_maps: Vec<_> = volumes
            .iter()
            .filter_map(|v| v.config_map.as_ref().map(|c| c.name.as_str()))
            .collect();
        assert_eq!(config_maps, vec!["db1-config", "db1-ilp-auth"]);
    }

    #[test]
    fn without_ilp_auth_no_auth_file_is_mounted() {
        let sts = statefulset(&questdb("db1", "tenant-a"), HASH, None, false, None);
        assert!(mounts(&container(&sts))
            .iter()
            .all(|(name, path, _)| name != "ilp-auth" && !path.ends_with("auth.txt")));
        assert!(pod(&sts)
            .volumes
            .unwrap_or_default()
            .iter()
            .all(|v| v.name != "ilp-auth"));
    }

    #[test]
    fn init_container_prepares_conf_as_the_questdb_user() {
        let sts = statefulset(&questdb("db1", "tenant-a"), HASH, None, true, None);
        let init = pod(&sts).init_containers.unwrap_or_default();
        assert_eq!(init.len(), 2);
        assert_eq!(
            init[0].command,
            Some(vec![
                "mkdir".to_string(),
                "-p".to_string(),
                "/var/lib/questdb/conf".to_string()
            ])
        );
        assert_eq!(init[0].image.as_deref(), Some("questdb/questdb:9.0.0"));
        assert_eq!(
            mounts(&init[0]),
            vec![("data".into(), "/var/lib/questdb".into(), None)]
        );
        // Then server.conf becomes a link into the refreshed config directory: a reloadable
        // setting reaches the running database with a reload, not a restart.
        assert_eq!(
            init[1].command,
            Some(vec![
                "ln".to_string(),
                "-sfn".to_string(),
                "/etc/questdb/server-conf/server.conf".to_string(),
                "/var/lib/questdb/conf/server.conf".to_string()
            ])
        );
        assert_eq!(init[1].security_context, init[0].security_context);
        assert_eq!(mounts(&init[1]), mounts(&init[0]));
    }

    #[test]
    fn probes_hit_status_on_the_health_port() {
        let c = container(&statefulset(
            &questdb("db1", "tenant-a"),
            HASH,
            None,
            true,
            None,
        ));
        let readiness = c.readiness_probe.unwrap_or_default();
        let liveness = c.liveness_probe.unwrap_or_default();
        let startup = c.startup_probe.unwrap_or_default();
        for probe in [&readiness, &liveness, &startup] {
            let get = probe.http_get.clone().unwrap_or_default();
            assert_eq!(get.path.as_deref(), Some("/status"));
            assert_eq!(get.port, IntOrString::String("health".to_string()));
        }
        assert_eq!(readiness.period_seconds, Some(5));
        assert!(liveness.failure_threshold > readiness.failure_threshold);
        let budget = |p: &Probe| p.period_seconds.unwrap_or(10) * p.failure_threshold.unwrap_or(3);
        assert!(
            budget(&startup) >= 600,
            "startup must tolerate a long WAL replay"
        );
    }

    #[test]
    fn pod_and_container_are_locked_down() {
        let sts = statefulset(&questdb("db1", "tenant-a"), HASH, None, true, None);
        let pod = pod(&sts);
        let psc = pod.security_context.clone().unwrap_or_default();
        assert_eq!(psc.fs_group, Some(10001));
        assert_eq!(psc.run_as_user, Some(10001));
        assert_eq!(psc.run_as_group, Some(10001));
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(
            psc.fs_group_change_policy.as_deref(),
            Some("OnRootMismatch")
        );
        assert_eq!(
            psc.seccomp_profile.map(|s| s.type_).as_deref(),
            Some("RuntimeDefault")
        );
        assert_eq!(pod.termination_grace_period_seconds, Some(60));
        assert_eq!(pod.enable_service_links, Some(false));
        for c in pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten())
        {
            let sc = c.security_context.clone().unwrap_or_default();
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            assert_eq!(
                sc.capabilities.and_then(|c| c.drop),
                Some(vec!["ALL".to_string()])
            );
        }
    }

    #[test]
    fn shared_nodes_get_no_selector_and_no_toleration() {
        let pod = pod(&statefulset(
            &questdb("db1", "tenant-a"),
            HASH,
            None,
            true,
            None,
        ));
        assert_eq!(pod.node_selector, None);
        assert_eq!(pod.tolerations, None);
    }

    #[test]
    fn dedicated_node_pins_the_pod_and_tolerates_exactly_its_taint() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.status = Some(crate::api::QuestDBStatus {
            instance_id: Some("i-0abc".to_string()),
            ..Default::default()
        });
        let node = DedicatedNode::for_questdb(&qdb);
        let pod = pod(&statefulset(&qdb, HASH, None, true, Some(&node)));
        assert_eq!(
            pod.node_selector,
            Some(BTreeMap::from([
                (
                    "crd.questdb.io/dedicated".to_string(),
                    "tenant-a.db1".to_string()
                ),
                (
                    "node-restriction.kubernetes.io/questdb-instance".to_string(),
                    "i-0abc".to_string()
                ),
            ]))
        );
        assert_eq!(
            pod.tolerations,
            Some(vec![
                Toleration {
                    key: Some("crd.questdb.io/dedicated".to_string()),
                    operator: Some("Equal".to_string()),
                    value: Some("tenant-a.db1".to_string()),
                    effect: Some("NoSchedule".to_string()),
                    toleration_seconds: None,
                },
                Toleration {
                    key: Some("node.kubernetes.io/not-ready".to_string()),
                    operator: Some("Exists".to_string()),
                    value: None,
                    effect: Some("NoExecute".to_string()),
                    toleration_seconds: None,
                },
                Toleration {
                    key: Some("node.kubernetes.io/unreachable".to_string()),
                    operator: Some("Exists".to_string()),
                    value: None,
                    effect: Some("NoExecute".to_string()),
                    toleration_seconds: None,
                },
            ])
        );
        let out_of_service = pod.tolerations.iter().flatten().any(|t| {
            t.key.is_none() || t.key.as_deref() == Some("node.kubernetes.io/out-of-service")
        });
        assert!(!out_of_service, "a fenced node must still evict the pod");
    }

    fn host_ports_of(pod: &PodSpec) -> Vec<(String, Option<i32>)> {
        pod.containers[0]
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), p.host_port))
            .collect()
    }

    /// Host ports need a `privileged` namespace: a new dedicated database binds none unless a
    /// public record needs the node's address or it is asked for, and a database that runs
    /// with them keeps them (an operator upgrade that dropped them would restart every
    /// database at once and move its clients' address).
    #[test]
    fn a_dedicated_database_binds_host_ports_only_when_public_asked_or_already_bound() {
        let bound = vec![
            ("http".to_string(), Some(9000)),
            ("pgwire".to_string(), Some(8812)),
            ("ilp".to_string(), Some(9009)),
            ("health".to_string(), None),
        ];
        let unbound: Vec<(String, Option<i32>)> =
            bound.iter().map(|(n, _)| (n.clone(), None)).collect();
        let with = |host_ports: Option<bool>, public: bool| {
            let mut qdb = questdb("db1", "tenant-a");
            let node = qdb.spec.node.get_or_insert_with(Default::default);
            node.host_ports = host_ports;
            if public {
                qdb.spec.dns = Some(crate::api::DnsSpec {
                    name: "db1.tenant-a.example.com".into(),
                    ttl: 5,
                    public: true,
                });
            }
            qdb
        };
        // (spec.node.hostPorts, dns.public, what the running StatefulSet binds) -> bound?
        for (host_ports, public, running, want) in [
            (None, false, None, false),
            (None, false, Some(false), false),
            (None, false, Some(true), true),
            (None, true, None, true),
            (Some(true), false, None, true),
            (Some(false), false, Some(true), false),
            (Some(false), true, None, true),
        ] {
            let qdb = with(host_ports, public);
            let node = DedicatedNode::for_questdb(&qdb).running_with_host_ports(&qdb, running);
            let pod = pod(&statefulset(&qdb, HASH, None, true, Some(&node)));
            assert_eq!(
                host_ports_of(&pod),
                if want { bound.clone() } else { unbound.clone() },
                "hostPorts {host_ports:?}, public {public}, running {running:?}"
            );
        }
        let shared = pod_of_shared(&questdb("db1", "tenant-a"));
        assert!(host_ports_of(&shared).iter().all(|(_, h)| h.is_none()));
    }

    fn pod_of_shared(qdb: &QuestDB) -> PodSpec {
        pod(&statefulset(qdb, HASH, None, true, None))
    }

    #[test]
    fn without_a_recorded_instance_the_pod_matches_no_node_not_a_predecessor() {
        let qdb = questdb("db1", "tenant-a");
        let node = DedicatedNode::for_questdb(&qdb);
        let pod = pod(&statefulset(&qdb, HASH, None, true, Some(&node)));
        let selector = pod.node_selector.unwrap_or_default();
        assert_eq!(
            selector
                .get("node-restriction.kubernetes.io/questdb-instance")
                .map(String::as_str),
            Some("awaiting-instance")
        );
        assert!(is_label_value("awaiting-instance"));
    }

    fn is_label_value(v: &str) -> bool {
        v.len() <= 63
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    }

    #[test]
    fn dedicated_label_value_is_namespace_dot_name() {
        assert_eq!(
            dedicated_label_value(&questdb("db1", "tenant-a")),
            "tenant-a.db1"
        );
    }

    #[test]
    fn long_dedicated_label_values_are_shortened_uniquely() {
        let ns = "a-very-long-namespace-name-for-a-tenant-with-a-long-name-x";
        let a = dedicated_label_value(&questdb("database-number-one", ns));
        let b = dedicated_label_value(&questdb("database-number-two", ns));
        assert!(is_label_value(&a), "{a}");
        assert!(is_label_value(&b), "{b}");
        assert!(a.len() >= 60, "keeps as much of the name as fits: {a}");
        assert_ne!(a, b);
        assert!(a.starts_with("a-very-long-namespace"));
        assert_eq!(
            a,
            dedicated_label_value(&questdb("database-number-one", ns))
        );
    }

    #[test]
    fn shortening_never_leaves_a_separator_before_the_hash() {
        // The 52-character prefix ends exactly on the '.' between namespace and name.
        let ns = "n".repeat(51);
        let v = dedicated_label_value(&questdb(&"m".repeat(30), &ns));
        assert!(is_label_value(&v), "{v}");
        assert!(!v.contains(".-"), "{v}");
    }
}

//! `spec.pod`: the fields of the database pod a platform team sets (placement, private
//! registries, annotations for injectors and cost tools, security context, extra volumes),
//! typed from k8s-openapi. What the operator owns (its labels and annotation keys, the data,
//! config and auth volumes and their paths, a dedicated node's pin and taint) cannot be
//! overridden: the schema refuses it, naming the field, before the operator sees the object.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, PodSecurityContext, SecurityContext, Toleration,
    TopologySpreadConstraint, Volume, VolumeMount,
};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Volume names the operator's own volumes take in the pod.
pub const RESERVED_VOLUMES: [&str; 3] = ["data", "config", "ilp-auth"];
/// The database's root directory (the data volume), whose `conf/` holds the operator's files.
const ROOT_DIR: &str = "/var/lib/questdb";
/// Prefix of the operator's own label and annotation keys.
const OPERATOR_PREFIX: &str = "crd.questdb.io/";
const MAX_MAP_ENTRIES: i64 = 64;
const MAX_LIST_ITEMS: i64 = 16;

/// The database pod's own fields. Labels and annotations are merged with the operator's (whose
/// keys win and cannot be set here); the security contexts fill in the fields they leave unset
/// from the operator's restricted defaults.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
// A mount of a volume the pod does not have would be refused only when the StatefulSet is
// written, far from the user's edit.
// The restricted Pod Security Standard, whatever the namespace's label says: a tenant who may
// edit QuestDBs must not get a privileged pod, the node's root user, or an unconfined kernel
// interface (the operator checks the same in `restricted_problems`, for objects stored before
// these rules).
#[x_kube(
    validation = Rule::new("!has(self.extraVolumeMounts) || self.extraVolumeMounts.all(m, has(self.extraVolumes) && self.extraVolumes.exists(v, v.name == m.name))").message("pod.extraVolumeMounts: every mount names one of pod.extraVolumes"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.privileged) || !self.containerSecurityContext.privileged").message("pod.containerSecurityContext.privileged: a privileged container is root on the node (restricted Pod Security)"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.allowPrivilegeEscalation) || !self.containerSecurityContext.allowPrivilegeEscalation").message("pod.containerSecurityContext.allowPrivilegeEscalation must be false (restricted Pod Security)"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.capabilities) || !has(self.containerSecurityContext.capabilities.add) || size(self.containerSecurityContext.capabilities.add) == 0 || (size(self.containerSecurityContext.capabilities.add) == 1 && self.containerSecurityContext.capabilities.add[0] == 'NET_BIND_SERVICE')").message("pod.containerSecurityContext.capabilities.add: NET_BIND_SERVICE at most; every other capability is dropped (restricted Pod Security)"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.runAsUser) || self.containerSecurityContext.runAsUser != 0").message("pod.containerSecurityContext.runAsUser: 0 is root (restricted Pod Security)"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.runAsNonRoot) || self.containerSecurityContext.runAsNonRoot").message("pod.containerSecurityContext.runAsNonRoot cannot be false (restricted Pod Security)"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.seccompProfile) || self.containerSecurityContext.seccompProfile.type != 'Unconfined'").message("pod.containerSecurityContext.seccompProfile: Unconfined is refused (restricted Pod Security)"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.appArmorProfile) || self.containerSecurityContext.appArmorProfile.type != 'Unconfined'").message("pod.containerSecurityContext.appArmorProfile: Unconfined is refused (restricted Pod Security)"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.procMount) || self.containerSecurityContext.procMount == 'Default'").message("pod.containerSecurityContext.procMount must be Default (restricted Pod Security)"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.windowsOptions) || !has(self.containerSecurityContext.windowsOptions.hostProcess) || !self.containerSecurityContext.windowsOptions.hostProcess").message("pod.containerSecurityContext.windowsOptions.hostProcess is refused (restricted Pod Security)"),
    validation = Rule::new("!has(self.containerSecurityContext) || !has(self.containerSecurityContext.seLinuxOptions) || (!has(self.containerSecurityContext.seLinuxOptions.user) && !has(self.containerSecurityContext.seLinuxOptions.role) && (!has(self.containerSecurityContext.seLinuxOptions.type) || self.containerSecurityContext.seLinuxOptions.type in ['container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']))").message("pod.containerSecurityContext.seLinuxOptions: no user or role, and a container type only (restricted Pod Security)"),
    validation = Rule::new("!has(self.securityContext) || !has(self.securityContext.runAsUser) || self.securityContext.runAsUser != 0").message("pod.securityContext.runAsUser: 0 is root (restricted Pod Security)"),
    validation = Rule::new("!has(self.securityContext) || !has(self.securityContext.runAsNonRoot) || self.securityContext.runAsNonRoot").message("pod.securityContext.runAsNonRoot cannot be false (restricted Pod Security)"),
    validation = Rule::new("!has(self.securityContext) || !has(self.securityContext.seccompProfile) || self.securityContext.seccompProfile.type != 'Unconfined'").message("pod.securityContext.seccompProfile: Unconfined is refused (restricted Pod Security)"),
    validation = Rule::new("!has(self.securityContext) || !has(self.securityContext.appArmorProfile) || self.securityContext.appArmorProfile.type != 'Unconfined'").message("pod.securityContext.appArmorProfile: Unconfined is refused (restricted Pod Security)"),
    validation = Rule::new("!has(self.securityContext) || !has(self.securityContext.sysctls) || size(self.securityContext.sysctls) == 0").message("pod.securityContext.sysctls: kernel parameters are the node's (restricted Pod Security)"),
    validation = Rule::new("!has(self.securityContext) || !has(self.securityContext.windowsOptions) || !has(self.securityContext.windowsOptions.hostProcess) || !self.securityContext.windowsOptions.hostProcess").message("pod.securityContext.windowsOptions.hostProcess is refused (restricted Pod Security)"),
    validation = Rule::new("!has(self.securityContext) || !has(self.securityContext.seLinuxOptions) || (!has(self.securityContext.seLinuxOptions.user) && !has(self.securityContext.seLinuxOptions.role) && (!has(self.securityContext.seLinuxOptions.type) || self.securityContext.seLinuxOptions.type in ['container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']))").message("pod.securityContext.seLinuxOptions: no user or role, and a container type only (restricted Pod Security)")
)]
pub struct PodOptions {
    /// Labels of the pod (not of the StatefulSet's selector).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = operator_keys_refused("pod.labels", &["app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by"]))]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the pod (sidecar injectors, backup and cost tools read these).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = operator_keys_refused("pod.annotations", &[]))]
    pub annotations: BTreeMap<String, String>,
    /// Annotations of the StatefulSet.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = operator_keys_refused("pod.statefulSetAnnotations", &[]))]
    pub stateful_set_annotations: BTreeMap<String, String>,
    /// Scheduling constraints. With a dedicated node (`spec.node`) only pod (anti-)affinity may
    /// be set: the pod is pinned to its instance. Pod (anti-)affinity terms look at the
    /// database's own namespace only (no `namespaces`, no `namespaceSelector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = affinity_schema)]
    pub affinity: Option<Box<Affinity>>,
    /// Tolerations. Not with a dedicated node, and never one that tolerates the dedicated
    /// nodes' taint (any key under `crd.questdb.io/`, or a wildcard: those nodes belong to one
    /// database each), the control plane's (`node-role.kubernetes.io/`), a cordon
    /// (`node.kubernetes.io/unschedulable`) or a fence (`node.kubernetes.io/out-of-service`).
    /// The operator's `--allowed-toleration-keys` may narrow the rest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = tolerations_schema)]
    pub tolerations: Vec<Toleration>,
    /// Node labels the pod requires. Not with a dedicated node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = operator_keys_refused("pod.nodeSelector", &["node-restriction.kubernetes.io/questdb-instance"]))]
    pub node_selector: BTreeMap<String, String>,
    /// How the pod spreads across zones or nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = max_items)]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// The pod's security context. Fields left unset keep the operator's defaults (non-root
    /// user 10001, `fsGroup` 10001, seccomp `RuntimeDefault`), which meet the `restricted` Pod
    /// Security level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<Box<PodSecurityContext>>,
    /// The database container's security context. Fields left unset keep the operator's
    /// defaults (no privilege escalation, every capability dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_security_context: Option<Box<SecurityContext>>,
    /// Secrets of this namespace that hold credentials for a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = max_items)]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// The pod's PriorityClass. Never one of the cluster's own `system-` classes (they preempt
    /// other tenants' pods and outrank the node's daemons); the operator's
    /// `--allowed-priority-classes` may narrow the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("!self.startsWith('system-')").message("pod.priorityClassName: the system- classes are the cluster's own (they preempt other tenants' pods)"))]
    pub priority_class_name: Option<String>,
    /// Seconds the database gets to flush and close its tables when stopped (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 3600").message("pod.terminationGracePeriodSeconds must be between 0 and 3600"))]
    pub termination_grace_period_seconds: Option<i64>,
    /// More volumes for the pod (a sidecar's, a CSV import directory). The names `data`,
    /// `config` and `ilp-auth` are the operator's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = extra_volumes_schema)]
    pub extra_volumes: Vec<Volume>,
    /// Mounts of `extraVolumes` in the database container. The root directory
    /// (`/var/lib/questdb`) and its `conf/` are the operator's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = extra_volume_mounts_schema)]
    pub extra_volume_mounts: Vec<VolumeMount>,
}

impl PodOptions {
    pub fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

fn insert_rules(schema: &mut schemars::Schema, rules: serde_json::Value) {
    let mut all = schema
        .get("x-kubernetes-validations")
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    all.extend(rules.as_array().cloned().unwrap_or_default());
    schema.insert("x-kubernetes-validations".into(), all.into());
}

fn operator_keys_refused(
    field: &'static str,
    reserved: &'static [&'static str],
) -> impl Fn(&mut schemars::Schema) {
    move |schema| {
        schema.insert("maxProperties".into(), MAX_MAP_ENTRIES.into());
        let mut rules = vec![json!({
            "rule": format!("self.all(k, !k.startsWith('{OPERATOR_PREFIX}'))"),
            "message": format!("{field}: keys under {OPERATOR_PREFIX} are the operator's"),
        })];
        for key in reserved {
            rules.push(json!({
                "rule": format!("!('{key}' in self)"),
                "message": format!("{field}: {key} is the operator's"),
            }));
        }
        insert_rules(schema, rules.into());
    }
}

fn max_items(schema: &mut schemars::Schema) {
    schema.insert("maxItems".into(), MAX_LIST_ITEMS.into());
}

/// Bounds a string field of the list's items: the apiserver refuses a CRD whose rules it
/// cannot prove cheap, and an unbounded string makes every comparison of it unbounded.
pub(super) fn bound_item_string(schema: &mut schemars::Schema, field: &str, max: i64) {
    if let Some(f) = schema
        .get_mut("items")
        .and_then(|i| i.get_mut("properties"))
        .and_then(|p| p.get_mut(field))
        .and_then(|f| f.as_object_mut())
    {
        f.insert("maxLength".into(), max.into());
    }
}

/// Taint keys no tenant's pod may tolerate, by prefix: the dedicated nodes' (each belongs to
/// one database) and the control plane's.
pub const REFUSED_TOLERATION_PREFIXES: &[&str] = &[OPERATOR_PREFIX, "node-role.kubernetes.io/"];
/// Taint keys no tenant's pod may tolerate: a cordoned node's and a fenced one's (a pod that
/// tolerates the out-of-service taint stays bound to a node the failover has fenced).
pub const REFUSED_TOLERATION_KEYS: &[&str] = &[
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/out-of-service",
];

pub fn toleration_message() -> String {
    format!(
        "pod.tolerations: a toleration needs a key, and keys under {} and the keys {} are refused (they reach other databases' or the cluster's own nodes, or keep the pod on a fenced node)",
        REFUSED_TOLERATION_PREFIXES.join(", "),
        REFUSED_TOLERATION_KEYS.join(", ")
    )
}

/// Whether a tenant may tolerate `key` (`None` or empty: a wildcard, refused).
pub fn toleration_key_refused(key: Option<&str>) -> bool {
    match key {
        None | Some("") => true,
        Some(k) => {
            REFUSED_TOLERATION_PREFIXES.iter().any(|p| k.starts_with(p))
                || REFUSED_TOLERATION_KEYS.contains(&k)
        }
    }
}

fn tolerations_schema(schema: &mut schemars::Schema) {
    max_items(schema);
    bound_item_string(schema, "key", 317);
    let prefixes: Vec<String> = REFUSED_TOLERATION_PREFIXES
        .iter()
        .map(|p| format!("!t.key.startsWith('{p}')"))
        .collect();
    let keys: Vec<String> = REFUSED_TOLERATION_KEYS
        .iter()
        .map(|k| format!("'{k}'"))
        .collect();
    insert_rules(
        schema,
        json!([{
            "rule": format!(
                "self.all(t, has(t.key) && t.key != '' && {} && !(t.key in [{}]))",
                prefixes.join(" && "),
                keys.join(", ")
            ),
            "message": toleration_message(),
        }]),
    );
}

pub const CROSS_NAMESPACE_AFFINITY_MESSAGE: &str = "pod.affinity: pod (anti-)affinity terms look at the database's own namespace only (no namespaces, no namespaceSelector): another tenant's pods are not a scheduling input";

/// Bounds the pod (anti-)affinity term lists (the apiserver prices a rule by its lists' sizes)
/// and refuses terms that select pods of other namespaces: a tenant could otherwise follow
/// another tenant's database onto its node, or learn where it runs.
fn affinity_schema(schema: &mut schemars::Schema) {
    for kind in ["podAffinity", "podAntiAffinity"] {
        let Some(props) = schema
            .get_mut("properties")
            .and_then(|p| p.get_mut(kind))
            .and_then(|k| k.get_mut("properties"))
            .and_then(|p| p.as_object_mut())
        else {
            continue;
        };
        for list in [
            "requiredDuringSchedulingIgnoredDuringExecution",
            "preferredDuringSchedulingIgnoredDuringExecution",
        ] {
            if let Some(l) = props.get_mut(list).and_then(|l| l.as_object_mut()) {
                l.insert("maxItems".into(), MAX_LIST_ITEMS.into());
            }
        }
    }
    let own = |term: &str| format!("!has({term}.namespaces) && !has({term}.namespaceSelector)");
    let terms = |kind: &str| {
        format!(
            "(!has(self.{kind}) || ((!has(self.{kind}.requiredDuringSchedulingIgnoredDuringExecution) || self.{kind}.requiredDuringSchedulingIgnoredDuringExecution.all(t, {})) && (!has(self.{kind}.preferredDuringSchedulingIgnoredDuringExecution) || self.{kind}.preferredDuringSchedulingIgnoredDuringExecution.all(w, {}))))",
            own("t"),
            own("w.podAffinityTerm")
        )
    };
    insert_rules(
        schema,
        json!([{
            "rule": format!("{} && {}", terms("podAffinity"), terms("podAntiAffinity")),
            "message": CROSS_NAMESPACE_AFFINITY_MESSAGE,
        }]),
    );
}

/// Whether any pod (anti-)affinity term of `affinity` selects pods of other namespaces.
pub fn affinity_crosses_namespaces(affinity: &Affinity) -> bool {
    use k8s_openapi::api::core::v1::PodAffinityTerm;
    let crosses = |t: &PodAffinityTerm| t.namespaces.is_some() || t.namespace_selector.is_some();
    let pod_affinity = affinity.pod_affinity.as_ref().map(|a| {
        (
            &a.required_during_scheduling_ignored_during_execution,
            &a.preferred_during_scheduling_ignored_during_execution,
        )
    });
    let anti = affinity.pod_anti_affinity.as_ref().map(|a| {
        (
            &a.required_during_scheduling_ignored_during_execution,
            &a.preferred_during_scheduling_ignored_during_execution,
        )
    });
    [pod_affinity, anti]
        .into_iter()
        .flatten()
        .any(|(required, preferred)| {
            required.iter().flatten().any(crosses)
                || preferred
                    .iter()
                    .flatten()
                    .any(|w| crosses(&w.pod_affinity_term))
        })
}

/// The volume types the restricted Pod Security Standard allows (a `hostPath`, an `nfs` share
/// or an inline cloud disk reaches past the database's own namespace).
pub const ALLOWED_VOLUME_TYPES: &[&str] = &[
    "emptyDir",
    "configMap",
    "secret",
    "projected",
    "downwardAPI",
    "csi",
    "persistentVolumeClaim",
    "ephemeral",
];

pub fn volume_types_message() -> String {
    format!(
        "pod.extraVolumes: only {} volumes (restricted Pod Security; a projected volume without service account tokens, an ephemeral one without a data source)",
        ALLOWED_VOLUME_TYPES.join(", ")
    )
}

/// Why `volume` is refused, if it is: a type outside [`ALLOWED_VOLUME_TYPES`], a projected
/// service account token (the pod runs with none), an ephemeral claim made from a data source.
pub fn volume_problem(volume: &Volume) -> Option<String> {
    let v = volume;
    let allowed = v.empty_dir.is_some()
        || v.config_map.is_some()
        || v.secret.is_some()
        || v.projected.is_some()
        || v.downward_api.is_some()
        || v.csi.is_some()
        || v.persistent_volume_claim.is_some()
        || v.ephemeral.is_some();
    let token = v
        .projected
        .as_ref()
        .and_then(|p| p.sources.as_ref())
        .is_some_and(|s| s.iter().any(|s| s.service_account_token.is_some()));
    let sourced = v
        .ephemeral
        .as_ref()
        .and_then(|e| e.volume_claim_template.as_ref())
        .is_some_and(|t| t.spec.data_source.is_some() || t.spec.data_source_ref.is_some());
    (!allowed || token || sourced)
        .then(|| format!("volume {:?}: {}", v.name, volume_types_message()))
}

fn extra_volumes_schema(schema: &mut schemars::Schema) {
    max_items(schema);
    bound_item_string(schema, "name", 63);
    // The projected sources are iterated by a rule: bounded, as the apiserver requires.
    if let Some(sources) = schema
        .get_mut("items")
        .and_then(|i| i.get_mut("properties"))
        .and_then(|p| p.get_mut("projected"))
        .and_then(|p| p.get_mut("properties"))
        .and_then(|p| p.get_mut("sources"))
        .and_then(|f| f.as_object_mut())
    {
        sources.insert("maxItems".into(), MAX_LIST_ITEMS.into());
    }
    let names: Vec<String> = RESERVED_VOLUMES.iter().map(|n| format!("'{n}'")).collect();
    let types: Vec<String> = ALLOWED_VOLUME_TYPES
        .iter()
        .map(|t| format!("has(v.{t})"))
        .collect();
    insert_rules(
        schema,
        json!([{
            "rule": format!("self.all(v, !(v.name in [{}]))", names.join(", ")),
            "message": format!("pod.extraVolumes: the volume names {} are the operator's", RESERVED_VOLUMES.join(", ")),
        }, {
            "rule": format!("self.all(v, {})", types.join(" || ")),
            "message": volume_types_message(),
        }, {
            "rule": "self.all(v, !has(v.projected) || !has(v.projected.sources) || v.projected.sources.all(s, !has(s.serviceAccountToken)))",
            "message": "pod.extraVolumes: a projected volume may not carry a service account token (the database pod runs with none)",
        }, {
            "rule": "self.all(v, !has(v.ephemeral) || !has(v.ephemeral.volumeClaimTemplate) || (!has(v.ephemeral.volumeClaimTemplate.spec.dataSource) && !has(v.ephemeral.volumeClaimTemplate.spec.dataSourceRef)))",
            "message": "pod.extraVolumes: an ephemeral volume may not be made from a data source",
        }]),
    );
}

/// The fields the pod's and the container's security contexts share, as the restricted Pod
/// Security Standard reads them.
struct SharedSecurity<'a> {
    run_as_user: Option<i64>,
    run_as_non_root: Option<bool>,
    seccomp: Option<&'a str>,
    app_armor: Option<&'a str>,
    host_process: Option<bool>,
    se_linux: Option<&'a k8s_openapi::api::core::v1::SELinuxOptions>,
}

impl SharedSecurity<'_> {
    /// Each refused field, named under `f`.
    fn problems(&self, f: &str, out: &mut Vec<String>) {
        let mut refuse = |field: &str, why: &str| out.push(format!("{f}.{field}: {why}"));
        if self.run_as_user == Some(0) {
            refuse("runAsUser", "0 is root");
        }
        if self.run_as_non_root == Some(false) {
            refuse("runAsNonRoot", "cannot be false");
        }
        if self.seccomp == Some("Unconfined") {
            refuse("seccompProfile", "Unconfined is refused");
        }
        if self.app_armor == Some("Unconfined") {
            refuse("appArmorProfile", "Unconfined is refused");
        }
        if self.host_process == Some(true) {
            refuse("windowsOptions.hostProcess", "is refused");
        }
        let se_linux_ok = self.se_linux.is_none_or(|o| {
            o.user.is_none()
                && o.role.is_none()
                && o.type_.as_deref().is_none_or(|t| {
                    [
                        "container_t",
                        "container_init_t",
                        "container_kvm_t",
                        "container_engine_t",
                    ]
                    .contains(&t)
                })
        });
        if !se_linux_ok {
            refuse(
                "seLinuxOptions",
                "no user or role, and a container type only",
            );
        }
    }
}

/// What in `pod` the restricted Pod Security Standard refuses, each naming its field: the
/// operator's own check, beside the schema's rules (a QuestDB stored before them is refused
/// here, never built).
pub fn restricted_problems(pod: &PodOptions) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = pod.container_security_context.as_deref() {
        let f = "pod.containerSecurityContext";
        if c.privileged == Some(true) {
            out.push(format!(
                "{f}.privileged: a privileged container is root on the node"
            ));
        }
        if c.allow_privilege_escalation == Some(true) {
            out.push(format!("{f}.allowPrivilegeEscalation: must be false"));
        }
        let added = c.capabilities.as_ref().and_then(|c| c.add.as_ref());
        if added.is_some_and(|a| a.len() > 1 || a.iter().any(|c| c != "NET_BIND_SERVICE")) {
            out.push(format!(
                "{f}.capabilities.add: NET_BIND_SERVICE at most; every other capability is dropped"
            ));
        }
        if c.proc_mount.as_deref().is_some_and(|m| m != "Default") {
            out.push(format!("{f}.procMount: must be Default"));
        }
        SharedSecurity {
            run_as_user: c.run_as_user,
            run_as_non_root: c.run_as_non_root,
            seccomp: c.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            app_armor: c.app_armor_profile.as_ref().map(|p| p.type_.as_str()),
            host_process: c.windows_options.as_ref().and_then(|w| w.host_process),
            se_linux: c.se_linux_options.as_ref(),
        }
        .problems(f, &mut out);
    }
    if let Some(p) = pod.security_context.as_deref() {
        let f = "pod.securityContext";
        if p.sysctls.as_ref().is_some_and(|s| !s.is_empty()) {
            out.push(format!("{f}.sysctls: kernel parameters are the node's"));
        }
        SharedSecurity {
            run_as_user: p.run_as_user,
            run_as_non_root: p.run_as_non_root,
            seccomp: p.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            app_armor: p.app_armor_profile.as_ref().map(|p| p.type_.as_str()),
            host_process: p.windows_options.as_ref().and_then(|w| w.host_process),
            se_linux: p.se_linux_options.as_ref(),
        }
        .problems(f, &mut out);
    }
    out.extend(pod.extra_volumes.iter().filter_map(volume_problem));
    if pod
        .tolerations
        .iter()
        .any(|t| toleration_key_refused(t.key.as_deref()))
    {
        out.push(toleration_message());
    }
    if pod
        .priority_class_name
        .as_deref()
        .is_some_and(|p| p.starts_with("system-"))
    {
        out.push("pod.priorityClassName: the system- classes are the cluster's own".to_string());
    }
    if pod
        .affinity
        .as_deref()
        .is_some_and(affinity_crosses_namespaces)
    {
        out.push(CROSS_NAMESPACE_AFFINITY_MESSAGE.to_string());
    }
    out
}

/// Under the database's root, the directories a mount may not cover: the operator's files, the
/// tables (a mount there puts them on a volume no backup snapshots) and the checkpoint.
pub const RESERVED_MOUNT_DIRS: &[&str] = &["conf", "db", ".checkpoint"];

/// Whether an extra mount at `path` would cover the root or one of [`RESERVED_MOUNT_DIRS`]
/// (the operator's own check, beside the schema's rule).
pub fn reserved_mount_path(path: &str) -> bool {
    unclean_mount_path(path)
        || path.trim_end_matches('/') == ROOT_DIR
        || RESERVED_MOUNT_DIRS
            .iter()
            .any(|d| path.starts_with(&format!("{ROOT_DIR}/{d}")))
}

/// A mount path with `//`, `.` or `..` segments: `/var/lib/questdb//conf` or
/// `/var/lib/questdb/x/../db` names a reserved directory that a prefix check would not see.
pub fn unclean_mount_path(path: &str) -> bool {
    path.contains("//")
        || path.contains("/./")
        || path.contains("/../")
        || path.ends_with("/.")
        || path.ends_with("/..")
}

pub fn reserved_mount_message() -> String {
    format!(
        "pod.extraVolumeMounts: {ROOT_DIR} and its {} are the operator's (a mount over the tables or the checkpoint hides them from every backup), and a mount path is written plainly (no //, . or .. segments)",
        RESERVED_MOUNT_DIRS.join(", ")
    )
}

fn extra_volume_mounts_schema(schema: &mut schemars::Schema) {
    max_items(schema);
    bound_item_string(schema, "name", 63);
    bound_item_string(schema, "mountPath", 1024);
    let dirs: Vec<String> = RESERVED_MOUNT_DIRS
        .iter()
        .map(|d| format!(" && !m.mountPath.startsWith('{ROOT_DIR}/{d}')"))
        .collect();
    insert_rules(
        schema,
        json!([{
            "rule": format!("self.all(m, m.mountPath != '{ROOT_DIR}' && m.mountPath != '{ROOT_DIR}/'{})", dirs.concat()),
            "message": reserved_mount_message(),
        }, {
            "rule": "self.all(m, !m.mountPath.contains('//') && !m.mountPath.contains('/./') && !m.mountPath.contains('/../') && !m.mountPath.endsWith('/.') && !m.mountPath.endsWith('/..'))",
            "message": reserved_mount_message(),
        }]),
    );
}

#[cfg(test)]
mod tests {
    //! `spec.pod`'s CEL rules, evaluated client-side by kube's `cel` feature exactly as the
    //! generated CRD carries them (the real apiserver's verdicts are in the integration tests).

    use super::*;
    use crate::api::{NodeSpec, QuestDB};
    use crate::desired::testing::questdb;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, NodeAffinity, PodAffinity};

    fn errors(qdb: &QuestDB) -> Vec<String> {
        match qdb.validate_cel() {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
        }
    }

    fn with_pod(pod: PodOptions) -> QuestDB {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.pod = pod;
        qdb
    }

    fn dedicated(pod: PodOptions) -> QuestDB {
        let mut qdb = with_pod(pod);
        qdb.spec.node = Some(NodeSpec {
            image: "ami-0abcdef1234567890".into(),
            instance_type: "m6i.large".into(),
            zone: "us-east-1a".into(),
            ..Default::default()
        });
        qdb
    }

    fn toleration(key: Option<&str>) -> Toleration {
        Toleration {
            key: key.map(str::to_string),
            operator: Some("Exists".into()),
            ..Default::default()
        }
    }

    fn scratch(name: &str) -> Volume {
        Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }
    }

    fn mount(name: &str, path: &str) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            ..Default::default()
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_fields_a_platform_team_sets_are_accepted() {
        let qdb = with_pod(PodOptions {
            labels: map(&[("team", "payments")]),
            annotations: map(&[("sidecar.istio.io/inject", "false")]),
            stateful_set_annotations: map(&[("backup.velero.io/backup-volumes", "data")]),
            tolerations: vec![toleration(Some("spot"))],
            node_selector: map(&[("topology.kubernetes.io/zone", "us-east-1a")]),
            image_pull_secrets: vec![LocalObjectReference {
                name: "registry".into(),
            }],
            priority_class_name: Some("databases".into()),
            termination_grace_period_seconds: Some(120),
            extra_volumes: vec![scratch("import")],
            extra_volume_mounts: vec![mount("import", "/var/lib/questdb/import")],
            ..Default::default()
        });
        assert_eq!(errors(&qdb), Vec::<String>::new());
    }

    #[test]
    fn a_dedicated_database_takes_no_placement_that_could_move_it_off_its_instance() {
        let cases = [
            (
                PodOptions {
                    tolerations: vec![toleration(Some("spot"))],
                    ..Default::default()
                },
                "pod.tolerations cannot be set on a database with a dedicated node",
            ),
            (
                PodOptions {
                    node_selector: map(&[("disk", "nvme")]),
                    ..Default::default()
                },
                "pod.nodeSelector cannot be set on a database with a dedicated node",
            ),
            (
                PodOptions {
                    affinity: Some(Box::new(Affinity {
                        node_affinity: Some(NodeAffinity::default()),
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                "pod.affinity.nodeAffinity cannot be set on a database with a dedicated node",
            ),
        ];
        for (pod, message) in cases {
            let errors = errors(&dedicated(pod.clone()));
            assert!(
                errors.len() == 1 && errors[0].starts_with(message),
                "{pod:?}: {errors:?}"
            );
            assert_eq!(self::errors(&with_pod(pod)), Vec::<String>::new());
        }
        // Pod (anti-)affinity cannot move the pod: accepted.
        let anti = dedicated(PodOptions {
            affinity: Some(Box::new(Affinity {
                pod_affinity: Some(PodAffinity::default()),
                ..Default::default()
            })),
            ..Default::default()
        });
        assert_eq!(errors(&anti), Vec::<String>::new());
    }

    #[test]
    fn no_toleration_reaches_another_databases_dedicated_node() {
        for t in [
            toleration(None),
            toleration(Some("")),
            toleration(Some("crd.questdb.io/dedicated")),
        ] {
            let qdb = with_pod(PodOptions {
                tolerations: vec![t.clone()],
                ..Default::default()
            });
            assert_eq!(errors(&qdb), vec![toleration_message()], "{t:?}");
        }
    }

    #[test]
    fn the_operators_keys_volumes_and_paths_cannot_be_overridden() {
        let refused = [
            (
                PodOptions {
                    labels: map(&[("app.kubernetes.io/instance", "other")]),
                    ..Default::default()
                },
                "pod.labels: app.kubernetes.io/instance is the operator's",
            ),
            (
                PodOptions {
                    annotations: map(&[("crd.questdb.io/config-hash", "0")]),
                    ..Default::default()
                },
                "pod.annotations: keys under crd.questdb.io/ are the operator's",
            ),
            (
                PodOptions {
                    stateful_set_annotations: map(&[("crd.questdb.io/credentials-seen", "x")]),
                    ..Default::default()
                },
                "pod.statefulSetAnnotations: keys under crd.questdb.io/ are the operator's",
            ),
            (
                PodOptions {
                    node_selector: map(&[("node-restriction.kubernetes.io/questdb-instance", "i-1")]),
                    ..Default::default()
                },
                "pod.nodeSelector: node-restriction.kubernetes.io/questdb-instance is the operator's",
            ),
            (
                PodOptions {
                    extra_volumes: vec![scratch("data")],
                    ..Default::default()
                },
                "pod.extraVolumes: the volume names data, config, ilp-auth are the operator's",
            ),
            (
                PodOptions {
                    extra_volume_mounts: vec![mount("missing", "/mnt/x")],
                    ..Default::default()
                },
                "pod.extraVolumeMounts: every mount names one of pod.extraVolumes",
            ),
            (
                PodOptions {
                    termination_grace_period_seconds: Some(-1),
                    ..Default::default()
                },
                "pod.terminationGracePeriodSeconds must be between 0 and 3600",
            ),
        ];
        for (pod, message) in refused {
            assert_eq!(errors(&with_pod(pod.clone())), vec![message], "{pod:?}");
        }
        // The root, its conf (the operator's files), db (the tables: a mount there hides them
        // from every backup) and the checkpoint.
        for path in [
            "/var/lib/questdb",
            "/var/lib/questdb/",
            "/var/lib/questdb/conf/server.conf",
            "/var/lib/questdb/db",
            "/var/lib/questdb/db/trades",
            "/var/lib/questdb/.checkpoint",
            // Reserved directories named around a prefix check.
            "/var/lib/questdb//conf",
            "/var/lib/questdb/import/../db",
            "/var/lib/questdb/./db",
        ] {
            let pod = PodOptions {
                extra_volumes: vec![scratch("x")],
                extra_volume_mounts: vec![mount("x", path)],
                ..Default::default()
            };
            assert_eq!(
                errors(&with_pod(pod)),
                vec![reserved_mount_message()],
                "{path}"
            );
            assert!(
                reserved_mount_path(path),
                "the operator's own check: {path}"
            );
        }
        assert!(!reserved_mount_path("/var/lib/questdb/import"));
    }

    /// The harm: a tenant who may edit QuestDBs getting a root shell on a node. Each setting
    /// the restricted Pod Security Standard refuses is refused by the schema's rules and by
    /// the operator's own check, naming its field.
    #[test]
    fn every_setting_restricted_pod_security_refuses_is_refused_by_both_naming_the_field() {
        use k8s_openapi::api::core::v1::{
            Capabilities, HostPathVolumeSource, NFSVolumeSource, ProjectedVolumeSource,
            SeccompProfile, ServiceAccountTokenProjection, Sysctl, VolumeProjection,
        };
        let container = |c: SecurityContext| PodOptions {
            container_security_context: Some(Box::new(c)),
            ..Default::default()
        };
        let pod_level = |p: PodSecurityContext| PodOptions {
            security_context: Some(Box::new(p)),
            ..Default::default()
        };
        let volume = |v: Volume| PodOptions {
            extra_volumes: vec![v],
            ..Default::default()
        };
        let cases: Vec<(&str, PodOptions)> = vec![
            (
                "privileged",
                container(SecurityContext {
                    privileged: Some(true),
                    ..Default::default()
                }),
            ),
            (
                "allowPrivilegeEscalation",
                container(SecurityContext {
                    allow_privilege_escalation: Some(true),
                    ..Default::default()
                }),
            ),
            (
                "capabilities.add",
                container(SecurityContext {
                    capabilities: Some(Capabilities {
                        add: Some(vec!["SYS_ADMIN".into()]),
                        drop: None,
                    }),
                    ..Default::default()
                }),
            ),
            (
                "containerSecurityContext.runAsUser",
                container(SecurityContext {
                    run_as_user: Some(0),
                    ..Default::default()
                }),
            ),
            (
                "securityContext.runAsUser",
                pod_level(PodSecurityContext {
                    run_as_user: Some(0),
                    ..Default::default()
                }),
            ),
            (
                "securityContext.runAsNonRoot",
                pod_level(PodSecurityContext {
                    run_as_non_root: Some(false),
                    ..Default::default()
                }),
            ),
            (
                "seccompProfile",
                pod_level(PodSecurityContext {
                    seccomp_profile: Some(SeccompProfile {
                        type_: "Unconfined".into(),
                        localhost_profile: None,
                    }),
                    ..Default::default()
                }),
            ),
            (
                "sysctls",
                pod_level(PodSecurityContext {
                    sysctls: Some(vec![Sysctl {
                        name: "kernel.shm_rmid_forced".into(),
                        value: "1".into(),
                    }]),
                    ..Default::default()
                }),
            ),
            (
                "extraVolumes",
                volume(Volume {
                    name: "host".into(),
                    host_path: Some(HostPathVolumeSource {
                        path: "/".into(),
                        type_: None,
                    }),
                    ..Default::default()
                }),
            ),
            (
                "extraVolumes",
                volume(Volume {
                    name: "share".into(),
                    nfs: Some(NFSVolumeSource {
                        path: "/".into(),
                        server: "10.0.0.1".into(),
                        read_only: None,
                    }),
                    ..Default::default()
                }),
            ),
            (
                "service account token",
                volume(Volume {
                    name: "token".into(),
                    projected: Some(ProjectedVolumeSource {
                        sources: Some(vec![VolumeProjection {
                            service_account_token: Some(ServiceAccountTokenProjection {
                                path: "token".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]),
                        default_mode: None,
                    }),
                    ..Default::default()
                }),
            ),
        ];
        for (field, pod) in cases {
            let rust = restricted_problems(&pod);
            assert!(
                rust.len() == 1 && rust[0].contains(field),
                "{field}: the operator's check says {rust:?}"
            );
            let cel = errors(&with_pod(pod));
            assert!(
                cel.len() == 1 && cel[0].contains(field),
                "{field}: the schema says {cel:?}"
            );
        }
        // What the defaults and a platform team's ordinary choices look like passes both.
        let fine = PodOptions {
            security_context: Some(Box::new(PodSecurityContext {
                run_as_user: Some(20000),
                fs_group: Some(20000),
                ..Default::default()
            })),
            container_security_context: Some(Box::new(SecurityContext {
                read_only_root_filesystem: Some(true),
                ..Default::default()
            })),
            extra_volumes: vec![scratch("import")],
            ..Default::default()
        };
        assert_eq!(restricted_problems(&fine), Vec::<String>::new());
        assert_eq!(errors(&with_pod(fine)), Vec::<String>::new());
    }

    #[test]
    fn no_placement_reaches_the_clusters_own_nodes_a_fenced_node_or_another_namespace() {
        use k8s_openapi::api::core::v1::{
            PodAffinityTerm, PodAntiAffinity, WeightedPodAffinityTerm,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        let term =
            |namespaces: Option<Vec<String>>, selector: Option<LabelSelector>| PodAffinityTerm {
                topology_key: "kubernetes.io/hostname".into(),
                namespaces,
                namespace_selector: selector,
                ..Default::default()
            };
        let following = |t: PodAffinityTerm| PodOptions {
            affinity: Some(Box::new(Affinity {
                pod_affinity: Some(PodAffinity {
                    required_during_scheduling_ignored_during_execution: Some(vec![t]),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        let avoiding = |t: PodAffinityTerm| PodOptions {
            affinity: Some(Box::new(Affinity {
                pod_anti_affinity: Some(PodAntiAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![
                        WeightedPodAffinityTerm {
                            weight: 1,
                            pod_affinity_term: t,
                        },
                    ]),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        let tolerating = |key: &str| PodOptions {
            tolerations: vec![toleration(Some(key))],
            ..Default::default()
        };
        let cases: Vec<(&str, PodOptions)> = vec![
            (
                "pod.priorityClassName",
                PodOptions {
                    priority_class_name: Some("system-cluster-critical".into()),
                    ..Default::default()
                },
            ),
            (
                "pod.tolerations",
                tolerating("node-role.kubernetes.io/control-plane"),
            ),
            (
                "pod.tolerations",
                tolerating("node.kubernetes.io/out-of-service"),
            ),
            (
                "pod.tolerations",
                tolerating("node.kubernetes.io/unschedulable"),
            ),
            ("pod.tolerations", tolerating("crd.questdb.io/anything")),
            (
                "pod.affinity",
                following(term(Some(vec!["team-b".into()]), None)),
            ),
            (
                "pod.affinity",
                following(term(None, Some(LabelSelector::default()))),
            ),
            (
                "pod.affinity",
                avoiding(term(Some(vec!["team-b".into()]), None)),
            ),
        ];
        for (field, pod) in cases {
            let rust = restricted_problems(&pod);
            assert!(
                rust.len() == 1 && rust[0].starts_with(field),
                "{field}: the operator's check says {rust:?}"
            );
            let cel = errors(&with_pod(pod));
            assert!(
                cel.len() == 1 && cel[0].starts_with(field),
                "{field}: the schema says {cel:?}"
            );
        }
        // Their own namespace's pods, an ordinary taint and class: accepted by both.
        for pod in [
            following(term(None, None)),
            avoiding(term(None, None)),
            tolerating("node.kubernetes.io/not-ready"),
            PodOptions {
                priority_class_name: Some("databases".into()),
                ..Default::default()
            },
        ] {
            assert_eq!(restricted_problems(&pod), Vec::<String>::new(), "{pod:?}");
            assert_eq!(errors(&with_pod(pod)), Vec::<String>::new());
        }
    }
}

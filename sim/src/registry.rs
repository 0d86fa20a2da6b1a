//! Which resources the simulator serves: the built-in kinds and every version of every installed
//! CustomResourceDefinition. Discovery documents are rendered from here.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use serde_json::{json, Value};

use crate::schema::CrdSchema;

/// What happens to `status` when an object is created (the apiserver's `PrepareForCreate`).
#[derive(Debug, Clone, PartialEq)]
pub enum StatusOnCreate {
    Keep,
    Clear,
    /// Replaced by this value (e.g. pods start `Pending`).
    Set(Value),
}

#[derive(Debug, Clone)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub json_path: String,
    pub description: String,
    pub priority: i64,
}

#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub has_status: bool,
    pub status_on_create: StatusOnCreate,
    /// Built-in kinds take strategic-merge patches; custom resources do not.
    pub strategic_merge: bool,
    pub printer_columns: Vec<PrinterColumn>,
    pub schema: Option<Arc<CrdSchema>>,
    /// Versions that share this resource's storage (custom resources are stored once for all
    /// served versions).
    pub storage_key: StorageKey,
}

/// Objects of a resource are stored once per (group, plural), whatever version is asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageKey {
    pub group: String,
    pub plural: String,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn is_crd_resource(&self) -> bool {
        self.schema.is_some()
    }

    fn discovery_entries(&self) -> Vec<Value> {
        let verbs = [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ];
        let mut main = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        let mut entries = vec![main];
        if self.has_status {
            entries.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        entries
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    has_status: bool,
    status_on_create: StatusOnCreate,
}

fn builtins() -> Vec<Builtin> {
    use StatusOnCreate::*;
    let b = |group, version, plural, kind, namespaced, short_names, has_status, soc| Builtin {
        group,
        version,
        plural,
        kind,
        namespaced,
        short_names,
        has_status,
        status_on_create: soc,
    };
    vec![
        b(
            "",
            "v1",
            "namespaces",
            "Namespace",
            false,
            &["ns"],
            true,
            Set(json!({"phase": "Active"})),
        ),
        // Kubelets register nodes with their status already filled in.
        b("", "v1", "nodes", "Node", false, &["no"], true, Keep),
        b(
            "",
            "v1",
            "pods",
            "Pod",
            true,
            &["po"],
            true,
            Set(json!({"phase": "Pending"})),
        ),
        b("", "v1", "services", "Service", true, &["svc"], true, Keep),
        b(
            "",
            "v1",
            "endpoints",
            "Endpoints",
            true,
            &["ep"],
            false,
            Keep,
        ),
        b(
            "",
            "v1",
            "configmaps",
            "ConfigMap",
            true,
            &["cm"],
            false,
            Keep,
        ),
        b("", "v1", "secrets", "Secret", true, &[], false, Keep),
        b(
            "",
            "v1",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            true,
            &["pvc"],
            true,
            Set(json!({"phase": "Pending"})),
        ),
        b(
            "",
            "v1",
            "persistentvolumes",
            "PersistentVolume",
            false,
            &["pv"],
            true,
            Set(json!({"phase": "Pending"})),
        ),
        b("", "v1", "events", "Event", true, &["ev"], false, Keep),
        b(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            false,
            Keep,
        ),
        b(
            "apps",
            "v1",
            "statefulsets",
            "StatefulSet",
            true,
            &["sts"],
            true,
            Clear,
        ),
        b(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            true,
            &["deploy"],
            true,
            Clear,
        ),
        b(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            &[],
            false,
            Keep,
        ),
        b(
            "storage.k8s.io",
            "v1",
            "volumeattachments",
            "VolumeAttachment",
            false,
            &[],
            true,
            Clear,
        ),
        b(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "NetworkPolicy",
            true,
            &["netpol"],
            false,
            Keep,
        ),
        b(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            &["pdb"],
            true,
            Clear,
        ),
        b(
            "storage.k8s.io",
            "v1",
            "storageclasses",
            "StorageClass",
            false,
            &["sc"],
            false,
            Keep,
        ),
        b(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            &["ev"],
            false,
            Keep,
        ),
        b(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
            Keep,
        ),
    ]
}

fn builtin_type(b: Builtin) -> ResourceType {
    ResourceType {
        group: b.group.into(),
        version: b.version.into(),
        plural: b.plural.into(),
        singular: b.kind.to_lowercase(),
        kind: b.kind.into(),
        namespaced: b.namespaced,
        short_names: b.short_names.iter().map(|s| s.to_string()).collect(),
        categories: vec![],
        has_status: b.has_status,
        status_on_create: b.status_on_create,
        strategic_merge: true,
        printer_columns: builtin_columns(b.group, b.plural),
        schema: None,
        // events.k8s.io/v1 Events are the core/v1 Events in another shape.
        storage_key: StorageKey {
            group: if b.group == "events.k8s.io" {
                ""
            } else {
                b.group
            }
            .into(),
            plural: b.plural.into(),
        },
    }
}

/// A few of kubectl's familiar columns for built-in kinds, as simple JSONPaths (the apiserver
/// computes richer ones in Go, e.g. pod READY counts).
fn builtin_columns(group: &str, plural: &str) -> Vec<PrinterColumn> {
    let col = |name: &str, path: &str| PrinterColumn {
        name: name.into(),
        type_: "string".into(),
        json_path: path.into(),
        description: String::new(),
        priority: 0,
    };
    let mut cols = match plural {
        "pods" => vec![
            col("Status", ".status.phase"),
            col("Node", ".spec.nodeName"),
        ],
        "nodes" => vec![col(
            "Status",
            r#".status.conditions[?(@.type=="Ready")].status"#,
        )],
        "persistentvolumeclaims" => vec![
            col("Status", ".status.phase"),
            col("Volume", ".spec.volumeName"),
            col("StorageClass", ".spec.storageClassName"),
        ],
        "persistentvolumes" => vec![
            col("Status", ".status.phase"),
            col("Claim", ".spec.claimRef.name"),
            col("StorageClass", ".spec.storageClassName"),
        ],
        "statefulsets" => vec![
            col("Replicas", ".spec.replicas"),
            col("Ready", ".status.readyReplicas"),
        ],
        "leases" => vec![col("Holder", ".spec.holderIdentity")],
        "volumeattachments" => vec![
            col("Attacher", ".spec.attacher"),
            col("PV", ".spec.source.persistentVolumeName"),
            col("Node", ".spec.nodeName"),
            col("Attached", ".status.attached"),
        ],
        "services" => vec![
            col("Type", ".spec.type"),
            col("Cluster-IP", ".spec.clusterIP"),
        ],
        "events" if group.is_empty() => vec![
            col("Type", ".type"),
            col("Reason", ".reason"),
            col("Object", ".involvedObject.name"),
            col("Message", ".message"),
        ],
        "events" => vec![
            col("Type", ".type"),
            col("Reason", ".reason"),
            col("Object", ".regarding.name"),
            col("Note", ".note"),
        ],
        _ => return vec![],
    };
    cols.push(PrinterColumn {
        type_: "date".into(),
        ..col("Age", ".metadata.creationTimestamp")
    });
    cols
}

type GvrKey = (String, String, String);

/// The served resources; cheap to read on every request, rewritten only when CRDs change.
#[derive(Default)]
pub struct Registry {
    inner: RwLock<Inner>,
}

#[derive(Default)]
struct Inner {
    by_gvr: HashMap<GvrKey, Arc<ResourceType>>,
    /// CRD name -> the keys it registered, to unregister on delete/update.
    crd_keys: HashMap<String, Vec<GvrKey>>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let reg = Self::default();
        {
            let mut inner = reg.write();
            for b in builtins() {
                let rt = builtin_type(b);
                inner.by_gvr.insert(
                    (rt.group.clone(), rt.version.clone(), rt.plural.clone()),
                    Arc::new(rt),
                );
            }
        }
        reg
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.read()
            .by_gvr
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// Any served version of a (group, plural) — used by garbage collection, which only knows
    /// owner/dependent API versions.
    pub fn lookup_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceType>> {
        let (group, version) = split_api_version(api_version);
        self.read()
            .by_gvr
            .values()
            .find(|rt| rt.group == group && rt.version == version && rt.kind == kind)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<ResourceType>> {
        self.read().by_gvr.values().cloned().collect()
    }

    /// (Re)registers the resource versions a CRD serves. Returns a human-readable problem when
    /// the CRD cannot be served (the caller turns it into a 422).
    pub fn install_crd(&self, crd: &Value) -> Result<(), String> {
        let types = crd_resource_types(crd)?;
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut inner = self.write();
        if let Some(old) = inner.crd_keys.remove(&name) {
            for k in old {
                inner.by_gvr.remove(&k);
            }
        }
        let mut keys = vec![];
        for rt in types {
            let key = (rt.group.clone(), rt.version.clone(), rt.plural.clone());
            keys.push(key.clone());
            inner.by_gvr.insert(key, Arc::new(rt));
        }
        inner.crd_keys.insert(name, keys);
        Ok(())
    }

    pub fn uninstall_crd(&self, name: &str) {
        let mut inner = self.write();
        if let Some(old) = inner.crd_keys.remove(name) {
            for k in old {
                inner.by_gvr.remove(&k);
            }
        }
    }

    /// `/api` and `/apis` group/version listing, preferred version first.
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for rt in self.read().by_gvr.values() {
            let versions = groups.entry(rt.group.clone()).or_default();
            if !versions.contains(&rt.version) {
                versions.push(rt.version.clone());
            }
        }
        for versions in groups.values_mut() {
            versions.sort_by(|a, b| compare_kube_versions(b, a));
        }
        groups
    }

    pub fn api_group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .into_iter()
            .filter(|(g, _)| !g.is_empty())
            .map(|(g, versions)| api_group(&g, &versions))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    pub fn api_group(&self, group: &str) -> Option<Value> {
        self.groups()
            .get(group)
            .filter(|_| !group.is_empty())
            .map(|v| api_group(group, v))
    }

    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let inner = self.read();
        let mut types: Vec<&Arc<ResourceType>> = inner
            .by_gvr
            .values()
            .filter(|rt| rt.group == group && rt.version == version)
            .collect();
        if types.is_empty() {
            return None;
        }
        types.sort_by(|a, b| a.plural.cmp(&b.plural));
        let resources: Vec<Value> = types.iter().flat_map(|rt| rt.discovery_entries()).collect();
        let group_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }))
    }
}

fn api_group(group: &str, versions: &[String]) -> Value {
    let gvs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": gvs,
        "preferredVersion": gvs[0],
    })
}

pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

/// Kubernetes version priority: GA > beta > alpha, then by number (v2 > v1, v1beta2 > v1beta1).
pub fn compare_kube_versions(a: &str, b: &str) -> std::cmp::Ordering {
    fn rank(v: &str) -> (u8, u64, u64) {
        let rest = v.strip_prefix('v').unwrap_or(v);
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let major = digits.parse().unwrap_or(0);
        let tail = &rest[digits.len()..];
        let (stage, minor) = if tail.is_empty() {
            (3, 0)
        } else if let Some(n) = tail.strip_prefix("beta") {
            (2, n.parse().unwrap_or(0))
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (1, n.parse().unwrap_or(0))
        } else {
            (0, 0)
        };
        (stage, major, minor)
    }
    rank(a).cmp(&rank(b)).then_with(|| b.cmp(a))
}

/// The resource types a CRD object declares, one per served version.
pub fn crd_resource_types(crd: &Value) -> Result<Vec<ResourceType>, String> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().ok_or("spec.group: Required value")?;
    let names = &spec["names"];
    let plural = names["plural"]
        .as_str()
        .ok_or("spec.names.plural: Required value")?;
    let kind = names["kind"]
        .as_str()
        .ok_or("spec.names.kind: Required value")?;
    let expected_name = format!("{plural}.{group}");
    if crd["metadata"]["name"].as_str() != Some(expected_name.as_str()) {
        return Err(format!(
            "metadata.name: Invalid value: must be spec.names.plural+\".\"+spec.group ({expected_name})"
        ));
    }
    let singular = names["singular"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let versions = spec["versions"]
        .as_array()
        .ok_or("spec.versions: Required value")?;
    let mut out = vec![];
    for v in versions {
        if v["served"].as_bool() == Some(false) {
            continue;
        }
        let version = v["name"]
            .as_str()
            .ok_or("spec.versions[].name: Required value")?;
        let open_api = &v["schema"]["openAPIV3Schema"];
        let schema = CrdSchema::compile(open_api.clone())
            .map_err(|e| format!("spec.versions[{version}].schema.openAPIV3Schema: {e}"))?;
        let printer_columns = v["additionalPrinterColumns"]
            .as_array()
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: c["name"].as_str().unwrap_or_default().to_string(),
                        type_: c["type"].as_str().unwrap_or("string").to_string(),
                        json_path: c["jsonPath"].as_str().unwrap_or_default().to_string(),
                        description: c["description"].as_str().unwrap_or_default().to_string(),
                        priority: c["priority"].as_i64().unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ResourceType {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: singular.clone(),
            kind: kind.into(),
            namespaced,
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            has_status: v["subresources"]["status"].is_object(),
            status_on_create: if v["subresources"]["status"].is_object() {
                StatusOnCreate::Clear
            } else {
                StatusOnCreate::Keep
            },
            strategic_merge: false,
            printer_columns,
            schema: Some(Arc::new(schema)),
            storage_key: StorageKey {
                group: group.into(),
                plural: plural.into(),
            },
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_priority_prefers_ga_then_beta() {
        let mut v = vec!["v1alpha1", "v1beta1", "v1", "v2beta1", "v2"];
        v.sort_by(|a, b| compare_kube_versions(b, a));
        assert_eq!(v, ["v2", "v1", "v2beta1", "v1beta1", "v1alpha1"]);
    }
}

//! A container's environment, resolved as the kubelet does before it creates the container
//! (pkg/kubelet/kubelet_pods.go `makeEnvironmentVariables`): `envFrom` sources first, then
//! `env` in order (a later name wins), Secrets and ConfigMaps read through the API. A missing
//! object or key that is not optional is the kubelet's `CreateContainerConfigError`, with its
//! message: `secret "x" not found`, `couldn't find key K in Secret ns/x`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};

/// The values of one Secret or ConfigMap, by key.
type Values = BTreeMap<String, String>;

pub(crate) struct Sources<'a> {
    client: &'a Client,
    namespace: String,
    secrets: BTreeMap<String, Option<Values>>,
    config_maps: BTreeMap<String, Option<Values>>,
}

impl<'a> Sources<'a> {
    pub(crate) fn new(client: &'a Client, namespace: &str) -> Self {
        Sources {
            client,
            namespace: namespace.to_string(),
            secrets: BTreeMap::new(),
            config_maps: BTreeMap::new(),
        }
    }

    /// A Secret's data, `None` when it does not exist; `Err` is the kubelet's message.
    pub(crate) async fn secret(&mut self, name: &str) -> Result<Option<&Values>, String> {
        if !self.secrets.contains_key(name) {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
            let found = api.get_opt(name).await.map_err(|e| e.to_string())?;
            let values = found.map(|s| {
                s.data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect()
            });
            self.secrets.insert(name.to_string(), values);
        }
        Ok(self.secrets[name].as_ref())
    }

    /// A ConfigMap's data (binary data too), `None` when it does not exist.
    pub(crate) async fn config_map(&mut self, name: &str) -> Result<Option<&Values>, String> {
        if !self.config_maps.contains_key(name) {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
            let found = api.get_opt(name).await.map_err(|e| e.to_string())?;
            let values = found.map(|c| {
                let mut v = c.data.unwrap_or_default();
                for (k, b) in c.binary_data.unwrap_or_default() {
                    v.insert(k, String::from_utf8_lossy(&b.0).into_owned());
                }
                v
            });
            self.config_maps.insert(name.to_string(), values);
        }
        Ok(self.config_maps[name].as_ref())
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }
}

/// The environment of `container` in `pod`, which runs at `pod_ip` on a node at `host_ip`.
pub(crate) async fn resolve(
    sources: &mut Sources<'_>,
    pod: &Pod,
    container: &Container,
    pod_ip: &str,
    host_ip: &str,
) -> Result<Vec<(String, String)>, String> {
    let ns = sources.namespace().to_string();
    let mut out: Vec<(String, String)> = vec![("HOSTNAME".into(), pod.name_any())];
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            match sources.config_map(&r.name).await? {
                Some(values) => out.extend(
                    values
                        .iter()
                        .map(|(k, v)| (format!("{prefix}{k}"), v.clone())),
                ),
                None if r.optional == Some(true) => {}
                None => return Err(format!("configmap {:?} not found", r.name)),
            }
        }
        if let Some(r) = &from.secret_ref {
            match sources.secret(&r.name).await? {
                Some(values) => out.extend(
                    values
                        .iter()
                        .map(|(k, v)| (format!("{prefix}{k}"), v.clone())),
                ),
                None if r.optional == Some(true) => {}
                None => return Err(format!("secret {:?} not found", r.name)),
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => var.value.clone().unwrap_or_default(),
            Some(from) => {
                if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional == Some(true);
                    match sources.secret(&r.name).await? {
                        Some(values) => match values.get(&r.key) {
                            Some(v) => v.clone(),
                            None if optional => continue,
                            None => {
                                return Err(format!(
                                    "couldn't find key {} in Secret {ns}/{}",
                                    r.key, r.name
                                ))
                            }
                        },
                        None if optional => continue,
                        None => return Err(format!("secret {:?} not found", r.name)),
                    }
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional == Some(true);
                    match sources.config_map(&r.name).await? {
                        Some(values) => match values.get(&r.key) {
                            Some(v) => v.clone(),
                            None if optional => continue,
                            None => {
                                return Err(format!(
                                    "couldn't find key {} in ConfigMap {ns}/{}",
                                    r.key, r.name
                                ))
                            }
                        },
                        None if optional => continue,
                        None => return Err(format!("configmap {:?} not found", r.name)),
                    }
                } else if let Some(f) = &from.field_ref {
                    field(pod, &f.field_path, pod_ip, host_ip)
                        .ok_or_else(|| format!("unsupported fieldPath: {}", f.field_path))?
                } else {
                    // resourceFieldRef: no cgroup limits here to report.
                    String::new()
                }
            }
        };
        out.push((var.name.clone(), value));
    }
    // A later definition of a name replaces an earlier one.
    let mut seen = BTreeMap::new();
    for (i, (k, _)) in out.iter().enumerate() {
        seen.insert(k.clone(), i);
    }
    Ok(out
        .into_iter()
        .enumerate()
        .filter(|(i, (k, _))| seen[k] == *i)
        .map(|(_, kv)| kv)
        .collect())
}

/// The downward API's `fieldRef` paths (pkg/kubelet/kubelet_pods.go `podFieldSelectorRuntimeValue`).
fn field(pod: &Pod, path: &str, pod_ip: &str, host_ip: &str) -> Option<String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let quoted = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_string)
    };
    Some(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "spec.nodeName" => spec.node_name.unwrap_or_default(),
        "spec.serviceAccountName" => spec.service_account_name.unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_string(),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        _ => {
            if let Some(k) = quoted("metadata.labels['") {
                pod.labels().get(&k).cloned().unwrap_or_default()
            } else if let Some(k) = quoted("metadata.annotations['") {
                pod.annotations().get(&k).cloned().unwrap_or_default()
            } else {
                return None;
            }
        }
    })
}

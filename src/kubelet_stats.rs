//! A database volume's file system as its node's kubelet reports it: the Summary API
//! (`GET https://<node InternalIP>:<kubeletEndpoint port>/stats/summary`), whose pod volume
//! entries carry `capacityBytes`, `availableBytes` and `usedBytes` of each claim (for a CSI
//! volume, the driver's `NodeGetVolumeStats`: a `statfs` of the mount).
//!
//! Why the kubelet and not QuestDB: QuestDB reports no free space (its metrics and SQL say
//! how large tables are, not how full the file system is), and a volume fills with WAL
//! segments, checkpoints and system tables as much as with table data. Why straight to the
//! kubelet and not through the API server's node proxy: the kubelet authorizes `/stats/*` as
//! `get` on `nodes/stats` (docs: "Kubelet authentication/authorization"), a read-only grant,
//! where the proxy needs `nodes/proxy`, which reaches every kubelet endpoint (exec included).
//! The request carries the operator's own credentials; the kubelet checks them with a
//! TokenReview and a SubjectAccessReview. Its serving certificate is verified against the
//! cluster's CA (EKS signs kubelet serving certificates with it) or `--kubelet-ca-file`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use serde::Deserialize;

pub(crate) use crate::plan::disk::VolumeUsage;

/// How long one Summary request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The parts of the kubelet's `Summary` (k8s.io/kubelet/pkg/apis/stats/v1alpha1) read here.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct Summary {
    #[serde(default)]
    pub pods: Vec<PodStats>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodStats {
    pub pod_ref: PodReference,
    #[serde(default)]
    pub volume: Vec<VolumeStats>,
}

#[derive(Deserialize, Debug)]
pub(crate) struct PodReference {
    pub namespace: String,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VolumeStats {
    #[serde(default)]
    pub pvc_ref: Option<PvcReference>,
    #[serde(default)]
    pub capacity_bytes: Option<u64>,
    #[serde(default)]
    pub available_bytes: Option<u64>,
    #[serde(default)]
    pub used_bytes: Option<u64>,
}

#[derive(Deserialize, Debug)]
pub(crate) struct PvcReference {
    pub name: String,
    pub namespace: String,
}

impl Summary {
    /// The usage of claim `namespace/claim`, as the pod that mounts it reports it.
    pub(crate) fn claim(&self, namespace: &str, claim: &str) -> Option<VolumeUsage> {
        self.pods
            .iter()
            .filter(|p| p.pod_ref.namespace == namespace)
            .flat_map(|p| &p.volume)
            .find(|v| {
                v.pvc_ref
                    .as_ref()
                    .is_some_and(|r| r.namespace == namespace && r.name == claim)
            })
            .and_then(|v| {
                Some(VolumeUsage {
                    capacity: v.capacity_bytes.filter(|c| *c > 0)?,
                    available: v.available_bytes?,
                    used: v.used_bytes?,
                })
            })
    }
}

/// Clients for the kubelets, one per endpoint, with the operator's credentials.
pub(crate) struct Kubelets {
    base: kube::Config,
    /// The CA the kubelets' serving certificates are verified with (DER); the cluster's when
    /// `None`.
    ca: Option<Vec<Vec<u8>>>,
    clients: Mutex<HashMap<String, kube::Client>>,
}

impl Kubelets {
    /// `ca_pem`: the CA that signs the kubelets' serving certificates, when it is not the
    /// cluster's (`--kubelet-ca-file`).
    pub(crate) fn new(base: &kube::Config, ca_pem: Option<&str>) -> anyhow::Result<Self> {
        let ca = match ca_pem {
            Some(pem) => {
                let certs = pem_certificates(pem)?;
                anyhow::ensure!(!certs.is_empty(), "the kubelet CA holds no certificate");
                Some(certs)
            }
            None => None,
        };
        Ok(Self {
            base: base.clone(),
            ca,
            clients: Mutex::default(),
        })
    }

    /// The Summary of `node`'s kubelet: refused, unreachable or unreadable, the reason.
    pub(crate) async fn summary(&self, node: &Node) -> Result<Summary, String> {
        let endpoint = endpoint(node)?;
        let client = self.client(&endpoint)?;
        let request = http::Request::get("/stats/summary")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let text = tokio::time::timeout(REQUEST_TIMEOUT, client.request_text(request))
            .await
            .map_err(|_| format!("the kubelet at {endpoint} did not answer in {REQUEST_TIMEOUT:?}"))?
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 401 || s.code == 403 => format!(
                    "the kubelet at {endpoint} refused the operator ({}): it needs get on nodes/stats",
                    s.code
                ),
                e => format!("the kubelet at {endpoint}: {e}"),
            })?;
        serde_json::from_str(&text).map_err(|e| {
            format!("the kubelet at {endpoint} sent a Summary that does not parse: {e}")
        })
    }

    /// Forgets the clients of kubelets not in `nodes` (dedicated nodes come and go).
    pub(crate) fn keep_only<'a>(&self, nodes: impl IntoIterator<Item = &'a Node>) {
        let keep: std::collections::HashSet<String> =
            nodes.into_iter().filter_map(|n| endpoint(n).ok()).collect();
        self.clients
            .lock()
            .expect("kubelet clients lock")
            .retain(|e, _| keep.contains(e));
    }

    fn client(&self, endpoint: &str) -> Result<kube::Client, String> {
        let mut clients = self.clients.lock().expect("kubelet clients lock");
        if let Some(c) = clients.get(endpoint) {
            return Ok(c.clone());
        }
        let mut config = self.base.clone();
        config.cluster_url = endpoint.parse().map_err(|e| format!("{endpoint}: {e}"))?;
        // The kubelet's certificate names its address, not the API server's.
        config.tls_server_name = None;
        config.proxy_url = None;
        if let Some(ca) = &self.ca {
            config.root_cert = Some(ca.clone());
            config.root_cert_file = None;
        }
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        clients.insert(endpoint.to_string(), client.clone());
        Ok(client)
    }
}

/// `https://<InternalIP>:<port>` of the node's kubelet.
pub(crate) fn endpoint(node: &Node) -> Result<String, String> {
    let status = node.status.as_ref();
    let ip = status
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .ok_or_else(|| "the node reports no InternalIP".to_string())?;
    let port = status
        .and_then(|s| s.daemon_endpoints.as_ref())
        .and_then(|d| d.kubelet_endpoint.as_ref())
        .map(|e| e.port)
        .filter(|p| *p > 0)
        .unwrap_or(10250);
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip
    };
    Ok(format!("https://{host}:{port}"))
}

/// The DER certificates of a PEM bundle.
fn pem_certificates(pem: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    use base64::Engine as _;
    let mut out = Vec::new();
    let mut body: Option<String> = None;
    for line in pem.lines().map(str::trim) {
        match (line, &mut body) {
            ("-----BEGIN CERTIFICATE-----", None) => body = Some(String::new()),
            ("-----END CERTIFICATE-----", Some(b)) => {
                out.push(base64::engine::general_purpose::STANDARD.decode(b.as_bytes())?);
                body = None;
            }
            (l, Some(b)) => b.push_str(l),
            _ => {}
        }
    }
    anyhow::ensure!(
        body.is_none(),
        "a certificate in the kubelet CA is not closed"
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_claims_usage_is_read_from_the_pod_that_mounts_it_and_no_other() {
        let summary: Summary = serde_json::from_value(json!({
            "node": {"nodeName": "n1"},
            "pods": [
                {"podRef": {"name": "other-0", "namespace": "b", "uid": "u1"},
                 "volume": [{"name": "data", "pvcRef": {"name": "data-db-0", "namespace": "b"},
                             "capacityBytes": 1, "availableBytes": 1, "usedBytes": 0}]},
                {"podRef": {"name": "db-0", "namespace": "a", "uid": "u2"},
                 "volume": [
                    {"name": "tmp", "capacityBytes": 5, "availableBytes": 5, "usedBytes": 0},
                    {"name": "data", "pvcRef": {"name": "data-db-0", "namespace": "a"},
                     "capacityBytes": 1000, "availableBytes": 150, "usedBytes": 850}]}
            ]
        }))
        .unwrap();
        assert_eq!(
            summary.claim("a", "data-db-0"),
            Some(VolumeUsage {
                capacity: 1000,
                available: 150,
                used: 850
            })
        );
        assert_eq!(summary.claim("a", "missing"), None);
    }

    #[test]
    fn the_kubelet_endpoint_is_the_nodes_internal_ip_and_reported_port() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {
                "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.1.5"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}
            }
        }))
        .unwrap();
        assert_eq!(endpoint(&node).unwrap(), "https://10.0.1.5:10250");
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
        assert!(endpoint(&bare).unwrap_err().contains("InternalIP"));
    }

    #[test]
    fn a_ca_bundle_parses_into_its_certificates_and_a_broken_one_is_refused() {
        let pem = "-----BEGIN CERTIFICATE-----\nAAEC\nAwQ=\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nBQY=\n-----END CERTIFICATE-----\n";
        assert_eq!(
            pem_certificates(pem).unwrap(),
            vec![vec![0, 1, 2, 3, 4], vec![5, 6]]
        );
        assert!(pem_certificates("-----BEGIN CERTIFICATE-----\nAAEC\n").is_err());
    }
}

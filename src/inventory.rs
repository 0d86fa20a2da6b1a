//! `questdb-operator inventory`: what the operator owns that costs money or holds data, listed
//! before an uninstall (docs/operations/eks.md, "Uninstalling without leaving anything billed"): the
//! QuestDBs (each one's finalizer gives its instance and record back), the dedicated instances
//! EC2 runs for this cluster (by its tag, whatever the QuestDBs say), the DNS records the
//! QuestDBs published, the operator's volume claims (a retained one outlives its QuestDB) and
//! the backups' snapshots (`deletionPolicy: Retain` keeps one after its backup).
//! It reads only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::api::{labels, QuestDB, QuestDBBackup};
use crate::cloud::{DnsProvider, InstanceState, NodeProvider, TAG_UID};

/// One thing that would remain, as a line of its kind's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// What it is ("QuestDB", "instance", "record", "claim", "snapshot").
    pub kind: &'static str,
    /// Its name (namespace/name, instance id, DNS name).
    pub name: String,
    /// What keeps it, and whose it is.
    pub detail: String,
    /// Billed or holding data once the operator is gone (a QuestDB itself is neither).
    pub remains: bool,
}

/// Everything found, in the order an uninstall meets it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    pub items: Vec<Item>,
    /// EC2 and Route53 were not asked (no cloud flags): instances and records are not listed.
    pub cloud_not_asked: bool,
}

impl Inventory {
    /// What would remain after `helm uninstall` (instances, records, claims, snapshots).
    pub(crate) fn remaining(&self) -> impl Iterator<Item = &Item> {
        self.items.iter().filter(|i| i.remains)
    }

    /// The inventory as a person reads it: one line per item, then what to do.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.cloud_not_asked {
            out.push_str("EC2 and Route53 were not asked (no --cloud-provider and its flags, as given to run): instances and records are not listed\n");
        }
        let width = self.items.iter().map(|i| i.name.len()).max().unwrap_or(0);
        for i in &self.items {
            out.push_str(&format!("{:<9} {:<width$}  {}\n", i.kind, i.name, i.detail));
        }
        let questdbs = self.items.iter().filter(|i| i.kind == "QuestDB").count();
        let remaining = self.remaining().count();
        out.push_str(&match (questdbs, remaining) {
            (0, 0) => "nothing would remain: the chart can be uninstalled\n".to_string(),
            (0, n) => format!(
                "{n} item(s) would remain after helm uninstall: delete the ones you do not keep (docs/operations/eks.md, Uninstalling)\n"
            ),
            (q, n) => format!(
                "{q} QuestDB(s) still exist and {n} item(s) would remain: delete the QuestDBs first (kubectl delete qdb --all -A) while the operator runs; it gives their instances and records back\n"
            ),
        });
        out
    }
}

/// Reads what the operator owns, across namespaces (or in `namespace`).
pub async fn collect(
    client: &Client,
    namespace: Option<&str>,
    nodes: Option<&dyn NodeProvider>,
    dns: Option<&dyn DnsProvider>,
) -> anyhow::Result<Inventory> {
    let list = ListParams::default();
    let questdbs = match namespace {
        Some(ns) => Api::<QuestDB>::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
    .list(&list)
    .await?
    .items;
    let claims = match namespace {
        Some(ns) => Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
    .list(&ListParams::default().labels(&format!(
        "{}={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    )))
    .await?
    .items;
    let backups = match namespace {
        Some(ns) => Api::<QuestDBBackup>::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
    .list(&list)
    .await
    // Without the backup CRD there are no backups.
    .map(|l| l.items)
    .unwrap_or_default();
    let by_uid: BTreeMap<String, String> = questdbs
        .iter()
        .filter_map(|q| Some((q.uid()?, display(q))))
        .collect();

    let mut items: Vec<Item> = questdbs.iter().map(questdb_item).collect();
    if let Some(nodes) = nodes {
        for i in nodes.describe_cluster().await? {
            if matches!(
                i.state,
                InstanceState::Terminated | InstanceState::ShuttingDown
            ) {
                continue;
            }
            let owner = i.tags.get(TAG_UID).map_or_else(
                || "no QuestDB tag".to_string(),
                |uid| {
                    by_uid.get(uid).map_or_else(
                        || format!("QuestDB uid {uid}, gone"),
                        |q| format!("QuestDB {q}"),
                    )
                },
            );
            items.push(Item {
                kind: "instance",
                name: i.id.clone(),
                detail: format!("{:?}, {} in {}, {owner}", i.state, i.instance_type, i.zone),
                remains: true,
            });
        }
    }
    if let Some(dns) = dns {
        for q in &questdbs {
            let Some(name) = q.status.as_ref().and_then(|s| s.dns_name.clone()) else {
                continue;
            };
            if let Some(record) = dns.read_a(&name).await? {
                items.push(Item {
                    kind: "record",
                    name: record.name.clone(),
                    detail: format!("A {}, QuestDB {}", record.ips.join(","), display(q)),
                    remains: true,
                });
            }
        }
    }
    items.extend(claims.iter().map(claim_item));
    for b in &backups {
        let Some(snapshot) = b.status.as_ref().and_then(|s| s.snapshot_name.clone()) else {
            continue;
        };
        items.push(Item {
            kind: "snapshot",
            name: format!("{}/{snapshot}", b.namespace().unwrap_or_default()),
            detail: format!(
                "backup {} of QuestDB {}, deletionPolicy {:?}",
                b.name_any(),
                b.spec.questdb_name,
                b.spec.deletion_policy
            ),
            remains: true,
        });
    }
    Ok(Inventory {
        items,
        cloud_not_asked: nodes.is_none() && dns.is_none(),
    })
}

/// A QuestDB as the inventory lists it: its phase, instance and record.
fn questdb_item(q: &QuestDB) -> Item {
    let s = q.status.clone().unwrap_or_default();
    let mut detail = vec![format!(
        "phase {}",
        s.phase.map(|p| p.as_str()).unwrap_or("unknown")
    )];
    if let Some(id) = &s.instance_id {
        detail.push(format!("instance {id}"));
    }
    if let Some(name) = &s.dns_name {
        detail.push(format!("record {name}"));
    }
    Item {
        kind: "QuestDB",
        name: display(q),
        detail: detail.join(", "),
        remains: false,
    }
}

/// A database volume's claim: its size, its volume, and whether it outlives its QuestDB.
fn claim_item(c: &PersistentVolumeClaim) -> Item {
    let owned = c.owner_references().iter().any(|o| o.kind == "QuestDB");
    let size = c
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default();
    let volume = c
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_else(|| "unbound".into());
    Item {
        kind: "claim",
        name: display(c),
        detail: format!(
            "{size}, volume {volume}, {}",
            if owned {
                "deleted with its QuestDB"
            } else {
                "retained: outlives its QuestDB"
            }
        ),
        remains: true,
    }
}

fn display(o: &impl ResourceExt) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(kind: &'static str, name: &str, remains: bool) -> Item {
        Item {
            kind,
            name: name.into(),
            detail: "x".into(),
            remains,
        }
    }

    /// The last line says what to do: QuestDBs first while the operator runs, then what remains.
    #[test]
    fn the_inventory_says_what_to_delete_first() {
        let empty = Inventory::default().render();
        assert!(empty.contains("nothing would remain"), "{empty}");
        let blind = Inventory {
            cloud_not_asked: true,
            ..Default::default()
        }
        .render();
        assert!(blind.contains("EC2 and Route53 were not asked"), "{blind}");
        let with_db = Inventory {
            items: vec![
                item("QuestDB", "orders/db", false),
                item("instance", "i-1", true),
            ],
            ..Default::default()
        }
        .render();
        assert!(
            with_db.contains("1 QuestDB(s)") && with_db.contains("delete the QuestDBs first"),
            "{with_db}"
        );
        let retained = Inventory {
            items: vec![item("claim", "orders/data-db-0", true)],
            ..Default::default()
        }
        .render();
        assert!(retained.contains("1 item(s) would remain"), "{retained}");
    }
}

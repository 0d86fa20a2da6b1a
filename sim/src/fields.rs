//! A small model of server-side-apply field ownership: enough for the conflict that lease-based
//! leader election relies on (an apply without `force` that would change a field another manager
//! set is refused with 409). Lists are atomic leaves; `managedFields` is not exposed.

use std::collections::BTreeMap;

use serde_json::Value;

/// Leaf path (`.spec.holderIdentity`) -> field manager.
pub type Owners = BTreeMap<String, String>;

fn leaves<'a>(v: &'a Value, prefix: String, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                if prefix.is_empty() && matches!(k.as_str(), "apiVersion" | "kind") {
                    continue;
                }
                let path = format!("{prefix}.{k}");
                if path == ".metadata" {
                    for sub in ["labels", "annotations", "finalizers", "ownerReferences"] {
                        if let Some(m) = child.get(sub) {
                            leaves(m, format!(".metadata.{sub}"), out);
                        }
                    }
                    continue;
                }
                leaves(child, path, out);
            }
        }
        _ => out.push((prefix, v)),
    }
}

fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').skip(1).try_fold(v, |cur, k| cur.get(k))
}

/// Fields of `applied` whose value would change and that another manager owns.
pub fn apply_conflicts(
    owners: &Owners,
    current: &Value,
    applied: &Value,
    manager: &str,
) -> Vec<(String, String)> {
    let mut out = vec![];
    let mut applied_leaves = vec![];
    leaves(applied, String::new(), &mut applied_leaves);
    for (path, value) in applied_leaves {
        let Some(owner) = owners.get(&path) else {
            continue;
        };
        if owner != manager && lookup(current, &path) != Some(value) {
            out.push((path, owner.clone()));
        }
    }
    out
}

/// Records that `manager` now owns the leaves it changed (and, for apply, every leaf it sent);
/// leaves that disappeared lose their owner.
pub fn record(
    owners: &mut Owners,
    old: &Value,
    new: &Value,
    manager: &str,
    applied: Option<&Value>,
) {
    let mut new_leaves = vec![];
    leaves(new, String::new(), &mut new_leaves);
    let present: std::collections::HashSet<&str> =
        new_leaves.iter().map(|(p, _)| p.as_str()).collect();
    owners.retain(|p, _| present.contains(p.as_str()));
    for (path, value) in &new_leaves {
        if lookup(old, path) != Some(*value) {
            owners.insert(path.clone(), manager.to_string());
        }
    }
    if let Some(applied) = applied {
        let mut applied_leaves = vec![];
        leaves(applied, String::new(), &mut applied_leaves);
        for (path, _) in applied_leaves {
            if present.contains(path.as_str()) {
                owners.insert(path, manager.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn apply_by_another_manager_conflicts_until_the_field_is_released() {
        let mut owners = Owners::new();
        let empty = json!({});
        let a = json!({"spec": {"holderIdentity": "a"}});
        record(&mut owners, &empty, &a, "a", Some(&a));
        let b = json!({"spec": {"holderIdentity": "b"}});
        assert_eq!(apply_conflicts(&owners, &a, &b, "b").len(), 1);
        // Same value: shared ownership, no conflict.
        assert!(apply_conflicts(&owners, &a, &a, "b").is_empty());
        // The holder clears the field: nobody owns it any more.
        let cleared = json!({"spec": {}});
        record(&mut owners, &a, &cleared, "a", None);
        assert!(apply_conflicts(&owners, &cleared, &b, "b").is_empty());
    }
}

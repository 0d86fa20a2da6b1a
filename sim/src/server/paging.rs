//! `limit`/`continue` list pagination. A continue token carries the first page's
//! resourceVersion (so a watch after the last page resumes from there and replays whatever
//! changed while paging) and the last key served.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::store::Stored;

pub struct Page {
    pub items: Vec<Arc<Stored>>,
    /// The list's `metadata`.
    pub meta: Value,
}

fn bad_token() -> ApiError {
    ApiError::bad_request("continue key is not valid: malformed continue token")
}

fn decode(token: &str) -> Result<(u64, String, String), ApiError> {
    let bytes = hex::decode(token).map_err(|_| bad_token())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad_token())?;
    match (v["rv"].as_u64(), v["ns"].as_str(), v["name"].as_str()) {
        (Some(rv), Some(ns), Some(name)) => Ok((rv, ns.to_string(), name.to_string())),
        _ => Err(bad_token()),
    }
}

fn encode(rv: u64, last: &Stored) -> String {
    hex::encode(json!({"rv": rv, "ns": last.namespace, "name": last.name}).to_string())
}

/// `items` are in (namespace, name) order, already filtered by the selectors.
pub fn paginate(
    items: Vec<Arc<Stored>>,
    current_rv: u64,
    limit: Option<&str>,
    continue_token: Option<&str>,
) -> Result<Page, ApiError> {
    let (rv, mut items) = match continue_token.filter(|t| !t.is_empty()) {
        None => (current_rv, items),
        Some(t) => {
            let (rv, ns, name) = decode(t)?;
            let rest = items
                .into_iter()
                .filter(|o| (o.namespace.as_str(), o.name.as_str()) > (ns.as_str(), name.as_str()))
                .collect();
            (rv, rest)
        }
    };
    let limit = match limit.filter(|l| !l.is_empty()) {
        None => 0,
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
    };
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if limit > 0 && items.len() > limit {
        let remaining = items.len() - limit;
        items.truncate(limit);
        if let Some(last) = items.last() {
            meta["continue"] = Value::String(encode(rv, last));
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    Ok(Page { items, meta })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str) -> Arc<Stored> {
        let store = crate::store::Store::new(10);
        let key = crate::registry::StorageKey {
            group: String::new(),
            plural: "configmaps".into(),
        };
        let v = json!({"metadata": {"name": name, "namespace": "ns", "uid": name}});
        let stored = store.write().put(&key, v, None);
        stored
    }

    #[test]
    fn pages_follow_each_other_and_keep_the_first_resource_version() {
        let all = || vec![obj("a"), obj("b"), obj("c")];
        let first = paginate(all(), 7, Some("2"), None).unwrap();
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.meta["remainingItemCount"], 1);
        let token = first.meta["continue"].as_str().unwrap().to_string();
        let second = paginate(all(), 9, Some("2"), Some(&token)).unwrap();
        assert_eq!(
            second
                .items
                .iter()
                .map(|o| o.name.as_str())
                .collect::<Vec<_>>(),
            ["c"]
        );
        assert_eq!(second.meta["resourceVersion"], "7");
        assert!(second.meta.get("continue").is_none());
        assert_eq!(
            paginate(all(), 7, None, Some("zz")).err().unwrap().code,
            400
        );
    }
}

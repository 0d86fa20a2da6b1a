//! Label and field selectors (`?labelSelector=` / `?fieldSelector=`), parsed once per request.

use std::collections::BTreeMap;

use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits at commas that are not inside `( )`.
fn top_level_parts(s: &str) -> Vec<&str> {
    let mut parts = vec![];
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn set_values(s: &str) -> Result<Vec<String>, ApiError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: expected a (value, ...) set, got {s:?}"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        for part in top_level_parts(s) {
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set_values(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                LabelReq::In(k.trim().into(), set_values(v)?)
            } else if part.contains(['(', ')', ' ', '<', '>']) {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: {part:?}"
                )));
            } else {
                LabelReq::Exists(part.to_string())
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => labels.get(k) == Some(v),
            LabelReq::NotEq(k, v) => labels.get(k) != Some(v),
            LabelReq::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            LabelReq::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// The fields a field selector may test; the store keeps them beside each object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Name,
    Namespace,
    NodeName,
    Phase,
    /// A field kept in `FieldValues::extra` (Events).
    Extra(String),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(Field, bool, String)>);

pub struct FieldValues<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub node_name: &'a str,
    pub phase: &'a str,
    pub extra: &'a [(String, String)],
}

impl FieldSelector {
    /// `plural` decides which fields exist: `spec.nodeName` and `status.phase` only for pods,
    /// like the apiserver.
    pub fn parse(s: &str, plural: &str) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        for part in top_level_parts(s) {
            let (key, eq, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            let field = match (key.trim(), plural) {
                ("metadata.name", _) => Field::Name,
                ("metadata.namespace", _) => Field::Namespace,
                ("spec.nodeName", "pods") => Field::NodeName,
                ("status.phase", "pods") => Field::Phase,
                (k, "events")
                    if k.starts_with("involvedObject.") || k == "reason" || k == "type" =>
                {
                    Field::Extra(k.to_string())
                }
                (k, "events") if k.starts_with("regarding.") => {
                    Field::Extra(k.replacen("regarding.", "involvedObject.", 1))
                }
                (other, _) => {
                    return Err(ApiError::bad_request(format!(
                        "field label not supported: {other}"
                    )))
                }
            };
            reqs.push((field, eq, value.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, f: &FieldValues<'_>) -> bool {
        self.0.iter().all(|(field, eq, want)| {
            let have = match field {
                Field::Name => f.name,
                Field::Namespace => f.namespace,
                Field::NodeName => f.node_name,
                Field::Phase => f.phase,
                Field::Extra(key) => f
                    .extra
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.as_str())
                    .unwrap_or(""),
            };
            (have == want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_operators() {
        let l = labels(&[("app", "db"), ("tier", "gold")]);
        let yes = [
            "app=db",
            "app==db",
            "app!=web",
            "tier in (gold, silver)",
            "tier notin (x)",
            "app",
            "!missing",
            "app=db,tier",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
        let no = [
            "app=web",
            "app!=db",
            "tier in (x,y)",
            "tier notin (gold)",
            "missing",
            "!app",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
    }

    #[test]
    fn field_selector_rejects_unknown_fields() {
        assert!(FieldSelector::parse("spec.nodeName=n1", "pods").is_ok());
        assert_eq!(
            FieldSelector::parse("spec.nodeName=n1", "services")
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            FieldSelector::parse("garbage", "pods").unwrap_err().code,
            400
        );
    }
}

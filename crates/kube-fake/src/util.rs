//! Small helpers: timestamps, query strings, label and field
//! selectors as the Kubernetes API server understands them.

use std::collections::BTreeMap;

/// `2026-01-02T03:04:05Z` for now.
pub fn now_rfc3339() -> String {
    rfc3339(u64::try_from(jiff::Timestamp::now().as_second()).unwrap_or(0))
}

/// RFC 3339 (UTC, whole seconds) for seconds since the epoch.
pub fn rfc3339(secs: u64) -> String {
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    jiff::Timestamp::from_second(secs).unwrap_or(jiff::Timestamp::MAX).to_string()
}

/// Query parameters, decoded; the last value of a repeated key wins.
pub fn parse_query(query: Option<&str>) -> BTreeMap<String, String> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes()).into_owned().collect()
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A label selector (`k=v,k!=v,k in (a,b),k notin (a),k,!k`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut terms = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (i, c) in text.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    terms.push(&text[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        terms.push(&text[start..]);
        let mut out = Vec::new();
        for term in terms.into_iter().map(str::trim).filter(|t| !t.is_empty()) {
            let bad = || format!("unable to parse requirement: {term:?}");
            let requirement = if let Some(k) = term.strip_prefix('!') {
                Requirement::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Requirement::Eq(k.trim().into(), v.trim().into())
            } else if let Some(open) = term.find('(') {
                let list = term[open + 1..].strip_suffix(')').ok_or_else(bad)?;
                let values = list.split(',').map(|v| v.trim().to_string()).collect();
                let head: Vec<&str> = term[..open].split_whitespace().collect();
                match head[..] {
                    [k, "in"] => Requirement::In(k.into(), values),
                    [k, "notin"] => Requirement::NotIn(k.into(), values),
                    _ => return Err(bad()),
                }
            } else if term.contains(char::is_whitespace) {
                return Err(bad());
            } else {
                Requirement::Exists(term.to_string())
            };
            out.push(requirement);
        }
        Ok(LabelSelector(out))
    }

    pub fn matches(&self, labels: &serde_json::Value) -> bool {
        let get = |k: &str| labels.get(k).and_then(|v| v.as_str());
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v),
            Requirement::NotEq(k, v) => get(k) != Some(v),
            Requirement::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A field selector on `metadata.name` and `metadata.namespace`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(text: &str) -> Result<FieldSelector, String> {
        let mut out = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!("invalid field selector {term:?}"));
            };
            if !matches!(field, "metadata.name" | "metadata.namespace") {
                return Err(format!("field label not supported: {field}"));
            }
            out.push((field.to_string(), equal, value.to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// Whether an object of `namespace` (empty when cluster-scoped) and
    /// `name` is selected.
    pub fn matches(&self, namespace: &str, name: &str) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let actual = if field == "metadata.name" { name } else { namespace };
            (actual == value) == *equal
        })
    }
}

pub(crate) fn owner_uids(value: &serde_json::Value) -> impl Iterator<Item = &str> {
    value["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str())
}

pub(crate) fn is_foreground_deleting(value: &serde_json::Value) -> bool {
    value["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == "foregroundDeletion"))
        && value["metadata"].get("deletionTimestamp").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(rfc3339(1_798_761_600), "2027-01-01T00:00:00Z");
    }

    #[test]
    fn queries_and_selectors() {
        let q = parse_query(Some("labelSelector=app%3Dgw%2Ctier+in+%28a%2Cb%29&watch=1"));
        assert_eq!(q["labelSelector"], "app=gw,tier in (a,b)");
        let s = LabelSelector::parse(&q["labelSelector"]).unwrap();
        assert!(s.matches(&json!({"app": "gw", "tier": "a"})));
        assert!(!s.matches(&json!({"app": "gw", "tier": "c"})));
        assert!(LabelSelector::parse("!x,y notin (z)").unwrap().matches(&json!({"y": "w"})));
        let f = FieldSelector::parse("metadata.name=edge").unwrap();
        assert!(f.matches("", "edge"));
        assert!(!f.matches("edge", "core"));
        let f = FieldSelector::parse("metadata.namespace!=kube-system").unwrap();
        assert!(f.matches("default", "x") && !f.matches("kube-system", "x"));
        assert!(FieldSelector::parse("spec.x=1").is_err());
    }
}

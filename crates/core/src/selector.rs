//! Kubernetes label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
//! `k notin (a,b)`, `k` and `!k`, joined by commas (all must hold).

use std::collections::BTreeMap;

use crate::syntax;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(pub Vec<Requirement>);

/// A selector that does not parse, with what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorError {
    pub selector: String,
    pub reason: String,
}

impl Selector {
    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses a selector string.
    pub fn parse(input: &str) -> Result<Selector, SelectorError> {
        let err = |reason: String| SelectorError { selector: input.to_string(), reason };
        let mut requirements = Vec::new();
        for term in split_terms(input).map_err(err)? {
            requirements.push(parse_term(term.trim()).map_err(err)?);
        }
        Ok(Selector(requirements))
    }
}

/// Splits on commas outside parentheses.
fn split_terms(input: &str) -> Result<Vec<&str>, String> {
    if input.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0u32, 0);
    for (i, c) in input.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err("nested parentheses".into()),
            ')' if depth == 1 => depth = 0,
            ')' => return Err("unbalanced ')'".into()),
            ',' if depth == 0 => {
                terms.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("missing ')'".into());
    }
    terms.push(&input[start..]);
    Ok(terms)
}

fn key(k: &str) -> Result<String, String> {
    let k = k.trim();
    syntax::qualified_name(k)?;
    Ok(k.to_string())
}

fn value(v: &str) -> Result<String, String> {
    let v = v.trim();
    syntax::label_value(v)?;
    Ok(v.to_string())
}

fn parse_term(term: &str) -> Result<Requirement, String> {
    if term.is_empty() {
        return Err("empty requirement".into());
    }
    if let Some(k) = term.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key(k)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(key(k)?, value(v)?));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(key(k)?, value(v)?));
    }
    if let Some(open) = term.find('(') {
        let head = term[..open].trim_end();
        let (k, op) = head
            .rsplit_once(char::is_whitespace)
            .ok_or_else(|| format!("expected `key in (...)` or `key notin (...)` in {term:?}"))?;
        let list = term[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| format!("expected ')' at the end of {term:?}"))?;
        let values = list.split(',').map(value).collect::<Result<Vec<_>, _>>()?;
        return match op {
            "in" => Ok(Requirement::In(key(k)?, values)),
            "notin" => Ok(Requirement::NotIn(key(k)?, values)),
            other => Err(format!("unknown operator {other:?}; use in or notin")),
        };
    }
    Ok(Requirement::Exists(key(term)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn operators() {
        let l = labels(&[("env", "prod"), ("tier", "edge")]);
        let cases = [
            ("", true),
            ("env=prod", true),
            ("env==prod", true),
            ("env=dev", false),
            ("env!=dev", true),
            ("missing!=x", true),
            ("env in (prod, staging)", true),
            ("env in (dev)", false),
            ("env notin (dev,staging)", true),
            ("missing notin (dev)", true),
            ("env", true),
            ("missing", false),
            ("!missing", true),
            ("!env", false),
            ("env=prod,tier=edge", true),
            ("env=prod, tier=core", false),
            ("app.kubernetes.io/name", false),
        ];
        for (selector, expected) in cases {
            let parsed = Selector::parse(selector).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(parsed.matches(&l), expected, "{selector}");
        }
    }

    #[test]
    fn malformed_selectors_are_rejected() {
        for bad in [
            "env in (a",
            "env in a)",
            "env=a b",
            "=x",
            "env is (a)",
            ",",
            "env in ((a))",
            "Bad Key",
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
    }
}

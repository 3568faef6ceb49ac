//! The subset of kubectl's JSONPath templates that `-o jsonpath=`,
//! `-o custom-columns=` and `--sort-by` take: text, `{.field.path}` with
//! `[n]`, `[*]` and `['key']`, `{range PATH}...{end}` and quoted literals
//! such as `{"\n"}`. A missing field prints nothing, as with kubectl's
//! default `--allow-missing-template-keys=true`.

use serde_json::Value;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    All,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Text(String),
    Path(Vec<Step>),
    Range(Vec<Step>, Vec<Node>),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    nodes: Vec<Node>,
}

/// A field path on its own (`.metadata.name` or `{.metadata.name}`), for
/// custom columns and `--sort-by`.
#[derive(Debug, Clone, PartialEq)]
pub struct Path(Vec<Step>, String);

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.1)
    }
}

/// A template or path that does not parse; the message says where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(String);

fn error(text: impl Into<String>) -> TemplateError {
    TemplateError(text.into())
}

/// Parses a path: `.a.b[0]['c.d'][*]`, optionally in braces or after `$`.
fn parse_path(text: &str) -> Result<Vec<Step>, TemplateError> {
    let text = text.trim();
    let text = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')).unwrap_or(text).trim();
    let text = text.strip_prefix('$').unwrap_or(text);
    if !text.is_empty() && !text.starts_with('.') && !text.starts_with('[') {
        return Err(error(format!("{text:?}: a field path starts with '.' (e.g. .metadata.name)")));
    }
    let chars: Vec<char> = text.chars().collect();
    let (mut steps, mut i) = (Vec::new(), 0);
    while i < chars.len() {
        match chars[i] {
            '.' => {
                let start = i + 1;
                i = start;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                match name.as_str() {
                    "" if i == chars.len() && start == 1 => {}
                    "" => return Err(error(format!("{text:?}: an empty field name"))),
                    "*" => steps.push(Step::All),
                    _ => steps.push(Step::Field(name)),
                }
            }
            '[' => {
                let close = chars[i..]
                    .iter()
                    .position(|c| *c == ']')
                    .map(|p| p + i)
                    .ok_or_else(|| error(format!("{text:?}: '[' without ']'")))?;
                let inner: String = chars[i + 1..close].iter().collect();
                let inner = inner.trim();
                let quoted = inner
                    .strip_prefix('\'')
                    .and_then(|q| q.strip_suffix('\''))
                    .or_else(|| inner.strip_prefix('"').and_then(|q| q.strip_suffix('"')));
                steps.push(match (inner, quoted) {
                    ("*", _) => Step::All,
                    (_, Some(key)) => Step::Field(key.to_string()),
                    _ => Step::Index(inner.parse().map_err(|_| {
                        error(format!("{text:?}: [{inner}] is not an index, '*' or a quoted key"))
                    })?),
                });
                i = close + 1;
            }
            other => return Err(error(format!("{text:?}: unexpected {other:?}"))),
        }
    }
    Ok(steps)
}

/// The values `steps` reaches from `value`, in order.
fn select<'a>(value: &'a Value, steps: &[Step]) -> Vec<&'a Value> {
    let Some((step, rest)) = steps.split_first() else { return vec![value] };
    let next: Vec<&Value> = match (step, value) {
        (Step::Field(name), Value::Object(map)) => map.get(name).into_iter().collect(),
        (Step::Index(i), Value::Array(items)) => {
            let len = i64::try_from(items.len()).unwrap_or(i64::MAX);
            let at = if *i < 0 { len + i } else { *i };
            usize::try_from(at).ok().and_then(|at| items.get(at)).into_iter().collect()
        }
        (Step::All, Value::Array(items)) => items.iter().collect(),
        (Step::All, Value::Object(map)) => map.values().collect(),
        _ => Vec::new(),
    };
    next.into_iter().flat_map(|v| select(v, rest)).collect()
}

/// How a value prints: strings bare, anything else as JSON.
pub fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn unescape(literal: &str) -> String {
    let mut out = String::new();
    let mut chars = literal.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

impl Template {
    /// Parses a kubectl-style JSONPath template.
    pub fn parse(template: &str) -> Result<Template, TemplateError> {
        let mut stack: Vec<(Vec<Step>, Vec<Node>)> = Vec::new();
        let mut nodes = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                nodes.push(Node::Text(rest.to_string()));
                break;
            };
            if open > 0 {
                nodes.push(Node::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            // A quoted literal may hold '}'.
            let inner_end = if after.trim_start().starts_with('"') {
                let start = after.find('"').unwrap_or(0) + 1;
                let mut escaped = false;
                let close = after[start..].char_indices().find(|(_, c)| {
                    let end = !escaped && *c == '"';
                    escaped = !escaped && *c == '\\';
                    end
                });
                let close = close.map(|(i, _)| start + i).ok_or_else(|| {
                    error(format!("{template:?}: a quoted literal without its closing quote"))
                })?;
                after[close..].find('}').map(|i| close + i)
            } else {
                after.find('}')
            };
            let close =
                inner_end.ok_or_else(|| error(format!("{template:?}: '{{' without '}}'")))?;
            let inner = after[..close].trim();
            rest = &after[close + 1..];
            if let Some(path) = inner.strip_prefix("range ") {
                stack.push((parse_path(path)?, std::mem::take(&mut nodes)));
            } else if inner == "end" {
                let (path, outer) = stack
                    .pop()
                    .ok_or_else(|| error(format!("{template:?}: {{end}} without {{range}}")))?;
                let body = std::mem::replace(&mut nodes, outer);
                nodes.push(Node::Range(path, body));
            } else if let Some(literal) = inner.strip_prefix('"').and_then(|l| l.strip_suffix('"'))
            {
                nodes.push(Node::Text(unescape(literal)));
            } else {
                nodes.push(Node::Path(parse_path(inner)?));
            }
        }
        if !stack.is_empty() {
            return Err(error(format!("{template:?}: {{range}} without {{end}}")));
        }
        Ok(Template { nodes })
    }

    /// The template's text for `value`.
    pub fn render(&self, value: &Value) -> String {
        let mut out = String::new();
        render(&self.nodes, value, &mut out);
        out
    }
}

fn render(nodes: &[Node], value: &Value, out: &mut String) {
    for node in nodes {
        match node {
            Node::Text(text) => out.push_str(text),
            Node::Path(steps) => {
                let values: Vec<String> = select(value, steps).into_iter().map(text).collect();
                out.push_str(&values.join(" "));
            }
            Node::Range(steps, body) => {
                for item in select(value, steps) {
                    render(body, item, out);
                }
            }
        }
    }
}

impl Path {
    /// Parses `.metadata.name` or `{.metadata.name}`.
    pub fn parse(text: &str) -> Result<Path, TemplateError> {
        parse_path(text).map(|steps| Path(steps, text.to_string()))
    }

    /// The values the path reaches in `value`.
    pub fn select<'a>(&self, value: &'a Value) -> Vec<&'a Value> {
        select(value, &self.0)
    }
}

/// `-o custom-columns=HEADER:PATH,...`: the headers and their paths.
pub fn custom_columns(spec: &str) -> Result<Vec<(String, Path)>, TemplateError> {
    spec.split(',')
        .map(|column| {
            let (header, path) = column.split_once(':').ok_or_else(|| {
                error(format!("custom column {column:?} is not HEADER:.field.path"))
            })?;
            if header.trim().is_empty() {
                return Err(error(format!("custom column {column:?} has no header")));
            }
            Ok((header.trim().to_string(), Path::parse(path)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list() -> Value {
        json!({"kind": "GatewayList", "items": [
            {"metadata": {"name": "a", "labels": {"team": "x", "gantry.dev/tier": "1"}}, "spec": {"replicas": 2}},
            {"metadata": {"name": "b"}, "spec": {"replicas": 3}},
        ]})
    }

    #[test]
    fn the_kubectl_template_subset() {
        let render = |t: &str| Template::parse(t).unwrap().render(&list());
        assert_eq!(render("{.items[*].metadata.name}"), "a b");
        assert_eq!(render("{.items[0].spec.replicas}"), "2");
        assert_eq!(render("{.items[-1].metadata.name}"), "b");
        assert_eq!(render("{$.kind}"), "GatewayList");
        assert_eq!(
            render(r#"{range .items[*]}{.metadata.name}{"\t"}{.spec.replicas}{"\n"}{end}"#),
            "a\t2\nb\t3\n"
        );
        assert_eq!(render("{.items[0].metadata.labels['gantry.dev/tier']}"), "1");
        assert_eq!(render("name={.items[1].metadata.name}!"), "name=b!");
        assert_eq!(
            render("{.items[5].metadata.name}{.nothing.here}"),
            "",
            "missing prints nothing"
        );
        assert_eq!(render("{.items[0].metadata.labels}"), r#"{"gantry.dev/tier":"1","team":"x"}"#);
        assert_eq!(render(r#"{"}"}"#), "}");
        for bad in ["{.items", "{range .items[*]}", "{end}", "{.items[x]}", "{metadata}", "{..a}"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn custom_columns_name_their_paths() {
        let columns = custom_columns("NAME:.metadata.name,R:{.spec.replicas}").unwrap();
        let item = &list()["items"][0];
        let cells: Vec<String> =
            columns.iter().map(|(_, p)| p.select(item).into_iter().map(text).collect()).collect();
        assert_eq!(columns.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(), ["NAME", "R"]);
        assert_eq!(cells, ["a", "2"]);
        assert!(custom_columns("NAME").is_err());
        assert!(custom_columns(":.a").is_err());
    }
}

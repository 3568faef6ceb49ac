//! Arguments as every command takes them: gateway names (`NAME` or
//! `gateway/NAME`), label changes, wait conditions, `create`'s flags.

use crate::errors::CtlError;
use gantry_client::manifest::{self, GatewayDoc, Metadata, Route, Spec};

/// One argument of `label`: `key=value` or `key-`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelChange {
    Set(String, String),
    Remove(String),
}

impl std::str::FromStr for LabelChange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match (s.split_once('='), s.strip_suffix('-')) {
            (Some((key, value)), _) if !key.is_empty() => {
                Ok(LabelChange::Set(key.to_string(), value.to_string()))
            }
            (None, Some(key)) if !key.is_empty() => Ok(LabelChange::Remove(key.to_string())),
            _ => Err(format!("{s:?} is neither key=value (set) nor key- (remove)")),
        }
    }
}

/// The resource types a name may be prefixed with, as kubectl takes
/// `TYPE/NAME`: `get -o name` prints `gateway/NAME`.
pub const RESOURCE_TYPES: [&str; 3] = ["gateway", "gateways", "gw"];

/// Kubernetes resource words a kubectl hand may type where gatewayctl
/// takes gateways: refused with a clear error instead of taken as names.
const OTHER_RESOURCES: [&str; 22] = [
    "pod",
    "pods",
    "po",
    "deployment",
    "deployments",
    "deploy",
    "service",
    "services",
    "svc",
    "configmap",
    "configmaps",
    "cm",
    "secret",
    "secrets",
    "ingress",
    "ingresses",
    "ing",
    "namespace",
    "namespaces",
    "ns",
    "node",
    "nodes",
];

/// Verbs whose first positional argument may be a resource word, as in
/// kubectl (`get gateways`, `delete gateway gw-5`, `describe gw edge`).
const NAMING_VERBS: [&str; 12] = [
    "get", "describe", "edit", "label", "annotate", "scale", "patch", "delete", "wait", "retry",
    "watch", "create",
];

/// Drops a leading resource word (`gateway`, `gateways`, `gw`) of a verb's
/// positional arguments, as kubectl reads `VERB TYPE NAME...`: the first
/// positional word is the type, so `delete gateway gw-5` deletes only
/// gw-5 (a gateway named "gateway" is `gateway/gateway`, or the second
/// word of `delete gateway gateway`). Another Kubernetes resource word is
/// refused. `takes_value(verb, flag)` says whether a flag consumes the
/// next argument.
pub fn strip_resource_word(
    args: Vec<String>,
    takes_value: impl Fn(&str, &str) -> bool,
) -> Result<Vec<String>, String> {
    // The verb: the first word that is neither a global flag nor its value.
    let mut verb_at = 1;
    while verb_at < args.len() && args[verb_at].starts_with('-') {
        let flag = args[verb_at].trim_start_matches('-');
        let skips_next = !flag.contains('=') && takes_value("", flag);
        verb_at += if skips_next { 2 } else { 1 };
    }
    if verb_at >= args.len() {
        return Ok(args);
    }
    let verb = args[verb_at].clone();
    if !NAMING_VERBS.contains(&verb.as_str()) {
        return Ok(args);
    }
    let mut i = verb_at + 1;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            return Ok(args);
        }
        if let Some(flag) = arg.strip_prefix('-') {
            let skips_next = !arg.contains('=') && takes_value(&verb, flag.trim_start_matches('-'));
            i += if skips_next { 2 } else { 1 };
            continue;
        }
        if RESOURCE_TYPES.contains(&arg.as_str()) {
            let mut args = args;
            args.remove(i);
            return Ok(args);
        }
        if OTHER_RESOURCES.contains(&arg.as_str()) {
            return Err(format!(
                "{arg:?} is a Kubernetes resource; gatewayctl manages gateways only (use kubectl for {arg})"
            ));
        }
        return Ok(args);
    }
    Ok(args)
}

/// A gateway's name as every command takes it: `NAME` or `gateway/NAME`.
pub fn gateway_name(arg: &str) -> Result<String, String> {
    match arg.split_once('/') {
        None if !arg.is_empty() => Ok(arg.to_string()),
        None => Err("a gateway name is required".into()),
        Some((kind, name)) if RESOURCE_TYPES.contains(&kind) && !name.is_empty() => {
            Ok(name.to_string())
        }
        Some((kind, _)) if RESOURCE_TYPES.contains(&kind) => {
            Err(format!("{arg:?} names no gateway: write gateway/NAME"))
        }
        Some((kind, _)) => Err(format!(
            "unknown resource type {kind:?} in {arg:?}: gatewayctl manages gateways (NAME or gateway/NAME)"
        )),
    }
}

/// What `wait --for` waits for.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// `condition=<Type>`: the condition is True for the current generation.
    Named(String),
    /// `converged`: observed_generation == generation.
    Converged,
    /// `delete`: the gateway is gone.
    Deleted,
    /// `jsonpath={.path}=value` (the field has that value) or
    /// `jsonpath={.path}` (the field is there), on the gateway as
    /// `get -o json` prints it.
    JsonPath { path: crate::template::Path, value: Option<String>, text: String },
}

impl Condition {
    /// Whether the printed gateway `doc` meets a `jsonpath=` condition.
    pub fn json_path_met(
        path: &crate::template::Path,
        value: Option<&str>,
        doc: &serde_json::Value,
    ) -> bool {
        let found = path.select(doc);
        match value {
            None => found.iter().any(|v| !v.is_null()),
            Some(wanted) => found.iter().any(|v| crate::template::text(v) == wanted),
        }
    }
}

/// `{.a.b}=value`, `{.a.b}`, `.a.b=value` or `.a.b`: the path and the value.
fn json_path_condition(spec: &str) -> Result<Condition, String> {
    let (path, value) = match spec.strip_prefix('{') {
        Some(rest) => {
            let close = rest.find('}').ok_or_else(|| format!("{spec:?}: no closing }}"))?;
            let after = &rest[close + 1..];
            let value = match after.strip_prefix('=') {
                Some(v) => Some(v.to_string()),
                None if after.is_empty() => None,
                None => return Err(format!("{spec:?}: expected =VALUE after the path")),
            };
            (&spec[..close + 2], value)
        }
        None => match spec.split_once('=') {
            Some((path, value)) => (path, Some(value.to_string())),
            None => (spec, None),
        },
    };
    let parsed = crate::template::Path::parse(path).map_err(|e| e.to_string())?;
    Ok(Condition::JsonPath { path: parsed, value, text: spec.to_string() })
}

impl std::str::FromStr for Condition {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "converged" => Ok(Condition::Converged),
            "delete" => Ok(Condition::Deleted),
            other => match (other.strip_prefix("condition="), other.strip_prefix("jsonpath=")) {
                (Some(kind), _) if !kind.is_empty() => Ok(Condition::Named(kind.into())),
                (_, Some(spec)) if !spec.is_empty() => json_path_condition(spec),
                _ => Err(format!(
                    "unknown condition {other:?}: use condition=Ready, converged, delete or jsonpath='{{.status.phase}}'=RUNNING"
                )),
            },
        }
    }
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Condition::Named(k) => write!(f, "condition={k}"),
            Condition::Converged => f.write_str("converged"),
            Condition::Deleted => f.write_str("delete"),
            Condition::JsonPath { text, .. } => write!(f, "jsonpath={text}"),
        }
    }
}

/// The flags of `create`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CreateFlags {
    /// Name of the new gateway (NAME or gateway/NAME).
    #[arg(value_parser = gateway_name)]
    pub name: String,
    /// Container image of the gateway.
    #[arg(long)]
    pub image: String,
    /// Number of pods (the store's default when absent).
    #[arg(long)]
    pub replicas: Option<i32>,
    /// Image of the supervisor sidecar (the reconciler's default when absent).
    #[arg(long)]
    pub supervisor_image: Option<String>,
    /// Host name of the gateway's route (no route when absent).
    #[arg(long)]
    pub route_host: Option<String>,
    /// Secret holding the route's TLS certificate.
    #[arg(long)]
    pub tls_secret: Option<String>,
    /// A label, key=value (repeatable).
    #[arg(long = "label", short = 'l')]
    pub labels: Vec<String>,
}

/// The gateway `create` makes of its flags.
pub fn create_doc(flags: CreateFlags) -> Result<GatewayDoc, CtlError> {
    let labels = flags
        .labels
        .iter()
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| CtlError::Message(format!("label {l:?} is not key=value")))
        })
        .collect::<Result<_, _>>()?;
    Ok(GatewayDoc {
        api_version: manifest::API_VERSION.into(),
        kind: manifest::KIND.into(),
        metadata: Metadata { name: flags.name, labels, ..Default::default() },
        spec: Spec {
            image: flags.image,
            replicas: flags.replicas,
            supervisor_image: flags.supervisor_image.unwrap_or_default(),
            route: flags
                .route_host
                .map(|host| Route { host, tls_secret_name: flags.tls_secret.unwrap_or_default() }),
            ..Default::default()
        },
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(line: &str) -> Result<String, String> {
        let args = line.split(' ').map(str::to_string).collect();
        let takes_value =
            |_: &str, flag: &str| matches!(flag, "o" | "output" | "l" | "selector" | "server");
        strip_resource_word(args, takes_value).map(|a| a.join(" "))
    }

    #[test]
    fn a_leading_resource_word_is_the_type_as_in_kubectl() {
        for (typed, meant) in [
            ("gatewayctl delete gateway gw-5", "gatewayctl delete gw-5"),
            ("gatewayctl get gateways", "gatewayctl get"),
            ("gatewayctl get -o json gw edge", "gatewayctl get -o json edge"),
            ("gatewayctl --server x get gateway edge", "gatewayctl --server x get edge"),
            ("gatewayctl describe gw edge", "gatewayctl describe edge"),
            ("gatewayctl delete gateway gateway", "gatewayctl delete gateway"),
            ("gatewayctl get edge gateway", "gatewayctl get edge gateway"),
            ("gatewayctl delete gateway/gw-5", "gatewayctl delete gateway/gw-5"),
            ("gatewayctl apply -f gateway", "gatewayctl apply -f gateway"),
            ("gatewayctl get -l=gateway", "gatewayctl get -l=gateway"),
        ] {
            assert_eq!(strip(typed).as_deref(), Ok(meant), "{typed}");
        }
        let refused = strip("gatewayctl get pods").unwrap_err();
        assert!(refused.contains("gateways only"), "{refused}");
    }

    #[test]
    fn wait_takes_kubectls_jsonpath_conditions() {
        let doc = serde_json::json!({"status": {"phase": "RUNNING", "observedGeneration": 2}});
        for (spec, met) in [
            ("jsonpath={.status.phase}=RUNNING", true),
            ("jsonpath=.status.phase=RUNNING", true),
            ("jsonpath={.status.phase}=FAILED", false),
            ("jsonpath={.status.observedGeneration}=2", true),
            ("jsonpath={.status.phase}", true),
            ("jsonpath={.status.routeAddress}", false),
        ] {
            let Ok(Condition::JsonPath { path, value, .. }) = spec.parse::<Condition>() else {
                panic!("{spec} does not parse");
            };
            assert_eq!(Condition::json_path_met(&path, value.as_deref(), &doc), met, "{spec}");
        }
        for bad in ["jsonpath=", "jsonpath={.status.phase", "jsonpath={.a}x"] {
            assert!(bad.parse::<Condition>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_name_is_taken_bare_or_as_kubectl_prints_it() {
        for arg in ["edge", "gateway/edge", "gateways/edge", "gw/edge"] {
            assert_eq!(gateway_name(arg).as_deref(), Ok("edge"), "{arg}");
        }
        for arg in ["", "gateway/", "pod/edge", "gantry.dev/edge"] {
            let refused = gateway_name(arg).unwrap_err();
            assert!(refused.to_lowercase().contains("name"), "{arg}: {refused}");
        }
        assert!(gateway_name("pod/edge").unwrap_err().contains("gateway/NAME"));
    }
}

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// `condition=<Type>`: the condition is True for the current generation.
    Named(String),
    /// `converged`: observed_generation == generation.
    Converged,
    /// `delete`: the gateway is gone.
    Deleted,
}

impl std::str::FromStr for Condition {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "converged" => Ok(Condition::Converged),
            "delete" => Ok(Condition::Deleted),
            other => match other.strip_prefix("condition=") {
                Some(kind) if !kind.is_empty() => Ok(Condition::Named(kind.into())),
                _ => Err(format!(
                    "unknown condition {other:?}: use condition=Ready, converged or delete"
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

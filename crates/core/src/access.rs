//! Roles, what each may do, and the update-mask paths each owns (rule 5).
//!
//! | role       | read | create, delete | spec, labels, annotations | status, finalizers |
//! |------------|------|----------------|---------------------------|--------------------|
//! | viewer     | yes  | no             | no                        | no                 |
//! | editor     | yes  | yes            | yes                       | no                 |
//! | reconciler | yes  | no             | no                        | yes                |
//! | admin      | yes  | yes            | yes                       | yes                |

use std::fmt;
use std::str::FromStr;

use crate::error::RuleError;

/// The role a bearer token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Viewer,
    Editor,
    Reconciler,
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Editor, Role::Reconciler, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Reconciler => "reconciler",
            Role::Admin => "admin",
        }
    }

    /// The role with what both `self` and `other` may do, and no more (the
    /// table above: editor and reconciler together are admin).
    pub fn join(self, other: Role) -> Role {
        match (self, other) {
            (a, b) if a == b => a,
            (Role::Viewer, r) | (r, Role::Viewer) => r,
            _ => Role::Admin,
        }
    }

    /// Whether this role may create and delete gateways.
    pub fn may_create_and_delete(self) -> bool {
        matches!(self, Role::Editor | Role::Admin)
    }

    /// Whether this role may write the field at `path`.
    pub fn owns(self, path: FieldPath) -> bool {
        match path {
            FieldPath::Spec
            | FieldPath::SpecField(_)
            | FieldPath::Labels
            | FieldPath::Annotations => {
                matches!(self, Role::Editor | Role::Admin)
            }
            FieldPath::Status | FieldPath::StatusField(_) | FieldPath::Finalizers => {
                matches!(self, Role::Reconciler | Role::Admin)
            }
        }
    }

    /// `Ok` when the role may create or delete, else PERMISSION_DENIED.
    pub fn check_create_and_delete(self) -> Result<(), RuleError> {
        if self.may_create_and_delete() {
            Ok(())
        } else {
            Err(RuleError::permission_denied(
                "gateway",
                format!(
                    "role {self} may not create or delete gateways; use an editor or admin token"
                ),
            ))
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role {s:?}; one of viewer, editor, reconciler, admin"))
    }
}

/// Fields of `GatewaySpec` an update mask may name as `spec.<field>`.
pub const SPEC_FIELDS: [&str; 9] = [
    "image",
    "supervisor_image",
    "replicas",
    "route",
    "server_dns_names",
    "oidc",
    "credential_driver",
    "config",
    "resources",
];

/// Fields of `GatewayStatus` an update mask may name as `status.<field>`.
pub const STATUS_FIELDS: [&str; 10] = [
    "phase",
    "observed_generation",
    "conditions",
    "provisioning",
    "route_address",
    "applied_fingerprint",
    "failure_count",
    "next_retry_time",
    "message",
    "failed_inputs",
];

/// One writable path of an update mask (AIP-161).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldPath {
    Spec,
    SpecField(&'static str),
    Labels,
    Annotations,
    Finalizers,
    Status,
    StatusField(&'static str),
}

impl FieldPath {
    /// Parses one mask path.
    pub fn parse(path: &str) -> Option<FieldPath> {
        match path {
            "spec" => Some(FieldPath::Spec),
            "status" => Some(FieldPath::Status),
            "metadata.labels" => Some(FieldPath::Labels),
            "metadata.annotations" => Some(FieldPath::Annotations),
            "metadata.finalizers" => Some(FieldPath::Finalizers),
            _ => {
                if let Some(field) = path.strip_prefix("spec.") {
                    SPEC_FIELDS.iter().find(|f| **f == field).map(|f| FieldPath::SpecField(f))
                } else if let Some(field) = path.strip_prefix("status.") {
                    STATUS_FIELDS.iter().find(|f| **f == field).map(|f| FieldPath::StatusField(f))
                } else {
                    None
                }
            }
        }
    }

    /// Whether this path writes (part of) the spec.
    pub fn is_spec(self) -> bool {
        matches!(self, FieldPath::Spec | FieldPath::SpecField(_))
    }

    /// Whether this path writes `status.<field>`, directly or through `status`.
    pub fn covers_status_field(self, field: &str) -> bool {
        match self {
            FieldPath::Status => true,
            FieldPath::StatusField(f) => f == field,
            _ => false,
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldPath::Spec => f.write_str("spec"),
            FieldPath::SpecField(x) => write!(f, "spec.{x}"),
            FieldPath::Labels => f.write_str("metadata.labels"),
            FieldPath::Annotations => f.write_str("metadata.annotations"),
            FieldPath::Finalizers => f.write_str("metadata.finalizers"),
            FieldPath::Status => f.write_str("status"),
            FieldPath::StatusField(x) => write!(f, "status.{x}"),
        }
    }
}

/// Parses an update mask and checks that `role` owns every path. An empty
/// mask is rejected: updates name what they change, so a writer never
/// replaces fields it does not own.
pub fn parse_update_mask(paths: &[String], role: Role) -> Result<Vec<FieldPath>, RuleError> {
    if paths.is_empty() {
        return Err(RuleError::invalid(
            "update_mask",
            "required: name the fields to update, e.g. paths [\"spec\"] or [\"status\"]",
        ));
    }
    let mut parsed = Vec::with_capacity(paths.len());
    for (i, path) in paths.iter().enumerate() {
        let Some(field) = FieldPath::parse(path) else {
            return Err(RuleError::invalid(
                format!("update_mask.paths[{i}]"),
                format!(
                    "unknown path {path:?}; one of spec, spec.<field>, metadata.labels, metadata.annotations, metadata.finalizers, status, status.<field>"
                ),
            ));
        };
        if !role.owns(field) {
            let owner =
                if field.is_spec() || matches!(field, FieldPath::Labels | FieldPath::Annotations) {
                    "editor"
                } else {
                    "reconciler"
                };
            return Err(RuleError::permission_denied(
                format!("gateway.{field}"),
                format!("role {role} may not write {field}; it is written by the {owner} role"),
            ));
        }
        if !parsed.contains(&field) {
            parsed.push(field);
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_may_do_exactly_what_either_role_may() {
        let may = |r: Role| {
            [r.may_create_and_delete(), r.owns(FieldPath::Spec), r.owns(FieldPath::Status)]
        };
        for a in Role::ALL {
            for b in Role::ALL {
                let either: Vec<bool> = may(a).iter().zip(may(b)).map(|(x, y)| *x || y).collect();
                assert_eq!(may(a.join(b)).to_vec(), either, "{a} join {b} = {}", a.join(b));
            }
        }
    }

    fn paths(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ownership_per_role() {
        let client = paths(&["spec", "spec.image", "metadata.labels", "metadata.annotations"]);
        let reconciler = paths(&["status", "status.observed_generation", "metadata.finalizers"]);
        for role in Role::ALL {
            let client_ok = matches!(role, Role::Editor | Role::Admin);
            let reconciler_ok = matches!(role, Role::Reconciler | Role::Admin);
            assert_eq!(parse_update_mask(&client, role).is_ok(), client_ok, "{role}");
            assert_eq!(parse_update_mask(&reconciler, role).is_ok(), reconciler_ok, "{role}");
        }
    }

    #[test]
    fn denied_path_is_named() {
        let err = parse_update_mask(&paths(&["spec", "status.phase"]), Role::Editor).unwrap_err();
        assert!(
            matches!(err, RuleError::PermissionDenied { ref field, .. } if field == "gateway.status.phase")
        );
    }

    #[test]
    fn empty_and_unknown_paths_are_invalid() {
        let err = parse_update_mask(&[], Role::Admin).unwrap_err();
        assert_eq!(err.field(), Some("update_mask"));
        let err = parse_update_mask(&paths(&["spec", "metadata.name"]), Role::Admin).unwrap_err();
        assert_eq!(err.field(), Some("update_mask.paths[1]"));
        assert!(parse_update_mask(&paths(&["spec.route.host"]), Role::Admin).is_err());
    }

    #[test]
    fn roles_parse() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert!("root".parse::<Role>().is_err());
    }
}

//! Role bindings: which users, groups and service accounts get which role,
//! in the shape of Kubernetes RBAC subjects.
//!
//! ```yaml
//! bindings:
//!   - role: reconciler
//!     subjects:
//!       - {kind: ServiceAccount, namespace: gantry, name: gateway-reconciler}
//!   - role: editor
//!     subjects:
//!       - {kind: Group, name: platform-team}
//!       - {kind: User, name: alice@example.com}
//! ```
//!
//! An identity gets the join of every role bound to it or to one of its
//! groups (editor and reconciler together are admin); none is PERMISSION
//! DENIED, never viewer.

use gantry_core::Role;
use serde::Deserialize;

use super::Identity;

/// A bindings file that does not parse or names something unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("role bindings file: {0}")]
pub struct BindingsFileError(pub String);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    bindings: Vec<RawBinding>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBinding {
    role: String,
    subjects: Vec<RawSubject>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubject {
    kind: String,
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

/// Who a binding names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    User(String),
    Group(String),
}

/// The bindings in force.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    bindings: Vec<(Role, Vec<Subject>)>,
}

impl Bindings {
    /// Parses a bindings file (YAML or JSON).
    pub fn parse(text: &str) -> Result<Self, BindingsFileError> {
        let file: File =
            serde_saphyr::from_str(text).map_err(|e| BindingsFileError(e.to_string()))?;
        let mut bindings = Vec::new();
        for (i, raw) in file.bindings.into_iter().enumerate() {
            let at = |reason: String| BindingsFileError(format!("bindings[{i}]: {reason}"));
            let role: Role = raw.role.parse().map_err(at)?;
            let mut subjects = Vec::new();
            for (j, s) in raw.subjects.into_iter().enumerate() {
                let at = |reason: &str| at(format!("subjects[{j}]: {reason}"));
                if s.name.is_empty() {
                    return Err(at("name is empty"));
                }
                subjects.push(match (s.kind.as_str(), s.namespace) {
                    ("User", None) => Subject::User(s.name),
                    ("Group", None) => Subject::Group(s.name),
                    ("ServiceAccount", Some(ns)) if !ns.is_empty() => {
                        Subject::User(format!("system:serviceaccount:{ns}:{}", s.name))
                    }
                    ("ServiceAccount", _) => return Err(at("a ServiceAccount needs a namespace")),
                    ("User" | "Group", Some(_)) => {
                        return Err(at("only a ServiceAccount has a namespace"))
                    }
                    (other, _) => {
                        return Err(at(&format!(
                            "kind {other:?} is not User, Group or ServiceAccount"
                        )))
                    }
                });
            }
            bindings.push((role, subjects));
        }
        Ok(Self { bindings })
    }

    /// The role `identity` has, if any binding names it or its groups.
    pub fn role_of(&self, identity: &Identity) -> Option<Role> {
        let names = |subject: &Subject| match subject {
            Subject::User(user) => *user == identity.user,
            Subject::Group(group) => identity.groups.iter().any(|g| g == group),
        };
        self.bindings
            .iter()
            .filter(|(_, subjects)| subjects.iter().any(names))
            .map(|(role, _)| *role)
            .reduce(Role::join)
    }

    /// How many bindings there are (for the reload log).
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "bindings:\n  - role: reconciler\n    subjects:\n      - {kind: ServiceAccount, namespace: gantry, name: gateway-reconciler}\n  - role: editor\n    subjects:\n      - {kind: Group, name: platform-team}\n      - {kind: User, name: alice}\n  - role: viewer\n    subjects:\n      - {kind: Group, name: system:authenticated}\n";

    fn identity(user: &str, groups: &[&str]) -> Identity {
        Identity {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            authenticator: "test",
        }
    }

    #[test]
    fn users_groups_and_service_accounts_get_the_join_of_their_roles() {
        let b = Bindings::parse(FILE).unwrap();
        let sa =
            identity("system:serviceaccount:gantry:gateway-reconciler", &["system:authenticated"]);
        assert_eq!(b.role_of(&sa), Some(Role::Reconciler));
        assert_eq!(b.role_of(&identity("alice", &[])), Some(Role::Editor));
        assert_eq!(b.role_of(&identity("bob", &["platform-team"])), Some(Role::Editor));
        assert_eq!(b.role_of(&identity("carol", &["system:authenticated"])), Some(Role::Viewer));
        // Another namespace's account of the same name is someone else.
        let other = identity("system:serviceaccount:other:gateway-reconciler", &[]);
        assert_eq!(b.role_of(&other), None);
        assert_eq!(b.role_of(&identity("mallory", &["platform"])), None);
        // Editor and reconciler together are admin.
        let both = identity("system:serviceaccount:gantry:gateway-reconciler", &["platform-team"]);
        assert_eq!(b.role_of(&both), Some(Role::Admin));
    }

    #[test]
    fn a_bad_file_names_the_binding_and_subject() {
        let cases = [
            ("bindings:\n  - role: root\n    subjects: []\n", "bindings[0]"),
            ("bindings:\n  - role: viewer\n    subjects:\n      - {kind: ServiceAccount, name: x}\n", "subjects[0]: a ServiceAccount needs a namespace"),
            ("bindings:\n  - role: viewer\n    subjects:\n      - {kind: Robot, name: x}\n", "Robot"),
            ("bindings:\n  - role: viewer\n    subjects:\n      - {kind: User, name: ''}\n", "name is empty"),
            ("bindigns: []\n", "bindigns"),
        ];
        for (text, wanted) in cases {
            let error = Bindings::parse(text).unwrap_err().to_string();
            assert!(error.contains(wanted), "{text:?}: {error}");
        }
    }
}

//! The resource types the fake serves, with what discovery says of them.

/// One served resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    /// Has a `/status` subresource (status is written only through it).
    pub status_subresource: bool,
    pub short_names: &'static [&'static str],
}

impl ResourceType {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether objects of this type carry a spec whose changes bump
    /// `metadata.generation`.
    pub fn has_generation(&self) -> bool {
        !matches!(
            self.kind,
            "ConfigMap"
                | "Secret"
                | "ServiceAccount"
                | "Namespace"
                | "Lease"
                | "Role"
                | "RoleBinding"
                | "ClusterRole"
                | "ClusterRoleBinding"
        )
    }
}

/// Table row constructor, so the table below reads as one line per type.
#[allow(clippy::too_many_arguments)]
const fn rt(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    status_subresource: bool,
    short_names: &'static [&'static str],
) -> ResourceType {
    ResourceType {
        group,
        version,
        kind,
        plural,
        singular,
        namespaced,
        status_subresource,
        short_names,
    }
}

/// Every type the fake serves.
pub const RESOURCES: &[ResourceType] = &[
    rt("", "v1", "Namespace", "namespaces", "namespace", false, true, &["ns"]),
    rt("", "v1", "ServiceAccount", "serviceaccounts", "serviceaccount", true, false, &["sa"]),
    rt("", "v1", "ConfigMap", "configmaps", "configmap", true, false, &["cm"]),
    rt("", "v1", "Secret", "secrets", "secret", true, false, &[]),
    rt("", "v1", "Service", "services", "service", true, true, &["svc"]),
    rt(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        true,
        true,
        &["pvc"],
    ),
    rt("apps", "v1", "Deployment", "deployments", "deployment", true, true, &["deploy"]),
    rt("networking.k8s.io", "v1", "Ingress", "ingresses", "ingress", true, true, &["ing"]),
    rt(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        "networkpolicy",
        true,
        false,
        &["netpol"],
    ),
    rt(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        true,
        true,
        &["pdb"],
    ),
    rt("coordination.k8s.io", "v1", "Lease", "leases", "lease", true, false, &[]),
    rt("rbac.authorization.k8s.io", "v1", "Role", "roles", "role", true, false, &[]),
    rt(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        false,
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        false,
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        false,
        &[],
    ),
];

/// The type served at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The type of `apiVersion` + `kind`.
pub fn find_kind(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    RESOURCES.iter().find(|r| r.api_version() == api_version && r.kind == kind)
}

/// The groups, in discovery order, with their single version.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !groups.contains(&(r.group, r.version)) {
            groups.push((r.group, r.version));
        }
    }
    groups
}

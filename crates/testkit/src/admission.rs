//! Admission policies of the API server itself (ValidatingAdmissionPolicy,
//! MutatingAdmissionPolicy: CEL, no webhook server), bound to one test
//! namespace: what a cluster's admission control does to gantry's writes.
//! Removed when dropped. The server enforces a policy a moment after it is
//! stored: a test waits for that with a probe of its own.

use serde_json::{json, Value};

use crate::cluster::ClusterRig;
use crate::k8s::ControlPlane;

/// A policy and its binding to a rig's namespace.
#[derive(Debug)]
pub struct Policy {
    plane: &'static ControlPlane,
    kind: &'static str,
    name: String,
}

/// `resourceRules` matching `operations` on `resources` of `group`/v1.
pub fn rules(group: &str, resources: &str, operations: &[&str]) -> Value {
    json!([{"apiGroups": [group], "apiVersions": ["v1"], "operations": operations, "resources": [resources]}])
}

impl Policy {
    /// Refuses the requests `rules` match for which `expression` (CEL, on
    /// `request`, `object`, `oldObject`) is false, with `message`.
    pub fn deny(
        rig: &ClusterRig,
        label: &str,
        rules: Value,
        expression: &str,
        message: &str,
    ) -> Policy {
        let spec = json!({
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "validations": [{"expression": expression, "message": message}],
        });
        Self::install(
            rig,
            "ValidatingAdmissionPolicy",
            label,
            spec,
            json!({"validationActions": ["Deny"]}),
        )
    }

    /// Patches what `rules` match with the JSON patch `expression` (CEL
    /// returning `JSONPatch` values).
    pub fn mutate(rig: &ClusterRig, label: &str, rules: Value, expression: &str) -> Policy {
        let spec = json!({
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {"resourceRules": rules},
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}],
        });
        Self::install(rig, "MutatingAdmissionPolicy", label, spec, json!({}))
    }

    fn install(
        rig: &ClusterRig,
        kind: &'static str,
        label: &str,
        spec: Value,
        binding: Value,
    ) -> Policy {
        let name = format!("{label}-{}", rig.namespace);
        let mut binding_spec = binding;
        binding_spec["policyName"] = json!(name);
        binding_spec["matchResources"] = json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": rig.namespace}}});
        let list = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": name}, "spec": spec},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": format!("{kind}Binding"), "metadata": {"name": name}, "spec": binding_spec},
        ]});
        rig.plane.kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
        Policy { plane: rig.plane, kind, name }
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        let kind = self.kind.to_ascii_lowercase();
        let policy = format!("{kind}/{}", self.name);
        let binding = format!("{kind}binding/{}", self.name);
        let _ = self.plane.kubectl_output(&["delete", &policy, &binding, "--ignore-not-found"]);
    }
}

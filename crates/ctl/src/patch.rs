//! `patch`: a JSON merge patch (RFC 7386) or a JSON patch (RFC 6902) of
//! a gateway's manifest, written back as an update of the parts it
//! changed, conditional on the version it was applied to.

use gantry_api::v1::Gateway;
use gantry_client::manifest::GatewayDoc;
use serde_json::Value;
use tonic::Code;

use crate::ctl::{dry_run_note, Ctl};
use crate::errors::{msg, CtlError};

/// The patch formats `--type` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PatchType {
    /// JSON merge patch (RFC 7386): objects merge, `null` removes a key.
    Merge,
    /// JSON patch (RFC 6902): a list of add, remove, replace, move, copy
    /// and test operations.
    Json,
}

/// The parts of a gateway a patch may change, and their update paths.
const WRITABLE: [(&str, &str); 3] = [
    ("/spec", "spec"),
    ("/metadata/labels", "metadata.labels"),
    ("/metadata/annotations", "metadata.annotations"),
];

/// `doc` with `patch` applied.
pub fn apply(doc: &Value, kind: PatchType, patch: &str) -> Result<Value, String> {
    let patch: Value =
        serde_json::from_str(patch).map_err(|e| format!("the patch is not JSON: {e}"))?;
    let mut patched = doc.clone();
    match kind {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err("a merge patch is a JSON object".into());
            }
            json_patch::merge(&mut patched, &patch);
        }
        PatchType::Json => {
            let operations: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| format!("not a JSON patch (a list of operations): {e}"))?;
            json_patch::patch(&mut patched, &operations).map_err(|e| e.to_string())?;
        }
    }
    Ok(patched)
}

/// The update paths of what changed from `before` to `after`; a change
/// anywhere else (status, uid, versions, the name) is refused.
pub fn changed_paths(before: &Value, after: &Value) -> Result<Vec<&'static str>, String> {
    let mut rest = (before.clone(), after.clone());
    let mut paths = Vec::new();
    for (pointer, path) in WRITABLE {
        let (a, b) = (before.pointer(pointer), after.pointer(pointer));
        if a != b {
            paths.push(path);
        }
        for side in [&mut rest.0, &mut rest.1] {
            if let Some(part) = side.pointer_mut(pointer) {
                *part = Value::Null;
            }
        }
    }
    if rest.0 != rest.1 {
        return Err("the patch changes more than spec, metadata.labels and metadata.annotations \
             (status, versions and times are the store's and the reconciler's)"
            .into());
    }
    Ok(paths)
}

impl Ctl {
    /// `patch`: applies `patch` to the gateway as read and writes back
    /// what it changed, conditional on that read; when someone else wrote
    /// in between, the patch is applied again to a fresh read (a few
    /// times), so it always lands on the current gateway.
    pub async fn patch(
        &self,
        name: &str,
        kind: PatchType,
        patch: &str,
        dry_run: bool,
    ) -> Result<String, CtlError> {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            let current = self.get(name).await?;
            let version = current.metadata.as_ref().map_or(0, |m| m.resource_version);
            let before = to_value(&GatewayDoc::from_proto(&current))?;
            let after = apply(&before, kind, patch).map_err(msg)?;
            let paths = changed_paths(&before, &after).map_err(msg)?;
            if paths.is_empty() {
                return Ok(format!("gateway/{name} patched (no change)"));
            }
            let doc: GatewayDoc = serde_json::from_value(after)
                .map_err(|e| msg(format!("the patched gateway is not valid: {e}")))?;
            let mut update: Gateway = doc.to_proto();
            update.metadata.get_or_insert_with(Default::default).resource_version = version;
            match self.write_paths(update, &paths, dry_run).await {
                Ok(_) => return Ok(format!("gateway/{name} patched{}", dry_run_note(dry_run))),
                Err(status) if status.code() == Code::Aborted && attempt < ATTEMPTS => continue,
                Err(status) => return Err(self.fail(status)),
            }
        }
        Err(msg(format!("gateway/{name} kept changing under the patch; try again")))
    }
}

fn to_value(doc: &GatewayDoc) -> Result<Value, CtlError> {
    serde_json::to_value(doc).map_err(|e| msg(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> Value {
        json!({"apiVersion": "gantry.dev/v1", "kind": "Gateway",
            "metadata": {"name": "edge", "resourceVersion": 4, "labels": {"team": "a"}},
            "spec": {"image": "x:1", "replicas": 2, "config": {"a": "1"}},
            "status": {"phase": "RUNNING"}})
    }

    #[test]
    fn merge_and_json_patches_change_the_parts_they_name() {
        let merged =
            apply(&doc(), PatchType::Merge, r#"{"spec":{"image":"x:2","config":{"a":null}}}"#)
                .unwrap();
        assert_eq!(merged["spec"], json!({"image": "x:2", "replicas": 2, "config": {}}));
        assert_eq!(changed_paths(&doc(), &merged).unwrap(), ["spec"]);
        let ops = r#"[{"op":"test","path":"/spec/replicas","value":2},
            {"op":"replace","path":"/spec/replicas","value":3},
            {"op":"add","path":"/metadata/labels/tier","value":"gold"}]"#;
        let patched = apply(&doc(), PatchType::Json, ops).unwrap();
        assert_eq!(patched["spec"]["replicas"], 3);
        assert_eq!(changed_paths(&doc(), &patched).unwrap(), ["spec", "metadata.labels"]);
        let failed = r#"[{"op":"test","path":"/spec/replicas","value":9}]"#;
        assert!(apply(&doc(), PatchType::Json, failed).is_err());
    }

    #[test]
    fn what_the_store_owns_cannot_be_patched() {
        for patch in [r#"{"status":{"phase":"FAILED"}}"#, r#"{"metadata":{"name":"other"}}"#] {
            let patched = apply(&doc(), PatchType::Merge, patch).unwrap();
            assert!(changed_paths(&doc(), &patched).is_err(), "{patch}");
        }
        assert!(apply(&doc(), PatchType::Merge, "[1]").is_err());
        assert!(apply(&doc(), PatchType::Json, "{}").is_err());
        assert!(apply(&doc(), PatchType::Merge, "not json").is_err());
    }
}

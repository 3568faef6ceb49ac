//! What the API server sets on every write, whoever sends it: the type
//! checked and named, the status kept or replaced as the scope says, the
//! server's own metadata (identity, timestamps, namespace) and the
//! generation. Pure functions over the JSON.

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::ssa::Scope;
use crate::util::now_rfc3339;

/// Sets the fields the server owns on a write: identity, timestamps,
/// generation, and keeps what the scope may not change.
pub(crate) fn prepare(
    rt: &ResourceType,
    namespace: &str,
    old: Option<&Value>,
    new: &mut Value,
    scope: Scope,
) -> Result<(), ApiError> {
    check_type(rt, new)?;
    keep_status(old, new, scope);
    server_metadata(rt, namespace, old, new)?;
    set_generation(rt, old, new);
    Ok(())
}

/// An object of `rt` (a body may leave apiVersion and kind out).
fn check_type(rt: &ResourceType, new: &mut Value) -> Result<(), ApiError> {
    if !new.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    if let Some(api_version) = new.get("apiVersion").and_then(Value::as_str) {
        if api_version != rt.api_version() {
            return Err(ApiError::bad_request(format!(
                "apiVersion {api_version} does not match {}",
                rt.api_version()
            )));
        }
    }
    if let Some(kind) = new.get("kind").and_then(Value::as_str) {
        if kind != rt.kind {
            return Err(ApiError::bad_request(format!("kind {kind} does not match {}", rt.kind)));
        }
    }
    new["apiVersion"] = json!(rt.api_version());
    new["kind"] = json!(rt.kind);
    if !new.get("metadata").is_some_and(Value::is_object) {
        new["metadata"] = json!({});
    }
    Ok(())
}

/// The main resource keeps the old status; the status subresource keeps
/// everything else.
fn keep_status(old: Option<&Value>, new: &mut Value, scope: Scope) {
    let remove_status = |new: &mut Value| {
        if let Some(map) = new.as_object_mut() {
            map.remove("status");
        }
    };
    match (old, scope) {
        (Some(old), Scope::Main) => match old.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => remove_status(new),
        },
        (Some(old), Scope::Status) => {
            let status = new.get("status").cloned();
            *new = old.clone();
            match status {
                Some(s) => new["status"] = s,
                None => remove_status(new),
            }
        }
        (None, Scope::Main) => remove_status(new),
        _ => {}
    }
}

/// Identity and timestamps kept from the old object (new ones on a
/// create), the namespace of the path, no managedFields or selfLink.
fn server_metadata(
    rt: &ResourceType,
    namespace: &str,
    old: Option<&Value>,
    new: &mut Value,
) -> Result<(), ApiError> {
    let meta = new["metadata"]
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
    meta.remove("managedFields");
    meta.remove("selfLink");
    if rt.namespaced {
        meta.insert("namespace".into(), json!(namespace));
    } else {
        meta.remove("namespace");
    }
    let keep = |field: &str| old.and_then(|o| o["metadata"].get(field)).cloned();
    for field in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"] {
        match keep(field) {
            Some(v) => {
                meta.insert(field.into(), v);
            }
            None => {
                meta.remove(field);
            }
        }
    }
    if old.is_none() {
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    }
    Ok(())
}

/// 1 on create, + 1 when the spec changed (for Deployments, the
/// annotations too), for kinds that have a generation.
fn set_generation(rt: &ResourceType, old: Option<&Value>, new: &mut Value) {
    if rt.has_generation() {
        let old_generation = old.and_then(|o| o["metadata"]["generation"].as_i64());
        // Deployments also count annotation changes (the API server's
        // deployment strategy; the rollback annotation once lived there).
        let spec_changed = old.is_some_and(|o| {
            o.get("spec") != new.get("spec")
                || (rt.kind == "Deployment"
                    && o["metadata"].get("annotations") != new["metadata"].get("annotations"))
        });
        let generation = match old_generation {
            None => 1,
            Some(g) if spec_changed => g + 1,
            Some(g) => g,
        };
        new["metadata"]["generation"] = json!(generation);
    } else if let Some(meta) = new["metadata"].as_object_mut() {
        meta.remove("generation");
    }
}

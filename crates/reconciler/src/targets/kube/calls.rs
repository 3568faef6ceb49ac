//! Calls to the API server: each bounded by the call timeout
//! (`--call-timeout`, [`CALL_TIMEOUT`] by default), errors described for
//! status, only a genuine NotFound taken as absent.

use std::time::Duration;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use serde_json::Value;

use crate::render::FIELD_MANAGER;
use crate::targets::TargetError;

/// Longest any single call to the cluster may take, by default.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

pub(super) fn api_resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = match kind {
        "Ingress" => "ingresses".to_string(),
        other => format!("{}s", other.to_ascii_lowercase()),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural)
}

pub(super) fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

/// The error of a call that failed with `e`.
pub(super) fn call_error(what: &str, e: &kube::Error) -> TargetError {
    let reason = match e {
        kube::Error::Api(status) => status.reason.clone(),
        _ => String::new(),
    };
    TargetError::Call { what: what.into(), message: describe(e), reason }
}

pub(super) async fn bounded<T>(
    timeout: Duration,
    what: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, TargetError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(call_error(what, &e)),
        Err(_) => Err(TargetError::Timeout { what: what.into(), after: timeout }),
    }
}

pub(super) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Deletes one owned object (background propagation); already gone is fine.
pub(super) async fn delete_object(
    timeout: Duration,
    api: &Api<DynamicObject>,
    what: &str,
    name: &str,
) -> Result<(), TargetError> {
    let call = async {
        match api.delete(name, &DeleteParams::background()).await {
            Err(e) if is_not_found(&e) => Ok(()),
            other => other.map(|_| ()),
        }
    };
    bounded(timeout, what, call).await
}

/// Whether the API server refused a change to a field that cannot change
/// once set (such as a Deployment's `spec.selector`).
pub(super) fn is_immutable_change(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422 && s.message.contains("field is immutable"))
}

/// Server-side applies `manifest` (forced: the object is ours, checked
/// before); the API server's error as it came, for the caller to judge.
pub(super) async fn apply_object(
    timeout: Duration,
    api: &Api<DynamicObject>,
    kind: &str,
    name: &str,
    manifest: &Value,
) -> Result<Result<DynamicObject, kube::Error>, TargetError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    tokio::time::timeout(timeout, api.patch(name, &params, &Patch::Apply(manifest)))
        .await
        .map_err(|_| TargetError::Timeout { what: format!("apply {kind} {name}"), after: timeout })
}

/// The path of the immutable field a refusal names (`spec.selector` in
/// `Deployment.apps "edge" is invalid: spec.selector: Invalid value: ...:
/// field is immutable`), or "a field" when it names none.
pub(super) fn immutable_field(message: &str) -> String {
    let after = message.split_once("is invalid: ").map_or(message, |(_, rest)| rest);
    after
        .split_once(": ")
        .map(|(field, _)| field.trim())
        .filter(|f| !f.is_empty() && !f.contains(' '))
        .map_or_else(|| "a field".to_string(), str::to_string)
}

/// The refusal for an object in the way.
pub(super) fn not_ours(kind: &str, name: &str) -> TargetError {
    TargetError::NotOurs { kind: kind.into(), name: name.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_its_immutable_field() {
        let message = "Deployment.apps \"edge\" is invalid: spec.selector: Invalid value: {\"matchLabels\":{}}: field is immutable";
        assert_eq!(immutable_field(message), "spec.selector");
        assert_eq!(immutable_field("field is immutable"), "a field");
    }

    #[test]
    fn only_a_refused_immutable_change_counts_as_one() {
        let refusal = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status { code, message: message.into(), ..Default::default() }.boxed(),
            )
        };
        assert!(is_immutable_change(&refusal(
            422,
            "Deployment.apps \"edge\" is invalid: spec.selector: Invalid value: {}: field is immutable"
        )));
        assert!(!is_immutable_change(&refusal(422, "spec.replicas: Invalid value: -1")));
        assert!(!is_immutable_change(&refusal(409, "field is immutable")));
    }
}

//! The API server's validation of what gantry writes, where the
//! reconciler depends on it: containers' resource requests may not exceed
//! their limits, and a Deployment's selector cannot change. Written apart
//! from gantry's own validation, so that a mistake in one is not copied
//! into the other.

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::resources::ResourceType;

/// A quantity as a number (`250m`, `1.5Gi`, `1e3`); `None` if malformed.
fn quantity(text: &str) -> Option<f64> {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(end);
    let number: f64 = number.parse().ok()?;
    let binary = |power: i32| 1024f64.powi(power);
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * factor)
}

fn invalid(rt: &ResourceType, name: &str, field: &str, detail: String) -> ApiError {
    let kind =
        if rt.group.is_empty() { rt.kind.to_string() } else { format!("{}.{}", rt.kind, rt.group) };
    let mut e =
        ApiError::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {field}: {detail}"));
    e.details = Some(json!({
        "name": name, "group": rt.group, "kind": rt.kind,
        "causes": [{"reason": "FieldValueInvalid", "message": detail, "field": field}],
    }));
    e
}

/// Checks a new version of an object (`old` is the stored one, if any).
pub fn validate(rt: &ResourceType, old: Option<&Value>, new: &Value) -> Result<(), ApiError> {
    if rt.kind != "Deployment" {
        return Ok(());
    }
    let name = new["metadata"]["name"].as_str().unwrap_or("");
    if let Some(old) = old {
        if old["spec"]["selector"] != new["spec"]["selector"] {
            let detail = format!("Invalid value: {}: field is immutable", new["spec"]["selector"]);
            return Err(invalid(rt, name, "spec.selector", detail));
        }
    }
    let containers = new["spec"]["template"]["spec"]["containers"].as_array();
    for (i, container) in containers.into_iter().flatten().enumerate() {
        let resources = &container["resources"];
        for (resource, request) in resources["requests"].as_object().into_iter().flatten() {
            let Some(limit) = resources["limits"][resource].as_str() else { continue };
            let request_text = request.as_str().unwrap_or("");
            if let (Some(r), Some(l)) = (quantity(request_text), quantity(limit)) {
                if r > l {
                    let field = format!("spec.template.spec.containers[{i}].resources.requests");
                    let detail = format!(
                        "Invalid value: \"{request_text}\": must be less than or equal to {resource} limit of {limit}"
                    );
                    return Err(invalid(rt, name, &field, detail));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(quantity("250m"), Some(0.25));
        assert_eq!(quantity("1Gi"), Some(1024.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("2e3"), Some(2000.0));
        assert_eq!(quantity("lots"), None);
    }
}

//! Kubernetes protobuf request bodies of the kinds kubectl's imperative
//! `create` commands send (`create namespace`, `configmap`, `secret`,
//! `serviceaccount`), decoded into the JSON the rest of kube-fake works on.
//! Any other kind is refused with 415, as the real server refuses a media
//! type it cannot read.
//!
//! Wire form: the magic `k8s\0`, then a `runtime.Unknown` message whose
//! `raw` field holds the object's message (field numbers from
//! `k8s.io/api/core/v1/generated.proto` and
//! `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`).

use base64::Engine;
use serde_json::{json, Map, Value};

const MAGIC: &[u8] = b"k8s\0";

/// How one field of a message is read.
#[derive(Debug, Clone, Copy)]
enum Field {
    String,
    Bytes,
    Bool,
    Message(&'static [(u64, &'static str, Field)]),
    MapStrings,
    MapBytes,
    RepeatedStrings,
}

const OBJECT_META: &[(u64, &str, Field)] = &[
    (1, "name", Field::String),
    (2, "generateName", Field::String),
    (3, "namespace", Field::String),
    (11, "labels", Field::MapStrings),
    (12, "annotations", Field::MapStrings),
    (14, "finalizers", Field::RepeatedStrings),
];
const CONFIG_MAP: &[(u64, &str, Field)] = &[
    (1, "metadata", Field::Message(OBJECT_META)),
    (2, "data", Field::MapStrings),
    (3, "binaryData", Field::MapBytes),
    (4, "immutable", Field::Bool),
];
const SECRET: &[(u64, &str, Field)] = &[
    (1, "metadata", Field::Message(OBJECT_META)),
    (2, "data", Field::MapBytes),
    (3, "type", Field::String),
    (4, "stringData", Field::MapStrings),
    (5, "immutable", Field::Bool),
];
const NAMESPACE: &[(u64, &str, Field)] = &[
    (1, "metadata", Field::Message(OBJECT_META)),
    (2, "spec", Field::Message(&[(1, "finalizers", Field::RepeatedStrings)])),
];
const SERVICE_ACCOUNT: &[(u64, &str, Field)] = &[
    (1, "metadata", Field::Message(OBJECT_META)),
    (4, "automountServiceAccountToken", Field::Bool),
];
const TYPE_META: &[(u64, &str, Field)] =
    &[(1, "apiVersion", Field::String), (2, "kind", Field::String)];
const UNKNOWN: &[(u64, &str, Field)] = &[
    (1, "typeMeta", Field::Message(TYPE_META)),
    (2, "raw", Field::Bytes),
    (3, "contentEncoding", Field::String),
];

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.bytes.split_first().ok_or("truncated varint")?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint too long".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err("truncated field".into());
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// The next `(field number, value)`: varints as numbers, everything
    /// length-delimited as bytes; fixed-width values are skipped (`None`).
    fn next(&mut self) -> Result<Option<(u64, Wire<'a>)>, String> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let tag = self.varint()?;
        let wire = match tag & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Skipped
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|e| e.to_string())?;
                Wire::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Wire::Skipped
            }
            other => return Err(format!("unsupported wire type {other}")),
        };
        Ok(Some((tag >> 3, wire)))
    }
}

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Skipped,
}

fn text(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "a string field is not UTF-8".to_string())
}

fn map_entry(bytes: &[u8], binary: bool) -> Result<(String, Value), String> {
    let mut reader = Reader { bytes };
    let (mut key, mut value) = (String::new(), Value::String(String::new()));
    while let Some((number, wire)) = reader.next()? {
        if let Wire::Bytes(b) = wire {
            match number {
                1 => key = text(b)?,
                2 if binary => {
                    value = json!(base64::engine::general_purpose::STANDARD.encode(b));
                }
                2 => value = json!(text(b)?),
                _ => {}
            }
        }
    }
    Ok((key, value))
}

fn message(bytes: &[u8], fields: &[(u64, &str, Field)]) -> Result<Value, String> {
    let mut out = Map::new();
    let mut reader = Reader { bytes };
    while let Some((number, wire)) = reader.next()? {
        let Some((_, name, field)) = fields.iter().find(|(n, _, _)| *n == number) else {
            continue;
        };
        let name = name.to_string();
        match (field, wire) {
            (Field::String, Wire::Bytes(b)) => {
                out.insert(name, json!(text(b)?));
            }
            (Field::Bytes, Wire::Bytes(b)) => {
                out.insert(name, json!(base64::engine::general_purpose::STANDARD.encode(b)));
            }
            (Field::Bool, Wire::Varint(v)) => {
                out.insert(name, json!(v != 0));
            }
            (Field::Message(inner), Wire::Bytes(b)) => {
                out.insert(name, message(b, inner)?);
            }
            (Field::MapStrings | Field::MapBytes, Wire::Bytes(b)) => {
                let (k, v) = map_entry(b, matches!(field, Field::MapBytes))?;
                let map = out.entry(name).or_insert_with(|| json!({}));
                map[k] = v;
            }
            (Field::RepeatedStrings, Wire::Bytes(b)) => {
                let list = out.entry(name).or_insert_with(|| json!([]));
                if let Some(items) = list.as_array_mut() {
                    items.push(json!(text(b)?));
                }
            }
            _ => return Err(format!("field {number} has an unexpected wire type")),
        }
    }
    Ok(Value::Object(out))
}

/// The JSON object of a protobuf body, or why it cannot be read (the
/// caller answers 415).
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let envelope = body.strip_prefix(MAGIC).ok_or("the body lacks the k8s protobuf magic")?;
    let unknown = message(envelope, UNKNOWN)?;
    if unknown["contentEncoding"].as_str().is_some_and(|e| !e.is_empty()) {
        return Err("encoded protobuf bodies are not supported".into());
    }
    let api_version = unknown["typeMeta"]["apiVersion"].as_str().unwrap_or("");
    let kind = unknown["typeMeta"]["kind"].as_str().unwrap_or("");
    let fields = match (api_version, kind) {
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        _ => return Err(format!("protobuf bodies of {api_version} {kind} are not supported")),
    };
    let raw = unknown["raw"].as_str().unwrap_or("");
    let raw = base64::engine::general_purpose::STANDARD.decode(raw).map_err(|e| e.to_string())?;
    let mut object = message(&raw, fields)?;
    object["apiVersion"] = json!(api_version);
    object["kind"] = json!(kind);
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out =
            vec![u8::try_from(number << 3 | 2).unwrap(), u8::try_from(bytes.len()).unwrap()];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn a_config_map_from_kubectl_create() {
        let meta = field(1, b"cfg");
        let entry = [field(1, b"k"), field(2, b"v")].concat();
        let raw = [field(1, &meta), field(2, &entry)].concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"k": "v"}})
        );
        assert!(decode(b"not protobuf").is_err());
        let deployment =
            [MAGIC.to_vec(), field(1, &[field(1, b"apps/v1"), field(2, b"Deployment")].concat())]
                .concat();
        assert!(decode(&deployment).unwrap_err().contains("not supported"));
    }
}

//! One name rule everywhere: a new gateway's name is an RFC 1035 label (its
//! Service is named after it), reads accept RFC 1123 labels. The proto's
//! comment, the README and the store's rules say the same.

#![allow(clippy::unwrap_used)]

use gantry_core::validation::{validate_name, validate_new_name};

fn read(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap()
}

#[test]
fn a_new_name_is_an_rfc_1035_label_in_the_rules_the_proto_and_the_readme() {
    let refused = validate_new_name("gateway.metadata.name", "1edge").unwrap_err().to_string();
    assert!(refused.contains("RFC 1035"), "{refused}");
    assert!(validate_new_name("gateway.metadata.name", "edge-1").is_ok());
    assert!(validate_name("name", "1edge").is_ok(), "an older name can still be read");

    let proto = read("proto/gantry/v1/gateway.proto");
    let meta = &proto[proto.find("message ObjectMeta {").unwrap()..];
    let comment: String = meta[..meta.find("string name = 1;").unwrap()]
        .lines()
        .filter_map(|l| l.trim().strip_prefix("//"))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(comment.contains("RFC 1035 label"), "the proto says: {comment}");
    assert!(comment.contains("starting with a letter"), "the proto says: {comment}");

    let readme = read("README.md");
    assert!(readme.contains("name is an RFC 1035 label"), "the README's rule");
}

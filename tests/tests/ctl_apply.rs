//! `gatewayctl apply` as kubectl's client-side apply, and the list
//! documents `get` prints and `apply` reads back: the real binary against
//! a real gateway-store process.

#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::process::Stdio;

use gantry_testkit::ctl::{ctl_command, exits, ok, write, CtlStore};

const LAST_APPLIED: &str = "gantry.dev/last-applied-configuration";

fn manifest(labels: &str, config: &str) -> String {
    format!(
        "apiVersion: gantry.dev/v1\nkind: Gateway\nmetadata:\n  name: edge\n  labels: {{{labels}}}\n\
         spec:\n  image: ghcr.io/acme/gw:1\n  config: {{{config}}}\n"
    )
}

/// gatewayctl with `stdin` piped in.
fn ctl_stdin(store: &CtlStore, args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = ctl_command(&[&["--server", &store.server()], args].concat())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn apply_keeps_what_others_set_and_removes_what_the_file_dropped() {
    let store = CtlStore::start("ctl-apply-merge", &[]);
    let file = write(&store.dir, "edge.yaml", &manifest("team: a, tier: gold", "a: '1', b: '2'"));
    assert_eq!(ok(store.ctl(&["apply", "-f", &file])), "gateway/edge created\n");
    let created = store.gateway_json("edge");
    let record: serde_json::Value =
        serde_json::from_str(created["metadata"]["annotations"][LAST_APPLIED].as_str().unwrap())
            .unwrap();
    assert_eq!(record["metadata"]["labels"]["tier"], "gold", "{record}");
    assert!(record.get("status").is_none() && record["metadata"].get("uid").is_none());

    // A colleague labels it; then the file drops `tier` and `b`.
    ok(store.ctl(&["label", "edge", "owner=bob"]));
    std::fs::write(&file, manifest("team: a", "a: '1'")).unwrap();
    assert_eq!(ok(store.ctl(&["apply", "-f", &file])), "gateway/edge configured\n");
    let applied = store.gateway_json("edge");
    let labels = &applied["metadata"]["labels"];
    assert_eq!(labels, &serde_json::json!({"team": "a", "owner": "bob"}), "{applied}");
    assert_eq!(applied["spec"]["config"], serde_json::json!({"a": "1"}), "{applied}");
    assert_eq!(ok(store.ctl(&["apply", "-f", &file])), "gateway/edge unchanged\n");

    // A gateway made by `create` has no record: apply removes nothing.
    ok(store.ctl(&["create", "plain", "--image", "x:1", "-l", "keep=yes"]));
    let plain = write(
        &store.dir,
        "plain.yaml",
        "apiVersion: gantry.dev/v1\nkind: Gateway\nmetadata: {name: plain}\nspec: {image: 'x:2'}\n",
    );
    assert_eq!(ok(store.ctl(&["apply", "-f", &plain])), "gateway/plain configured\n");
    let plain = store.gateway_json("plain");
    assert_eq!(plain["metadata"]["labels"]["keep"], "yes", "{plain}");
    assert_eq!(plain["spec"]["image"], "x:2");
}

#[test]
fn a_resource_version_in_the_file_makes_apply_conditional() {
    let store = CtlStore::start("ctl-apply-pinned", &[]);
    let file = write(&store.dir, "edge.yaml", &manifest("team: a", "a: '1'"));
    ok(store.ctl(&["apply", "-f", &file]));
    let read = ok(store.ctl(&["get", "edge", "-o", "yaml"]));
    // Someone changes the gateway after it was read.
    ok(store.ctl(&["label", "edge", "owner=bob"]));
    let before = store.gateway_json("edge");
    let edited = read.replace("image: ghcr.io/acme/gw:1", "image: ghcr.io/acme/gw:2");
    let (_, stderr) = exits(1, ctl_stdin(&store, &["apply", "-f", "-"], &edited));
    assert!(
        stderr.contains("was changed since") && stderr.contains("--force-conflicts"),
        "{stderr}"
    );
    assert_eq!(store.gateway_json("edge"), before, "a refused apply changed the gateway");

    let forced = ctl_stdin(&store, &["apply", "-f", "-", "--force-conflicts"], &edited);
    assert_eq!(ok(forced), "gateway/edge configured\n");
    let after = store.gateway_json("edge");
    assert_eq!(after["spec"]["image"], "ghcr.io/acme/gw:2");
    assert_eq!(after["metadata"]["labels"]["owner"], "bob", "{after}");

    // A pinned file whose gateway is gone is not silently re-created.
    ok(store.ctl(&["delete", "edge", "--wait"]));
    let (_, stderr) = exits(1, ctl_stdin(&store, &["apply", "-f", "-"], &edited));
    assert!(stderr.contains("does not exist now"), "{stderr}");
}

#[test]
fn a_printed_list_applies_back_and_carries_its_revision() {
    let store = CtlStore::start("ctl-apply-list", &[]);
    let empty = ok(store.ctl(&["get", "-o", "yaml"]));
    let empty: serde_json::Value = serde_saphyr::from_str(&empty).unwrap();
    assert_eq!(empty["kind"], "GatewayList");
    assert_eq!(empty["items"], serde_json::json!([]), "{empty}");
    for name in ["one", "two"] {
        ok(store.ctl(&["create", name, "--image", "x:1"]));
    }
    let listed = ok(store.ctl(&["get", "-o", "json"]));
    let list: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let newest = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["metadata"]["resourceVersion"].as_i64().unwrap())
        .max()
        .unwrap();
    let revision = list["metadata"]["resourceVersion"].as_i64().unwrap();
    assert!(revision >= newest, "the list's revision {revision} is before its items ({newest})");
    assert!(list["items"][0]["metadata"]["updateTime"].is_string(), "{listed}");

    // get -o json | apply -f -, and the same as kubectl's List in YAML.
    let changed = listed.replace("\"x:1\"", "\"x:2\"");
    let out = ok(ctl_stdin(&store, &["apply", "-f", "-"], &changed));
    assert_eq!(out, "gateway/one configured\ngateway/two configured\n");
    let yaml = ok(store.ctl(&["get", "-o", "yaml"])).replace("GatewayList", "List");
    assert_eq!(
        ok(ctl_stdin(&store, &["apply", "-f", "-"], &yaml)),
        "gateway/one unchanged\ngateway/two unchanged\n"
    );

    // A broken document on stdin is named once.
    let (_, stderr) = exits(1, ctl_stdin(&store, &["apply", "-f", "-"], "kind: [\n"));
    assert!(stderr.starts_with("error: -: ") && !stderr.contains("-: -:"), "{stderr}");
}

//! The `gateway-store` binary as an operator runs it: refuses to start
//! without authentication, serves on embedded defaults, stops on SIGTERM.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use gantry_e2e::{binary, free_port, temp_dir, wait_for_http};

#[test]
fn refuses_to_start_without_tokens_and_says_what_to_do() {
    let dir = temp_dir("refuse");
    let out = Command::new(binary("gateway-store"))
        .args([
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .env_remove("GANTRY_ALLOW_UNAUTHENTICATED")
        .env_remove("GANTRY_TOKENS_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--tokens-file") && stderr.contains("--allow-unauthenticated"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn rejects_a_malformed_tokens_file_naming_the_line() {
    let dir = temp_dir("bad-tokens");
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, "# ok\nlong-enough-token-000001,alice,superuser\n").unwrap();
    let out = Command::new(binary("gateway-store"))
        .args([
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .env("GANTRY_TOKENS_FILE", &tokens)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2") && stderr.contains("superuser"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn serves_on_embedded_defaults_and_stops_on_sigterm() {
    let dir = temp_dir("serve");
    let (grpc, http) = (free_port(), free_port());
    let mut child = Command::new(binary("gateway-store"))
        .current_dir(&dir)
        .args(["--allow-unauthenticated", "--log-format", "json"])
        .env("GANTRY_STORE_LISTEN", format!("127.0.0.1:{grpc}"))
        .env("GANTRY_STORE_HTTP_LISTEN", format!("127.0.0.1:{http}"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = wait_for_http(http, "/readyz", Duration::from_secs(30));
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(dir.join("gantry-data/gantry.db").exists(), "SQLite file under the default data dir");

    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    let mut logs = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut logs).unwrap();
    let last = logs.lines().last().unwrap();
    let parsed: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    assert_eq!(parsed["message"], "gateway-store stopped");
    std::fs::remove_dir_all(dir).unwrap();
}

//! The `gateway-store` binary as an operator runs it: refuses to start
//! without authentication, serves on embedded defaults, stops on SIGTERM.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use gantry_testkit::{binary, eventually_some, free_port, temp_dir, wait_for_http};

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

/// Refusals are logged with who and where, but a client hammering with a
/// bad token cannot fill the disk: at most 10 lines a second, the rest
/// counted on the next line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_logged_with_the_peer_and_subject_and_rate_limited() {
    use gantry_api::v1::{CreateGatewayRequest, Gateway, GetGatewayRequest, ObjectMeta};
    let dir = temp_dir("refusals");
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, "viewer-token-0000000001,alice,viewer\n").unwrap();
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    let store = gantry_testkit::StoreProcess::start_with(
        &database,
        &dir,
        &["--tokens-file", tokens.to_str().unwrap(), "--log-format", "json"],
    );
    let client = |token: &str| {
        gantry_client::ClientConfig {
            endpoint: store.endpoint(),
            token: Some(token.into()),
            ..Default::default()
        }
        .connect_lazy()
        .unwrap()
    };
    let mut intruder = client("not-a-token-0000000000000");
    let started = std::time::Instant::now();
    for _ in 0..1_000 {
        let refused = intruder.get_gateway(GetGatewayRequest { name: "edge".into() }).await;
        assert_eq!(refused.unwrap_err().code(), tonic::Code::Unauthenticated);
    }
    let flood = started.elapsed();
    // A refusal in a later second carries the count of suppressed lines.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let denied = client("viewer-token-0000000001")
        .create_gateway(CreateGatewayRequest {
            gateway: Some(Gateway {
                metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
                ..Default::default()
            }),
            validate_only: false,
        })
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    let lines = eventually_some(Duration::from_secs(10), "the PERMISSION_DENIED logged", || {
        let lines: Vec<serde_json::Value> = store
            .logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["message"] == "request refused")
            .collect();
        std::future::ready(lines.iter().any(|l| l["subject"] == "alice").then_some(lines))
    })
    .await;
    let bound = 10 * (flood.as_secs() as usize + 2) + 1;
    assert!(lines.len() <= bound, "{} refusal lines for 1,001 refusals in {flood:?}", lines.len());
    assert!(lines.iter().all(|l| l["peer"].as_str().is_some_and(|p| p.starts_with("127.0.0.1:"))));
    let alice = lines.iter().find(|l| l["subject"] == "alice").unwrap();
    assert_eq!(alice["code"], "PermissionDenied");
    let suppressed: u64 = lines.iter().filter_map(|l| l["suppressed"].as_u64()).sum();
    assert_eq!(
        suppressed as usize + lines.len(),
        1_001,
        "every refusal is either a line or counted on a later one"
    );
    assert!(!store.logs().contains("not-a-token"), "a presented token was logged");
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
}

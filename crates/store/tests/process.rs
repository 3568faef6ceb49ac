//! The `gateway-store` binary as an operator runs it: refuses to start
//! without authentication, serves on embedded defaults, stops on SIGTERM.

#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gateway-store");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn temp_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gantry-process-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn refuses_to_start_without_tokens_and_says_what_to_do() {
    let dir = temp_dir();
    let out = Command::new(BIN)
        .args(["--data-dir", dir.join("refuse").to_str().unwrap(), "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .env_remove("GANTRY_ALLOW_UNAUTHENTICATED")
        .env_remove("GANTRY_TOKENS_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--tokens-file") && stderr.contains("--allow-unauthenticated"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn rejects_a_malformed_tokens_file_naming_the_line() {
    let dir = temp_dir();
    let tokens = dir.join("bad-tokens.csv");
    std::fs::write(&tokens, "# ok\nlong-enough-token-000001,alice,superuser\n").unwrap();
    let out = Command::new(BIN)
        .args(["--data-dir", dir.join("bad").to_str().unwrap(), "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .env("GANTRY_TOKENS_FILE", &tokens)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2") && stderr.contains("superuser"), "{stderr}");
}

#[test]
fn serves_on_embedded_defaults_and_stops_on_sigterm() {
    let dir = temp_dir().join("serve");
    let (grpc, http) = (free_port(), free_port());
    let mut child = Command::new(BIN)
        .current_dir(temp_dir())
        .args(["--allow-unauthenticated", "--log-format", "json"])
        .env("GANTRY_DATA_DIR", &dir)
        .env("GANTRY_STORE_LISTEN", format!("127.0.0.1:{grpc}"))
        .env("GANTRY_STORE_HTTP_LISTEN", format!("127.0.0.1:{http}"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let ready = loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", http)) {
            use std::io::{Read, Write};
            s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            break out;
        }
        assert!(Instant::now() < deadline, "store did not come up");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(dir.join("gantry.db").exists(), "SQLite file under the data dir");

    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    let mut logs = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut logs).unwrap();
    let last = logs.lines().last().unwrap();
    let parsed: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    assert_eq!(parsed["message"], "gateway-store stopped");
}

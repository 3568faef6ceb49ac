//! Helpers for end-to-end tests: locate (building if needed) the
//! workspace's binaries, pick free ports, and poll HTTP endpoints.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Path of a workspace binary, built once per test process with the same
/// cargo that runs the tests (cheap when it is already up to date).
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let status = Command::new(env!("CARGO"))
            .current_dir(workspace_root())
            .args(["build", "--quiet", "--bins"])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build --bins failed");
    });
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(label: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir =
        std::env::temp_dir().join(format!("gantry-e2e-{label}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// `GET path` on 127.0.0.1:port; the raw response, or `None` if nothing
/// listens.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Polls `GET path` until it answers, for at most `timeout`.
pub fn wait_for_http(port: u16, path: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(answer) = http_get(port, path) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "nothing answered on 127.0.0.1:{port}{path} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

//! gantry's testkit, shared by every crate's tests and the benchmarks:
//! locate (building if needed) the workspace's binaries and run them as
//! processes ([`StoreProcess`], [`ReconcilerProcess`]), temporary SQLite
//! and PostgreSQL databases ([`TestDatabase`]), a real Kubernetes control plane
//! ([`k8s`]), a [`Gateway`](gateway::GatewayBuilder) builder, bounded waits
//! on a condition ([`eventually`]), free ports and HTTP probes.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether this is a CI run, where a missing PostgreSQL or missing
/// Kubernetes binaries fail the tests instead of skipping them: `CI` set to
/// anything but empty, `false` or `0`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Says that a test skipped, on the real stderr: libtest captures
/// `eprintln!` of passing tests, so that line would never be seen.
pub fn skipped(reason: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {reason}");
}

/// Path of a workspace binary, built once per test process with the same
/// cargo that runs the tests (cheap when it is already up to date).
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        // Cargo sets CARGO_MANIFEST_DIR and friends for the test process;
        // some build scripts track them, so passing them on would rebuild
        // half the dependency tree. Hand the inner cargo a clean slate.
        let mut cargo = Command::new(env!("CARGO"));
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy().into_owned();
            let set_for_tests = [
                "CARGO_MANIFEST_",
                "CARGO_PKG_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_PRIMARY_",
                "CARGO_TARGET_TMPDIR",
            ];
            if set_for_tests.iter().any(|p| key.starts_with(p)) {
                cargo.env_remove(&key);
            }
        }
        // The same targets `cargo test --workspace` builds, so the feature
        // set matches and nothing is rebuilt when the suite runs as a whole.
        let status = cargo
            .current_dir(workspace_root())
            .args(["build", "--quiet", "--workspace", "--all-targets"])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build failed");
    });
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// SIGKILLs `child` after `limit` whatever happens, so that a process a
/// test reads from (a watch) can never hang the suite.
pub fn kill_after(child: &Child, limit: Duration) {
    let pid = child.id().to_string();
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    });
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

/// `GET path` on 127.0.0.1:port from async code; the raw response.
pub async fn fetch(port: u16, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// Polls `GET path` until it answers 200, for at most `timeout`.
pub fn wait_ready(port: u16, path: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if http_get(port, path).is_some_and(|answer| answer.starts_with("HTTP/1.1 200")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "127.0.0.1:{port}{path} was not ready within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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

/// A test CA and a server certificate it signed, for DNS `names` and the
/// IP addresses `ips`: `(CA, certificate, key)` in PEM.
pub fn server_certificate(
    common_name: &str,
    names: &[&str],
    ips: &[[u8; 4]],
) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "gantry-test-ca");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("server key");
    let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let mut params = CertificateParams::new(names).expect("server params");
    for ip in ips {
        params.subject_alt_names.push(SanType::IpAddress((*ip).into()));
    }
    params.distinguished_name.push(DnType::CommonName, common_name);
    let server = params.signed_by(&server_key, &issuer).expect("server certificate");
    (ca.pem(), server.pem(), server_key.serialize_pem())
}

pub mod calls;
pub mod db;
pub mod gateway;
pub mod k8s;
pub mod linearizability;
pub mod process;
mod services;
pub mod wait;

pub use calls::Gateways;
pub use db::{Backend, TestDatabase};
pub use process::Process;
pub use services::{ReconcilerProcess, StoreProcess};
pub use wait::{eventually, eventually_blocking, eventually_some};

/// Replays the history from the first revision up to `until` and returns
/// its revisions, checking that each event is a creation (the crash and
/// fault tests only create) and that none takes over 30 s to arrive.
pub async fn replay_creations(client: &mut gantry_client::GatewayClient, until: i64) -> Vec<i64> {
    use gantry_api::v1::{EventType, WatchGatewaysRequest};
    use tokio_stream::StreamExt;
    let mut stream = client
        .watch_gateways(WatchGatewaysRequest { resource_version: 1, ..Default::default() })
        .await
        .expect("watch from the first revision")
        .into_inner();
    let mut revisions = Vec::new();
    while revisions.last().is_none_or(|r| *r < until) {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("the next event within 30 s")
            .expect("the watch stays open")
            .expect("a watch event");
        assert_eq!(event.r#type(), EventType::Added);
        revisions.push(event.resource_version);
    }
    revisions
}

/// Polls the store until `done` holds for gateway `name`, for at most
/// `patience`; otherwise panics with its last status and `explain()` (for
/// example the reconciler's logs).
pub async fn wait_for_gateway(
    client: &gantry_client::GatewayClient,
    name: &str,
    what: &str,
    patience: Duration,
    done: impl Fn(&gantry_api::v1::Gateway) -> bool,
    explain: impl Fn() -> String,
) -> gantry_api::v1::Gateway {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let request = gantry_api::v1::GetGatewayRequest { name: name.into() };
        let gateway = client.clone().get_gateway(request).await.expect("get the gateway");
        let gateway = gateway.into_inner();
        if done(&gateway) {
            return gateway;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never became {what}: {:?}\n{}",
            gateway.status,
            explain()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

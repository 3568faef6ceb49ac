//! The machine a test runs on: the workspace and its binaries (built once
//! per test process), CI or not, free ports, scratch directories.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::Duration;

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

//! The machine a test runs on: the workspace and its binaries (built once
//! per test process), CI or not, free ports, scratch directories.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock};
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

/// Removes from `command` the variables cargo sets for a test process:
/// some build scripts track them, so an inner cargo (or a script that runs
/// one) that saw them would rebuild half the dependency tree.
pub fn without_test_cargo_env(command: &mut Command) {
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
            command.env_remove(&key);
        }
    }
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
        without_test_cargo_env(&mut cargo);
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

/// A port nothing listens on right now, and that this test process has
/// not handed out before.
///
/// Taken below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port the kernel picks for
/// `bind(0)` can be given again to the next outgoing connection (a client,
/// a watch) before the process meant to listen on it starts, and then
/// that process fails with "Address already in use". Outgoing connections
/// never take a port below the range.
pub fn free_port() -> u16 {
    use std::collections::hash_map::RandomState;
    use std::hash::BuildHasher as _;
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let (low, high) = (10_000, ephemeral_start().saturating_sub(1));
    if high <= low + 1_000 {
        return kernel_port();
    }
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..1_000 {
        let random = RandomState::new().hash_one(handed_out.len());
        let port = low + u16::try_from(random % u64::from(high - low)).unwrap_or(0);
        if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    kernel_port()
}

/// The first port of the kernel's ephemeral range (32768 when unknown).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A port the kernel picks.
fn kernel_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Replaces a file the way Secret mounts and the kubelet's projected
/// tokens change: a new file renamed over it (a reader sees the old or the
/// new contents, never a half-written file).
pub fn replace_file(path: &std::path::Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).expect("write the new file");
    std::fs::rename(&tmp, path).expect("rename it over the old one");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_below_the_ephemeral_range_bindable_and_never_handed_out_twice() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice");
        for port in ports {
            assert!(port < ephemeral_start(), "{port} is in the ephemeral range");
            TcpListener::bind(("127.0.0.1", port)).expect("bindable");
        }
    }
}

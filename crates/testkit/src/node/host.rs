//! What a real node changes on this machine, recorded before it starts
//! and put back when it stops: iptables, network namespaces, sysctls, the
//! kubelet's cgroups, mounts and the host directories it writes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::BRIDGE;

/// Sysctls the kubelet and the bridge plugin change.
pub(super) const SYSCTLS: [&str; 4] =
    ["vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops", "net.ipv4.ip_forward"];
/// Host directories the node writes whatever its own directory.
pub(super) const HOST_DIRS: [&str; 4] =
    ["/var/lib/kubelet", "/var/log/pods", "/var/lib/cni", "/run/containerd"];

/// The host as it was before the node started.
#[derive(Debug, Default)]
pub(super) struct HostState {
    iptables: Option<String>,
    ip6tables: Option<String>,
    netns: Vec<String>,
    sysctls: Vec<(String, String)>,
    absent_dirs: Vec<String>,
    /// The kubelet's cgroups (`kubepods`) that did not exist.
    absent_cgroups: Vec<PathBuf>,
}

pub(super) fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"))
}

pub(super) fn run_ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl HostState {
    pub(super) fn record() -> HostState {
        let save = |program: &str| {
            let out = run(program, &[]);
            out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        };
        HostState {
            iptables: save("iptables-save"),
            ip6tables: save("ip6tables-save"),
            netns: netns(),
            sysctls: SYSCTLS
                .iter()
                .map(|k| (k.to_string(), run_ok("sysctl", &["-n", k]).trim().to_string()))
                .collect(),
            absent_dirs: HOST_DIRS
                .iter()
                .filter(|d| !Path::new(d).exists())
                .map(|d| d.to_string())
                .collect(),
            absent_cgroups: kubepods().into_iter().filter(|c| !c.exists()).collect(),
        }
    }

    /// Puts back what the node changed.
    pub(super) fn restore(&self) {
        for cgroup in &self.absent_cgroups {
            remove_cgroup(cgroup);
        }
        for ns in netns().into_iter().filter(|ns| !self.netns.contains(ns)) {
            let _ = run("ip", &["netns", "delete", &ns]);
        }
        let _ = run("ip", &["link", "delete", BRIDGE]);
        for (program, saved) in
            [("iptables-restore", &self.iptables), ("ip6tables-restore", &self.ip6tables)]
        {
            if let Some(saved) = saved {
                let mut restore =
                    Command::new(program).stdin(Stdio::piped()).spawn().expect(program);
                use std::io::Write as _;
                let _ = restore.stdin.take().expect("stdin").write_all(saved.as_bytes());
                let _ = restore.wait();
            }
        }
        for (key, value) in &self.sysctls {
            let _ = run("sysctl", &["-q", "-w", &format!("{key}={value}")]);
        }
        for dir in &self.absent_dirs {
            unmount_under(Path::new(dir));
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The kubelet's cgroup (`kubepods`) under every v1 controller.
pub(super) fn kubepods() -> Vec<PathBuf> {
    let controllers = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten();
    controllers.map(|c| c.path().join("kubepods")).collect()
}

/// Every process in `cgroup` and under it.
pub(super) fn cgroup_processes(cgroup: &Path, into: &mut Vec<String>) {
    let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
    into.extend(procs.lines().map(str::to_string));
    for child in std::fs::read_dir(cgroup).into_iter().flatten().flatten() {
        if child.path().is_dir() {
            cgroup_processes(&child.path(), into);
        }
    }
}

/// Kills what runs in `cgroup` (containers outlive their shims) and
/// removes it, deepest first.
fn remove_cgroup(cgroup: &Path) {
    if !cgroup.exists() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut pids = Vec::new();
        cgroup_processes(cgroup, &mut pids);
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        let _ = Command::new("kill").arg("-9").args(&pids).stderr(Stdio::null()).status();
        std::thread::sleep(Duration::from_millis(100));
    }
    fn remove(dir: &Path) {
        for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if child.path().is_dir() {
                remove(&child.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    remove(cgroup);
}

fn netns() -> Vec<String> {
    let out = run("ip", &["netns", "list"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Unmounts everything mounted under `dir`, deepest first.
pub(super) fn unmount_under(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = dir.display().to_string();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = run("umount", &["-l", point]);
    }
}

//! `--pin SERVER:LOAD`: the server under test on the CPUs `SERVER` and
//! this process (the load generator) on the CPUs `LOAD`, the same way for
//! etcd and for gantry. Unpinned, on a small machine, the server and the
//! clients take CPU from each other and a faster client shows up as a
//! slower server; pinned, each side's CPU seconds are its own.
//!
//! The server under test is gateway-store and, on `--backend postgres`,
//! the local PostgreSQL server's processes (etcd keeps its data itself;
//! gantry's is in PostgreSQL), pinned for the run and given back their
//! CPUs after it. CPU lists are `taskset`'s (`0`, `0-1`, `0,2`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use anyhow::Context as _;

/// Which CPUs the server under test and the load generator run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pin {
    pub server: String,
    pub load: String,
}

impl FromStr for Pin {
    type Err = String;

    fn from_str(s: &str) -> Result<Pin, String> {
        let valid = |cpus: &str| {
            !cpus.is_empty() && cpus.chars().all(|c| c.is_ascii_digit() || c == ',' || c == '-')
        };
        match s.split_once(':') {
            Some((server, load)) if valid(server) && valid(load) => {
                Ok(Pin { server: server.into(), load: load.into() })
            }
            _ => Err(format!("{s:?}: expected SERVER_CPUS:LOAD_CPUS, e.g. 0:1")),
        }
    }
}

/// `program args` as run on `cpus` (through `taskset`, which execs it:
/// the child's pid is the program's).
pub fn command(cpus: Option<&str>, program: &Path, args: Vec<String>) -> (PathBuf, Vec<String>) {
    match cpus {
        None => (program.to_path_buf(), args),
        Some(cpus) => {
            let mut wrapped = vec!["-c".to_string(), cpus.to_string()];
            wrapped.push(program.display().to_string());
            wrapped.extend(args);
            (PathBuf::from("taskset"), wrapped)
        }
    }
}

/// Sets the CPUs of every thread of process `pid`; its CPU list before.
fn set_cpus(pid: u32, cpus: &str) -> anyhow::Result<String> {
    let before = Command::new("taskset").args(["-c", "-p", &pid.to_string()]).output();
    let before = before.context("run taskset (util-linux)")?;
    let before = String::from_utf8_lossy(&before.stdout);
    // "pid 42's current affinity list: 0,1"
    let before = before.rsplit(':').next().unwrap_or("").trim().to_string();
    let status = Command::new("taskset")
        .args(["-a", "-c", "-p", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .context("run taskset (util-linux)")?;
    anyhow::ensure!(status.success(), "taskset -a -c -p {cpus} {pid} failed");
    Ok(before)
}

/// Puts this process (the load generator, every thread) on the load CPUs.
pub fn pin_self(pin: &Pin) -> anyhow::Result<()> {
    set_cpus(std::process::id(), &pin.load)?;
    eprintln!("pinned: server under test on CPUs {}, load generator on {}", pin.server, pin.load);
    Ok(())
}

/// Processes whose command name is `name`.
fn pids_named(name: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .collect()
}

/// CPU seconds of every process named `name`, with those of their
/// children that have exited and been waited for (a PostgreSQL backend
/// that ended during a run counts in the postmaster's).
pub fn cpu_seconds_named(name: &str) -> f64 {
    pids_named(name)
        .iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
            // utime, stime, cutime, cstime (fields 14–17 of proc(5)).
            let ticks: u64 = fields.get(11..15)?.iter().filter_map(|f| f.parse::<u64>().ok()).sum();
            Some(ticks as f64 / 100.0)
        })
        .sum()
}

/// The local PostgreSQL server's processes on the server CPUs until
/// dropped; new backends inherit the postmaster's CPUs.
pub struct PinnedPostgres {
    before: Vec<(u32, String)>,
}

impl PinnedPostgres {
    pub fn pin(cpus: &str) -> anyhow::Result<PinnedPostgres> {
        let pids = pids_named("postgres");
        anyhow::ensure!(
            !pids.is_empty(),
            "--pin with --backend postgres: no local `postgres` process to pin \
             (run PostgreSQL on this machine, or leave out --pin)"
        );
        let mut before = Vec::new();
        for pid in pids {
            // A backend may end between listing and pinning.
            if let Ok(cpus_before) = set_cpus(pid, cpus) {
                before.push((pid, cpus_before));
            }
        }
        Ok(PinnedPostgres { before })
    }
}

impl Drop for PinnedPostgres {
    fn drop(&mut self) {
        for (pid, cpus) in &self.before {
            let _ = set_cpus(*pid, cpus);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_parse_as_server_and_load_cpu_lists() {
        assert_eq!("0:1".parse(), Ok(Pin { server: "0".into(), load: "1".into() }));
        assert_eq!("0-1:2,3".parse(), Ok(Pin { server: "0-1".into(), load: "2,3".into() }));
        for bad in ["", "0", ":1", "0:", "a:1", "0:1:2"] {
            assert!(bad.parse::<Pin>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_pinned_command_runs_the_program_through_taskset() {
        let args = vec!["--flag".to_string()];
        let (program, wrapped) = command(Some("0"), Path::new("/bin/etcd"), args.clone());
        assert_eq!(program, PathBuf::from("taskset"));
        assert_eq!(wrapped, ["-c", "0", "/bin/etcd", "--flag"]);
        assert_eq!(command(None, Path::new("/bin/etcd"), args.clone()), ("/bin/etcd".into(), args));
    }

    #[test]
    fn a_pinned_child_runs_on_its_cpus_only() {
        let (program, args) =
            command(Some("0"), Path::new("sh"), vec!["-c".into(), "sleep 5".into()]);
        let mut child = Command::new(program).args(args).spawn().unwrap();
        // taskset pins itself, then execs sh: the pid is the shell's.
        let comm = format!("/proc/{}/comm", child.id());
        gantry_testkit::eventually_blocking(std::time::Duration::from_secs(10), "sh run", || {
            std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "sh")
        });
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
        let _ = child.kill();
        let _ = child.wait();
        let status = status.unwrap();
        let allowed = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap();
        assert_eq!(allowed.split_whitespace().nth(1), Some("0"));
    }
}

/// `--cpu-latency-qos`: a latency constraint of 0 µs on every CPU's idle
/// state (`/dev/cpu_dma_latency`, root only), held while the value lives.
/// The kernel's idle loop then polls instead of halting the CPU, as tuned's
/// `latency-performance` profile makes it. On a virtual machine, waking a
/// halted CPU goes through the hypervisor and is the largest part of a
/// 1-client write for both servers, and the most variable: this takes it
/// out of the comparison, for etcd and gantry alike.
#[derive(Debug)]
pub struct IdlePolling {
    _held: std::fs::File,
}

impl IdlePolling {
    pub fn hold() -> anyhow::Result<IdlePolling> {
        use std::io::Write as _;
        let path = "/dev/cpu_dma_latency";
        let mut held = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("open {path} (needs root) for --cpu-latency-qos"))?;
        held.write_all(&0i32.to_ne_bytes()).with_context(|| format!("write 0 to {path}"))?;
        Ok(IdlePolling { _held: held })
    }
}

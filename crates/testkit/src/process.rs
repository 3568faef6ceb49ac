//! One child-process type for everything tests and benchmarks run (the
//! store, the reconciler, etcd): restartable with the same arguments, its
//! stderr appended to one log file across restarts, signalled by name, and
//! killed when dropped so that no test leaves a process behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

/// A child process (see the module doc).
#[derive(Debug)]
pub struct Process {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Where its stderr goes (`None`: nowhere).
    log: Option<PathBuf>,
    /// Its open-file limit (`ulimit -n`), when set.
    open_files: Option<u32>,
    child: Option<Child>,
}

impl Process {
    /// A process of `program` with `args`, not started yet.
    pub fn new(program: impl Into<PathBuf>, args: Vec<String>) -> Process {
        Process {
            program: program.into(),
            args,
            env: Vec::new(),
            log: None,
            open_files: None,
            child: None,
        }
    }

    /// Appends its stderr to `path`.
    #[must_use]
    pub fn log_to(mut self, path: &Path) -> Process {
        self.log = Some(path.to_path_buf());
        self
    }

    /// Sets an environment variable.
    #[must_use]
    pub fn env(mut self, key: &str, value: &str) -> Process {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs it (from the next start) with an open-file limit.
    pub fn set_open_files(&mut self, limit: u32) {
        self.open_files = Some(limit);
    }

    /// Starts it (again, after [`Process::kill9`] or an exit).
    pub fn spawn(&mut self) -> std::io::Result<()> {
        let stderr = match &self.log {
            None => Stdio::null(),
            Some(path) => std::fs::OpenOptions::new().create(true).append(true).open(path)?.into(),
        };
        let mut command = match self.open_files {
            None => Command::new(&self.program),
            Some(limit) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", &format!("ulimit -n {limit} && exec \"$0\" \"$@\"")])
                    .arg(&self.program);
                sh
            }
        };
        let child = command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// How it ended, once it has (`None` while it runs or was not started).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything it logged so far (all restarts).
    pub fn logs(&self) -> String {
        self.log.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default()
    }

    /// The log file, if any.
    pub fn log_path(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// Sends `signal` (e.g. `-STOP`, `-CONT`, `-TERM`).
    pub fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill").args([signal, &pid.to_string()]).status();
        }
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill9(&mut self) {
        self.signal("-KILL");
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// SIGTERM (a graceful stop), and its exit status.
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        self.signal("-TERM");
        self.child.take()?.wait().ok()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::wait::eventually_blocking;

    fn log_file(label: &str) -> PathBuf {
        let log = std::env::temp_dir().join(format!("gantry-{label}-{}", std::process::id()));
        let _ = std::fs::remove_file(&log);
        log
    }

    #[test]
    fn a_restart_appends_to_the_same_log_and_a_kill_ends_the_process() {
        let log = log_file("process-restart");
        let script = "echo started >&2; exec sleep 60".to_string();
        let mut process = Process::new("sh", vec!["-c".into(), script]).log_to(&log);
        for round in 1..=2 {
            process.spawn().expect("spawn sh");
            let pid = process.pid().expect("running");
            eventually_blocking(Duration::from_secs(10), "the start logged", || {
                process.logs().lines().count() == round
            });
            process.kill9();
            assert!(process.pid().is_none());
            assert!(!Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} still exists");
        }
        assert_eq!(process.logs(), "started\nstarted\n");
        let _ = std::fs::remove_file(&log);
    }

    #[test]
    fn terminate_reports_how_it_exited() {
        let log = log_file("process-terminate");
        let script = "trap 'exit 3' TERM; echo ready >&2; sleep 60 & wait".to_string();
        let mut process = Process::new("sh", vec!["-c".into(), script]).log_to(&log);
        process.spawn().expect("spawn sh");
        eventually_blocking(Duration::from_secs(10), "the trap set", || {
            process.logs().contains("ready")
        });
        let status = process.terminate().expect("an exit status");
        assert_eq!(status.code(), Some(3));
        let _ = std::fs::remove_file(&log);
    }
}

//! gatewayctl as a user runs it: the real binary against a real
//! gateway-store process (SQLite), with no config file or environment of
//! the machine it runs on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{binary, temp_dir, StoreProcess};

/// A store process on its own SQLite file, for gatewayctl to talk to.
#[derive(Debug)]
pub struct CtlStore {
    pub process: StoreProcess,
    pub dir: PathBuf,
}

impl CtlStore {
    /// A store with `extra` flags, in a fresh directory named after `label`.
    pub fn start(label: &str, extra: &[&str]) -> CtlStore {
        let dir = temp_dir(label);
        let url = format!("sqlite://{}/store.db", dir.display());
        let process = StoreProcess::start_with(&url, &dir, extra);
        CtlStore { process, dir }
    }

    pub fn server(&self) -> String {
        self.process.endpoint()
    }

    /// gatewayctl against this store.
    pub fn ctl(&self, args: &[&str]) -> Output {
        ctl_at(&self.server(), args)
    }

    /// The gateway as `get NAME -o json` prints it.
    pub fn gateway_json(&self, name: &str) -> serde_json::Value {
        serde_json::from_str(&ok(self.ctl(&["get", name, "-o", "json"]))).expect("get -o json")
    }
}

impl Drop for CtlStore {
    fn drop(&mut self) {
        self.process.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The gatewayctl command with `args`, its environment cleared of every
/// GANTRY_* setting and its HOME empty.
pub fn ctl_command(args: &[&str]) -> Command {
    let mut command = Command::new(binary("gatewayctl"));
    command
        .args(args)
        .env("HOME", std::env::temp_dir().join("gantry-e2e-no-home"))
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("GANTRY_TOKEN")
        .env_remove("GANTRY_SERVER")
        .env_remove("GANTRY_CONFIG")
        .env_remove("GANTRY_CONTEXT")
        .env_remove("GANTRY_CA");
    command
}

/// gatewayctl `args` against `server`.
pub fn ctl_at(server: &str, args: &[&str]) -> Output {
    ctl_command(&[&["--server", server], args].concat()).output().expect("run gatewayctl")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts exit 0; stdout.
pub fn ok(out: Output) -> String {
    assert!(out.status.success(), "gatewayctl failed: {}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// Asserts exit `code` and no panic; (stdout, stderr).
pub fn exits(code: i32, out: Output) -> (String, String) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(code), "stdout: {stdout}\nstderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    (stdout, stderr)
}

/// Writes `content` to `dir/name`; the path.
pub fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write a test file");
    path.display().to_string()
}

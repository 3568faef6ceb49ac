//! What gatewayctl does on this machine: read manifests from files,
//! directories and stdin, run the user's editor, and run `diff` on two
//! versions of the gateways, as kubectl does.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::manifest::{self, GatewayDoc};
use crate::CtlError;

fn msg(text: impl Into<String>) -> CtlError {
    CtlError::Message(text.into())
}

/// The files `-f PATH` names: the file itself, `-` for stdin, or a
/// directory's `.yaml`, `.yml` and `.json` files in name order (its
/// subdirectories too with `recursive`).
pub fn expand(path: &str, recursive: bool) -> Result<Vec<String>, CtlError> {
    if path == "-" || !Path::new(path).is_dir() {
        return Ok(vec![path.to_string()]);
    }
    let mut found = Vec::new();
    let mut dirs = vec![PathBuf::from(path)];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| msg(format!("cannot read directory {}: {e}", dir.display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| msg(format!("cannot read {}: {e}", dir.display())))?;
            let path = entry.path();
            if path.is_dir() {
                if recursive {
                    dirs.push(path);
                }
            } else if path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
            {
                found.push(path.display().to_string());
            }
        }
    }
    found.sort();
    if found.is_empty() {
        return Err(msg(format!("no .yaml, .yml or .json files in {path}")));
    }
    Ok(found)
}

/// Reads a manifest file (`-` for stdin).
pub fn read(path: &str) -> Result<String, CtlError> {
    if path == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(|e| msg(format!("cannot read {path}: {e}")))
}

/// Every document of every file `-f` names, in order; a file that cannot
/// be read or parsed is one `Err` item naming it, so that the others are
/// still tried.
pub fn documents(paths: &[String], recursive: bool) -> Vec<Result<GatewayDoc, (String, CtlError)>> {
    let mut docs = Vec::new();
    for path in paths {
        let files = match expand(path, recursive) {
            Ok(files) => files,
            Err(e) => {
                docs.push(Err((path.clone(), e)));
                continue;
            }
        };
        for file in files {
            match read(&file).and_then(|t| Ok(manifest::parse(&t, &file)?)) {
                Ok(parsed) => docs.extend(parsed.into_iter().map(Ok)),
                Err(e) => docs.push(Err((file, e))),
            }
        }
    }
    docs
}

/// A private scratch directory, removed when dropped.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(label: &str) -> Result<Scratch, CtlError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("gatewayctl-{label}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| msg(format!("cannot create {}: {e}", dir.display())))?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Keeps the directory (and what is in it) after the command.
    pub fn keep(self) -> PathBuf {
        let dir = self.0.clone();
        std::mem::forget(self);
        dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `command` (a shell command line, such as `$EDITOR` or `diff -u`)
/// with `args` appended, as kubectl runs its editor and its diff; its exit
/// code.
pub fn run_shell(command: &str, args: &[&Path]) -> Result<i32, CtlError> {
    let mut line = command.to_string();
    for (i, _) in args.iter().enumerate() {
        line.push_str(&format!(" \"${}\"", i + 1));
    }
    let status = Command::new("sh")
        .arg("-c")
        .arg(&line)
        .arg("gatewayctl")
        .args(args)
        .status()
        .map_err(|e| msg(format!("cannot run {command:?}: {e}")))?;
    status.code().ok_or_else(|| msg(format!("{command:?} was killed by a signal")))
}

/// The editor: `GANTRY_EDITOR`, `VISUAL`, `EDITOR`, else `vi`.
pub fn editor() -> String {
    ["GANTRY_EDITOR", "VISUAL", "EDITOR"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|e| !e.trim().is_empty()))
        .unwrap_or_else(|| "vi".into())
}

/// The diff program: `GANTRY_EXTERNAL_DIFF` (as `KUBECTL_EXTERNAL_DIFF`),
/// else `diff -u -N`.
pub fn differ() -> String {
    std::env::var("GANTRY_EXTERNAL_DIFF")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| "diff -u -N".into())
}

//! What gatewayctl does on this machine: read manifests from files,
//! directories and stdin, run the user's editor (`edit`), and run `diff`
//! on two versions of the gateways (`diff`), as kubectl does.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use std::process::ExitCode;

use crate::ctl::Ctl;
use crate::errors::CtlError;
use gantry_client::manifest::{self, GatewayDoc};

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
/// be read or parsed is one `Err` item naming it (the error itself does
/// not repeat the name), so that the others are still tried.
pub fn documents(paths: &[String], recursive: bool) -> Vec<Result<GatewayDoc, (String, CtlError)>> {
    let unnamed = |path: &str, e: CtlError| {
        let text = e.to_string();
        let said = text.strip_prefix(&format!("{path}: ")).unwrap_or(&text).to_string();
        (path.to_string(), msg(said))
    };
    let mut docs = Vec::new();
    for path in paths {
        let files = match expand(path, recursive) {
            Ok(files) => files,
            Err(e) => {
                docs.push(Err(unnamed(path, e)));
                continue;
            }
        };
        for file in files {
            match read(&file).and_then(|t| Ok(manifest::parse(&t, &file)?)) {
                Ok(parsed) => docs.extend(parsed.into_iter().map(Ok)),
                Err(e) => docs.push(Err(unnamed(&file, e))),
            }
        }
    }
    docs
}

/// A private scratch directory, removed when dropped.
#[derive(Debug)]
pub struct Scratch(tempfile::TempDir);

impl Scratch {
    pub fn new(label: &str) -> Result<Scratch, CtlError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("gatewayctl-{label}-"))
            .tempdir()
            .map_err(|e| msg(format!("cannot create a scratch directory: {e}")))?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Keeps the directory (and what is in it) after the command.
    pub fn keep(self) -> PathBuf {
        self.0.keep()
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

/// Names of the documents the files hold (for `delete -f`).
pub fn names_in(files: &[String], err: &mut impl std::io::Write) -> Result<Vec<String>, CtlError> {
    let mut names = Vec::new();
    let mut failed = 0;
    for doc in documents(files, false) {
        match doc {
            Ok(doc) => names.push(doc.metadata.name),
            Err((path, e)) => {
                failed += 1;
                writeln!(err, "error: {path}: {e}")?;
            }
        }
    }
    if failed > 0 {
        return Err(CtlError::Reported);
    }
    Ok(names)
}

/// `diff`: writes each gateway as stored and as applying would store it
/// under two directories and runs the diff program on them; its exit code
/// (0 no change, 1 changes) is gatewayctl's.
pub async fn diff(
    ctl: &Ctl,
    files: &[String],
    recursive: bool,
    err: &mut impl std::io::Write,
) -> Result<ExitCode, CtlError> {
    let scratch = Scratch::new("diff")?;
    let (live, merged) = (scratch.path().join("LIVE"), scratch.path().join("MERGED"));
    for dir in [&live, &merged] {
        std::fs::create_dir_all(dir)?;
    }
    let mut failed = 0;
    for doc in documents(files, recursive) {
        let doc = match doc {
            Ok(doc) => doc,
            Err((path, e)) => {
                failed += 1;
                writeln!(err, "error: {path}: {e}")?;
                continue;
            }
        };
        let name = doc.metadata.name.clone();
        match ctl.diff(&doc).await {
            Ok((before, after)) => {
                let file = format!("gantry.dev.v1.Gateway.{name}");
                if let Some(before) = before {
                    std::fs::write(live.join(&file), yaml(&before)?)?;
                }
                std::fs::write(merged.join(&file), yaml(&after)?)?;
            }
            Err(e) => {
                failed += 1;
                writeln!(err, "error: gateway/{name}: {e}")?;
            }
        }
    }
    let code = run_shell(&differ(), &[&live, &merged])?;
    if failed > 0 {
        return Err(CtlError::Reported);
    }
    match code {
        0 => Ok(ExitCode::SUCCESS),
        1 => Ok(ExitCode::from(1)),
        other => Err(CtlError::Message(format!("the diff program exited with {other}"))),
    }
}

/// A gateway as `diff` shows it: without apply's record (it repeats the
/// change) and the update time (every write changes it).
fn yaml(doc: &GatewayDoc) -> Result<String, CtlError> {
    let mut doc = doc.clone();
    doc.metadata.annotations.remove(crate::write::LAST_APPLIED_ANNOTATION);
    doc.metadata.update_time.clear();
    serde_saphyr::to_string(&doc).map_err(|e| CtlError::Message(e.to_string()))
}

/// `edit`: opens the gateway in the editor; on any failure after the
/// edit, the edited file is kept and its path said.
pub async fn edit(
    ctl: &Ctl,
    name: &str,
    out: &mut impl std::io::Write,
    err: &mut impl std::io::Write,
) -> Result<(), CtlError> {
    let scratch = Scratch::new("edit")?;
    let file = scratch.path().join(format!("{name}.yaml"));
    let edited = std::cell::Cell::new(false);
    let outcome = ctl
        .edit(name, |text| {
            std::fs::write(&file, text)?;
            let code = run_shell(&editor(), &[&file])?;
            if code != 0 {
                return Err(CtlError::Message(format!(
                    "the editor exited with {code}; nothing was written"
                )));
            }
            let after = std::fs::read_to_string(&file)?;
            edited.set(after != text);
            Ok((after != text).then_some(after))
        })
        .await;
    match outcome {
        Ok(crate::write::EditOutcome::Edited) => writeln!(out, "gateway/{name} edited")?,
        Ok(crate::write::EditOutcome::Cancelled) => {
            writeln!(err, "Edit cancelled, no changes made.")?;
        }
        Err(e) if edited.get() => {
            let kept = scratch.keep().join(format!("{name}.yaml"));
            return Err(CtlError::Message(format!(
                "{e}\nyour edited copy is saved in {}",
                kept.display()
            )));
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

//! docs/operations.md's backup and restore commands, exactly as written
//! there, for the tests that take a backup and restore it.

use std::path::Path;
use std::process::Command;

use crate::env::{in_ci, skipped};

/// Whether the command-line tool `name` is installed; a test without it
/// says it skipped (and fails under `CI=true`).
pub fn tool(name: &str) -> bool {
    let present = Command::new(name).arg("--version").output().is_ok_and(|o| o.status.success());
    if !present {
        assert!(!in_ci(), "{name} is not installed");
        skipped(&format!("{name} is not installed: its backup and restore were not tested"));
    }
    present
}

/// Runs `program` with `args`; panics with its stderr unless it succeeds.
pub fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An online backup of the SQLite database `db` into `to` (`sqlite3 .backup`).
pub fn sqlite_backup(db: &Path, to: &Path) {
    let db = db.to_str().expect("a UTF-8 path");
    run("sqlite3", &[db, &format!(".backup '{}'", to.display())]);
}

/// Puts the backup `from` in place of the SQLite database `db`, without
/// the old WAL (the store must be stopped).
pub fn sqlite_restore(from: &Path, db: &Path) {
    for suffix in ["-wal", "-shm"] {
        let mut stale = db.as_os_str().to_owned();
        stale.push(suffix);
        let _ = std::fs::remove_file(stale);
    }
    std::fs::copy(from, db).expect("copy the backup in place");
}

/// `pg_dump --format=custom` of the database at `url` into `to`.
pub fn pg_dump(url: &str, to: &Path) {
    let to = to.to_str().expect("a UTF-8 path");
    run("pg_dump", &["--format=custom", "--dbname", url, "--file", to]);
}

/// `pg_restore` of the dump `from` into the (empty) database at `url`.
pub fn pg_restore(from: &Path, url: &str) {
    let from = from.to_str().expect("a UTF-8 path");
    run("pg_restore", &["--no-owner", "--exit-on-error", "--dbname", url, from]);
}

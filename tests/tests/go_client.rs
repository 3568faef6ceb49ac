//! The Go client (`clients/go`): its own tests (`go test`) against a real
//! gateway-store process, run from the Rust suite so that the README's one
//! test command covers it. Without Go they skip with one line (and fail
//! under CI).

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

use gantry_testkit::{binary, in_ci, skipped};

#[test]
fn the_go_client_passes_its_tests_against_a_real_store() {
    let has_go = Command::new("go").arg("version").output().is_ok_and(|o| o.status.success());
    if !has_go {
        assert!(!in_ci(), "go is not installed: CI runs the Go client's tests");
        skipped("go is not installed: the Go client's tests (clients/go) did not run");
        return;
    }
    let module = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/go");
    let unformatted =
        Command::new("gofmt").arg("-l").arg(".").current_dir(&module).output().unwrap();
    let unformatted = String::from_utf8_lossy(&unformatted.stdout).into_owned();
    assert!(unformatted.trim().is_empty(), "gofmt would change: {unformatted}");
    let out = Command::new("go")
        .args(["test", "-count=1", "-v", "./..."])
        .current_dir(&module)
        .env("GANTRY_STORE_BIN", binary("gateway-store"))
        .env("GOFLAGS", "-mod=readonly")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "go test failed:\n{report}");
    for test in [
        "TestEveryChangeExactlyOnceAcrossAStoreRestart",
        "TestResumeBehindCompactionRelists",
        "TestPermanentErrorsEndTheLoop",
        "TestRetryOnConflictResolvesConflictsAndUnknownOutcomes",
        "TestDialTLSWithARotatedTokenFile",
        "TestDialRefusesATokenOverPlaintext",
        "TestEveryExportedNameHasGodoc",
        "ExampleDial",
        "ExampleRetryOnConflict",
    ] {
        assert!(stdout.contains(&format!("--- PASS: {test}")), "{test} did not pass:\n{report}");
    }
}

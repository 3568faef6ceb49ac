//! The project as a new user meets it: the gantry-local launcher as a
//! process, driven by the gatewayctl binary.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use gantry_testkit::{binary, eventually_blocking, free_port, kill_after, temp_dir, wait_ready};

struct Local {
    child: Child,
    dir: PathBuf,
    config: PathBuf,
    server: String,
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts the launcher in `dir` on free ports; waits until both services
/// are ready. Returns the process and the store's URL.
fn spawn_local(dir: &Path, config: &Path) -> (Child, String) {
    let (grpc, http, reconciler_http) = (free_port(), free_port(), free_port());
    let child = Command::new(binary("gantry-local"))
        .current_dir(dir)
        .args([
            "--listen",
            &format!("127.0.0.1:{grpc}"),
            "--http-listen",
            &format!("127.0.0.1:{http}"),
        ])
        .args(["--reconciler-http-listen", &format!("127.0.0.1:{reconciler_http}")])
        .args(["--ctl-config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for port in [http, reconciler_http] {
        wait_ready(port, "/readyz", Duration::from_secs(60));
    }
    (child, format!("http://127.0.0.1:{grpc}"))
}

fn start_local(label: &str) -> Local {
    let dir = temp_dir(label);
    let config = dir.join("gatewayctl.yaml");
    let (child, server) = spawn_local(&dir, &config);
    Local { child, dir, config, server }
}

fn ctl(config: &Path, args: &[&str]) -> Output {
    Command::new(binary("gatewayctl"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("GANTRY_TOKEN")
        .env_remove("GANTRY_SERVER")
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "gatewayctl failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn failed(out: Output) -> String {
    assert!(!out.status.success(), "expected a failure: {}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked") && !stderr.contains("stack backtrace"), "{stderr}");
    stderr
}

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

#[test]
fn a_gateway_from_apply_to_delete_through_gatewayctl() {
    let local = start_local("local-lifecycle");
    let minimal = examples().join("minimal.yaml");
    let file = minimal.to_str().unwrap();
    assert_eq!(ok(ctl(&local.config, &["apply", "-f", file])), "gateway/edge created\n");
    assert_eq!(ok(ctl(&local.config, &["apply", "-f", file])), "gateway/edge unchanged\n");
    assert_eq!(
        ok(ctl(&local.config, &["wait", "edge", "--for=converged", "--timeout=60s"])),
        "gateway/edge condition met\n"
    );
    // The directory target runs nothing: Ready is not claimed.
    let stderr =
        failed(ctl(&local.config, &["wait", "edge", "--for=condition=Ready", "--timeout=1s"]));
    assert!(stderr.contains("timed out") && stderr.contains("phase WRITTEN"), "{stderr}");

    let json: serde_json::Value =
        serde_json::from_str(&ok(ctl(&local.config, &["get", "edge", "-o", "json"]))).unwrap();
    assert_eq!(json["kind"], "Gateway");
    assert_eq!(json["metadata"]["name"], "edge");
    assert_eq!(json["spec"]["image"], "ghcr.io/acme/gateway:1.0");
    assert_eq!(json["status"]["phase"], "WRITTEN");
    assert_eq!(json["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(json["status"]["conditions"][0]["status"], "UNKNOWN");
    assert_eq!(json["status"]["observedGeneration"], json["metadata"]["generation"]);
    let manifests = local.dir.join("gantry-manifests/edge");
    assert!(
        manifests.join("deployment.yaml").exists(),
        "manifests written to the directory target"
    );

    // A spec change: configured, then converged at generation 2.
    let changed = local.dir.join("changed.yaml");
    std::fs::write(
        &changed,
        std::fs::read_to_string(&minimal).unwrap().replace("gateway:1.0", "gateway:1.1"),
    )
    .unwrap();
    assert_eq!(
        ok(ctl(&local.config, &["apply", "-f", changed.to_str().unwrap()])),
        "gateway/edge configured\n"
    );
    ok(ctl(&local.config, &["wait", "edge", "--for=converged", "--timeout=60s"]));
    let yaml = ok(ctl(&local.config, &["get", "edge", "-o", "yaml"]));
    assert!(yaml.contains("generation: 2") && yaml.contains("observedGeneration: 2"), "{yaml}");
    assert!(std::fs::read_to_string(manifests.join("deployment.yaml"))
        .unwrap()
        .contains("gateway:1.1"));

    // Table, wide and name outputs.
    let table = ok(ctl(&local.config, &["get"]));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "PHASE", "READY", "GENERATION", "OBSERVED", "AGE"]
    );
    assert_eq!(
        lines[1].split_whitespace().take(5).collect::<Vec<_>>(),
        ["edge", "WRITTEN", "Unknown", "2", "2"]
    );
    let wide = ok(ctl(&local.config, &["get", "-o", "wide"]));
    assert!(
        wide.lines().next().unwrap().ends_with("MESSAGE")
            && wide.contains("ghcr.io/acme/gateway:1.1"),
        "{wide}"
    );
    assert_eq!(ok(ctl(&local.config, &["get", "-o", "name"])), "gateway/edge\n");
    let none = ctl(&local.config, &["get", "-l", "team=none"]);
    assert_eq!(String::from_utf8_lossy(&none.stderr), "No gateways found.\n");
    assert_eq!(ok(none), "", "a message, not data: nothing on stdout");
    let described = ok(ctl(&local.config, &["describe", "edge"]));
    assert!(
        described.contains("Conditions:") && described.contains("ManifestsApplied"),
        "{described}"
    );
    let events = described.split("Events:").nth(1).unwrap();
    assert!(
        events.contains("ADDED") && events.contains("MODIFIED") && events.contains("WRITTEN"),
        "{described}"
    );
    let completion = ok(ctl(&local.config, &["completion", "bash"]));
    // The function asks gatewayctl itself (tests/tests/ctl_habits.rs drives it).
    assert!(
        completion.contains("complete ") && completion.contains("COMPLETE=\"bash\""),
        "a bash completion function: {completion}"
    );
    assert_eq!(ok(ctl(&local.config, &["retry", "edge"])), "gateway/edge retry requested\n");

    let deleted = ok(ctl(&local.config, &["delete", "edge", "--wait", "--timeout=60s"]));
    assert_eq!(deleted, "gateway/edge deleted\ngateway/edge condition met\n");
    assert!(!manifests.exists(), "the manifests left the directory target");
    let stderr = failed(ctl(&local.config, &["get", "edge"]));
    assert!(stderr.contains("gateway \"edge\" not found"), "{stderr}");
}

#[test]
fn errors_are_plain_words_with_a_non_zero_exit() {
    let local = start_local("local-errors");
    let bad = local.dir.join("bad.yaml");
    std::fs::write(&bad, "apiVersion: gantry.dev/v1\nkind: Gateway\nmetadata: {name: edge}\nspec: {image: 'Not An Image', replicas: -1}\n").unwrap();
    let stderr = failed(ctl(&local.config, &["apply", "-f", bad.to_str().unwrap()]));
    assert!(
        stderr.contains("gateway.spec.image") && stderr.contains("gateway.spec.replicas"),
        "{stderr}"
    );
    std::fs::write(
        &bad,
        "apiVersion: gantry.dev/v1\nkind: Gateway\nmetadata: {name: edge}\nspec: {imagee: x}\n",
    )
    .unwrap();
    let stderr = failed(ctl(&local.config, &["apply", "-f", bad.to_str().unwrap()]));
    assert!(stderr.contains("imagee"), "{stderr}");
    let stderr = failed(ctl(&local.config, &["apply", "-f", "/nonexistent.yaml"]));
    assert!(stderr.contains("cannot read /nonexistent.yaml"), "{stderr}");

    let stderr = failed(ctl(&local.config, &["describe", "nobody"]));
    assert!(stderr.contains("gateway \"nobody\" not found"), "{stderr}");
    let stderr =
        failed(ctl(&local.config, &["wait", "nobody", "--for=condition=Ready", "--timeout=1s"]));
    assert!(stderr.contains("not found"), "{stderr}");
    let stderr = failed(ctl(&local.config, &["--token", "wrong-token-wrong-token", "get"]));
    assert!(stderr.contains("rejected the credentials") && stderr.contains("--token"), "{stderr}");
    let unreachable = format!("http://127.0.0.1:{}", free_port());
    let stderr = failed(ctl(&local.config, &["--server", &unreachable, "get"]));
    assert!(stderr.contains("nothing is listening") && stderr.contains(&unreachable), "{stderr}");
    let stderr = failed(ctl(&local.config, &["wait", "x", "--for=happy"]));
    assert!(stderr.contains("condition=Ready"), "{stderr}");

    // A timeout says what state the gateway was in.
    ok(ctl(&local.config, &["create", "slowpoke", "--image", "ghcr.io/acme/gateway:1.0"]));
    let stderr =
        failed(ctl(&local.config, &["wait", "slowpoke", "--for=condition=Happy", "--timeout=1s"]));
    assert!(stderr.contains("timed out") && stderr.contains("slowpoke"), "{stderr}");
    assert!(local.server.starts_with("http://"));
}

#[test]
fn a_second_start_reuses_the_data_and_the_tokens() {
    let dir = temp_dir("local-restart");
    let config = dir.join("gatewayctl.yaml");
    let (mut first, _) = spawn_local(&dir, &config);
    ok(ctl(&config, &["create", "kept", "--image", "ghcr.io/acme/gateway:1.0"]));
    let tokens = std::fs::read_to_string(dir.join("gantry-data/tokens.csv")).unwrap();
    Command::new("kill").args(["-TERM", &first.id().to_string()]).status().unwrap();
    assert!(first.wait().unwrap().success(), "SIGTERM stops both cleanly");

    let (mut again, _) = spawn_local(&dir, &config);
    assert_eq!(
        std::fs::read_to_string(dir.join("gantry-data/tokens.csv")).unwrap(),
        tokens,
        "tokens reused"
    );
    assert_eq!(ok(ctl(&config, &["get", "-o", "name"])), "gateway/kept\n", "data reused");
    let _ = Command::new("kill").args(["-TERM", &again.id().to_string()]).status();
    let _ = again.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn watch_prints_changes_as_they_happen() {
    use std::io::{BufRead, BufReader};
    let local = start_local("local-watch");
    let mut watcher = Command::new(binary("gatewayctl"))
        .arg("--config")
        .arg(&local.config)
        .args(["watch"])
        .env_remove("GANTRY_TOKEN")
        .env_remove("GANTRY_SERVER")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    gantry_testkit::kill_after(&watcher, Duration::from_secs(60));
    let mut lines = BufReader::new(watcher.stdout.take().unwrap()).lines();
    let header = lines.next().unwrap().unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["REVISION", "EVENT", "NAME", "PHASE", "GEN/OBSERVED"]
    );
    ok(ctl(&local.config, &["create", "watched", "--image", "ghcr.io/acme/gateway:1.0"]));
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let fields: Vec<String> = line.split_whitespace().map(String::from).collect();
        seen.push(line);
        if fields.get(2).is_some_and(|n| n == "watched")
            && fields.get(3).is_some_and(|p| p == "WRITTEN")
        {
            break;
        }
    }
    assert!(seen[0].contains("ADDED") && seen[0].contains("watched"), "{seen:?}");
    let _ = watcher.kill();
    let _ = watcher.wait();
}

#[test]
fn a_missing_kubeconfig_stops_gantry_local_at_once_with_the_reason() {
    let dir = temp_dir("local-no-kubeconfig");
    let missing = dir.join("no-such-kubeconfig");
    let (grpc, http, reconciler_http) = (free_port(), free_port(), free_port());
    let mut child = Command::new(binary("gantry-local"))
        .current_dir(&dir)
        .args(["--listen", &format!("127.0.0.1:{grpc}")])
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--reconciler-http-listen", &format!("127.0.0.1:{reconciler_http}")])
        .args(["--ctl-config", dir.join("gatewayctl.yaml").to_str().unwrap()])
        .args(["--target", "kube", "--kubeconfig", missing.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed after a minute whatever happens; it must exit well before.
    kill_after(&child, Duration::from_secs(60));
    let mut exited = None;
    eventually_blocking(
        Duration::from_secs(20),
        "gantry-local to exit after its reconciler could not start",
        || {
            exited = child.try_wait().unwrap();
            exited.is_some()
        },
    );
    let status = exited.unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!status.success(), "{stdout}{stderr}");
    assert!(!stdout.contains("running"), "it claimed to run: {stdout}");
    assert!(
        stderr.contains("gateway-reconciler failed to start")
            && stderr.contains("kubeconfig")
            && stderr.contains(missing.to_str().unwrap()),
        "{stderr}"
    );
    // Nothing keeps listening after it exits.
    assert!(gantry_testkit::http_get(http, "/healthz").is_none());
    let _ = std::fs::remove_dir_all(dir);
}

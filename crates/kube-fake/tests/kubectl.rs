//! The real kubectl against the gantry-kube-fake binary: server-side
//! apply, get, label selection and delete give what a cluster would.
//! Skips with a message when kubectl is absent, except under CI=true.

#![allow(clippy::unwrap_used)]

use gantry_testkit::eventually_blocking;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MANIFESTS: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: cfg
  labels: {app: demo}
data:
  a: "1"
---
apiVersion: v1
kind: Service
metadata:
  name: svc
  labels: {app: demo}
spec:
  selector: {app: demo}
  ports:
  - port: 80
    targetPort: 8080
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: demo, tier: front}
spec:
  replicas: 2
  selector:
    matchLabels: {app: demo}
  template:
    metadata:
      labels: {app: demo}
    spec:
      containers:
      - name: web
        image: nginx:1.27
"#;

/// The kubectl of the pinned Kubernetes release (tests/k8s/setup.sh).
fn kubectl_path() -> Option<PathBuf> {
    gantry_testkit::k8s::kubectl()
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Path) -> (Server, PathBuf) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let kubeconfig = dir.join("kubeconfig");
    let child = Command::new(env!("CARGO_BIN_EXE_gantry-kube-fake"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--rollout-delay-ms",
            "10",
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    eventually_blocking(Duration::from_secs(30), "kube-fake started", || {
        kubeconfig.exists() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    (server, kubeconfig)
}

fn kubectl(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    let out =
        Command::new(kubectl).arg("--kubeconfig").arg(kubeconfig).args(args).output().unwrap();
    out
}

fn ok(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn kubectl_applies_gets_selects_and_deletes() {
    let Some(bin) = kubectl_path() else { return };
    let dir = std::env::temp_dir().join(format!("kube-fake-kubectl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifests = dir.join("manifests.yaml");
    std::fs::write(&manifests, MANIFESTS).unwrap();
    let (_server, config) = start(&dir);
    let file = manifests.to_str().unwrap();

    let applied =
        ok(kubectl(&bin, &config, &["apply", "--server-side", "--validate=false", "-f", file]));
    assert_eq!(
        applied.lines().collect::<Vec<_>>(),
        [
            "configmap/cfg serverside-applied",
            "service/svc serverside-applied",
            "deployment.apps/web serverside-applied"
        ]
    );

    let get_json = |args: &[&str]| -> serde_json::Value {
        serde_json::from_str(&ok(kubectl(&bin, &config, args))).unwrap()
    };
    let deployment = get_json(&["get", "deployment", "web", "-o", "json", "--show-managed-fields"]);
    assert_eq!(deployment["metadata"]["generation"], 1);
    assert_eq!(deployment["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1.27");
    assert_eq!(deployment["metadata"]["managedFields"][0]["manager"], "kubectl");
    assert_eq!(deployment["metadata"]["managedFields"][0]["operation"], "Apply");

    // Once the rollout is reported, applying the same manifests again
    // changes nothing.
    let deadline = Instant::now() + Duration::from_secs(30);
    let rolled_out = loop {
        let d = get_json(&["get", "deployment", "web", "-o", "json"]);
        if d["status"]["availableReplicas"] == 2 {
            break d;
        }
        assert!(Instant::now() < deadline, "the rollout was never reported");
        std::thread::sleep(Duration::from_millis(20));
    };
    ok(kubectl(&bin, &config, &["apply", "--server-side", "--validate=false", "-f", file]));
    let again = get_json(&["get", "deployment", "web", "-o", "json"]);
    assert_eq!(again["metadata"]["resourceVersion"], rolled_out["metadata"]["resourceVersion"]);
    assert_eq!(again["metadata"]["generation"], 1);

    let selected = ok(kubectl(
        &bin,
        &config,
        &["get", "configmaps,services,deployments", "-l", "app=demo", "-o", "name"],
    ));
    assert_eq!(
        selected.lines().collect::<Vec<_>>(),
        ["configmap/cfg", "service/svc", "deployment.apps/web"]
    );
    let front = ok(kubectl(
        &bin,
        &config,
        &["get", "deployments", "-l", "tier=front,app in (demo)", "-o", "name"],
    ));
    assert_eq!(front.trim(), "deployment.apps/web");
    let none = ok(kubectl(&bin, &config, &["get", "configmaps", "-l", "app=other", "-o", "name"]));
    assert!(none.trim().is_empty());

    let deleted = ok(kubectl(&bin, &config, &["delete", "-f", file]));
    assert_eq!(
        deleted.lines().collect::<Vec<_>>(),
        [
            "configmap \"cfg\" deleted from default namespace",
            "service \"svc\" deleted from default namespace",
            "deployment.apps \"web\" deleted from default namespace"
        ]
    );
    let missing = kubectl(&bin, &config, &["get", "configmap", "cfg"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

//! Deploying gantry onto a [`RealNode`] the way the README does: an
//! overlay of `deploy/` applied with kustomize (the image substituted by
//! `images:`, not by editing the manifests), pods waited Ready, the store
//! reached through `kubectl port-forward`, and a service of this machine
//! (the harness's PostgreSQL) made reachable from the pods.

use std::io::BufRead as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{RealNode, NODE_IP};
use crate::{free_port, workspace_root};

/// The image name `deploy/base` gives gantry, which an overlay's `images:`
/// replaces.
const SHIPPED_IMAGE: &str = "ghcr.io/gantry-dev/gantry";

impl RealNode {
    /// Applies `deploy/overlays/{overlay}` through a kustomization in
    /// `dir` that names `image` for gantry and adds `patches` (YAML list
    /// items, indented by two spaces, or empty).
    pub fn apply_overlay(&self, dir: &Path, overlay: &str, image: &str, patches: &str) {
        let kustomization = dir.join(format!("overlay-{overlay}"));
        std::fs::create_dir_all(&kustomization).expect("create the kustomization's directory");
        // kustomize takes only relative paths: up to / and down to the
        // overlay.
        let target = workspace_root()
            .join("deploy/overlays")
            .join(overlay)
            .canonicalize()
            .expect("the overlay exists");
        let depth = kustomization.canonicalize().expect("made above").components().count() - 1;
        let relative = format!(
            "{}{}",
            "../".repeat(depth),
            target.display().to_string().trim_start_matches('/')
        );
        let patches =
            if patches.is_empty() { String::new() } else { format!("patches:\n{patches}") };
        std::fs::write(
            kustomization.join("kustomization.yaml"),
            format!(
                "resources:\n  - {relative}\nimages:\n  - name: {SHIPPED_IMAGE}\n    newName: {image}\n{patches}"
            ),
        )
        .expect("write the kustomization");
        self.kubectl(&["apply", "--server-side", "-k", &kustomization.display().to_string()]);
    }

    /// Waits until `count` pods that `selector` selects in `namespace` are
    /// Ready (through their real probes).
    pub fn wait_pods_ready(&self, namespace: &str, selector: &str, count: usize, within: Duration) {
        let wanted = vec!["True"; count].join(" ");
        self.wait_for(
            &format!("{count} pods {selector} Ready in {namespace}"),
            within,
            &[
                "-n",
                namespace,
                "get",
                "pods",
                "-l",
                selector,
                "-o",
                "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
            ],
            |s| s == wanted,
        );
    }

    /// `kubectl port-forward` of `target` in `namespace` to a free local
    /// port, as the README has users reach the store; the port, once
    /// forwarding.
    pub fn port_forward(&self, namespace: &str, target: &str, remote: u16) -> (Child, u16) {
        let local = free_port();
        let mut child = Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(["-n", namespace, "port-forward", target, &format!("{local}:{remote}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run kubectl port-forward");
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(first.contains("Forwarding from"), "kubectl port-forward {target}: {first:?}");
        // Keep reading so that the pipe never fills.
        std::thread::spawn(move || for _ in lines {});
        (child, local)
    }

    /// Makes `to` (a service of this machine on loopback, such as the
    /// harness's PostgreSQL) reachable from the pods at the returned
    /// address on the node's bridge, for as long as the test runs.
    pub fn expose(&self, to: SocketAddr) -> SocketAddr {
        let listener = TcpListener::bind((NODE_IP, 0)).expect("listen on the node's address");
        let at = listener.local_addr().expect("bound");
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect_timeout(&to, Duration::from_secs(5)) else {
                    continue;
                };
                relay(client, server);
            }
        });
        at
    }
}

/// Copies bytes both ways between `a` and `b` until either side closes.
fn relay(a: TcpStream, b: TcpStream) {
    let pipe = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        });
    };
    if let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) {
        pipe(a, b2);
        pipe(b, a2);
    }
}

//! Real containers on a real node (`gantry_testkit::node`): the images
//! built here, imported with no registry, run by containerd and the
//! kubelet under the securityContext gantry ships; their probes are real,
//! their traffic goes through a Service's ClusterIP, and the kubelet
//! restarts a killed store without losing an acknowledged write.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gantry_testkit::node::RealNode;
use gantry_testkit::{binary, temp_dir, without_test_cargo_env, workspace_root};

/// Builds an image with gantry-image (`kind` and its flags) into `dir`.
fn image(dir: &Path, file: &str, name: &str, args: &[&str]) -> std::path::PathBuf {
    let out = dir.join(file);
    let (name, tag) = name.split_once(':').unwrap();
    let built = Command::new(binary("gantry-image"))
        .args(["--out", out.to_str().unwrap(), "--name", name, "--tag", tag])
        .args(args)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    out
}

/// gantry's image as deploy/image/build.sh makes it, from the tests' binaries.
fn gantry_image(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("gantry.tar");
    let mut build = Command::new("bash");
    build
        .arg(workspace_root().join("deploy/image/build.sh"))
        .arg(&out)
        .env("GANTRY_IMAGE_BINARIES", binary("gateway-store").parent().unwrap());
    without_test_cargo_env(&mut build);
    let done = build.output().unwrap();
    assert!(done.status.success(), "build.sh: {}", String::from_utf8_lossy(&done.stderr));
    out
}

fn deployment(name: &str, image: &str) -> String {
    format!(
        r#"{{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {{"name": "{name}", "namespace": "real"}},
 "spec": {{"replicas": 1, "selector": {{"matchLabels": {{"app": "{name}"}}}},
  "template": {{"metadata": {{"labels": {{"app": "{name}"}}}}, "spec": {{
   "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 5,
   "securityContext": {{"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "seccompProfile": {{"type": "RuntimeDefault"}}}},
   "containers": [{{"name": "gateway", "image": "{image}", "imagePullPolicy": "Never",
     "ports": [{{"name": "https", "containerPort": 8443}}, {{"name": "health", "containerPort": 8081}}],
     "readinessProbe": {{"httpGet": {{"path": "/readyz", "port": "health"}}, "periodSeconds": 1}},
     "livenessProbe": {{"httpGet": {{"path": "/healthz", "port": "health"}}, "periodSeconds": 5}},
     "securityContext": {{"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {{"drop": ["ALL"]}}}}}}]}}}}}}}}
---
{{"apiVersion": "v1", "kind": "Service", "metadata": {{"name": "{name}", "namespace": "real"}},
 "spec": {{"selector": {{"app": "{name}"}}, "ports": [{{"port": 443, "targetPort": "https"}}]}}}}"#
    )
}

/// The store as deploy/base runs it (non-root, read-only root, no
/// capabilities, probes on /readyz and /healthz), on an emptyDir.
fn store_pod(image: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "store", "namespace": "real", "labels": {{"app": "store"}}}},
 "spec": {{"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 30,
  "securityContext": {{"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532, "seccompProfile": {{"type": "RuntimeDefault"}}}},
  "containers": [{{"name": "gateway-store", "image": "{image}", "imagePullPolicy": "Never",
    "command": ["/usr/local/bin/gateway-store"],
    "args": ["--listen=0.0.0.0:50051", "--http-listen=0.0.0.0:9090", "--data-dir=/var/lib/gantry", "--allow-unauthenticated", "--log-format=json"],
    "ports": [{{"name": "grpc", "containerPort": 50051}}, {{"name": "http", "containerPort": 9090}}],
    "readinessProbe": {{"httpGet": {{"path": "/readyz", "port": "http"}}, "periodSeconds": 1}},
    "livenessProbe": {{"httpGet": {{"path": "/healthz", "port": "http"}}, "periodSeconds": 10}},
    "securityContext": {{"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {{"drop": ["ALL"]}}}},
    "volumeMounts": [{{"name": "data", "mountPath": "/var/lib/gantry"}}]}}],
  "volumes": [{{"name": "data", "emptyDir": {{}}}}]}}}}"#
    )
}

fn ready(node: &RealNode, selector: &str) {
    node.wait_for(
        &format!("{selector} Ready"),
        Duration::from_secs(120),
        &[
            "-n",
            "real",
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
        ],
        |s| s == "True",
    );
}

fn http(url: &str) -> String {
    let out = Command::new("curl").args(["-s", "--max-time", "5", url]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_built_here_run_on_a_real_node() {
    let Some(node) = tokio::task::block_in_place(RealNode::start) else { return };
    let dir = temp_dir("real-node-images");
    for archive in [
        image(&dir, "gateway.tar", "gantry.test/gateway:1", &["test-gateway"]),
        image(
            &dir,
            "never-ready.tar",
            "gantry.test/never-ready:1",
            &["test-gateway", "--never-ready"],
        ),
        gantry_image(&dir),
    ] {
        node.import(&archive);
    }
    node.kubectl(&["create", "namespace", "real"]);

    // A gateway's pods answer through its Service once Ready.
    node.kubectl_stdin(&["apply", "-f", "-"], &deployment("web", "gantry.test/gateway:1"));
    ready(&node, "app=web");
    let cluster_ip =
        node.kubectl(&["-n", "real", "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    assert!(cluster_ip.starts_with("10.96."), "{cluster_ip}");
    let mut page = String::new();
    for _ in 0..40 {
        page = http(&format!("http://{cluster_ip}:443/"));
        if page.contains("gantry test gateway") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        page.contains("gantry test gateway"),
        "through the ClusterIP: {page:?}\n{}",
        node.diagnostics()
    );

    // The never-ready image runs but never passes its readiness probe.
    node.kubectl_stdin(&["apply", "-f", "-"], &deployment("stuck", "gantry.test/never-ready:1"));
    node.wait_for(
        "the never-ready pod to run",
        Duration::from_secs(120),
        &[
            "-n",
            "real",
            "get",
            "pods",
            "-l",
            "app=stuck",
            "-o",
            "jsonpath={.items[0].status.phase}",
        ],
        |s| s == "Running",
    );
    node.wait_for(
        "a failed readiness probe",
        Duration::from_secs(60),
        &[
            "-n",
            "real",
            "get",
            "events",
            "--field-selector",
            "reason=Unhealthy",
            "-o",
            "jsonpath={.items[*].message}",
        ],
        |s| s.contains("Readiness probe failed"),
    );
    let stuck = node.kubectl(&[
        "-n",
        "real",
        "get",
        "pods",
        "-l",
        "app=stuck",
        "-o",
        "jsonpath={.items[0].status.conditions[?(@.type==\"Ready\")].status}",
    ]);
    assert_eq!(stuck, "False");

    // gantry's image: the store, non-root on a read-only root, Ready
    // through its real probes; killed with SIGKILL, restarted by the
    // kubelet with every acknowledged write there.
    node.kubectl_stdin(&["apply", "-f", "-"], &store_pod("ghcr.io/gantry-dev/gantry:0.1.0"));
    ready(&node, "app=store");
    let ip = node.pod_ip("real", "app=store");
    let client = gantry_client::ClientConfig {
        endpoint: format!("http://{ip}:50051"),
        ..Default::default()
    }
    .connect_lazy()
    .unwrap();
    let gateways = gantry_testkit::Gateways::new(client.clone());
    const WRITES: usize = 20;
    for i in 0..WRITES {
        gateways
            .create(
                gantry_testkit::gateway::named(&format!("gw-{i}"))
                    .image("ghcr.io/acme/gw:1")
                    .build(),
            )
            .await;
    }
    let killed = Command::new("pkill")
        .args(["-9", "-f", "/usr/local/bin/gateway-store --listen=0.0.0.0:50051"])
        .status()
        .unwrap();
    assert!(killed.success(), "no store process to kill");
    node.wait_for(
        "the kubelet to restart the store",
        Duration::from_secs(120),
        &[
            "-n",
            "real",
            "get",
            "pod",
            "store",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
        |s| s == "1",
    );
    ready(&node, "app=store");
    // The first call after the restart may meet the old connection.
    let mut listed = Vec::new();
    for _ in 0..20 {
        let request = gantry_api::v1::ListGatewaysRequest { page_size: 1000, ..Default::default() };
        if let Ok(page) = client.clone().list_gateways(request).await {
            listed = page.into_inner().gateways;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let names: Vec<String> =
        listed.iter().map(|g| g.metadata.as_ref().unwrap().name.clone()).collect();
    assert_eq!(names.len(), WRITES, "acknowledged writes after the restart: {names:?}");
    let user = node.kubectl(&[
        "-n",
        "real",
        "get",
        "pod",
        "store",
        "-o",
        "jsonpath={.spec.securityContext.runAsUser}",
    ]);
    assert_eq!(user, "65532");
    let _ = std::fs::remove_dir_all(dir);
}

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

/// gantry's image as deploy/image/build.sh makes it, from the tests'
/// binaries, named `name`.
fn gantry_image(dir: &Path, name: &str) -> std::path::PathBuf {
    let out = dir.join("gantry.tar");
    let mut build = Command::new("bash");
    build
        .arg(workspace_root().join("deploy/image/build.sh"))
        .arg(&out)
        .env("GANTRY_IMAGE_BINARIES", binary("gateway-store").parent().unwrap())
        .env("GANTRY_IMAGE_NAME", name);
    without_test_cargo_env(&mut build);
    let done = build.output().unwrap();
    assert!(done.status.success(), "build.sh: {}", String::from_utf8_lossy(&done.stderr));
    out
}

/// The names of every gateway the store lists (retried: the first call
/// after a restart may meet the old connection).
async fn stored_names(client: &gantry_client::GatewayClient) -> std::collections::BTreeSet<String> {
    let listed = gantry_testkit::eventually_some(Duration::from_secs(30), "a listing", || {
        let mut client = client.clone();
        async move {
            let request =
                gantry_api::v1::ListGatewaysRequest { page_size: 1000, ..Default::default() };
            client.list_gateways(request).await.ok().map(|page| page.into_inner().gateways)
        }
    })
    .await;
    listed.iter().map(|g| g.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default()).collect()
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

fn http(url: &str) -> String {
    let out = Command::new("curl").args(["-s", "--max-time", "5", url]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The page at `url` once it holds `wanted` (kube-proxy programs a new
/// Service's endpoints a moment after the pods are Ready).
async fn page_with(url: &str, wanted: &str) -> String {
    let what = format!("{url} to answer {wanted:?}");
    gantry_testkit::eventually_some(Duration::from_secs(30), &what, || async {
        Some(http(url)).filter(|page| page.contains(wanted))
    })
    .await
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
        gantry_image(&dir, "ghcr.io/gantry-dev/gantry"),
    ] {
        node.import(&archive);
    }
    node.kubectl(&["create", "namespace", "real"]);

    // A gateway's pods answer through its Service once Ready.
    node.kubectl_stdin(&["apply", "-f", "-"], &deployment("web", "gantry.test/gateway:1"));
    node.wait_pods_ready("real", "app=web", 1, Duration::from_secs(120));
    let cluster_ip = service_ip(&node, "real", "web");
    assert!(cluster_ip.starts_with("10.96."), "{cluster_ip}");
    let page = page_with(&format!("http://{cluster_ip}:443/"), "gantry test gateway").await;
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
    node.wait_pods_ready("real", "app=store", 1, Duration::from_secs(120));
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
    node.wait_pods_ready("real", "app=store", 1, Duration::from_secs(120));
    let names = stored_names(&client).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pair_from_the_dev_overlay_converges_a_gateway_whose_pods_answer() {
    let Some(node) = tokio::task::block_in_place(RealNode::start) else { return };
    let dir = temp_dir("real-node-pair");
    // gantry's image under a name only kustomize's substitution reaches.
    node.import(&gantry_image(&dir, "gantry.test/gantry"));
    node.import(&image(&dir, "gateway.tar", "gantry.test/gateway:1", &["test-gateway"]));
    let never_ready = ["test-gateway", "--never-ready"];
    node.import(&image(&dir, "never-ready.tar", "gantry.test/never-ready:1", &never_ready));

    // The store's claim is met by a volume on this node.
    let volume = dir.join("store-volume");
    std::fs::create_dir_all(&volume).unwrap();
    let _ = Command::new("chmod").arg("0777").arg(&volume).status();
    let pv = format!(
        r#"{{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {{"name": "store-data"}},
 "spec": {{"capacity": {{"storage": "1Gi"}}, "accessModes": ["ReadWriteOnce"], "hostPath": {{"path": "{}"}}}}}}"#,
        volume.display()
    );
    node.kubectl_stdin(&["apply", "-f", "-"], &pv);
    // deploy/overlays/dev as the README applies it, the image substituted
    // by kustomize.
    let patch = "  - target: {kind: Deployment, name: gateway-reconciler}\n    patch: |-\n\
                 \x20     - op: add\n        path: /spec/template/spec/containers/0/args/-\n        value: --progress-deadline=15s\n";
    node.apply_overlay(&dir, "dev", "gantry.test/gantry", patch);
    for app in ["gateway-store", "gateway-reconciler"] {
        let selector = format!("app.kubernetes.io/name={app}");
        node.wait_pods_ready("gantry", &selector, 1, Duration::from_secs(180));
    }
    let holder = node.wait_for(
        "the reconciler to hold the Lease",
        Duration::from_secs(60),
        &["-n", "gantry", "get", "lease", "-o", "jsonpath={.items[*].spec.holderIdentity}"],
        |s| s.contains("gateway-reconciler"),
    );
    assert!(!holder.is_empty());

    // The README's way in: port-forward, then gatewayctl.
    let (mut forward, port) = node.port_forward("gantry", "svc/gateway-store", 50051);
    let tokens =
        std::fs::read_to_string(workspace_root().join("deploy/overlays/dev/dev-tokens.csv"))
            .unwrap();
    let token = tokens
        .lines()
        .find(|l| l.contains(",admin"))
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .to_string();
    let ctl = |args: &[&str]| {
        gantry_testkit::ctl::ctl_command(
            &[&["--server", &format!("http://127.0.0.1:{port}"), "--token", &token], args].concat(),
        )
        .output()
        .unwrap()
    };
    create_gateway(&ctl, "demo", "gantry.test/gateway:1");
    wait_phase(&node, &ctl, "demo", "RUNNING");
    // RUNNING only once the pods are Ready.
    let ready = node.kubectl(&[
        "-n",
        "gantry-gateways",
        "get",
        "pods",
        "-o",
        "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
    ]);
    assert_eq!(ready, "True", "RUNNING with pods not Ready");
    let cluster_ip = service_ip(&node, "gantry-gateways", "demo");
    let page = page_with(&format!("http://{cluster_ip}:443/"), "gantry test gateway").await;
    assert!(
        page.contains("gantry test gateway"),
        "through the gateway's Service {cluster_ip}: {page:?}\n{}\n{}",
        node.kubectl(&["-n", "gantry-gateways", "get", "svc,endpointslices,pods", "-o", "wide"]),
        node.diagnostics()
    );
    // Inside the gateway's container: non-root, and the root filesystem
    // refuses writes.
    let exec = |args: &[&str]| {
        node.kubectl_output(
            &[&["-n", "gantry-gateways", "exec", "deploy/demo", "-c", "gateway", "--"], args]
                .concat(),
        )
    };
    let id = exec(&["/bin/busybox", "id", "-u"]);
    assert_eq!(
        String::from_utf8_lossy(&id.stdout).trim(),
        "65532",
        "{}",
        String::from_utf8_lossy(&id.stderr)
    );
    let touched = exec(&["/bin/busybox", "touch", "/written"]);
    assert!(!touched.status.success(), "a write to / succeeded");
    assert!(
        String::from_utf8_lossy(&touched.stderr).contains("Read-only file system"),
        "{touched:?}"
    );

    // The reconciler's pod deleted: its replacement takes the Lease and
    // converges a change made meanwhile.
    let old = node.kubectl(&[
        "-n",
        "gantry",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=gateway-reconciler",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    node.kubectl(&["-n", "gantry", "delete", "pod", &old, "--wait=false"]);
    let scaled = ctl(&["scale", "demo", "--replicas=2"]);
    assert!(scaled.status.success(), "{}", String::from_utf8_lossy(&scaled.stderr));
    node.wait_for(
        "a new reconciler to hold the Lease",
        Duration::from_secs(120),
        &["-n", "gantry", "get", "lease", "-o", "jsonpath={.items[*].spec.holderIdentity}"],
        |holder| holder.contains("gateway-reconciler") && !holder.contains(&old),
    );
    let converged = ctl(&["wait", "demo", "--for=converged", "--timeout=240s"]);
    assert!(
        converged.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&converged.stderr),
        node.diagnostics()
    );
    node.wait_for(
        "two Ready gateway pods",
        Duration::from_secs(120),
        &[
            "-n",
            "gantry-gateways",
            "get",
            "pods",
            "-o",
            "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
        ],
        |s| s == "True True",
    );

    // A gateway whose pods never become Ready ends DEGRADED with the
    // Deployment's ProgressDeadlineExceeded, as on kwok (the reconciler
    // runs with --progress-deadline=15s here).
    create_gateway(&ctl, "stuck", "gantry.test/never-ready:1");
    wait_phase(&node, &ctl, "stuck", "DEGRADED");
    let shown = ctl(&["get", "stuck", "-o", "json"]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let conditions = shown["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let stalled = conditions.iter().find(|c| c["type"] == "Stalled");
    assert_eq!(
        stalled.map(|c| c["reason"].clone()),
        Some("ProgressDeadlineExceeded".into()),
        "{shown}"
    );
    let _ = forward.kill();
    let _ = forward.wait();

    // `kubectl rollout restart` of the store (Recreate: it is away for a
    // while) under a client writing through its Service: every write it
    // was told succeeded is there afterwards, and its retries are bounded.
    let store_ip = service_ip(&node, "gantry", "gateway-store");
    let client = gantry_client::ClientConfig {
        endpoint: format!("http://{store_ip}:50051"),
        token: Some(token.clone()),
        ..Default::default()
    }
    .connect_lazy()
    .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = tokio::spawn(write_until(client.clone(), stop.clone(), written.clone()));
    // The old store's container, watched to its end: it must stop on
    // SIGTERM by itself (exit code 0), within its grace period (else the
    // kubelet's SIGKILL: 137).
    let old_store = node.kubectl(&[
        "-n",
        "gantry",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=gateway-store",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let mut watch = Command::new(gantry_testkit::k8s::kubectl().unwrap())
        .arg("--kubeconfig")
        .arg(&node.admin_kubeconfig)
        .args([
            "-n",
            "gantry",
            "get",
            "pod",
            &old_store,
            "-w",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.terminated.exitCode}{\"\\n\"}",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its log, followed to the end: the last lines say it stopped.
    let log = follow(&node, &["-n", "gantry", "logs", "-f", &old_store]);
    node.kubectl(&["-n", "gantry", "rollout", "restart", "deploy/gateway-store"]);
    node.kubectl(&["-n", "gantry", "rollout", "status", "deploy/gateway-store", "--timeout=240s"]);
    // A few writes to the new store too.
    let after = written.load(std::sync::atomic::Ordering::SeqCst);
    gantry_testkit::eventually(Duration::from_secs(120), "writes after the restart", || {
        let written = written.clone();
        async move { written.load(std::sync::atomic::Ordering::SeqCst) >= after + 3 }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = watch.kill();
    let watched = String::from_utf8_lossy(&watch.wait_with_output().unwrap().stdout).into_owned();
    let codes: Vec<&str> = watched.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(codes.last(), Some(&"0"), "the old store's exit codes as watched: {codes:?}");
    let log = log.recv_timeout(Duration::from_secs(60)).expect("the old store's log to end");
    for line in ["shutting down: draining in-flight requests", "gateway-store stopped"] {
        assert!(log.contains(line), "the old store's log has no {line:?}:\n{log}");
    }
    let (acked, retries) = writer.await.unwrap();
    assert!(acked.len() >= 5, "too few writes to tell: {acked:?}");
    let stored = stored_names(&client).await;
    let lost: Vec<&String> = acked.iter().filter(|name| !stored.contains(*name)).collect();
    assert!(lost.is_empty(), "acknowledged and lost across the restart: {lost:?}");
    // Each write's retries end within its bound (write_until); say how many.
    eprintln!("{} writes across the restart, {retries} failed attempts retried", acked.len());
    let _ = std::fs::remove_dir_all(dir);
}

/// deploy/overlays/postgres as the README deploys it, with the Secrets
/// made the README's way: two stores on the harness's PostgreSQL behind
/// TLS whose certificate names the Service, the reconciler reaching them
/// by that name; a `kill -9` of one store under a writing client loses no
/// acknowledged write, and the reconciler converges a change after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_overlay_runs_two_stores_behind_tls_and_a_killed_one_loses_no_write() {
    let Some(db) = gantry_testkit::TestDatabase::postgres().await else { return };
    let Some(node) = tokio::task::block_in_place(RealNode::start) else { return };
    let dir = temp_dir("real-node-postgres");
    node.import(&gantry_image(&dir, "gantry.test/gantry"));
    node.import(&image(&dir, "gateway.tar", "gantry.test/gateway:1", &["test-gateway"]));

    // The Secrets, as the README has operators make them.
    let admin = format!("{:032x}", fastrand::u128(..));
    let file = |name: &str, content: &str| {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    };
    // People's tokens only: the reconciler presents its service-account
    // token.
    let tokens = file("tokens.csv", &format!("{admin},admin,admin\n"));
    let service_names = ["gateway-store", "gateway-store.gantry.svc", "localhost"];
    let (ca, cert, key) =
        gantry_testkit::server_certificate("gateway-store.gantry.svc", &service_names, &[]);
    let (ca, cert, key) =
        (file("ca.crt", &ca), file("server.crt", &cert), file("server.key", &key));
    // The database, reached from the pods through the node's address.
    let (scheme_user, rest) = db.url.split_once('@').unwrap();
    let (host_port, database) = rest.split_once('/').unwrap();
    let to = std::net::ToSocketAddrs::to_socket_addrs(host_port).unwrap().next().unwrap();
    let url = format!("{scheme_user}@{}/{database}", node.expose(to));
    node.kubectl(&["create", "namespace", "gantry"]);
    let secret = |args: &[&str]| {
        node.kubectl(&[&["-n", "gantry", "create", "secret", "generic"], args].concat());
    };
    secret(&["gantry-store-tokens", &format!("--from-file=tokens.csv={tokens}")]);
    secret(&[
        "gantry-store-tls",
        &format!("--from-file=tls.crt={cert}"),
        &format!("--from-file=tls.key={key}"),
        &format!("--from-file=ca.crt={ca}"),
    ]);
    secret(&["gantry-store-database", &format!("--from-literal=url={url}")]);

    node.apply_overlay(&dir, "postgres", "gantry.test/gantry", "");
    let stores = "app.kubernetes.io/name=gateway-store";
    node.wait_pods_ready("gantry", stores, 2, Duration::from_secs(180));
    let reconcilers = "app.kubernetes.io/name=gateway-reconciler";
    node.wait_pods_ready("gantry", reconcilers, 1, Duration::from_secs(180));
    node.wait_for(
        "the reconciler to hold the Lease",
        Duration::from_secs(60),
        &["-n", "gantry", "get", "lease", "-o", "jsonpath={.items[*].spec.holderIdentity}"],
        |s| s.contains("gateway-reconciler"),
    );

    // gatewayctl through port-forward, over TLS checked against the CA.
    let (mut forward, port) = node.port_forward("gantry", "svc/gateway-store", 50051);
    let server = format!("https://localhost:{port}");
    let ctl = |args: &[&str]| {
        let common = ["--server", &server, "--ca", &ca, "--token", &admin];
        gantry_testkit::ctl::ctl_command(&[&common[..], args].concat()).output().unwrap()
    };
    create_gateway(&ctl, "demo", "gantry.test/gateway:1");
    wait_phase(&node, &ctl, "demo", "RUNNING");
    let _ = forward.kill();
    let _ = forward.wait();

    // A client writing through the Service's ClusterIP (TLS checked
    // against the Service's name) while one store is killed.
    let store_ip = service_ip(&node, "gantry", "gateway-store");
    let client = gantry_client::ClientConfig {
        endpoint: format!("https://{store_ip}:50051"),
        token: Some(admin.clone()),
        ca_pem: Some(std::fs::read(&ca).unwrap()),
        tls_domain: Some("gateway-store.gantry.svc".into()),
        ..Default::default()
    }
    .connect_lazy()
    .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = tokio::spawn(write_until(client.clone(), stop.clone(), written.clone()));
    let writes = |at_least: usize| {
        let written = written.clone();
        gantry_testkit::eventually(Duration::from_secs(120), "writes", move || {
            let written = written.clone();
            async move { written.load(std::sync::atomic::Ordering::SeqCst) >= at_least }
        })
    };
    writes(5).await;
    let pids = Command::new("pgrep").args(["-f", "gateway-store --listen=0.0.0.0:50051"]).output();
    let pids = String::from_utf8_lossy(&pids.unwrap().stdout).into_owned();
    let pids: Vec<&str> = pids.split_whitespace().collect();
    assert_eq!(pids.len(), 2, "the two stores' processes: {pids:?}");
    assert!(Command::new("kill").args(["-9", pids[0]]).status().unwrap().success());
    node.wait_for(
        "the kubelet to restart the killed store",
        Duration::from_secs(120),
        &[
            "-n",
            "gantry",
            "get",
            "pods",
            "-l",
            stores,
            "-o",
            "jsonpath={.items[*].status.containerStatuses[0].restartCount}",
        ],
        |s| {
            let mut counts: Vec<&str> = s.split_whitespace().collect();
            counts.sort_unstable();
            counts == ["0", "1"]
        },
    );
    node.wait_pods_ready("gantry", stores, 2, Duration::from_secs(120));
    let after = written.load(std::sync::atomic::Ordering::SeqCst);
    writes(after + 3).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (acked, retries) = writer.await.unwrap();
    let stored = stored_names(&client).await;
    let lost: Vec<&String> = acked.iter().filter(|name| !stored.contains(*name)).collect();
    assert!(lost.is_empty(), "acknowledged and lost to the kill: {lost:?}");
    eprintln!("{} writes across the kill, {retries} failed attempts retried", acked.len());

    // The reconciler still follows the store: a change after the kill
    // converges.
    let (mut forward, port) = node.port_forward("gantry", "svc/gateway-store", 50051);
    let server = format!("https://localhost:{port}");
    let ctl = |args: &[&str]| {
        let common = ["--server", &server, "--ca", &ca, "--token", &admin];
        gantry_testkit::ctl::ctl_command(&[&common[..], args].concat()).output().unwrap()
    };
    let scaled = ctl(&["scale", "demo", "--replicas=2"]);
    assert!(scaled.status.success(), "{}", String::from_utf8_lossy(&scaled.stderr));
    let converged = ctl(&["wait", "demo", "--for=converged", "--timeout=240s"]);
    assert!(
        converged.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&converged.stderr),
        node.diagnostics()
    );
    node.wait_pods_ready("gantry-gateways", "gantry.dev/gateway=demo", 2, Duration::from_secs(120));
    let _ = forward.kill();
    let _ = forward.wait();
    drop(node);
    db.drop_database().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// gatewayctl, as a test runs it.
type Gatewayctl<'a> = dyn Fn(&[&str]) -> std::process::Output + 'a;

/// `gatewayctl create gateway NAME` with `image` (the test gateway as its
/// supervisor), one replica.
fn create_gateway(ctl: &Gatewayctl<'_>, name: &str, image: &str) {
    let created = ctl(&[
        "create",
        "gateway",
        name,
        "--image",
        image,
        "--supervisor-image",
        "gantry.test/gateway:1",
        "--replicas",
        "1",
    ]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
}

/// `gatewayctl wait` until the store reports `name` in `phase` (4 minutes
/// at most; the node's state on failure).
fn wait_phase(node: &RealNode, ctl: &Gatewayctl<'_>, name: &str, phase: &str) {
    let wanted = format!("--for=jsonpath={{.status.phase}}={phase}");
    let waited = ctl(&["wait", name, &wanted, "--timeout=240s"]);
    assert!(
        waited.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&waited.stderr),
        node.diagnostics()
    );
}

/// The ClusterIP of a Service.
fn service_ip(node: &RealNode, namespace: &str, name: &str) -> String {
    node.kubectl(&["-n", namespace, "get", "svc", name, "-o", "jsonpath={.spec.clusterIP}"])
}

/// The output of kubectl `args` (as the admin) once it ends by itself.
fn follow(node: &RealNode, args: &[&str]) -> std::sync::mpsc::Receiver<String> {
    let child = Command::new(gantry_testkit::k8s::kubectl().unwrap())
        .arg("--kubeconfig")
        .arg(&node.admin_kubeconfig)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let out = child.wait_with_output().map(|o| o.stdout).unwrap_or_default();
        let _ = send.send(String::from_utf8_lossy(&out).into_owned());
    });
    receive
}

/// Creates gateways one after another until `stop`, counting them in
/// `written` (each retried until the store answers: an ALREADY_EXISTS
/// after a lost answer means it landed); the names acknowledged and the
/// attempts that failed.
async fn write_until(
    client: gantry_client::GatewayClient,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    written: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> (Vec<String>, usize) {
    use std::sync::atomic::Ordering::SeqCst;
    let (mut acked, failed) = (Vec::new(), std::sync::atomic::AtomicUsize::new(0));
    for i in 0.. {
        if stop.load(SeqCst) {
            break;
        }
        let name = format!("w-{i}");
        let mut gateway =
            gantry_testkit::gateway::named(&name).image("gantry.test/gateway:1").build();
        gateway.spec.as_mut().unwrap().replicas = Some(0);
        gantry_testkit::eventually_some(
            Duration::from_secs(180),
            "the store to take a write",
            || {
                let (mut client, gateway, failed) = (client.clone(), gateway.clone(), &failed);
                async move {
                    let request = gantry_api::v1::CreateGatewayRequest {
                        gateway: Some(gateway),
                        validate_only: false,
                    };
                    match client.create_gateway(request).await {
                        Ok(_) => Some(()),
                        Err(status) if status.code() == tonic::Code::AlreadyExists => Some(()),
                        Err(_) => {
                            failed.fetch_add(1, SeqCst);
                            None
                        }
                    }
                }
            },
        )
        .await;
        acked.push(name);
        written.fetch_add(1, SeqCst);
    }
    (acked, failed.into_inner())
}

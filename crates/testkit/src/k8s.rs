//! A real Kubernetes control plane for tests, as controller-runtime's
//! envtest gives Go controllers, plus fake nodes so Deployments roll out:
//!
//! ```text
//!  etcd ◄── kube-apiserver (TLS, token identities, RBAC, audit log)
//!                ▲      ▲              ▲                ▲
//!   kube-controller-manager   kube-scheduler   kwok (nodes and pods Ready)
//!   (deployment, replicaset, garbage
//!    collector, namespace, serviceaccount,
//!    persistent-volume binder)
//! ```
//!
//! The binaries are built from the Go modules pinned in `tests/k8s/tools`
//! by `tests/k8s/setup.sh k8s`. [`ControlPlane::shared`] starts one plane
//! per test binary (tests take a namespace each) and answers `None`, with
//! one `SKIPPED` line, when the binaries are absent and `CI` is not set.
//! Every process of a plane is in one process group, stopped on drop and
//! by a watchdog when the test process exits.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::certs::server_certificate;
use crate::env::{free_port, in_ci, skipped, temp_dir, workspace_root};

/// The user the reconciler runs as: the ServiceAccount deploy/ binds its
/// Role to, presented as a static token.
pub const RECONCILER_USER: &str = "system:serviceaccount:gantry:gateway-reconciler";
/// The image whose pods kwok never makes Ready (tests/k8s/kwok-stages.yaml).
pub const NEVER_READY_IMAGE: &str = "registry.invalid/never-ready:1";

const BINARIES: [&str; 6] =
    ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl"];

pub(crate) fn k8s_dir() -> PathBuf {
    workspace_root().join("tests/k8s")
}

/// The directory with the control plane's binaries: `GANTRY_K8S_BIN`, or
/// where `tests/k8s/setup.sh k8s` builds them for the pinned versions.
/// `None` (with one `SKIPPED` line) when they are not all there, a panic
/// under `CI=true`.
pub fn bin_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = match std::env::var_os("GANTRY_K8S_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let out = Command::new("bash")
                    .arg(k8s_dir().join("setup.sh"))
                    .arg("bin-dir")
                    .output()
                    .ok()
                    .filter(|o| o.status.success());
                match out {
                    Some(o) => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
                    None => PathBuf::from("/nonexistent"),
                }
            }
        };
        let missing: Vec<_> = BINARIES.iter().filter(|b| !dir.join(b).is_file()).collect();
        if missing.is_empty() {
            return Some(dir);
        }
        assert!(
            !in_ci(),
            "CI=true but the Kubernetes binaries {missing:?} are not in {}: run tests/k8s/setup.sh",
            dir.display()
        );
        skipped(&format!(
            "Kubernetes binaries {missing:?} not in {} (build them with tests/k8s/setup.sh k8s)",
            dir.display()
        ));
        None
    })
    .clone()
}

/// kubectl from the pinned release (see [`bin_dir`]).
pub fn kubectl() -> Option<PathBuf> {
    bin_dir().map(|d| d.join("kubectl"))
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    bin: PathBuf,
    /// Process group of every component.
    group: Option<u32>,
    children: Vec<Child>,
    /// Stops the group when the test process exits without a drop.
    watchdog: Option<Child>,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// Kubeconfig of a cluster admin (`system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// Kubeconfig of [`RECONCILER_USER`].
    pub reconciler_kubeconfig: PathBuf,
    /// The API server's audit log (JSON lines, one per request).
    pub audit_log: PathBuf,
    namespaces: AtomicUsize,
}

struct Certs {
    ca_pem: String,
    server_cert_pem: String,
    server_key_pem: String,
    service_account_key_pem: String,
    service_account_public_pem: String,
}

fn certificates() -> Certs {
    let (ca_pem, server_cert_pem, server_key_pem) = server_certificate(
        "kube-apiserver",
        &["localhost", "kubernetes", "kubernetes.default.svc"],
        &[[127, 0, 0, 1], [10, 0, 0, 1]],
    );
    let service_account_key = rcgen::KeyPair::generate().expect("service-account signing key");
    Certs {
        ca_pem,
        server_cert_pem,
        server_key_pem,
        service_account_key_pem: service_account_key.serialize_pem(),
        service_account_public_pem: service_account_key.public_key_pem(),
    }
}

/// A test etcd on free loopback ports with its data in `data_dir`: its
/// client URL and its arguments.
pub(crate) fn etcd(data_dir: &Path) -> (String, Vec<String>) {
    let (client, peer) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{client}");
    let args = vec![
        "--name=default".into(),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={url}"),
        format!("--advertise-client-urls={url}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-cluster=default=http://127.0.0.1:{peer}"),
        "--unsafe-no-fsync".into(),
        "--log-level=warn".into(),
    ];
    (url, args)
}

/// The flags kube-controller-manager and kube-scheduler share in a test
/// plane: the admin's kubeconfig for everything, no leader election, a
/// free loopback port, certificates in `cert_dir`, no profiling.
pub(crate) fn controller_args(kubeconfig: &Path, cert_dir: &Path) -> Vec<String> {
    let admin = kubeconfig.display();
    vec![
        format!("--kubeconfig={admin}"),
        format!("--authentication-kubeconfig={admin}"),
        format!("--authorization-kubeconfig={admin}"),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", free_port()),
        format!("--cert-dir={}", cert_dir.display()),
        "--profiling=false".into(),
    ]
}

pub(crate) fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

pub(crate) fn kubeconfig(url: &str, ca: &Path, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority: {}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context: {{cluster: test, user: {user}}}\ncurrent-context: test\n",
        ca.display()
    )
}

impl ControlPlane {
    /// The plane shared by the tests of this test binary, started on first
    /// use; `None` when the binaries are absent (see [`bin_dir`]).
    pub fn shared() -> Option<&'static ControlPlane> {
        static PLANE: OnceLock<Option<ControlPlane>> = OnceLock::new();
        PLANE.get_or_init(|| bin_dir().map(|bin| ControlPlane::start(&bin))).as_ref()
    }

    /// Starts a plane of its own (most tests use [`ControlPlane::shared`]).
    pub fn start(bin: &Path) -> ControlPlane {
        let started = Instant::now();
        let dir = temp_dir("k8s");
        let certs = certificates();
        let path = |name: &str| dir.join(name);
        write(&path("ca.crt"), &certs.ca_pem);
        write(&path("apiserver.crt"), &certs.server_cert_pem);
        write(&path("apiserver.key"), &certs.server_key_pem);
        write(&path("sa.key"), &certs.service_account_key_pem);
        write(&path("sa.pub"), &certs.service_account_public_pem);
        let admin_token = uuid::Uuid::new_v4().simple().to_string();
        let reconciler_token = uuid::Uuid::new_v4().simple().to_string();
        write(
            &path("tokens.csv"),
            &format!(
                "{admin_token},admin,admin,\"system:masters\"\n{reconciler_token},{RECONCILER_USER},gateway-reconciler,\"system:serviceaccounts,system:serviceaccounts:gantry\"\n"
            ),
        );
        write(
            &path("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        );
        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let admin_kubeconfig = path("admin.kubeconfig");
        let reconciler_kubeconfig = path("reconciler.kubeconfig");
        write(&admin_kubeconfig, &kubeconfig(&url, &path("ca.crt"), "admin", &admin_token));
        write(
            &reconciler_kubeconfig,
            &kubeconfig(&url, &path("ca.crt"), "gateway-reconciler", &reconciler_token),
        );

        let mut plane = ControlPlane {
            bin: bin.to_path_buf(),
            group: None,
            children: Vec::new(),
            watchdog: None,
            url,
            admin_kubeconfig,
            reconciler_kubeconfig,
            audit_log: path("audit.log"),
            namespaces: AtomicUsize::new(0),
            dir: dir.clone(),
        };
        plane.spawn_etcd_and_apiserver(port);
        plane.wait_ready(started);
        plane.spawn_controllers();
        plane.add_kwok_node();
        eprintln!("control plane at {} ready in {:?}", plane.url, started.elapsed());
        plane
    }

    /// etcd and kube-apiserver (TLS on `port`, tokens, RBAC, audit log).
    fn spawn_etcd_and_apiserver(&mut self, port: u16) {
        let (etcd_url, etcd_args) = etcd(&self.dir.join("etcd"));
        self.spawn("etcd", &etcd_args);
        self.spawn(
            "kube-apiserver",
            &[
                format!("--etcd-servers={etcd_url}"),
                format!("--secure-port={port}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--cert-dir={}", self.dir.join("apiserver-certs").display()),
                format!("--tls-cert-file={}", self.dir.join("apiserver.crt").display()),
                format!("--tls-private-key-file={}", self.dir.join("apiserver.key").display()),
                format!("--client-ca-file={}", self.dir.join("ca.crt").display()),
                format!("--token-auth-file={}", self.dir.join("tokens.csv").display()),
                "--authorization-mode=RBAC".into(),
                "--anonymous-auth=false".into(),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={}", self.dir.join("sa.pub").display()),
                format!("--service-account-signing-key-file={}", self.dir.join("sa.key").display()),
                // Room for a benchmark fleet of Services (gantry-bench --cluster real).
                "--service-cluster-ip-range=10.0.0.0/16".into(),
                format!("--audit-policy-file={}", self.dir.join("audit-policy.yaml").display()),
                format!("--audit-log-path={}", self.dir.join("audit.log").display()),
                "--audit-log-mode=blocking".into(),
                "--enable-priority-and-fairness=false".into(),
                // ConfigMaps are watched straight from etcd, whose history
                // is compacted every second: a watch from an old
                // resourceVersion gets 410 Gone, as on a busy cluster.
                "--watch-cache-sizes=configmaps#0".into(),
                "--etcd-compaction-interval=1s".into(),
                "--profiling=false".into(),
            ],
        );
    }

    /// kube-controller-manager (deployments, replica sets, garbage
    /// collection, namespaces, service accounts), kube-scheduler and kwok.
    fn spawn_controllers(&mut self) {
        let admin = self.admin_kubeconfig.display().to_string();
        self.spawn(
        "kube-controller-manager",
        &[
            format!("--kubeconfig={admin}"),
            format!("--authentication-kubeconfig={admin}"),
            format!("--authorization-kubeconfig={admin}"),
            "--controllers=deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller,persistentvolume-binder-controller".into(),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()),
            format!("--cert-dir={}", self.dir.join("kcm-certs").display()),
            format!("--root-ca-file={}", self.dir.join("ca.crt").display()),
            "--use-service-account-credentials=false".into(),
            "--concurrent-deployment-syncs=10".into(),
            "--concurrent-replicaset-syncs=10".into(),
            "--profiling=false".into(),
        ],
    );
        self.spawn(
            "kube-scheduler",
            &controller_args(&self.admin_kubeconfig, &self.dir.join("scheduler-certs")),
        );
        self.spawn(
            "kwok",
            &[
                format!("--kubeconfig={admin}"),
                format!("--config={}", k8s_dir().join("kwok-stages.yaml").display()),
                "--manage-all-nodes=true".into(),
                format!("--server-address=127.0.0.1:{}", free_port()),
                "--cidr=10.1.0.1/16".into(),
                "--node-ip=10.1.0.1".into(),
            ],
        );
    }

    /// kwok's node, Ready and without the not-ready taint.
    fn add_kwok_node(&self) {
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "kwok-node-0", "labels": {"type": "kwok"},
                          "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
            "status": {"allocatable": {"cpu": "1k", "memory": "1Ti", "pods": "20k"},
                        "capacity": {"cpu": "1k", "memory": "1Ti", "pods": "20k"}},
        });
        self.kubectl_stdin(&["apply", "-f", "-"], &node.to_string());
        self.wait_for(
            "the kwok node to be Ready",
            Duration::from_secs(60),
            &[
                "get",
                "node",
                "kwok-node-0",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
            |out| out == "True",
        );
        // The API server taints a new node not-ready; the node lifecycle
        // controller (not run: kwok nodes send no heartbeats) would lift it.
        self.kubectl(&["taint", "node", "kwok-node-0", "node.kubernetes.io/not-ready:NoSchedule-"]);
    }

    fn spawn(&mut self, name: &str, args: &[String]) {
        use std::os::unix::process::CommandExt;
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).expect("log file");
        let mut command = Command::new(self.bin.join(name));
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .process_group(self.group.map_or(0, |g| g as i32));
        let child = command.spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
        if self.group.is_none() {
            self.group = Some(child.id());
            // Stops the plane when the test process exits without dropping
            // it (a shared plane lives in a static, which is never dropped).
            // It joins the plane's group, so whatever stops the test's own
            // group leaves it running; the API server may outlive a TERM
            // once etcd is gone, hence the KILL after a grace period. The
            // etcd data (over 100 MB) goes too; the logs stay for a look.
            // (`sh` may be dash, whose `kill` refuses `--`: a group is
            // named as a negative pid after the signal.)
            let watchdog = format!(
                "trap '' TERM; while kill -0 {} 2>/dev/null; do sleep 1; done; kill -TERM -{group} 2>/dev/null; sleep 5; rm -rf '{etcd}'; kill -KILL -{group} 2>/dev/null",
                std::process::id(),
                group = child.id(),
                etcd = self.dir.join("etcd").display()
            );
            let watchdog = Command::new("sh")
                .args(["-c", &watchdog])
                .process_group(i32::try_from(child.id()).unwrap_or(0))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the control plane's watchdog");
            self.watchdog = Some(watchdog);
        }
        self.children.push(child);
    }

    /// The PEM key the API server signs service-account tokens with.
    pub fn service_account_key(&self) -> String {
        std::fs::read_to_string(self.dir.join("sa.key")).expect("the plane's service-account key")
    }

    /// The log of one component (`kube-apiserver`, `kwok`, ...).
    pub fn component_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    fn wait_ready(&mut self, started: Instant) {
        let deadline = started + Duration::from_secs(90);
        loop {
            let out = self.kubectl_output(&["get", "--raw", "/readyz"]);
            if out.status.success() {
                return;
            }
            for child in &mut self.children {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "a control-plane component exited ({status}); etcd log:\n{}\nkube-apiserver log:\n{}",
                        self.component_log("etcd"),
                        tail(&self.component_log("kube-apiserver"), 40)
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready within 90 s; its log:\n{}",
                tail(&self.component_log("kube-apiserver"), 40)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// kubectl as the admin, with `args`.
    fn admin_kubectl(&self, args: &[&str]) -> Command {
        let mut command = Command::new(self.bin.join("kubectl"));
        command.arg("--kubeconfig").arg(&self.admin_kubeconfig).args(args);
        command
    }

    /// Runs kubectl as the admin; its output whether it failed or not.
    pub fn kubectl_output(&self, args: &[&str]) -> Output {
        self.admin_kubectl(args).output().expect("run kubectl")
    }

    /// Runs kubectl as the admin and returns its stdout; panics with its
    /// stderr on failure.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_output(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl as the admin with `input` on stdin; panics with its
    /// stderr on failure.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Output {
        let out = self.kubectl_stdin_output(args, input);
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs kubectl as the admin with `input` on stdin; its output whether
    /// it failed or not.
    pub fn kubectl_stdin_output(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write;
        let mut child = self
            .admin_kubectl(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
        child.wait_with_output().expect("kubectl output")
    }

    /// Polls `kubectl args` until `done(stdout)`, for at most `timeout`.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        args: &[&str],
        done: impl Fn(&str) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            let out = self.kubectl_output(args);
            last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if out.status.success() && done(String::from_utf8_lossy(&out.stdout).trim()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("timed out after {timeout:?} waiting for {what}; last answer: {last}");
    }

    /// A kube-rs client from a kubeconfig of this plane.
    pub async fn client(&self, kubeconfig: &Path) -> kube::Client {
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(kubeconfig).expect("read kubeconfig"),
            &options,
        )
        .await
        .expect("kubeconfig");
        kube::Client::try_from(config).expect("kube client")
    }

    /// A fresh namespace, labelled to enforce the `restricted` Pod Security
    /// Standard (and to warn of it on workloads, whose pod templates
    /// `enforce` alone does not check), holding deploy/'s reconciler Role
    /// and RoleBinding (and nothing else for the reconciler's identity).
    pub fn namespace(&self, prefix: &str) -> String {
        let n = self.namespaces.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{n}");
        let namespace = serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/warn": "restricted",
            }},
        });
        self.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &namespace.to_string());
        let rbac: Vec<Value> = self
            .render("base")
            .into_iter()
            .filter(|o| matches!(o["kind"].as_str(), Some("Role" | "RoleBinding")))
            .filter(|o| {
                o["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("gateway-reconciler"))
            })
            .map(|mut o| {
                o["metadata"]["namespace"] = Value::from(name.clone());
                o
            })
            .collect();
        assert_eq!(
            rbac.len(),
            4,
            "deploy/base has the reconciler's Roles and RoleBindings (gateways' objects, Lease)"
        );
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": rbac});
        self.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &list.to_string());
        name
    }

    /// deploy/ rendered by kustomize: `base` or an overlay's name.
    pub fn render(&self, what: &str) -> Vec<Value> {
        kustomize(&self.bin.join("kubectl"), what)
    }

    /// Every audit event so far (JSON objects, `ResponseComplete` stage).
    pub fn audit_events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.audit_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// deploy/ rendered by `kubectl kustomize`: `base` or an overlay's name.
pub fn kustomize(kubectl: &Path, what: &str) -> Vec<Value> {
    let deploy = workspace_root().join("deploy");
    let dir = if what == "base" { deploy.join("base") } else { deploy.join("overlays").join(what) };
    let out = Command::new(kubectl).arg("kustomize").arg(&dir).output().expect("run kubectl");
    assert!(out.status.success(), "kustomize {what}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("kustomize {what}: {e}"))
}

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(group) = self.group {
            let _ = Command::new("kill").args(["-TERM", "--", &format!("-{group}")]).status();
        }
        for child in self.children.iter_mut().chain(self.watchdog.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("control plane logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// grpcurl built by `tests/k8s/setup.sh grpcurl` (`GANTRY_GRPCURL`
/// overrides). `None` (with one `SKIPPED` line) when it is not there, a
/// panic under `CI=true`.
pub fn grpcurl() -> Option<PathBuf> {
    let path = match std::env::var_os("GANTRY_GRPCURL") {
        Some(path) => PathBuf::from(path),
        None => Command::new("bash")
            .arg(k8s_dir().join("setup.sh"))
            .arg("grpcurl-bin")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map_or_else(
                || PathBuf::from("/nonexistent"),
                |o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
            ),
    };
    if path.is_file() {
        return Some(path);
    }
    assert!(!in_ci(), "CI=true but grpcurl is not at {}: run tests/k8s/setup.sh", path.display());
    skipped(&format!(
        "grpcurl not at {} (build it with tests/k8s/setup.sh grpcurl)",
        path.display()
    ));
    None
}

//! A real node for the tests that run containers: a control plane of its
//! own whose API server is bound and advertised on a bridge of this
//! machine, containerd (runc, the CNI bridge plugin), the kubelet and
//! kube-proxy, all from `tests/k8s/setup.sh all`. Images come from OCI
//! archives imported into containerd (no registry); the pod sandbox is
//! `gantry-image pause`.
//!
//! Every packet stays on the machine: the pod range (10.244.0.0/24) is the
//! bridge's own network, the Service range (10.96.0.0/16) is routed to the
//! bridge before anything starts, pods get no default route and no
//! masquerading. What the node changes on the host (the bridge and route,
//! iptables, network namespaces, sysctls, mounts, `/var/lib/kubelet`,
//! `/var/log/pods`, `/var/lib/cni`, `/run/containerd`) is recorded at
//! start and put back when the node is dropped, so a second run starts
//! clean. Facts behind the settings: `../shared/TOOLS.md` ("A real node").

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod deploy;
mod host;

use host::{cgroup_processes, kubepods, run, run_ok, unmount_under, HostState};

use crate::k8s::{bin_dir, k8s_dir, kubeconfig, tail, write};
use crate::{binary, free_port, in_ci, skipped, temp_dir};

/// The bridge the pods are on; its address is the node's.
pub(crate) const BRIDGE: &str = "gantry0";
/// The node's address (its bridge's), where the API server listens.
pub const NODE_IP: &str = "10.244.0.1";
const POD_CIDR: &str = "10.244.0.0/24";
const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The cluster DNS Service's address (CoreDNS).
const DNS_IP: &str = "10.96.0.10";
/// The name the node registers.
pub const NODE_NAME: &str = "gantry-node";
/// The sandbox image containerd runs for every pod.
const PAUSE_IMAGE: &str = "gantry.test/pause:1";
/// A real node and its control plane; stopped and undone when dropped.
#[derive(Debug)]
pub struct RealNode {
    dir: PathBuf,
    bin: PathBuf,
    children: Vec<(String, Child)>,
    host: HostState,
    /// Kubeconfig of a cluster admin.
    pub admin_kubeconfig: PathBuf,
    /// The containerd socket (for `ctr`).
    pub containerd_socket: PathBuf,
    /// One node at a time on this machine (tests of one binary run in
    /// parallel): held until the node is undone.
    _turn: std::sync::MutexGuard<'static, ()>,
}

static ONE_NODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What a real node needs on this machine; the reason when something is
/// missing.
fn missing_prerequisite(node_bin: &Path) -> Option<String> {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !is_root {
        return Some("not root (a node needs to create a bridge and run containers)".into());
    }
    for tool in ["containerd", "ctr", "runc", "iptables-save", "ip"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Some(format!("{tool} is not installed (tests/k8s/setup.sh node)"));
        }
    }
    for file in ["kubelet", "kube-proxy", "coredns"] {
        if !node_bin.join(file).is_file() {
            return Some(format!(
                "{file} is not in {} (tests/k8s/setup.sh node)",
                node_bin.display()
            ));
        }
    }
    None
}

fn node_bin() -> PathBuf {
    let out = Command::new("bash").arg(k8s_dir().join("setup.sh")).arg("node-bin").output();
    out.ok().filter(|o| o.status.success()).map_or_else(
        || PathBuf::from("/nonexistent"),
        |o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
    )
}

impl RealNode {
    /// Starts the node; `None` (with one `SKIPPED` line) when this machine
    /// cannot run one, a panic under `CI=true`.
    pub fn start() -> Option<RealNode> {
        let node_bin = node_bin();
        let reason = match bin_dir() {
            None => Some("the control plane's binaries are missing".to_string()),
            Some(_) => missing_prerequisite(&node_bin),
        };
        if let Some(reason) = reason {
            assert!(!in_ci(), "CI=true but no real node can start: {reason}");
            skipped(&format!("no real node: {reason}"));
            return None;
        }
        let bin = bin_dir()?;
        let turn = ONE_NODE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let started = Instant::now();
        // A node left by a killed run: undo what can be undone first.
        let _ = run("ip", &["link", "delete", BRIDGE]);
        let host = HostState::record();
        let dir = temp_dir("node");
        let mut node = RealNode {
            containerd_socket: dir.join("containerd/containerd.sock"),
            admin_kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            bin,
            children: Vec::new(),
            host,
            _turn: turn,
        };
        node.network();
        node.control_plane();
        node.containerd();
        node.import(&node.pause_image());
        node.kubelet(&node_bin);
        node.spawn(
            &node_bin.join("kube-proxy"),
            "kube-proxy",
            &[
                format!("--kubeconfig={}", node.admin_kubeconfig.display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--cluster-cidr={POD_CIDR}"),
                "--proxy-mode=iptables".into(),
                format!("--bind-address={NODE_IP}"),
                format!("--healthz-bind-address=127.0.0.1:{}", free_port()),
                format!("--metrics-bind-address=127.0.0.1:{}", free_port()),
            ],
        );
        node.wait_for(
            "the node to be Ready",
            Duration::from_secs(120),
            &[
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
            |out| out == "True",
        );
        node.dns(&node_bin);
        eprintln!("real node ready in {:?}", started.elapsed());
        Some(node)
    }

    /// The bridge (the node's address) and the route of the Service range
    /// to it, before anything can send a packet there.
    fn network(&self) {
        run_ok("ip", &["link", "add", BRIDGE, "type", "bridge"]);
        run_ok("ip", &["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE]);
        run_ok("ip", &["link", "set", BRIDGE, "up"]);
        run_ok("ip", &["route", "add", SERVICE_CIDR, "dev", BRIDGE]);
        let cni = self.dir.join("cni");
        std::fs::create_dir_all(&cni).expect("cni dir");
        let conf = serde_json::json!({
            "cniVersion": "1.0.0", "name": "gantry",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                "ipam": {"type": "host-local",
                          "ranges": [[{"subnet": POD_CIDR, "rangeStart": "10.244.0.10", "gateway": NODE_IP}]],
                          "routes": [{"dst": SERVICE_CIDR}],
                          "dataDir": self.dir.join("cni-ipam").display().to_string()},
            }],
        });
        write(&cni.join("10-gantry.conflist"), &conf.to_string());
    }

    /// etcd, kube-apiserver on the bridge, the controller manager and the
    /// scheduler.
    fn control_plane(&mut self) {
        let (ca, cert, key) = crate::server_certificate(
            "kube-apiserver",
            &["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            &[[127, 0, 0, 1], [10, 244, 0, 1], [10, 96, 0, 1]],
        );
        let sa = rcgen::KeyPair::generate().expect("service-account key");
        let dir = self.dir.clone();
        let path = |name: &str| dir.join(name);
        write(&path("ca.crt"), &ca);
        write(&path("apiserver.crt"), &cert);
        write(&path("apiserver.key"), &key);
        write(&path("sa.key"), &sa.serialize_pem());
        write(&path("sa.pub"), &sa.public_key_pem());
        let token = uuid::Uuid::new_v4().simple().to_string();
        write(&path("tokens.csv"), &format!("{token},admin,admin,\"system:masters\"\n"));
        let port = free_port();
        let url = format!("https://{NODE_IP}:{port}");
        write(&self.admin_kubeconfig, &kubeconfig(&url, &path("ca.crt"), "admin", &token));
        let (etcd, etcd_args) = crate::k8s::etcd(&path("etcd"));
        let d = |name: &str| path(name).display().to_string();
        self.spawn(&self.bin.join("etcd"), "etcd", &etcd_args);
        self.spawn(
            &self.bin.join("kube-apiserver"),
            "kube-apiserver",
            &[
                format!("--etcd-servers={etcd}"),
                format!("--secure-port={port}"),
                format!("--bind-address={NODE_IP}"),
                format!("--advertise-address={NODE_IP}"),
                format!("--cert-dir={}", d("apiserver-certs")),
                format!("--tls-cert-file={}", d("apiserver.crt")),
                format!("--tls-private-key-file={}", d("apiserver.key")),
                format!("--client-ca-file={}", d("ca.crt")),
                format!("--token-auth-file={}", d("tokens.csv")),
                "--authorization-mode=Node,RBAC".into(),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={}", d("sa.pub")),
                format!("--service-account-signing-key-file={}", d("sa.key")),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--allow-privileged=true".into(),
                // Else it resolves the node's name through this machine's resolver.
                "--kubelet-preferred-address-types=InternalIP".into(),
                "--profiling=false".into(),
            ],
        );
        self.wait_for(
            "the API server to be ready",
            Duration::from_secs(90),
            &["get", "--raw", "/readyz"],
            |out| out == "ok",
        );
        self.spawn(
            &self.bin.join("kube-controller-manager"),
            "kube-controller-manager",
            &[
                crate::k8s::controller_args(&self.admin_kubeconfig, &path("kcm-certs")),
                vec![
                    format!("--root-ca-file={}", d("ca.crt")),
                    format!("--service-account-private-key-file={}", d("sa.key")),
                    "--use-service-account-credentials=false".into(),
                ],
            ]
            .concat(),
        );
        self.spawn(
            &self.bin.join("kube-scheduler"),
            "kube-scheduler",
            &crate::k8s::controller_args(&self.admin_kubeconfig, &path("scheduler-certs")),
        );
    }

    /// containerd with a private configuration: no CAP_SYS_RESOURCE here,
    /// hence `restrict_oom_score_adj`.
    fn containerd(&mut self) {
        let dir = self.dir.clone();
        let d = |name: &str| dir.join(name).display().to_string();
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n[grpc]\n  address = \"{socket}\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{PAUSE_IMAGE}\"\n  restrict_oom_score_adj = true\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n  default_runtime_name = \"runc\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n  conf_dir = \"{cni}\"\n",
            root = d("containerd/root"),
            state = d("containerd/state"),
            socket = self.containerd_socket.display(),
            cni = d("cni"),
        );
        write(&self.dir.join("containerd.toml"), &config);
        let containerd = PathBuf::from("containerd");
        self.spawn(&containerd, "containerd", &[format!("--config={}", d("containerd.toml"))]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not start: {}",
                self.log("containerd")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// CoreDNS (from `setup.sh node`) as the cluster DNS: Services by
    /// name, nothing forwarded off the machine.
    fn dns(&self, node_bin: &Path) {
        let archive = self.dir.join("coredns.tar");
        let built = Command::new(binary("gantry-image"))
            .args([
                "--out",
                &archive.display().to_string(),
                "--name",
                "gantry.test/coredns",
                "--tag",
                "1",
            ])
            .args(["static", &node_bin.join("coredns").display().to_string()])
            .output()
            .expect("gantry-image");
        assert!(
            built.status.success(),
            "gantry-image static: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        self.import(&archive);
        let corefile = ".:1053 {\n    errors\n    ready :8181\n    kubernetes cluster.local in-addr.arpa ip6.arpa {\n        pods insecure\n    }\n    cache 30\n}\n";
        let manifests = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", "namespace": "kube-system"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "gantry-test:coredns"},
             "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                       {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "gantry-test:coredns"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gantry-test:coredns"},
             "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": "kube-system"},
             "data": {"Corefile": corefile}},
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", "namespace": "kube-system"},
             "spec": {"replicas": 1, "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
              "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}}, "spec": {
                "serviceAccountName": "coredns", "dnsPolicy": "Default",
                "containers": [{"name": "coredns", "image": "gantry.test/coredns:1", "imagePullPolicy": "Never",
                  "args": ["-conf", "/etc/coredns/Corefile"],
                  "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 1},
                  "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}]}],
                "volumes": [{"name": "config", "configMap": {"name": "coredns"}}]}}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", "namespace": "kube-system"},
             "spec": {"clusterIP": DNS_IP, "selector": {"k8s-app": "kube-dns"},
              "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 1053},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 1053}]}},
        ]});
        self.kubectl_stdin(&["apply", "-f", "-"], &manifests.to_string());
        self.wait_for(
            "CoreDNS to be Ready",
            Duration::from_secs(120),
            &[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "k8s-app=kube-dns",
                "-o",
                "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
            ],
            |s| s == "True",
        );
    }

    /// `gantry-image pause` in this node's directory.
    fn pause_image(&self) -> PathBuf {
        let out = self.dir.join("pause.tar");
        let (name, tag) = PAUSE_IMAGE.split_once(':').expect("name:tag");
        let built = Command::new(binary("gantry-image"))
            .args(["--out", &out.display().to_string(), "--name", name, "--tag", tag, "pause"])
            .output()
            .expect("gantry-image");
        assert!(
            built.status.success(),
            "gantry-image pause: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        out
    }

    fn kubelet(&mut self, node_bin: &Path) {
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             failCgroupV1: false\ncgroupDriver: cgroupfs\nresolvConf: \"\"\naddress: {NODE_IP}\nport: {port}\n\
             readOnlyPort: 0\nhealthzBindAddress: 127.0.0.1\nhealthzPort: {healthz}\n\
             authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}\n\
             authorization: {{mode: AlwaysAllow}}\nclusterDomain: cluster.local\nclusterDNS: [{DNS_IP}]\nfailSwapOn: false\n\
             imageGCHighThresholdPercent: 100\n\
             evictionHard: {{\"memory.available\": \"1Mi\", \"nodefs.available\": \"1%\", \"imagefs.available\": \"1%\"}}\n",
            port = free_port(),
            healthz = free_port(),
        );
        write(&self.dir.join("kubelet.yaml"), &config);
        let dir = self.dir.clone();
        let d = |name: &str| dir.join(name).display().to_string();
        let args = [
            format!("--config={}", d("kubelet.yaml")),
            format!("--kubeconfig={}", self.admin_kubeconfig.display()),
            format!("--container-runtime-endpoint=unix://{}", self.containerd_socket.display()),
            format!("--node-ip={NODE_IP}"),
            format!("--hostname-override={NODE_NAME}"),
            format!("--root-dir={}", d("kubelet")),
            "--v=1".into(),
        ];
        self.spawn(&node_bin.join("kubelet"), "kubelet", &args);
    }

    fn spawn(&mut self, program: &Path, name: &str, args: &[String]) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).expect("log file");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.children.push((name.to_string(), child));
    }

    /// The log of a component (`kubelet`, `containerd`, ...).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// `ctr` on this node's containerd, in the Kubernetes namespace.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.containerd_socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("run ctr")
    }

    /// Imports an OCI archive into the node's containerd.
    pub fn import(&self, archive: &Path) {
        let out = self.ctr(&["images", "import", &archive.display().to_string()]);
        assert!(
            out.status.success(),
            "ctr images import {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// kubectl as the admin.
    pub fn kubectl_output(&self, args: &[&str]) -> Output {
        Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// kubectl as the admin; its stdout, or a panic with the node's state.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_output(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            self.diagnostics()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// kubectl as the admin with `input` on stdin.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> String {
        use std::io::Write as _;
        let mut child = Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
        let out = child.wait_with_output().expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until kubectl `args` prints what `done` accepts.
    pub fn wait_for(
        &self,
        what: &str,
        within: Duration,
        args: &[&str],
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + within;
        loop {
            let out = self.kubectl_output(args);
            let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && done(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "not within {within:?}: {what} (last: {text})\n{}",
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// What a red run needs to say why: the pods, the events, the
    /// kubelet's and containerd's last lines.
    pub fn diagnostics(&self) -> String {
        let get =
            |args: &[&str]| String::from_utf8_lossy(&self.kubectl_output(args).stdout).into_owned();
        format!(
            "pods:\n{}\nevents:\n{}\nkubelet log:\n{}\ncontainerd log:\n{}",
            get(&["get", "pods", "-A", "-o", "wide"]),
            tail(&get(&["get", "events", "-A", "--sort-by=.lastTimestamp"]), 30),
            tail(&self.log("kubelet"), 30),
            tail(&self.log("containerd"), 15),
        )
    }

    /// The IP of the first pod `selector` selects in `namespace`.
    pub fn pod_ip(&self, namespace: &str, selector: &str) -> String {
        self.kubectl(&[
            "-n",
            namespace,
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            "jsonpath={.items[0].status.podIP}",
        ])
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        // The kubelet first, so that it restarts nothing; then every
        // container of this containerd (their shims outlive it), then the
        // rest in reverse order.
        let kill = |child: &mut Child| {
            let _ = child.kill();
            let _ = child.wait();
        };
        if let Some((_, kubelet)) = self.children.iter_mut().find(|(n, _)| n == "kubelet") {
            kill(kubelet);
        }
        // Containers outlive their shims: kill them by the kubelet's
        // cgroups, then the shims.
        for cgroup in kubepods() {
            let mut pids = Vec::new();
            cgroup_processes(&cgroup, &mut pids);
            let _ = Command::new("kill").arg("-9").args(&pids).stderr(Stdio::null()).status();
        }
        let socket = self.containerd_socket.display().to_string();
        let _ =
            run("pkill", &["-9", "-f", &format!("containerd-shim-runc-v2 .*-address {socket}")]);
        for (_, child) in self.children.iter_mut().rev() {
            kill(child);
        }
        unmount_under(&self.dir);
        self.host.restore();
        if std::thread::panicking() {
            eprintln!("real node logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

//! A store process and reconciler processes on one namespace of the shared
//! real control plane ([`ControlPlane::shared`]): what every test judged by
//! a real cluster stands on. Derefs to [`StoreRig`] for the store calls.

use std::collections::BTreeSet;
use std::time::Duration;

use gantry_api::v1::{Gateway, Phase};
use serde_json::Value;

use crate::env::temp_dir;
use crate::k8s::{ControlPlane, RECONCILER_USER};
use crate::rig::StoreRig;
use crate::services::ReconcilerProcess;
use crate::wait::{eventually, eventually_blocking};

/// Kinds a gateway with a route and several replicas owns, as
/// `kubectl get` names them.
pub const OWNED: &str =
    "serviceaccounts,configmaps,services,deployments,ingresses,poddisruptionbudgets";

/// How long a real-cluster test waits for one step.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// A store process and a reconciler process on one namespace of the
/// shared plane.
#[derive(Debug)]
pub struct ClusterRig {
    pub base: StoreRig,
    pub plane: &'static ControlPlane,
    pub namespace: String,
    pub reconcilers: Vec<ReconcilerProcess>,
}

impl std::ops::Deref for ClusterRig {
    type Target = StoreRig;

    fn deref(&self) -> &StoreRig {
        &self.base
    }
}

impl ClusterRig {
    pub fn start(prefix: &str) -> Option<ClusterRig> {
        let dir = temp_dir(prefix);
        let database = format!("sqlite://{}", dir.join("gantry.db").display());
        Self::start_on(prefix, &database, dir)
    }

    /// As [`ClusterRig::start`], with the store on `database`.
    pub fn start_on(prefix: &str, database: &str, dir: std::path::PathBuf) -> Option<ClusterRig> {
        let plane = ControlPlane::shared()?;
        let namespace = plane.namespace(prefix);
        let base = StoreRig::on(database, dir);
        Some(ClusterRig { base, plane, namespace, reconcilers: Vec::new() })
    }

    /// Starts a reconciler process as the reconciler's identity.
    pub fn reconciler(&mut self, extra: &[&str]) {
        self.reconciler_with_env(extra, &[]);
    }

    /// As [`ClusterRig::reconciler`], with environment variables; with
    /// `KUBECONFIG` among them, no `--kubeconfig` is given.
    pub fn reconciler_with_env(&mut self, extra: &[&str], env: &[(&str, &str)]) {
        let kubeconfig = self.plane.reconciler_kubeconfig.display().to_string();
        let by_env = env.iter().any(|(k, _)| *k == "KUBECONFIG");
        let defaults = [
            ("--target", "kube"),
            ("--kubeconfig", kubeconfig.as_str()),
            ("--namespace", self.namespace.as_str()),
            ("--poll-interval", "200ms"),
            ("--sync-period", "30s"),
            ("--retry-backoff", "200ms"),
            ("--progress-deadline", "6s"),
        ];
        let mut args: Vec<&str> = Vec::new();
        for (flag, value) in defaults {
            let skipped = extra.contains(&flag) || (by_env && flag == "--kubeconfig");
            if !skipped {
                args.extend([flag, value]);
            }
        }
        args.extend_from_slice(extra);
        let process = ReconcilerProcess::start_with_env(&self.store.endpoint(), &args, env);
        self.reconcilers.push(process);
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.namespace.as_str()];
        all.extend_from_slice(args);
        self.plane.kubectl(&all)
    }

    /// kubectl in the namespace as the reconciler's identity (impersonated
    /// by the admin), whatever its outcome: what the reconciler would get.
    pub fn kubectl_output_as_reconciler(&self, args: &[&str]) -> std::process::Output {
        let user = format!("--as={RECONCILER_USER}");
        let mut all = vec!["-n", self.namespace.as_str(), user.as_str()];
        all.extend_from_slice(args);
        self.plane.kubectl_output(&all)
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all)).expect("kubectl -o json prints JSON")
    }

    /// Names of the objects of `kinds` in the namespace, as `kind/name`.
    pub fn objects(&self, kinds: &str) -> BTreeSet<String> {
        self.kubectl(&["get", kinds, "-o", "name"])
            .lines()
            .filter(|l| !l.ends_with("/kube-root-ca.crt") && !l.ends_with("serviceaccount/default"))
            .filter(|l| !l.contains("/team-"))
            .map(str::to_string)
            .collect()
    }

    /// Polls the store until `done` holds for the gateway.
    pub async fn wait_for(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&Gateway) -> bool,
    ) -> Gateway {
        let logs = || self.reconcilers.iter().map(|r| r.logs()).collect::<Vec<_>>().join("\n");
        self.gateways.wait_for(name, what, PATIENCE, done, logs).await
    }

    pub async fn wait_running(&self, name: &str, generation: i64) -> Gateway {
        self.wait_for(name, &format!("RUNNING at generation {generation}"), |g| {
            let s = g.status.clone().unwrap_or_default();
            s.phase() == Phase::Running && s.observed_generation == generation
        })
        .await
    }

    pub async fn wait_gone(&self, name: &str) {
        eventually(PATIENCE, &format!("{name} was never deleted"), || async {
            self.get(name).await.is_err()
        })
        .await;
    }

    /// Waits until `kubectl get kinds` lists nothing gantry could own.
    pub fn wait_empty(&self, kinds: &str) {
        eventually_blocking(PATIENCE, &format!("no {kinds} left behind"), || {
            let left = self.objects(kinds);
            if !left.is_empty() {
                eprintln!("left behind: {left:?}");
            }
            left.is_empty()
        });
    }

    /// Two reconciler processes, `replica-a` and `replica-b`, electing a
    /// leader on a Lease of `lease_duration`.
    pub fn replicas(&mut self, lease_duration: &str) {
        for identity in ["replica-a", "replica-b"] {
            self.reconciler(&[
                "--leader-elect",
                "--lease-duration",
                lease_duration,
                "--identity",
                identity,
            ]);
        }
    }

    /// The Lease's holder, when there is a Lease and a holder.
    pub fn lease_holder(&self) -> Option<String> {
        let text = self.kubectl(&[
            "get",
            "lease",
            "gateway-reconciler",
            "-o",
            "json",
            "--ignore-not-found",
        ]);
        let lease: Value = serde_json::from_str(&text).ok()?;
        lease["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()).map(str::to_string)
    }

    /// Plays the ingress controller: publishes `hostname` on the Ingress
    /// once the reconciler has created it.
    pub fn admit(&self, ingress: &str, hostname: &str) {
        eventually_blocking(PATIENCE, &format!("Ingress {ingress} never appeared"), || {
            self.kubectl(&["get", "ingress", "-o", "name"]).contains(ingress)
        });
        let status = format!(
            r#"{{"status":{{"loadBalancer":{{"ingress":[{{"hostname":"{hostname}"}}]}}}}}}"#
        );
        self.kubectl(&[
            "patch",
            "ingress",
            ingress,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ]);
    }

    /// The audit events of the reconciler's identity in this namespace.
    pub fn reconciler_requests(&self) -> Vec<Value> {
        self.plane
            .audit_events()
            .into_iter()
            .filter(|e| e["user"]["username"] == RECONCILER_USER)
            .filter(|e| e["objectRef"]["namespace"] == self.namespace.as_str())
            .collect()
    }

    /// Sum of the first reconciler's passes (its `reconciles` counter).
    pub fn passes(&self) -> u64 {
        let metrics =
            crate::http::http_get(self.reconcilers[0].http, "/metrics").unwrap_or_default();
        metrics
            .lines()
            .filter(|l| l.starts_with("gantry_reconciler_reconciles_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Waits for `n` more passes of the first reconciler.
    pub fn wait_passes(&self, n: u64) {
        self.wait_passes_after(self.passes(), n);
    }

    /// Waits until the first reconciler made `n` passes after its count
    /// was `start` (read it before the event that causes them).
    pub fn wait_passes_after(&self, start: u64, n: u64) {
        eventually_blocking(PATIENCE, &format!("{n} more passes"), || self.passes() >= start + n);
    }

    /// Makes the first reconciler run `n` passes over `gateway`, one at a
    /// time: each a label written to the store (news to the reconciler that
    /// changes nothing it renders).
    pub async fn passes_over(&self, gateway: &str, n: usize) {
        for round in 0..n {
            let passes = self.passes();
            let mut g = self.get(gateway).await.expect("the gateway");
            let labels = &mut g.metadata.as_mut().expect("metadata").labels;
            labels.insert("gantry.test/round".into(), round.to_string());
            self.update(g, &["metadata.labels"]).await;
            self.wait_passes_after(passes, 1);
        }
    }

    /// The one ConfigMap of `gateway` (content-addressed: its name is the
    /// gateway's and a hash of its data).
    pub fn config_map(&self, gateway: &str) -> Value {
        let selector = format!("gantry.dev/gateway={gateway}");
        let list = self.json(&["get", "configmaps", "-l", &selector]);
        let items = list["items"].as_array().cloned().unwrap_or_default();
        assert_eq!(items.len(), 1, "one ConfigMap of {gateway}: {items:?}");
        items[0].clone()
    }

    /// The name of [`ClusterRig::config_map`].
    pub fn config_map_name(&self, gateway: &str) -> String {
        self.config_map(gateway)["metadata"]["name"].as_str().unwrap_or_default().to_string()
    }

    /// The images of the namespace's pods that kwok made Ready.
    pub fn ready_pod_images(&self) -> Vec<String> {
        let pods = self.json(&["get", "pods"]);
        pods["items"]
            .as_array()
            .expect("a list of pods")
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .map(|p| p["spec"]["containers"][0]["image"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

impl Drop for ClusterRig {
    fn drop(&mut self) {
        self.reconcilers.clear();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.base.dir);
        }
    }
}

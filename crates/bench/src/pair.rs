//! The pair under test: a store, a reconciler and its cluster (kube-fake
//! in this process, or a real control plane).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::args::{Args, ClusterKind};
use crate::procs::{Reconciler, Store};

pub(crate) enum Cluster {
    Fake(gantry_kube_fake::KubeFake, tempfile_path::TempPath),
    Real {
        plane: Box<gantry_testkit::k8s::ControlPlane>,
        namespace: String,
        /// Audit events already counted.
        counted: usize,
    },
}

pub(crate) fn cluster_name(args: &Args) -> &'static str {
    match args.cluster {
        ClusterKind::Fake => "kube-fake",
        ClusterKind::Real => "real",
    }
}

/// gateway-store, a cluster (kube-fake, or a real control plane), and a
/// gateway-reconciler process between them.
pub(crate) struct Pair {
    pub(crate) store: Store,
    pub(crate) cluster: Cluster,
    pub(crate) reconciler: Option<Reconciler>,
    pub(crate) poll_interval: String,
}

mod tempfile_path {
    /// A file removed when dropped.
    pub struct TempPath(pub std::path::PathBuf);
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Pair {
    pub(crate) async fn start(args: &Args) -> anyhow::Result<Pair> {
        let store = Store::start(args, 4096).await?;
        let cluster = match args.cluster {
            ClusterKind::Fake => {
                let kube = gantry_kube_fake::KubeFake::start_with(gantry_kube_fake::Options {
                    rollout_delay: Duration::ZERO,
                    ..Default::default()
                })
                .await?;
                let path = std::env::temp_dir()
                    .join(format!("gantry-bench-kubeconfig-{}", uuid::Uuid::new_v4().simple()));
                std::fs::write(&path, kube.kubeconfig())?;
                Cluster::Fake(kube, tempfile_path::TempPath(path))
            }
            ClusterKind::Real => {
                let bin = gantry_testkit::k8s::bin_dir().ok_or_else(|| {
                    anyhow::anyhow!("no Kubernetes binaries: run tests/k8s/setup.sh k8s")
                })?;
                eprintln!("starting a control plane from {}", bin.display());
                let plane = tokio::task::spawn_blocking(move || {
                    let plane = gantry_testkit::k8s::ControlPlane::start(&bin);
                    let namespace = plane.namespace("bench");
                    (plane, namespace)
                })
                .await?;
                Cluster::Real { plane: Box::new(plane.0), namespace: plane.1, counted: 0 }
            }
        };
        Ok(Pair { store, cluster, reconciler: None, poll_interval: args.poll_interval.clone() })
    }

    pub(crate) async fn start_reconciler(
        &mut self,
        sync_period: Duration,
    ) -> anyhow::Result<&Reconciler> {
        let (kubeconfig, namespace) = match &self.cluster {
            Cluster::Fake(_, path) => (path.0.as_path(), None),
            Cluster::Real { plane, namespace, .. } => {
                (plane.reconciler_kubeconfig.as_path(), Some(namespace.as_str()))
            }
        };
        let reconciler =
            Reconciler::start(&self.store, kubeconfig, namespace, sync_period, &self.poll_interval)
                .await?;
        Ok(self.reconciler.insert(reconciler))
    }

    pub(crate) fn reconciler(&self) -> anyhow::Result<&Reconciler> {
        self.reconciler.as_ref().ok_or_else(|| anyhow::anyhow!("the reconciler is not running"))
    }

    /// The reconciler's cluster requests since the last call: (all,
    /// writes). On a real cluster, read from the API server's audit log.
    pub(crate) fn take_kube_requests(&mut self) -> (usize, usize) {
        match &mut self.cluster {
            Cluster::Fake(kube, _) => {
                let requests = kube.requests();
                kube.clear_requests();
                (requests.len(), requests.iter().filter(|r| r.is_write()).count())
            }
            Cluster::Real { plane, counted, .. } => {
                let events = plane.audit_events();
                let ours: Vec<&Value> = events[(*counted).min(events.len())..]
                    .iter()
                    .filter(|e| e["user"]["username"] == gantry_testkit::k8s::RECONCILER_USER)
                    .collect();
                *counted = events.len();
                let writes = ours
                    .iter()
                    .filter(|e| {
                        matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete"))
                    })
                    .count();
                (ours.len(), writes)
            }
        }
    }

    pub(crate) async fn stop(mut self) {
        if let Some(r) = self.reconciler.take() {
            r.stop();
        }
        match self.cluster {
            Cluster::Fake(kube, _) => kube.stop().await,
            Cluster::Real { plane, .. } => {
                drop(tokio::task::spawn_blocking(move || drop(plane)).await)
            }
        }
        self.store.stop().await;
    }
}

/// Waits until `pair`'s reconciler has made `count` passes since it
/// started; false after `limit`.
pub(crate) async fn wait_reconciles(
    pair: &Pair,
    count: u64,
    limit: Duration,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let mut reported = Instant::now();
    loop {
        let done = pair.reconciler()?.reconciles().await?;
        if done >= count {
            return Ok(true);
        }
        if started.elapsed() > limit {
            return Ok(false);
        }
        if reported.elapsed() > Duration::from_secs(5) {
            eprintln!("  {done}/{count} reconcile passes after {:?}", started.elapsed());
            reported = Instant::now();
        }
        // A scrape recounts every gateway's phase: scraping every 20 ms
        // (as the first version did) cost the reconciler 15% of its CPU
        // at 100,000 gateways. Prometheus scrapes every 15 s or so.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

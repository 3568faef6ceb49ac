//! gateway-reconciler end to end: a real gateway-store process, the real
//! kube-rs client against kube-fake, and the reconciler's control loop.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::{ConditionStatus, Gateway, GatewaySpec, ObjectMeta, Phase, Route};
use gantry_client::ClientConfig;
use gantry_core::recovery::RecoveryPolicy;
use gantry_core::retry::Backoff;
use gantry_kube_fake::{FaultAction, FaultRule, KubeFake, Options};
use gantry_reconciler::controller::{Controller, Settings, FINALIZER, RETRY_ANNOTATION};
use gantry_reconciler::metrics::Metrics;
use gantry_reconciler::render::RenderSettings;
use gantry_reconciler::store::{GatewayStore, GrpcStore};
use gantry_reconciler::targets::kube::{KubeSettings, KubeTarget};
use gantry_reconciler::targets::Target;
use gantry_testkit::gateway::named;
use gantry_testkit::{eventually, StoreRig};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use tonic::Code;

const PATIENCE: Duration = Duration::from_secs(60);

/// Store process + kube-fake + reconciler, torn down on drop.
struct Rig {
    base: StoreRig,
    kube: KubeFake,
    kube_client: kube::Client,
    reconciler: Reconciler,
    settings: Settings,
    kube_settings: KubeSettings,
}

impl std::ops::Deref for Rig {
    type Target = StoreRig;

    fn deref(&self) -> &StoreRig {
        &self.base
    }
}

/// One reconciler (a process's worth: its own caches and watches).
struct Reconciler {
    controller: Arc<Controller>,
    metrics: Arc<Metrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Reconciler {
    fn start(
        store: &ClientConfig,
        kube: &kube::Client,
        settings: &Settings,
        kube_settings: &KubeSettings,
    ) -> Self {
        let target: Arc<dyn Target> =
            Arc::new(KubeTarget::with_settings(kube.clone(), "default", kube_settings.clone()));
        let metrics = Arc::new(Metrics::default());
        let controller =
            Controller::new(grpc_store(store), target, settings.clone(), metrics.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controller.clone().run(async {
            let _ = stopped.await;
        }));
        Reconciler { controller, metrics, stop: Some(stop), task: Some(task) }
    }

    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
        }
    }
}

fn settings() -> Settings {
    Settings {
        render: RenderSettings::default(),
        policy: RecoveryPolicy {
            budget: 3,
            backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(200),
                jitter: 0.0,
            },
            sync_period: Duration::from_secs(2),
            failed_window_floor: Duration::from_secs(2),
        },
        concurrency: 4,
        sync_period: Duration::from_secs(2),
        poll_interval: Duration::from_millis(100),
        ..Settings::default()
    }
}

fn grpc_store(config: &ClientConfig) -> Arc<dyn GatewayStore> {
    Arc::new(GrpcStore::new(config.connect_lazy().unwrap()))
}

impl Rig {
    async fn start() -> Rig {
        Self::start_with(settings()).await
    }

    async fn start_with(settings: Settings) -> Rig {
        Self::start_full(settings, KubeSettings::default()).await
    }

    async fn start_full(settings: Settings, kube_settings: KubeSettings) -> Rig {
        let base = StoreRig::start("reconciler-kube");
        let kube = KubeFake::start_with(Options {
            rollout_delay: Duration::from_millis(20),
            ..Options::default()
        })
        .await
        .unwrap();
        let kube_client =
            kube::Client::try_from(kube::Config::new(kube.url().parse().unwrap())).unwrap();
        let config = ClientConfig { endpoint: base.store.endpoint(), ..Default::default() };
        let reconciler = Reconciler::start(&config, &kube_client, &settings, &kube_settings);
        Rig { base, kube, kube_client, reconciler, settings, kube_settings }
    }

    /// Stops the reconciler and starts another (a restarted process).
    async fn restart_reconciler(&mut self, before_start: impl FnOnce(&KubeFake)) {
        self.reconciler.stop().await;
        before_start(&self.kube);
        let config = ClientConfig { endpoint: self.store.endpoint(), ..Default::default() };
        self.reconciler =
            Reconciler::start(&config, &self.kube_client, &self.settings, &self.kube_settings);
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.kube_client.clone(), "default")
    }

    /// Waits until the gateway observed `generation` and is RUNNING.
    async fn wait_generation(&self, name: &str, generation: i64) -> Gateway {
        self.wait_for(name, &format!("RUNNING at generation {generation}"), |g| {
            let s = g.status.clone().unwrap_or_default();
            s.observed_generation == generation && s.phase() == Phase::Running
        })
        .await
    }

    /// Polls the store until `done` holds for the gateway.
    async fn wait_for(&self, name: &str, what: &str, done: impl Fn(&Gateway) -> bool) -> Gateway {
        self.gateways.wait_for(name, what, PATIENCE, done, String::new).await
    }

    async fn wait_running(&self, name: &str) -> Gateway {
        self.wait_for(name, "RUNNING and converged", |g| {
            let s = g.status.clone().unwrap_or_default();
            s.phase() == Phase::Running
                && s.observed_generation == g.metadata.as_ref().unwrap().generation
        })
        .await
    }

    /// Waits until no pass runs or is due: what follows asserts that
    /// nothing more happened.
    async fn wait_idle(&self) {
        let controller = &self.reconciler.controller;
        eventually(PATIENCE, "the reconciler never went idle", || async { controller.is_idle() })
            .await;
    }

    fn reconciles(&self) -> u64 {
        let text = self.reconciler.metrics.encode();
        text.lines()
            .filter(|l| l.starts_with("gantry_reconciler_reconciles_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    async fn stop(mut self) {
        self.reconciler.stop().await;
        let _ = std::fs::remove_dir_all(&self.base.dir);
        drop(self.base);
        self.kube.stop().await;
    }
}

fn spec(image: &str) -> GatewaySpec {
    GatewaySpec { image: image.into(), ..Default::default() }
}

fn ready(g: &Gateway) -> bool {
    g.status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .any(|c| c.r#type == "Ready" && c.status() == ConditionStatus::True)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_converges_changes_and_is_deleted() {
    let rig = Rig::start().await;
    let created = rig.create_spec("edge", spec("ghcr.io/acme/gw:1")).await;
    assert_eq!(meta(&created).generation, 1);
    let running = rig.wait_running("edge").await;
    assert!(ready(&running));
    assert!(meta(&running).finalizers.contains(&FINALIZER.to_string()));
    let steps: Vec<_> =
        running.status.as_ref().unwrap().provisioning.iter().map(|s| s.name.clone()).collect();
    assert_eq!(steps, ["ManifestsApplied", "WorkloadAvailable"]);

    let deployment = rig.deployments().get("edge").await.unwrap();
    assert_eq!(deployment.metadata.labels.as_ref().unwrap()["gantry.dev/gateway"], "edge");
    let managers: Vec<_> =
        deployment.metadata.managed_fields.unwrap().into_iter().filter_map(|m| m.manager).collect();
    assert!(managers.contains(&"gantry-reconciler".to_string()));
    let cm: Api<ConfigMap> = Api::namespaced(rig.kube_client.clone(), "default");
    let configs = cm.list(&ListParams::default().labels("gantry.dev/gateway=edge")).await.unwrap();
    assert_eq!(configs.items.len(), 1);
    assert!(configs.items[0].data.as_ref().unwrap().contains_key("gantry.json"));

    // Spec change: the Deployment follows and observed_generation advances.
    rig.set_spec("edge", spec("ghcr.io/acme/gw:2")).await;
    let changed = rig.wait_generation("edge", 2).await;
    assert_eq!(meta(&changed).generation, 2);
    assert_eq!(deployed_image(&rig, "edge").await.as_deref(), Some("ghcr.io/acme/gw:2"));

    // Labels only: the reconciler looks, and writes nothing to the cluster.
    rig.kube.clear_requests();
    let before = rig.reconciles();
    rig.update(named("edge").label("team", "edge"), &["metadata.labels"]).await;
    eventually(PATIENCE, "the label change was never looked at", || async {
        rig.reconciles() > before
    })
    .await;
    let writes: Vec<_> = rig.kube.requests().into_iter().filter(|r| r.is_write()).collect();
    assert!(writes.is_empty(), "a labels-only change wrote to the cluster: {writes:?}");
    assert_eq!(meta(&rig.get("edge").await.unwrap()).generation, 2);

    // A route adds an Ingress; 3 replicas add a PDB; removing both prunes them.
    let ingresses: Api<Ingress> = Api::namespaced(rig.kube_client.clone(), "default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(rig.kube_client.clone(), "default");
    let mut bigger = spec("ghcr.io/acme/gw:2");
    bigger.route =
        Some(Route { host: "edge.example.com".into(), tls_secret_name: "edge-tls".into() });
    bigger.replicas = Some(3);
    rig.set_spec("edge", bigger).await;
    let routed = rig.wait_generation("edge", 3).await;
    assert_eq!(
        routed.status.as_ref().unwrap().route_address,
        gantry_kube_fake::INGRESS_ADDRESS,
        "the address the ingress controller published, not the requested host"
    );
    assert!(ingresses.get_opt("edge").await.unwrap().is_some());
    assert!(pdbs.get_opt("edge").await.unwrap().is_some());
    rig.set_spec("edge", spec("ghcr.io/acme/gw:2")).await;
    rig.wait_generation("edge", 4).await;
    assert!(ingresses.get_opt("edge").await.unwrap().is_none(), "the Ingress was pruned");
    assert!(pdbs.get_opt("edge").await.unwrap().is_none(), "the PDB was pruned");

    // Delete: owned objects go, then the finalizer, then the gateway.
    rig.delete("edge").await;
    eventually(PATIENCE, "the gateway was never removed", || async {
        rig.get("edge").await.is_err()
    })
    .await;
    assert_eq!(rig.get("edge").await.unwrap_err().code(), Code::NotFound);
    assert!(rig.deployments().get_opt("edge").await.unwrap().is_none());
    assert!(cm.get_opt("edge").await.unwrap().is_none());
    rig.stop().await;
}

fn meta(g: &Gateway) -> &ObjectMeta {
    g.metadata.as_ref().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_rollout_is_degraded_until_it_heals() {
    let rig = Rig::start().await;
    rig.kube.set_stalled("default", "slow", true);
    rig.create_spec("slow", spec("ghcr.io/acme/gw:1")).await;
    let degraded = rig
        .wait_for("slow", "DEGRADED", |g| {
            g.status.as_ref().is_some_and(|s| s.phase() == Phase::Degraded)
        })
        .await;
    let status = degraded.status.unwrap();
    assert_eq!(status.observed_generation, 1, "the manifests of generation 1 were applied");
    let stalled = status.conditions.iter().find(|c| c.r#type == "Stalled").unwrap();
    assert_eq!(
        (stalled.status(), stalled.reason.as_str()),
        (ConditionStatus::True, "ProgressDeadlineExceeded")
    );
    rig.kube.set_stalled("default", "slow", false);
    rig.wait_running("slow").await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_spend_the_budget_then_fail_truthfully_and_recover() {
    let rig = Rig::start().await;
    let fail_deployments = || FaultRule {
        verb: Some("apply".into()),
        resource: Some("apps/deployments".into()),
        action: FaultAction::Status { code: 500, retry_after: None },
        rate: 1.0,
        remaining: None,
    };
    rig.kube.inject(fail_deployments());
    rig.create_spec("flaky", spec("ghcr.io/acme/gw:1")).await;
    let failed = rig
        .wait_for("flaky", "FAILED", |g| {
            g.status.as_ref().is_some_and(|s| s.phase() == Phase::Failed)
        })
        .await;
    let status = failed.status.clone().unwrap();
    assert!(status.message.contains("500"), "{}", status.message);
    assert_eq!(status.failure_count, 3);
    assert_eq!(status.observed_generation, 0, "nothing was applied");
    let attempts = |rig: &Rig| {
        rig.kube
            .requests()
            .iter()
            .filter(|r| r.verb == "apply" && r.resource == "apps/deployments")
            .count()
    };
    assert_eq!(attempts(&rig), 3, "exactly the budget");

    // The failed window (2 s) ends in one more attempt, recorded with a
    // new wait of a whole window: retries stay bounded however long it
    // fails, and every attempt is recorded.
    let ms = |t: &prost_types::Timestamp| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000;
    let first_wait = ms(status.next_retry_time.as_ref().unwrap());
    let again = rig
        .wait_for("flaky", "the attempt after the window recorded", |g| {
            g.status.as_ref().is_some_and(|s| s.failure_count > 3)
        })
        .await
        .status
        .unwrap();
    let second_wait = ms(again.next_retry_time.as_ref().unwrap());
    assert!(
        second_wait >= first_wait + 2_000,
        "the next try is not a whole window later: {first_wait} then {second_wait}"
    );
    let recorded = usize::try_from(again.failure_count).unwrap();
    assert!(attempts(&rig) <= recorded + 1, "attempts that were not recorded: {}", attempts(&rig));

    // A spec fix retries at once and converges.
    rig.kube.clear_faults();
    rig.set_spec("flaky", spec("ghcr.io/acme/gw:2")).await;
    let fixed = rig.wait_running("flaky").await;
    assert_eq!(fixed.status.unwrap().failure_count, 0);

    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_band_changes_to_owned_objects_are_repaired() {
    let rig = Rig::start().await;
    rig.create_spec("drift", spec("ghcr.io/acme/gw:1")).await;
    rig.wait_running("drift").await;
    let deployments = rig.deployments();

    let edit = serde_json::json!({"spec": {"template": {"spec": {"containers": [{"name": "gateway", "image": "evil:1"}]}}}});
    deployments.patch("drift", &PatchParams::apply("someone-else").force(), &Patch::Apply(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "drift"}, "spec": edit["spec"],
    }))).await.unwrap();
    let image = || async {
        let d = deployments.get("drift").await.unwrap();
        let containers = d.spec.unwrap().template.spec.unwrap().containers;
        containers.into_iter().find(|c| c.name == "gateway").unwrap().image.unwrap()
    };
    eventually(PATIENCE, "the edited Deployment was never repaired", || async {
        image().await == "ghcr.io/acme/gw:1"
    })
    .await;

    deployments.delete("drift", &DeleteParams::default()).await.unwrap();
    eventually(PATIENCE, "the deleted Deployment was never re-created", || async {
        deployments.get_opt("drift").await.unwrap().is_some()
    })
    .await;
    rig.wait_running("drift").await;

    // Any owned kind deleted out of band comes back.
    let configmaps: Api<ConfigMap> = Api::namespaced(rig.kube_client.clone(), "default");
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(rig.kube_client.clone(), "default");
    let of_drift = ListParams::default().labels("gantry.dev/gateway=drift");
    let config = configmaps.list(&of_drift).await.unwrap().items.remove(0);
    let config = config.metadata.name.unwrap();
    configmaps.delete(&config, &DeleteParams::default()).await.unwrap();
    services.delete("drift", &DeleteParams::default()).await.unwrap();
    eventually(PATIENCE, "the deleted ConfigMap and Service were never re-created", || async {
        configmaps.get_opt(&config).await.unwrap().is_some()
            && services.get_opt("drift").await.unwrap().is_some()
    })
    .await;
    rig.wait_running("drift").await;

    // An owned object of a kind the gateway no longer renders (a prune
    // that was skipped or failed) is removed: this gateway has no route.
    use gantry_reconciler::render::{
        LABEL_GATEWAY, LABEL_GATEWAY_UID, LABEL_MANAGED_BY, MANAGED_BY,
    };
    let ingresses: Api<Ingress> = Api::namespaced(rig.kube_client.clone(), "default");
    let uid = meta(&rig.get("drift").await.unwrap()).uid.clone();
    let leftover: Ingress = serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "drift", "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_GATEWAY: "drift", LABEL_GATEWAY_UID: uid}},
        "spec": {"rules": [{"host": "old.example.com"}]},
    }))
    .unwrap();
    ingresses.create(&Default::default(), &leftover).await.unwrap();
    eventually(PATIENCE, "the leftover Ingress was never pruned", || async {
        ingresses.get_opt("drift").await.unwrap().is_none()
    })
    .await;
    rig.wait_running("drift").await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_request_resets_a_failed_gateway_without_a_spec_change() {
    // A failed window far longer than the test's patience: only the retry
    // request can bring the gateway back in time.
    let mut long_window = settings();
    long_window.policy.failed_window_floor = Duration::from_secs(3600);
    let rig = Rig::start_with(long_window).await;
    rig.kube.inject(FaultRule {
        verb: Some("apply".into()),
        resource: Some("apps/deployments".into()),
        action: FaultAction::Status { code: 500, retry_after: None },
        rate: 1.0,
        remaining: None,
    });
    rig.create_spec("stuck", spec("ghcr.io/acme/gw:1")).await;
    rig.wait_for("stuck", "FAILED", |g| {
        g.status.as_ref().is_some_and(|s| s.phase() == Phase::Failed)
    })
    .await;
    rig.kube.clear_faults();
    let retry = named("stuck").annotation(RETRY_ANNOTATION, "2026-12-03T10:00:00Z");
    let generation = meta(&rig.update(retry, &["metadata.annotations"]).await).generation;
    let recovered = rig.wait_running("stuck").await;
    assert_eq!(meta(&recovered).generation, generation, "no spec change was needed");
    assert_eq!(generation, 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checking_a_converged_gateway_sends_no_request_to_the_cluster() {
    // A resync or a metadata-only change re-checks a gateway: with nothing
    // drifted, that is read from the reconciler's watches, not the API
    // server (a periodic resync of 100,000 gateways would otherwise be
    // 100,000 GETs).
    let rig = Rig::start().await;
    let g = rig.create_spec("quiet", spec("ghcr.io/acme/gw:1")).await;
    rig.wait_running("quiet").await;
    rig.wait_idle().await;
    rig.kube.clear_requests();
    let passes = rig.reconciles();
    let mut labelled = rig.get("quiet").await.unwrap();
    labelled.metadata.as_mut().unwrap().labels.insert("team".into(), "edge".into());
    rig.update(labelled, &["metadata.labels"]).await;
    eventually(PATIENCE, "the label change was never checked", || async {
        rig.reconciles() > passes
    })
    .await;
    rig.wait_idle().await;
    let requests: Vec<String> = rig
        .kube
        .requests()
        .iter()
        .filter(|r| r.verb != "watch")
        .map(|r| format!("{} {} {}", r.verb, r.resource, r.name))
        .collect();
    assert!(requests.is_empty(), "a converged gateway's check reached the cluster: {requests:?}");
    assert_eq!(meta(&rig.get("quiet").await.unwrap()).generation, meta(&g).generation);
    rig.stop().await;
}

/// A restarted reconciler waits for its watches of the owned objects to
/// list before it judges anything, as an informer-based controller waits
/// for its caches: judged before, every converged gateway read as "waiting
/// for the watches" and had its status flapped to PROVISIONING and back.
/// Meanwhile /readyz names the watch it waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_leaves_converged_gateways_untouched_while_its_watches_list() {
    let mut rig = Rig::start().await;
    rig.create_spec("steady", spec("ghcr.io/acme/gw:1")).await;
    let converged = rig.wait_running("steady").await;
    rig.wait_idle().await;
    let before = rig.get("steady").await.unwrap();
    assert_eq!(before.status, converged.status);
    // The new process's list of Deployments takes two seconds.
    rig.restart_reconciler(|kube| {
        kube.inject(FaultRule {
            verb: Some("list".into()),
            resource: Some("apps/deployments".into()),
            action: FaultAction::Latency(Duration::from_secs(2)),
            rate: 1.0,
            remaining: Some(1),
        })
    })
    .await;
    eventually(PATIENCE, "the Deployment watch reported as not listed", || async {
        matches!(rig.reconciler.controller.readiness(), Err(reason) if reason.contains("Deployment"))
    })
    .await;
    assert_eq!(rig.reconciles(), 0, "a pass ran before the watches listed");
    eventually(PATIENCE, "a pass after the watches listed", || async { rig.reconciles() > 0 })
        .await;
    rig.wait_idle().await;
    let after = rig.get("steady").await.unwrap();
    assert_eq!(
        meta(&after).resource_version,
        meta(&before).resource_version,
        "the restart wrote the gateway: {:?}",
        after.status
    );
    assert_eq!(rig.reconciler.controller.readiness(), Ok(()));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_lost_behind_the_watches_back_are_restored_within_one_sync_period() {
    // The cluster loses the objects without a watch event (a server
    // restored from an old backup): the watches' caches still show them, so
    // only a relist from the cluster can find out.
    let relist = Duration::from_secs(3);
    let rig = Rig::start_full(
        settings(),
        KubeSettings { relist_period: relist, ..KubeSettings::default() },
    )
    .await;
    let names = ["lost-a", "lost-b", "lost-c"];
    for name in names {
        rig.create_spec(name, spec("ghcr.io/acme/gw:1")).await;
    }
    for name in names {
        rig.wait_running(name).await;
    }
    rig.kube.lose_objects("default");
    let lost_at = tokio::time::Instant::now();
    for name in names {
        let within = (relist + Duration::from_secs(1)).saturating_sub(lost_at.elapsed());
        let what = format!("{name}: the lost Deployment restored within a sync period");
        eventually(within, &what, || async {
            rig.deployments().get_opt(name).await.unwrap().is_some()
        })
        .await;
    }
    for name in names {
        rig.wait_running(name).await;
    }
    rig.stop().await;
}

/// Every server-side apply takes 400 ms (a slow but healthy API server).
fn slow_applies(kube: &KubeFake) {
    kube.inject(FaultRule {
        verb: Some("apply".into()),
        resource: None,
        action: FaultAction::Latency(Duration::from_millis(400)),
        rate: 1.0,
        remaining: None,
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_healthy_apply_is_no_failure_and_a_call_past_its_timeout_is() {
    // Within --call-timeout each call is healthy: seconds for the whole
    // apply are no failure.
    let patient = KubeSettings { call_timeout: Duration::from_secs(3), ..KubeSettings::default() };
    let rig = Rig::start_full(settings(), patient).await;
    slow_applies(&rig.kube);
    rig.create_spec("slow", spec("ghcr.io/acme/gw:1")).await;
    let g = rig.wait_running("slow").await;
    assert_eq!(g.status.unwrap().failure_count, 0, "a slow apply counted as a failure");
    rig.stop().await;

    // A call past --call-timeout fails the apply, and says so.
    let hasty =
        KubeSettings { call_timeout: Duration::from_millis(100), ..KubeSettings::default() };
    let rig = Rig::start_full(settings(), hasty).await;
    slow_applies(&rig.kube);
    rig.create_spec("slow", spec("ghcr.io/acme/gw:1")).await;
    let g = rig
        .wait_for("slow", "a failure for the timeout", |g| {
            g.status.as_ref().is_some_and(|s| s.failure_count >= 1)
        })
        .await;
    let message = g.status.unwrap().message;
    assert!(message.contains("no answer within 100ms"), "{message}");
    rig.stop().await;
}

/// The first container's image of the Deployment `name`.
async fn deployed_image(rig: &Rig, name: &str) -> Option<String> {
    let deployment = rig.deployments().get(name).await.unwrap();
    deployment.spec?.template.spec?.containers.first()?.image.clone()
}

/// The uid label of the Deployment `name`, if there is one.
async fn deployment_owner(rig: &Rig, name: &str) -> Option<String> {
    let deployment = rig.deployments().get_opt(name).await.unwrap()?;
    deployment.metadata.labels?.get("gantry.dev/gateway-uid").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_deleted_and_made_again_under_its_name_gets_objects_of_its_own() {
    let rig = Rig::start().await;
    let first = rig.create_spec("edge", spec("ghcr.io/acme/gw:1")).await;
    let first_uid = meta(&first).uid.clone();
    rig.wait_running("edge").await;
    assert_eq!(deployment_owner(&rig, "edge").await.as_deref(), Some(first_uid.as_str()));

    rig.delete("edge").await;
    eventually(PATIENCE, "the first edge gone from the store", || async {
        rig.get("edge").await.is_err()
    })
    .await;
    // Its objects went before its finalizer did.
    assert_eq!(deployment_owner(&rig, "edge").await, None);
    let second = rig.create_spec("edge", spec("ghcr.io/acme/gw:2")).await;
    let second_uid = meta(&second).uid.clone();
    assert_ne!(second_uid, first_uid);
    rig.wait_running("edge").await;
    assert_eq!(deployment_owner(&rig, "edge").await.as_deref(), Some(second_uid.as_str()));
    assert_eq!(deployed_image(&rig, "edge").await.as_deref(), Some("ghcr.io/acme/gw:2"));
    rig.stop().await;
}

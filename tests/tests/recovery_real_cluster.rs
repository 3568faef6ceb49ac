//! The promises off the happy path, judged by the real control plane
//! (tests/k8s): a store restored from a backup is converged on; a
//! converged gateway whose repair keeps failing is FAILED at its own
//! generation and recovers from it (the wedge the recovery policy exists
//! for); drift is judged by server-side apply's merge rules; a drift every
//! repair leaves in place is reported and then left alone. Skips with one
//! line when the binaries are absent, and fails instead under `CI=true`.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use gantry_api::v1::{Gateway, GatewaySpec, ListGatewaysRequest, Phase};
use gantry_testkit::admission::{self, Policy};
use gantry_testkit::backup::{pg_dump, pg_restore, sqlite_backup, sqlite_restore, tool};
use gantry_testkit::cluster::{ClusterRig, PATIENCE};
use gantry_testkit::k8s::{ControlPlane, RECONCILER_USER};
use gantry_testkit::{binary, eventually_blocking, temp_dir, TestDatabase};

fn spec(tag: &str) -> GatewaySpec {
    GatewaySpec { image: format!("ghcr.io/acme/gateway:{tag}"), ..Default::default() }
}

/// The image of the Deployment `name` in the cluster.
fn deployed_image(rig: &ClusterRig, name: &str) -> String {
    let deployment = rig.json(&["get", "deployment", name]);
    deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// How a backend takes a backup and restores it (docs/operations.md).
enum Backup {
    Sqlite { db: PathBuf, file: PathBuf },
    Postgres { database: TestDatabase, file: PathBuf },
}

impl Backup {
    fn take(&self) {
        match self {
            Backup::Sqlite { db, file } => sqlite_backup(db, file),
            Backup::Postgres { database, file } => pg_dump(&database.url, file),
        }
    }

    /// With the store stopped: the backup in place of its database.
    async fn restore(&self) {
        match self {
            Backup::Sqlite { db, file } => sqlite_restore(file, db),
            Backup::Postgres { database, file } => {
                database.admin("DROP DATABASE {db} WITH (FORCE)").await;
                database.admin("CREATE DATABASE {db}").await;
                pg_restore(file, &database.url);
            }
        }
    }
}

/// Reconciler running; a backup; an edit and a new gateway; the store
/// restored under the running reconciler. The cluster converges to the
/// restored specs, an edit made after the restore is applied, the status
/// writes per gateway stay few, and nothing is restarted.
async fn a_restore_is_converged_on(mut rig: ClusterRig, backup: Backup) {
    rig.reconciler(&[]);
    rig.create_spec("edge", spec("1")).await;
    rig.create_spec("keep", spec("1")).await;
    rig.wait_running("edge", 1).await;
    rig.wait_running("keep", 1).await;
    backup.take();

    rig.set_spec("edge", spec("2")).await;
    rig.create_spec("late", spec("1")).await;
    rig.wait_running("edge", 2).await;
    rig.wait_running("late", 1).await;
    assert_eq!(deployed_image(&rig, "edge"), "ghcr.io/acme/gateway:2");

    rig.base.store.kill9();
    backup.restore().await;
    rig.base.store.spawn();
    let listed = rig.store.client().list_gateways(ListGatewaysRequest::default()).await.unwrap();
    let writes = rig.count_changes(listed.into_inner().resource_version);

    eventually_blocking(PATIENCE, "the cluster back on the restored spec", || {
        deployed_image(&rig, "edge") == "ghcr.io/acme/gateway:1"
    });
    let edited = rig.set_spec("edge", spec("3")).await;
    let generation = edited.metadata.unwrap().generation;
    assert_eq!(generation, 2, "the restored history continues from the backup");
    rig.wait_running("edge", generation).await;
    eventually_blocking(PATIENCE, "the edit after the restore applied", || {
        deployed_image(&rig, "edge") == "ghcr.io/acme/gateway:3"
    });

    let logs = rig.reconcilers[0].logs();
    assert_eq!(logs.matches("restored from a backup").count(), 1, "{logs}");
    let counts = writes.all();
    // edge moves through: the repair's rollout (two), the edit, its
    // rollout (two); keep was already what the restored status says. How
    // many progress messages a rollout writes within a phase depends on
    // how many of its steps the reconciler sees (more under load): those
    // are bounded apart, a hot loop would pass both bounds.
    let states = writes.states("edge");
    eprintln!("edge after the restore: {states:?}");
    assert!(writes.transitions("edge") <= 6, "edge moved too often: {states:#?}");
    assert!(states.len() <= 12, "edge written too often: {states:#?}");
    assert_eq!(counts.get("keep"), None, "{counts:?}");
    // As docs/operations.md says: a gateway made after the backup is no
    // longer known, and its objects are left for the operator.
    assert_eq!(rig.objects("deployments").iter().filter(|d| d.ends_with("/late")).count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_store_restored_under_a_running_reconciler_is_converged_on() {
    if !tool("sqlite3") {
        return;
    }
    let dir = temp_dir("restore-sqlite");
    let db = dir.join("gantry.db");
    let database = format!("sqlite://{}", db.display());
    let file = dir.join("backup.db");
    let Some(rig) = ClusterRig::start_on("restore-sqlite", &database, dir) else { return };
    a_restore_is_converged_on(rig, Backup::Sqlite { db, file }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_store_restored_under_a_running_reconciler_is_converged_on() {
    let Some(database) = TestDatabase::postgres().await else { return };
    if !tool("pg_dump") || !tool("pg_restore") {
        return;
    }
    let dir = temp_dir("restore-pg");
    let file = dir.join("gantry.dump");
    let Some(rig) = ClusterRig::start_on("restore-pg", &database.url, dir) else { return };
    a_restore_is_converged_on(rig, Backup::Postgres { database, file }).await;
}

/// Refuses every update of a Deployment in the rig's namespace by the
/// reconciler (as a freeze would), until dropped; installed and lifted
/// only once the server enforces that.
struct Freeze {
    probe: Probe,
    _policy: Option<Policy>,
}

/// A dry-run update of the Deployment as the reconciler.
struct Probe {
    plane: &'static ControlPlane,
    namespace: String,
}

const FROZEN: &str = "deployments are frozen by policy";

impl Probe {
    /// Whether an update by the reconciler is refused now.
    fn frozen(&self) -> bool {
        let probe = self.plane.kubectl_output(&[
            "-n",
            &self.namespace,
            "annotate",
            "deployment",
            "edge",
            "probe=1",
            "--overwrite",
            "--dry-run=server",
            &format!("--as={RECONCILER_USER}"),
        ]);
        String::from_utf8_lossy(&probe.stderr).contains(FROZEN)
    }
}

impl Freeze {
    fn install(rig: &ClusterRig) -> Freeze {
        let expression = format!("request.userInfo.username != '{RECONCILER_USER}'");
        let rules = admission::rules("apps", "deployments", &["UPDATE"]);
        let policy = Policy::deny(rig, "freeze", rules, &expression, FROZEN);
        let probe = Probe { plane: rig.plane, namespace: rig.namespace.clone() };
        eventually_blocking(PATIENCE, "the freeze enforced", || probe.frozen());
        Freeze { probe, _policy: Some(policy) }
    }
}

impl Drop for Freeze {
    /// Lifts the freeze, and waits until the server no longer enforces it.
    fn drop(&mut self) {
        self._policy.take();
        if !std::thread::panicking() {
            eventually_blocking(PATIENCE, "the freeze lifted", || !self.probe.frozen());
        }
    }
}

/// Someone else changes the Deployment's image: drift to repair.
fn drift(rig: &ClusterRig) {
    rig.kubectl(&["set", "image", "deployment/edge", "gateway=ghcr.io/acme/gateway:evil"]);
}

fn generation(g: &Gateway) -> i64 {
    g.metadata.as_ref().unwrap().generation
}

/// FAILED at its own generation after `failures` attempts, saying why.
async fn wait_failed(rig: &ClusterRig, failures: i32) -> Gateway {
    let what = format!("FAILED at its generation after {failures} failures");
    let g = rig
        .wait_for("edge", &what, |g| {
            let s = g.status.clone().unwrap_or_default();
            s.phase() == Phase::Failed && s.failure_count == failures
        })
        .await;
    let s = g.status.clone().unwrap();
    assert_eq!(s.observed_generation, generation(&g), "the wedge: FAILED at an equal generation");
    assert!(s.message.contains(FROZEN), "{}", s.message);
    let stalled = s.conditions.iter().find(|c| c.r#type == "Stalled").unwrap();
    assert_eq!(stalled.reason, "RetryBudgetExhausted");
    g
}

async fn wait_recovered(rig: &ClusterRig, generation: i64, image: &str) {
    let g = rig.wait_running("edge", generation).await;
    assert_eq!(g.status.unwrap().failure_count, 0);
    eventually_blocking(PATIENCE, "the drift repaired", || deployed_image(rig, "edge") == image);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_converged_gateway_whose_repair_fails_is_failed_at_its_generation_and_recovers() {
    let Some(mut rig) = ClusterRig::start("wedge") else { return };
    // A window of 5 s: each retry after FAILED comes 5 s after the last.
    let quick = ["--retry-budget", "2", "--failed-retry-floor", "5s", "--sync-period", "5s"];
    for identity in ["replica-a", "replica-b"] {
        let leader = ["--leader-elect", "--lease-duration", "3s", "--identity", identity];
        rig.reconciler(&[&quick[..], &leader[..]].concat());
    }
    rig.create_spec("edge", spec("1")).await;
    rig.wait_running("edge", 1).await;

    let freeze = Freeze::install(&rig);
    drift(&rig);
    wait_failed(&rig, 2).await;
    // A leader hand-over: the new leader continues the record (a third
    // failure, not a fresh budget).
    let holder = rig.lease_holder().expect("a leader");
    let index = usize::from(holder == "replica-b");
    rig.reconcilers[index].kill9();
    wait_failed(&rig, 3).await;
    // A restarted reconciler continues it too.
    let other = 1 - index;
    rig.reconcilers[other].kill9();
    rig.reconcilers[index].spawn();
    wait_failed(&rig, 4).await;
    // The cause goes away; nobody touches the spec: after the window it
    // recovers.
    drop(freeze);
    wait_recovered(&rig, 1, "ghcr.io/acme/gateway:1").await;
    assert_eq!(generation(&rig.get("edge").await.unwrap()), 1, "no spec change");

    // With a window of ten minutes, a retry request and a spec change each
    // recover it at once.
    rig.reconcilers.clear();
    let slow = ["--retry-budget", "2", "--failed-retry-floor", "10m", "--sync-period", "10m"];
    rig.reconciler(&slow);
    let freeze = Freeze::install(&rig);
    drift(&rig);
    wait_failed(&rig, 2).await;
    drop(freeze);
    let out = std::process::Command::new(binary("gatewayctl"))
        .args(["--server", &rig.store.endpoint(), "retry", "edge"])
        .env("HOME", temp_dir("wedge-home"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_recovered(&rig, 1, "ghcr.io/acme/gateway:1").await;

    let freeze = Freeze::install(&rig);
    drift(&rig);
    wait_failed(&rig, 2).await;
    drop(freeze);
    rig.set_spec("edge", spec("2")).await;
    wait_recovered(&rig, 2, "ghcr.io/acme/gateway:2").await;
}

/// The supervisor's args as rendered.
fn supervisor_args(rig: &ClusterRig) -> serde_json::Value {
    let deployment = rig.json(&["get", "deployment", "edge"]);
    deployment["spec"]["template"]["spec"]["containers"][1]["args"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_judged_by_the_merge_rules_of_server_side_apply() {
    let Some(mut rig) = ClusterRig::start("merge-rules") else { return };
    // A sync period far beyond the test: repairs come from the watches.
    rig.reconciler(&["--sync-period", "10m"]);
    rig.create_spec("edge", spec("1")).await;
    rig.wait_running("edge", 1).await;
    let args = supervisor_args(&rig);

    // Another team adds what server-side apply keeps for them: a port and
    // an env var in keyed lists of our container, an annotation we do not
    // render.
    let theirs = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "edge", "namespace": rig.namespace, "annotations": {"team/owner": "payments"}},
        "spec": {"template": {"spec": {"containers": [{
            "name": "gateway",
            "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
            "env": [{"name": "TEAM_EXTRA", "value": "1"}],
        }]}}},
    });
    rig.plane.kubectl_stdin(
        &["apply", "--server-side", "--field-manager=team", "-f", "-"],
        &theirs.to_string(),
    );
    // What we own whole or by key, changed by others: each repaired.
    rig.kubectl(&[
        "patch",
        "service",
        "edge",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"selector":{"app":"elsewhere"}}}"#,
    ]);
    eventually_blocking(PATIENCE, "the Service's selector repaired whole", || {
        rig.json(&["get", "service", "edge"])["spec"]["selector"]
            == serde_json::json!({"gantry.dev/gateway": "edge"})
    });
    rig.kubectl(&[
        "patch",
        "deployment",
        "edge",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/spec/template/spec/containers/1/args/-","value":"--debug"}]"#,
    ]);
    eventually_blocking(PATIENCE, "the supervisor's args repaired whole", || {
        supervisor_args(&rig) == args
    });
    rig.kubectl(&[
        "patch",
        "service",
        "edge",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/ports/0/appProtocol","value":"http"}]"#,
    ]);
    eventually_blocking(PATIENCE, "the value inside our port entry repaired", || {
        rig.json(&["get", "service", "edge"])["spec"]["ports"][0]["appProtocol"] == "https"
    });
    rig.wait_running("edge", 1).await;

    // The team's additions stayed through every repair, and a pass after
    // them found nothing to do.
    let applies = |rig: &ClusterRig| rig.reconcilers[0].logs().matches("manifests applied").count();
    let before = applies(&rig);
    let passes = rig.passes();
    rig.kubectl(&["annotate", "service", "edge", "team/owner=payments"]);
    rig.wait_passes_after(passes, 1);
    assert_eq!(applies(&rig), before, "an annotation of another writer was fought");
    let deployment = rig.json(&["get", "deployment", "edge"]);
    let gateway = &deployment["spec"]["template"]["spec"]["containers"][0];
    let ports: Vec<_> =
        gateway["ports"].as_array().unwrap().iter().map(|p| p["name"].clone()).collect();
    assert!(ports.contains(&serde_json::json!("metrics")), "{ports:?}");
    assert!(gateway["env"].as_array().unwrap().iter().any(|e| e["name"] == "TEAM_EXTRA"));
    assert_eq!(deployment["metadata"]["annotations"]["team/owner"], "payments");
    let service = rig.json(&["get", "service", "edge"]);
    assert_eq!(service["metadata"]["annotations"]["team/owner"], "payments");
}

/// What a mutating admission pins the gateway's image to, on every write
/// of a Deployment (as webhooks that pin digests do).
const PINNED: &str = "ghcr.io/acme/gateway:1@sha256:0000000000000000000000000000000000000000000000000000000000000001";

/// A MutatingAdmissionPolicy (the API server's own mutating admission,
/// GA in Kubernetes 1.36) rewriting the first container's image of every
/// Deployment written in the rig's namespace, once enforced.
fn pin_images(rig: &ClusterRig) -> Policy {
    let expression = format!(
        "[JSONPatch{{op: \"replace\", path: \"/spec/template/spec/containers/0/image\", value: \"{PINNED}\"}}]"
    );
    let rules = admission::rules("apps", "deployments", &["CREATE", "UPDATE"]);
    let policy = Policy::mutate(rig, "pin", rules, &expression);
    let probe = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "probe", "namespace": rig.namespace},
        "spec": {"selector": {"matchLabels": {"app": "probe"}}, "template": {
            "metadata": {"labels": {"app": "probe"}},
            "spec": {"containers": [{"name": "c", "image": "probe:1"}]}}},
    });
    eventually_blocking(PATIENCE, "the pinning enforced", || {
        let out = rig.plane.kubectl_stdin(
            &["create", "--dry-run=server", "-o", "json", "-f", "-"],
            &probe.to_string(),
        );
        String::from_utf8_lossy(&out.stdout).contains(PINNED)
    });
    policy
}

/// The reconciler's writes in the rig's namespace so far.
fn writes(rig: &ClusterRig) -> usize {
    rig.reconciler_requests()
        .iter()
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete")))
        .count()
}

async fn wait_drift_persists(rig: &ClusterRig, generation: i64) -> Gateway {
    rig.wait_for("edge", "the drift reported as persisting", |g| {
        g.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.reason == "DriftPersists" && c.observed_generation == generation)
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drift_every_repair_leaves_is_reported_and_then_costs_no_write() {
    let Some(mut rig) = ClusterRig::start("sticky") else { return };
    let _pinning = pin_images(&rig);
    rig.reconciler(&["--sync-period", "3s"]);
    rig.create_spec("edge", spec("1")).await;

    let g = wait_drift_persists(&rig, 1).await;
    let status = g.status.unwrap();
    let drifted = status.conditions.iter().find(|c| c.r#type == "Drifted").unwrap();
    assert!(
        drifted
            .message
            .starts_with("Deployment edge: .spec.template.spec.containers[gateway].image"),
        "{}",
        drifted.message
    );
    assert_eq!(deployed_image(&rig, "edge"), PINNED);
    // The workload is fine: Ready, RUNNING.
    let g = rig.wait_running("edge", 1).await;
    let ready = g.status.unwrap().conditions.into_iter().find(|c| c.r#type == "Ready").unwrap();
    assert_eq!(ready.status(), gantry_api::v1::ConditionStatus::True);

    // Two more sync periods (each pass counted): not one write.
    let before = writes(&rig);
    let passes = rig.passes();
    rig.wait_passes_after(passes, 2);
    assert_eq!(writes(&rig), before, "a persisting drift was written again");
    let repairs = rig.reconcilers[0].logs().matches("owned objects drifted; repairing").count();
    assert_eq!(repairs, 3, "the repair budget");

    // A spec change is applied, and the drift is judged afresh.
    rig.set_spec("edge", spec("2")).await;
    wait_drift_persists(&rig, 2).await;
    let repairs = rig.reconcilers[0].logs().matches("owned objects drifted; repairing").count();
    assert_eq!(repairs, 6, "a fresh budget for the new generation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_is_found_as_kubectl_finds_it_with_several_paths_merged() {
    let Some(mut rig) = ClusterRig::start("kubeconfig") else { return };
    // The reconciler's kubeconfig in two files, each useless alone: the
    // context in one, the cluster and the user in the other.
    let whole = std::fs::read_to_string(&rig.plane.reconciler_kubeconfig).unwrap();
    let (head, contexts) = whole.split_at(whole.find("contexts:").unwrap());
    let header = "apiVersion: v1\nkind: Config\n";
    let body = head.strip_prefix(header).unwrap();
    let (context_file, cluster_file) = (rig.dir.join("context.yaml"), rig.dir.join("cluster.yaml"));
    std::fs::write(&context_file, format!("{header}{contexts}")).unwrap();
    std::fs::write(&cluster_file, format!("{header}{body}")).unwrap();
    let kubeconfig = format!("{}:{}", context_file.display(), cluster_file.display());
    rig.reconciler_with_env(&[], &[("KUBECONFIG", kubeconfig.as_str())]);
    rig.create_spec("edge", spec("1")).await;
    rig.wait_running("edge", 1).await;
    assert_eq!(deployed_image(&rig, "edge"), "ghcr.io/acme/gateway:1");
}

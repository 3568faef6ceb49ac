//! gateway-reconciler judged by a real control plane (tests/k8s): the
//! reconciler runs as its own process with the identity deploy/'s Role is
//! bound to, so RBAC, admission (the `restricted` Pod Security Standard),
//! schema validation, server-side apply, the deployment and replicaset
//! controllers, garbage collection and kwok's pods are all real.
//!
//! Skips with one line when the binaries are absent (tests/k8s/setup.sh
//! builds them), and fails instead under `CI=true`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use gantry_api::v1::{ConditionStatus, GatewaySpec, Phase, Route};
use gantry_testkit::cluster::{ClusterRig as Rig, OWNED, PATIENCE};
use gantry_testkit::eventually_blocking;
use gantry_testkit::gateway::named;
use gantry_testkit::k8s::{ControlPlane, NEVER_READY_IMAGE};
use gantry_testkit::{temp_dir, ReconcilerProcess};
use serde_json::Value;

/// A config entry of several KB, as real gateways carry.
fn routes() -> String {
    (0..120)
        .map(|i| format!("- host: svc-{i}.example.com\n  backend: http://svc-{i}:8080\n"))
        .collect()
}

fn image(tag: &str) -> String {
    format!("ghcr.io/acme/gateway:{tag}")
}

fn full_spec(tag: &str) -> GatewaySpec {
    GatewaySpec {
        image: image(tag),
        replicas: Some(2),
        route: Some(Route { host: "edge.example.com".into(), tls_secret_name: "edge-tls".into() }),
        config: [("mode".to_string(), "strict".to_string()), ("routes.yaml".to_string(), routes())]
            .into(),
        resources: Some(gantry_api::v1::ResourceRequirements {
            requests: [("cpu".to_string(), "100m".to_string())].into(),
            limits: [("cpu".to_string(), "1".to_string())].into(),
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_rolls_out_changes_and_is_deleted_with_everything_it_owns() {
    let Some(rig) = Rig::start("lifecycle") else { return };
    lifecycle(rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_rolls_out_changes_and_is_deleted_on_postgres() {
    let Some(postgres) = gantry_testkit::TestDatabase::postgres().await else { return };
    let Some(rig) = Rig::start_on("lifecycle-pg", &postgres.url, temp_dir("lifecycle-pg")) else {
        return;
    };
    lifecycle(rig).await;
    postgres.drop_database().await;
}

/// Objects in the namespace that gantry does not own (named `team-*`): two
/// of kinds it manages, one carrying its labels for another gateway.
fn foreign_objects(rig: &Rig) -> Vec<Value> {
    let labelled = serde_json::json!({"app.kubernetes.io/managed-by": "gantry", "gantry.dev/gateway": "other"});
    vec![
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team-settings", "namespace": rig.namespace}, "data": {"k": "v"}}),
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "team-robot", "namespace": rig.namespace}}),
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team-other", "namespace": rig.namespace, "labels": labelled}, "data": {"k": "v"}}),
    ]
}

/// `kind/name` → resourceVersion of the foreign objects.
fn versions(rig: &Rig, objects: &[Value]) -> Vec<(String, Value)> {
    objects
        .iter()
        .map(|o| {
            let (kind, name) =
                (o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap());
            let live = rig.json(&["get", kind, name]);
            (format!("{kind}/{name}"), live["metadata"]["resourceVersion"].clone())
        })
        .collect()
}

async fn lifecycle(mut rig: Rig) {
    let foreign = foreign_objects(&rig);
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": foreign});
    rig.plane.kubectl_stdin(
        &["apply", "--server-side", "--field-manager=team", "-f", "-"],
        &list.to_string(),
    );
    let foreign_before = versions(&rig, &foreign);
    rig.reconciler(&[]);

    rig.create_spec("edge", full_spec("1")).await;
    rig.admit("edge", "lb-1.example.net");
    let g = rig.wait_running("edge", 1).await;
    let status = g.status.unwrap();
    let ready = status.conditions.iter().find(|c| c.r#type == "Ready").unwrap();
    assert_eq!((ready.status(), ready.reason.as_str()), (ConditionStatus::True, "RolloutComplete"));
    let config_name = rig.config_map_name("edge");
    assert_eq!(
        rig.objects(OWNED),
        [
            &format!("configmap/{config_name}"),
            "deployment.apps/edge",
            "ingress.networking.k8s.io/edge",
            "poddisruptionbudget.policy/edge",
            "service/edge",
            "serviceaccount/edge",
        ]
        .map(String::from)
        .into(),
    );
    // RUNNING means the real controllers rolled it out: two Ready pods of
    // the image, made by a ReplicaSet the Deployment owns.
    assert_eq!(rig.ready_pod_images(), [image("1"), image("1")]);
    let deployment = rig.json(&["get", "deployment", "edge"]);
    assert_eq!(deployment["status"]["availableReplicas"], 2);
    assert_eq!(deployment["status"]["observedGeneration"], deployment["metadata"]["generation"]);
    let config = rig.config_map("edge");
    assert_eq!(config["immutable"], true);
    assert_eq!(config["data"]["mode"], "strict");
    assert_eq!(config["data"]["routes.yaml"].as_str().unwrap(), routes());

    // A new generation rolls out through a second ReplicaSet.
    rig.set_spec("edge", full_spec("2")).await;
    rig.wait_running("edge", 2).await;
    assert_eq!(rig.ready_pod_images(), [image("2"), image("2")], "only new pods remain");
    let sets = rig.json(&["get", "replicasets"]);
    let sets = sets["items"].as_array().unwrap();
    assert_eq!(sets.len(), 2, "one ReplicaSet per rolled-out template");
    for set in sets {
        assert_eq!(set["metadata"]["ownerReferences"][0]["name"], "edge");
        let replicas = set["spec"]["replicas"].as_i64().unwrap();
        let tag = set["spec"]["template"]["spec"]["containers"][0]["image"].as_str().unwrap();
        assert_eq!(replicas, if tag == image("2") { 2 } else { 0 }, "{tag}");
    }

    // Shrinking to one replica prunes the PodDisruptionBudget.
    rig.set_spec("edge", GatewaySpec { replicas: Some(1), ..full_spec("2") }).await;
    rig.wait_running("edge", 3).await;
    assert!(!rig.objects(OWNED).contains("poddisruptionbudget.policy/edge"));

    // Deletion removes every owned object, and garbage collection the
    // ReplicaSets and pods they own.
    rig.delete("edge").await;
    rig.wait_gone("edge").await;
    rig.wait_empty(&format!("{OWNED},replicasets,pods"));
    let events = rig.reconciler_requests();
    let refused: Vec<_> = events.iter().filter(|e| e["responseStatus"]["code"] == 403).collect();
    assert!(refused.is_empty(), "the reconciler was refused: {refused:?}");

    // Nothing it does not own was touched: the foreign objects are as they
    // were, and every write it made was to the gateway's own objects.
    assert_eq!(versions(&rig, &foreign), foreign_before);
    let writes: Vec<_> = events
        .iter()
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete")))
        .collect();
    assert!(!writes.is_empty());
    let ours = |name: &str| name == "edge" || name == config_name;
    let foreign_writes: Vec<_> =
        writes.iter().filter(|e| !ours(e["objectRef"]["name"].as_str().unwrap_or(""))).collect();
    assert!(
        foreign_writes.is_empty(),
        "the reconciler wrote to objects it does not own: {foreign_writes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_that_never_becomes_available_is_degraded_until_a_fix() {
    let Some(mut rig) = Rig::start("degraded") else { return };
    rig.reconciler(&[]);

    rig.create_spec("stuck", GatewaySpec { image: NEVER_READY_IMAGE.into(), ..Default::default() })
        .await;
    // Pods exist (admitted, scheduled) but never become Ready; after the
    // 6 s progress deadline the deployment controller says so.
    let g = rig
        .wait_for("stuck", "DEGRADED", |g| {
            g.status.as_ref().is_some_and(|s| s.phase() == Phase::Degraded)
        })
        .await;
    let status = g.status.unwrap();
    let stalled = status.conditions.iter().find(|c| c.r#type == "Stalled").unwrap();
    assert_eq!(stalled.status(), ConditionStatus::True);
    assert_eq!(stalled.reason, "ProgressDeadlineExceeded");
    assert_eq!(status.observed_generation, 1);
    let deployment = rig.json(&["get", "deployment", "stuck"]);
    let progressing = deployment["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Progressing")
        .unwrap()
        .clone();
    assert_eq!(progressing["reason"], "ProgressDeadlineExceeded", "{deployment}");

    // A fixing spec change rolls out and the gateway is RUNNING again.
    rig.set_spec("stuck", GatewaySpec { image: image("fixed"), ..Default::default() }).await;
    let g = rig.wait_running("stuck", 2).await;
    let ready = g.status.unwrap().conditions.into_iter().find(|c| c.r#type == "Ready").unwrap();
    assert_eq!(ready.status(), ConditionStatus::True);
    assert_eq!(rig.ready_pod_images(), [image("fixed")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_address_is_what_the_ingress_controller_reports() {
    let Some(mut rig) = Rig::start("route") else { return };
    rig.reconciler(&["--ingress-class", "edge-lb"]);
    let spec = GatewaySpec {
        image: image("1"),
        route: Some(Route { host: "edge.example.com".into(), tls_secret_name: String::new() }),
        ..Default::default()
    };
    rig.create_spec("edge", spec).await;
    // Rolled out, but no ingress controller has admitted the route: not
    // RUNNING, not Ready, and RouteAdmitted says what it waits for.
    let g = rig
        .wait_for("edge", "waiting for the route", |g| {
            g.status.as_ref().is_some_and(|s| {
                s.provisioning.iter().any(|p| {
                    p.name == "RouteAdmitted" && p.state() == gantry_api::v1::StepState::InProgress
                }) && s.observed_generation == 1
            })
        })
        .await;
    let status = g.status.unwrap();
    assert_eq!((status.phase(), status.route_address.as_str()), (Phase::Provisioning, ""));
    let ready = status.conditions.iter().find(|c| c.r#type == "Ready").unwrap();
    assert_eq!(ready.status(), ConditionStatus::False);
    let ingress = rig.json(&["get", "ingress", "edge"]);
    assert_eq!(ingress["spec"]["ingressClassName"], "edge-lb");
    assert_eq!(ingress["spec"]["rules"][0]["host"], "edge.example.com");
    assert_eq!(
        ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"],
        "edge"
    );

    // The test plays the ingress controller: it publishes the address.
    rig.admit("edge", "lb-1.example.net");
    let g = rig.wait_running("edge", 1).await;
    assert_eq!(g.status.unwrap().route_address, "lb-1.example.net");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_elect_one_leader_on_a_real_lease_and_the_other_takes_over() {
    let Some(mut rig) = Rig::start("leader") else { return };
    rig.replicas("4s");
    let holder = |rig: &Rig| rig.lease_holder().unwrap_or_default();
    eventually_blocking(PATIENCE, "no leader was elected", || !holder(&rig).is_empty());
    let first = holder(&rig);
    assert!(first == "replica-a" || first == "replica-b", "{first}");
    rig.create_spec("one", GatewaySpec { image: image("1"), ..Default::default() }).await;
    rig.wait_running("one", 1).await;
    let (leader, follower) = if first == "replica-a" { (0, 1) } else { (1, 0) };
    let applied = |r: &ReconcilerProcess| r.logs().matches("manifests applied").count();
    assert!(applied(&rig.reconcilers[leader]) >= 1);
    assert_eq!(applied(&rig.reconcilers[follower]), 0, "only the leader applies");

    // The leader dies without releasing the Lease; the other replica takes
    // over once it expires and reconciles what comes next.
    rig.reconcilers[leader].kill9();
    rig.create_spec("two", GatewaySpec { image: image("1"), ..Default::default() }).await;
    rig.wait_running("two", 1).await;
    let second = holder(&rig);
    assert_ne!(second, first, "the Lease changed hands");
    assert!(applied(&rig.reconcilers[follower]) >= 1);
}

/// What the reconciler called, as RBAC sees it: `(group, resource, verb)`.
/// A server-side apply (a PATCH with a field manager) may also create.
fn used_permissions(events: &[Value]) -> BTreeSet<(String, String, String)> {
    let mut used = BTreeSet::new();
    for e in events {
        let group = e["objectRef"]["apiGroup"].as_str().unwrap_or("").to_string();
        let resource = e["objectRef"]["resource"].as_str().unwrap_or("").to_string();
        let verb = e["verb"].as_str().unwrap_or("").to_string();
        if verb == "patch" && e["requestURI"].as_str().unwrap_or("").contains("fieldManager=") {
            used.insert((group.clone(), resource.clone(), "create".to_string()));
        }
        used.insert((group, resource, verb));
    }
    used
}

fn granted_permissions(plane: &ControlPlane) -> BTreeSet<(String, String, String)> {
    let roles: Vec<Value> = plane
        .render("base")
        .into_iter()
        .filter(|o| o["kind"] == "Role")
        .filter(|o| {
            o["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("gateway-reconciler"))
        })
        .collect();
    assert_eq!(roles.len(), 2, "the gateways' objects and the Lease");
    let mut granted = BTreeSet::new();
    for rule in roles.iter().flat_map(|r| r["rules"].as_array().unwrap()) {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    granted.insert((
                        group.as_str().unwrap().to_string(),
                        resource.as_str().unwrap().to_string(),
                        verb.as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    granted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_grants_exactly_what_the_reconciler_calls_on_the_real_audit_log() {
    let Some(mut rig) = Rig::start("rbac") else { return };
    rig.reconciler(&["--leader-elect", "--lease-duration", "4s", "--identity", "rbac"]);
    // A full lifecycle: create with a route and three replicas, change,
    // shrink (prune), replace a Deployment (opted in), delete.
    rig.create_spec("edge", GatewaySpec { replicas: Some(3), ..full_spec("1") }).await;
    rig.admit("edge", "lb-1.example.net");
    rig.wait_running("edge", 1).await;
    rig.set_spec("edge", GatewaySpec { replicas: Some(3), ..full_spec("2") }).await;
    rig.wait_running("edge", 2).await;
    rig.set_spec("edge", GatewaySpec { image: image("2"), ..Default::default() }).await;
    rig.wait_running("edge", 3).await;
    // A Deployment replaced for a field that cannot change (opted in).
    opt_in_to_recreate(&rig).await;
    let uid = rig.get("edge").await.unwrap().metadata.unwrap().uid;
    let old_uid = swap_in_another_selector(&mut rig, &uid);
    eventually_blocking(PATIENCE, "the old Deployment replaced and its pods retired", || {
        // Between the old one's deletion and the new apply there is none.
        let live = rig.kubectl(&["get", "deployment", "edge", "-o", "json", "--ignore-not-found"]);
        let live: Value = serde_json::from_str(&live).unwrap_or(Value::Null);
        !live.is_null()
            && live["metadata"]["uid"] != old_uid
            && rig.ready_pod_images() == [image("2")]
    });
    rig.delete("edge").await;
    rig.wait_gone("edge").await;
    // Lease renewals (update) happen every few seconds.
    eventually_blocking(PATIENCE, "the Lease was never renewed", || {
        rig.reconciler_requests()
            .iter()
            .any(|e| e["verb"] == "update" && e["objectRef"]["resource"] == "leases")
    });

    let events = rig.reconciler_requests();
    let refused: Vec<_> = events.iter().filter(|e| e["responseStatus"]["code"] == 403).collect();
    assert!(refused.is_empty(), "refused by RBAC: {refused:?}");
    let used = used_permissions(&events);
    let granted = granted_permissions(rig.plane);
    let missing: Vec<_> = used.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(missing.is_empty(), "the Role lacks what the reconciler calls: {missing:?}");
    assert!(unused.is_empty(), "the Role grants what the reconciler never calls: {unused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_by_others_are_repaired_and_metadata_only_changes_are_not_drift() {
    let Some(mut rig) = Rig::start("drift") else { return };
    rig.reconciler(&["--sync-period", "2s"]);
    rig.create_spec("edge", GatewaySpec { image: image("1"), ..Default::default() }).await;
    rig.wait_running("edge", 1).await;
    let repairs = |rig: &Rig| rig.reconcilers[0].logs().matches("owned objects drifted").count();
    let generation = |rig: &Rig| {
        rig.json(&["get", "deployment", "edge"])["metadata"]["generation"].as_i64().unwrap()
    };

    // The API server bumps a Deployment's generation on an annotation
    // change (as on the deployment controller's own revision annotation):
    // not drift. Two resyncs pass without a repair.
    let before = generation(&rig);
    rig.kubectl(&["annotate", "deployment", "edge", "example.com/note=hello"]);
    assert_eq!(generation(&rig), before + 1, "the real server bumps the generation");
    rig.wait_passes(2);
    assert_eq!(repairs(&rig), 0, "an annotation is not drift");

    // Someone else changes the image: repaired.
    rig.kubectl(&["set", "image", "deployment/edge", "gateway=evil:1"]);
    eventually_blocking(PATIENCE, "the edited image repaired", || {
        let live = rig.json(&["get", "deployment", "edge"]);
        live["spec"]["template"]["spec"]["containers"][0]["image"] == image("1").as_str()
    });
    assert!(repairs(&rig) >= 1);

    // Someone deletes the Deployment: re-created, and it rolls out again.
    rig.kubectl(&["delete", "deployment", "edge", "--wait=true"]);
    eventually_blocking(PATIENCE, "the deleted Deployment was never re-created", || {
        rig.objects("deployments").contains("deployment.apps/edge")
    });
    rig.wait_running("edge", 1).await;
    assert_eq!(rig.json(&["get", "deployment", "edge"])["status"]["availableReplicas"], 1);
}

/// While no reconciler runs, replaces the gateway's Deployment with one of
/// another selector (as an older release might have left it), its pods
/// Ready on `image("0")`; restarts the reconcilers. The old Deployment's uid.
fn swap_in_another_selector(rig: &mut Rig, uid: &str) -> Value {
    for r in &mut rig.reconcilers {
        r.kill9();
    }
    rig.kubectl(&["delete", "deployment", "edge", "--wait=true"]);
    let old = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "edge", "namespace": rig.namespace,
                     "labels": {"app.kubernetes.io/managed-by": "gantry", "gantry.dev/gateway": "edge",
                                "gantry.dev/gateway-uid": uid}},
        "spec": {
            "selector": {"matchLabels": {"app": "edge-old"}},
            "template": {
                // gantry's marks, but not the label the new selector
                // matches: its ReplicaSet is not adopted, it is retired.
                "metadata": {"labels": {"app": "edge-old", "app.kubernetes.io/managed-by": "gantry",
                                        "gantry.dev/gateway-uid": uid}},
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "gateway", "image": image("0"), "securityContext": {
                        "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
                },
            },
        },
    });
    rig.plane.kubectl_stdin(
        &["apply", "--server-side", "--field-manager=older-gantry", "-f", "-"],
        &old.to_string(),
    );
    eventually_blocking(PATIENCE, "the old Deployment's pod Ready", || {
        rig.ready_pod_images() == [image("0")]
    });
    let old_uid = rig.json(&["get", "deployment", "edge"])["metadata"]["uid"].clone();
    for r in &mut rig.reconcilers {
        r.spawn();
    }
    old_uid
}

/// Opts the gateway in to replacing what cannot change.
async fn opt_in_to_recreate(rig: &Rig) {
    let mut g = rig.get("edge").await.unwrap();
    let annotations = &mut g.metadata.as_mut().unwrap().annotations;
    annotations.insert("gantry.dev/recreate-on-immutable".into(), "true".into());
    rig.update(g, &["metadata.annotations"]).await;
}

/// Waits for RUNNING while sampling the pods: at every sample some pod is
/// Ready (the old ones go only after a new one is available), and at the
/// end only the new image runs and no ReplicaSet is left without an owner.
async fn replaced_without_a_gap(rig: &Rig) {
    let sampling = std::sync::atomic::AtomicBool::new(true);
    let samples = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut samples = Vec::new();
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                samples.push(rig.ready_pod_images());
            }
            samples
        });
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(rig.wait_running("edge", 1))
        });
        eventually_blocking(PATIENCE, "the old pods retired", || {
            rig.ready_pod_images() == [image("1")]
        });
        sampling.store(false, std::sync::atomic::Ordering::SeqCst);
        sampler.join().unwrap()
    });
    let gaps: Vec<_> = samples.iter().filter(|ready| ready.is_empty()).collect();
    assert!(gaps.is_empty(), "no pod Ready in {} of {} samples", gaps.len(), samples.len());
    let sets = rig.json(&["get", "replicasets"]);
    for rs in sets["items"].as_array().unwrap() {
        assert!(rs["metadata"]["ownerReferences"].is_array(), "left behind: {rs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_whose_selector_differs_is_reported_and_replaced_only_when_opted_in() {
    let Some(mut rig) = Rig::start("immutable") else { return };
    rig.reconciler(&["--retry-budget", "2"]);
    rig.create_spec("edge", GatewaySpec { image: image("1"), ..Default::default() }).await;
    rig.wait_running("edge", 1).await;
    let uid = rig.get("edge").await.unwrap().metadata.unwrap().uid;
    let old_uid = swap_in_another_selector(&mut rig, &uid);

    // Without the opt-in: FAILED, saying which field and the way out;
    // the live Deployment and its pods untouched.
    let failed = rig
        .wait_for("edge", "FAILED", |g| {
            g.status.clone().unwrap_or_default().phase() == Phase::Failed
        })
        .await;
    let message = failed.status.unwrap().message;
    assert!(message.contains("spec.selector"), "{message}");
    assert!(message.contains("gantry.dev/recreate-on-immutable=true"), "{message}");
    assert!(message.contains("--recreate-on-immutable"), "{message}");
    assert_eq!(rig.json(&["get", "deployment", "edge"])["metadata"]["uid"], old_uid);
    assert_eq!(rig.ready_pod_images(), [image("0")]);

    // Opted in: replaced at once (a fresh budget), the old pods serving
    // until a new one is Ready.
    opt_in_to_recreate(&rig).await;
    replaced_without_a_gap(&rig).await;
    let live = rig.json(&["get", "deployment", "edge"]);
    assert_ne!(live["metadata"]["uid"], old_uid);
    assert_eq!(
        live["spec"]["selector"]["matchLabels"],
        serde_json::json!({"gantry.dev/gateway": "edge"})
    );
    assert!(rig.reconcilers[0].logs().contains("replacing the object (opted in)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_manifests_pass_strict_validation_and_the_restricted_standard() {
    use gantry_reconciler::render::{render, RenderSettings};
    let Some(plane) = ControlPlane::shared() else { return };
    let namespace = plane.namespace("render");
    let spec = GatewaySpec {
        supervisor_image: "ghcr.io/acme/supervisor:2".into(),
        server_dns_names: vec!["edge.example.com".into(), "*.edge.example.com".into()],
        oidc: Some(gantry_api::v1::Oidc {
            issuer_url: "https://idp.example.com".into(),
            client_id: "edge".into(),
            audiences: vec!["api".into()],
        }),
        credential_driver: "vault".into(),
        resources: Some(gantry_api::v1::ResourceRequirements {
            requests: [
                ("cpu".to_string(), "100m".to_string()),
                ("memory".to_string(), "128Mi".to_string()),
            ]
            .into(),
            limits: [
                ("cpu".to_string(), "1".to_string()),
                ("memory".to_string(), "256Mi".to_string()),
            ]
            .into(),
        }),
        ..full_spec("1")
    };
    let gateway = |name: &str, spec: GatewaySpec| named(name).with_spec(spec).build();
    let settings = RenderSettings { namespace: namespace.clone(), ..RenderSettings::default() };
    let full = render(&gateway("edge", spec), &settings);
    let kinds: Vec<&str> = full.objects.iter().map(|m| m.kind).collect();
    assert_eq!(
        kinds,
        ["ServiceAccount", "ConfigMap", "Service", "Deployment", "Ingress", "PodDisruptionBudget"]
    );
    // A gateway that says nothing of resources gets the defaults.
    let minimal = render(
        &gateway("plain", GatewaySpec { image: image("1"), ..Default::default() }),
        &settings,
    );
    for (rendered, dry_run) in [(&full, true), (&minimal, false)] {
        let items: Vec<_> = rendered.objects.iter().map(|m| &m.body).collect();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let mut args =
            vec!["apply", "--server-side", "--validate=strict", "--field-manager=render-test"];
        if dry_run {
            args.push("--dry-run=server");
        }
        let out = plane.kubectl_stdin(&[&args[..], &["-f", "-"]].concat(), &list.to_string());
        // The namespace warns of the restricted standard on workloads.
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(warnings.trim().is_empty(), "the API server warned: {warnings}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), rendered.objects.len());
    }
    // The standard is enforced on pods: the ReplicaSet's pods are admitted.
    plane.wait_for(
        "the rendered Deployment's pods to be admitted under the restricted standard",
        Duration::from_secs(60),
        &["get", "pods", "-n", &namespace, "-l", "gantry.dev/gateway=plain", "-o", "name"],
        |pods| !pods.is_empty(),
    );
}

/// Writes (create, update, patch, delete) in the audit events.
fn writes(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete")))
        .filter(|e| e["objectRef"]["resource"] != "leases")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_named_like_the_control_plane_cannot_take_it_over() {
    let Some(mut rig) = Rig::start("takeover") else { return };
    // The control plane's own objects, in the namespace gateways use.
    let theirs = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gateway-store", "namespace": rig.namespace}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gateway-store", "namespace": rig.namespace},
         "spec": {"selector": {"app": "gateway-store"}, "ports": [{"name": "grpc", "port": 50051}]}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gateway-reconciler", "namespace": rig.namespace}},
    ]});
    rig.plane.kubectl_stdin(
        &["apply", "--server-side", "--field-manager=platform", "-f", "-"],
        &theirs.to_string(),
    );
    let objects: Vec<Value> = theirs["items"].as_array().unwrap().clone();
    let before = versions(&rig, &objects);
    rig.reconciler(&["--retry-budget", "2"]);

    for (gateway, blocked) in [
        ("gateway-store", "ServiceAccount gateway-store"),
        ("gateway-reconciler", "ServiceAccount gateway-reconciler"),
    ] {
        rig.create_spec(gateway, GatewaySpec { image: image("1"), ..Default::default() }).await;
        let g = rig
            .wait_for(gateway, "FAILED on the ownership check", |g| {
                g.status.as_ref().is_some_and(|s| s.phase() == Phase::Failed)
            })
            .await;
        let message = g.status.unwrap().message;
        assert!(
            message.contains(&format!("{blocked} exists and is not managed by this gateway")),
            "{message}"
        );
    }
    assert_eq!(versions(&rig, &objects), before, "the control plane's objects were changed");

    // Deleting the attacking gateways deletes nothing of the control plane.
    for gateway in ["gateway-store", "gateway-reconciler"] {
        rig.delete(gateway).await;
        rig.wait_gone(gateway).await;
    }
    assert_eq!(versions(&rig, &objects), before, "the control plane's objects were changed");
    let events = rig.reconciler_requests();
    let touched: Vec<_> = writes(&events)
        .into_iter()
        .filter(|e| {
            let (resource, name) = (&e["objectRef"]["resource"], &e["objectRef"]["name"]);
            objects.iter().any(|o| {
                o["metadata"]["name"] == *name
                    && resource.as_str().is_some_and(|r| {
                        r.trim_end_matches('s') == o["kind"].as_str().unwrap().to_ascii_lowercase()
                    })
            })
        })
        .collect();
    assert!(touched.is_empty(), "the reconciler wrote to objects it does not own: {touched:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_owned_kind_is_repaired_an_idle_fleet_costs_no_writes_and_scaling_is_not_fought() {
    let Some(mut rig) = Rig::start("drift-all") else { return };
    rig.reconciler(&["--sync-period", "2s"]);
    rig.create_spec("edge", full_spec("1")).await;
    rig.admit("edge", "lb-1.example.net");
    rig.create_spec("auto", GatewaySpec { image: image("1"), ..Default::default() }).await;
    rig.wait_running("edge", 1).await;
    rig.wait_running("auto", 1).await;

    // Idle and converged: resyncs and relists read, and write nothing.
    rig.wait_passes(2);
    let before = writes(&rig.reconciler_requests()).len();
    rig.wait_passes(6);
    let after = rig.reconciler_requests();
    let idle_writes: Vec<_> = writes(&after).into_iter().skip(before).collect();
    let summary: Vec<String> = idle_writes
        .iter()
        .map(|e| {
            format!(
                "{} {} {} at {}",
                e["verb"],
                e["objectRef"]["resource"],
                e["objectRef"]["name"],
                e["requestReceivedTimestamp"]
            )
        })
        .collect();
    assert!(
        idle_writes.is_empty(),
        "an idle converged fleet wrote: {summary:?}\n{}",
        rig.reconcilers[0].logs()
    );

    // Replicas the spec leaves unset belong to whoever scales.
    rig.kubectl(&["scale", "deployment", "auto", "--replicas=3"]);
    rig.wait_passes(6);
    let scaled = rig.json(&["get", "deployment", "auto"]);
    assert_eq!(scaled["spec"]["replicas"], 3, "the reconciler fought a scale: {scaled}");

    // Another actor's change to any field gantry applies is repaired.
    type Edit = (&'static str, &'static str, &'static str, fn(&Value) -> bool);
    let edits: [Edit; 7] = [
        // (Its data cannot change: it is immutable. Its labels can.)
        (
            "configmap",
            "merge",
            r#"{"metadata":{"labels":{"app.kubernetes.io/name":"evil"}}}"#,
            |o| o["metadata"]["labels"]["app.kubernetes.io/name"] == "gantry-gateway",
        ),
        ("service", "merge", r#"{"spec":{"selector":{"gantry.dev/gateway":"evil"}}}"#, |o| {
            o["spec"]["selector"]["gantry.dev/gateway"] == "edge"
        }),
        // (Changing `port` itself would change the list item's key, which
        // server-side apply then treats as another item owned by the editor.)
        (
            "service",
            "json",
            r#"[{"op":"replace","path":"/spec/ports/0/targetPort","value":9999}]"#,
            |o| o["spec"]["ports"][0]["targetPort"] == "https",
        ),
        ("serviceaccount", "merge", r#"{"automountServiceAccountToken":true}"#, |o| {
            o["automountServiceAccountToken"] == false
        }),
        (
            "ingress",
            "json",
            r#"[{"op":"replace","path":"/spec/rules/0/host","value":"evil.example.com"}]"#,
            |o| o["spec"]["rules"][0]["host"] == "edge.example.com",
        ),
        ("poddisruptionbudget", "merge", r#"{"spec":{"maxUnavailable":2}}"#, |o| {
            o["spec"]["maxUnavailable"] == 1
        }),
        (
            "deployment",
            "json",
            r#"[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"evil:1"}]"#,
            |o| o["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/acme/gateway:1",
        ),
    ];
    for (kind, patch_type, patch, repaired) in edits {
        let name = if kind == "configmap" { rig.config_map_name("edge") } else { "edge".into() };
        rig.kubectl(&["patch", kind, &name, "--type", patch_type, "-p", patch]);
        // With a 2 s resync a repair comes within seconds whether the
        // watch or the resync brings it; what is checked is that it comes.
        let what = format!("{kind}: the edit repaired");
        eventually_blocking(PATIENCE, &what, || repaired(&rig.json(&["get", kind, &name])));
    }
    rig.wait_running("edge", 1).await;
}

/// The replica an audit event came from (its User-Agent names it).
fn replica_of(event: &Value) -> Option<&'static str> {
    let agent = event["userAgent"].as_str().unwrap_or("");
    ["replica-a", "replica-b"].into_iter().find(|r| agent.contains(&format!("({r})")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_twenty_forced_leadership_changes_only_the_lease_holder_writes() {
    let Some(mut rig) = Rig::start("failover") else { return };
    rig.replicas("2s");
    let wait_holder = |rig: &Rig, not: Option<&str>| {
        let mut holder = None;
        eventually_blocking(PATIENCE, &format!("a new leader after {not:?}"), || {
            holder = rig.lease_holder().filter(|h| Some(h.as_str()) != not);
            holder.is_some()
        });
        holder.unwrap_or_default()
    };
    let names = ["f0", "f1", "f2"];
    for name in names {
        rig.create_spec(name, GatewaySpec { image: image("0"), ..Default::default() }).await;
    }
    let mut leader = wait_holder(&rig, None);
    // When each stopped leader was let go again.
    let mut resumed: Vec<(String, std::time::SystemTime)> = Vec::new();
    for change in 0..20 {
        // Work in flight while the leader is stopped: every gateway rolls.
        for name in names {
            rig.set_spec(
                name,
                GatewaySpec { image: image(&(change + 1).to_string()), ..Default::default() },
            )
            .await;
        }
        let index = usize::from(leader == "replica-b");
        if change % 2 == 0 {
            rig.reconcilers[index].signal("-STOP");
            let next = wait_holder(&rig, Some(&leader));
            // The frozen leader wakes up in the middle of its pass.
            resumed.push((leader.clone(), std::time::SystemTime::now()));
            rig.reconcilers[index].signal("-CONT");
            leader = next;
        } else {
            rig.reconcilers[index].kill9();
            let next = wait_holder(&rig, Some(&leader));
            rig.reconcilers[index].spawn();
            leader = next;
        }
        for name in names {
            rig.wait_running(name, 2 + change).await;
        }
    }

    // From the audit log: every write to a gateway's objects came from the
    // replica whose Lease write (acquire or renew) came last before it. The
    // one exception is what a frozen leader had already handed to its
    // connection when it was stopped: such a request leaves when it wakes
    // (no client-side election can recall it), so it is allowed only right
    // after that replica was let go, at most one per gateway in flight; its
    // passes stop there (every later write is checked against the fence).
    let mut events: Vec<Value> = rig
        .reconciler_requests()
        .into_iter()
        .filter(|e| e["responseStatus"]["code"].as_i64().is_some_and(|c| c < 300))
        .collect();
    events.sort_by(|a, b| {
        a["requestReceivedTimestamp"].as_str().cmp(&b["requestReceivedTimestamp"].as_str())
    });
    let received = |e: &Value| -> std::time::SystemTime {
        let text = e["requestReceivedTimestamp"].as_str().unwrap();
        std::time::SystemTime::try_from(text.parse::<prost_types::Timestamp>().unwrap()).unwrap()
    };
    let (mut holder_now, mut changes, mut checked) = (None, 0, 0);
    let mut leases: Vec<String> = Vec::new();
    let mut in_flight: Vec<usize> = vec![0; resumed.len()];
    for e in &events {
        let verb = e["verb"].as_str().unwrap_or("");
        if !matches!(verb, "create" | "update" | "patch" | "delete") {
            continue;
        }
        let replica = replica_of(e).unwrap_or_else(|| panic!("a write from no known replica: {e}"));
        if e["objectRef"]["resource"] == "leases" {
            if holder_now.is_some_and(|h| h != replica) {
                changes += 1;
            }
            holder_now = Some(replica);
            leases.push(format!("{replica} {}", e["requestReceivedTimestamp"]));
            continue;
        }
        checked += 1;
        if holder_now == Some(replica) {
            continue;
        }
        let at = received(e);
        let woke = resumed.iter().position(|(r, t)| {
            r == replica && *t <= at && at.duration_since(*t).unwrap() < Duration::from_secs(1)
        });
        let recent = &leases[leases.len().saturating_sub(6)..];
        let Some(woke) = woke else {
            panic!("{replica} wrote while {holder_now:?} held the lease: {e}\nlast lease writes: {recent:?}");
        };
        in_flight[woke] += 1;
        assert!(
            in_flight[woke] <= names.len(),
            "{replica} kept writing after it woke without the lease: {e}\nlast lease writes: {recent:?}"
        );
    }
    assert!(changes >= 20, "only {changes} leadership changes seen in the audit log");
    assert!(checked > 0, "no writes to check");
}

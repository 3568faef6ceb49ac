//! How gateways roll out, judged by the real control plane (tests/k8s):
//! pods roll for what they consume and nothing else, configs are
//! content-addressed and retired after the rollout that replaced them, and
//! status tells each step as it is (a re-rollout at the same generation, a
//! route waiting for its address, a cleanup the cluster refuses).
//! Skips with one line when the binaries are absent, and fails instead
//! under `CI=true`.

#![allow(clippy::unwrap_used)]

use gantry_api::v1::{
    ConditionStatus, Gateway, GatewaySpec, Phase, ResourceRequirements, Route, StepState,
};
use gantry_testkit::admission::{self, Policy};
use gantry_testkit::cluster::{ClusterRig, PATIENCE};
use gantry_testkit::eventually_blocking;
use gantry_testkit::k8s::{NEVER_READY_IMAGE, RECONCILER_USER};

fn spec(host: &str, replicas: i32, mode: &str, cpu: &str) -> GatewaySpec {
    GatewaySpec {
        image: "ghcr.io/acme/gateway:1".into(),
        replicas: Some(replicas),
        route: Some(Route { host: host.into(), tls_secret_name: String::new() }),
        config: [("mode".to_string(), mode.to_string())].into(),
        resources: Some(ResourceRequirements {
            requests: [("cpu".to_string(), cpu.to_string())].into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The gateway's ReplicaSets (one per pod template rolled out).
fn replica_sets(rig: &ClusterRig) -> usize {
    let sets = rig.json(&["get", "replicasets", "-l", "gantry.dev/gateway=edge"]);
    sets["items"].as_array().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_roll_for_what_they_consume_and_nothing_else() {
    let Some(mut rig) = ClusterRig::start("pod-inputs") else { return };
    rig.reconciler(&[]);
    rig.create_spec("edge", spec("edge.example.com", 2, "strict", "100m")).await;
    rig.admit("edge", "lb-1.example.net");
    rig.wait_running("edge", 1).await;
    assert_eq!(replica_sets(&rig), 1);
    let first_config = rig.config_map_name("edge");

    // The route's host is the Ingress's: applied, no pod rolled.
    rig.set_spec("edge", spec("api.example.com", 2, "strict", "100m")).await;
    rig.wait_running("edge", 2).await;
    let ingress = rig.json(&["get", "ingress", "edge"]);
    assert_eq!(ingress["spec"]["rules"][0]["host"], "api.example.com");
    assert_eq!(replica_sets(&rig), 1, "a new host rolled the pods");

    // One replica: the PodDisruptionBudget goes, no pod rolls.
    rig.set_spec("edge", spec("api.example.com", 1, "strict", "100m")).await;
    rig.wait_running("edge", 3).await;
    assert!(!rig.objects("poddisruptionbudgets").contains("poddisruptionbudget.policy/edge"));
    assert_eq!(replica_sets(&rig), 1, "the PDB's removal rolled the pods");

    // The same amount spelled otherwise is the same spec.
    let same = rig.set_spec("edge", spec("api.example.com", 1, "strict", "0.1")).await;
    assert_eq!(same.metadata.unwrap().generation, 3, "0.1 and 100m are one spec");
    assert_eq!(replica_sets(&rig), 1);

    // A config change: exactly one new ReplicaSet, a new ConfigMap, and the
    // old one retired once the rollout is done.
    rig.set_spec("edge", spec("api.example.com", 1, "relaxed", "100m")).await;
    rig.wait_running("edge", 4).await;
    assert_eq!(replica_sets(&rig), 2, "one new ReplicaSet for the new config");
    eventually_blocking(PATIENCE, "the earlier config retired", || {
        let configs = rig.json(&["get", "configmaps", "-l", "gantry.dev/gateway=edge"]);
        configs["items"].as_array().unwrap().len() == 1
    });
    let config = rig.config_map("edge");
    assert_ne!(config["metadata"]["name"], first_config.as_str());
    assert_eq!(config["data"]["mode"], "relaxed");
    assert_eq!(config["immutable"], true);
    let deployment = rig.json(&["get", "deployment", "edge"]);
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    assert_eq!(volumes[0]["configMap"]["name"], config["metadata"]["name"]);

    // Checking the converged routed gateway costs no request: three passes
    // (each a label written to the store) read only the watches' caches.
    let requests = |rig: &ClusterRig| {
        rig.reconciler_requests()
            .into_iter()
            .filter(|e| !matches!(e["verb"].as_str(), Some("watch" | "list")))
            .count()
    };
    let before = requests(&rig);
    rig.passes_over("edge", 3).await;
    assert_eq!(requests(&rig), before, "a converged routed gateway cost requests");
}

fn step(g: &Gateway, name: &str) -> StepState {
    let status = g.status.as_ref().unwrap();
    status
        .provisioning
        .iter()
        .find(|s| s.name == name)
        .map_or(StepState::Unspecified, |s| s.state())
}

fn condition(g: &Gateway, kind: &str) -> Option<gantry_api::v1::Condition> {
    g.status.as_ref()?.conditions.iter().find(|c| c.r#type == kind).cloned()
}

/// UpdateGateway calls the store answered OK so far.
fn update_calls(rig: &ClusterRig) -> u64 {
    let metrics = gantry_testkit::http_get(rig.store.http, "/metrics").unwrap_or_default();
    metrics
        .lines()
        .filter(|l| l.starts_with("gantry_store_grpc_requests_total{"))
        .filter(|l| l.contains("method=\"UpdateGateway\"") && l.contains("code=\"OK\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A rig whose reconciler runs `edge` (image 1, one replica) converged.
async fn running_edge(prefix: &str) -> Option<ClusterRig> {
    let mut rig = ClusterRig::start(prefix)?;
    rig.reconciler(&[]);
    let spec = GatewaySpec { image: "ghcr.io/acme/gateway:1".into(), ..Default::default() };
    rig.create_spec("edge", spec).await;
    rig.wait_running("edge", 1).await;
    Some(rig)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_rollout_at_the_same_generation_shows_in_its_step_and_polls_write_nothing() {
    let Some(rig) = running_edge("re-rollout").await else { return };

    // No pod can be created in the namespace; the Deployment is deleted
    // out of band and re-created by the reconciler: a rollout at the same
    // generation, stuck.
    let rules = admission::rules("", "pods", &["CREATE"]);
    let no_pods = Policy::deny(&rig, "no-pods", rules, "false", "no pods now");
    // A pod the namespace's restricted Pod Security admits.
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe", "namespace": rig.namespace},
        "spec": {"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{"name": "c", "image": "probe:1", "securityContext": {
                     "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}});
    eventually_blocking(PATIENCE, "pods refused", || {
        let create = ["create", "--dry-run=server", "-f", "-"];
        let out = rig.plane.kubectl_stdin_output(&create, &pod.to_string());
        String::from_utf8_lossy(&out.stderr).contains("no pods now")
    });
    rig.kubectl(&["delete", "deployment", "edge", "--wait=true"]);
    let stuck = rig
        .wait_for("edge", "WorkloadAvailable back to IN_PROGRESS", |g| {
            step(g, "WorkloadAvailable") == StepState::InProgress
        })
        .await;
    let status = stuck.status.clone().unwrap();
    assert_eq!((status.phase(), status.observed_generation), (Phase::Provisioning, 1));
    assert_eq!(step(&stuck, "ManifestsApplied"), StepState::Complete);

    // Polled every 200 ms while stuck: every UpdateGateway the store gets
    // changes something (a no-op write makes no event).
    let from = rig.get("edge").await.unwrap().metadata.unwrap().resource_version;
    let writes = rig.count_changes(from);
    let (passes, calls) = (rig.passes(), update_calls(&rig));
    assert!(calls > 0, "the store counted none of the reconciler's UpdateGateway calls");
    rig.wait_passes_after(passes, 10);
    let changes = writes.of("edge");
    let made = update_calls(&rig) - calls;
    assert!(made <= u64::from(changes), "{made} UpdateGateway calls made {changes} changes");
    assert!(changes <= 2, "{changes} status changes while stuck");

    drop(no_pods);
    let g = rig.wait_running("edge", 1).await;
    assert_eq!(step(&g, "WorkloadAvailable"), StepState::Complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_waits_with_its_workload_available_and_its_deadline_runs_from_the_wait() {
    let Some(mut rig) = ClusterRig::start("route-wait") else { return };
    rig.reconciler(&["--route-deadline", "4s"]);
    rig.create_spec("edge", spec("edge.example.com", 1, "strict", "100m")).await;
    let waiting = rig
        .wait_for("edge", "waiting for its address", |g| {
            step(g, "RouteAdmitted") == StepState::InProgress
                && step(g, "WorkloadAvailable") == StepState::Complete
        })
        .await;
    assert_eq!(waiting.status.as_ref().unwrap().phase(), Phase::Provisioning);
    let since = condition(&waiting, "RouteAdmitted").unwrap();
    assert_eq!(
        (since.status(), since.reason.as_str()),
        (ConditionStatus::False, "WaitingForAddress")
    );

    let degraded = rig
        .wait_for("edge", "DEGRADED RouteNotAdmitted", |g| {
            g.status.as_ref().is_some_and(|s| s.phase() == Phase::Degraded)
        })
        .await;
    let ready = condition(&degraded, "Ready").unwrap();
    assert_eq!(ready.reason, "RouteNotAdmitted");
    assert_eq!(step(&degraded, "WorkloadAvailable"), StepState::Complete);
    assert_eq!(step(&degraded, "RouteAdmitted"), StepState::Failed);
    let route = condition(&degraded, "RouteAdmitted").unwrap();
    assert_eq!(route.last_transition_time, since.last_transition_time, "the wait's start is kept");

    rig.admit("edge", "lb-1.example.net");
    let g = rig.wait_running("edge", 1).await;
    assert_eq!(condition(&g, "RouteAdmitted").unwrap().reason, "AddressPublished");

    // Its address goes, longer after the Ingress was made than the
    // deadline (it waited the deadline once already): a new wait, with the
    // whole deadline, not DEGRADED at once as counting from the Ingress's
    // creation would make it.
    let cleared = r#"{"status":{"loadBalancer":{"ingress":null}}}"#;
    rig.kubectl(&[
        "patch",
        "ingress",
        "edge",
        "--subresource=status",
        "--type=merge",
        "-p",
        cleared,
    ]);
    rig.wait_for("edge", "waiting again", |g| {
        step(g, "RouteAdmitted") == StepState::InProgress
            && g.status.as_ref().is_some_and(|s| s.phase() == Phase::Provisioning)
    })
    .await;
    rig.wait_for("edge", "DEGRADED again", |g| {
        g.status.as_ref().is_some_and(|s| s.phase() == Phase::Degraded)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_the_cluster_refuses_is_in_status_with_its_reason() {
    let Some(rig) = running_edge("cleanup").await else { return };
    let expression = format!("request.userInfo.username != '{RECONCILER_USER}'");
    let rules = admission::rules("apps", "deployments", &["DELETE"]);
    let kept = Policy::deny(&rig, "keep", rules, &expression, "deployments are kept by policy");
    eventually_blocking(PATIENCE, "deletes refused", || {
        let out =
            rig.kubectl_output_as_reconciler(&["delete", "deployment", "edge", "--dry-run=server"]);
        String::from_utf8_lossy(&out.stderr).contains("kept by policy")
    });
    rig.delete("edge").await;
    let blocked = rig
        .wait_for("edge", "the blocked cleanup in status", |g| {
            condition(g, "CleanupBlocked").is_some()
        })
        .await;
    let c = condition(&blocked, "CleanupBlocked").unwrap();
    assert_eq!((c.status(), c.reason.as_str()), (ConditionStatus::True, "Invalid"));
    assert!(c.message.contains("deployments are kept by policy"), "{}", c.message);
    assert_eq!(blocked.status.unwrap().phase(), Phase::Deleting);
    drop(kept);
    rig.wait_gone("edge").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_rollout_is_rolled_back_when_opted_in_and_says_what_it_serves() {
    let Some(mut rig) = ClusterRig::start("rollback") else { return };
    // The rig's progress deadline is 6 s.
    rig.reconciler(&["--rollback-on-failure"]);
    let good = |image: &str, mode: &str| GatewaySpec {
        image: image.into(),
        config: [("mode".to_string(), mode.to_string())].into(),
        ..Default::default()
    };
    rig.create_spec("edge", good("ghcr.io/acme/gateway:1", "strict")).await;
    rig.wait_running("edge", 1).await;
    let first_config = rig.config_map_name("edge");

    // A new image that never becomes ready, with a new config.
    rig.set_spec("edge", good(NEVER_READY_IMAGE, "relaxed")).await;
    let rolled = rig
        .wait_for("edge", "rolled back", |g| {
            condition(g, "Stalled").is_some_and(|c| c.reason == "RolledBack")
        })
        .await;
    let status = rolled.status.clone().unwrap();
    assert_eq!((status.phase(), status.observed_generation), (Phase::Degraded, 2));
    assert!(status.message.contains("generation 1 is served"), "{}", status.message);
    // The pods that served before serve, with the config they read.
    let deployment = rig.json(&["get", "deployment", "edge"]);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], "ghcr.io/acme/gateway:1");
    assert_eq!(pod["volumes"][0]["configMap"]["name"], first_config.as_str());
    eventually_blocking(PATIENCE, "the old pods serving alone", || {
        rig.ready_pod_images() == ["ghcr.io/acme/gateway:1"]
    });
    let configs = rig.json(&["get", "configmap", &first_config]);
    assert_eq!(configs["data"]["mode"], "strict");

    // Held: the stuck rendering is not applied again (label writes make
    // passes).
    let applies = |rig: &ClusterRig| rig.reconcilers[0].logs().matches("manifests applied").count();
    let before = applies(&rig);
    rig.passes_over("edge", 3).await;
    assert_eq!(applies(&rig), before, "the rolled-back rendering was applied again");

    // A fixed spec rolls out, and the earlier configs are retired after it.
    rig.set_spec("edge", good("ghcr.io/acme/gateway:2", "relaxed")).await;
    rig.wait_running("edge", 3).await;
    eventually_blocking(PATIENCE, "the earlier configs retired", || {
        let configs = rig.json(&["get", "configmaps", "-l", "gantry.dev/gateway=edge"]);
        configs["items"].as_array().unwrap().len() == 1
    });
    assert_eq!(rig.ready_pod_images(), ["ghcr.io/acme/gateway:2"]);
}

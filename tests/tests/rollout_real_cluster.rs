//! How gateways roll out, judged by the real control plane (tests/k8s):
//! pods roll for what they consume and nothing else, configs are
//! content-addressed and retired after the rollout that replaced them.
//! Skips with one line when the binaries are absent, and fails instead
//! under `CI=true`.

#![allow(clippy::unwrap_used)]

use gantry_api::v1::{GatewaySpec, ResourceRequirements, Route};
use gantry_testkit::cluster::{ClusterRig, PATIENCE};
use gantry_testkit::eventually_blocking;

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
}

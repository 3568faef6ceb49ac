//! deploy/ checked: every overlay rendered by the pinned kustomize
//! (kubectl), every object parsed against the Kubernetes types with unknown
//! fields rejected, references and ports cross-checked, flags matched
//! against the binaries' --help, and every overlay applied to a real API
//! server under the restricted Pod Security Standard. (The Role is compared
//! with the real audit log in reconciler_real_cluster.rs.)

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gantry_testkit::binary;
use gantry_testkit::k8s::kustomize;
use serde_json::Value;

const OVERLAYS: [&str; 3] = ["postgres", "ha", "dev"];
/// Secrets the user creates (README, "Deployment").
const USER_PROVIDED: [&str; 3] =
    ["gantry-store-tokens", "gantry-store-tls", "gantry-store-database"];

/// The kubectl of the pinned Kubernetes release (tests/k8s/setup.sh).
fn kubectl() -> Option<PathBuf> {
    gantry_testkit::k8s::kubectl()
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// Parses with the typed k8s-openapi struct and serializes back: a field
/// the schema does not know (or a wrong type) does not survive.
fn strict(object: &Value) {
    use k8s_openapi::api::{
        apps::v1 as apps, core::v1 as core, networking::v1 as net, rbac::v1 as rbac,
    };
    fn round<T: serde::de::DeserializeOwned + serde::Serialize>(
        v: &Value,
    ) -> Result<Value, String> {
        let typed: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
        Ok(strip_nulls(&serde_json::to_value(typed).unwrap()))
    }
    let kind = object["kind"].as_str().unwrap();
    let back = match kind {
        "Namespace" => round::<core::Namespace>(object),
        "ServiceAccount" => round::<core::ServiceAccount>(object),
        "Secret" => round::<core::Secret>(object),
        "ConfigMap" => round::<core::ConfigMap>(object),
        "PersistentVolumeClaim" => round::<core::PersistentVolumeClaim>(object),
        "Service" => round::<core::Service>(object),
        "Deployment" => round::<apps::Deployment>(object),
        "Role" => round::<rbac::Role>(object),
        "RoleBinding" => round::<rbac::RoleBinding>(object),
        "ClusterRoleBinding" => round::<rbac::ClusterRoleBinding>(object),
        "NetworkPolicy" => round::<net::NetworkPolicy>(object),
        other => panic!("unexpected kind {other}"),
    };
    let back = back
        .unwrap_or_else(|e| panic!("{kind} {} does not parse: {e}", object["metadata"]["name"]));
    assert_eq!(
        back,
        strip_nulls(object),
        "{kind} {} has fields the schema does not know",
        object["metadata"]["name"]
    );
}

fn named<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn exists(objects: &[Value], kind: &str, name: &str) -> bool {
    objects.iter().any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector.as_object().is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels[k] == *v))
}

/// Flags and env vars a binary's --help documents.
fn help(name: &str) -> (HashSet<String>, HashSet<String>) {
    let out = Command::new(binary(name)).arg("--help").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let flags = text
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.trim_end_matches(|c: char| !c.is_alphanumeric() && c != '-').to_string())
        .collect();
    let envs = text
        .match_indices("[env: ")
        .map(|(i, _)| text[i + 6..].split('=').next().unwrap().to_string())
        .collect();
    (flags, envs)
}

fn check_overlay(overlay: &str, objects: &[Value]) {
    for object in objects {
        // The API server (Go's base64) skips line breaks in Secret data,
        // which kustomize folds; k8s-openapi's decoder does not.
        let mut object = object.clone();
        if let Some(data) = object.get_mut("data").and_then(Value::as_object_mut) {
            for value in data.values_mut() {
                if let Some(text) = value.as_str() {
                    *value = Value::String(text.replace(['\n', '\r'], ""));
                }
            }
        }
        strict(&object);
    }
    let deployments = named(objects, "Deployment");
    assert_eq!(deployments.len(), 2, "{overlay}: the store and the reconciler");
    // Gateways' objects go to a namespace of their own, where alone the
    // reconciler may write them; it always runs with leader election.
    let reconciler = deployments.iter().find(|d| d["metadata"]["name"] == "gateway-reconciler");
    let reconciler = reconciler.unwrap_or_else(|| panic!("{overlay}: no gateway-reconciler"));
    let args: Vec<&str> = reconciler["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--leader-elect"), "{overlay}: the reconciler elects a leader");
    let gateways = args
        .iter()
        .find_map(|a| a.strip_prefix("--namespace="))
        .unwrap_or_else(|| panic!("{overlay}: the reconciler names the gateways' namespace"));
    let own = reconciler["metadata"]["namespace"].as_str().unwrap_or("");
    assert_ne!(gateways, own, "{overlay}: gateways' objects in the control plane's namespace");
    for role in named(objects, "Role") {
        let writes_gateway_kinds =
            role["rules"].as_array().into_iter().flatten().any(|r| {
                r["resources"].as_array().into_iter().flatten().any(|x| x == "deployments")
            });
        if writes_gateway_kinds {
            assert_eq!(
                role["metadata"]["namespace"], gateways,
                "{overlay}: the reconciler may write gateways' kinds only in their namespace"
            );
        }
    }
    let helps = [
        ("gateway-store", help("gateway-store")),
        ("gateway-reconciler", help("gateway-reconciler")),
    ];
    for d in &deployments {
        let name = d["metadata"]["name"].as_str().unwrap();
        let spec = &d["spec"]["template"]["spec"];
        assert!(
            labels_match(
                &d["spec"]["selector"]["matchLabels"],
                &d["spec"]["template"]["metadata"]["labels"]
            ),
            "{overlay}/{name}: selector matches pod labels"
        );
        assert!(
            exists(objects, "ServiceAccount", spec["serviceAccountName"].as_str().unwrap()),
            "{overlay}/{name}: service account"
        );
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
        assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        let container = &spec["containers"][0];
        let sc = &container["securityContext"];
        assert_eq!(
            (sc["readOnlyRootFilesystem"].as_bool(), sc["allowPrivilegeEscalation"].as_bool()),
            (Some(true), Some(false)),
            "{overlay}/{name}"
        );
        assert_eq!(sc["capabilities"]["drop"][0], "ALL");
        assert!(
            container["resources"]["requests"].is_object()
                && container["resources"]["limits"].is_object()
        );
        // Flags and env vars the binary really has.
        let (_, (flags, envs)) = helps.iter().find(|(b, _)| *b == name).unwrap();
        let args: Vec<&str> =
            container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        for arg in &args {
            let flag = arg.split('=').next().unwrap();
            assert!(flags.contains(flag), "{overlay}/{name}: {flag} is not a flag of {name}");
        }
        for env in container["env"].as_array().into_iter().flatten() {
            let env = env["name"].as_str().unwrap();
            assert!(envs.contains(env), "{overlay}/{name}: {env} is not read by {name}");
        }
        // Probes hit the HTTP port the binary listens on, on real paths.
        let http_listen = args.iter().find_map(|a| a.strip_prefix("--http-listen=")).unwrap();
        let http_port: i64 = http_listen.rsplit(':').next().unwrap().parse().unwrap();
        let ports = container["ports"].as_array().unwrap();
        for probe in ["readinessProbe", "livenessProbe"] {
            let get = &container[probe]["httpGet"];
            assert!(
                matches!(get["path"].as_str(), Some("/healthz" | "/readyz")),
                "{overlay}/{name}: {probe} path"
            );
            let port = ports
                .iter()
                .find(|p| p["name"] == get["port"])
                .unwrap_or_else(|| panic!("{overlay}/{name}: {probe} port"));
            assert_eq!(
                port["containerPort"], http_port,
                "{overlay}/{name}: {probe} hits --http-listen"
            );
        }
        // Every referenced Secret, ConfigMap and claim exists or is the user's.
        for volume in spec["volumes"].as_array().into_iter().flatten() {
            if let Some(secret) = volume["secret"]["secretName"].as_str() {
                assert!(
                    exists(objects, "Secret", secret) || USER_PROVIDED.contains(&secret),
                    "{overlay}/{name}: Secret {secret}"
                );
            }
            if let Some(map) = volume["configMap"]["name"].as_str() {
                assert!(exists(objects, "ConfigMap", map), "{overlay}/{name}: ConfigMap {map}");
            }
            if let Some(claim) = volume["persistentVolumeClaim"]["claimName"].as_str() {
                assert!(
                    exists(objects, "PersistentVolumeClaim", claim),
                    "{overlay}/{name}: claim {claim}"
                );
            }
            let mounted = container["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == volume["name"]);
            assert!(mounted, "{overlay}/{name}: volume {} is mounted", volume["name"]);
        }
        for env in container["env"].as_array().into_iter().flatten() {
            if let Some(secret) = env["valueFrom"]["secretKeyRef"]["name"].as_str() {
                assert!(
                    exists(objects, "Secret", secret) || USER_PROVIDED.contains(&secret),
                    "{overlay}/{name}: Secret {secret}"
                );
            }
        }
        for mount in container["volumeMounts"].as_array().unwrap() {
            assert!(
                spec["volumes"].as_array().unwrap().iter().any(|v| v["name"] == mount["name"]),
                "{overlay}/{name}: mount {}",
                mount["name"]
            );
        }
        let grace = spec["terminationGracePeriodSeconds"].as_i64().unwrap();
        assert!(grace >= 30, "{overlay}/{name}: graceful termination longer than the drain");
    }
    // Services select a Deployment's pods and target its container ports.
    for service in named(objects, "Service") {
        let selector = &service["spec"]["selector"];
        let target = deployments
            .iter()
            .find(|d| labels_match(selector, &d["spec"]["template"]["metadata"]["labels"]))
            .unwrap();
        let ports =
            target["spec"]["template"]["spec"]["containers"][0]["ports"].as_array().unwrap();
        for port in service["spec"]["ports"].as_array().unwrap() {
            let ok = ports.iter().any(|p| {
                p["name"] == port["targetPort"] || p["containerPort"] == port["targetPort"]
            });
            assert!(ok, "{overlay}: Service port {} targets a container port", port["name"]);
        }
    }
    for binding in named(objects, "RoleBinding") {
        assert!(exists(objects, "Role", binding["roleRef"]["name"].as_str().unwrap()));
        for subject in binding["subjects"].as_array().unwrap() {
            assert!(exists(objects, "ServiceAccount", subject["name"].as_str().unwrap()));
        }
    }
    for binding in named(objects, "ClusterRoleBinding") {
        for subject in binding["subjects"].as_array().unwrap() {
            assert!(exists(objects, "ServiceAccount", subject["name"].as_str().unwrap()));
        }
    }
    reconciler_identity_is_bound(overlay, objects);
    for policy in named(objects, "NetworkPolicy") {
        let store = deployments.iter().find(|d| d["metadata"]["name"] == "gateway-store").unwrap();
        assert!(labels_match(
            &policy["spec"]["podSelector"]["matchLabels"],
            &store["spec"]["template"]["metadata"]["labels"]
        ));
        let reconciler =
            deployments.iter().find(|d| d["metadata"]["name"] == "gateway-reconciler").unwrap();
        let client = &policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
        assert!(
            labels_match(client, &reconciler["spec"]["template"]["metadata"]["labels"]),
            "the reconciler may reach the store"
        );
    }
}

/// The reconciler reaches the store with its own service-account token:
/// the projected token's audience is the one the store takes, and the
/// store's role bindings give that account, in the reconciler's namespace,
/// the reconciler role. No shared token is mounted.
fn reconciler_identity_is_bound(overlay: &str, objects: &[Value]) {
    let deployment = |name: &str| {
        named(objects, "Deployment").into_iter().find(|d| d["metadata"]["name"] == name).unwrap()
    };
    let (store, reconciler) = (deployment("gateway-store"), deployment("gateway-reconciler"));
    let pod = &reconciler["spec"]["template"]["spec"];
    let projected = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| v["projected"]["sources"].as_array().cloned().unwrap_or_default())
        .find_map(|s| s["serviceAccountToken"]["audience"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("{overlay}: the reconciler mounts no projected token"));
    let store_args: Vec<&str> = store["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(store_args.contains(&"--service-account-tokens"), "{overlay}: the store takes them");
    let audience = store_args
        .iter()
        .find_map(|a| a.strip_prefix("--service-account-audience="))
        .unwrap_or("gantry");
    assert_eq!(projected, audience, "{overlay}: the token's audience is the store's");
    let token_file = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("--token-file="))
        .unwrap_or_else(|| panic!("{overlay}: the reconciler reads a token file"));
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    let mount = mounts
        .iter()
        .find(|m| token_file.starts_with(m["mountPath"].as_str().unwrap()))
        .unwrap_or_else(|| panic!("{overlay}: {token_file} is on no volume"));
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]);
    assert!(
        volume.is_some_and(|v| v["projected"].is_object()),
        "{overlay}: the reconciler's token file is its projected token, not a Secret"
    );
    let map = named(objects, "ConfigMap")
        .into_iter()
        .find(|m| m["metadata"]["name"] == "gantry-role-bindings")
        .unwrap_or_else(|| panic!("{overlay}: no role bindings"));
    let bindings: Value =
        serde_saphyr::from_str(map["data"]["bindings.yaml"].as_str().unwrap()).unwrap();
    let account = pod["serviceAccountName"].as_str().unwrap();
    let namespace = reconciler["metadata"]["namespace"].as_str().unwrap();
    let bound = bindings["bindings"].as_array().unwrap().iter().any(|b| {
        b["role"] == "reconciler"
            && b["subjects"].as_array().unwrap().iter().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == namespace
            })
    });
    assert!(bound, "{overlay}: {namespace}/{account} is not bound to the reconciler role");
}

#[test]
fn every_overlay_renders_to_strictly_valid_consistent_objects() {
    let Some(kubectl) = kubectl() else { return };
    for overlay in OVERLAYS {
        let objects = kustomize(&kubectl, overlay);
        check_overlay(overlay, &objects);
    }
    // A SQLite store (its file on a ReadWriteOnce volume) has one writer:
    // a rollout stops the old pod before the new one opens the file.
    let mut sqlite = 0;
    for overlay in OVERLAYS {
        let objects = kustomize(&kubectl, overlay);
        let store = objects
            .iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "gateway-store")
            .unwrap();
        if objects.iter().any(|o| o["kind"] == "PersistentVolumeClaim") {
            assert_eq!(store["spec"]["strategy"]["type"], "Recreate", "{overlay}");
            assert_eq!(store["spec"]["replicas"], 1, "{overlay}");
            sqlite += 1;
        }
    }
    assert_eq!(sqlite, 1, "dev keeps the SQLite store (ha is on postgres)");
    let postgres = kustomize(&kubectl, "postgres");
    let store = postgres
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "gateway-store")
        .unwrap();
    assert_eq!(store["spec"]["replicas"], 2);
    assert_eq!(store["spec"]["strategy"]["type"], "RollingUpdate");
    assert!(!postgres.iter().any(|o| o["kind"] == "PersistentVolumeClaim"));
    let ha = kustomize(&kubectl, "ha");
    let reconciler = ha
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "gateway-reconciler")
        .unwrap();
    assert_eq!(reconciler["spec"]["replicas"], 2);
    assert!(reconciler["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "--leader-elect"));
}

#[test]
#[should_panic(expected = "has fields the schema does not know")]
fn strict_parsing_rejects_unknown_fields() {
    strict(&serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80, "targetPrt": 8080}]},
    }));
}

#[test]
#[should_panic(expected = "does not parse")]
fn strict_parsing_rejects_wrong_types() {
    strict(&serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
        "spec": {"replicas": "two", "selector": {}, "template": {}},
    }));
}

/// Every overlay applied to a real API server with `kubectl apply
/// --server-side` and full schema validation (kubectl's default, strict),
/// each in a namespace of its own that enforces the `restricted` Pod
/// Security Standard: no warning, and the Deployments roll out, so their
/// pods were admitted (a refused pod would leave the ReplicaSet short).
#[test]
fn every_overlay_is_admitted_by_the_real_api_server_under_the_restricted_standard() {
    use gantry_testkit::k8s::ControlPlane;
    let Some(plane) = ControlPlane::shared() else { return };
    for overlay in OVERLAYS {
        let namespace = format!("deploy-{overlay}");
        // The control plane's namespace and the gateways' own.
        let renamed = |old: &str| {
            if old == "gantry-gateways" {
                format!("{namespace}-gw")
            } else {
                namespace.clone()
            }
        };
        let mut objects = plane.render(overlay);
        let mut namespaces = 0;
        for object in &mut objects {
            if object["kind"] == "Namespace" {
                namespaces += 1;
                assert_eq!(
                    object["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
                    "restricted",
                    "{overlay}: the namespace enforces the restricted standard"
                );
                let name = renamed(object["metadata"]["name"].as_str().unwrap());
                object["metadata"]["name"] = Value::from(name);
            } else if let Some(old) = object["metadata"]["namespace"].as_str() {
                object["metadata"]["namespace"] = Value::from(renamed(old));
            }
            let subjects = object.get_mut("subjects").and_then(Value::as_array_mut);
            for subject in subjects.into_iter().flatten() {
                subject["namespace"] = Value::from(namespace.clone());
            }
        }
        assert_eq!(
            namespaces, 2,
            "{overlay} creates the control plane's and the gateways' namespaces"
        );
        objects.sort_by_key(|o| o["kind"] != "Namespace");
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
        let out = plane.kubectl_stdin(
            &["apply", "--server-side", "--field-manager=deploy-test", "-f", "-"],
            &list.to_string(),
        );
        // The cluster's storage: a volume for each claim, as a static
        // provisioner would make it.
        for claim in objects.iter().filter(|o| o["kind"] == "PersistentVolumeClaim") {
            let name = claim["metadata"]["name"].as_str().unwrap();
            let volume = serde_json::json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": format!("{namespace}-{name}")},
                "spec": {
                    "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                    "accessModes": claim["spec"]["accessModes"],
                    "claimRef": {"namespace": namespace, "name": name},
                    "hostPath": {"path": format!("/tmp/gantry-pv/{namespace}-{name}")},
                },
            });
            plane.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &volume.to_string());
        }
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(warnings.trim().is_empty(), "{overlay}: kubectl warned: {warnings}");
        for deployment in objects.iter().filter(|o| o["kind"] == "Deployment") {
            let name = deployment["metadata"]["name"].as_str().unwrap();
            let replicas = deployment["spec"]["replicas"].as_i64().unwrap_or(1);
            plane.wait_for(
                &format!("{overlay}: Deployment {name} available"),
                Duration::from_secs(90),
                &[
                    "-n",
                    &namespace,
                    "get",
                    "deployment",
                    name,
                    "-o",
                    "jsonpath={.status.availableReplicas}",
                ],
                |available| available == replicas.to_string(),
            );
        }
        plane.kubectl(&["delete", "namespace", &namespace, "--wait=false"]);
        plane.kubectl(&["delete", "namespace", &format!("{namespace}-gw"), "--wait=false"]);
    }
}

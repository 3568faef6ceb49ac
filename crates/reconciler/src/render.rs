//! Render (pure): a Gateway becomes the Kubernetes objects that run it.
//!
//! ServiceAccount, ConfigMap (spec.config plus gantry's own settings under
//! `gantry.json`), Deployment (gateway and supervisor containers), Service,
//! Ingress when a route is set, PodDisruptionBudget when replicas > 1. Every
//! object carries the common labels; the pod template carries the
//! fingerprint of all rendered inputs, so any change rolls the pods.

use gantry_api::v1::{Gateway, GatewaySpec};
use gantry_core::fingerprint::fingerprint;
use serde_json::{json, Map, Value};

/// Field manager of every apply.
pub const FIELD_MANAGER: &str = "gantry-reconciler";
/// Label naming the gateway an object belongs to.
pub const LABEL_GATEWAY: &str = "gantry.dev/gateway";
/// Label (and annotation) with the uid of that gateway: only objects
/// carrying the uid of a gateway are changed or deleted for it, so a new
/// gateway of the same name, or one named like someone else's object,
/// never takes over what it did not create.
pub const LABEL_GATEWAY_UID: &str = "gantry.dev/gateway-uid";
/// Standard label marking gantry's objects.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "gantry";
/// Annotation with the fingerprint of the rendered inputs.
pub const ANNOTATION_FINGERPRINT: &str = "gantry.dev/fingerprint";
/// ConfigMap key holding gantry's settings for the gateway.
pub const SETTINGS_KEY: &str = "gantry.json";
/// Port the gateway serves on, and its health port.
pub const GATEWAY_PORT: i32 = 8443;
pub const HEALTH_PORT: i32 = 8081;

/// The kinds a gateway may own, in apply order (pruned in reverse).
pub const OWNED_KINDS: [(&str, &str); 6] = [
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("networking.k8s.io/v1", "Ingress"),
    ("policy/v1", "PodDisruptionBudget"),
];

/// Settings of the renderer that are not in the Gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderSettings {
    pub namespace: String,
    /// Supervisor image when the spec leaves it empty.
    pub default_supervisor_image: String,
    /// The Deployment's `progressDeadlineSeconds`.
    pub progress_deadline: std::time::Duration,
    /// Prefix of every object name (`<prefix><gateway>`).
    pub name_prefix: String,
    /// `spec.ingressClassName` of routes (empty: the cluster's default
    /// class).
    pub ingress_class: String,
}

impl Default for RenderSettings {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            default_supervisor_image: "ghcr.io/gantry-dev/supervisor:0.1.0".into(),
            progress_deadline: std::time::Duration::from_secs(600),
            name_prefix: String::new(),
            ingress_class: String::new(),
        }
    }
}

/// The objects of one gateway and the fingerprint of everything rendered.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub manifests: Vec<Value>,
    pub fingerprint: String,
}

/// Labels on every object of gateway `name` with `uid`.
pub fn common_labels(name: &str, uid: &str) -> Value {
    json!({
        "app.kubernetes.io/name": "gantry-gateway",
        "app.kubernetes.io/instance": name,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_GATEWAY: name,
        LABEL_GATEWAY_UID: uid,
    })
}

/// The label selector of everything the gateway with `uid` owns.
pub fn owned_selector(uid: &str) -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_GATEWAY_UID}={uid}")
}

fn metadata(object: &str, gateway: &str, uid: &str, namespace: &str) -> Value {
    json!({
        "name": object, "namespace": namespace, "labels": common_labels(gateway, uid),
        "annotations": {LABEL_GATEWAY_UID: uid},
    })
}

fn settings_document(spec: &GatewaySpec) -> String {
    let oidc = spec.oidc.as_ref().map(
        |o| json!({"issuerUrl": o.issuer_url, "clientId": o.client_id, "audiences": o.audiences}),
    );
    let document = json!({
        "serverDnsNames": spec.server_dns_names,
        "oidc": oidc,
        "credentialDriver": spec.credential_driver,
        "route": spec.route.as_ref().map(|r| json!({"host": r.host, "tlsSecretName": r.tls_secret_name})),
    });
    // Sorted keys (serde_json maps are ordered), so equal settings give
    // equal bytes.
    serde_json::to_string_pretty(&document).unwrap_or_default()
}

fn resources(spec: &GatewaySpec) -> Value {
    let mut out = Map::new();
    if let Some(r) = &spec.resources {
        if !r.requests.is_empty() {
            out.insert("requests".into(), json!(r.requests));
        }
        if !r.limits.is_empty() {
            out.insert("limits".into(), json!(r.limits));
        }
    }
    Value::Object(out)
}

fn security_context() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// Renders the objects of `gateway`.
pub fn render(gateway: &Gateway, settings: &RenderSettings) -> Rendered {
    let gateway_name = gateway.metadata.as_ref().map_or("", |m| m.name.as_str());
    let uid = gateway.metadata.as_ref().map_or("", |m| m.uid.as_str());
    let object_name = format!("{}{gateway_name}", settings.name_prefix);
    let name = object_name.as_str();
    let ns = settings.namespace.as_str();
    let metadata = |_: &str, ns: &str| metadata(name, gateway_name, uid, ns);
    let default_spec = GatewaySpec::default();
    let spec = gateway.spec.as_ref().unwrap_or(&default_spec);
    let selector = json!({LABEL_GATEWAY: gateway_name});
    let supervisor_image = if spec.supervisor_image.is_empty() {
        settings.default_supervisor_image.as_str()
    } else {
        spec.supervisor_image.as_str()
    };

    let mut data: Map<String, Value> =
        spec.config.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    data.insert(SETTINGS_KEY.into(), json!(settings_document(spec)));

    let mut manifests = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(name, ns), "automountServiceAccountToken": false}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(name, ns), "data": data}),
        json!({
            "apiVersion": "v1", "kind": "Service", "metadata": metadata(name, ns),
            "spec": {
                "type": "ClusterIP",
                "selector": selector,
                "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}],
            },
        }),
    ];
    let probe =
        |path: &str| json!({"httpGet": {"path": path, "port": "health"}, "periodSeconds": 10});
    let pod_labels = common_labels(gateway_name, uid);
    let mut deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(name, ns),
        "spec": {
            "selector": {"matchLabels": selector},
            "progressDeadlineSeconds": settings.progress_deadline.as_secs(),
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": false,
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [
                        {
                            "name": "gateway",
                            "image": spec.image,
                            "ports": [
                                {"name": "https", "containerPort": GATEWAY_PORT, "protocol": "TCP"},
                                {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
                            ],
                            "readinessProbe": probe("/readyz"),
                            "livenessProbe": probe("/healthz"),
                            "resources": resources(spec),
                            "securityContext": security_context(),
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/gantry", "readOnly": true}],
                        },
                        {
                            "name": "supervisor",
                            "image": supervisor_image,
                            "args": ["--config=/etc/gantry/gantry.json", format!("--credential-driver={}", spec.credential_driver)],
                            "securityContext": security_context(),
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/gantry", "readOnly": true}],
                        },
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": name}}],
                },
            },
        },
    });
    // Replicas left unset in the spec are not applied, so an autoscaler or
    // `kubectl scale` owns them and is not fought.
    if let Some(replicas) = spec.replicas {
        deployment["spec"]["replicas"] = json!(replicas);
    }
    manifests.push(deployment);
    if let Some(route) = spec.route.as_ref().filter(|r| !r.host.is_empty()) {
        let mut ingress = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": metadata(name, ns),
            "spec": {"rules": [{"host": route.host, "http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": name, "port": {"name": "https"}}},
            }]}}]},
        });
        if !settings.ingress_class.is_empty() {
            ingress["spec"]["ingressClassName"] = json!(settings.ingress_class);
        }
        if !route.tls_secret_name.is_empty() {
            ingress["spec"]["tls"] =
                json!([{"hosts": [route.host], "secretName": route.tls_secret_name}]);
        }
        manifests.push(ingress);
    }
    if spec.replicas.is_some_and(|r| r > 1) {
        manifests.push(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": metadata(name, ns),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        }));
    }
    let mut bytes = Vec::with_capacity(8 * 1024);
    for m in &manifests {
        // Writing a Value to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut bytes, m);
    }
    let fingerprint = fingerprint(&bytes);
    for m in &mut manifests {
        if m["kind"] == "Deployment" {
            m["spec"]["template"]["metadata"]["annotations"] =
                json!({ANNOTATION_FINGERPRINT: fingerprint});
        }
    }
    Rendered { manifests, fingerprint }
}

/// The file name of a manifest in the directory target.
pub fn file_name(manifest: &Value) -> String {
    format!("{}.yaml", manifest["kind"].as_str().unwrap_or("object").to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::{ObjectMeta, Oidc, ResourceRequirements, Route};

    fn gateway(spec: GatewaySpec) -> Gateway {
        Gateway {
            metadata: Some(ObjectMeta {
                name: "edge".into(),
                uid: "0b9c6a52-8d1e-4f7a-9a51-3c2f1e0d4b6a".into(),
                ..Default::default()
            }),
            spec: Some(spec),
            status: None,
        }
    }

    fn minimal() -> GatewaySpec {
        GatewaySpec { image: "ghcr.io/acme/gateway:1.0".into(), ..Default::default() }
    }

    fn full() -> GatewaySpec {
        GatewaySpec {
            image: "ghcr.io/acme/gateway:1.0".into(),
            supervisor_image: "ghcr.io/acme/supervisor:2.0".into(),
            replicas: Some(3),
            route: Some(Route {
                host: "edge.example.com".into(),
                tls_secret_name: "edge-tls".into(),
            }),
            server_dns_names: vec!["edge.example.com".into(), "*.edge.example.com".into()],
            oidc: Some(Oidc {
                issuer_url: "https://login.example.com".into(),
                client_id: "edge".into(),
                audiences: vec!["api".into()],
            }),
            credential_driver: "vault".into(),
            config: [("log.level".to_string(), "debug".to_string())].into(),
            resources: Some(ResourceRequirements {
                requests: [("cpu".to_string(), "250m".to_string())].into(),
                limits: [("memory".to_string(), "512Mi".to_string())].into(),
            }),
        }
    }

    fn kinds(r: &Rendered) -> Vec<&str> {
        r.manifests.iter().map(|m| m["kind"].as_str().unwrap()).collect()
    }

    /// Compares with `tests/golden/<name>.yaml`; `GANTRY_UPDATE_GOLDEN=1`
    /// rewrites the file instead.
    fn golden(name: &str, rendered: &Rendered) {
        let text = rendered
            .manifests
            .iter()
            .map(|m| serde_saphyr::to_string(m).unwrap())
            .collect::<Vec<_>>()
            .join("---\n");
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(format!("{name}.yaml"));
        if std::env::var_os("GANTRY_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run with GANTRY_UPDATE_GOLDEN=1", path.display()));
        assert_eq!(
            text, expected,
            "rendering of {name} changed; review and run with GANTRY_UPDATE_GOLDEN=1"
        );
    }

    #[test]
    fn minimal_gateway_renders_the_core_objects() {
        let r = render(&gateway(minimal()), &RenderSettings::default());
        assert_eq!(kinds(&r), ["ServiceAccount", "ConfigMap", "Service", "Deployment"]);
        golden("minimal", &r);
    }

    #[test]
    fn full_gateway_adds_ingress_and_pdb() {
        let r = render(
            &gateway(full()),
            &RenderSettings { namespace: "gateways".into(), ..RenderSettings::default() },
        );
        assert_eq!(
            kinds(&r),
            [
                "ServiceAccount",
                "ConfigMap",
                "Service",
                "Deployment",
                "Ingress",
                "PodDisruptionBudget"
            ]
        );
        golden("full", &r);
    }

    #[test]
    fn every_object_carries_the_labels_and_the_pods_the_fingerprint() {
        let r = render(&gateway(full()), &RenderSettings::default());
        for m in &r.manifests {
            assert_eq!(m["metadata"]["labels"][LABEL_GATEWAY], "edge");
            assert_eq!(m["metadata"]["labels"][LABEL_MANAGED_BY], "gantry");
        }
        let deployment = r.manifests.iter().find(|m| m["kind"] == "Deployment").unwrap();
        assert_eq!(
            deployment["spec"]["template"]["metadata"]["annotations"][ANNOTATION_FINGERPRINT],
            r.fingerprint.as_str()
        );
    }

    #[test]
    fn a_name_prefix_names_every_object_and_every_reference_but_not_the_labels() {
        let settings = RenderSettings { name_prefix: "gw-".into(), ..RenderSettings::default() };
        let r = render(&gateway(full()), &settings);
        for m in &r.manifests {
            assert_eq!(m["metadata"]["name"], "gw-edge", "{}", m["kind"]);
            assert_eq!(m["metadata"]["labels"][LABEL_GATEWAY], "edge");
        }
        let deployment = r.manifests.iter().find(|m| m["kind"] == "Deployment").unwrap();
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "gw-edge");
        assert_eq!(pod["volumes"][0]["configMap"]["name"], "gw-edge");
        let ingress = r.manifests.iter().find(|m| m["kind"] == "Ingress").unwrap();
        let backend = &ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"];
        assert_eq!(backend["name"], "gw-edge");
    }

    #[test]
    fn replicas_left_unset_are_not_rendered() {
        let r = render(&gateway(minimal()), &RenderSettings::default());
        let deployment = r.manifests.iter().find(|m| m["kind"] == "Deployment").unwrap();
        assert!(deployment["spec"].get("replicas").is_none(), "{deployment}");
        let fixed = render(
            &gateway(GatewaySpec { replicas: Some(1), ..minimal() }),
            &RenderSettings::default(),
        );
        let deployment = fixed.manifests.iter().find(|m| m["kind"] == "Deployment").unwrap();
        assert_eq!(deployment["spec"]["replicas"], 1);
        assert_ne!(fixed.fingerprint, r.fingerprint);
    }

    #[test]
    fn the_fingerprint_follows_every_input() {
        let base = render(&gateway(full()), &RenderSettings::default()).fingerprint;
        assert_eq!(
            base,
            render(&gateway(full()), &RenderSettings::default()).fingerprint,
            "stable"
        );
        let changes: Vec<fn(&mut GatewaySpec)> = vec![
            |s| s.image = "other:1".into(),
            |s| s.replicas = Some(2),
            |s| {
                s.config.insert("k".into(), "v".into());
            },
            |s| s.credential_driver = "file".into(),
            |s| s.oidc = None,
        ];
        for change in changes {
            let mut spec = full();
            change(&mut spec);
            assert_ne!(render(&gateway(spec), &RenderSettings::default()).fingerprint, base);
        }
        let other_default = RenderSettings {
            default_supervisor_image: "sup:9".into(),
            ..RenderSettings::default()
        };
        assert_ne!(
            render(&gateway(minimal()), &other_default).fingerprint,
            render(&gateway(minimal()), &RenderSettings::default()).fingerprint
        );
    }
}

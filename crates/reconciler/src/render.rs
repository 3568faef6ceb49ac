//! Render (pure): a Gateway becomes the Kubernetes objects that run it.
//!
//! ServiceAccount, ConfigMap (spec.config plus gantry's own settings under
//! `gantry.json`; immutable, named after its content), Deployment (gateway and supervisor containers), Service,
//! Ingress when a route is set, PodDisruptionBudget when replicas > 1. Every
//! object carries the common labels; the pod template carries the
//! fingerprint of what the pods consume (their template and the ConfigMap
//! they mount), so exactly a change of those rolls the pods. Quantities are
//! rendered in one spelling per amount.
//!
//! The pod is meant to pass a production review: both containers have
//! requests and limits (defaults from the reconciler's flags, the gateway's
//! overridable by `spec.resources`), probes, a restricted security context
//! with a fixed non-root user, a writable `/tmp` on an `emptyDir` under a
//! read-only root; the gateway drains on a preStop sleep within its grace
//! period; replicas spread across zones and nodes; the route's TLS Secret
//! is mounted where the gateway serves HTTPS, and the Ingress names its
//! class and tells the controllers the backend speaks HTTPS.

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
/// Pod template annotation with the fingerprint of what the pods consume
/// (the pod template and the ConfigMap it mounts): it changes, and the
/// pods roll, exactly when one of those does.
pub const ANNOTATION_FINGERPRINT: &str = "gantry.dev/fingerprint";
/// Deployment annotation with the generation whose rendering it carries;
/// the Deployment controller copies it to the ReplicaSet of that template,
/// so a rollback knows which generation it puts back.
pub const ANNOTATION_GENERATION: &str = "gantry.dev/generation";
/// ConfigMap key holding gantry's settings for the gateway.
pub const SETTINGS_KEY: &str = "gantry.json";
/// Port the gateway serves on, and its health port.
pub const GATEWAY_PORT: i32 = 8443;
pub const HEALTH_PORT: i32 = 8081;
/// The supervisor's health port (`/healthz`, `/readyz`).
pub const SUPERVISOR_HEALTH_PORT: i32 = 8082;
/// Where the route's TLS Secret is mounted in the gateway container.
pub const TLS_DIR: &str = "/etc/gantry/tls";
/// The user and group both containers run as (the distroless `nonroot`).
pub const RUN_AS: i64 = 65532;
/// Seconds the gateway keeps serving after it is told to stop, so that
/// Services and load balancers stop sending it traffic first.
pub const PRE_STOP_SLEEP_SECONDS: i64 = 5;
/// The pod's grace period: the preStop sleep plus time to finish requests.
pub const TERMINATION_GRACE_SECONDS: i64 = 45;
/// Size limit of the writable `/tmp`.
pub const TMP_SIZE_LIMIT: &str = "64Mi";
/// Ingress annotations saying the backend speaks HTTPS (ingress-nginx;
/// Traefik reads its own from the Service), without which those
/// controllers send plain HTTP to port 8443 and answer 502.
pub const INGRESS_BACKEND_HTTPS: [(&str, &str); 1] =
    [("nginx.ingress.kubernetes.io/backend-protocol", "HTTPS")];
/// Service annotation of the same meaning for Traefik.
pub const SERVICE_BACKEND_HTTPS: (&str, &str) =
    ("traefik.ingress.kubernetes.io/service.serversscheme", "https");

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
    /// Requests and limits of the gateway container where
    /// `spec.resources` says nothing.
    pub gateway_resources: Resources,
    /// Requests and limits of the supervisor container.
    pub supervisor_resources: Resources,
}

/// Requests and limits of a container, by resource name (`cpu`, `memory`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub requests: std::collections::BTreeMap<String, String>,
    pub limits: std::collections::BTreeMap<String, String>,
}

impl Resources {
    /// Parses `requests.cpu=100m,limits.memory=256Mi,...`; every value a
    /// quantity, no request above its limit.
    pub fn parse(text: &str) -> Result<Resources, String> {
        let mut out = Resources::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?} is not KIND.RESOURCE=QUANTITY"))?;
            let map = match key.split_once('.') {
                Some(("requests", name)) if !name.is_empty() => out.requests.entry(name.into()),
                Some(("limits", name)) if !name.is_empty() => out.limits.entry(name.into()),
                _ => {
                    return Err(format!(
                        "{key:?}: write requests.NAME or limits.NAME (e.g. requests.cpu)"
                    ))
                }
            };
            gantry_core::syntax::quantity(value)?;
            map.or_insert_with(|| value.to_string());
        }
        for (name, request) in &out.requests {
            let limit = out.limits.get(name);
            let over = limit.is_some_and(|l| quantity(request) > quantity(l));
            if over {
                return Err(format!(
                    "requests.{name}={request} is above limits.{name}={}",
                    limit.map_or("", String::as_str)
                ));
            }
        }
        Ok(out)
    }

    /// These defaults with the gateway's own requests and limits over
    /// them, name by name; a limit the gateway's request would exceed is
    /// raised to that request (Kubernetes refuses a request above its
    /// limit).
    pub fn overlaid(&self, own: Option<&gantry_api::v1::ResourceRequirements>) -> Resources {
        let mut out = self.clone();
        let Some(own) = own else { return out };
        out.requests.extend(own.requests.iter().map(|(k, v)| (k.clone(), v.clone())));
        out.limits.extend(own.limits.iter().map(|(k, v)| (k.clone(), v.clone())));
        for (name, request) in &out.requests {
            if let Some(limit) = out.limits.get_mut(name) {
                if quantity(request) > quantity(limit) && !own.limits.contains_key(name) {
                    limit.clone_from(request);
                }
            }
        }
        out
    }

    /// As rendered: every quantity in its one spelling, so `0.25` and
    /// `250m` render (and roll) the same.
    fn to_json(&self) -> Value {
        let canonical = |m: &std::collections::BTreeMap<String, String>| -> Map<String, Value> {
            m.iter()
                .map(|(k, v)| (k.clone(), json!(gantry_core::syntax::canonical_quantity(v))))
                .collect()
        };
        json!({"requests": canonical(&self.requests), "limits": canonical(&self.limits)})
    }
}

fn quantity(text: &str) -> i128 {
    gantry_core::syntax::quantity_nanos(text).unwrap_or(0)
}

/// The gateway container's defaults: a small gateway's needs, with room.
pub const DEFAULT_GATEWAY_RESOURCES: &str =
    "requests.cpu=100m,requests.memory=128Mi,limits.cpu=1,limits.memory=256Mi";
/// The supervisor's defaults.
pub const DEFAULT_SUPERVISOR_RESOURCES: &str =
    "requests.cpu=10m,requests.memory=32Mi,limits.cpu=100m,limits.memory=64Mi";

impl Default for RenderSettings {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            default_supervisor_image: "ghcr.io/gantry-dev/supervisor:0.1.0".into(),
            progress_deadline: std::time::Duration::from_secs(600),
            name_prefix: String::new(),
            ingress_class: String::new(),
            gateway_resources: Resources::parse(DEFAULT_GATEWAY_RESOURCES).unwrap_or_default(),
            supervisor_resources: Resources::parse(DEFAULT_SUPERVISOR_RESOURCES)
                .unwrap_or_default(),
        }
    }
}

/// The objects of one gateway and the fingerprint of everything rendered.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// In apply order.
    pub objects: Vec<Manifest>,
    pub fingerprint: String,
}

impl Rendered {
    /// The rendered object of `kind`, if any (at most one of each).
    pub fn get(&self, kind: &str) -> Option<&Manifest> {
        self.objects.iter().find(|m| m.kind == kind)
    }
}

/// One rendered object: its type and name, read once, and the manifest
/// applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// One of [`OWNED_KINDS`].
    pub api_version: &'static str,
    pub kind: &'static str,
    pub name: String,
    pub body: Value,
}

impl Manifest {
    /// `body`, which names one of [`OWNED_KINDS`] (everything `render`
    /// makes does).
    pub fn of(body: Value) -> Self {
        let (api_version, kind) =
            OWNED_KINDS.iter().copied().find(|(_, k)| body["kind"] == *k).unwrap_or(("", ""));
        let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
        Manifest { api_version, kind, name, body }
    }

    /// Its file name in the directory target.
    pub fn file_name(&self) -> String {
        file_name(&self.body)
    }
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

/// What the gateway reads from `gantry.json`. Only what the pods consume:
/// the route's host is the Ingress's business (a new host rolls no pod);
/// its TLS Secret is mounted, and the document says where.
fn settings_document(spec: &GatewaySpec) -> String {
    let oidc = spec.oidc.as_ref().map(
        |o| json!({"issuerUrl": o.issuer_url, "clientId": o.client_id, "audiences": o.audiences}),
    );
    let document = json!({
        "serverDnsNames": spec.server_dns_names,
        "oidc": oidc,
        "credentialDriver": spec.credential_driver,
        "tls": tls_secret(spec).map(|_| json!({
            "certFile": format!("{TLS_DIR}/tls.crt"),
            "keyFile": format!("{TLS_DIR}/tls.key"),
        })),
    });
    // Sorted keys (serde_json maps are ordered), so equal settings give
    // equal bytes.
    serde_json::to_string_pretty(&document).unwrap_or_default()
}

/// The Secret with the certificate the gateway serves HTTPS with: the
/// route's.
fn tls_secret(spec: &GatewaySpec) -> Option<&str> {
    spec.route.as_ref().map(|r| r.tls_secret_name.as_str()).filter(|s| !s.is_empty())
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

/// What every object of one gateway is named and labelled with.
struct Names<'a> {
    /// The objects' name (the prefix and the gateway's name).
    name: &'a str,
    gateway: &'a str,
    uid: &'a str,
    namespace: &'a str,
    /// The pods' selector.
    selector: Value,
}

impl Names<'_> {
    fn metadata(&self) -> Value {
        metadata(self.name, self.gateway, self.uid, self.namespace)
    }
}

/// The name of the ConfigMap holding `data`: `<name>-<10 hex digits of
/// its hash>`.
pub fn config_map_name(name: &str, data: &Map<String, Value>) -> String {
    let bytes = serde_json::to_vec(data).unwrap_or_default();
    let hash = fingerprint(&bytes);
    format!("{name}-{}", &hash[..hash.len().min(10)])
}

/// Renders the objects of `gateway`.
pub fn render(gateway: &Gateway, settings: &RenderSettings) -> Rendered {
    let gateway_name = gateway.metadata.as_ref().map_or("", |m| m.name.as_str());
    let uid = gateway.metadata.as_ref().map_or("", |m| m.uid.as_str());
    let object_name = format!("{}{gateway_name}", settings.name_prefix);
    let names = Names {
        name: &object_name,
        gateway: gateway_name,
        uid,
        namespace: &settings.namespace,
        selector: json!({LABEL_GATEWAY: gateway_name}),
    };
    let default_spec = GatewaySpec::default();
    let spec = gateway.spec.as_ref().unwrap_or(&default_spec);

    let mut data: Map<String, Value> =
        spec.config.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    data.insert(SETTINGS_KEY.into(), json!(settings_document(spec)));
    // Content-addressed, as kustomize's configMapGenerator: a new config is
    // a new ConfigMap, so pods of the previous rollout keep reading theirs.
    let config_name = config_map_name(&object_name, &data);
    let mut config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": names.metadata(), "immutable": true, "data": data});
    config["metadata"]["name"] = json!(config_name);

    let mut manifests = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": names.metadata(), "automountServiceAccountToken": false}),
        config,
        json!({
            "apiVersion": "v1", "kind": "Service", "metadata": names.metadata(),
            "spec": {
                "type": "ClusterIP",
                "selector": names.selector,
                "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP", "appProtocol": "https"}],
            },
        }),
    ];
    let (key, value) = SERVICE_BACKEND_HTTPS;
    manifests[2]["metadata"]["annotations"][key] = json!(value);
    let mut deployment = deployment(&names, &config_name, spec, settings);
    let generation = gateway.metadata.as_ref().map_or(0, |m| m.generation);
    deployment["metadata"]["annotations"][ANNOTATION_GENERATION] = json!(generation.to_string());
    manifests.push(deployment);
    manifests.extend(ingress(&names, spec, settings));
    if spec.replicas.is_some_and(|r| r > 1) {
        manifests.push(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": names.metadata(),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector}},
        }));
    }
    let fingerprint = stamp_fingerprint(&mut manifests);
    Rendered { objects: manifests.into_iter().map(Manifest::of).collect(), fingerprint }
}

/// The fingerprint of every rendered object (what status records as
/// applied); the pod template carries the fingerprint of what the pods
/// consume only: the pod template itself (its image, resources, Secret
/// names) and the ConfigMap it mounts. A change of the Service, the
/// Ingress, the PodDisruptionBudget or of how gantry renders those rolls
/// no pod.
fn stamp_fingerprint(manifests: &mut [Value]) -> String {
    let mut bytes = Vec::with_capacity(8 * 1024);
    for m in manifests.iter() {
        // Writing a Value to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut bytes, m);
    }
    let everything = fingerprint(&bytes);
    let mut pod_inputs = Vec::with_capacity(8 * 1024);
    for m in manifests.iter().filter(|m| m["kind"] == "Deployment") {
        let _ = serde_json::to_writer(&mut pod_inputs, &m["spec"]["template"]);
    }
    for m in manifests.iter().filter(|m| m["kind"] == "ConfigMap") {
        let _ = serde_json::to_writer(&mut pod_inputs, &m["data"]);
    }
    let pods = fingerprint(&pod_inputs);
    for m in manifests.iter_mut().filter(|m| m["kind"] == "Deployment") {
        m["spec"]["template"]["metadata"]["annotations"] = json!({ANNOTATION_FINGERPRINT: pods});
    }
    everything
}

/// The Ingress of the gateway's route, if it has a host.
fn ingress(names: &Names<'_>, spec: &GatewaySpec, settings: &RenderSettings) -> Option<Value> {
    let route = spec.route.as_ref().filter(|r| !r.host.is_empty())?;
    let mut ingress = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": names.metadata(),
        "spec": {"rules": [{"host": route.host, "http": {"paths": [{
            "path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": names.name, "port": {"name": "https"}}},
        }]}}]},
    });
    if !settings.ingress_class.is_empty() {
        ingress["spec"]["ingressClassName"] = json!(settings.ingress_class);
    }
    for (key, value) in INGRESS_BACKEND_HTTPS {
        ingress["metadata"]["annotations"][key] = json!(value);
    }
    if !route.tls_secret_name.is_empty() {
        ingress["spec"]["tls"] =
            json!([{"hosts": [route.host], "secretName": route.tls_secret_name}]);
    }
    Some(ingress)
}

/// The Deployment: the gateway container and its supervisor sidecar.
fn deployment(
    names: &Names<'_>,
    config_name: &str,
    spec: &GatewaySpec,
    settings: &RenderSettings,
) -> Value {
    let name = names.name;
    let selector = &names.selector;
    let supervisor_image = if spec.supervisor_image.is_empty() {
        settings.default_supervisor_image.as_str()
    } else {
        spec.supervisor_image.as_str()
    };
    let probe = |path: &str, port: &str| json!({"httpGet": {"path": path, "port": port}, "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3});
    let pod_labels = common_labels(names.gateway, names.uid);
    let mut gateway_mounts = vec![
        json!({"name": "config", "mountPath": "/etc/gantry", "readOnly": true}),
        json!({"name": "tmp", "mountPath": "/tmp"}),
    ];
    let mut volumes = vec![
        json!({"name": "config", "configMap": {"name": config_name}}),
        json!({"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}}),
    ];
    if let Some(secret) = tls_secret(spec) {
        gateway_mounts.push(json!({"name": "tls", "mountPath": TLS_DIR, "readOnly": true}));
        volumes
            .push(json!({"name": "tls", "secret": {"secretName": secret, "defaultMode": 0o440}}));
    }
    let mut supervisor_args = vec![
        "--config=/etc/gantry/gantry.json".to_string(),
        format!("--health-listen=0.0.0.0:{SUPERVISOR_HEALTH_PORT}"),
    ];
    if !spec.credential_driver.is_empty() {
        supervisor_args.push(format!("--credential-driver={}", spec.credential_driver));
    }
    let spread = |key: &str| {
        json!({
            "maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector}, "matchLabelKeys": ["pod-template-hash"],
        })
    };
    let mut deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": names.metadata(),
        "spec": {
            "selector": {"matchLabels": selector},
            "progressDeadlineSeconds": settings.progress_deadline.as_secs(),
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "securityContext": {
                        "runAsNonRoot": true, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "topologySpreadConstraints": [spread("topology.kubernetes.io/zone"), spread("kubernetes.io/hostname")],
                    "containers": [
                        {
                            "name": "gateway",
                            "image": spec.image,
                            "ports": [
                                {"name": "https", "containerPort": GATEWAY_PORT, "protocol": "TCP"},
                                {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
                            ],
                            "readinessProbe": probe("/readyz", "health"),
                            "livenessProbe": probe("/healthz", "health"),
                            "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_SECONDS}}},
                            "resources": settings.gateway_resources.overlaid(spec.resources.as_ref()).to_json(),
                            "securityContext": security_context(),
                            "volumeMounts": gateway_mounts,
                        },
                        {
                            "name": "supervisor",
                            "image": supervisor_image,
                            "args": supervisor_args,
                            "ports": [{"name": "supervisor", "containerPort": SUPERVISOR_HEALTH_PORT, "protocol": "TCP"}],
                            "readinessProbe": probe("/readyz", "supervisor"),
                            "livenessProbe": probe("/healthz", "supervisor"),
                            "resources": settings.supervisor_resources.to_json(),
                            "securityContext": security_context(),
                            "volumeMounts": [
                                {"name": "config", "mountPath": "/etc/gantry", "readOnly": true},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                        },
                    ],
                    "volumes": volumes,
                },
            },
        },
    });
    // Replicas left unset in the spec are not applied, so an autoscaler or
    // `kubectl scale` owns them and is not fought.
    if let Some(replicas) = spec.replicas {
        deployment["spec"]["replicas"] = json!(replicas);
    }
    deployment
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

    fn containers(r: &Rendered) -> Vec<Value> {
        let deployment = &r.get("Deployment").unwrap().body;
        deployment["spec"]["template"]["spec"]["containers"].as_array().unwrap().clone()
    }

    #[test]
    fn the_pod_passes_a_production_review() {
        for spec in [minimal(), full()] {
            let rendered = render(&gateway(spec.clone()), &RenderSettings::default());
            let deployment = &rendered.get("Deployment").unwrap().body;
            let pod = &deployment["spec"]["template"]["spec"];
            for container in containers(&rendered) {
                let name = container["name"].as_str().unwrap().to_string();
                for kind in ["requests", "limits"] {
                    for resource in ["cpu", "memory"] {
                        assert!(
                            container["resources"][kind][resource].is_string(),
                            "{name}: {kind}.{resource}"
                        );
                    }
                }
                for probe in ["readinessProbe", "livenessProbe"] {
                    assert!(container[probe]["httpGet"]["port"].is_string(), "{name}: {probe}");
                }
                assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true, "{name}");
                let mounts = container["volumeMounts"].as_array().unwrap();
                assert!(
                    mounts.iter().any(|m| m["mountPath"] == "/tmp" && m["readOnly"].is_null()),
                    "{name}: writable /tmp"
                );
                for arg in container["args"].as_array().into_iter().flatten() {
                    assert!(!arg.as_str().unwrap().ends_with('='), "{name}: empty argument {arg}");
                }
            }
            assert_eq!(pod["securityContext"]["runAsUser"], RUN_AS);
            assert_eq!(pod["securityContext"]["runAsGroup"], RUN_AS);
            assert_eq!(pod["terminationGracePeriodSeconds"], TERMINATION_GRACE_SECONDS);
            let gateway = &containers(&rendered)[0];
            assert_eq!(gateway["lifecycle"]["preStop"]["sleep"]["seconds"], PRE_STOP_SLEEP_SECONDS);
            let keys: Vec<&str> = pod["topologySpreadConstraints"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["topologyKey"].as_str().unwrap())
                .collect();
            assert_eq!(keys, ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]);
            let volumes = pod["volumes"].as_array().unwrap();
            let tmp = volumes.iter().find(|v| v["name"] == "tmp").unwrap();
            assert_eq!(tmp["emptyDir"]["sizeLimit"], TMP_SIZE_LIMIT);
            // The route's TLS Secret is mounted where the gateway serves.
            let tls = volumes.iter().find(|v| v["name"] == "tls");
            let mounted = gateway["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountPath"] == TLS_DIR);
            let secret =
                spec.route.as_ref().map(|r| r.tls_secret_name.as_str()).filter(|s| !s.is_empty());
            assert_eq!(tls.map(|v| v["secret"]["secretName"].as_str().unwrap()), secret);
            assert_eq!(mounted, secret.is_some());
        }
        // The Ingress names its class and says the backend speaks HTTPS.
        let rendered = render(
            &gateway(full()),
            &RenderSettings { ingress_class: "nginx".into(), ..RenderSettings::default() },
        );
        let ingress = &rendered.get("Ingress").unwrap().body;
        assert_eq!(ingress["spec"]["ingressClassName"], "nginx");
        assert_eq!(
            ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"],
            "HTTPS"
        );
        let service = &rendered.get("Service").unwrap().body;
        assert_eq!(service["spec"]["ports"][0]["appProtocol"], "https");
    }

    #[test]
    fn resources_default_from_flags_and_yield_to_the_gateways_own() {
        let defaults = Resources::parse(DEFAULT_GATEWAY_RESOURCES).unwrap();
        assert_eq!(defaults.requests["cpu"], "100m");
        assert_eq!(defaults.limits["memory"], "256Mi");
        // The gateway's own win name by name; a limit its request exceeds
        // is raised to the request; one it sets itself is kept.
        let own = ResourceRequirements {
            requests: [
                ("cpu".to_string(), "2".to_string()),
                ("memory".to_string(), "64Mi".to_string()),
            ]
            .into(),
            limits: [("ephemeral-storage".to_string(), "1Gi".to_string())].into(),
        };
        let merged = defaults.overlaid(Some(&own));
        assert_eq!(merged.requests["cpu"], "2");
        assert_eq!(merged.limits["cpu"], "2", "raised to the request");
        assert_eq!(merged.requests["memory"], "64Mi");
        assert_eq!(merged.limits["memory"], "256Mi");
        assert_eq!(merged.limits["ephemeral-storage"], "1Gi");
        assert_eq!(defaults.overlaid(None), defaults);
        for bad in [
            "requests.cpu",
            "cpu=1",
            "requests.cpu=lots",
            "requests.cpu=2,limits.cpu=1",
            "requests.=1",
        ] {
            assert!(Resources::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Resources::parse("").unwrap(), Resources::default());
    }

    fn kinds(r: &Rendered) -> Vec<&str> {
        r.objects.iter().map(|m| m.kind).collect()
    }

    /// Compares with `tests/golden/<name>.yaml`; `GANTRY_UPDATE_GOLDEN=1`
    /// rewrites the file instead.
    fn golden(name: &str, rendered: &Rendered) {
        let text = rendered
            .objects
            .iter()
            .map(|m| serde_saphyr::to_string(&m.body).unwrap())
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
    fn every_object_carries_the_labels_and_the_pods_the_fingerprint_of_their_inputs() {
        let r = render(&gateway(full()), &RenderSettings::default());
        for m in r.objects.iter().map(|m| &m.body) {
            assert_eq!(m["metadata"]["labels"][LABEL_GATEWAY], "edge");
            assert_eq!(m["metadata"]["labels"][LABEL_MANAGED_BY], "gantry");
        }
        assert!(pod_fingerprint(&r).is_some_and(|f| f.len() == 16), "{:?}", pod_fingerprint(&r));
    }

    fn pod_fingerprint(r: &Rendered) -> Option<String> {
        let deployment = &r.get("Deployment")?.body;
        let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
        annotations[ANNOTATION_FINGERPRINT].as_str().map(str::to_string)
    }

    type Change = fn(&mut GatewaySpec);

    #[test]
    fn pods_roll_for_what_they_consume_and_nothing_else() {
        let settings = RenderSettings::default();
        let base = render(&gateway(full()), &settings);
        let pods = pod_fingerprint(&base);
        // Not consumed by the pods: the same template, no new ReplicaSet.
        let untouched: Vec<(&str, Change)> = vec![
            ("the route's host", |s| s.route.as_mut().unwrap().host = "api.example.com".into()),
            ("replicas (and the PDB)", |s| s.replicas = Some(5)),
            ("a quantity respelled", |s| {
                s.resources.as_mut().unwrap().requests.insert("cpu".into(), "0.25".into());
            }),
        ];
        for (what, change) in untouched {
            let mut spec = full();
            change(&mut spec);
            assert_eq!(pod_fingerprint(&render(&gateway(spec), &settings)), pods, "{what}");
        }
        let other_class = RenderSettings { ingress_class: "traefik".into(), ..settings.clone() };
        assert_eq!(pod_fingerprint(&render(&gateway(full()), &other_class)), pods, "the class");
        // Consumed: a new template.
        let rolled: Vec<(&str, Change)> = vec![
            ("the config", |s| {
                s.config.insert("k".into(), "v".into());
            }),
            ("the image", |s| s.image = "other:1".into()),
            ("the TLS Secret's name", |s| s.route.as_mut().unwrap().tls_secret_name = "x".into()),
            ("a resource amount", |s| {
                s.resources.as_mut().unwrap().requests.insert("cpu".into(), "300m".into());
            }),
            ("the OIDC settings", |s| s.oidc = None),
        ];
        for (what, change) in rolled {
            let mut spec = full();
            change(&mut spec);
            assert_ne!(pod_fingerprint(&render(&gateway(spec), &settings)), pods, "{what}");
        }
        // A respelled quantity renders the very same objects.
        let mut respelled = full();
        respelled.resources.as_mut().unwrap().requests.insert("cpu".into(), "0.25".into());
        assert_eq!(render(&gateway(respelled), &settings), base);
    }

    #[test]
    fn the_config_map_is_named_after_its_content_and_immutable() {
        let settings = RenderSettings::default();
        let r = render(&gateway(full()), &settings);
        let config = &r.get("ConfigMap").unwrap();
        assert!(config.name.starts_with("edge-") && config.name.len() == "edge-".len() + 10);
        assert_eq!(config.body["immutable"], true);
        let pod = &r.get("Deployment").unwrap().body["spec"]["template"]["spec"];
        assert_eq!(pod["volumes"][0]["configMap"]["name"], config.name.as_str());
        let mut spec = full();
        spec.config.insert("k".into(), "v".into());
        let changed = render(&gateway(spec), &settings);
        assert_ne!(changed.get("ConfigMap").unwrap().name, config.name);
        let again = render(&gateway(full()), &settings);
        assert_eq!(again.get("ConfigMap").unwrap().name, config.name, "stable");
    }

    #[test]
    fn a_name_prefix_names_every_object_and_every_reference_but_not_the_labels() {
        let settings = RenderSettings { name_prefix: "gw-".into(), ..RenderSettings::default() };
        let r = render(&gateway(full()), &settings);
        for m in r.objects.iter().map(|m| &m.body) {
            let name = m["metadata"]["name"].as_str().unwrap();
            if m["kind"] == "ConfigMap" {
                assert!(name.starts_with("gw-edge-"), "{name}");
            } else {
                assert_eq!(name, "gw-edge", "{}", m["kind"]);
            }
            assert_eq!(m["metadata"]["labels"][LABEL_GATEWAY], "edge");
        }
        let deployment = &r.get("Deployment").unwrap().body;
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "gw-edge");
        let config = &r.get("ConfigMap").unwrap().name;
        assert!(config.starts_with("gw-edge-"), "{config}");
        assert_eq!(pod["volumes"][0]["configMap"]["name"], config.as_str());
        let ingress = &r.get("Ingress").unwrap().body;
        let backend = &ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"];
        assert_eq!(backend["name"], "gw-edge");
    }

    #[test]
    fn replicas_left_unset_are_not_rendered() {
        let r = render(&gateway(minimal()), &RenderSettings::default());
        let deployment = &r.get("Deployment").unwrap().body;
        assert!(deployment["spec"].get("replicas").is_none(), "{deployment}");
        let fixed = render(
            &gateway(GatewaySpec { replicas: Some(1), ..minimal() }),
            &RenderSettings::default(),
        );
        let deployment = &fixed.get("Deployment").unwrap().body;
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

//! kube-fake kept honest: the same scripted scenarios run against the real
//! API server (tests/k8s) and against kube-fake, and what the reconciler
//! reads (applied fields, generations, errors with their codes, reasons and
//! causes, watch events, deletion answers) must be the same on both.
//!
//! Skips with one line when the Kubernetes binaries are absent, and fails
//! instead under `CI=true`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use futures_util::StreamExt;
use gantry_kube_fake::KubeFake;
use gantry_testkit::k8s::ControlPlane;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    WatchEvent, WatchParams,
};
use serde_json::{json, Value};

/// Labelled observations of one server.
type Observations = BTreeMap<String, Value>;

fn api(client: &kube::Client, ns: &str, api_version: &str, kind: &str) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = format!("{}s", kind.to_ascii_lowercase());
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural);
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// What a call answered, reduced to what a client acts on.
fn outcome(result: &Result<DynamicObject, kube::Error>, fields: &[&str]) -> Value {
    match result {
        Ok(object) => {
            let value = serde_json::to_value(object).unwrap();
            let picked: serde_json::Map<String, Value> = fields
                .iter()
                .map(|f| {
                    let pointer = format!("/{}", f.replace('.', "/"));
                    (f.to_string(), value.pointer(&pointer).cloned().unwrap_or(Value::Null))
                })
                .collect();
            json!({"ok": picked})
        }
        Err(e) => error(e),
    }
}

fn error(e: &kube::Error) -> Value {
    match e {
        kube::Error::Api(status) => {
            let mut causes: Vec<Value> = status
                .details
                .as_ref()
                .map(|d| {
                    d.causes.iter().map(|c| json!({"type": c.reason, "field": c.field})).collect()
                })
                .unwrap_or_default();
            causes.sort_by_key(Value::to_string);
            json!({"code": status.code, "reason": status.reason, "causes": causes})
        }
        other => json!({"client error": other.to_string()}),
    }
}

async fn apply(
    api: &Api<DynamicObject>,
    manager: &str,
    force: bool,
    object: Value,
) -> Result<DynamicObject, kube::Error> {
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    let mut params = PatchParams::apply(manager);
    params.force = force;
    api.patch(&name, &params, &Patch::Apply(object)).await
}

fn config_map(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

fn deployment(name: &str, selector: Value, image: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {"containers": [{"name": "web", "image": image}]},
            },
        },
    })
}

/// The scripted scenarios, run in namespace `ns` of one server; `compact`
/// makes the server forget its watch history (a real server keeps a
/// bounded window, already past resourceVersion 1).
async fn scenarios(client: kube::Client, ns: &str, compact: &(dyn Fn() + Sync)) -> Observations {
    let mut seen = Observations::new();
    let cms = api(&client, ns, "v1", "ConfigMap");

    // Server-side apply: create, no-op, change, conflict, force, removal.
    let created = apply(&cms, "mgr-a", false, config_map("cm", json!({"a": "1", "b": "2"}))).await;
    seen.insert("apply create".into(), outcome(&created, &["data"]));
    let rv = created.unwrap().metadata.resource_version;
    let again = apply(&cms, "mgr-a", false, config_map("cm", json!({"a": "1", "b": "2"}))).await;
    seen.insert(
        "apply no-op keeps the resourceVersion".into(),
        json!(again.unwrap().metadata.resource_version == rv),
    );
    let changed = apply(&cms, "mgr-a", false, config_map("cm", json!({"a": "1", "b": "3"}))).await;
    seen.insert("apply change".into(), outcome(&changed, &["data"]));
    let conflict = apply(&cms, "mgr-b", false, config_map("cm", json!({"b": "4"}))).await;
    seen.insert("apply conflict".into(), outcome(&conflict, &["data"]));
    let forced = apply(&cms, "mgr-b", true, config_map("cm", json!({"b": "4"}))).await;
    seen.insert("apply force".into(), outcome(&forced, &["data"]));
    let dropped = apply(&cms, "mgr-a", false, config_map("cm", json!({"a": "1"}))).await;
    seen.insert("apply drops a field another manager owns".into(), outcome(&dropped, &["data"]));
    let removed = apply(&cms, "mgr-b", false, config_map("cm", json!({}))).await;
    seen.insert("apply removes a field nobody else owns".into(), outcome(&removed, &["data"]));
    let unknown = apply(
        &cms,
        "mgr-a",
        false,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "dta": {}}),
    )
    .await;
    seen.insert("apply with an unknown field".into(), outcome(&unknown, &["data"]));

    // Deployments: generation, immutable selector, requests above limits.
    let deployments = api(&client, ns, "apps/v1", "Deployment");
    let selector = json!({"app": "web"});
    let first = apply(
        &deployments,
        "mgr-a",
        false,
        deployment("web", selector.clone(), "web:1", json!({})),
    )
    .await;
    seen.insert("deployment create".into(), outcome(&first, &["metadata.generation"]));
    let annotated = apply(
        &deployments,
        "mgr-a",
        false,
        deployment("web", selector.clone(), "web:1", json!({"note": "x"})),
    )
    .await;
    seen.insert(
        "deployment annotation change".into(),
        outcome(&annotated, &["metadata.generation"]),
    );
    let spec_change = apply(
        &deployments,
        "mgr-a",
        false,
        deployment("web", selector.clone(), "web:2", json!({"note": "x"})),
    )
    .await;
    seen.insert("deployment spec change".into(), outcome(&spec_change, &["metadata.generation"]));
    let reselected = apply(
        &deployments,
        "mgr-a",
        false,
        deployment("web", json!({"app": "web", "tier": "edge"}), "web:2", json!({"note": "x"})),
    )
    .await;
    seen.insert(
        "deployment selector change".into(),
        outcome(&reselected, &["spec.selector.matchLabels"]),
    );
    let mut greedy = deployment("greedy", selector.clone(), "web:1", json!({}));
    greedy["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}});
    let greedy = apply(&deployments, "mgr-a", false, greedy).await;
    seen.insert("deployment requests above limits".into(), outcome(&greedy, &["metadata.name"]));

    // Services are named as RFC 1035 labels.
    let services = api(&client, ns, "v1", "Service");
    let digit = apply(
        &services,
        "mgr-a",
        false,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "1edge"},
               "spec": {"ports": [{"port": 443}]}}),
    )
    .await;
    seen.insert("service named with a leading digit".into(), outcome(&digit, &["metadata.name"]));

    // Label selectors are atomic: an apply replaces the whole selector.
    let pdbs = api(&client, ns, "policy/v1", "PodDisruptionBudget");
    let pdb = |labels: Value| {
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pdb"},
               "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}})
    };
    apply(&pdbs, "mgr-a", false, pdb(json!({"a": "1"}))).await.unwrap();
    let replaced = apply(&pdbs, "mgr-b", true, pdb(json!({"b": "2"}))).await;
    seen.insert(
        "a forced selector replaces the selector".into(),
        outcome(&replaced, &["spec.selector.matchLabels"]),
    );

    // A paginated list is one snapshot: later pages answer the first
    // page's resourceVersion, and a watch from it replays an object
    // created behind the cursor between pages.
    for name in ["p-b", "p-c", "p-d"] {
        let mut cm = config_map(name, json!({}));
        cm["metadata"]["labels"] = json!({"page": "yes"});
        apply(&cms, "mgr-a", false, cm).await.unwrap();
    }
    let params = kube::api::ListParams::default().labels("page=yes").limit(2);
    let first = cms.list(&params).await.unwrap();
    let mut behind = config_map("p-a", json!({}));
    behind["metadata"]["labels"] = json!({"page": "yes"});
    apply(&cms, "mgr-a", false, behind).await.unwrap();
    let (mut names, mut same_rv, mut token, mut last_rv) = (
        Vec::new(),
        true,
        first.metadata.continue_.clone(),
        first.metadata.resource_version.clone(),
    );
    names.extend(first.items.iter().filter_map(|o| o.metadata.name.clone()));
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = cms.list(&params.clone().continue_token(&t)).await.unwrap();
        same_rv &= page.metadata.resource_version == first.metadata.resource_version;
        names.extend(page.items.iter().filter_map(|o| o.metadata.name.clone()));
        (token, last_rv) = (page.metadata.continue_, page.metadata.resource_version);
    }
    seen.insert("a paginated list's names".into(), json!(names));
    seen.insert("every page answers the first page's resourceVersion".into(), json!(same_rv));
    let mut stream =
        cms.watch(&WatchParams::default().timeout(5), &last_rv.unwrap()).await.unwrap().boxed();
    let replayed = loop {
        match stream.next().await {
            Some(Ok(WatchEvent::Added(o))) => break json!(["ADDED", o.metadata.name]),
            Some(Ok(WatchEvent::Bookmark(_))) => continue,
            Some(Ok(other)) => break json!(format!("{other:?}")),
            Some(Err(e)) => break error(&e),
            None => break json!("nothing"),
        }
    };
    seen.insert(
        "a watch from a paginated list replays what was created behind it".into(),
        replayed,
    );

    // Watch from a listed resourceVersion: every change after it, in order.
    let listed = cms.list(&Default::default()).await.unwrap().metadata.resource_version.unwrap();
    apply(&cms, "mgr-a", false, config_map("watched", json!({"v": "1"}))).await.unwrap();
    apply(&cms, "mgr-a", false, config_map("watched", json!({"v": "2"}))).await.unwrap();
    cms.delete("watched", &DeleteParams::default()).await.unwrap();
    let mut stream = cms.watch(&WatchParams::default().timeout(5), &listed).await.unwrap().boxed();
    let mut events = Vec::new();
    while events.len() < 3 {
        let Some(event) = stream.next().await else { break };
        match event.unwrap() {
            WatchEvent::Added(o) => events.push(json!(["ADDED", o.metadata.name, o.data["data"]])),
            WatchEvent::Modified(o) => {
                events.push(json!(["MODIFIED", o.metadata.name, o.data["data"]]))
            }
            WatchEvent::Deleted(o) => events.push(json!(["DELETED", o.metadata.name])),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => events.push(json!(["ERROR", e.code])),
        }
    }
    seen.insert("watch from a listed resourceVersion".into(), json!(events));
    // A resourceVersion older than what the server keeps: 410 Gone, so the
    // client relists (kube-fake is asked to forget its history first).
    compact();
    let mut stream = cms.watch(&WatchParams::default().timeout(5), "1").await.unwrap().boxed();
    let first = match stream.next().await {
        Some(Ok(WatchEvent::Error(e))) => json!(["ERROR", e.code, e.reason]),
        Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o))) => {
            json!(["an event of", o.metadata.name])
        }
        Some(Ok(WatchEvent::Bookmark(b))) => json!(["a bookmark at", b.metadata.resource_version]),
        Some(Err(e)) => error(&e),
        None => json!("nothing"),
    };
    seen.insert("watch from a resourceVersion too old".into(), first);

    // Deletion: with a finalizer the object stays until it is removed.
    apply(&cms, "mgr-a", false, {
        let mut cm = config_map("held", json!({}));
        cm["metadata"]["finalizers"] = json!(["example.com/hold"]);
        cm
    })
    .await
    .unwrap();
    let held = cms.delete("held", &DeleteParams::default()).await.unwrap();
    seen.insert(
        "delete with a finalizer answers".into(),
        json!(held.map_left(|o| o.metadata.deletion_timestamp.is_some()).map_right(|s| s.code)),
    );
    seen.insert(
        "a held object is still there".into(),
        json!(cms.get_opt("held").await.unwrap().is_some()),
    );
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    seen.insert("released, it is gone".into(), json!(cms.get_opt("held").await.unwrap().is_none()));
    apply(&cms, "mgr-a", false, config_map("plain", json!({}))).await.unwrap();
    let plain = cms.delete("plain", &DeleteParams::default()).await.unwrap();
    seen.insert(
        "delete without finalizers answers".into(),
        json!(plain
            .map_left(|o| o.metadata.name)
            .map_right(|s| s.status.map(|s| format!("{s:?}")))),
    );
    seen
}

/// kubectl's imperative `create` sends protobuf bodies; a server must read
/// them (kubectl falls back to JSON only from CBOR, not from protobuf).
fn kubectl_creates(kubectl: &Path, kubeconfig: &Path, ns: &str) -> Value {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .unwrap();
        json!({"success": out.status.success(), "stderr": String::from_utf8_lossy(&out.stderr)})
    };
    json!({
        "configmap": run(&["-n", ns, "create", "configmap", "from-kubectl", "--from-literal=k=v"]),
        "secret": run(&["-n", ns, "create", "secret", "generic", "from-kubectl", "--from-literal=k=v"]),
        "namespace": run(&["create", "namespace", &format!("{ns}-from-kubectl")]),
        "read back": run(&["-n", ns, "get", "configmap", "from-kubectl", "-o", "jsonpath={.data.k}"]),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_fake_answers_as_the_real_api_server_does() {
    let Some(plane) = ControlPlane::shared() else { return };
    let real_ns = plane.namespace("diff");
    let real = scenarios(plane.client(&plane.admin_kubeconfig).await, &real_ns, &|| {}).await;
    let mut real_all = real.clone();
    real_all.insert(
        "kubectl create".into(),
        kubectl_creates(
            &gantry_testkit::k8s::kubectl().unwrap(),
            &plane.admin_kubeconfig,
            &real_ns,
        ),
    );

    let fake = KubeFake::start().await.unwrap();
    let fake_client =
        kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    let dir = gantry_testkit::temp_dir("diff");
    let fake_kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &fake_kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: {}}}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: u}}\ncurrent-context: fake\n",
            fake.url()
        ),
    )
    .unwrap();
    let mut fake_all = scenarios(fake_client, "default", &|| fake.compact()).await;
    fake_all.insert(
        "kubectl create".into(),
        kubectl_creates(&gantry_testkit::k8s::kubectl().unwrap(), &fake_kubeconfig, "default"),
    );
    fake.stop().await;
    let _ = std::fs::remove_dir_all(dir);

    let mut differences = Vec::new();
    for (label, real_value) in &real_all {
        let fake_value = fake_all.get(label).unwrap_or(&Value::Null);
        // kubectl's messages name the server; only success matters.
        let comparable = |v: &Value| {
            let mut v = v.clone();
            for run in v.as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
                if let Some(map) = run.as_object_mut() {
                    map.remove("stderr");
                }
            }
            v
        };
        if comparable(real_value) != comparable(fake_value) {
            differences
                .push(format!("{label}:\n  real:      {real_value}\n  kube-fake: {fake_value}"));
        }
    }
    eprintln!("real API server observations: {}", serde_json::to_string_pretty(&real_all).unwrap());
    assert!(
        differences.is_empty(),
        "kube-fake diverges from the real API server:\n{}",
        differences.join("\n")
    );
}

/// kube-fake's schemas (`crates/k8s-schema/src/schema.json`) are those of
/// the real API server of the pinned release; with
/// `GANTRY_UPDATE_KUBE_SCHEMA=1` this test rewrites them.
#[test]
fn kube_fake_schemas_are_the_real_api_servers() {
    let Some(plane) = ControlPlane::shared() else { return };
    let mut documents = Vec::new();
    let mut kinds = Vec::new();
    let mut paths = std::collections::BTreeSet::new();
    for rt in gantry_kube_fake::resources::RESOURCES {
        kinds.push((rt.api_version(), rt.kind.to_string()));
        paths.insert(if rt.group.is_empty() {
            format!("/openapi/v3/api/{}", rt.version)
        } else {
            format!("/openapi/v3/apis/{}/{}", rt.group, rt.version)
        });
    }
    for path in paths {
        documents
            .push(serde_json::from_str::<Value>(&plane.kubectl(&["get", "--raw", &path])).unwrap());
    }
    let compact = gantry_k8s_schema::compact(&documents, &kinds);
    assert_eq!(
        compact["kinds"].as_object().unwrap().len(),
        kinds.len(),
        "every served kind has a schema"
    );
    let text = serde_json::to_string_pretty(&compact).unwrap() + "\n";
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/k8s-schema/src/schema.json");
    if std::env::var_os("GANTRY_UPDATE_KUBE_SCHEMA").is_some() {
        std::fs::write(&file, &text).unwrap();
    }
    assert!(
        std::fs::read_to_string(&file).unwrap() == text,
        "{} is not what the real API server serves: rerun this test with GANTRY_UPDATE_KUBE_SCHEMA=1",
        file.display()
    );
}

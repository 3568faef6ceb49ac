//! The real kube-rs client against kube-fake: every verb, server-side
//! apply semantics, watches, rollouts, deletion, faults and the request log.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures_util::StreamExt;
use gantry_kube_fake::{FaultAction, FaultRule, KubeFake, Options, RequestRecord};
use gantry_testkit::eventually_some;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::Client;
use serde_json::json;

const PATIENCE: Duration = Duration::from_secs(30);

fn client(fake: &KubeFake) -> Client {
    let config = kube::Config::new(fake.url().parse().unwrap());
    Client::try_from(config).unwrap()
}

fn api_error(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(status) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn config_map(name: &str, labels: serde_json::Value, data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": data})).unwrap()
}

fn deployment(name: &str, image: &str, replicas: Option<i32>, extra_container: bool) -> Deployment {
    let mut containers =
        vec![json!({"name": "gateway", "image": image, "ports": [{"containerPort": 8080}]})];
    if extra_container {
        containers.push(json!({"name": "supervisor", "image": "ghcr.io/acme/sup:1"}));
    }
    let mut d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": containers}}
        }
    });
    if let Some(r) = replicas {
        d["spec"]["replicas"] = json!(r);
    }
    serde_json::from_value(d).unwrap()
}

fn rv(meta: &kube::api::ObjectMeta) -> String {
    meta.resource_version.clone().unwrap()
}

#[tokio::test]
async fn create_get_list_update_patch_delete() {
    let fake = KubeFake::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), "default");
    let created = api
        .create(&PostParams::default(), &config_map("a", json!({"app": "x"}), json!({"k": "1"})))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    api.create(&PostParams::default(), &config_map("b", json!({"app": "y"}), json!({})))
        .await
        .unwrap();
    let again = api
        .create(&PostParams::default(), &config_map("a", json!({}), json!({})))
        .await
        .unwrap_err();
    assert!(api_error(again).is_already_exists());

    assert_eq!(api.get("a").await.unwrap().data.unwrap()["k"], "1");
    assert!(api_error(api.get("missing").await.unwrap_err()).is_not_found());
    assert!(api.get_opt("missing").await.unwrap().is_none());
    let selected = api.list(&ListParams::default().labels("app=x")).await.unwrap();
    assert_eq!(selected.items.len(), 1);
    let by_field = api.list(&ListParams::default().fields("metadata.name=b")).await.unwrap();
    assert_eq!(by_field.items[0].metadata.name.as_deref(), Some("b"));
    let page = api.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let rest = api
        .list(
            &ListParams::default()
                .limit(1)
                .continue_token(page.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(rest.items[0].metadata.name.as_deref(), Some("b"));

    // Update with a resourceVersion precondition.
    let mut a = api.get("a").await.unwrap();
    let stale = a.clone();
    a.data = Some([("k".to_string(), "2".to_string())].into());
    let updated = api.replace("a", &PostParams::default(), &a).await.unwrap();
    assert_ne!(rv(&updated.metadata), rv(&stale.metadata));
    let conflict = api.replace("a", &PostParams::default(), &stale).await.unwrap_err();
    assert!(api_error(conflict).is_conflict());

    let patched = api
        .patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": null, "n": "3"}})))
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap(), [("n".to_string(), "3".to_string())].into());

    api.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("a").await.unwrap().is_none());
    let ns: Api<ConfigMap> = Api::namespaced(client(&fake), "nowhere");
    let err = ns
        .create(&PostParams::default(), &config_map("c", json!({}), json!({})))
        .await
        .unwrap_err();
    assert!(api_error(err).is_not_found(), "a namespace must exist");
}

#[tokio::test]
async fn generation_moves_on_spec_changes_only() {
    let fake = KubeFake::start().await.unwrap();
    let api: Api<Deployment> = Api::namespaced(client(&fake), "default");
    let d = api
        .create(&PostParams::default(), &deployment("gw", "gw:1", Some(1), false))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    let labelled = api
        .patch(
            "gw",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(1));
    let scaled = api
        .patch("gw", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .unwrap();
    assert_eq!(scaled.metadata.generation, Some(2));
}

#[tokio::test]
async fn server_side_apply_creates_updates_and_is_a_noop_when_unchanged() {
    let fake = KubeFake::start().await.unwrap();
    let api: Api<Deployment> = Api::namespaced(client(&fake), "default");
    let params = PatchParams::apply("gantry-reconciler").force();
    let first = api
        .patch("gw", &params, &Patch::Apply(deployment("gw", "gw:1", Some(2), true)))
        .await
        .unwrap();
    assert_eq!(first.metadata.generation, Some(1));
    let managers: Vec<_> = first
        .metadata
        .managed_fields
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| (m.manager.clone().unwrap(), m.operation.clone().unwrap()))
        .collect();
    assert_eq!(managers, [("gantry-reconciler".to_string(), "Apply".to_string())]);

    let repeat = api
        .patch("gw", &params, &Patch::Apply(deployment("gw", "gw:1", Some(2), true)))
        .await
        .unwrap();
    assert_eq!(rv(&repeat.metadata), rv(&first.metadata), "a repeated apply changes nothing");
    assert_eq!(repeat.metadata.generation, Some(1));

    let changed = api
        .patch("gw", &params, &Patch::Apply(deployment("gw", "gw:2", Some(2), true)))
        .await
        .unwrap();
    assert_eq!(changed.metadata.generation, Some(2));
    let containers = changed.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers.len(), 2, "containers merge by name");
    assert_eq!(containers[0].image.as_deref(), Some("gw:2"));
}

#[tokio::test]
async fn apply_conflicts_between_managers_and_force_resolves_them() {
    let fake = KubeFake::start().await.unwrap();
    let api: Api<Deployment> = Api::namespaced(client(&fake), "default");
    api.patch(
        "gw",
        &PatchParams::apply("team-a"),
        &Patch::Apply(deployment("gw", "gw:1", Some(2), false)),
    )
    .await
    .unwrap();
    let err = api
        .patch(
            "gw",
            &PatchParams::apply("team-b"),
            &Patch::Apply(deployment("gw", "gw:1", Some(5), false)),
        )
        .await
        .unwrap_err();
    let status = api_error(err);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains("team-a") && status.message.contains(".spec.replicas"),
        "{}",
        status.message
    );
    assert_eq!(api.get("gw").await.unwrap().spec.unwrap().replicas, Some(2), "nothing changed");

    let forced = api
        .patch(
            "gw",
            &PatchParams::apply("team-b").force(),
            &Patch::Apply(deployment("gw", "gw:1", Some(5), false)),
        )
        .await
        .unwrap();
    assert_eq!(forced.spec.unwrap().replicas, Some(5));
    // team-a lost replicas: applying its old value again now conflicts.
    let err = api
        .patch(
            "gw",
            &PatchParams::apply("team-a"),
            &Patch::Apply(deployment("gw", "gw:1", Some(2), false)),
        )
        .await
        .unwrap_err();
    assert!(api_error(err).message.contains("team-b"));
}

#[tokio::test]
async fn fields_no_longer_applied_are_removed() {
    let fake = KubeFake::start().await.unwrap();
    let api: Api<Deployment> = Api::namespaced(client(&fake), "default");
    let params = PatchParams::apply("gantry-reconciler").force();
    let mut with_annotation = deployment("gw", "gw:1", Some(2), true);
    with_annotation.metadata.annotations =
        Some([("gantry.dev/fingerprint".to_string(), "abc".to_string())].into());
    api.patch("gw", &params, &Patch::Apply(&with_annotation)).await.unwrap();
    let trimmed = api
        .patch("gw", &params, &Patch::Apply(deployment("gw", "gw:1", None, false)))
        .await
        .unwrap();
    assert!(trimmed.metadata.annotations.unwrap_or_default().is_empty(), "annotation removed");
    let spec = trimmed.spec.unwrap();
    assert_eq!(spec.replicas, None, "replicas removed");
    assert_eq!(spec.template.spec.unwrap().containers.len(), 1, "the supervisor container removed");
}

type EventStream = futures_util::stream::BoxStream<'static, kube::Result<WatchEvent<ConfigMap>>>;

async fn next(stream: &mut EventStream) -> WatchEvent<ConfigMap> {
    tokio::time::timeout(PATIENCE, stream.next()).await.unwrap().unwrap().unwrap()
}

#[tokio::test]
async fn watches_resume_from_a_resource_version_and_expire_with_410() {
    let fake = KubeFake::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), "default");
    let created = api
        .create(&PostParams::default(), &config_map("w", json!({"app": "w"}), json!({"v": "1"})))
        .await
        .unwrap();
    api.patch("w", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}})))
        .await
        .unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();

    let mut stream =
        api.watch(&WatchParams::default(), &rv(&created.metadata)).await.unwrap().boxed();
    assert!(
        matches!(next(&mut stream).await, WatchEvent::Modified(cm) if cm.data.as_ref().unwrap()["v"] == "2")
    );
    assert!(matches!(next(&mut stream).await, WatchEvent::Deleted(_)));
    api.create(&PostParams::default(), &config_map("later", json!({}), json!({}))).await.unwrap();
    assert!(
        matches!(next(&mut stream).await, WatchEvent::Added(cm) if cm.metadata.name.as_deref() == Some("later"))
    );

    fake.compact();
    let mut old = api.watch(&WatchParams::default(), &rv(&created.metadata)).await.unwrap().boxed();
    match next(&mut old).await {
        WatchEvent::Error(status) => assert_eq!(status.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }

    let bookmarks = WatchParams::default();
    let fake2 = KubeFake::start_with(Options {
        bookmark_interval: Duration::from_millis(50),
        ..Options::default()
    })
    .await
    .unwrap();
    let api2: Api<ConfigMap> = Api::namespaced(client(&fake2), "default");
    let mut s = api2.watch(&bookmarks, "0").await.unwrap().boxed();
    assert!(matches!(next(&mut s).await, WatchEvent::Bookmark(_)));
}

/// A paginated list is one snapshot: every page answers the first page's
/// resourceVersion, so an object created behind the cursor between pages
/// (missing from the list) reaches a client that watches from the list's
/// resourceVersion. An informer that listed while objects were being
/// created otherwise missed them until its next relist.
#[tokio::test]
async fn a_paginated_list_is_one_snapshot_a_watch_from_it_misses_nothing() {
    let fake = KubeFake::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), "default");
    for name in ["p-b", "p-c", "p-d"] {
        api.create(&PostParams::default(), &config_map(name, json!({"page": "yes"}), json!({})))
            .await
            .unwrap();
    }
    let params = ListParams::default().labels("page=yes").limit(2);
    let first = api.list(&params).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    api.create(&PostParams::default(), &config_map("p-a", json!({"page": "yes"}), json!({})))
        .await
        .unwrap();
    let second = api.list(&params.clone().continue_token(&token)).await.unwrap();
    let names = |list: &kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items.iter().map(|c| c.metadata.name.clone().unwrap()).collect()
    };
    assert_eq!(
        (names(&first), names(&second)),
        (vec!["p-b".into(), "p-c".into()], vec!["p-d".to_string()])
    );
    assert_eq!(second.metadata.resource_version, first.metadata.resource_version);
    let listed = second.metadata.resource_version.unwrap();
    let mut stream = api.watch(&WatchParams::default(), &listed).await.unwrap().boxed();
    assert!(
        matches!(next(&mut stream).await, WatchEvent::Added(cm) if cm.metadata.name.as_deref() == Some("p-a")),
        "the object created behind the cursor is replayed"
    );
}

#[tokio::test]
async fn the_runtime_watcher_lists_then_watches() {
    use kube::runtime::watcher::{watcher, Config, Event};
    let fake = KubeFake::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), "default");
    api.create(&PostParams::default(), &config_map("one", json!({"app": "r"}), json!({})))
        .await
        .unwrap();
    let mut events = watcher(api.clone(), Config::default().labels("app=r")).boxed();
    let mut seen = Vec::new();
    while !seen.contains(&"two".to_string()) {
        match tokio::time::timeout(PATIENCE, events.next()).await.unwrap().unwrap().unwrap() {
            Event::InitApply(cm) | Event::Apply(cm) => seen.push(cm.metadata.name.unwrap()),
            Event::InitDone => {
                api.create(
                    &PostParams::default(),
                    &config_map("two", json!({"app": "r"}), json!({})),
                )
                .await
                .unwrap();
                api.create(
                    &PostParams::default(),
                    &config_map("other", json!({"app": "s"}), json!({})),
                )
                .await
                .unwrap();
            }
            _ => {}
        }
    }
    assert_eq!(seen, ["one", "two"]);
}

#[tokio::test]
async fn deployments_roll_out_or_stall() {
    let fake = KubeFake::start_with(Options {
        rollout_delay: Duration::from_millis(20),
        ..Options::default()
    })
    .await
    .unwrap();
    let api: Api<Deployment> = Api::namespaced(client(&fake), "default");
    let params = PatchParams::apply("gantry-reconciler").force();
    api.patch("ok", &params, &Patch::Apply(deployment("ok", "gw:1", Some(2), false)))
        .await
        .unwrap();
    fake.set_stalled("default", "stuck", true);
    api.patch("stuck", &params, &Patch::Apply(deployment("stuck", "gw:1", Some(2), false)))
        .await
        .unwrap();

    let status_of = |name: &'static str| {
        let api = api.clone();
        async move {
            eventually_some(PATIENCE, &format!("{name} observed"), || async {
                let d = api.get(name).await.unwrap();
                d.status.filter(|s| s.observed_generation == d.metadata.generation)
            })
            .await
        }
    };
    let ok = status_of("ok").await;
    assert_eq!(
        (ok.replicas, ok.updated_replicas, ok.available_replicas),
        (Some(2), Some(2), Some(2))
    );
    let conditions = ok.conditions.unwrap();
    assert!(conditions.iter().any(|c| c.type_ == "Available" && c.status == "True"));
    let stuck = status_of("stuck").await;
    let progressing =
        stuck.conditions.unwrap().into_iter().find(|c| c.type_ == "Progressing").unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_deref()),
        ("False", Some("ProgressDeadlineExceeded"))
    );

    // A spec change rolls out again; status is not the applier's to write.
    let d = api
        .patch("ok", &params, &Patch::Apply(deployment("ok", "gw:2", Some(2), false)))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2));
    assert_eq!(status_of("ok").await.observed_generation, Some(2));
    let managers: Vec<_> = api
        .get("ok")
        .await
        .unwrap()
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .map(|m| (m.manager.unwrap(), m.subresource))
        .collect();
    assert!(managers.contains(&("kube-controller-manager".to_string(), Some("status".to_string()))));
}

#[tokio::test]
async fn deletion_honours_finalizers_preconditions_and_owners() {
    let fake = KubeFake::start().await.unwrap();
    let client = client(&fake);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");

    // Finalizers hold the object.
    let mut held = config_map("held", json!({}), json!({}));
    held.metadata.finalizers = Some(vec!["gantry.dev/cleanup".into()]);
    let held = cms.create(&PostParams::default(), &held).await.unwrap();
    let wrong = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: Some("1".into()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    assert!(api_error(cms.delete("held", &wrong).await.unwrap_err()).is_conflict());
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let deleting = cms.get("held").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none());
    let _ = held;

    // Background: dependents go after the owner.
    let owner = deployments
        .create(&PostParams::default(), &deployment("owner", "gw:1", Some(1), false))
        .await
        .unwrap();
    let reference = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "owner", "uid": owner.metadata.uid.clone().unwrap(), "blockOwnerDeletion": true}]);
    let mut dependent = config_map("dependent", json!({}), json!({}));
    dependent.metadata.owner_references = Some(serde_json::from_value(reference.clone()).unwrap());
    cms.create(&PostParams::default(), &dependent).await.unwrap();
    deployments.delete("owner", &DeleteParams::background()).await.unwrap();
    assert!(cms.get_opt("dependent").await.unwrap().is_none());

    // Foreground: the owner waits for a dependent held by a finalizer.
    let owner = deployments
        .create(&PostParams::default(), &deployment("owner2", "gw:1", Some(1), false))
        .await
        .unwrap();
    let mut reference = reference;
    reference[0]["name"] = json!("owner2");
    reference[0]["uid"] = json!(owner.metadata.uid.clone().unwrap());
    let mut blocker = config_map("blocker", json!({}), json!({}));
    blocker.metadata.owner_references = Some(serde_json::from_value(reference).unwrap());
    blocker.metadata.finalizers = Some(vec!["gantry.dev/hold".into()]);
    cms.create(&PostParams::default(), &blocker).await.unwrap();
    deployments.delete("owner2", &DeleteParams::foreground()).await.unwrap();
    let waiting = deployments.get("owner2").await.unwrap();
    assert!(waiting.metadata.finalizers.unwrap().contains(&"foregroundDeletion".to_string()));
    cms.patch(
        "blocker",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("blocker").await.unwrap().is_none());
    assert!(deployments.get_opt("owner2").await.unwrap().is_none(), "foreground deletion finished");

    // Deleting a namespace deletes its contents.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "gone"}})).unwrap(),
        )
        .await
        .unwrap();
    let in_ns: Api<ConfigMap> = Api::namespaced(client, "gone");
    in_ns.create(&PostParams::default(), &config_map("x", json!({}), json!({}))).await.unwrap();
    namespaces.delete("gone", &DeleteParams::default()).await.unwrap();
    assert!(in_ns.get_opt("x").await.unwrap().is_none());
}

#[tokio::test]
async fn injected_faults_reach_the_client_as_the_right_errors() {
    let fake = KubeFake::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake), "default");
    api.create(&PostParams::default(), &config_map("f", json!({}), json!({}))).await.unwrap();
    let rule = |verb: &str, code: u16, retry_after: Option<u64>| FaultRule {
        verb: Some(verb.into()),
        resource: Some("/configmaps".into()),
        action: FaultAction::Status { code, retry_after },
        rate: 1.0,
        remaining: Some(1),
    };
    fake.inject(rule("get", 500, None));
    assert_eq!(api_error(api.get("f").await.unwrap_err()).code, 500);
    assert!(api.get("f").await.is_ok(), "a fault with remaining 1 fires once");
    // kube-rs retries 429 after the server's Retry-After: one throttled
    // list, then the retry succeeds.
    fake.clear_requests();
    fake.inject(rule("list", 429, Some(1)));
    assert_eq!(api.list(&ListParams::default()).await.unwrap().items.len(), 1);
    assert_eq!(fake.requests().iter().filter(|r| r.verb == "list").count(), 2);
    fake.inject(rule("apply", 409, None));
    let err = api
        .patch("f", &PatchParams::apply("m"), &Patch::Apply(config_map("f", json!({}), json!({}))))
        .await
        .unwrap_err();
    assert!(api_error(err).is_conflict());
    fake.inject(FaultRule {
        verb: None,
        resource: None,
        action: FaultAction::Latency(Duration::from_millis(1)),
        rate: 1.0,
        remaining: Some(1),
    });
    assert!(api.get("f").await.is_ok(), "latency delays, it does not fail");

    // Dropped watch connections end the stream; the next watch may expire.
    let mut stream = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    assert!(matches!(stream.next().await, Some(Ok(WatchEvent::Added(_)))));
    fake.drop_watches();
    assert!(tokio::time::timeout(PATIENCE, stream.next()).await.unwrap().is_none());
    fake.expire_next_watches(1);
    let mut expired = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    match tokio::time::timeout(PATIENCE, expired.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Error(status) => assert_eq!(status.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn the_request_log_records_a_scripted_scenario() {
    let fake = KubeFake::start().await.unwrap();
    let client = client(&fake);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let leases: Api<Lease> = Api::namespaced(client, "default");
    fake.clear_requests();
    cms.patch(
        "cfg",
        &PatchParams::apply("gantry-reconciler").force(),
        &Patch::Apply(config_map("cfg", json!({}), json!({"a": "1"}))),
    )
    .await
    .unwrap();
    cms.get("cfg").await.unwrap();
    cms.list(&ListParams::default().labels("gantry.dev/gateway=edge")).await.unwrap();
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}}),
    )
    .unwrap();
    let lease = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut renewed = lease.clone();
    renewed.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases.replace("leader", &PostParams::default(), &renewed).await.unwrap();
    assert!(api_error(leases.replace("leader", &PostParams::default(), &lease).await.unwrap_err())
        .is_conflict());
    cms.delete("cfg", &DeleteParams::default()).await.unwrap();

    let record = |verb: &str, resource: &str, name: &str, manager: &str| RequestRecord {
        verb: verb.into(),
        resource: resource.into(),
        namespace: "default".into(),
        name: name.into(),
        subresource: String::new(),
        field_manager: manager.into(),
    };
    let requests = fake.requests();
    assert_eq!(
        requests,
        [
            record("apply", "/configmaps", "cfg", "gantry-reconciler"),
            record("get", "/configmaps", "cfg", ""),
            record("list", "/configmaps", "", ""),
            record("create", "coordination.k8s.io/leases", "", &requests[3].field_manager),
            record("update", "coordination.k8s.io/leases", "leader", &requests[4].field_manager),
            record("update", "coordination.k8s.io/leases", "leader", &requests[5].field_manager),
            record("delete", "/configmaps", "cfg", ""),
        ]
    );
    assert_eq!(requests.iter().filter(|r| r.is_write()).count(), 5);
}

#[tokio::test]
async fn discovery_serves_typed_and_dynamic_clients() {
    let fake = KubeFake::start().await.unwrap();
    let client = client(&fake);
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let discovery = kube::discovery::Discovery::new(client.clone()).run().await.unwrap();
    let (resource, caps) = discovery
        .resolve_gvk(&kube::api::GroupVersionKind::gvk("apps", "v1", "Deployment"))
        .unwrap();
    assert_eq!(resource.plural, "deployments");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    let dynamic: Api<kube::api::DynamicObject> = Api::namespaced_with(client, "default", &resource);
    let params = PatchParams::apply("dyn").force();
    let obj: kube::api::DynamicObject = serde_json::from_value(
        serde_json::to_value(deployment("dyn", "gw:1", Some(1), false)).unwrap(),
    )
    .unwrap();
    let applied = dynamic.patch("dyn", &params, &Patch::Apply(&obj)).await.unwrap();
    assert_eq!(applied.metadata.generation, Some(1));
    assert_eq!(dynamic.list(&ListParams::default()).await.unwrap().items.len(), 1);
}

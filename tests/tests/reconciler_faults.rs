//! The reconciler under a hostile cluster: random 500s, 429s and latency on
//! every resource, watches dropped and expired, while 200 gateways are
//! created, 50 changed and 50 deleted. While faults last, a FAILED gateway
//! says why; once they stop, every gateway converges, nothing of a deleted
//! gateway is left, and the requests sent stay bounded.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, Gateway, GatewaySpec, ListGatewaysRequest,
    ObjectMeta, Phase, Route, UpdateGatewayRequest,
};
use gantry_client::{ClientConfig, GatewayClient};
use gantry_core::recovery::RecoveryPolicy;
use gantry_core::retry::Backoff;
use gantry_kube_fake::{FaultAction, FaultRule, KubeFake, Options};
use gantry_reconciler::controller::{Controller, Settings};
use gantry_reconciler::metrics::Metrics;
use gantry_reconciler::render::{RenderSettings, LABEL_GATEWAY};
use gantry_reconciler::store::GrpcStore;
use gantry_reconciler::targets::kube::KubeTarget;
use gantry_testkit::{temp_dir, StoreProcess};
use prost_types::FieldMask;

const GATEWAYS: usize = 200;

fn spec(i: usize, image: &str) -> GatewaySpec {
    GatewaySpec {
        image: image.into(),
        route: i
            .is_multiple_of(5)
            .then(|| Route { host: format!("g{i}.example.com"), ..Default::default() }),
        ..Default::default()
    }
}

async fn all(client: &mut GatewayClient) -> Vec<Gateway> {
    let request = ListGatewaysRequest { page_size: 1000, ..Default::default() };
    client.list_gateways(request).await.unwrap().into_inner().gateways
}

fn converged(g: &Gateway) -> bool {
    let (meta, status) = (g.metadata.as_ref().unwrap(), g.status.clone().unwrap_or_default());
    status.phase() == Phase::Running && status.observed_generation == meta.generation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_random_cluster_faults_gateways_converge_or_fail_truthfully() {
    let dir = temp_dir("reconciler-faults");
    let store = StoreProcess::start(&format!("sqlite://{}", dir.join("gantry.db").display()), &dir);
    let kube = KubeFake::start_with(Options {
        rollout_delay: Duration::from_millis(20),
        ..Options::default()
    })
    .await
    .unwrap();
    let kube_client =
        kube::Client::try_from(kube::Config::new(kube.url().parse().unwrap())).unwrap();
    let config = ClientConfig { endpoint: store.endpoint(), ..Default::default() };
    let settings = Settings {
        render: RenderSettings::default(),
        policy: RecoveryPolicy {
            budget: 3,
            backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(400),
                jitter: 0.2,
            },
            sync_period: Duration::from_secs(5),
            failed_window_floor: Duration::from_secs(1),
        },
        concurrency: 8,
        sync_period: Duration::from_secs(5),
        poll_interval: Duration::from_millis(100),
        ..Settings::default()
    };
    let controller = Controller::new(
        Arc::new(GrpcStore::new(config.connect_lazy().unwrap())),
        Arc::new(KubeTarget::new(kube_client.clone(), "default")),
        settings,
        Arc::new(Metrics::default()),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let reconciler = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));

    // Faults on every verb and resource.
    for (action, rate) in [
        (FaultAction::Status { code: 500, retry_after: None }, 0.10),
        (FaultAction::Status { code: 429, retry_after: Some(0) }, 0.05),
        (FaultAction::Latency(Duration::from_millis(30)), 0.10),
    ] {
        kube.inject(FaultRule { verb: None, resource: None, action, rate, remaining: None });
    }
    let mut client = config.connect_lazy().unwrap();
    for i in 0..GATEWAYS {
        let g = Gateway {
            metadata: Some(ObjectMeta { name: format!("g{i:03}"), ..Default::default() }),
            spec: Some(spec(i, "ghcr.io/acme/gw:1")),
            status: None,
        };
        client
            .create_gateway(CreateGatewayRequest { gateway: Some(g), validate_only: false })
            .await
            .unwrap();
        if i.is_multiple_of(25) {
            kube.drop_watches();
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for i in 0..50 {
        let g = Gateway {
            metadata: Some(ObjectMeta { name: format!("g{i:03}"), ..Default::default() }),
            spec: Some(spec(i, "ghcr.io/acme/gw:2")),
            status: None,
        };
        let mask = Some(FieldMask { paths: vec!["spec".into()] });
        client
            .update_gateway(UpdateGatewayRequest {
                gateway: Some(g),
                update_mask: mask,
                validate_only: false,
            })
            .await
            .unwrap();
    }
    let deleted: BTreeSet<String> = (150..GATEWAYS).map(|i| format!("g{i:03}")).collect();
    for name in &deleted {
        client
            .delete_gateway(DeleteGatewayRequest { name: name.clone(), ..Default::default() })
            .await
            .unwrap();
    }

    // While the faults last (watches dropped and expired too): whatever
    // is FAILED says why.
    let mut failed_seen = 0;
    for round in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        kube.drop_watches();
        if round % 3 == 0 {
            kube.expire_next_watches(1);
        }
        for g in all(&mut client).await {
            let status = g.status.clone().unwrap_or_default();
            if status.phase() == Phase::Failed {
                failed_seen += 1;
                assert!(!status.message.is_empty(), "FAILED without a message: {g:?}");
                assert!(status.failure_count > 0, "FAILED without failures: {g:?}");
            }
        }
    }

    // The faults stop: everything settles.
    kube.clear_faults();
    kube.clear_requests();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let gateways = all(&mut client).await;
        let names: BTreeSet<String> =
            gateways.iter().map(|g| g.metadata.as_ref().unwrap().name.clone()).collect();
        let pending: Vec<&Gateway> = gateways.iter().filter(|g| !converged(g)).collect();
        if pending.is_empty()
            && names.is_disjoint(&deleted)
            && names.len() == GATEWAYS - deleted.len()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled 2 minutes after the faults stopped: {} unconverged, deleted still present: {:?}",
            pending.len(),
            names.intersection(&deleted).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Nothing of a deleted gateway is left in the cluster; every kept one
    // has its Deployment, and routed ones their Ingress.
    let owners = |kind: &str| {
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
            kube_client.clone(),
            "default",
            &kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk(
                    if kind == "ingresses" {
                        "networking.k8s.io"
                    } else if kind == "deployments" {
                        "apps"
                    } else {
                        ""
                    },
                    "v1",
                    "",
                ),
                kind,
            ),
        );
        async move {
            api.list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|o| o.metadata.labels?.get(LABEL_GATEWAY).cloned())
                .collect::<Vec<String>>()
        }
    };
    for kind in ["deployments", "services", "configmaps", "ingresses"] {
        let owned = owners(kind).await;
        let leaked: Vec<&String> = owned.iter().filter(|g| deleted.contains(*g)).collect();
        assert!(leaked.is_empty(), "{kind} of deleted gateways left behind: {leaked:?}");
        let expected = if kind == "ingresses" {
            (0..150usize).filter(|i| i.is_multiple_of(5)).count()
        } else {
            150
        };
        assert_eq!(owned.len(), expected, "{kind}: one per kept gateway");
    }

    // Settling after the faults took a bounded number of requests.
    let requests = kube.requests().iter().filter(|r| r.verb != "watch").count();
    assert!(requests < 20 * GATEWAYS, "{requests} cluster requests to settle {GATEWAYS} gateways");
    eprintln!("faults: {failed_seen} FAILED observations while faults lasted; settled with {requests} requests");

    let _ = stop.send(());
    let _ = reconciler.await;
    kube.stop().await;
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

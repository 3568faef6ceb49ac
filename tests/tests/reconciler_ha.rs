//! Two reconciler replicas with leader election through a Lease on
//! kube-fake: only the leader writes; when it dies without releasing the
//! lease, the other takes over once the lease expires.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use gantry_api::v1::{
    CreateGatewayRequest, Gateway, GatewaySpec, GetGatewayRequest, ObjectMeta, Phase,
};
use gantry_client::ClientConfig;
use gantry_kube_fake::{KubeFake, Options};
use gantry_reconciler::controller::{Controller, Settings};
use gantry_reconciler::leader::{self, ElectionSettings, Fence};
use gantry_reconciler::metrics::Metrics;
use gantry_reconciler::render::Rendered;
use gantry_reconciler::status::Observation;
use gantry_reconciler::store::GrpcStore;
use gantry_reconciler::targets::kube::KubeTarget;
use gantry_reconciler::targets::{Owner, Target, TargetError};
use gantry_testkit::eventually;
use gantry_testkit::{temp_dir, StoreProcess};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

const PATIENCE: Duration = Duration::from_secs(60);

/// The real kube target, counting the applies this replica makes.
#[derive(Debug)]
struct Counted {
    inner: KubeTarget,
    applies: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Target for Counted {
    async fn apply(&self, gateway: &Owner, rendered: &Rendered) -> Result<(), TargetError> {
        self.applies.fetch_add(1, Ordering::SeqCst);
        self.inner.apply(gateway, rendered).await
    }
    async fn observe(
        &self,
        gateway: &Owner,
        rendered: &Rendered,
    ) -> Result<Observation, TargetError> {
        self.inner.observe(gateway, rendered).await
    }
    async fn delete(&self, gateway: &Owner) -> Result<bool, TargetError> {
        self.inner.delete(gateway).await
    }
    fn may_write(&self) -> bool {
        self.inner.may_write()
    }
    fn watch_owned(&self) -> Option<BoxStream<'static, String>> {
        self.inner.watch_owned()
    }
    fn name(&self) -> &'static str {
        "kube"
    }
}

struct Replica {
    applies: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn start_replica(identity: &str, store: &StoreProcess, kube_client: &kube::Client) -> Replica {
    let applies = Arc::new(AtomicUsize::new(0));
    let fence = Fence::elected();
    let target = Arc::new(Counted {
        inner: KubeTarget::new(kube_client.clone(), "default").with_fence(fence.clone()),
        applies: applies.clone(),
    });
    let client =
        ClientConfig { endpoint: store.endpoint(), ..Default::default() }.connect_lazy().unwrap();
    let settings = Settings { poll_interval: Duration::from_millis(100), ..Settings::default() };
    let controller = Controller::new(
        Arc::new(GrpcStore::new(client)),
        target,
        settings,
        Arc::new(Metrics::default()),
    );
    let (leading_tx, leading) = tokio::sync::watch::channel(false);
    let election = ElectionSettings {
        lease_name: "gateway-reconciler".into(),
        namespace: "default".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(600),
        retry_period: Duration::from_millis(100),
        fence,
    };
    let api: Api<Lease> = Api::namespaced(kube_client.clone(), "default");
    let tasks = vec![
        tokio::spawn(leader::run(api, election, leading_tx, gantry_runtime::Shutdown::new())),
        tokio::spawn(controller.run_while_leading(leading, std::future::pending())),
    ];
    Replica { applies, tasks }
}

async fn wait_running(client: &gantry_client::GatewayClient, name: &str) {
    eventually(PATIENCE, &format!("{name} converged"), || async {
        let request = GetGatewayRequest { name: name.into() };
        let g = client.clone().get_gateway(request).await.unwrap().into_inner();
        let s = g.status.unwrap_or_default();
        s.phase() == Phase::Running && s.observed_generation == g.metadata.unwrap().generation
    })
    .await;
}

async fn holder(kube_client: &kube::Client) -> String {
    let api: Api<Lease> = Api::namespaced(kube_client.clone(), "default");
    api.get_opt("gateway-reconciler")
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles_and_a_follower_takes_over() {
    let dir = temp_dir("reconciler-ha");
    let store = StoreProcess::start(&format!("sqlite://{}", dir.join("gantry.db").display()), &dir);
    let kube = KubeFake::start_with(Options {
        rollout_delay: Duration::from_millis(10),
        ..Options::default()
    })
    .await
    .unwrap();
    let kube_client =
        kube::Client::try_from(kube::Config::new(kube.url().parse().unwrap())).unwrap();
    let a = start_replica("replica-a", &store, &kube_client);
    eventually(PATIENCE, "replica-a never led", || async {
        holder(&kube_client).await == "replica-a"
    })
    .await;
    let b = start_replica("replica-b", &store, &kube_client);

    let client =
        ClientConfig { endpoint: store.endpoint(), ..Default::default() }.connect_lazy().unwrap();
    let create = |name: &str| {
        let g = Gateway {
            metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
            spec: Some(GatewaySpec { image: "ghcr.io/acme/gw:1".into(), ..Default::default() }),
            status: None,
        };
        let mut c = client.clone();
        async move {
            c.create_gateway(CreateGatewayRequest { gateway: Some(g), validate_only: false })
                .await
                .unwrap()
        }
    };
    for i in 0..5 {
        create(&format!("gw-{i}")).await;
    }
    for i in 0..5 {
        wait_running(&client, &format!("gw-{i}")).await;
    }
    assert!(a.applies.load(Ordering::SeqCst) >= 5);
    assert_eq!(b.applies.load(Ordering::SeqCst), 0, "the follower wrote nothing");

    // The leader dies without releasing its lease.
    let killed = tokio::time::Instant::now();
    for task in a.tasks {
        task.abort();
    }
    create("after-failover").await;
    wait_running(&client, "after-failover").await;
    assert_eq!(holder(&kube_client).await, "replica-b");
    assert!(b.applies.load(Ordering::SeqCst) >= 1, "the new leader applied");
    eprintln!("failover converged {:?} after the leader died (lease 1 s)", killed.elapsed());
    for task in b.tasks {
        task.abort();
    }
    drop(store);
    kube.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

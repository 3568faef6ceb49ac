//! gateway-reconciler: converges every Gateway in gateway-store onto
//! Kubernetes (or a directory) and writes status back.
//!
//! ```text
//! gateway-store ──watch──► controller (cache, queue, workers) ──► target
//!        ▲                         │                              │ kube: SSA + prune
//!        └── UpdateGateway(status, observed_generation) ◄─────────┘ directory: files
//! ```
//!
//! [`run`] is what the binary calls; [`controller::Controller`] is the
//! loop, usable directly in tests with any [`targets::Target`].

#![forbid(unsafe_code)]

pub mod config;
pub mod controller;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod queue;
pub mod render;
pub mod status;
pub mod store;
pub mod targets;

use std::future::Future;
use std::sync::Arc;

use gantry_client::ClientConfig;
use gantry_core::recovery::RecoveryPolicy;
use gantry_core::retry::Backoff;

use crate::config::{Config, TargetKind};
use crate::controller::{Controller, Settings};
use crate::metrics::Metrics;
use crate::render::RenderSettings;
use crate::targets::directory::DirectoryTarget;
use crate::targets::kube::{KubeSettings, KubeTarget};
use crate::targets::Target;

/// Why the reconciler could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot read {what} {path}: {source}")]
    ReadFile { what: &'static str, path: String, source: std::io::Error },
    #[error(transparent)]
    Client(#[from] gantry_client::ClientError),
    #[error(
        "cannot load the Kubernetes configuration: {0}; pass --kubeconfig or run in a cluster"
    )]
    Kubeconfig(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("invalid flags: {0}")]
    Flags(String),
}

fn read(what: &'static str, path: &std::path::Path) -> Result<Vec<u8>, RunError> {
    std::fs::read(path).map_err(|source| RunError::ReadFile {
        what,
        path: path.display().to_string(),
        source,
    })
}

/// The control-loop settings a configuration asks for.
pub fn settings(config: &Config) -> Settings {
    Settings {
        render: RenderSettings {
            namespace: config.manifests.namespace.clone(),
            default_supervisor_image: config.render.supervisor_image.clone(),
            progress_deadline: config.render.progress_deadline,
            name_prefix: config.render.name_prefix.clone(),
            ingress_class: config.render.ingress_class.clone(),
            gateway_resources: config.render.gateway_resources.clone(),
            supervisor_resources: config.render.supervisor_resources.clone(),
        },
        policy: RecoveryPolicy {
            budget: config.control.retry_budget,
            backoff: Backoff { initial: config.control.retry_backoff, ..Backoff::default() },
            sync_period: config.control.sync_period,
            failed_window_floor: config.control.failed_retry_floor,
        },
        concurrency: config.control.concurrency,
        sync_period: config.control.sync_period,
        poll_interval: config.control.poll_interval,
        route_deadline: config.render.route_deadline,
        apply_timeout: config.control.apply_timeout,
        rollback_on_failure: config.control.rollback_on_failure,
    }
}

async fn kube_client(config: &Config, identity: &str) -> Result<kube::Client, RunError> {
    let mut kube_config = match &config.manifests.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| RunError::Kubeconfig(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| RunError::Kubeconfig(e.to_string()))?
        }
        None => kube::Config::infer().await.map_err(|e| RunError::Kubeconfig(e.to_string()))?,
    };
    // The API server's audit log then tells replicas apart.
    let agent = format!("gateway-reconciler/{} ({identity})", env!("CARGO_PKG_VERSION"));
    if let Ok(agent) = agent.parse() {
        kube_config.headers.push((axum::http::header::USER_AGENT, agent));
    }
    kube::Client::try_from(kube_config).map_err(|e| RunError::Kubeconfig(e.to_string()))
}

/// Runs the reconciler until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    config.validate().map_err(RunError::Flags)?;
    if let Some(path) = &config.gateway_store.token_file {
        // Checked once at start so a wrong path fails fast; afterwards the
        // client reads the file again whenever it changes.
        read("token file", path)?;
    }
    let ca_pem =
        config.gateway_store.store_ca.as_deref().map(|p| read("store CA", p)).transpose()?;
    let client = ClientConfig {
        endpoint: config.gateway_store.store.clone(),
        token_file: config.gateway_store.token_file.clone(),
        ca_pem,
        ..Default::default()
    }
    .connect_lazy()?;
    let store = Arc::new(crate::store::GrpcStore::new(client));
    let identity = config.leader.identity.clone().unwrap_or_else(default_identity);
    let fence = if config.leader.leader_elect {
        leader::Fence::elected()
    } else {
        leader::Fence::default()
    };
    let kube = if config.manifests.target == TargetKind::Kube || config.leader.leader_elect {
        Some(kube_client(&config, &identity).await?)
    } else {
        None
    };
    let target: Arc<dyn Target> = match (&config.manifests.target, &kube) {
        (TargetKind::Kube, Some(client)) => {
            let settings = KubeSettings {
                relist_period: config.control.sync_period,
                recreate_on_immutable: config.manifests.recreate_on_immutable,
                call_timeout: config.control.call_timeout,
            };
            let target = KubeTarget::with_settings(
                client.clone(),
                config.manifests.namespace.clone(),
                settings,
            );
            Arc::new(target.with_fence(fence.clone()))
        }
        _ => Arc::new(DirectoryTarget::new(config.manifests.directory.clone())),
    };
    let controller =
        Controller::new(store, target, settings(&config), Arc::new(Metrics::default()));
    let listener = tokio::net::TcpListener::bind(config.http_listen)
        .await
        .map_err(|source| RunError::Bind { addr: config.http_listen.to_string(), source })?;
    let shutdown = gantry_runtime::Shutdown::on(shutdown);
    let http = gantry_runtime::admin::serve(
        listener,
        gantry_runtime::admin::router(controller.state()),
        config.admin.limits(),
        shutdown.wait(),
    );
    tracing::info!(store = %config.gateway_store.store, target = ?config.manifests.target, http = %config.http_listen, "gateway-reconciler running");
    let (leading_tx, leading) = tokio::sync::watch::channel(!config.leader.leader_elect);
    let election = match (&kube, config.leader.leader_elect) {
        (Some(client), true) => {
            let lease_namespace = config
                .leader
                .lease_namespace
                .clone()
                .unwrap_or_else(|| config.manifests.namespace.clone());
            let settings = leader::ElectionSettings {
                lease_name: config.leader.lease_name.clone(),
                namespace: lease_namespace.clone(),
                identity,
                lease_duration: config.leader.lease_duration,
                renew_deadline: config.renew_deadline(),
                retry_period: config.retry_period(),
                fence,
            };
            let api = kube::Api::namespaced(client.clone(), &lease_namespace);
            Some(tokio::spawn(leader::run(api, settings, leading_tx, shutdown.clone())))
        }
        _ => None,
    };
    tokio::join!(controller.run_while_leading(leading, shutdown.wait()), http);
    if let Some(election) = election {
        // Releases the lease so a successor need not wait for it to expire.
        let _ = election.await;
    }
    tracing::info!("gateway-reconciler stopped");
    Ok(())
}

/// `<host name>-<pid>`: unique per replica in a cluster and on one machine.
fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .unwrap_or_else(|| "gateway-reconciler".into());
    format!("{host}-{}", std::process::id())
}

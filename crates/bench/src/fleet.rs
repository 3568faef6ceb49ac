//! What the scenarios share: gateways to create and update, percentiles.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_api::v1::{
    CreateGatewayRequest, Gateway, GatewaySpec, ObjectMeta, UpdateGatewayRequest,
};
use gantry_client::GatewayClient;
use serde_json::{json, Value};

use crate::procs::Store;

pub(crate) fn gateway(name: &str, image: &str, config: &[(&str, String)]) -> Gateway {
    Gateway {
        metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
        spec: Some(GatewaySpec {
            image: image.into(),
            config: config.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            ..Default::default()
        }),
        status: None,
    }
}

pub(crate) async fn update_spec(
    client: &mut GatewayClient,
    g: Gateway,
) -> Result<Gateway, tonic::Status> {
    let mask = Some(prost_types::FieldMask { paths: vec!["spec".into()] });
    client
        .update_gateway(UpdateGatewayRequest {
            gateway: Some(g),
            update_mask: mask,
            validate_only: false,
        })
        .await
        .map(|r| r.into_inner())
}

/// p50/p90/p99/max in microseconds.
pub(crate) fn percentiles(mut micros: Vec<u64>) -> Value {
    if micros.is_empty() {
        return json!(null);
    }
    micros.sort_unstable();
    let at = |q: f64| micros[((micros.len() as f64 - 1.0) * q).round() as usize];
    json!({"p50_us": at(0.5), "p90_us": at(0.9), "p99_us": at(0.99), "max_us": micros[micros.len() - 1], "samples": micros.len()})
}

/// Creates `count` gateways named `{prefix}-{i:06}` from 64 concurrent
/// clients, labelled `team=t{i % 10}`.
pub(crate) async fn create_gateways(
    store: &Store,
    prefix: &str,
    count: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (mut client, next, prefix) = (store.client()?, next.clone(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= count {
                    return Ok::<(), tonic::Status>(());
                }
                let mut g = gateway(&format!("{prefix}-{i:06}"), "ghcr.io/acme/gateway:1.0", &[]);
                g.metadata.as_mut().map(|m| m.labels.insert("team".into(), format!("t{}", i % 10)));
                client
                    .create_gateway(CreateGatewayRequest { gateway: Some(g), validate_only: false })
                    .await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}

//! The reconciler's scenarios: converge (a fixed update rate, bursts of
//! creates), scale (a large fleet) and idle.

use std::time::{Duration, Instant};

use gantry_api::v1::{CreateGatewayRequest, ListGatewaysRequest};
use gantry_client::GatewayClient;
use serde_json::{json, Value};

use crate::args::Args;
use crate::fleet::{create_gateways, gateway, percentiles, update_spec};
use crate::pair::{cluster_name, wait_reconciles, Pair};
use crate::procs::Usage;
use crate::tracker::Tracker;

/// First the update → observed latency at `rate` updates/s over 10
/// gateways, then each burst: that many gateways created at once, timed
/// until all are RUNNING.
/// First the update → observed latency at `rate` updates/s over 10
/// gateways, then each burst: that many gateways created at once, timed
/// until all are RUNNING.
pub(crate) async fn converge(
    args: &Args,
    bursts: &[usize],
    rate: u32,
    rate_duration: Duration,
) -> anyhow::Result<Vec<Value>> {
    let mut pair = Pair::start(args).await?;
    pair.start_reconciler(Duration::from_secs(300)).await?;
    let tracker = Tracker::start(pair.store.client()?);
    // Clients share a few connections, as real ones do (the store bounds
    // connections; one per call would also time connection setup).
    let clients =
        (0..16).map(|_| pair.store.client()).collect::<Result<Vec<GatewayClient>, _>>()?;
    let mut results =
        vec![at_rate(args, &mut pair, &tracker, &clients, rate, rate_duration).await?];
    results.extend(in_bursts(args, &mut pair, &tracker, &clients, bursts).await?);
    drop(tracker);
    pair.stop().await;
    Ok(results)
}

/// Update → observed at `rate` updates/s over 10 gateways.
async fn at_rate(
    args: &Args,
    pair: &mut Pair,
    tracker: &Tracker,
    clients: &[GatewayClient],
    rate: u32,
    rate_duration: Duration,
) -> anyhow::Result<Value> {
    eprintln!("converge: {rate} updates/s for {rate_duration:?} over 10 gateways");
    create_gateways(&pair.store, "steady", 10).await?;
    anyhow::ensure!(
        tracker.wait_converged(10, Duration::from_secs(60), "steady").await,
        "10 gateways did not converge"
    );
    let (store_before, reconciler_before) = (pair.store.usage(), pair.reconciler()?.usage());
    let stages_before = pair.reconciler()?.stages().await?;
    pair.take_kube_requests();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    let deadline = Instant::now() + rate_duration;
    let mut updates = Vec::new();
    let mut i = 0usize;
    while Instant::now() < deadline {
        ticks.tick().await;
        i += 1;
        let (mut client, tracker) = (clients[i % clients.len()].clone(), tracker.clone());
        updates.push(tokio::spawn(async move {
            let name = format!("steady-{:06}", i % 10);
            let sent = Instant::now();
            let g = gateway(&name, &format!("ghcr.io/acme/gateway:1.{i}"), &[]);
            let updated = update_spec(&mut client, g).await?;
            tracker.expect(&name, updated.metadata.map_or(0, |m| m.generation), sent);
            Ok::<(), tonic::Status>(())
        }));
    }
    for u in updates {
        u.await??;
    }
    let settle = Instant::now();
    while tracker.pending() > 0 && settle.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (kube_requests, kube_writes) = pair.take_kube_requests();
    // Mean milliseconds per pass in each stage over the run.
    let stages: serde_json::Map<String, Value> = pair
        .reconciler()?
        .stages()
        .await?
        .into_iter()
        .map(|(stage, (sum, count))| {
            let (sum0, count0) = stages_before.get(&stage).copied().unwrap_or_default();
            let mean_ms =
                if count > count0 { (sum - sum0) / (count - count0) * 1000.0 } else { 0.0 };
            (stage, json!((mean_ms * 100.0).round() / 100.0))
        })
        .collect();
    Ok(json!({
        "scenario": "converge", "mode": "fixed-rate", "cluster": cluster_name(args), "stage_mean_ms": stages, "backend": args.backend.name(),
        "updates_per_s": rate, "duration_s": rate_duration.as_secs_f64(), "updates": i,
        "not_observed_within_10s": tracker.pending(),
        "update_to_observed": percentiles(tracker.take_observed()),
        "kube_requests_per_update": (kube_requests as f64 / i.max(1) as f64 * 10.0).round() / 10.0,
        "kube_writes_per_update": (kube_writes as f64 / i.max(1) as f64 * 10.0).round() / 10.0,
        "store": pair.store.usage().since(store_before),
        "reconciler": pair.reconciler()?.usage().since(reconciler_before),
    }))
}

/// Each burst: that many gateways created at once, timed until all are
/// RUNNING.
async fn in_bursts(
    args: &Args,
    pair: &mut Pair,
    tracker: &Tracker,
    clients: &[GatewayClient],
    bursts: &[usize],
) -> anyhow::Result<Vec<Value>> {
    let mut results = Vec::new();
    let mut existing = 10;
    for (b, &gateways) in bursts.iter().enumerate() {
        eprintln!("converge: {gateways} gateways created at once ({existing} already there)");
        let (store_before, reconciler_before) = (pair.store.usage(), pair.reconciler()?.usage());
        let started = Instant::now();
        let mut creates = Vec::new();
        for i in 0..gateways {
            let mut client = clients[i % clients.len()].clone();
            creates.push(tokio::spawn(async move {
                client
                    .create_gateway(CreateGatewayRequest {
                        gateway: Some(gateway(&format!("burst{b}-{i:06}"), "gw:1", &[])),
                        validate_only: false,
                    })
                    .await
            }));
        }
        for c in creates {
            c.await??;
        }
        let created = started.elapsed();
        existing += gateways;
        anyhow::ensure!(
            tracker.wait_converged(existing, Duration::from_secs(900), "burst").await,
            "not all {gateways} gateways RUNNING after 15 minutes"
        );
        let all_running = started.elapsed();
        let (kube_requests, kube_writes) = pair.take_kube_requests();
        results.push(json!({
            "scenario": "converge", "mode": "burst", "cluster": cluster_name(args), "backend": args.backend.name(), "gateways": gateways,
            "created_s": created.as_secs_f64(), "all_running_s": all_running.as_secs_f64(),
            "kube_requests_per_gateway": (kube_requests as f64 / gateways as f64 * 10.0).round() / 10.0,
            "kube_writes_per_gateway": (kube_writes as f64 / gateways as f64 * 10.0).round() / 10.0,
            "store": pair.store.usage().since(store_before),
            "reconciler": pair.reconciler()?.usage().since(reconciler_before),
        }));
    }
    Ok(results)
}

pub(crate) async fn scale(
    args: &Args,
    gateways: usize,
    sync_period: Duration,
) -> anyhow::Result<Value> {
    let mut pair = Pair::start(args).await?;
    eprintln!("scale: {gateways} gateways in the store on {}", args.backend.name());
    let rss_empty = pair.store.usage().rss_kib;
    let created = create_gateways(&pair.store, "gw", gateways).await?;
    let rss_full = pair.store.usage().rss_kib;
    let list = |selector: &'static str| {
        let mut client = pair.store.client();
        async move {
            let client = client.as_mut().map_err(|e| tonic::Status::internal(e.to_string()))?;
            let started = Instant::now();
            let (mut count, mut token, mut pages) = (0usize, String::new(), 0usize);
            loop {
                let page = client
                    .list_gateways(ListGatewaysRequest {
                        page_size: 1000,
                        page_token: token,
                        label_selector: selector.into(),
                    })
                    .await?
                    .into_inner();
                count += page.gateways.len();
                pages += 1;
                if page.next_page_token.is_empty() {
                    return Ok::<_, tonic::Status>((count, pages, started.elapsed()));
                }
                token = page.next_page_token;
            }
        }
    };
    let (listed, pages, all_time) = list("").await?;
    let (selected, _, selected_time) = list("team=t3").await?;
    anyhow::ensure!(listed == gateways, "listed {listed} of {gateways}");

    eprintln!("scale: the reconciler converges {gateways} gateways");
    let tracker = Tracker::start(pair.store.client()?);
    let started = Instant::now();
    pair.start_reconciler(sync_period).await?;
    anyhow::ensure!(
        tracker.wait_converged(gateways, Duration::from_secs(3600), "first converge").await,
        "not all gateways converged within an hour"
    );
    let first_converge = started.elapsed();
    drop(tracker);
    if let Some(r) = pair.reconciler.take() {
        r.stop();
    }
    pair.take_kube_requests();

    eprintln!("scale: reconciler cold start over {gateways} converged gateways");
    let (started, store_before) = (Instant::now(), pair.store.usage());
    pair.start_reconciler(sync_period).await?;
    anyhow::ensure!(
        wait_reconciles(&pair, gateways as u64, Duration::from_secs(600)).await?,
        "the restarted reconciler did not check every gateway within 10 minutes"
    );
    let cold_start = started.elapsed();
    let after_start = pair.reconciler()?.usage();
    let store_cold_start = pair.store.usage().cpu_s - store_before.cpu_s;
    let (cold_requests, cold_writes) = pair.take_kube_requests();

    eprintln!("scale: waiting for a periodic resync (sync period {sync_period:?})");
    let resync_limit = sync_period * 2 + Duration::from_secs(600);
    anyhow::ensure!(
        wait_reconciles(&pair, 2 * gateways as u64, resync_limit).await?,
        "no full resync within {resync_limit:?}"
    );
    let after_resync = pair.reconciler()?.usage();
    let (resync_requests, resync_writes) = pair.take_kube_requests();
    let result = json!({
        "scenario": "scale", "backend": args.backend.name(), "gateways": gateways,
        "create_s": created.as_secs_f64(), "creates_per_s": (gateways as f64 / created.as_secs_f64()).round(),
        "store_rss_empty_kib": rss_empty, "store_rss_kib": rss_full,
        "list_all_s": all_time.as_secs_f64(), "list_pages": pages,
        "list_selector_s": selected_time.as_secs_f64(), "list_selector_matches": selected,
        "reconciler_first_converge_s": first_converge.as_secs_f64(),
        "reconciler_cold_start_s": cold_start.as_secs_f64(),
        // CPU seconds during the cold start: whether it waits or works.
        "reconciler_cold_start_cpu_s": after_start.cpu_s, "store_cold_start_cpu_s": store_cold_start,
        "reconciler_cold_start_kube_requests": cold_requests, "reconciler_cold_start_kube_writes": cold_writes,
        "resync_kube_requests": resync_requests, "resync_kube_writes": resync_writes,
        "reconciler_rss_kib": after_start.rss_kib.max(after_resync.rss_kib),
        // The restarted reconciler's peak: its cold start and the resync.
        "reconciler_peak_rss_kib": after_resync.peak_rss_kib,
        "store_rss_with_reconciler_kib": pair.store.usage().rss_kib,
        // kube-fake runs in this process: what it holds for the fleet.
        "kube_fake_process_rss_kib": Usage::of(std::process::id()).rss_kib,
    });
    pair.stop().await;
    Ok(result)
}

pub(crate) async fn idle(
    args: &Args,
    gateways: usize,
    duration: Duration,
) -> anyhow::Result<Value> {
    let mut pair = Pair::start(args).await?;
    eprintln!("idle: {gateways} converged gateways for {duration:?} on {}", args.backend.name());
    create_gateways(&pair.store, "idle", gateways).await?;
    let tracker = Tracker::start(pair.store.client()?);
    // The default sync period: an idle resync happens in a 5-minute window.
    pair.start_reconciler(Duration::from_secs(300)).await?;
    anyhow::ensure!(
        tracker.wait_converged(gateways, Duration::from_secs(1800), "idle setup").await,
        "gateways did not converge"
    );
    drop(tracker);
    // Let the last status writes and watch events settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    pair.take_kube_requests();
    let (store_before, reconciler_before) = (pair.store.usage(), pair.reconciler()?.usage());
    let (store_requests_before, passes_before) =
        (pair.store.requests().await?, pair.reconciler()?.reconciles().await?);
    tokio::time::sleep(duration).await;
    let (store_after, reconciler_after) = (pair.store.usage(), pair.reconciler()?.usage());
    let (store_requests_after, passes_after) =
        (pair.store.requests().await?, pair.reconciler()?.reconciles().await?);
    let (kube_requests, kube_writes) = pair.take_kube_requests();
    let seconds = duration.as_secs_f64();
    let core_percent = |after: Usage, before: Usage| {
        ((after.cpu_s - before.cpu_s) / seconds * 1000.0).round() / 10.0
    };
    let result = json!({
        "scenario": "idle", "backend": args.backend.name(), "gateways": gateways, "duration_s": seconds,
        "kube_requests": kube_requests, "kube_writes": kube_writes,
        "store_grpc_requests": store_requests_after - store_requests_before,
        "reconcile_passes": passes_after - passes_before,
        "store_core_percent": core_percent(store_after, store_before),
        "reconciler_core_percent": core_percent(reconciler_after, reconciler_before),
        "store": store_after.since(store_before), "reconciler": reconciler_after.since(reconciler_before),
    });
    pair.stop().await;
    Ok(result)
}

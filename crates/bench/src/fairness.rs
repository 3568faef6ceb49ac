//! `fairness`: viewers flood the store with full-page lists from 64
//! connections, ignoring the retry delay (one identity, then the same flood
//! spread over 8), while an editor creates gateways and the reconciler
//! writes their status. Measured: the p99 of those creates and status
//! writes from the store's own histograms (interpolated inside buckets that
//! double, as `histogram_quantile` does) and, exact,
//! as the clients saw them, quiet and flooded (the target: flooded within
//! 2× of quiet), the lists served and refused, and the calls held to their
//! retry delay. Seats as `store_fairness.rs` sets them:
//! 4 viewer seats (a 500-object page takes them all), queues of 8, 1 s of
//! queue wait.

use std::time::Duration;

use gantry_testkit::load::{self, Flood};
use serde_json::{json, Value};

use crate::args::Args;
use crate::procs::Store;

const ADMIN: &str = "admin-token-000000000001";
const EDITOR: &str = "editor-token-00000000001";
const RECONCILER: &str = "reconciler-token-000001";
const VIEWERS: usize = 8;
const EARLY: &str = "gantry_store_fairness_early_retries_total{level=\"viewers\"} ";

fn viewer(i: usize) -> String {
    format!("viewer-token-{i:011}")
}

/// The editor's and the reconciler's work for at least `duration`: the
/// p99 of the creates and of the status writes, in seconds, from the
/// store's histograms (interpolated) and as the clients saw them
/// (exact): `[store create, store status, client create, client status]`.
async fn work_for(store: &Store, prefix: &str, duration: Duration) -> anyhow::Result<[f64; 4]> {
    let before = store.metrics().await?;
    let done = load::work_for(&store.endpoint, (EDITOR, RECONCILER), prefix, duration).await;
    let after = store.metrics().await?;
    let p99 = |method| load::p99(&load::buckets(&before, method), &load::buckets(&after, method));
    let exact = |latencies: &[Duration]| load::quantile(latencies, 0.99).as_secs_f64();
    Ok([
        p99("CreateGateway"),
        p99("UpdateGateway"),
        exact(&done.creates),
        exact(&done.status_writes),
    ])
}

pub async fn fairness(args: &Args, duration: Duration) -> anyhow::Result<Vec<Value>> {
    let mut tokens = format!(
        "{ADMIN},root,admin\n{EDITOR},eddie,editor\n{RECONCILER},gateway-reconciler,reconciler\n"
    );
    for i in 0..VIEWERS {
        tokens.push_str(&format!("{},viewer-{i},viewer\n", viewer(i)));
    }
    let flags =
        ["--fair-viewer-concurrency", "4", "--fair-queue-length", "8", "--fair-queue-wait", "1s"];
    let store = Store::start_with(args, 4096, Some(&tokens), &flags).await?;
    eprintln!("fairness: 100 gateways to list, then the quiet work");
    load::work(&store.endpoint, (EDITOR, RECONCILER), "base", 100).await;
    let quiet = work_for(&store, "quiet", duration).await?;
    let mut rows = Vec::new();
    for identities in [1, VIEWERS] {
        eprintln!("fairness: {identities} flooding identities");
        let tokens: Vec<String> = (0..identities).map(viewer).collect();
        let early = load::metric(&store.metrics().await?, EARLY);
        let cpu = store.usage();
        let flood = Flood::start(&store.endpoint, &tokens, 500).await;
        let flooded = work_for(&store, &format!("flood{identities}"), duration).await?;
        let store_usage = store.usage().since(cpu);
        let (served, refused) = flood.stop().await;
        let held = load::metric(&store.metrics().await?, EARLY) - early;
        let ms = |s: f64| (s * 1e5).round() / 100.0;
        rows.push(json!({
            "scenario": "fairness",
            "backend": args.backend.name(),
            "flooding_identities": identities,
            "flood": format!("{}×{} callers, 500-object lists", load::FLOOD_CONNECTIONS, load::FLOOD_CALLERS),
            "lists_served": served,
            "refused": refused,
            "held_to_retry_delay": held,
            "create_p99_ms": {"quiet": ms(quiet[0]), "flooded": ms(flooded[0]), "ratio": ratio(flooded[0], quiet[0])},
            "status_p99_ms": {"quiet": ms(quiet[1]), "flooded": ms(flooded[1]), "ratio": ratio(flooded[1], quiet[1])},
            "client_create_p99_ms": {"quiet": ms(quiet[2]), "flooded": ms(flooded[2]), "ratio": ratio(flooded[2], quiet[2])},
            "client_status_p99_ms": {"quiet": ms(quiet[3]), "flooded": ms(flooded[3]), "ratio": ratio(flooded[3], quiet[3])},
            "store": store_usage,
        }));
    }
    store.stop().await;
    Ok(rows)
}

fn ratio(flooded: f64, quiet: f64) -> f64 {
    ((flooded / quiet) * 100.0).round() / 100.0
}

//! Fair queuing per identity on a real store process: a viewer identity
//! flooding from 64 connections (and the same flood spread over 8 viewer
//! identities) is refused RESOURCE_EXHAUSTED with a retry delay once its
//! queue is full, and its calls back before the delay are held until it
//! ends, while an editor and the reconciler keep working: none of their
//! calls is refused or waits for a seat, and every write they were told
//! succeeded is there. Their latency under the flood, against the same
//! work unloaded in the phases between the floods (p99 from the store's
//! own histograms), is printed, not
//! asserted: the machine may be loaded (docs/reliability.md records it;
//! `gantry-bench fairness` measures it on a release build).

#![allow(clippy::unwrap_used)]

use std::io::Write as _;

use gantry_api::v1::ListGatewaysRequest;
use gantry_client::GatewayClient;
use gantry_testkit::load::{self, Flood};
use gantry_testkit::{http_get, temp_dir, StoreProcess};

const EDITOR: &str = "editor-token-00000000001";
const RECONCILER: &str = "reconciler-token-000001";

fn viewer(i: usize) -> String {
    format!("viewer-token-{i:011}")
}

fn client(store: &StoreProcess, token: &str) -> GatewayClient {
    store.client_with_token(token)
}

/// A metric's value on the store's /metrics (0 when absent).
fn metric(store: &StoreProcess, line_start: &str) -> f64 {
    load::metric(&http_get(store.http, "/metrics").unwrap_or_default(), line_start)
}

/// The cumulative buckets of `method`'s latency histogram.
fn buckets(store: &StoreProcess, method: &str) -> Vec<(f64, f64)> {
    load::buckets(&http_get(store.http, "/metrics").unwrap_or_default(), method)
}

async fn work(store: &StoreProcess, prefix: &str, n: usize) -> load::Done {
    load::work(&store.endpoint(), (EDITOR, RECONCILER), prefix, n).await
}

/// The editor's and the reconciler's calls of one kind of phase (quiet
/// or flooded), over every round: the store's histograms and the calls as
/// their clients saw them.
#[derive(Default)]
struct Phases {
    creates: load::Tally,
    status_writes: load::Tally,
    done: load::Done,
    cpu: load::CpuTicks,
}

impl Phases {
    /// The editor's and the reconciler's work for [`PHASE`] (quiet or
    /// flooded alike, so that both p99s rank as many calls), added to
    /// these phases.
    async fn measure(&mut self, store: &StoreProcess, prefix: &str) {
        let (create, update) = ("CreateGateway", "UpdateGateway");
        let (c0, u0) = (buckets(store, create), buckets(store, update));
        let cpu = load::CpuTicks::now();
        let done = load::work_for(&store.endpoint(), (EDITOR, RECONCILER), prefix, PHASE).await;
        self.cpu = self.cpu.add(cpu, load::CpuTicks::now());
        let (c1, u1) = (buckets(store, create), buckets(store, update));
        self.creates.add(&c0, &c1);
        self.status_writes.add(&u0, &u1);
        self.done.extend(done);
    }

    /// The p99 (seconds) of creates and of status writes: by the store's
    /// histograms, and exact as the clients saw them.
    fn p99s(&self) -> ((f64, f64), (f64, f64)) {
        let exact = |l: &[std::time::Duration]| load::quantile(l, 0.99).as_secs_f64();
        (
            (self.creates.p99(), self.status_writes.p99()),
            (exact(&self.done.creates), exact(&self.done.status_writes)),
        )
    }
}

/// The viewers' answer bytes.
const VIEWER_BYTES: &str = "gantry_store_fairness_answer_bytes_total{level=\"viewers\"} ";

/// Quiet and flooded phases alternate, [`ROUNDS`] of each per flood, so
/// that a one-off stall of the machine or the database (a checkpoint, a
/// vacuum, another process) and the tables' growth weigh on both alike.
const PHASE: std::time::Duration = std::time::Duration::from_secs(2);
const ROUNDS: usize = 6;

/// One test at a time: the two backends' tests (and making the PostgreSQL
/// test's database) would otherwise load each other's quiet and flooded
/// runs.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_viewer_is_refused_while_the_editor_and_the_reconciler_never_wait() {
    let dir = temp_dir("fairness");
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    let _alone = ONE_AT_A_TIME.lock().await;
    flood_beside_the_work(&database, &dir).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_viewer_is_refused_while_the_editor_and_the_reconciler_never_wait_on_postgres() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(db) = gantry_testkit::TestDatabase::postgres().await else { return };
    let dir = temp_dir("fairness-pg");
    flood_beside_the_work(&db.url, &dir).await;
    db.drop_database().await;
    let _ = std::fs::remove_dir_all(dir);
}

async fn flood_beside_the_work(database: &str, dir: &std::path::Path) {
    let mut tokens = format!("{EDITOR},eddie,editor\n{RECONCILER},gateway-reconciler,reconciler\n");
    for i in 0..8 {
        tokens.push_str(&format!("{},viewer-{i},viewer\n", viewer(i)));
    }
    let flags =
        ["--fair-viewer-concurrency", "4", "--fair-queue-length", "8", "--fair-queue-wait", "1s"];
    let store = StoreProcess::with_tokens(database, dir, &tokens, &flags);
    // Something to list: 100 gateways.
    let mut acked = work(&store, "base", 100).await.acked;

    for identities in [1, 8] {
        let waited_before =
            metric(&store, "gantry_store_fairness_wait_duration_seconds_count{level=\"editors\"} ");
        let rejected_before =
            metric(&store, "gantry_store_fairness_rejected_total{level=\"viewers\"} ");
        let early_before =
            metric(&store, "gantry_store_fairness_early_retries_total{level=\"viewers\"} ");
        let bytes_before = metric(&store, VIEWER_BYTES);
        let tokens: Vec<String> = (0..identities).map(viewer).collect();
        let (mut quiet, mut flooded) = (Phases::default(), Phases::default());
        let (mut served, mut refused) = (0, 0);
        let mut flooding = std::time::Duration::ZERO;
        for round in 0..ROUNDS {
            quiet.measure(&store, &format!("quiet{identities}-{round}")).await;
            let started = std::time::Instant::now();
            let flood = Flood::start(&store.endpoint(), &tokens, 500).await;
            // Each phase works for more than the retry delay, so that the
            // flood's callers come back (early) more than once.
            flooded.measure(&store, &format!("flood{identities}-{round}")).await;
            let (s, r) = flood.stop().await;
            flooding += started.elapsed();
            (served, refused) = (served + s, refused + r);
            // Every seat given back once the answers are written: the next
            // quiet phase is quiet.
            let free = "every viewer seat given back";
            gantry_testkit::eventually(std::time::Duration::from_secs(30), free, || async {
                metric(&store, "gantry_store_fairness_in_flight{level=\"viewers\"} ") == 0.0
            })
            .await;
        }
        // The flood ignores the retry delay: its calls back early were
        // held until the delay ended, not answered at once.
        let early = metric(&store, "gantry_store_fairness_early_retries_total{level=\"viewers\"} ");
        assert!(early > early_before, "no call back before its retry delay was held");
        let (quiet_p99, quiet_client) = quiet.p99s();
        let (loaded, loaded_client) = flooded.p99s();
        let calls = flooded.done.creates.len();
        let bytes = metric(&store, VIEWER_BYTES) - bytes_before;
        let rate = bytes / flooding.as_secs_f64() / 1_048_576.0;
        acked.extend(quiet.done.acked);
        acked.extend(flooded.done.acked);
        let figures = format!(
            "{}: flood of {identities} viewer identities on 64 connections, {ROUNDS} rounds of {PHASE:?} quiet then flooded: \
             {served} lists served ({rate:.1} MiB/s), {refused} refused, {} held to their retry delay; {calls} creates and status writes each \
             flooded; p99 quiet / flooded (ratio): \
             store's histograms: create {:.4}s / {:.4}s ({:.2}x), status write {:.4}s / {:.4}s ({:.2}x); \
             clients: create {:.4}s / {:.4}s ({:.2}x), status write {:.4}s / {:.4}s ({:.2}x); \
             CPU stolen by the hypervisor: quiet {:.1} %, flooded {:.1} %",
            database.split(':').next().unwrap_or_default(),
            early - early_before,
            quiet_p99.0, loaded.0, loaded.0 / quiet_p99.0, quiet_p99.1, loaded.1, loaded.1 / quiet_p99.1,
            quiet_client.0, loaded_client.0, loaded_client.0 / quiet_client.0,
            quiet_client.1, loaded_client.1, loaded_client.1 / quiet_client.1,
            quiet.cpu.steal_percent(), flooded.cpu.steal_percent(),
        );
        // Written to stderr directly, not through the test's captured
        // output: the figures are in the log of every run, passing or not.
        let _ = writeln!(std::io::stderr(), "{figures}");
        assert!(refused > 0, "the flood was never refused ({served} served)");
        let rejected = metric(&store, "gantry_store_fairness_rejected_total{level=\"viewers\"} ");
        assert!(rejected - rejected_before >= refused as f64, "refusals counted per level");
        // The editor's level has seats to spare: none of its calls waited.
        let waited =
            metric(&store, "gantry_store_fairness_wait_duration_seconds_count{level=\"editors\"} ");
        assert_eq!(waited, waited_before, "an editor's call queued behind the flood");
    }

    // Nothing acknowledged is lost.
    let mut listed = std::collections::BTreeSet::new();
    let mut page_token = String::new();
    loop {
        let request = ListGatewaysRequest { page_size: 500, page_token, ..Default::default() };
        let page = client(&store, EDITOR).list_gateways(request).await.unwrap().into_inner();
        listed.extend(page.gateways.into_iter().filter_map(|g| g.metadata.map(|m| m.name)));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let lost: Vec<&String> = acked.iter().filter(|n| !listed.contains(*n)).collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
    drop(store);
}

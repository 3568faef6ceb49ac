//! Load that the fairness test and `gantry-bench fairness` put on a store:
//! viewers flooding it with full-page lists, ignoring the retry delay,
//! beside an editor and the reconciler at work; and the store's own
//! latency histograms, read from its `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use gantry_api::v1::{
    CreateGatewayRequest, GatewayStatus, ListGatewaysRequest, Phase, UpdateGatewayRequest,
};
use gantry_client::{ClientConfig, GatewayClient};
use prost::Message as _;
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::gateway::gateway;

/// Connections of a flood, and callers on each.
pub const FLOOD_CONNECTIONS: usize = 64;
pub const FLOOD_CALLERS: usize = 4;

/// The flood's thread's nice value: the lowest CPU priority.
pub const FLOOD_NICE: i32 = 19;

/// Lists sent back to back on [`FLOOD_CONNECTIONS`] connections by
/// [`FLOOD_CALLERS`] callers each, ignoring the retry delay; each
/// connection's token taken in turn from the flood's tokens. The flood's
/// CPU goes to the store, as when it comes from other machines: pages are
/// received, not decoded, and the callers run on a thread of their own at
/// [`FLOOD_NICE`], so on a machine it shares with the store the flooding
/// client takes no CPU the store and the other clients want.
#[derive(Debug)]
pub struct Flood {
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    served: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Flood {
    /// Starts flooding the store at `endpoint` with lists of `page_size`,
    /// once every connection is made. A refusal other than
    /// RESOURCE_EXHAUSTED with a retry delay panics (seen when the flood
    /// stops).
    pub async fn start(endpoint: &str, tokens: &[String], page_size: i32) -> Flood {
        let (stop, refused, served) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let request = ListGatewaysRequest { page_size, ..Default::default() }.encode_to_vec();
        let (endpoint, tokens) = (endpoint.to_string(), tokens.to_vec());
        let (connected, ready) = tokio::sync::oneshot::channel();
        let counters = (stop.clone(), refused.clone(), served.clone());
        let thread = std::thread::Builder::new()
            .name("flood".into())
            .spawn(move || {
                rustix::process::setpriority_process(None, FLOOD_NICE)
                    .expect("the flood's thread's priority");
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the flood's runtime");
                runtime.block_on(async move {
                    let mut tasks = Vec::new();
                    for c in 0..FLOOD_CONNECTIONS {
                        let connection = crate::raw_grpc::connect(&endpoint).await;
                        let token = tokens[c % tokens.len()].clone();
                        for _ in 0..FLOOD_CALLERS {
                            tasks.push(tokio::spawn(flood_caller(
                                connection.clone(),
                                token.clone(),
                                request.clone(),
                                counters.clone(),
                            )));
                        }
                    }
                    let _ = connected.send(());
                    for task in tasks {
                        task.await.expect("a flood caller failed");
                    }
                });
            })
            .expect("the flood's thread");
        ready.await.expect("the flood could not connect");
        Flood { stop, refused, served, thread }
    }

    /// Stops the flood: (lists served, calls refused).
    pub async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .expect("joining the flood's thread")
            .expect("a flood caller failed");
        (self.served.load(Ordering::Relaxed), self.refused.load(Ordering::Relaxed))
    }
}

/// One flood caller: lists back to back until `stop`, counting lists
/// served and refused.
async fn flood_caller(
    connection: tonic::transport::Channel,
    token: String,
    request: Vec<u8>,
    (stop, refused, served): (Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicU64>),
) {
    while !stop.load(Ordering::Relaxed) {
        let list = crate::raw_grpc::call(
            connection.clone(),
            "ListGateways",
            request.clone(),
            Some(&token),
        );
        match list.await {
            Ok(_) => {
                served.fetch_add(1, Ordering::Relaxed);
            }
            Err(s) if s.code() == Code::ResourceExhausted => {
                let details = s.get_error_details();
                assert!(
                    details.retry_info().and_then(|r| r.retry_delay).is_some(),
                    "a refusal without a retry delay: {s:?}"
                );
                refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(s) => panic!("flood call failed with {:?}: {}", s.code(), s.message()),
        }
    }
}

/// What [`work`] did: the names acknowledged, and each create's and
/// status write's latency as its client saw it.
#[derive(Debug, Default)]
pub struct Done {
    pub acked: Vec<String>,
    pub creates: Vec<std::time::Duration>,
    pub status_writes: Vec<std::time::Duration>,
}

impl Done {
    /// Adds `other`'s names and latencies to these.
    pub fn extend(&mut self, other: Done) {
        self.acked.extend(other.acked);
        self.creates.extend(other.creates);
        self.status_writes.extend(other.status_writes);
    }
}

/// The `q` quantile (0..=1) of `latencies` (exact, by rank).
pub fn quantile(latencies: &[std::time::Duration], q: f64) -> std::time::Duration {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or_default()
}

/// The editor's and the reconciler's work: `n` gateways created, each
/// followed by a status write. A refusal panics.
pub async fn work(endpoint: &str, tokens: (&str, &str), prefix: &str, n: usize) -> Done {
    let (mut editor, mut reconciler) = clients(endpoint, tokens);
    work_on(&mut editor, &mut reconciler, prefix, n).await
}

/// The editor's and the reconciler's clients, each on a connection of its
/// own (made at its first call).
fn clients(endpoint: &str, (editor, reconciler): (&str, &str)) -> (GatewayClient, GatewayClient) {
    let client = |token: &str| {
        ClientConfig { endpoint: endpoint.into(), token: Some(token.into()), ..Default::default() }
            .connect_lazy()
            .expect("a client")
    };
    (client(editor), client(reconciler))
}

/// [`work`] through the given clients.
async fn work_on(
    editor: &mut GatewayClient,
    reconciler: &mut GatewayClient,
    prefix: &str,
    n: usize,
) -> Done {
    let mut done = Done::default();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let started = std::time::Instant::now();
        let created = editor
            .create_gateway(CreateGatewayRequest {
                gateway: Some(gateway(&name).build()),
                validate_only: false,
            })
            .await
            .unwrap_or_else(|s| panic!("the editor was refused: {s:?}"));
        done.creates.push(started.elapsed());
        done.acked.push(name);
        let mut g = created.into_inner();
        g.status = Some(GatewayStatus {
            phase: Phase::Written.into(),
            observed_generation: 1,
            ..Default::default()
        });
        let request = UpdateGatewayRequest {
            gateway: Some(g),
            update_mask: Some(prost_types::FieldMask { paths: vec!["status".into()] }),
            ..Default::default()
        };
        let started = std::time::Instant::now();
        reconciler
            .update_gateway(request)
            .await
            .unwrap_or_else(|s| panic!("the reconciler was refused: {s:?}"));
        done.status_writes.push(started.elapsed());
    }
    done
}

/// [`work`] in rounds of 25 gateways named `{prefix}-{round}-{i}`, for at
/// least `duration` and two rounds, through one editor and one reconciler
/// client: each keeps its connection, as a running reconciler does.
pub async fn work_for(
    endpoint: &str,
    tokens: (&str, &str),
    prefix: &str,
    duration: std::time::Duration,
) -> Done {
    let started = std::time::Instant::now();
    let (mut editor, mut reconciler) = clients(endpoint, tokens);
    let mut all = Done::default();
    let mut round = 0;
    while round < 2 || started.elapsed() < duration {
        let prefix = format!("{prefix}-{round}");
        all.extend(work_on(&mut editor, &mut reconciler, &prefix, 25).await);
        round += 1;
    }
    all
}

/// The cumulative buckets `(upper bound in seconds, count)` of `method`'s
/// latency histogram in the store's `/metrics` text.
pub fn buckets(metrics: &str, method: &str) -> Vec<(f64, f64)> {
    let prefix = "gantry_store_grpc_request_duration_seconds_bucket{";
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter(|l| l.contains(&format!("method=\"{method}\"")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let count = l.rsplit(' ').next()?.parse().ok()?;
            Some((le.parse().unwrap_or(f64::INFINITY), count))
        })
        .collect()
}

/// The p99 (seconds) of the calls between two readings of [`buckets`],
/// interpolated linearly inside its bucket as Prometheus'
/// `histogram_quantile` does.
pub fn p99(before: &[(f64, f64)], after: &[(f64, f64)]) -> f64 {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| (*le, n - before.iter().find(|(b, _)| b == le).map_or(0.0, |(_, m)| *m)))
        .collect();
    let total = delta.last().map_or(0.0, |(_, n)| *n);
    if total <= 0.0 {
        return f64::INFINITY;
    }
    let rank = total * 0.99;
    let Some(i) = delta.iter().position(|(_, n)| *n >= rank) else { return f64::INFINITY };
    let (upper, count) = delta[i];
    let (lower, below) = if i == 0 { (0.0, 0.0) } else { delta[i - 1] };
    if upper.is_infinite() {
        return lower;
    }
    if count <= below {
        return upper;
    }
    lower + (upper - lower) * (rank - below) / (count - below)
}

/// One histogram's calls summed over several intervals, each between two
/// readings of [`buckets`]: phases interleaved with others (quiet and
/// flooded in turn) measured as one.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Cumulative counts by upper bound, as [`buckets`] reads them.
    counts: Vec<(f64, f64)>,
}

impl Tally {
    /// Adds the calls between `before` and `after`.
    pub fn add(&mut self, before: &[(f64, f64)], after: &[(f64, f64)]) {
        for (le, n) in after {
            let delta = n - before.iter().find(|(b, _)| b == le).map_or(0.0, |(_, m)| *m);
            match self.counts.iter_mut().find(|(b, _)| b == le) {
                Some((_, sum)) => *sum += delta,
                None => self.counts.push((*le, delta)),
            }
        }
    }

    /// The p99 (seconds) of every call added, as [`p99`] answers it.
    pub fn p99(&self) -> f64 {
        p99(&[], &self.counts)
    }
}

/// A metric's value in `/metrics` text, by the start of its line (0 when
/// absent).
pub fn metric(metrics: &str, line_start: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line_start).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// The machine's CPU time and the part of it the hypervisor gave to other
/// guests ("steal"), in clock ticks, from `/proc/stat` (zero where there is
/// none): a phase whose time was stolen measured the neighbours, not the
/// store, and its figures say so.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct CpuTicks {
    pub total: u64,
    pub steal: u64,
}

impl CpuTicks {
    /// The counters now.
    pub fn now() -> CpuTicks {
        std::fs::read_to_string("/proc/stat").map(|s| CpuTicks::parse(&s)).unwrap_or_default()
    }

    /// The machine-wide `cpu` line of `/proc/stat` text: user, nice,
    /// system, idle, iowait, irq, softirq, steal (guest time is already in
    /// user and nice).
    fn parse(stat: &str) -> CpuTicks {
        let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
            return CpuTicks::default();
        };
        let fields: Vec<u64> =
            line.split_whitespace().skip(1).take(8).filter_map(|f| f.parse().ok()).collect();
        CpuTicks { total: fields.iter().sum(), steal: fields.get(7).copied().unwrap_or(0) }
    }

    /// These ticks plus the ticks from `before` to `after`.
    pub fn add(self, before: CpuTicks, after: CpuTicks) -> CpuTicks {
        CpuTicks {
            total: self.total + after.total.saturating_sub(before.total),
            steal: self.steal + after.steal.saturating_sub(before.steal),
        }
    }

    /// The share of the time stolen, in per cent.
    pub fn steal_percent(self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        100.0 * self.steal as f64 / self.total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::p99;

    #[test]
    fn p99_is_interpolated_inside_its_bucket() {
        let before = [(0.001, 0.0), (0.002, 0.0), (0.004, 0.0), (f64::INFINITY, 0.0)];
        // 100 calls: 50 up to 1 ms, 40 in (1, 2] ms, 10 in (2, 4] ms.
        let after = [(0.001, 50.0), (0.002, 90.0), (0.004, 100.0), (f64::INFINITY, 100.0)];
        // Rank 99 is the 9th of the 10 calls in (2, 4] ms.
        assert!((p99(&before, &after) - 0.0038).abs() < 1e-9, "{}", p99(&before, &after));
        // Only what happened between the readings counts.
        let later = [(0.001, 100.0), (0.002, 180.0), (0.004, 200.0), (f64::INFINITY, 200.0)];
        assert!((p99(&after, &later) - 0.0038).abs() < 1e-9);
        // Past the last finite bucket: its bound, as Prometheus answers.
        let slow = [(0.001, 0.0), (0.002, 0.0), (0.004, 0.0), (f64::INFINITY, 100.0)];
        assert_eq!(p99(&before, &slow), 0.004);
        // No calls: no p99.
        assert!(p99(&before, &before).is_infinite());
    }

    #[test]
    fn a_tally_of_intervals_ranks_their_calls_together() {
        use super::Tally;
        let zero = [(0.001, 0.0), (0.002, 0.0), (0.004, 0.0), (f64::INFINITY, 0.0)];
        // 100 calls up to 1 ms, then (after another interval not added)
        // 100 calls: 80 up to 1 ms, 20 in (2, 4] ms.
        let first = [(0.001, 100.0), (0.002, 100.0), (0.004, 100.0), (f64::INFINITY, 100.0)];
        let skipped = [(0.001, 500.0), (0.002, 900.0), (0.004, 900.0), (f64::INFINITY, 900.0)];
        let second = [(0.001, 580.0), (0.002, 980.0), (0.004, 1000.0), (f64::INFINITY, 1000.0)];
        let mut tally = Tally::default();
        assert!(tally.p99().is_infinite());
        tally.add(&zero, &first);
        assert!((tally.p99() - 0.00099).abs() < 1e-9, "{}", tally.p99());
        tally.add(&skipped, &second);
        // 200 calls: 180 up to 1 ms, 20 in (2, 4] ms; rank 198 is the 18th
        // of those 20, the skipped interval's 400 in (1, 2] ms not counted.
        assert!((tally.p99() - 0.0038).abs() < 1e-9, "{}", tally.p99());
    }

    #[test]
    fn steal_is_read_from_the_cpu_line_and_summed_over_intervals() {
        use super::CpuTicks;
        let stat = |user: u64, idle: u64, steal: u64| {
            format!("cpu  {user} 0 10 {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 5\n")
        };
        let a = CpuTicks::parse(&stat(100, 800, 90));
        assert_eq!(a, CpuTicks { total: 1000, steal: 90 });
        let b = CpuTicks::parse(&stat(150, 1000, 140));
        let phases = CpuTicks::default().add(a, b);
        assert_eq!(phases, CpuTicks { total: 300, steal: 50 });
        assert!((phases.steal_percent() - 100.0 / 6.0).abs() < 1e-9);
        assert_eq!(CpuTicks::parse("intr 5\n"), CpuTicks::default());
        assert_eq!(CpuTicks::default().steal_percent(), 0.0);
    }
}

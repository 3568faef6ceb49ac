//! `gantry-bench`: starts what a scenario needs (gateway-store on SQLite or
//! PostgreSQL, gateway-reconciler, kube-fake) on free ports, runs it for a
//! bounded time, and prints one JSON object per measurement: inputs,
//! throughput, latency percentiles and each process's RSS and CPU. Progress
//! goes to stderr. Timings are measured here, never asserted by tests.

mod args;
mod etcd;
mod fairness;
mod fleet;
mod pair;
mod pinning;
mod procs;
mod reconciling;
mod report;
mod spread;
mod stamps;
mod tracker;
mod versus;

use std::time::Duration;

use clap::Parser;
use serde_json::{json, Value};

use crate::args::{Args, Cases, ClusterKind, Scenario};
use crate::reconciling::{converge, idle, scale};
use crate::versus::{read, versus_row, watch, write, Carry, Pace, System};

/// kube-fake runs in this process and holds every object of a scale run
/// (gigabytes of small JSON values); glibc's malloc spent over half of its
/// CPU in `_int_malloc` listing 100,000 gateways' objects.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn run(args: &Args, scenario: Scenario) -> anyhow::Result<Vec<Value>> {
    let quick = args.quick;
    let secs = Duration::from_secs;
    let mut out = Vec::new();
    match scenario {
        Scenario::Read => {
            for config_bytes in [0, 4 * 1024, 64 * 1024] {
                out.push(read(args, config_bytes, if quick { 200 } else { 2000 }).await?);
            }
        }
        Scenario::Write => {
            let (clients, seconds): (&[usize], u64) =
                if quick { (&[1, 16], 2) } else { (&[1, 16, 64, 256], 10) };
            for c in args.clients_or(clients) {
                out.push(write(args, System::Gantry, c, secs(seconds)).await?);
            }
        }
        Scenario::Watch => {
            // (watchers, connections, pace)
            let runs: &[(usize, usize, Pace)] = if quick {
                &[
                    (1, 1, Pace::BackToBack),
                    (100, 100, Pace::BackToBack),
                    (100, 1, Pace::PerSecond(100)),
                ]
            } else {
                &[
                    (1, 1, Pace::BackToBack),
                    (100, 100, Pace::BackToBack),
                    (1000, 1000, Pace::BackToBack),
                    (1000, 1, Pace::BackToBack),
                    (1000, 1000, Pace::PerSecond(100)),
                    (10_000, 10_000, Pace::PerSecond(10)),
                    (10_000, 1, Pace::PerSecond(10)),
                ]
            };
            for (watchers, connections, pace) in runs {
                let duration = secs(if quick { 2 } else { 10 });
                let shape = (*watchers, *connections, Carry::StreamEach);
                out.push(watch(args, System::Gantry, shape, *pace, duration).await?);
            }
        }
        Scenario::Versus => out.extend(versus(args).await?),
        Scenario::Fairness => {
            out.extend(fairness::fairness(args, secs(if quick { 3 } else { 10 })).await?);
        }
        Scenario::Converge => {
            // A real control plane's Deployment controller and kwok on the
            // same two cores: bursts of a tenth of the size.
            let real = args.cluster == ClusterKind::Real;
            out.extend(match (quick, real) {
                (true, _) => converge(args, &[100], 50, secs(3)).await?,
                (false, false) => converge(args, &[1000, 10_000], 50, secs(20)).await?,
                (false, true) => converge(args, &[100, 1000], 50, secs(20)).await?,
            });
        }
        Scenario::Scale => out.push(match (quick, args.gateways) {
            (_, Some(n)) => scale(args, n, secs(120)).await?,
            (true, None) => scale(args, 1_000, secs(5)).await?,
            (false, None) => scale(args, 100_000, secs(120)).await?,
        }),
        Scenario::Idle => out.push(if quick {
            idle(args, 200, secs(5)).await?
        } else {
            idle(args, 10_000, secs(300)).await?
        }),
        Scenario::All => unreachable!("expanded by main"),
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Held for the whole run: PostgreSQL gets its CPUs back when dropped.
    let _pinned_postgres = match &args.pin {
        Some(pin) => {
            pinning::pin_self(pin)?;
            (args.backend == args::Backend::Postgres)
                .then(|| pinning::PinnedPostgres::pin(&pin.server))
                .transpose()?
        }
        None => None,
    };
    let _idle_polling = args.cpu_latency_qos.then(pinning::IdlePolling::hold).transpose()?;
    let scenarios: Vec<Scenario> = match args.scenario {
        Scenario::All => vec![
            Scenario::Read,
            Scenario::Write,
            Scenario::Watch,
            Scenario::Converge,
            Scenario::Scale,
            Scenario::Idle,
            Scenario::Versus,
            Scenario::Fairness,
        ],
        one => vec![one],
    };
    let mut results = Vec::new();
    for scenario in scenarios {
        for r in run(&args, scenario).await? {
            println!("{r}");
            results.push(r);
        }
    }
    if let Some(path) = &args.append {
        report::append(path, &results)?;
        eprintln!("appended the results to {}", path.display());
    }
    Ok(())
}

/// The write and watch work against etcd and gantry in turn, with
/// gantry's ratio to etcd: `--runs` times, then the spread of each ratio.
async fn versus(args: &Args) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for run in 0..args.runs {
        // Whichever goes second finds the page cache and the CPU's clock
        // as the first left them: each goes first in half of the runs.
        let order = if run % 2 == 0 {
            [System::Etcd, System::Gantry]
        } else {
            [System::Gantry, System::Etcd]
        };
        if args.runs > 1 {
            eprintln!("versus: run {} of {}, {:?} first", run + 1, args.runs, order[0]);
        }
        for mut row in versus_once(args, order).await? {
            if args.runs > 1 {
                row["run"] = json!(run + 1);
            }
            out.push(row);
        }
    }
    out.extend(spread::summary(&out));
    Ok(out)
}

/// One measurement of each system, in `order`: (etcd's, gantry's).
async fn in_order<F, Fut>(order: [System; 2], mut measure: F) -> anyhow::Result<(Value, Value)>
where
    F: FnMut(System) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Value>>,
{
    let first = measure(order[0]).await?;
    let second = measure(order[1]).await?;
    Ok(if order[0] == System::Etcd { (first, second) } else { (second, first) })
}

/// One side-by-side run of every case, each case's two systems in `order`.
async fn versus_once(args: &Args, order: [System; 2]) -> anyhow::Result<Vec<Value>> {
    let (quick, secs) = (args.quick, Duration::from_secs);
    let mut out = Vec::new();
    let (clients, seconds): (&[usize], u64) =
        if quick { (&[1, 16], 2) } else { (&[1, 16, 64], 10) };
    let clients = if args.cases == Cases::Watch { Vec::new() } else { args.clients_or(clients) };
    for c in clients {
        let (e, g) = in_order(order, |system| write(args, system, c, secs(seconds))).await?;
        out.push(versus_row("write", json!(c), &g, &e, "writes_per_s", "latency"));
        out.extend([e, g]);
    }
    if args.cases == Cases::Write {
        return Ok(out);
    }
    // (watchers, connections, pace). Back to back, each side writes
    // as fast as it acknowledges (etcd slows its Puts while it fans
    // out; gantry does not), so events/s compares fan-out capacity
    // but latencies cover different loads; paced below both
    // capacities, both deliver the same events and latencies
    // compare. Shared: the watches of a connection share one stream
    // (gantry's Watch; etcd's Watch with a create per watch, as its Go
    // client does); else one stream each.
    let (each, shared) = (Carry::StreamEach, Carry::Shared);
    let runs: &[(usize, usize, Carry, Pace)] = if quick {
        &[(100, 100, each, Pace::BackToBack), (100, 10, shared, Pace::BackToBack)]
    } else {
        &[
            (1000, 1000, each, Pace::BackToBack),
            (1000, 10, each, Pace::BackToBack),
            (1000, 10, shared, Pace::BackToBack),
            (1000, 1000, each, Pace::PerSecond(20)),
            (1000, 10, each, Pace::PerSecond(50)),
            (1000, 10, shared, Pace::PerSecond(50)),
        ]
    };
    for (watchers, connections, carry, pace) in runs {
        let shape = (*watchers, *connections, *carry);
        let run = |system| watch(args, system, shape, *pace, secs(seconds));
        let (e, g) = in_order(order, run).await?;
        let streams = if *carry == Carry::Shared { " shared" } else { "" };
        let load = match pace {
            Pace::BackToBack => json!(format!("{watchers}/{connections}{streams}")),
            Pace::PerSecond(r) => {
                json!(format!("{watchers}/{connections}{streams} at {r} writes/s"))
            }
        };
        out.push(versus_row("watch", load, &g, &e, "delivered_per_s", "write_to_receive"));
        out.extend([e, g]);
    }
    Ok(out)
}

//! gantry-bench's flags: which scenario, on which backend and cluster.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Benchmark scenarios for gantry.
#[derive(Parser, Debug)]
#[command(name = "gantry-bench", version, about)]
pub struct Args {
    /// Small sizes and short runs (a smoke check, under three minutes).
    #[arg(long, global = true, env = "GANTRY_BENCH_QUICK")]
    pub(crate) quick: bool,
    /// Store backend.
    #[arg(long, global = true, env = "GANTRY_BENCH_BACKEND", value_enum, default_value_t = Backend::Sqlite)]
    pub(crate) backend: Backend,
    /// PostgreSQL server for --backend postgres (a fresh database is made).
    #[arg(
        long,
        global = true,
        env = "GANTRY_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pub(crate) postgres_url: String,
    /// Also append the results (a section with the command, commit, machine
    /// and tables) to this Markdown file, and write latency plots as SVG
    /// files next to it.
    #[arg(long, global = true, env = "GANTRY_BENCH_APPEND")]
    pub(crate) append: Option<PathBuf>,
    /// Gateways of the `scale` scenario (default 100,000; 1,000 with
    /// --quick), e.g. a smaller fleet to profile.
    #[arg(long, global = true, env = "GANTRY_BENCH_GATEWAYS")]
    pub(crate) gateways: Option<usize>,
    /// The reconciler's --poll-interval (re-check of a rollout in progress;
    /// its watches of the owned objects re-check on every change anyway).
    #[arg(long, global = true, env = "GANTRY_BENCH_POLL_INTERVAL", default_value = "2s")]
    pub(crate) poll_interval: String,
    /// The cluster of the reconciler's scenarios (converge, scale, idle).
    #[arg(long, global = true, env = "GANTRY_BENCH_CLUSTER", value_enum, default_value_t = ClusterKind::Fake)]
    pub(crate) cluster: ClusterKind,
    /// etcd binary for `versus` (Debian's etcd-server installs `etcd`).
    #[arg(long, global = true, env = "GANTRY_BENCH_ETCD_BIN", default_value = "etcd")]
    pub(crate) etcd_bin: PathBuf,
    /// `SERVER:LOAD` (taskset CPU lists, e.g. `0:1`): the server under test
    /// (gateway-store and a local PostgreSQL's processes, or etcd) on the
    /// CPUs SERVER, this process and what it starts besides on LOAD.
    #[arg(long, global = true, env = "GANTRY_BENCH_PIN")]
    pub(crate) pin: Option<crate::pinning::Pin>,
    /// Hold a 0 µs latency constraint on the CPUs' idle states for the run
    /// (`/dev/cpu_dma_latency`, root only): idle CPUs poll instead of
    /// halting, as under tuned's latency-performance profile, for every
    /// process measured alike.
    #[arg(long, global = true, env = "GANTRY_BENCH_CPU_LATENCY_QOS")]
    pub(crate) cpu_latency_qos: bool,
    /// `versus` only: the whole side-by-side run this many times, the
    /// server that goes first alternating, then each ratio's median,
    /// lowest and highest (one run's ratio moves by up to 2.5× here).
    #[arg(long, global = true, env = "GANTRY_BENCH_RUNS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) runs: u32,
    /// `write` and `versus`: these numbers of concurrent writers (e.g.
    /// `1` or `16,64`) instead of the scenario's own.
    #[arg(long, global = true, env = "GANTRY_BENCH_CLIENTS", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) clients: Vec<u64>,
    /// `versus` only: just its write cases, or just its watch cases.
    #[arg(long, global = true, env = "GANTRY_BENCH_CASES", value_enum, default_value_t = Cases::All)]
    pub(crate) cases: Cases,
    #[command(subcommand)]
    pub(crate) scenario: Scenario,
}

/// Which of `versus`'s cases run.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cases {
    All,
    Write,
    Watch,
}

impl Args {
    /// The CPUs of the server under test, when pinned.
    pub(crate) fn server_cpus(&self) -> Option<&str> {
        self.pin.as_ref().map(|p| p.server.as_str())
    }

    /// `--clients` if given, else `default`.
    pub(crate) fn clients_or(&self, default: &[usize]) -> Vec<usize> {
        if self.clients.is_empty() {
            default.to_vec()
        } else {
            self.clients.iter().map(|&c| c as usize).collect()
        }
    }
}

#[derive(Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Concurrent clients doing spec updates (durable acknowledgements).
    Write,
    /// GetGateway round trips, one at a time, for gateways of several sizes
    /// (a reply of several KB must not wait on Nagle's algorithm).
    Read,
    /// Watchers on their own connections or sharing one, while a writer
    /// changes a gateway back to back or at a fixed rate.
    Watch,
    /// Update → observed latency at a fixed update rate, and N gateways
    /// created at once until all RUNNING (reconciler + kube-fake).
    Converge,
    /// Many gateways: store RSS, full pagination, reconciler cold start and
    /// RSS, cluster writes during a no-drift resync.
    Scale,
    /// Converged gateways left alone: CPU, cluster requests, store requests.
    Idle,
    /// The write and watch work run against etcd and gantry in turn, in
    /// one run: each side's numbers and gantry's ratio to etcd.
    Versus,
    /// Viewers flooding the store while an editor and the reconciler work:
    /// their p99 quiet and flooded (the store's own histograms).
    Fairness,
    /// Every scenario.
    All,
}

/// The cluster a scenario's reconciler applies to.
/// The cluster a scenario's reconciler applies to.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterKind {
    /// kube-fake in this process, rollouts done at once.
    Fake,
    /// A real control plane (kube-apiserver, etcd, kube-controller-manager,
    /// kube-scheduler, kwok) built by `tests/k8s/setup.sh k8s`; the
    /// reconciler runs as deploy/'s identity in a namespace of its own.
    Real,
}

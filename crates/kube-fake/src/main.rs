//! `gantry-kube-fake`: serves the fake Kubernetes API on an address and
//! writes a kubeconfig for it, until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;

/// The fake holds every object as small JSON values; glibc's malloc spent
/// over half of its CPU in `_int_malloc` at 100,000 gateways.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A fake Kubernetes API server for tests, benchmarks and manual use.
#[derive(Parser, Debug)]
#[command(name = "gantry-kube-fake", version, about)]
struct Args {
    /// Address to serve on.
    #[arg(long, env = "KUBE_FAKE_LISTEN", default_value = "127.0.0.1:8001")]
    listen: SocketAddr,
    /// Where to write a kubeconfig pointing at the server.
    #[arg(long, env = "KUBE_FAKE_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Delay before a Deployment's simulated rollout completes, in
    /// milliseconds.
    #[arg(long, env = "KUBE_FAKE_ROLLOUT_DELAY_MS", default_value_t = 50)]
    rollout_delay_ms: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let options = gantry_kube_fake::Options {
        rollout_delay: Duration::from_millis(args.rollout_delay_ms),
        ..Default::default()
    };
    let (addr, _fake, serving) = gantry_kube_fake::serve(listener, options, shutdown())?;
    if let Some(path) = &args.kubeconfig {
        std::fs::write(path, gantry_kube_fake::kubeconfig(&format!("http://{addr}")))
            .with_context(|| format!("write kubeconfig {}", path.display()))?;
    }
    tracing::info!(%addr, "kube-fake serving");
    serving.await?;
    Ok(())
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

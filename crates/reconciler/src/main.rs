//! `gateway-reconciler`: parses flags and runs the reconciler until SIGTERM
//! or Ctrl-C.

use std::process::ExitCode;

use clap::Parser;
use gantry_reconciler::config::Config;

/// Its passes allocate many small JSON values; glibc's malloc spent a
/// fifth of the reconciler's CPU in a 10,000-gateway burst (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    // Kept until the end: dropping it flushes the traces.
    let _telemetry = match config.log.init("gateway-reconciler") {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("gateway-reconciler: {e}");
            return ExitCode::FAILURE;
        }
    };
    match gantry_reconciler::run(config, gantry_runtime::shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "gateway-reconciler failed");
            eprintln!("gateway-reconciler: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `gateway-store`: parses flags and runs the store until SIGTERM or Ctrl-C.

use std::process::ExitCode;

use clap::Parser;
use gantry_store::config::Config;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    // Kept until the end: dropping it flushes the traces.
    let _telemetry = match config.log.init("gateway-store") {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("gateway-store: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::debug!(?config, "configuration");
    match gantry_store::run(config, gantry_runtime::shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "gateway-store failed");
            eprintln!("gateway-store: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `gateway-store`: parses flags and runs the store until SIGTERM or Ctrl-C.

use std::process::ExitCode;

use clap::Parser;
use gantry_store::config::Config;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    gantry_store::init_logging(&config.log);
    tracing::debug!(?config, "configuration");
    match gantry_store::run(config, gantry_store::shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "gateway-store failed");
            eprintln!("gateway-store: {e}");
            ExitCode::FAILURE
        }
    }
}

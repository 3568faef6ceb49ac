//! `gatewayctl`: reads the arguments (a leading resource word dropped, as
//! kubectl reads `VERB TYPE NAME`), runs one command
//! ([`gantry_ctl::commands::run`]) in a trace when OTLP is configured, and
//! turns any failure into a plain message and a non-zero exit code.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use gantry_ctl::cli::Cli;
use gantry_ctl::{args, commands, CtlError};

#[tokio::main]
async fn main() -> ExitCode {
    let cli_command = Cli::command();
    let takes_value = |verb: &str, flag: &str| {
        let flags_of = |c: &clap::Command| {
            c.get_arguments().any(|a| {
                let named = a.get_long() == Some(flag)
                    || (flag.len() == 1 && a.get_short() == flag.chars().next());
                named && a.get_action().takes_values()
            })
        };
        flags_of(&cli_command) || cli_command.find_subcommand(verb).is_some_and(flags_of)
    };
    let args = match args::strip_resource_word(std::env::args().collect(), takes_value) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let matches = Cli::command().get_matches_from(args);
    let command = matches.subcommand_name().unwrap_or_default().to_string();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // With OTEL_EXPORTER_OTLP_ENDPOINT set, the command is a trace whose
    // context goes with every call to the store (and from there to the
    // reconciler's pass for the generation it makes).
    let telemetry = gantry_runtime::otlp_endpoint(None).and_then(|endpoint| {
        let filter = tracing_subscriber::EnvFilter::new("off");
        let installed = gantry_runtime::init(
            "gatewayctl",
            filter,
            gantry_runtime::LogStyle::Off,
            Some(&endpoint),
        );
        installed.map_err(|e| eprintln!("warning: traces are off: {e}")).ok()
    });
    let span = tracing::info_span!("gatewayctl", otel.name = format!("gatewayctl {command}"));
    let outcome = tracing::Instrument::instrument(commands::run(cli), span).await;
    // Flushes the command's spans before the process ends.
    drop(telemetry);
    match outcome {
        Ok(code) => code,
        Err(CtlError::Reported) => ExitCode::FAILURE,
        // The reader went away (`| head`): nothing more to say.
        Err(CtlError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

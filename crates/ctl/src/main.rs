//! `gatewayctl`: reads the arguments (a leading resource word dropped, as
//! kubectl reads `VERB TYPE NAME`), runs one command
//! ([`gantry_ctl::commands::run`]) in a trace when OTLP is configured, and
//! turns any failure into a plain message and a non-zero exit code.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use gantry_client::traced::CALLS_TARGET;
use gantry_ctl::cli::{Cli, LOG_CALLS};
use gantry_ctl::{args, commands, CtlError};

fn main() -> ExitCode {
    // A shell's completion function runs gatewayctl with COMPLETE=<shell>:
    // answer it and exit, before any runtime starts (completing gateway
    // names runs its own).
    clap_complete::CompleteEnv::with_factory(Cli::command)
        .var(gantry_ctl::completion::COMPLETE_VAR)
        .complete();
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
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
    // reconciler's pass for the generation it makes). With -v=6 each call
    // is printed on stderr.
    let endpoint = gantry_runtime::otlp_endpoint(None);
    let verbose = cli.verbosity >= LOG_CALLS;
    let telemetry = (verbose || endpoint.is_some()).then(|| {
        let (filter, style) = match verbose {
            true => (format!("{CALLS_TARGET}=debug"), gantry_runtime::LogStyle::Pretty),
            false => ("off".to_string(), gantry_runtime::LogStyle::Off),
        };
        let filter = tracing_subscriber::EnvFilter::new(filter);
        let installed = gantry_runtime::init("gatewayctl", filter, style, endpoint.as_deref());
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

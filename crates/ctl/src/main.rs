//! `gatewayctl`: parses flags, resolves the context, runs one command, and
//! turns any failure into a plain message and a non-zero exit code.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use gantry_core::duration::parse_duration;
use gantry_ctl::config::{self, default_path, ConfigFile};
use gantry_ctl::output::{Format, PrintOptions};
use gantry_ctl::template::Path;
use gantry_ctl::{args, for_each, gateway_name, local, Condition, Ctl, CtlError, LabelChange};

/// The command line for gantry Gateways.
#[derive(Parser, Debug)]
#[command(
    name = "gatewayctl",
    version,
    about = "Manage gantry Gateways: apply, diff, get, describe, edit, label, wait, retry, delete, watch",
    after_help = "Examples:\n  gatewayctl apply -f examples/minimal.yaml\n  gatewayctl get\n  gatewayctl wait edge --for=condition=Ready --timeout=60s\n  gatewayctl describe edge\n  gatewayctl delete edge --wait"
)]
struct Cli {
    /// gRPC URL of gateway-store (overrides the context).
    #[arg(long, env = "GANTRY_SERVER", global = true)]
    server: Option<String>,
    /// Bearer token (overrides the context).
    #[arg(long, env = "GANTRY_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// PEM CA certificate for an https:// server (overrides the context).
    #[arg(long, env = "GANTRY_CA", global = true)]
    ca: Option<PathBuf>,
    /// Config file with contexts.
    #[arg(long, env = "GANTRY_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Context to use instead of the current one.
    #[arg(long, env = "GANTRY_CONTEXT", global = true)]
    context: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or update gateways from YAML or JSON files, directories or stdin.
    #[command(
        after_help = "Examples:\n  gatewayctl apply -f examples/full.yaml\n  gatewayctl apply -f gateways/ --dry-run=server\n  cat gw.yaml | gatewayctl apply -f -"
    )]
    Apply {
        /// A file of gateway documents, a directory of them (.yaml, .yml,
        /// .json), or "-" for stdin (repeatable).
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
        /// Read directories given with -f recursively.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// Write even over a change made since the file's
        /// metadata.resourceVersion (which otherwise makes the write conditional).
        #[arg(long)]
        force_conflicts: bool,
        #[command(flatten)]
        dry_run: DryRunArg,
    },
    /// Create a gateway from flags; an existing name is refused.
    #[command(
        after_help = "Example:\n  gatewayctl create edge --image ghcr.io/acme/gateway:1.0 --replicas 2 --route-host edge.example.com"
    )]
    Create {
        #[command(flatten)]
        flags: args::CreateFlags,
        #[command(flatten)]
        dry_run: DryRunArg,
    },
    /// List gateways or show some.
    #[command(
        after_help = "Examples:\n  gatewayctl get\n  gatewayctl get -l team=payments -o wide --show-labels\n  gatewayctl get edge -o json\n  gatewayctl get -o jsonpath='{range .items[*]}{.metadata.name}{\"\\n\"}{end}'\n  gatewayctl get -o custom-columns=NAME:.metadata.name,IMAGE:.spec.image --sort-by=.spec.image\n  gatewayctl get --watch"
    )]
    Get {
        /// Gateways to show (NAME or gateway/NAME); all when none.
        #[arg(value_parser = gateway_name)]
        names: Vec<String>,
        /// Label selector (k=v, k!=v, k in (a,b), k notin (a), k, !k).
        #[arg(short = 'l', long = "selector", default_value = "")]
        selector: String,
        /// Output format: table, wide, json, yaml, name, jsonpath=TEMPLATE,
        /// custom-columns=HEADER:.field.path,...
        #[arg(short = 'o', long = "output", default_value = "table", value_parser = Format::parse)]
        output: Format,
        /// Tables without their header row.
        #[arg(long)]
        no_headers: bool,
        /// Tables with a LABELS column.
        #[arg(long)]
        show_labels: bool,
        /// Sort by a field (a JSONPath such as .metadata.name or {.spec.image}).
        #[arg(long, value_parser = parse_path)]
        sort_by: Option<Path>,
        /// After the listing, print each change as it happens, in the same format.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Show a gateway's spec, conditions and provisioning steps.
    #[command(after_help = "Example:\n  gatewayctl describe edge")]
    Describe {
        /// The gateway (NAME or gateway/NAME).
        #[arg(value_parser = gateway_name)]
        name: String,
    },
    /// Show what applying files would change, as a unified diff (exit 0:
    /// no change, 1: changes, >1: an error).
    #[command(
        after_help = "Examples:\n  gatewayctl diff -f examples/full.yaml\n  GANTRY_EXTERNAL_DIFF='diff -u --color' gatewayctl diff -f gateways/"
    )]
    Diff {
        /// A file of gateway documents, a directory of them, or "-" for stdin (repeatable).
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
        /// Read directories given with -f recursively.
        #[arg(short = 'R', long)]
        recursive: bool,
    },
    /// Edit a gateway in your editor; written back only if nobody changed it meanwhile.
    #[command(
        after_help = "The editor is GANTRY_EDITOR, VISUAL or EDITOR (else vi).\n\nExample:\n  EDITOR=nano gatewayctl edit edge"
    )]
    Edit {
        /// The gateway (NAME or gateway/NAME).
        #[arg(value_parser = gateway_name)]
        name: String,
    },
    /// Set (key=value) or remove (key-) labels of gateways.
    #[command(
        after_help = "Examples:\n  gatewayctl label edge team=payments\n  gatewayctl label edge team=checkout --overwrite\n  gatewayctl label edge team-"
    )]
    Label {
        /// The gateway (NAME or gateway/NAME).
        #[arg(value_parser = gateway_name)]
        name: String,
        /// key=value to set, key- to remove.
        #[arg(required = true)]
        changes: Vec<LabelChange>,
        /// Allow replacing the value of an existing label.
        #[arg(long)]
        overwrite: bool,
        #[command(flatten)]
        dry_run: DryRunArg,
    },
    /// Delete gateways by name, label selector, file, or all of them.
    #[command(
        after_help = "Examples:\n  gatewayctl delete edge --wait --timeout=2m\n  gatewayctl delete -l team=payments\n  gatewayctl delete -f examples/full.yaml\n  gatewayctl delete --all"
    )]
    Delete {
        /// The gateways (NAME or gateway/NAME); each is tried and reported.
        #[arg(value_parser = gateway_name)]
        names: Vec<String>,
        /// Delete the gateways this label selector selects.
        #[arg(short = 'l', long = "selector")]
        selector: Option<String>,
        /// Delete every gateway.
        #[arg(long)]
        all: bool,
        /// Delete the gateways a file (or directory, or "-") names (repeatable).
        #[arg(short = 'f', long = "filename")]
        files: Vec<String>,
        /// Return only once the gateways are gone.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits (e.g. 30s, 2m).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
        #[command(flatten)]
        dry_run: DryRunArg,
    },
    /// Wait for a condition; the exit code tells whether it was met.
    #[command(
        after_help = "Examples:\n  gatewayctl wait edge --for=condition=Ready\n  gatewayctl wait edge --for=converged --timeout=2m\n  gatewayctl wait edge --for=delete"
    )]
    Wait {
        /// The gateways (NAME or gateway/NAME).
        #[arg(required = true, value_parser = gateway_name)]
        names: Vec<String>,
        /// condition=<Type>, converged, or delete.
        #[arg(long = "for")]
        condition: Condition,
        /// How long to wait for all of them (e.g. 30s, 2m).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Ask the reconciler to retry a FAILED gateway now (no spec change).
    #[command(after_help = "Example:\n  gatewayctl retry edge")]
    Retry {
        /// The gateway (NAME or gateway/NAME).
        #[arg(value_parser = gateway_name)]
        name: String,
    },
    /// Print changes to gateways as they happen.
    #[command(after_help = "Example:\n  gatewayctl watch -l team=payments")]
    Watch {
        /// Label selector (k=v, k!=v, k in (a,b), k notin (a), k, !k).
        #[arg(short = 'l', long = "selector", default_value = "")]
        selector: String,
        /// Only this gateway (NAME or gateway/NAME).
        #[arg(value_parser = gateway_name)]
        name: Option<String>,
    },
    /// Show or switch the contexts of the config file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print the versions of gatewayctl and of the store it talks to.
    Version {
        /// Only gatewayctl's version (no connection).
        #[arg(long)]
        client: bool,
    },
    /// Print a shell completion script.
    #[command(
        after_help = "Example:\n  gatewayctl completion bash > /etc/bash_completion.d/gatewayctl"
    )]
    Completion {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// List the contexts; the current one is marked with '*'.
    GetContexts,
    /// Make a context the current one.
    UseContext {
        /// The context's name.
        name: String,
    },
    /// Print the current context's name.
    CurrentContext,
}

/// `--dry-run`: none, or server (the store runs every check and stores
/// nothing).
#[derive(clap::Args, Debug, Clone, Copy)]
struct DryRunArg {
    /// "server": the store runs every check and answers, storing nothing;
    /// "none": write.
    #[arg(long = "dry-run", value_enum, default_value_t = DryRun::None, default_missing_value = "server", num_args = 0..=1, require_equals = true)]
    mode: DryRun,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum DryRun {
    None,
    Server,
}

impl DryRunArg {
    fn on(self) -> bool {
        self.mode == DryRun::Server
    }
}

fn parse_path(text: &str) -> Result<Path, String> {
    Path::parse(text).map_err(|e| e.to_string())
}

async fn run(cli: Cli) -> Result<ExitCode, CtlError> {
    if let Command::Completion { shell } = &cli.command {
        clap_complete::generate(*shell, &mut Cli::command(), "gatewayctl", &mut std::io::stdout());
        return Ok(ExitCode::SUCCESS);
    }
    let config_path = cli.config.clone().unwrap_or_else(default_path);
    if cli.config.is_some() && !config_path.exists() {
        // A config named on purpose that is not there is a mistake, not an
        // empty config (only the default one may be absent).
        return Err(CtlError::Message(format!(
            "config file {} does not exist: check --config (GANTRY_CONFIG)",
            config_path.display()
        )));
    }
    let file = ConfigFile::load(&config_path).map_err(CtlError::Message)?;
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    match cli.command {
        Command::Config(command) => {
            match command {
                ConfigCommand::GetContexts => config::get_contexts(&file, &mut out)?,
                ConfigCommand::UseContext { name } => {
                    config::use_context(file, &config_path, &name, &mut out)?;
                }
                ConfigCommand::CurrentContext => {
                    config::current_context(&file, &config_path, &mut out)?;
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Version { client: true } => {
            writeln!(out, "Client Version: {}", env!("CARGO_PKG_VERSION"))?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let flags = config::Overrides {
        server: cli.server.clone(),
        token: cli.token.clone(),
        ca: cli.ca.clone(),
        context: cli.context.clone(),
    };
    let ctl = config::connect(&flags, &file, &config_path)?;
    dispatch(&ctl, cli.command, &mut out, &mut err).await
}

/// Runs one command that talks to the store.
async fn dispatch(
    ctl: &Ctl,
    command: Command,
    out: &mut impl std::io::Write,
    err: &mut impl std::io::Write,
) -> Result<ExitCode, CtlError> {
    match command {
        Command::Apply { files, recursive, force_conflicts, dry_run } => {
            for_each(
                local::documents(&files, recursive),
                |doc| match doc {
                    Ok(doc) => format!("gateway/{}", doc.metadata.name),
                    Err((path, _)) => path.clone(),
                },
                async |doc| match doc {
                    Ok(doc) => ctl.apply(doc, dry_run.on(), force_conflicts).await,
                    Err((_, e)) => Err(CtlError::Message(e.to_string())),
                },
                out,
                err,
            )
            .await?;
        }
        Command::Create { flags, dry_run } => {
            let doc = args::create_doc(flags)?;
            writeln!(out, "{}", ctl.create(&doc, dry_run.on()).await?)?;
        }
        Command::Get { names, selector, output, no_headers, show_labels, sort_by, watch } => {
            let options = PrintOptions {
                single: false,
                headers: !no_headers,
                show_labels,
                sort_by,
                revision: 0,
            };
            let revision = ctl.get_cmd(&names, &selector, &output, &options, out, err).await?;
            if watch {
                ctl.get_watch(&names, &selector, &output, &options, revision, out).await?;
            }
        }
        Command::Describe { name } => ctl.describe(&name, out).await?,
        Command::Diff { files, recursive } => {
            // As `kubectl diff`: 0 no change, 1 changes, anything above an
            // error (never 1, which would read as "changes").
            return Ok(match local::diff(ctl, &files, recursive, err).await {
                Ok(code) => code,
                Err(CtlError::Reported) => ExitCode::from(2),
                Err(e) => {
                    writeln!(err, "error: {e}")?;
                    ExitCode::from(2)
                }
            });
        }
        Command::Edit { name } => local::edit(ctl, &name, out, err).await?,
        Command::Label { name, changes, overwrite, dry_run } => {
            writeln!(out, "{}", ctl.label(&name, &changes, overwrite, dry_run.on()).await?)?;
        }
        Command::Delete { names, selector, all, files, wait, timeout, dry_run } => {
            let ways = [!names.is_empty(), selector.is_some(), all, !files.is_empty()];
            if ways.iter().filter(|w| **w).count() != 1 {
                return Err(CtlError::Message(
                    "say which gateways: NAME..., -l SELECTOR, -f FILE or --all (one of them)"
                        .into(),
                ));
            }
            let names = match (selector, all) {
                (Some(selector), _) => ctl.names(&selector).await?,
                (None, true) => ctl.names("").await?,
                _ if !files.is_empty() => local::names_in(&files, err)?,
                _ => names,
            };
            let wait = wait.then_some(timeout);
            ctl.delete_all(&names, wait, dry_run.on(), out, err).await?;
        }
        Command::Wait { names, condition, timeout } => {
            ctl.wait(&names, &condition, timeout, out).await?;
        }
        Command::Retry { name } => ctl.retry(&name, out).await?,
        Command::Watch { selector, name } => ctl.watch(&selector, name.as_deref(), out).await?,
        Command::Version { .. } => {
            writeln!(out, "Client Version: {}", env!("CARGO_PKG_VERSION"))?;
            writeln!(out, "Server Version: {}", ctl.server_version().await?)?;
        }
        Command::Config(_) | Command::Completion { .. } => {}
    }
    Ok(ExitCode::SUCCESS)
}

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
    let outcome = tracing::Instrument::instrument(run(cli), span).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_and_argument_has_help_text() {
        fn missing_help(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                if !matches!(id, "help" | "version") && help.trim().is_empty() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                missing_help(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let command = Cli::command();
        command.clone().debug_assert();
        let mut missing = Vec::new();
        missing_help(&command, "gatewayctl", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:?}");
    }
}

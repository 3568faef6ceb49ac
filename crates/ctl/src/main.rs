//! `gatewayctl`: parses flags, resolves the context, runs one command, and
//! turns any failure into a plain message and a non-zero exit code.

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use gantry_core::duration::parse_duration;
use gantry_ctl::config::{default_path, ConfigFile};
use gantry_ctl::manifest::{self, GatewayDoc, Metadata, Route, Spec};
use gantry_ctl::output::Format;
use gantry_ctl::{for_each, gateway_name, Condition, Ctl, CtlError};

/// The command line for gantry Gateways.
#[derive(Parser, Debug)]
#[command(
    name = "gatewayctl",
    version,
    about = "Manage gantry Gateways: apply, get, describe, wait, retry, delete, watch",
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
    /// Create or update gateways from a YAML or JSON file ("-" for stdin).
    #[command(
        after_help = "Examples:\n  gatewayctl apply -f examples/full.yaml\n  cat gw.yaml | gatewayctl apply -f -"
    )]
    Apply {
        /// A file of one or more gateway documents ("-" for stdin; repeatable).
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
    },
    /// Create a gateway from flags; an existing name is refused.
    #[command(
        after_help = "Example:\n  gatewayctl create edge --image ghcr.io/acme/gateway:1.0 --replicas 2 --route-host edge.example.com"
    )]
    Create {
        /// Name of the new gateway (NAME or gateway/NAME).
        #[arg(value_parser = gateway_name)]
        name: String,
        /// Container image of the gateway.
        #[arg(long)]
        image: String,
        /// Number of pods (the store's default when absent).
        #[arg(long)]
        replicas: Option<i32>,
        /// Image of the supervisor sidecar (the reconciler's default when absent).
        #[arg(long)]
        supervisor_image: Option<String>,
        /// Host name of the gateway's route (no route when absent).
        #[arg(long)]
        route_host: Option<String>,
        /// Secret holding the route's TLS certificate.
        #[arg(long)]
        tls_secret: Option<String>,
        /// A label, key=value (repeatable).
        #[arg(long = "label", short = 'l')]
        labels: Vec<String>,
    },
    /// List gateways or show one.
    #[command(
        after_help = "Examples:\n  gatewayctl get\n  gatewayctl get -l team=payments -o wide\n  gatewayctl get edge -o json\n  gatewayctl get --watch"
    )]
    Get {
        /// One gateway (NAME or gateway/NAME); all when absent.
        #[arg(value_parser = gateway_name)]
        name: Option<String>,
        /// Label selector (k=v, k!=v, k in (a,b), k notin (a), k, !k).
        #[arg(short = 'l', long = "selector", default_value = "")]
        selector: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
        output: Format,
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
    /// Delete gateways.
    #[command(after_help = "Example:\n  gatewayctl delete edge --wait --timeout=2m")]
    Delete {
        /// The gateways (NAME or gateway/NAME); each is tried and reported.
        #[arg(required = true, value_parser = gateway_name)]
        names: Vec<String>,
        /// Return only once the gateways are gone.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits (e.g. 30s, 2m).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
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
    /// Print a shell completion script.
    #[command(
        after_help = "Example:\n  gatewayctl completion bash > /etc/bash_completion.d/gatewayctl"
    )]
    Completion {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

fn read_file(path: &str) -> Result<String, CtlError> {
    if path == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(|e| CtlError::Message(format!("cannot read {path}: {e}")))
}

async fn run(cli: Cli) -> Result<(), CtlError> {
    if let Command::Completion { shell } = &cli.command {
        clap_complete::generate(*shell, &mut Cli::command(), "gatewayctl", &mut std::io::stdout());
        return Ok(());
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
    let context = file.context(cli.context.as_deref()).cloned();
    if cli.context.is_some() && context.is_none() {
        return Err(CtlError::Message(format!(
            "no context {:?} in {}",
            cli.context.unwrap_or_default(),
            config_path.display()
        )));
    }
    let server = cli
        .server
        .clone()
        .or_else(|| context.as_ref().map(|c| c.server.clone()))
        .unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let token = cli.token.clone().or_else(|| context.as_ref().and_then(|c| c.token.clone()));
    let ca_path = cli.ca.clone().or_else(|| context.as_ref().and_then(|c| c.ca.clone()));
    let ca_pem = match ca_path {
        Some(p) => Some(
            std::fs::read(&p)
                .map_err(|e| CtlError::Message(format!("cannot read CA {}: {e}", p.display())))?,
        ),
        None => None,
    };
    let client = gantry_client::ClientConfig {
        endpoint: server.clone(),
        token,
        ca_pem,
        ..Default::default()
    }
    .connect_lazy()
    .map_err(|e| CtlError::Message(e.to_string()))?;
    let ctl = Ctl { client, server };
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    match cli.command {
        Command::Apply { files } => {
            // Every document of every file is tried; a file that cannot be
            // read or parsed is reported as one failed item.
            let mut docs = Vec::new();
            for path in files {
                match read_file(&path).and_then(|t| Ok(manifest::parse(&t, &path)?)) {
                    Ok(parsed) => docs.extend(parsed.into_iter().map(Ok)),
                    Err(e) => docs.push(Err((path, e))),
                }
            }
            for_each(
                docs,
                |doc| match doc {
                    Ok(doc) => format!("gateway/{}", doc.metadata.name),
                    Err((path, _)) => path.clone(),
                },
                async |doc| match doc {
                    Ok(doc) => ctl.apply(doc).await,
                    Err((_, e)) => Err(CtlError::Message(e.to_string())),
                },
                &mut out,
                &mut err,
            )
            .await
        }
        Command::Create {
            name,
            image,
            replicas,
            supervisor_image,
            route_host,
            tls_secret,
            labels,
        } => {
            let labels = labels
                .iter()
                .map(|l| {
                    l.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .ok_or_else(|| CtlError::Message(format!("label {l:?} is not key=value")))
                })
                .collect::<Result<_, _>>()?;
            let doc = GatewayDoc {
                api_version: manifest::API_VERSION.into(),
                kind: manifest::KIND.into(),
                metadata: Metadata { name, labels, ..Default::default() },
                spec: Spec {
                    image,
                    replicas,
                    supervisor_image: supervisor_image.unwrap_or_default(),
                    route: route_host.map(|host| Route {
                        host,
                        tls_secret_name: tls_secret.unwrap_or_default(),
                    }),
                    ..Default::default()
                },
                status: None,
            };
            writeln!(out, "{}", ctl.create(&doc).await?)?;
            Ok(())
        }
        Command::Get { name, selector, output, watch } => {
            let revision =
                ctl.get_cmd(name.as_deref(), &selector, output, &mut out, &mut err).await?;
            if watch {
                ctl.get_watch(name.as_deref(), &selector, output, revision, &mut out).await?;
            }
            Ok(())
        }
        Command::Describe { name } => ctl.describe(&name, &mut out).await,
        Command::Delete { names, wait, timeout } => {
            let deleted = std::cell::RefCell::new(Vec::new());
            let outcome = for_each(
                &names,
                |name| format!("gateway/{name}"),
                async |name| {
                    let line = ctl.delete(name).await?;
                    deleted.borrow_mut().push((*name).clone());
                    Ok(line)
                },
                &mut out,
                &mut err,
            )
            .await;
            let deleted = deleted.into_inner();
            if wait && !deleted.is_empty() {
                ctl.wait(&deleted, &Condition::Deleted, timeout, &mut out).await?;
            }
            outcome
        }
        Command::Wait { names, condition, timeout } => {
            ctl.wait(&names, &condition, timeout, &mut out).await
        }
        Command::Retry { name } => ctl.retry(&name, &mut out).await,
        Command::Watch { selector, name } => ctl.watch(&selector, name.as_deref(), &mut out).await,
        Command::Completion { .. } => Ok(()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
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

//! gatewayctl's command line: its flags, subcommands and their help, as
//! clap reads them (`main.rs` parses, [`crate::commands`] runs).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use gantry_core::duration::parse_duration;

use clap_complete::engine::ArgValueCandidates;

use crate::args::{self, gateway_name, Condition, LabelChange};
use crate::completion;
use crate::output::Format;
use crate::template::Path;

/// The command line for gantry Gateways.
#[derive(Parser, Debug)]
#[command(
    name = "gatewayctl",
    version,
    about = "Manage gantry Gateways: apply, diff, get, describe, edit, label, wait, retry, delete, watch",
    after_help = "Examples:\n  gatewayctl apply -f examples/minimal.yaml\n  gatewayctl get\n  gatewayctl wait edge --for=condition=Ready --timeout=60s\n  gatewayctl describe edge\n  gatewayctl delete edge --wait"
)]
pub struct Cli {
    /// gRPC URL of gateway-store (overrides the context).
    #[arg(long, env = "GANTRY_SERVER", global = true)]
    pub server: Option<String>,
    /// Bearer token (overrides the context).
    #[arg(long, env = "GANTRY_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token (overrides the context).
    #[arg(long, env = "GANTRY_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// PEM CA certificate for an https:// server (overrides the context).
    #[arg(long, env = "GANTRY_CA", global = true)]
    pub ca: Option<PathBuf>,
    /// PEM client certificate to present (with --client-key).
    #[arg(long, env = "GANTRY_CLIENT_CERTIFICATE", global = true, requires = "client_key")]
    pub client_certificate: Option<PathBuf>,
    /// PEM key of --client-certificate.
    #[arg(long, env = "GANTRY_CLIENT_KEY", global = true, requires = "client_certificate")]
    pub client_key: Option<PathBuf>,
    /// Name to check the server's certificate against, when it is not the
    /// server URL's host (e.g. through port-forward).
    #[arg(long, env = "GANTRY_TLS_SERVER_NAME", global = true)]
    pub tls_server_name: Option<String>,
    /// Config file with contexts.
    #[arg(long, env = "GANTRY_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// Context to use instead of the current one.
    #[arg(long, env = "GANTRY_CONTEXT", global = true, add = ArgValueCandidates::new(completion::contexts))]
    pub context: Option<String>,
    /// Verbosity, as kubectl's -v: 6 and above print each call to the
    /// store (method, gRPC code, time) on stderr.
    #[arg(short = 'v', long = "v", env = "GANTRY_VERBOSITY", global = true, default_value_t = 0)]
    pub verbosity: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// The `-v` level from which each call to the store is printed.
pub const LOG_CALLS: u8 = 6;

#[derive(Subcommand, Debug)]
pub enum Command {
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
        after_help = "Examples:\n  gatewayctl create edge --image ghcr.io/acme/gateway:1.0 --replicas 2 --route-host edge.example.com\n  gatewayctl create edge --image ghcr.io/acme/gateway:1.0 --dry-run=client -o yaml > edge.yaml"
    )]
    Create {
        #[command(flatten)]
        flags: args::CreateFlags,
        /// Print the gateway made (yaml, json or name) instead of a line.
        #[arg(short = 'o', long = "output", value_parser = ["yaml", "json", "name"])]
        output: Option<String>,
        #[command(flatten)]
        dry_run: DryRunArg,
    },
    /// List gateways or show some.
    #[command(
        after_help = "Examples:\n  gatewayctl get\n  gatewayctl get -l team=payments -o wide --show-labels\n  gatewayctl get edge -o json\n  gatewayctl get -o jsonpath='{range .items[*]}{.metadata.name}{\"\\n\"}{end}'\n  gatewayctl get -o custom-columns=NAME:.metadata.name,IMAGE:.spec.image --sort-by=.spec.image\n  gatewayctl get --watch"
    )]
    Get {
        /// Gateways to show (NAME or gateway/NAME); all when none.
        #[arg(value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
        names: Vec<String>,
        /// Label selector (k=v, k!=v, k in (a,b), k notin (a), k, !k).
        #[arg(short = 'l', long = "selector", default_value = "")]
        selector: String,
        /// Output format: table, wide, json, yaml, name, jsonpath=TEMPLATE,
        /// custom-columns=HEADER:.field.path,...
        #[arg(short = 'o', long = "output", default_value = "table", value_parser = Format::parse, add = ArgValueCandidates::new(completion::output_formats))]
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
        #[arg(value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
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
        #[arg(value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
        name: String,
    },
    /// Set (key=value) or remove (key-) labels of gateways.
    #[command(
        after_help = "Examples:\n  gatewayctl label edge team=payments\n  gatewayctl label edge team=checkout --overwrite\n  gatewayctl label edge team-"
    )]
    Label(KeyChanges),
    /// Set (key=value) or remove (key-) annotations of gateways.
    #[command(
        after_help = "Examples:\n  gatewayctl annotate edge owner=payments-oncall\n  gatewayctl annotate edge gantry.dev/rollback-on-failure=true --overwrite\n  gatewayctl annotate edge owner-"
    )]
    Annotate(KeyChanges),
    /// Change a gateway with a JSON merge patch or a JSON patch of its manifest.
    #[command(
        after_help = "Examples:\n  gatewayctl patch edge -p '{\"spec\":{\"image\":\"ghcr.io/acme/gateway:1.1\"}}'\n  gatewayctl patch edge --type json -p '[{\"op\":\"replace\",\"path\":\"/spec/replicas\",\"value\":3}]'\n  gatewayctl patch edge -p '{\"metadata\":{\"labels\":{\"tier\":null}}}'"
    )]
    Patch {
        /// The gateway (NAME or gateway/NAME).
        #[arg(value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
        name: String,
        /// The patch, as JSON.
        #[arg(short = 'p', long = "patch", required = true)]
        patch: String,
        /// merge: JSON merge patch (RFC 7386); json: JSON patch (RFC 6902).
        #[arg(long = "type", value_enum, default_value = "merge")]
        kind: crate::patch::PatchType,
        #[command(flatten)]
        dry_run: DryRunArg,
    },
    /// Set the number of pods of a gateway (spec.replicas).
    #[command(
        after_help = "Examples:\n  gatewayctl scale edge --replicas=3\n  gatewayctl scale edge --replicas=5 --current-replicas=3"
    )]
    Scale {
        /// The gateway (NAME or gateway/NAME).
        #[arg(value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
        name: String,
        /// The new number of pods.
        #[arg(long, required = true, value_parser = clap::value_parser!(i32).range(0..))]
        replicas: i32,
        /// Scale only if the gateway has this many now.
        #[arg(long)]
        current_replicas: Option<i32>,
        #[command(flatten)]
        dry_run: DryRunArg,
    },
    /// Delete gateways by name, label selector, file, or all of them.
    #[command(
        after_help = "Examples:\n  gatewayctl delete edge --wait --timeout=2m\n  gatewayctl delete -l team=payments\n  gatewayctl delete -f examples/full.yaml\n  gatewayctl delete --all"
    )]
    Delete {
        /// The gateways (NAME or gateway/NAME); each is tried and reported.
        #[arg(value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
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
        #[arg(required = true, value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
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
        #[arg(value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
        name: String,
    },
    /// Print changes to gateways as they happen.
    #[command(after_help = "Example:\n  gatewayctl watch -l team=payments")]
    Watch {
        /// Label selector (k=v, k!=v, k in (a,b), k notin (a), k, !k).
        #[arg(short = 'l', long = "selector", default_value = "")]
        selector: String,
        /// Only this gateway (NAME or gateway/NAME).
        #[arg(value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
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
    /// Print the shell completion function (it asks gatewayctl, so gateway
    /// names, contexts and -o formats complete too).
    #[command(
        after_help = "Examples:\n  gatewayctl completion bash > /etc/bash_completion.d/gatewayctl\n  source <(gatewayctl completion zsh)\n  gatewayctl completion fish > ~/.config/fish/completions/gatewayctl.fish"
    )]
    Completion {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// List the contexts; the current one is marked with '*'.
    GetContexts,
    /// Make a context the current one.
    UseContext {
        /// The context's name.
        #[arg(add = ArgValueCandidates::new(completion::contexts))]
        name: String,
    },
    /// Print the current context's name.
    CurrentContext,
    /// Print the config file (tokens redacted unless --raw).
    View {
        /// Show the tokens too.
        #[arg(long)]
        raw: bool,
    },
    /// Create a context or change its fields (an empty value clears one).
    #[command(
        after_help = "Examples:\n  gatewayctl config set-context prod --server https://gateway-store:50051 --ca ca.pem --token T --current\n  gatewayctl config set-context prod --token ''\n  gatewayctl config set-context prod --token-command 'kubectl create token alice --audience gantry'\n  gatewayctl config set-context sso --token-command 'kubectl oidc-login get-token --oidc-issuer-url=https://idp --oidc-client-id=gantry'"
    )]
    SetContext {
        /// The context's name (the current one with --current and no name).
        #[arg(add = ArgValueCandidates::new(completion::contexts))]
        name: Option<String>,
        #[command(flatten)]
        change: crate::config::ContextChange,
    },
}

/// What `label` and `annotate` take.
#[derive(clap::Args, Debug)]
pub struct KeyChanges {
    /// The gateway (NAME or gateway/NAME).
    #[arg(value_parser = gateway_name, add = ArgValueCandidates::new(completion::gateways))]
    pub name: String,
    /// key=value to set, key- to remove.
    #[arg(required = true)]
    pub changes: Vec<LabelChange>,
    /// Allow replacing the value of an existing key.
    #[arg(long)]
    pub overwrite: bool,
    #[command(flatten)]
    pub dry_run: DryRunArg,
}

/// `--dry-run`: none, server (the store runs every check and stores
/// nothing) or client (`create` only: print the manifest, call nothing).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct DryRunArg {
    /// "server": the store runs every check and answers, storing nothing;
    /// "client" (create only): print what would be sent, with -o yaml a
    /// manifest to edit and apply; "none": write.
    #[arg(long = "dry-run", value_enum, default_value_t = DryRun::None, default_missing_value = "server", num_args = 0..=1, require_equals = true)]
    pub mode: DryRun,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DryRun {
    None,
    Server,
    Client,
}

impl DryRunArg {
    /// Whether the store is to dry-run the write; `client` is refused
    /// (only `create` takes it).
    pub fn server(self) -> Result<bool, crate::CtlError> {
        match self.mode {
            DryRun::Client => Err(crate::CtlError::Message(
                "--dry-run=client is for create (to print a manifest); use --dry-run=server".into(),
            )),
            mode => Ok(mode == DryRun::Server),
        }
    }
}

pub fn parse_path(text: &str) -> Result<Path, String> {
    Path::parse(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

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

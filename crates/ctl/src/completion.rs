//! Dynamic shell completion, as kubectl's `__complete`: the shell's
//! completion function runs gatewayctl itself (clap_complete's
//! `CompleteEnv`, `COMPLETE=<shell>`), which answers gateway names listed
//! from the store, the config's contexts and the `-o` formats.
//! `gatewayctl completion SHELL` prints the function to install.

use std::path::PathBuf;
use std::time::Duration;

use clap_complete::engine::CompletionCandidate;
use clap_complete::env::{Bash, Elvish, EnvCompleter, Fish, Powershell, Zsh};
use clap_complete::Shell;

use crate::config::{self, default_path, ConfigFile, Overrides};

/// The environment variable that asks gatewayctl for completions.
pub const COMPLETE_VAR: &str = "COMPLETE";

/// How long completion waits for the store before offering nothing.
const STORE_PATIENCE: Duration = Duration::from_secs(2);

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The config file the environment names (the command line is not parsed
/// while completing).
fn config() -> (PathBuf, ConfigFile) {
    let path = env("GANTRY_CONFIG").map_or_else(default_path, PathBuf::from);
    let file = ConfigFile::load(&path).unwrap_or_default();
    (path, file)
}

/// Names of the gateways of the store the environment and the config
/// point at; none when it cannot be asked within two seconds.
pub fn gateways() -> Vec<CompletionCandidate> {
    let (path, file) = config();
    let flags = Overrides {
        server: env("GANTRY_SERVER"),
        token: env("GANTRY_TOKEN"),
        token_file: env("GANTRY_TOKEN_FILE").map(PathBuf::from),
        client_certificate: env("GANTRY_CLIENT_CERTIFICATE").map(PathBuf::from),
        client_key: env("GANTRY_CLIENT_KEY").map(PathBuf::from),
        tls_server_name: env("GANTRY_TLS_SERVER_NAME"),
        ca: env("GANTRY_CA").map(PathBuf::from),
        context: env("GANTRY_CONTEXT"),
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return Vec::new();
    };
    let names = runtime.block_on(async {
        let ctl = config::connect(&flags, &file, &path).ok()?;
        tokio::time::timeout(STORE_PATIENCE, ctl.names("")).await.ok()?.ok()
    });
    names.unwrap_or_default().into_iter().map(CompletionCandidate::new).collect()
}

/// The contexts of the config file.
pub fn contexts() -> Vec<CompletionCandidate> {
    let (_, file) = config();
    file.contexts.into_iter().map(|c| CompletionCandidate::new(c.name)).collect()
}

/// What `get -o` takes.
pub fn output_formats() -> Vec<CompletionCandidate> {
    ["table", "wide", "json", "yaml", "name", "jsonpath=", "custom-columns="]
        .into_iter()
        .map(CompletionCandidate::new)
        .collect()
}

/// Writes the completion function of `shell` for gatewayctl on PATH.
pub fn registration(shell: Shell, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let completer: &dyn EnvCompleter = match shell {
        Shell::Bash => &Bash,
        Shell::Zsh => &Zsh,
        Shell::Fish => &Fish,
        Shell::Elvish => &Elvish,
        Shell::PowerShell => &Powershell,
        _ => &Bash,
    };
    completer.write_registration(COMPLETE_VAR, "gatewayctl", "gatewayctl", "gatewayctl", out)
}

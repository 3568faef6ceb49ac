//! gatewayctl's `config` commands and how a connection is resolved: flags
//! and environment variables override the config file
//! ([`gantry_client::config`]: named contexts and the current one).

use std::path::{Path, PathBuf};

pub use gantry_client::config::{default_path, ConfigFile, Context};

use crate::ctl::Ctl;
use crate::errors::CtlError;

/// `config get-contexts`: the contexts, the current one marked with '*'.
pub fn get_contexts(file: &ConfigFile, out: &mut impl std::io::Write) -> Result<(), CtlError> {
    writeln!(out, "{:<8} {:<20} SERVER", "CURRENT", "NAME")?;
    for c in &file.contexts {
        let current = if c.name == file.current_context { "*" } else { "" };
        writeln!(out, "{current:<8} {:<20} {}", c.name, c.server)?;
    }
    Ok(())
}

/// `config use-context NAME`: makes `name` current and saves the file.
pub fn use_context(
    mut file: ConfigFile,
    path: &Path,
    name: &str,
    out: &mut impl std::io::Write,
) -> Result<(), CtlError> {
    if file.context(Some(name)).is_none() {
        let known: Vec<&str> = file.contexts.iter().map(|c| c.name.as_str()).collect();
        return Err(CtlError::Message(format!(
            "no context {name:?} in {} (it has: {})",
            path.display(),
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        )));
    }
    file.current_context = name.to_string();
    file.save(path).map_err(CtlError::Message)?;
    writeln!(out, "Switched to context \"{name}\".")?;
    Ok(())
}

/// `config current-context`: the current context's name.
pub fn current_context(
    file: &ConfigFile,
    path: &Path,
    out: &mut impl std::io::Write,
) -> Result<(), CtlError> {
    if file.current_context.is_empty() {
        return Err(CtlError::Message(format!("no current context in {}", path.display())));
    }
    writeln!(out, "{}", file.current_context)?;
    Ok(())
}

/// `config view`: the config file as YAML, tokens shown as `REDACTED`
/// unless `raw` (as `kubectl config view --raw`).
pub fn view(file: &ConfigFile, raw: bool, out: &mut impl std::io::Write) -> Result<(), CtlError> {
    let mut shown = file.clone();
    if !raw {
        for context in &mut shown.contexts {
            if context.token.is_some() {
                context.token = Some("REDACTED".into());
            }
            // A command's arguments may hold secrets too.
            if let [program, rest @ ..] = &context.token_command[..] {
                if !rest.is_empty() {
                    context.token_command = vec![program.clone(), "REDACTED".into()];
                }
            }
        }
    }
    let text = serde_saphyr::to_string(&shown).map_err(|e| CtlError::Message(e.to_string()))?;
    write!(out, "{text}")?;
    Ok(())
}

/// What `config set-context` changes (its flags).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ContextChange {
    /// gRPC URL of gateway-store.
    #[arg(long)]
    pub server: Option<String>,
    /// Bearer token.
    #[arg(long)]
    pub token: Option<String>,
    /// File holding the bearer token, read when used.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Command printing the bearer token or an ExecCredential (split at
    /// spaces; edit the config file for arguments with spaces).
    #[arg(long)]
    pub token_command: Option<String>,
    /// PEM CA certificate for an https:// server.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// PEM client certificate to present.
    #[arg(long)]
    pub client_certificate: Option<PathBuf>,
    /// PEM key of the client certificate.
    #[arg(long)]
    pub client_key: Option<PathBuf>,
    /// Name to check the server's certificate against.
    #[arg(long)]
    pub tls_server_name: Option<String>,
    /// Make it the current context (or, without a name, change the current one).
    #[arg(long)]
    pub current: bool,
}

/// `config set-context NAME`: creates the context (a server is then
/// required) or changes the fields given; saves the file.
pub fn set_context(
    mut file: ConfigFile,
    path: &Path,
    name: &str,
    change: ContextChange,
    out: &mut impl std::io::Write,
) -> Result<(), CtlError> {
    let existing = file.contexts.iter().position(|c| c.name == name);
    let verb = if existing.is_some() { "modified" } else { "created" };
    let mut context = match existing {
        Some(i) => file.contexts[i].clone(),
        None => Context { name: name.into(), ..Default::default() },
    };
    if let Some(server) = change.server {
        context.server = server;
    }
    if context.server.is_empty() {
        return Err(CtlError::Message(format!(
            "context {name:?} is new: give its --server (e.g. https://gateway-store:50051)"
        )));
    }
    if let Some(token) = change.token {
        context.token = Some(token).filter(|t| !t.is_empty());
    }
    if let Some(file) = change.token_file {
        context.token_file = Some(file).filter(|f| !f.as_os_str().is_empty());
    }
    if let Some(command) = change.token_command {
        context.token_command = command.split_whitespace().map(str::to_string).collect();
    }
    let set = |p: PathBuf| Some(p).filter(|p| !p.as_os_str().is_empty());
    if let Some(ca) = change.ca {
        context.ca = set(ca);
    }
    if let Some(cert) = change.client_certificate {
        context.client_certificate = set(cert);
    }
    if let Some(key) = change.client_key {
        context.client_key = set(key);
    }
    if let Some(name) = change.tls_server_name {
        context.tls_server_name = Some(name).filter(|n| !n.is_empty());
    }
    match existing {
        Some(i) => file.contexts[i] = context,
        None => file.contexts.push(context),
    }
    if change.current || file.current_context.is_empty() {
        file.current_context = name.into();
    }
    file.save(path).map_err(CtlError::Message)?;
    writeln!(out, "Context \"{name}\" {verb}.")?;
    Ok(())
}

/// What the flags (and their environment variables) say of the
/// connection; each overrides the context.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub server: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    pub client_certificate: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub tls_server_name: Option<String>,
    pub context: Option<String>,
}

/// Where to connect, from the flags, the environment and the config file
/// at `path`.
pub fn connect(flags: &Overrides, file: &ConfigFile, path: &Path) -> Result<Ctl, CtlError> {
    let context = file.context(flags.context.as_deref()).cloned();
    if flags.context.is_some() && context.is_none() {
        return Err(CtlError::Message(format!(
            "no context {:?} in {}",
            flags.context.clone().unwrap_or_default(),
            path.display()
        )));
    }
    let server =
        flags.server.clone().or_else(|| context.as_ref().map(|c| c.server.clone())).ok_or_else(
            || {
                CtlError::Message(format!(
                "no store to talk to: no --server (GANTRY_SERVER) and no current context in {}; \
                     start one locally with gantry-local (it writes a context), or run \
                     `gatewayctl config set-context NAME --server URL --current`",
                path.display()
            ))
            },
        )?;
    let (token, token_file) = credential(flags, context.as_ref())?;
    let pick = |flag: &Option<PathBuf>, field: fn(&Context) -> Option<PathBuf>| {
        flag.clone().or_else(|| context.as_ref().and_then(field))
    };
    let read = |what: &str, path: Option<PathBuf>| -> Result<Option<Vec<u8>>, CtlError> {
        path.map(|p| {
            std::fs::read(&p)
                .map_err(|e| CtlError::Message(format!("cannot read {what} {}: {e}", p.display())))
        })
        .transpose()
    };
    let ca_pem = read("CA", pick(&flags.ca, |c| c.ca.clone()))?;
    let certificate = read(
        "client certificate",
        pick(&flags.client_certificate, |c| c.client_certificate.clone()),
    )?;
    let key = read("client key", pick(&flags.client_key, |c| c.client_key.clone()))?;
    let client_identity = match (certificate, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(CtlError::Message(
                "a client certificate needs its key (client_certificate and client_key)".into(),
            ))
        }
    };
    let tls_domain = flags
        .tls_server_name
        .clone()
        .or_else(|| context.as_ref().and_then(|c| c.tls_server_name.clone()));
    let client = gantry_client::ClientConfig {
        endpoint: server.clone(),
        token,
        token_file,
        ca_pem,
        tls_domain,
        client_identity,
    }
    .connect_lazy()
    .map_err(|e| CtlError::Message(e.to_string()))?;
    Ok(Ctl { client, server })
}

/// The bearer token (or the file holding it) the first of these gives:
/// `--token`, `--token-file`, the context's `token`, `token_file`,
/// `token_command`.
fn credential(
    flags: &Overrides,
    context: Option<&Context>,
) -> Result<(Option<String>, Option<PathBuf>), CtlError> {
    if flags.token.is_some() || flags.token_file.is_some() {
        return Ok((flags.token.clone(), flags.token_file.clone()));
    }
    let Some(context) = context else { return Ok((None, None)) };
    if context.token.is_some() || context.token_file.is_some() {
        return Ok((context.token.clone(), context.token_file.clone()));
    }
    if context.token_command.is_empty() {
        return Ok((None, None));
    }
    crate::credential::token_from_command(&context.token_command).map(|t| (Some(t), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_lookup() {
        let dir = std::env::temp_dir().join(format!("gatewayctl-config-{}", std::process::id()));
        let path = dir.join("config.yaml");
        let mut config = ConfigFile::default();
        config.upsert(Context {
            name: "local".into(),
            server: "http://127.0.0.1:50051".into(),
            token: Some("t".into()),
            ..Default::default()
        });
        config.upsert(Context {
            name: "prod".into(),
            server: "https://store:50051".into(),
            ca: Some("/ca.pem".into()),
            ..Default::default()
        });
        config.save(&path).unwrap();
        let loaded = ConfigFile::load(&path).unwrap();
        assert_eq!(loaded, config);
        assert_eq!(loaded.context(None).unwrap().name, "prod");
        assert_eq!(loaded.context(Some("local")).unwrap().token.as_deref(), Some("t"));
        assert!(!format!("{:?}", loaded.context(Some("local")).unwrap()).contains("\"t\""));
        assert_eq!(ConfigFile::load(&dir.join("missing.yaml")).unwrap(), ConfigFile::default());
        std::fs::remove_dir_all(dir).unwrap();
    }
}

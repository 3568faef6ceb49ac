//! The gatewayctl config file: named contexts (server, token, CA) and the
//! current one. Flags and environment variables override it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ctl::Ctl;
use crate::errors::CtlError;

/// The config file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ConfigFile {
    #[serde(default)]
    pub current_context: String,
    #[serde(default)]
    pub contexts: Vec<Context>,
}

/// One store to talk to.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Context {
    pub name: String,
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Path of a PEM CA certificate for an https:// server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name)
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("ca", &self.ca)
            .finish()
    }
}

/// The default config path: `$HOME/.config/gantry/config.yaml`.
pub fn default_path() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".config/gantry/config.yaml")
}

impl ConfigFile {
    /// Reads the file; a missing file is an empty config.
    pub fn load(path: &Path) -> Result<ConfigFile, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_saphyr::from_str(&text)
                .map_err(|e| format!("cannot read config {}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
            Err(e) => Err(format!("cannot read config {}: {e}", path.display())),
        }
    }

    /// Writes the file (creating its directory), readable by the owner only.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let text = serde_saphyr::to_string(self).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
        Ok(())
    }

    /// The named context, or the current one.
    pub fn context(&self, name: Option<&str>) -> Option<&Context> {
        let wanted = name.unwrap_or(&self.current_context);
        self.contexts.iter().find(|c| c.name == wanted)
    }

    /// Adds or replaces a context and makes it current.
    pub fn upsert(&mut self, context: Context) {
        self.current_context = context.name.clone();
        match self.contexts.iter_mut().find(|c| c.name == context.name) {
            Some(existing) => *existing = context,
            None => self.contexts.push(context),
        }
    }
}

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

/// What the flags (and their environment variables) say of the
/// connection; each overrides the context.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub server: Option<String>,
    pub token: Option<String>,
    pub ca: Option<PathBuf>,
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
    let server = flags
        .server
        .clone()
        .or_else(|| context.as_ref().map(|c| c.server.clone()))
        .unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let token = flags.token.clone().or_else(|| context.as_ref().and_then(|c| c.token.clone()));
    let ca_path = flags.ca.clone().or_else(|| context.as_ref().and_then(|c| c.ca.clone()));
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
    Ok(Ctl { client, server })
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
            ca: None,
        });
        config.upsert(Context {
            name: "prod".into(),
            server: "https://store:50051".into(),
            token: None,
            ca: Some("/ca.pem".into()),
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

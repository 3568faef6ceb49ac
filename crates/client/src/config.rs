//! The gatewayctl config file (`$XDG_CONFIG_HOME/gantry/config.yaml`, by
//! default `~/.config/gantry/config.yaml`): named
//! contexts (server, token, CA) and the current one. Read by gatewayctl,
//! written by `gatewayctl config` and by gantry-local.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    /// File holding the bearer token, read when used (kubeconfig's
    /// `tokenFile`: a projected service-account token, for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Command (program and arguments) that prints the bearer token: an
    /// `ExecCredential` as kubectl's exec plugins print it (`kubectl
    /// oidc-login get-token ...`), or the token alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_command: Vec<String>,
    /// Path of a PEM CA certificate for an https:// server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// Paths of a PEM client certificate and its key (kubeconfig's
    /// `client-certificate` and `client-key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PathBuf>,
    /// The name to check the server's certificate against, when it is not
    /// the server URL's host (`kubectl --tls-server-name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name)
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("token_file", &self.token_file)
            .field("token_command", &self.token_command)
            .field("ca", &self.ca)
            .field("client_certificate", &self.client_certificate)
            .field("client_key", &self.client_key)
            .field("tls_server_name", &self.tls_server_name)
            .finish()
    }
}

/// The default config path: `gantry/config.yaml` under
/// `$XDG_CONFIG_HOME` (when set to an absolute path, as the XDG Base
/// Directory specification says), else under `$HOME/.config`.
pub fn default_path() -> PathBuf {
    let xdg = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
    let base = xdg.unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
        home.join(".config")
    });
    base.join("gantry/config.yaml")
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

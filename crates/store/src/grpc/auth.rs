//! Bearer-token authentication from a static tokens file.
//!
//! The file has the shape of Kubernetes' static token file: one
//! `token,subject,role[,expires]` line per token, `expires` an RFC 3339
//! time after which the token is refused; blank lines and lines starting
//! with `#` are ignored. Tokens are never logged; only subjects are. A
//! presented token is compared with every known token in constant time, so
//! response timing does not reveal how much of a guess was right.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use gantry_core::Role;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub subject: String,
    pub role: Role,
}

/// A tokens file that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tokens file line {line}: {reason}")]
pub struct TokensFileError {
    pub line: usize,
    pub reason: String,
}

/// One line of the tokens file.
#[derive(Clone)]
pub struct TokenEntry {
    token: Vec<u8>,
    principal: Principal,
    expires: Option<SystemTime>,
}

impl fmt::Debug for TokenEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenEntry")
            .field("principal", &self.principal)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// Equality of two byte strings in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// How requests are authenticated.
#[derive(Clone)]
pub enum Authenticator {
    /// Every request needs a known, unexpired bearer token.
    Tokens(Vec<TokenEntry>),
    /// Every request is admin; only with `--allow-unauthenticated`.
    Unauthenticated,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Authenticator::Tokens(t) => write!(f, "Tokens({} tokens)", t.len()),
            Authenticator::Unauthenticated => f.write_str("Unauthenticated"),
        }
    }
}

impl Authenticator {
    /// Parses the contents of a tokens file.
    pub fn parse_tokens_file(text: &str) -> Result<Self, TokensFileError> {
        let mut tokens: Vec<TokenEntry> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |reason: &str| TokensFileError { line, reason: reason.to_string() };
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = trimmed.split(',').map(str::trim).collect();
            let (token, subject, role, expires) = match fields[..] {
                [token, subject, role] => (token, subject, role, None),
                [token, subject, role, expires] => (token, subject, role, Some(expires)),
                _ => return Err(err("expected token,subject,role[,expires]")),
            };
            let expires = expires
                .map(|e| {
                    e.parse::<prost_types::Timestamp>()
                        .ok()
                        .and_then(|t| SystemTime::try_from(t).ok())
                        .ok_or_else(|| {
                            err("expires must be an RFC 3339 time such as 2027-01-31T00:00:00Z")
                        })
                })
                .transpose()?;
            if token.len() < 16 {
                return Err(err("token must be at least 16 characters"));
            }
            if subject.is_empty() {
                return Err(err("subject is empty"));
            }
            let role: Role = role.parse().map_err(|e: String| err(&e))?;
            let principal = Principal { subject: subject.to_string(), role };
            if tokens.iter().any(|t| t.token == token.as_bytes()) {
                return Err(err("duplicate token"));
            }
            tokens.push(TokenEntry { token: token.as_bytes().to_vec(), principal, expires });
        }
        if tokens.is_empty() {
            return Err(TokensFileError { line: 0, reason: "no tokens".into() });
        }
        Ok(Authenticator::Tokens(tokens))
    }

    /// The principal for a request's `authorization: Bearer T` metadata, or
    /// UNAUTHENTICATED.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Principal, Status> {
        let tokens = match self {
            Authenticator::Unauthenticated => {
                return Ok(Principal { subject: "anonymous".into(), role: Role::Admin });
            }
            Authenticator::Tokens(tokens) => tokens,
        };
        let token = bearer(metadata)?;
        // Every entry is compared, whatever matched first.
        let found = tokens.iter().fold(None, |found, entry| {
            if constant_time_eq(&entry.token, token.as_bytes()) {
                Some(entry)
            } else {
                found
            }
        });
        let entry = found.ok_or_else(|| {
            Status::unauthenticated("unknown bearer token; check the token your client sends")
        })?;
        if entry.expires.is_some_and(|e| e <= SystemTime::now()) {
            return Err(Status::unauthenticated(format!(
                "the bearer token of {} has expired; ask the store's operator for a new one",
                entry.principal.subject
            )));
        }
        Ok(entry.principal.clone())
    }
}

/// The authenticator in force, replaced when the tokens file changes (or
/// on SIGHUP): a token added or removed there takes effect without a
/// restart, and open watch streams re-check their token on every reload
/// and when it expires.
pub struct Auth {
    current: RwLock<Arc<Authenticator>>,
    /// The tokens file it was read from, if any.
    path: Option<PathBuf>,
    reloads: tokio::sync::watch::Sender<u64>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth").field("current", &self.snapshot()).field("path", &self.path).finish()
    }
}

impl Auth {
    pub fn new(authenticator: Authenticator) -> Self {
        Self::with_path(authenticator, None)
    }

    /// An authenticator read from `path`, reloadable.
    pub fn with_path(authenticator: Authenticator, path: Option<PathBuf>) -> Self {
        Self {
            current: RwLock::new(Arc::new(authenticator)),
            path,
            reloads: tokio::sync::watch::channel(0).0,
        }
    }

    fn snapshot(&self) -> Arc<Authenticator> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The tokens file, if the tokens came from one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// See [`Authenticator::authenticate`], with the tokens now in force.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Principal, Status> {
        self.snapshot().authenticate(metadata)
    }

    /// When the token in `metadata` expires, if it is known and expires.
    pub fn expires(&self, metadata: &MetadataMap) -> Option<SystemTime> {
        match &*self.snapshot() {
            Authenticator::Tokens(tokens) => {
                let token = bearer(metadata).ok()?;
                tokens.iter().find(|e| constant_time_eq(&e.token, token.as_bytes()))?.expires
            }
            Authenticator::Unauthenticated => None,
        }
    }

    /// Puts `authenticator` in force and tells open streams to re-check.
    pub fn replace(&self, authenticator: Authenticator) {
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(authenticator);
        self.reloads.send_modify(|n| *n += 1);
    }

    /// Changes on every [`Auth::replace`].
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }
}

/// Reloads the tokens file of `auth` when it changes (checked every
/// second) or on SIGHUP, until `shutdown`. A file that does not parse is
/// logged and the tokens in force stay.
pub async fn reload_on_change(auth: Arc<Auth>, shutdown: gantry_runtime::Shutdown) {
    let Some(path) = auth.path().map(Path::to_path_buf) else { return };
    let stamp = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.modified().ok(), m.len()));
    let mut seen = stamp(&path);
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        let hangup = async {
            match hangups.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        let forced = tokio::select! {
            () = shutdown.wait() => return,
            _ = tick.tick() => false,
            () = hangup => true,
        };
        let now = stamp(&path);
        if !forced && now == seen {
            continue;
        }
        seen = now;
        let parsed = std::fs::read(&path).map_err(|e| e.to_string()).and_then(|text| {
            Authenticator::parse_tokens_file(&String::from_utf8_lossy(&text))
                .map_err(|e| e.to_string())
        });
        match parsed {
            Ok(authenticator) => {
                tracing::info!(path = %path.display(), tokens = ?authenticator, "tokens file reloaded");
                auth.replace(authenticator);
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "cannot reload the tokens file; the tokens in force stay");
            }
        }
    }
}

fn bearer(metadata: &MetadataMap) -> Result<&str, Status> {
    let header = metadata.get("authorization").ok_or_else(|| {
        Status::unauthenticated("missing `authorization: Bearer <token>` metadata")
    })?;
    header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or_else(|| Status::unauthenticated("authorization metadata must be `Bearer <token>`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# gantry tokens\nviewer-token-0123456789,alice,viewer\n\nreconciler-token-0123456,gateway-reconciler,reconciler\n";

    fn metadata(value: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", value.parse().unwrap());
        m
    }

    #[test]
    fn parses_and_authenticates() {
        let auth = Authenticator::parse_tokens_file(FILE).unwrap();
        let p = auth.authenticate(&metadata("Bearer viewer-token-0123456789")).unwrap();
        assert_eq!(p, Principal { subject: "alice".into(), role: Role::Viewer });
        for bad in ["Bearer nope-nope-nope-nope", "Basic abc", "viewer-token-0123456789"] {
            assert_eq!(
                auth.authenticate(&metadata(bad)).unwrap_err().code(),
                tonic::Code::Unauthenticated
            );
        }
        assert_eq!(
            auth.authenticate(&MetadataMap::new()).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
    }

    #[test]
    fn rejects_bad_files_with_the_line() {
        let cases = [
            ("short,a,viewer", 1),
            ("a-long-enough-token-1,a", 1),
            ("# c\na-long-enough-token-1,a,root", 2),
            ("a-long-enough-token-1,a,viewer\na-long-enough-token-1,b,admin", 2),
            ("", 0),
        ];
        for (text, line) in cases {
            assert_eq!(Authenticator::parse_tokens_file(text).unwrap_err().line, line, "{text}");
        }
    }

    #[test]
    fn expired_tokens_are_refused_and_unexpired_ones_accepted() {
        let file = "old-token-0123456789ab,bob,editor,2020-01-01T00:00:00Z\n\
                    new-token-0123456789ab,carol,editor,2999-01-01T00:00:00Z\n";
        let auth = Authenticator::parse_tokens_file(file).unwrap();
        let expired = auth.authenticate(&metadata("Bearer old-token-0123456789ab")).unwrap_err();
        assert_eq!(expired.code(), tonic::Code::Unauthenticated);
        assert!(expired.message().contains("expired"), "{}", expired.message());
        assert!(!expired.message().contains("old-token"), "the message must not echo the token");
        let p = auth.authenticate(&metadata("Bearer new-token-0123456789ab")).unwrap();
        assert_eq!(p.subject, "carol");
        let bad = Authenticator::parse_tokens_file("a-long-enough-token-1,a,viewer,tomorrow");
        assert_eq!(bad.unwrap_err().line, 1);
    }

    #[test]
    fn constant_time_eq_compares_whole_strings() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn debug_hides_tokens() {
        let auth = Authenticator::parse_tokens_file(FILE).unwrap();
        assert!(!format!("{auth:?}").contains("viewer-token"));
    }
}

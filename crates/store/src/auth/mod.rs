//! Who is calling, and with which role.
//!
//! A call is checked by the authenticators configured, in this order (the
//! Kubernetes API server's):
//!
//! 0. a client certificate the TLS handshake verified against
//!    `--client-ca` ([`x509`]): its CN is the user, each O a group;
//!
//! then its `authorization: Bearer T`:
//!
//! 1. the static tokens file ([`tokens`]): the line names the subject and
//!    its role;
//! 2. for a token shaped like a JWT, the issuer its `iss` names ([`jwt`]):
//!    Kubernetes service-account tokens ([`service_account`]), verified
//!    offline against the API server's keys and, optionally, online by a
//!    TokenReview, and people's tokens from an OIDC provider ([`oidc`]).
//!    The identity (user and groups) gets its role from the role bindings
//!    ([`bindings`]); an identity no binding names is refused with
//!    PERMISSION_DENIED, never taken as a viewer.
//!
//! A verified JWT is remembered for [`VERIFIED_FOR`] by its SHA-256 (never
//! the token itself), so a busy caller costs one signature check (and one
//! TokenReview) per interval, and a refusal can be logged with the identity
//! without verifying again. The tokens and bindings files are reloaded when
//! they change or on SIGHUP ([`reload_on_change`]); open watches re-check
//! their caller then and when its token expires.

pub mod bindings;
pub mod https;
pub mod jwt;
pub mod oidc;
pub mod service_account;
pub mod tokens;
pub mod x509;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use gantry_core::Role;
use rustls::pki_types::CertificateDer;
use sha2::Digest as _;
use tonic::metadata::MetadataMap;
use tonic::Status;

pub use bindings::{Bindings, BindingsFileError};
pub use tokens::{Authenticator, TokensFileError};

use self::jwt::Issuer;
use self::service_account::{ReviewRefusal, TokenReviewer};

/// The static tokens file's name in logs.
pub const TOKENS_FILE: &str = "tokens-file";

/// How long a verified JWT is taken without checking it again.
pub const VERIFIED_FOR: Duration = Duration::from_secs(10);
/// The most verified tokens remembered at once.
const VERIFIED_MAX: usize = 10_000;

/// What a call presents.
#[derive(Debug, Clone, Copy)]
pub struct Credentials<'a> {
    pub metadata: &'a MetadataMap,
    /// The client certificate chain the TLS handshake verified, leaf
    /// first.
    pub certificates: Option<&'a [CertificateDer<'static>]>,
}

impl<'a> Credentials<'a> {
    /// A call that presents only metadata.
    pub fn metadata(metadata: &'a MetadataMap) -> Self {
        Self { metadata, certificates: None }
    }

    fn client_certificate(&self) -> Option<&'a [u8]> {
        self.certificates.and_then(|chain| chain.first()).map(|c| c.as_ref())
    }
}

/// Who is calling, with the role the handlers check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub subject: String,
    pub role: Role,
}

/// An authenticated caller before its role is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    /// Which authenticator vouched for it.
    pub authenticator: &'static str,
}

#[derive(Debug)]
struct Remembered {
    identity: Identity,
    expires: SystemTime,
    checked: Instant,
}

impl Remembered {
    fn fresh(&self) -> bool {
        self.checked.elapsed() < VERIFIED_FOR && self.expires > SystemTime::now()
    }
}

/// The authenticators and bindings in force.
pub struct Auth {
    tokens: RwLock<Arc<Authenticator>>,
    tokens_path: Option<PathBuf>,
    bindings: RwLock<Arc<Bindings>>,
    bindings_path: Option<PathBuf>,
    issuers: Vec<Issuer>,
    reviewer: Option<TokenReviewer>,
    client_certificates: bool,
    verified: Mutex<HashMap<[u8; 32], Remembered>>,
    reloads: tokio::sync::watch::Sender<u64>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("tokens", &self.tokens())
            .field("tokens_path", &self.tokens_path)
            .field("bindings_path", &self.bindings_path)
            .field("issuers", &self.issuers)
            .field("token_review", &self.reviewer.is_some())
            .finish_non_exhaustive()
    }
}

fn unauthenticated(message: String) -> Status {
    Status::unauthenticated(message)
}

impl Auth {
    pub fn new(authenticator: Authenticator) -> Self {
        Self::with_path(authenticator, None)
    }

    /// An authenticator read from the tokens file `path`, reloadable.
    pub fn with_path(authenticator: Authenticator, path: Option<PathBuf>) -> Self {
        Self {
            tokens: RwLock::new(Arc::new(authenticator)),
            tokens_path: path,
            bindings: RwLock::new(Arc::new(Bindings::default())),
            bindings_path: None,
            issuers: Vec::new(),
            reviewer: None,
            client_certificates: false,
            verified: Mutex::new(HashMap::new()),
            reloads: tokio::sync::watch::channel(0).0,
        }
    }

    /// Role bindings (read from `path`, reloadable, if given).
    pub fn with_bindings(mut self, bindings: Bindings, path: Option<PathBuf>) -> Self {
        self.bindings = RwLock::new(Arc::new(bindings));
        self.bindings_path = path;
        self
    }

    /// One more issuer whose JWTs are accepted.
    pub fn with_issuer(mut self, issuer: Issuer) -> Self {
        self.issuers.push(issuer);
        self
    }

    /// Checks service-account tokens with the API server too.
    pub fn with_token_review(mut self, reviewer: TokenReviewer) -> Self {
        self.reviewer = Some(reviewer);
        self
    }

    /// Takes verified client certificates as identities (`--client-ca`).
    pub fn with_client_certificates(mut self) -> Self {
        self.client_certificates = true;
        self
    }

    /// The issuers configured (to fetch their keys at start).
    pub fn issuers(&self) -> &[Issuer] {
        &self.issuers
    }

    fn tokens(&self) -> Arc<Authenticator> {
        self.tokens.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn bindings(&self) -> Arc<Bindings> {
        self.bindings.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The tokens file, if the tokens came from one.
    pub fn path(&self) -> Option<&Path> {
        self.tokens_path.as_deref()
    }

    /// The principal for a call's metadata: UNAUTHENTICATED when no
    /// authenticator vouches for its token, PERMISSION_DENIED when one does
    /// but no binding gives the identity a role, UNAVAILABLE when the
    /// API server could not review a service-account token.
    pub async fn authenticate(&self, call: &Credentials<'_>) -> Result<Principal, Status> {
        let tokens = self.tokens();
        if matches!(*tokens, Authenticator::Unauthenticated) {
            return Ok(Principal { subject: "anonymous".into(), role: Role::Admin });
        }
        if let Some((identity, _)) = self.certificate_identity(call)? {
            return self.bind(identity);
        }
        let token = bearer(call.metadata)?;
        if let Some(found) = tokens.lookup(token) {
            return found;
        }
        if !self.issuers.is_empty() {
            if let Some(iss) = jwt::unverified_issuer(token) {
                let identity = self.verify(token, &iss).await?;
                return self.bind(identity);
            }
        }
        Err(unauthenticated("unknown bearer token; check the token your client sends".into()))
    }

    /// The identity of the call's verified client certificate, if it has
    /// one and certificates are taken.
    fn certificate_identity(
        &self,
        call: &Credentials<'_>,
    ) -> Result<Option<(Identity, SystemTime)>, Status> {
        match call.client_certificate().filter(|_| self.client_certificates) {
            Some(der) => x509::identity(der).map(Some).map_err(|reason| {
                unauthenticated(format!("{} certificate refused: {reason}", x509::AUTHENTICATOR))
            }),
            None => Ok(None),
        }
    }

    async fn verify(&self, token: &str, iss: &str) -> Result<Identity, Status> {
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        if let Some(identity) = self.remembered(&digest) {
            return Ok(identity);
        }
        let mut issuer = None;
        for candidate in &self.issuers {
            if candidate.issues(iss).await {
                issuer = Some(candidate);
                break;
            }
        }
        let Some(issuer) = issuer else {
            let iss: String = iss.chars().take(120).collect();
            return Err(unauthenticated(format!(
                "no authenticator takes tokens of issuer {iss:?}"
            )));
        };
        let verified = issuer.verify(token).await.map_err(|reason| {
            unauthenticated(format!("{} token refused: {reason}", issuer.authenticator))
        })?;
        if issuer.authenticator == service_account::AUTHENTICATOR {
            if let Some(reviewer) = &self.reviewer {
                reviewer.review(token, &verified.identity.user).await.map_err(|r| match r {
                    ReviewRefusal::Refused(reason) => {
                        unauthenticated(format!("{} token refused: {reason}", issuer.authenticator))
                    }
                    ReviewRefusal::Unreachable(reason) => Status::unavailable(format!(
                        "cannot check the service-account token: {reason}; retry"
                    )),
                })?;
            }
        }
        self.remember(digest, &verified);
        Ok(verified.identity)
    }

    fn remembered(&self, digest: &[u8; 32]) -> Option<Identity> {
        let verified = self.verified.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        verified.get(digest).filter(|r| r.fresh()).map(|r| r.identity.clone())
    }

    fn remember(&self, digest: [u8; 32], verified: &jwt::Verified) {
        let mut remembered =
            self.verified.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if remembered.len() >= VERIFIED_MAX {
            remembered.retain(|_, r| r.fresh());
            if remembered.len() >= VERIFIED_MAX {
                remembered.clear();
            }
        }
        let entry = Remembered {
            identity: verified.identity.clone(),
            expires: verified.expires,
            checked: Instant::now(),
        };
        remembered.insert(digest, entry);
    }

    fn bind(&self, identity: Identity) -> Result<Principal, Status> {
        match self.bindings().role_of(&identity) {
            Some(role) => Ok(Principal { subject: identity.user, role }),
            None => Err(Status::permission_denied(format!(
                "{} (authenticated by {}) has no role: no role binding names it or one of its groups ({}); \
                 ask the store's operator to bind it in the role bindings file",
                identity.user,
                identity.authenticator,
                identity.groups.join(", ")
            ))),
        }
    }

    /// Who the call's token belongs to and which authenticator said so, as
    /// far as is known without verifying it again (for refusal logs).
    pub fn describe(&self, call: &Credentials<'_>) -> Option<(String, &'static str)> {
        if let Ok(Some((identity, _))) = self.certificate_identity(call) {
            return Some((identity.user, identity.authenticator));
        }
        let token = bearer(call.metadata).ok()?;
        if let Some(Ok(principal)) = self.tokens().lookup(token) {
            return Some((principal.subject, TOKENS_FILE));
        }
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let verified = self.verified.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        verified.get(&digest).map(|r| (r.identity.user.clone(), r.identity.authenticator))
    }

    /// When the call's certificate or token expires, if that is known.
    pub fn expires(&self, call: &Credentials<'_>) -> Option<SystemTime> {
        if let Ok(Some((_, expires))) = self.certificate_identity(call) {
            return Some(expires);
        }
        let token = bearer(call.metadata).ok()?;
        if let Some(at) = self.tokens().expires(token) {
            return Some(at);
        }
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let verified = self.verified.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        verified.get(&digest).map(|r| r.expires)
    }

    /// Puts `authenticator` in force and tells open streams to re-check.
    pub fn replace(&self, authenticator: Authenticator) {
        *self.tokens.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(authenticator);
        self.reloads.send_modify(|n| *n += 1);
    }

    /// Puts `bindings` in force and tells open streams to re-check.
    pub fn replace_bindings(&self, bindings: Bindings) {
        *self.bindings.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(bindings);
        self.reloads.send_modify(|n| *n += 1);
    }

    /// Changes on every reload.
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }
}

/// One reloadable file: where, and what it was when last read.
struct Watched {
    path: PathBuf,
    tokens: bool,
    seen: Option<(Option<SystemTime>, u64)>,
}

fn stamp(path: &Path) -> Option<(Option<SystemTime>, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.modified().ok(), m.len()))
}

/// Reloads the tokens and role bindings files of `auth` when they change
/// (checked every second) or on SIGHUP, until `shutdown`. A file that does
/// not parse is logged and what is in force stays.
pub async fn reload_on_change(auth: Arc<Auth>, shutdown: gantry_runtime::Shutdown) {
    let mut files: Vec<Watched> = [(&auth.tokens_path, true), (&auth.bindings_path, false)]
        .into_iter()
        .filter_map(|(path, tokens)| path.clone().map(|path| (path, tokens)))
        .map(|(path, tokens)| Watched { seen: stamp(&path), path, tokens })
        .collect();
    if files.is_empty() {
        return;
    }
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
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
        for file in &mut files {
            let now = stamp(&file.path);
            if !forced && now == file.seen {
                continue;
            }
            file.seen = now;
            reload(&auth, file);
        }
    }
}

fn reload(auth: &Auth, file: &Watched) {
    let path = file.path.display().to_string();
    let text = match std::fs::read(&file.path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => {
            tracing::error!(path, error = %e, "cannot read the file to reload; what is in force stays");
            return;
        }
    };
    if file.tokens {
        match Authenticator::parse_tokens_file(&text) {
            Ok(tokens) => {
                tracing::info!(path, tokens = ?tokens, "tokens file reloaded");
                auth.replace(tokens);
            }
            Err(e) => {
                tracing::error!(path, error = %e, "cannot reload the tokens file; the tokens in force stay");
            }
        }
    } else {
        match Bindings::parse(&text) {
            Ok(bindings) => {
                tracing::info!(path, bindings = bindings.len(), "role bindings reloaded");
                auth.replace_bindings(bindings);
            }
            Err(e) => {
                tracing::error!(path, error = %e, "cannot reload the role bindings; the bindings in force stay");
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
mod tests;

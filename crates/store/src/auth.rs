//! Bearer-token authentication from a static tokens file.
//!
//! The file has the shape of Kubernetes' static token file: one
//! `token,subject,role` line per token; blank lines and lines starting with
//! `#` are ignored. Tokens are never logged; only subjects are.

use std::collections::HashMap;
use std::fmt;

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

/// How requests are authenticated.
#[derive(Clone)]
pub enum Authenticator {
    /// Every request needs a known bearer token.
    Tokens(HashMap<String, Principal>),
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
        let mut tokens = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |reason: &str| TokensFileError { line, reason: reason.to_string() };
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = trimmed.split(',').map(str::trim).collect();
            let [token, subject, role] = fields[..] else {
                return Err(err("expected token,subject,role"));
            };
            if token.len() < 16 {
                return Err(err("token must be at least 16 characters"));
            }
            if subject.is_empty() {
                return Err(err("subject is empty"));
            }
            let role: Role = role.parse().map_err(|e: String| err(&e))?;
            let principal = Principal { subject: subject.to_string(), role };
            if tokens.insert(token.to_string(), principal).is_some() {
                return Err(err("duplicate token"));
            }
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
        let header = metadata.get("authorization").ok_or_else(|| {
            Status::unauthenticated("missing `authorization: Bearer <token>` metadata")
        })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated("authorization metadata must be `Bearer <token>`")
            })?;
        tokens.get(token).cloned().ok_or_else(|| {
            Status::unauthenticated("unknown bearer token; check the token your client sends")
        })
    }
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
    fn debug_hides_tokens() {
        let auth = Authenticator::parse_tokens_file(FILE).unwrap();
        assert!(!format!("{auth:?}").contains("viewer-token"));
    }
}

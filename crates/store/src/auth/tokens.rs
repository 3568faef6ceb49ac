//! The static tokens file: the authenticator for local use, gantry-local
//! and clusters without service-account or OIDC tokens.
//!
//! The file has the shape of Kubernetes' static token file: one
//! `token,subject,role[,expires]` line per token, `expires` an RFC 3339
//! time after which the token is refused; blank lines and lines starting
//! with `#` are ignored. Tokens are never logged; only subjects are. A
//! presented token is compared with every known token in constant time, so
//! response timing does not reveal how much of a guess was right.

use std::fmt;
use std::time::SystemTime;

use gantry_core::Role;
use tonic::Status;

use super::Principal;

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

    /// The principal `token` names: `None` when no line has it (another
    /// authenticator may know it), UNAUTHENTICATED when its line expired.
    pub fn lookup(&self, token: &str) -> Option<Result<Principal, Status>> {
        let Authenticator::Tokens(tokens) = self else {
            return Some(Ok(Principal { subject: "anonymous".into(), role: Role::Admin }));
        };
        // Every entry is compared, whatever matched first.
        let entry = tokens.iter().fold(None, |found, entry| {
            if constant_time_eq(&entry.token, token.as_bytes()) {
                Some(entry)
            } else {
                found
            }
        })?;
        if entry.expires.is_some_and(|e| e <= SystemTime::now()) {
            return Some(Err(Status::unauthenticated(format!(
                "the bearer token of {} has expired; ask the store's operator for a new one",
                entry.principal.subject
            ))));
        }
        Some(Ok(entry.principal.clone()))
    }

    /// When `token`'s line expires, if it has one.
    pub fn expires(&self, token: &str) -> Option<SystemTime> {
        match self {
            Authenticator::Tokens(tokens) => {
                tokens.iter().find(|e| constant_time_eq(&e.token, token.as_bytes()))?.expires
            }
            Authenticator::Unauthenticated => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# gantry tokens\nviewer-token-0123456789,alice,viewer\n\nreconciler-token-0123456,gateway-reconciler,reconciler\n";

    #[test]
    fn parses_and_looks_up() {
        let auth = Authenticator::parse_tokens_file(FILE).unwrap();
        let p = auth.lookup("viewer-token-0123456789").unwrap().unwrap();
        assert_eq!(p, Principal { subject: "alice".into(), role: Role::Viewer });
        for unknown in ["nope-nope-nope-nope", "viewer-token-012345678", ""] {
            assert!(auth.lookup(unknown).is_none(), "{unknown}");
        }
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
        let expired = auth.lookup("old-token-0123456789ab").unwrap().unwrap_err();
        assert_eq!(expired.code(), tonic::Code::Unauthenticated);
        assert!(expired.message().contains("expired"), "{}", expired.message());
        assert!(!expired.message().contains("old-token"), "the message must not echo the token");
        let p = auth.lookup("new-token-0123456789ab").unwrap().unwrap();
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

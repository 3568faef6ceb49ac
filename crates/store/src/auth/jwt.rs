//! JSON Web Tokens from an issuer that publishes its keys as a JWKS (OIDC
//! discovery): a Kubernetes API server for service-account tokens, an OIDC
//! provider for people.
//!
//! A token is accepted only when a key of the issuer's set signed it with
//! the one algorithm that key is for (so neither `alg: none` nor an HMAC
//! made with a public key passes), and its `iss`, `aud`, `exp` and (when
//! present) `nbf` hold. The key set is fetched on first use and again when
//! a token names a key id the set lacks (a rotation), at most once per
//! [`Issuer::refetch_after`], so a stream of made-up key ids costs one fetch
//! per interval, not one per call.

use std::time::{Duration, Instant, SystemTime};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::https::HttpsGet;
use super::Identity;

/// Clock skew allowed on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 30;

/// Where an issuer's discovery document and keys come from.
#[derive(Clone)]
pub enum KeySource {
    /// The API server this store reaches (in-cluster configuration or
    /// KUBECONFIG): `/.well-known/openid-configuration` names the issuer,
    /// `/openid/v1/jwks` holds the keys.
    ApiServer(kube::Client),
    /// An OIDC provider: `{issuer}/.well-known/openid-configuration`
    /// must name `issuer` exactly and gives `jwks_uri`.
    Discovery { issuer: String, https: Box<HttpsGet> },
    /// A fixed issuer and key set (tests of the rules below).
    Fixed { issuer: String, keys: JwkSet },
}

impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::ApiServer(_) => f.write_str("ApiServer"),
            KeySource::Discovery { issuer, .. } => write!(f, "Discovery({issuer})"),
            KeySource::Fixed { issuer, .. } => write!(f, "Fixed({issuer})"),
        }
    }
}

impl KeySource {
    /// The issuer's name when it is known without a fetch.
    fn known_issuer(&self) -> Option<&str> {
        match self {
            KeySource::ApiServer(_) => None,
            KeySource::Discovery { issuer, .. } | KeySource::Fixed { issuer, .. } => Some(issuer),
        }
    }

    /// The issuer's name (`iss`) and its current keys.
    async fn fetch(&self) -> Result<(String, JwkSet), String> {
        match self {
            KeySource::Fixed { issuer, keys } => Ok((issuer.clone(), keys.clone())),
            KeySource::Discovery { issuer, https } => {
                let url =
                    format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
                let discovery = https.json(&url).await?;
                let named = discovery["issuer"].as_str().unwrap_or_default();
                if named != issuer {
                    return Err(format!(
                        "the discovery document names the issuer {named:?}, not {issuer:?}"
                    ));
                }
                let jwks_uri = discovery["jwks_uri"]
                    .as_str()
                    .ok_or("the discovery document names no jwks_uri")?;
                let keys = serde_json::from_value(https.json(jwks_uri).await?)
                    .map_err(|e| format!("the key set does not parse: {e}"))?;
                Ok((issuer.clone(), keys))
            }
            KeySource::ApiServer(client) => {
                let get = |path: &'static str| async move {
                    let request =
                        http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
                    client.request_text(request).await.map_err(|e| format!("GET {path}: {e}"))
                };
                let discovery = get("/.well-known/openid-configuration").await?;
                let discovery: serde_json::Value = serde_json::from_str(&discovery)
                    .map_err(|e| format!("the discovery document does not parse: {e}"))?;
                let issuer = discovery["issuer"]
                    .as_str()
                    .ok_or("the discovery document names no issuer")?
                    .to_string();
                let keys = get("/openid/v1/jwks").await?;
                let keys = serde_json::from_str(&keys)
                    .map_err(|e| format!("the key set does not parse: {e}"))?;
                Ok((issuer, keys))
            }
        }
    }
}

/// How a verified token's claims name the caller.
#[derive(Debug, Clone)]
pub enum ClaimMapping {
    /// A Kubernetes service-account token: `sub` is
    /// `system:serviceaccount:NAMESPACE:NAME`; the groups are the ones the
    /// API server gives service accounts.
    ServiceAccount,
    /// An OIDC provider's token, with kube-apiserver's `--oidc-*` rules:
    /// the user is `username_prefix` + the `username_claim`, the groups
    /// `groups_prefix` + each value of the `groups_claim`. Names starting
    /// `system:` are refused: those are the cluster's own.
    Oidc {
        username_claim: String,
        username_prefix: String,
        groups_claim: Option<String>,
        groups_prefix: String,
    },
}

impl ClaimMapping {
    fn identity(
        &self,
        claims: &serde_json::Value,
        authenticator: &'static str,
    ) -> Result<Identity, String> {
        match self {
            ClaimMapping::ServiceAccount => {
                let sub = claims["sub"].as_str().unwrap_or_default();
                let namespace = sub
                    .strip_prefix("system:serviceaccount:")
                    .and_then(|rest| rest.split_once(':'))
                    .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
                    .map(|(ns, _)| ns)
                    .ok_or_else(|| format!("subject {sub:?} is not a service account"))?;
                Ok(Identity {
                    user: sub.to_string(),
                    groups: vec![
                        "system:serviceaccounts".into(),
                        format!("system:serviceaccounts:{namespace}"),
                        "system:authenticated".into(),
                    ],
                    authenticator,
                })
            }
            ClaimMapping::Oidc { username_claim, username_prefix, groups_claim, groups_prefix } => {
                let name = claims[username_claim.as_str()]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| format!("the token has no {username_claim} claim"))?;
                if username_claim == "email" && claims["email_verified"] == false {
                    return Err("the token's email is not verified".into());
                }
                let user = format!("{username_prefix}{name}");
                let mut groups = match groups_claim.as_deref().map(|c| &claims[c]) {
                    None | Some(serde_json::Value::Null) => Vec::new(),
                    Some(serde_json::Value::String(g)) => vec![format!("{groups_prefix}{g}")],
                    Some(serde_json::Value::Array(values)) => values
                        .iter()
                        .map(|g| g.as_str().map(|g| format!("{groups_prefix}{g}")))
                        .collect::<Option<Vec<_>>>()
                        .ok_or("the token's groups are not all strings")?,
                    Some(_) => {
                        return Err("the token's groups claim is not a list of strings".into())
                    }
                };
                if let Some(reserved) =
                    std::iter::once(&user).chain(&groups).find(|n| n.starts_with("system:"))
                {
                    return Err(format!("{reserved:?} is a name reserved to the cluster"));
                }
                groups.push("system:authenticated".into());
                Ok(Identity { user, groups, authenticator })
            }
        }
    }
}

/// The keys in force and when they were fetched.
#[derive(Debug)]
struct Keys {
    issuer: String,
    set: JwkSet,
    fetched: Instant,
}

/// One issuer whose tokens are accepted.
#[derive(Debug)]
pub struct Issuer {
    /// The authenticator's name in logs and refusals.
    pub authenticator: &'static str,
    audiences: Vec<String>,
    source: KeySource,
    claims: ClaimMapping,
    keys: tokio::sync::Mutex<Option<Keys>>,
    /// The shortest time between two fetches of the key set.
    pub refetch_after: Duration,
}

/// A verified token: who, and until when.
#[derive(Debug, Clone)]
pub struct Verified {
    pub identity: Identity,
    pub expires: SystemTime,
}

impl Issuer {
    pub fn new(
        authenticator: &'static str,
        source: KeySource,
        audiences: Vec<String>,
        claims: ClaimMapping,
    ) -> Self {
        Self {
            authenticator,
            audiences,
            source,
            claims,
            keys: tokio::sync::Mutex::new(None),
            refetch_after: Duration::from_secs(10),
        }
    }

    /// Fetches the key set now (at start, so that a misconfiguration is
    /// logged before the first caller meets it).
    pub async fn refresh(&self) -> Result<(), String> {
        let mut keys = self.keys.lock().await;
        self.fetch_into(&mut keys).await
    }

    async fn fetch_into(&self, keys: &mut Option<Keys>) -> Result<(), String> {
        let (issuer, set) = self.source.fetch().await?;
        tracing::info!(
            authenticator = self.authenticator,
            issuer,
            keys = set.keys.len(),
            "issuer keys fetched"
        );
        *keys = Some(Keys { issuer, set, fetched: Instant::now() });
        Ok(())
    }

    /// Whether this issuer is the one a token's (unverified) `iss` names
    /// (the API server's is learnt from its first fetch).
    pub async fn issues(&self, iss: &str) -> bool {
        if let Some(known) = self.source.known_issuer() {
            return known == iss;
        }
        let mut keys = self.keys.lock().await;
        if keys.is_none() {
            if let Err(e) = self.fetch_into(&mut keys).await {
                tracing::warn!(authenticator = self.authenticator, error = %e, "cannot fetch the issuer's keys");
            }
        }
        keys.as_ref().is_some_and(|k| k.issuer == iss)
    }

    /// The key that `kid` names, fetching the set again if it lacks it and
    /// the last fetch is old enough.
    async fn key(&self, kid: Option<&str>) -> Result<(String, Jwk), String> {
        let mut keys = self.keys.lock().await;
        let find = |keys: &Option<Keys>| {
            let keys = keys.as_ref()?;
            let jwk = match kid {
                Some(kid) => keys.set.find(kid),
                // No key id: only unambiguous with a single key.
                None if keys.set.keys.len() == 1 => keys.set.keys.first(),
                None => None,
            };
            jwk.map(|jwk| (keys.issuer.clone(), jwk.clone()))
        };
        if let Some(found) = find(&keys) {
            return Ok(found);
        }
        let stale = keys.as_ref().is_none_or(|k| k.fetched.elapsed() >= self.refetch_after);
        if stale {
            self.fetch_into(&mut keys)
                .await
                .map_err(|e| format!("cannot fetch the issuer's keys: {e}"))?;
            if let Some(found) = find(&keys) {
                return Ok(found);
            }
        }
        Err(match kid {
            Some(kid) => format!("no key {kid:?} in the issuer's key set"),
            None => "the token names no key id (kid) and the issuer has several keys".into(),
        })
    }

    /// Verifies `token`: its identity and expiry, or why it is refused.
    pub async fn verify(&self, token: &str) -> Result<Verified, String> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| format!("malformed token: {e}"))?;
        let (issuer, jwk) = self.key(header.kid.as_deref()).await?;
        let (algorithm, key) = decoding_key(&jwk)?;
        if header.alg != algorithm {
            return Err(format!(
                "algorithm {:?} is not the one its key is for ({algorithm:?})",
                header.alg
            ));
        }
        let mut validation = Validation::new(algorithm);
        validation.set_issuer(&[&issuer]);
        validation.set_audience(&self.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECONDS;
        let data = jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
            .map_err(|e| refusal(&e, &self.audiences))?;
        let exp = data.claims["exp"].as_u64().ok_or("exp is not a number of seconds")?;
        let expires = SystemTime::UNIX_EPOCH + Duration::from_secs(exp);
        let identity = self.claims.identity(&data.claims, self.authenticator)?;
        Ok(Verified { identity, expires })
    }
}

/// The one algorithm a published key is for, and the key. Symmetric keys
/// are never taken from a key set.
fn decoding_key(jwk: &Jwk) -> Result<(Algorithm, DecodingKey), String> {
    let algorithm = match &jwk.algorithm {
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return Err(format!("unsupported curve {:?}", p.curve)),
        },
        AlgorithmParameters::RSA(_) => match jwk.common.key_algorithm.map(|a| a.to_string()) {
            Some(named) => {
                named.parse().map_err(|_| format!("unsupported key algorithm {named}"))?
            }
            None => Algorithm::RS256,
        },
        AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
        // Symmetric keys, and kinds this version does not know.
        _ => return Err("the issuer's key is not a public signing key".into()),
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("unusable key: {e}"))?;
    Ok((algorithm, key))
}

/// A verification failure in words an operator can act on.
fn refusal(error: &jsonwebtoken::errors::Error, audiences: &[String]) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match error.kind() {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => {
            format!("the token's audience is not {}", audiences.join(" or "))
        }
        ErrorKind::InvalidIssuer => "the token's issuer is not the one expected".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("the token has no {claim} claim"),
        ErrorKind::InvalidClaimFormat(claim) => format!("the token's {claim} claim is malformed"),
        other => format!("the token is invalid: {other:?}"),
    }
}

/// The unverified `iss` of a token shaped like a JWT (three base64url
/// parts), to pick the issuer that must verify it.
pub fn unverified_issuer(token: &str) -> Option<String> {
    if token.split('.').count() != 3 {
        return None;
    }
    let claims: serde_json::Value = jsonwebtoken::dangerous::insecure_decode_claims(token).ok()?;
    claims["iss"].as_str().map(str::to_string)
}

//! Signed JSON Web Tokens for tests of the store's authenticators: a P-256
//! key (made here, or an issuer's own from its PEM), its JWK, and tokens it
//! signs (ES256, with its `kid`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};

/// A P-256 signing key and the key id it signs under.
pub struct Signer {
    pub key: rcgen::KeyPair,
    pub kid: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("kid", &self.kid).finish_non_exhaustive()
    }
}

impl Signer {
    /// A new key.
    pub fn new(kid: &str) -> Self {
        Self { key: rcgen::KeyPair::generate().expect("a P-256 key"), kid: kid.into() }
    }

    /// An existing P-256 key in PEM (PKCS#8), such as a control plane's
    /// service-account signing key.
    pub fn from_pem(pem: &str, kid: &str) -> Self {
        Self { key: rcgen::KeyPair::from_pem(pem).expect("a PEM key"), kid: kid.into() }
    }

    /// The public key as a JWK (what a JWKS lists).
    pub fn jwk(&self) -> serde_json::Value {
        let point = self.key.public_key_raw();
        serde_json::json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        })
    }

    /// `claims` signed with ES256 under this key's id.
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        let key = EncodingKey::from_ec_der(&self.key.serialize_der());
        jsonwebtoken::encode(&header, claims, &key).expect("sign")
    }
}

/// Seconds since the epoch, as JWT times are written.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The claims of a person's ID token from `issuer` for the client
/// `audience`: `email` (verified) and `groups`, valid over `valid` (JWT
/// times, see [`now`]).
pub fn person(
    issuer: &str,
    audience: &str,
    email: &str,
    groups: &[&str],
    valid: std::ops::Range<u64>,
) -> serde_json::Value {
    serde_json::json!({
        "iss": issuer, "aud": audience, "sub": format!("id-{email}"), "email": email,
        "email_verified": true, "groups": groups,
        "iat": valid.start, "nbf": valid.start, "exp": valid.end,
    })
}

/// The `kid` in a token's header.
pub fn kid_of(token: &str) -> Option<String> {
    jsonwebtoken::decode_header(token).ok()?.kid
}

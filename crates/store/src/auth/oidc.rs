//! OpenID Connect tokens for people, with kube-apiserver's flags and rules:
//! the provider's discovery document and keys fetched over HTTPS (its CA
//! from `--oidc-ca-file`), the audience `--oidc-client-id`, the user from
//! `--oidc-username-claim` (prefixed with the issuer URL and `#` unless the
//! claim is `email` or a prefix is given; `-` for none) and the groups from
//! `--oidc-groups-claim` with `--oidc-groups-prefix`.

use super::https::HttpsGet;
use super::jwt::{ClaimMapping, Issuer, KeySource};

/// The authenticator's name in logs and refusals.
pub const AUTHENTICATOR: &str = "oidc";

/// What the `--oidc-*` flags say.
#[derive(Debug, Clone)]
pub struct OidcSettings {
    pub issuer_url: String,
    pub client_id: String,
    pub ca_pem: Option<Vec<u8>>,
    pub username_claim: String,
    pub username_prefix: Option<String>,
    pub groups_claim: Option<String>,
    pub groups_prefix: String,
}

/// The issuer the settings describe.
pub fn issuer(settings: &OidcSettings) -> Result<Issuer, String> {
    if !settings.issuer_url.starts_with("https://") {
        return Err(format!("--oidc-issuer-url {} is not an https URL", settings.issuer_url));
    }
    if settings.client_id.is_empty() {
        return Err("--oidc-client-id is empty".into());
    }
    let https = HttpsGet::new(settings.ca_pem.as_deref())?;
    let claims = ClaimMapping::Oidc {
        username_claim: settings.username_claim.clone(),
        username_prefix: username_prefix(settings),
        groups_claim: settings.groups_claim.clone(),
        groups_prefix: settings.groups_prefix.clone(),
    };
    let source =
        KeySource::Discovery { issuer: settings.issuer_url.clone(), https: Box::new(https) };
    Ok(Issuer::new(AUTHENTICATOR, source, vec![settings.client_id.clone()], claims))
}

/// kube-apiserver's default: users other than emails are prefixed with the
/// issuer URL and `#`, so that they cannot pose as another authenticator's.
fn username_prefix(settings: &OidcSettings) -> String {
    match settings.username_prefix.as_deref() {
        Some("-") => String::new(),
        Some(prefix) => prefix.to_string(),
        None if settings.username_claim == "email" => String::new(),
        None => format!("{}#", settings.issuer_url),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(claim: &str, prefix: Option<&str>) -> OidcSettings {
        OidcSettings {
            issuer_url: "https://idp.example".into(),
            client_id: "gantry".into(),
            ca_pem: None,
            username_claim: claim.into(),
            username_prefix: prefix.map(str::to_string),
            groups_claim: None,
            groups_prefix: String::new(),
        }
    }

    #[test]
    fn usernames_are_prefixed_as_kube_apiserver_prefixes_them() {
        assert_eq!(username_prefix(&settings("sub", None)), "https://idp.example#");
        assert_eq!(username_prefix(&settings("email", None)), "");
        assert_eq!(username_prefix(&settings("sub", Some("-"))), "");
        assert_eq!(username_prefix(&settings("sub", Some("oidc:"))), "oidc:");
    }

    #[test]
    fn only_https_issuers_with_a_client_id() {
        let mut plain = settings("sub", None);
        plain.issuer_url = "http://idp.example".into();
        assert!(issuer(&plain).unwrap_err().contains("https"));
        let mut no_client = settings("sub", None);
        no_client.client_id = String::new();
        assert!(issuer(&no_client).unwrap_err().contains("client-id"));
    }
}

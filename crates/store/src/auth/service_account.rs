//! Kubernetes service-account tokens, as Vault's Kubernetes auth and the
//! API server itself take them: verified offline against the issuer's keys
//! that the API server publishes ([`super::jwt`], audience `gantry` by
//! default), and, with `--service-account-token-review`, checked online by a
//! TokenReview so that the token of a deleted pod or account stops working
//! before it expires.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};

use super::jwt::{ClaimMapping, Issuer, KeySource};

/// The authenticator's name in logs and refusals.
pub const AUTHENTICATOR: &str = "service-account";

/// The issuer of the service-account tokens of the cluster `client` reaches.
pub fn issuer(client: kube::Client, audience: String) -> Issuer {
    Issuer::new(
        AUTHENTICATOR,
        KeySource::ApiServer(client),
        vec![audience],
        ClaimMapping::ServiceAccount,
    )
}

/// Checks tokens with the API server (TokenReview). The store's service
/// account needs `create` on `tokenreviews` (the `system:auth-delegator`
/// ClusterRole).
#[derive(Clone)]
pub struct TokenReviewer {
    client: kube::Client,
    audience: String,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer").field("audience", &self.audience).finish_non_exhaustive()
    }
}

/// Why a review did not accept a token.
#[derive(Debug)]
pub enum ReviewRefusal {
    /// The API server says the token is not (or no longer) valid.
    Refused(String),
    /// The API server could not be asked.
    Unreachable(String),
}

impl TokenReviewer {
    pub fn new(client: kube::Client, audience: String) -> Self {
        Self { client, audience }
    }

    /// `Ok` when the API server still accepts `token` as `user`.
    pub async fn review(&self, token: &str, user: &str) -> Result<(), ReviewRefusal> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let answer = api.create(&PostParams::default(), &review).await.map_err(|e| {
            let hint = match &e {
                kube::Error::Api(status) if status.code == 403 => {
                    ": grant the store's service account the system:auth-delegator ClusterRole"
                }
                _ => "",
            };
            ReviewRefusal::Unreachable(format!("TokenReview failed: {e}{hint}"))
        })?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let error = status.error.unwrap_or_else(|| "not authenticated".into());
            return Err(ReviewRefusal::Refused(format!(
                "the API server no longer accepts the token ({error})"
            )));
        }
        let reviewed = status.user.and_then(|u| u.username).unwrap_or_default();
        if reviewed != user {
            return Err(ReviewRefusal::Refused(format!(
                "the API server says the token is {reviewed:?}, not {user:?}"
            )));
        }
        Ok(())
    }
}

//! Why the store could not start, or stopped with an error.

use crate::auth;
use crate::storage::StorageError;

/// Why the store could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot read {what} {path}: {source}")]
    ReadFile { what: &'static str, path: String, source: std::io::Error },
    #[error(transparent)]
    Tokens(#[from] auth::TokensFileError),
    #[error(transparent)]
    Bindings(#[from] auth::BindingsFileError),
    #[error(
        "no authenticator configured: refusing to serve without authentication; pass --tokens-file, --service-account-tokens or --oidc-issuer-url, or --allow-unauthenticated for local development"
    )]
    NoAuthentication,
    #[error("--service-account-tokens: cannot reach the Kubernetes API server (in-cluster configuration or KUBECONFIG): {0}")]
    Kube(String),
    #[error("--oidc-issuer-url: {0}")]
    Oidc(String),
    #[error("cannot open the database: {0}")]
    Storage(#[from] StorageError),
    #[error("cannot create the data directory {path}: {source}")]
    DataDir { path: String, source: std::io::Error },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("cannot start the {thread} thread: {source}")]
    Thread { thread: &'static str, source: std::io::Error },
}

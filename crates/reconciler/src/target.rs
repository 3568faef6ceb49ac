//! Where manifests go: one trait, two targets.
//!
//! - [`kube::KubeTarget`]: server-side apply with one field manager, prune
//!   of labelled objects no longer rendered, rollout observation.
//! - [`directory::DirectoryTarget`]: `<dir>/<gateway>/<kind>.yaml`, each
//!   written atomically; the embedded default, usable as a GitOps source.

pub mod directory;
pub mod kube;

use futures_util::stream::BoxStream;
use serde_json::Value;

use crate::render::Rendered;
use crate::status::Observation;

/// A target call that failed; the message is what status reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TargetError(pub String);

/// A place manifests are applied to.
#[tonic::async_trait]
pub trait Target: Send + Sync + std::fmt::Debug + 'static {
    /// Applies every manifest of `gateway` and removes its objects that are
    /// no longer rendered. Safe to repeat; repairs a partial earlier apply.
    async fn apply(&self, gateway: &str, manifests: &[Value]) -> Result<(), TargetError>;

    /// Reports the rollout and whether anything drifted from `rendered`.
    async fn observe(&self, gateway: &str, rendered: &Rendered)
        -> Result<Observation, TargetError>;

    /// Deletes everything `gateway` owns; `true` once it is all gone.
    async fn delete(&self, gateway: &str) -> Result<bool, TargetError>;

    /// Names of gateways whose owned objects changed, if the target can
    /// watch them (the reconciler re-checks those gateways).
    fn watch_owned(&self) -> Option<BoxStream<'static, String>> {
        None
    }

    /// `kube` or `directory`, for logs and metrics.
    fn name(&self) -> &'static str;
}

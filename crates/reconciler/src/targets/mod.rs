//! Where manifests go: one trait, two targets.
//!
//! - [`kube::KubeTarget`]: server-side apply with one field manager, prune
//!   of labelled objects no longer rendered, rollout observation.
//! - [`directory::DirectoryTarget`]: `<dir>/<gateway>/<kind>.yaml`, each
//!   written atomically; the embedded default, usable as a GitOps source.

pub mod directory;
pub mod kube;

use crate::render::Rendered;
use crate::status::Observation;
use futures_util::stream::BoxStream;

/// The gateway a target call is for: objects are marked with both, and
/// only objects marked with this uid are changed or deleted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Owner {
    pub name: String,
    pub uid: String,
    /// The gateway opted in to replacing an object whose immutable field
    /// differs ([`RECREATE_ANNOTATION`]).
    pub recreate: bool,
}

/// Annotation by which a gateway opts in to having a rollout that exceeds
/// its progress deadline rolled back (`"true"`; `--rollback-on-failure`
/// for every gateway).
pub const ROLLBACK_ANNOTATION: &str = "gantry.dev/rollback-on-failure";

/// Annotation by which a gateway opts in to having an object replaced when
/// a field that cannot change on a live object differs (`"true"`).
pub const RECREATE_ANNOTATION: &str = "gantry.dev/recreate-on-immutable";

impl Owner {
    pub fn of(meta: &gantry_api::v1::ObjectMeta) -> Self {
        let recreate = meta.annotations.get(RECREATE_ANNOTATION).is_some_and(|v| v == "true");
        Self { name: meta.name.clone(), uid: meta.uid.clone(), recreate }
    }
}

/// A target call that failed; its text is what status reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// An object in the way is not this gateway's (Helm's check).
    #[error("{kind} {name} exists and is not managed by this gateway; rename or remove it, or give gateways their own namespace")]
    NotOurs { kind: String, name: String },
    /// A call was refused or failed: `what` (such as "apply Deployment
    /// edge") and why; `reason` is the API server's (`Forbidden`,
    /// `Invalid`, ...; empty when it gave none).
    #[error("{what}: {message}")]
    Call { what: String, message: String, reason: String },
    /// A call got no answer within `after`.
    #[error("{}no answer within {after:?}", prefix(what))]
    Timeout { what: String, after: std::time::Duration },
    /// A write stopped before it was sent: this replica's leadership
    /// lapsed.
    #[error("{what}: stopped, this replica's leadership has lapsed")]
    Fenced { what: String },
    /// The cluster refused to change a field that cannot change on a live
    /// object, and nothing was replaced (no opt-in).
    #[error("{kind} {name}: {field} cannot change on the live object ({detail}); nothing was changed, so its pods keep serving. To replace it (a Deployment's new pods become available before the old ones go), annotate the gateway {RECREATE_ANNOTATION}=true or run the reconciler with --recreate-on-immutable, or delete the {kind} yourself")]
    Immutable { kind: String, name: String, field: String, detail: String },
    /// Anything else (the directory target's files, a scripted failure).
    #[error("{0}")]
    Other(String),
}

impl TargetError {
    /// A one-word reason for a condition: the API server's when it gave
    /// one.
    pub fn reason(&self) -> &str {
        match self {
            TargetError::Call { reason, .. } if !reason.is_empty() => reason,
            TargetError::Call { .. } | TargetError::Other(_) => "CallFailed",
            TargetError::NotOurs { .. } => "NotOwned",
            TargetError::Timeout { .. } => "Timeout",
            TargetError::Fenced { .. } => "NotLeader",
            TargetError::Immutable { .. } => "FieldImmutable",
        }
    }
}

/// `what: `, or nothing when there is no `what`.
fn prefix(what: &str) -> String {
    if what.is_empty() {
        String::new()
    } else {
        format!("{what}: ")
    }
}

/// A place manifests are applied to.
#[tonic::async_trait]
pub trait Target: Send + Sync + std::fmt::Debug + 'static {
    /// Applies every manifest of `gateway` and removes its objects that are
    /// no longer rendered. Safe to repeat; repairs a partial earlier apply.
    async fn apply(&self, owner: &Owner, rendered: &Rendered) -> Result<(), TargetError>;

    /// Puts back the pod template that served before the current rollout
    /// (the newest earlier one with available pods, as `kubectl rollout
    /// undo` does); the generation whose rendering it was. `None`: nothing
    /// to roll back to (or a target that runs nothing).
    async fn roll_back(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<Option<i64>, TargetError> {
        let _ = (owner, rendered);
        Ok(None)
    }

    /// Reports the rollout and whether anything drifted from `rendered`.
    async fn observe(&self, owner: &Owner, rendered: &Rendered)
        -> Result<Observation, TargetError>;

    /// Deletes everything `owner` owns (objects marked with its uid);
    /// `true` once it is all gone.
    async fn delete(&self, owner: &Owner) -> Result<bool, TargetError>;

    /// Names of gateways whose owned objects changed, if the target can
    /// watch them (the reconciler re-checks those gateways).
    fn watch_owned(&self) -> Option<BoxStream<'static, String>> {
        None
    }

    /// Kinds whose watch has not listed yet (none for a target without
    /// watches). Passes wait for all of them: judged before, every
    /// converged gateway would read as "waiting" and its status flap.
    fn unsynced(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Whether this process may write now (false once a leader's tenure
    /// lapsed): a refused write is then not an apply failure.
    fn may_write(&self) -> bool {
        true
    }

    /// `kube` or `directory`, for logs and metrics.
    fn name(&self) -> &'static str;
}

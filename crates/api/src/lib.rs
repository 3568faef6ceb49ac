//! The gantry wire contract: prost messages and tonic client and server code
//! generated from `proto/gantry/v1/gateway.proto`.
//!
//! Maps are `BTreeMap`s so that equal objects encode to equal bytes and
//! compare equal regardless of insertion order.

#![forbid(unsafe_code)]
#![allow(missing_docs, missing_debug_implementations, clippy::all)]

pub mod codec;
mod list_response;
mod watch_event;

/// Version 1 of the gantry API.
pub mod v1 {
    tonic::include_proto!("gantry.v1");
    pub use crate::list_response::ListGatewaysResponse;
    pub use crate::watch_event::WatchEvent;

    /// Encoded `FileDescriptorSet` of the API, served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("gantry_descriptor");
}

pub use prost_types;

/// Response metadata (a header) on every answer of gateway-store: its
/// version, for `gatewayctl version`.
pub const VERSION_HEADER: &str = "gantry-server-version";

/// Annotation holding the W3C `traceparent` of the request that made a
/// gateway's current generation: written by the store, read by the
/// reconciler, whose pass for that generation continues the trace. Absent
/// when that request carried no sampled trace.
pub const TRACE_ANNOTATION: &str = "gantry.dev/traceparent";

/// Annotation `gatewayctl retry` sets to a fresh timestamp: the reconciler
/// resets a gateway's retry budget whenever its value changes.
pub const RETRY_ANNOTATION: &str = "gantry.dev/retry-requested-at";

/// Annotation holding the manifest `gatewayctl apply` last applied (JSON),
/// as kubectl's `kubectl.kubernetes.io/last-applied-configuration`: the
/// next apply removes what the file dropped since and keeps what others set.
pub const LAST_APPLIED_ANNOTATION: &str = "gantry.dev/last-applied-configuration";

/// The provisioning steps of a gateway's status, named once for the
/// reconciler that writes them, the store's rules and every reader.
pub mod steps {
    /// The manifests of the observed generation were applied (forward
    /// only within a generation).
    pub const MANIFESTS_APPLIED: &str = "ManifestsApplied";
    /// The workload is rolled out and available (observed live).
    pub const WORKLOAD_AVAILABLE: &str = "WorkloadAvailable";
    /// An ingress controller published the route's address (observed live).
    pub const ROUTE_ADMITTED: &str = "RouteAdmitted";
    /// Steps that report what is live now: they follow it, back too (a
    /// re-rollout at the same generation, an address withdrawn).
    pub const OBSERVED: [&str; 2] = [WORKLOAD_AVAILABLE, ROUTE_ADMITTED];
}

/// `google.rpc.ErrorInfo` of gantry's errors: the domain and the reasons a
/// client acts on. Named here once for the store and every client.
pub mod reasons {
    /// `ErrorInfo.domain` of every gantry error.
    pub const ERROR_DOMAIN: &str = "gantry.dev";
    /// OUT_OF_RANGE: the revision asked for (to watch from, or of a page
    /// token) is older than the retained history: relist, then watch from
    /// the listed revision.
    pub const REVISION_COMPACTED: &str = "REVISION_COMPACTED";
    /// OUT_OF_RANGE: a revision the store has not reached (of another
    /// store, or of this one before a restore): relist. etcd answers
    /// "required revision is a future revision".
    pub const REVISION_FUTURE: &str = "REVISION_FUTURE";
    /// RESOURCE_EXHAUSTED: a watcher fell behind its budget: resume.
    pub const WATCHER_TOO_SLOW: &str = "WATCHER_TOO_SLOW";
    /// RESOURCE_EXHAUSTED: the caller holds the most watches one identity
    /// may: close one, or retry after the RetryInfo delay.
    pub const TOO_MANY_WATCHES: &str = "TOO_MANY_WATCHES";
    /// RESOURCE_EXHAUSTED: the caller's queue at its priority level is
    /// full, or its call waited too long for a seat: retry after the
    /// RetryInfo delay.
    pub const TOO_MANY_REQUESTS: &str = "TOO_MANY_REQUESTS";
    /// UNAVAILABLE: the store is shutting down: resume elsewhere.
    pub const STORE_SHUTTING_DOWN: &str = "STORE_SHUTTING_DOWN";
    /// UNAVAILABLE: the commit was sent and failed on the way; it may have
    /// committed (read back before retrying).
    pub const COMMIT_OUTCOME_UNKNOWN: &str = "COMMIT_OUTCOME_UNKNOWN";
    /// UNAVAILABLE: nothing was written; retrying is safe.
    pub const NOT_COMMITTED: &str = "NOT_COMMITTED";
}

//! The watch: every committed change after a revision, to any number of
//! subscribers, in revision order, with no gaps and no duplicates.
//!
//! ```text
//! writer (this replica's commits) ─┐
//! tailer (events table: others') ──┴─► hub (byte-bounded cache) ─► stream (one per subscriber)
//! compactor: trims the events table to the retention
//! budget: the database pages one identity's streams hold
//! ```
//!
//! Layer: under the gRPC edge (which turns a [`stream::WatchEnd`] into a
//! status), over storage. Nothing here builds a `tonic::Status`.

pub mod budget;
pub mod compactor;
pub mod filter;
pub mod hub;
pub mod stream;
pub mod tailer;

//! The gantry wire contract: prost messages and tonic client and server code
//! generated from `proto/gantry/v1/gateway.proto`.
//!
//! Maps are `BTreeMap`s so that equal objects encode to equal bytes and
//! compare equal regardless of insertion order.

#![forbid(unsafe_code)]
#![allow(missing_docs, missing_debug_implementations, clippy::all)]

pub mod codec;
mod watch_event;

/// Version 1 of the gantry API.
pub mod v1 {
    tonic::include_proto!("gantry.v1");
    pub use crate::watch_event::WatchEvent;

    /// Encoded `FileDescriptorSet` of the API, served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("gantry_descriptor");
}

pub use prost_types;

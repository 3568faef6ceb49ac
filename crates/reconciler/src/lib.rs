//! gateway-reconciler.
#![forbid(unsafe_code)]

pub mod queue;
pub mod render;
pub mod status;
pub mod target;

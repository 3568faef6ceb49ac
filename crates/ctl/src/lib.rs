//! gatewayctl: the command line for gantry, in the spirit of kubectl.
//!
//! Each command is a function over a connected client that writes to a
//! given output, so tests run them directly; `main.rs` only parses flags,
//! resolves the context and turns errors into plain messages and exit codes.

#![forbid(unsafe_code)]

pub mod args;
pub mod cli;
pub mod commands;
pub mod completion;
pub mod config;
mod credential;
pub mod ctl;
pub mod errors;
pub mod local;
pub mod merge;
pub mod output;
pub mod patch;
mod read;
pub mod template;
mod write;

pub use gantry_client::manifest;

pub use args::{gateway_name, Condition, LabelChange, RESOURCE_TYPES};
pub use ctl::{for_each, Ctl};
pub use errors::{explain, CtlError};
pub use read::DESCRIBE_EVENTS;
pub use write::{EditOutcome, KeyMap, Verdict, EDIT_HEADER, RETRY_ANNOTATION};

//! gantry's testkit, shared by every crate's tests and the benchmarks:
//! locate (building if needed) the workspace's binaries and run them as
//! processes ([`StoreProcess`], [`ReconcilerProcess`]), temporary SQLite
//! and PostgreSQL databases ([`TestDatabase`]), a real Kubernetes control plane
//! ([`k8s`]), a [`Gateway`](gateway::GatewayBuilder) builder, bounded waits
//! on a condition ([`eventually`]), free ports and HTTP probes.

#![forbid(unsafe_code)]

pub mod admission;
pub mod backup;
pub mod calls;
pub mod certs;
pub mod cluster;
pub mod ctl;
pub mod db;
pub mod env;
pub mod gateway;
pub mod http;
pub mod jwt;
pub mod k8s;
pub mod linearizability;
pub mod load;
pub mod node;
pub mod oidc;
pub mod process;
pub mod raw_grpc;
pub mod rig;
mod services;
pub mod wait;

pub use calls::{replay_creations, wait_for_gateway, Gateways};
pub use certs::{server_certificate, TestCa};
pub use db::{Backend, TestDatabase};
pub use env::{
    binary, free_port, in_ci, kill_after, replace_file, skipped, temp_dir, without_test_cargo_env,
    workspace_root,
};
pub use http::{fetch, http_get, wait_for_http, wait_ready};
pub use process::Process;
pub use rig::StoreRig;
pub use services::{ReconcilerProcess, StoreProcess};
pub use wait::{eventually, eventually_blocking, eventually_some};

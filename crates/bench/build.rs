//! Compiles the etcd API subset in `proto/etcd.proto` (client only) with
//! protox, as gantry-api does for gantry's own API.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("proto");
    let file = root.join("etcd.proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let fds = protox::compile([&file], [&root])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_well_known_types(false)
        .compile_fds(fds)?;
    Ok(())
}

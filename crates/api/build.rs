//! Compiles `proto/gantry/v1/*.proto` with protox (pure Rust, no system
//! `protoc`) and generates prost messages and tonic client and server code.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = proto_root.join("gantry/v1/gateway.proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());

    let fds = protox::compile([&file], [&proto_root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("gantry_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;

    tonic_prost_build::configure()
        .btree_map(".")
        .compile_well_known_types(false)
        .codec_path("crate::codec::StrictCodec")
        // Hand-written (src/watch_event.rs): it can carry a pre-encoded gateway.
        .extern_path(".gantry.v1.WatchEvent", "crate::watch_event::WatchEvent")
        // Hand-written (src/list_response.rs): it can carry pre-encoded gateways.
        .extern_path(
            ".gantry.v1.ListGatewaysResponse",
            "crate::list_response::ListGatewaysResponse",
        )
        .compile_fds(fds)?;
    Ok(())
}

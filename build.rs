//! Compiles proto/ without a system protoc: protox parses the files, the
//! descriptor set is kept for gRPC reflection and JSON codecs, and
//! tonic-prost-build generates the Rust types and service code. etcd's API
//! (clients only) is compiled on its own, outside that descriptor set.
use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/felixbackend.proto", "proto/vxmgr.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("vxmgr_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    // Type names let the JSON codecs find each message's descriptor.
    let mut config = tonic_prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure().compile_fds_with_config(descriptors, config)?;

    let etcd = "proto/etcd.proto";
    println!("cargo:rerun-if-changed={etcd}");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(protox::compile([etcd], ["proto"])?)?;
    Ok(())
}

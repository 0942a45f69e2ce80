//! Compiles proto/ without a system protoc: protox parses the files, the
//! descriptor set is kept for gRPC reflection and JSON codecs, and
//! tonic-prost-build generates the Rust types and the client. The server
//! side of `vxmgr.v1.Dataplane` is generated from the description below,
//! so that Sync's requests keep the bytes they arrived as (a record is a
//! faithful capture); it must list the methods of proto/vxmgr.proto.
//! etcd's API (clients only, for calc-flannel) is compiled on its own,
//! outside that descriptor set.
use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Relative relocations packed (DT_RELR): the loader reads a few pages
    // of them at start-up instead of 650 KB, which then stay resident.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
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
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds_with_config(descriptors, config)?;
    let method = tonic_build::manual::Method::builder;
    let dataplane = tonic_build::manual::Service::builder()
        .package("vxmgr.v1")
        .name("Dataplane")
        .method(
            method()
                .name("sync")
                .route_name("Sync")
                .input_type("crate::wire::Received")
                .output_type("super::SyncResponse")
                .codec_path("crate::wire::codec::SyncServerCodec")
                .client_streaming()
                .server_streaming()
                .build(),
        )
        .method(
            method()
                .name("get_state")
                .route_name("GetState")
                .input_type("super::GetStateRequest")
                .output_type("super::DataplaneState")
                .codec_path("tonic_prost::ProstCodec")
                .build(),
        )
        .build();
    tonic_build::manual::Builder::new()
        .build_client(false)
        .compile(&[dataplane]);

    let etcd = "proto/etcd.proto";
    println!("cargo:rerun-if-changed={etcd}");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(protox::compile([etcd], ["proto"])?)?;
    Ok(())
}

//! Generated protocol types and their encodings. No logic.

pub mod json;
pub mod replay;

pub mod felix {
    tonic::include_proto!("felix");
}

pub mod vxmgr {
    pub mod v1 {
        tonic::include_proto!("vxmgr.v1");
    }
}

/// Encoded `FileDescriptorSet` of proto/: serves gRPC reflection and the
/// proto3 JSON codecs.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vxmgr_descriptor.bin"));

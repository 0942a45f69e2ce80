//! Generated protocol types and their encodings. No logic.

pub mod json;
pub mod replay;

pub mod felix {
    tonic::include_proto!("felix");
}

/// etcd's v3 API, the part calc-flannel uses (clients only).
pub mod etcd {
    tonic::include_proto!("etcdserverpb");
}

pub mod vxmgr {
    pub mod v1 {
        tonic::include_proto!("vxmgr.v1");
    }
}

/// Largest message accepted, from a client of the socket or from a replay
/// file.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Encoded `FileDescriptorSet` of proto/: serves gRPC reflection and the
/// proto3 JSON codecs.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vxmgr_descriptor.bin"));

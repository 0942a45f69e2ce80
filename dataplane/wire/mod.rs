//! Generated protocol types and their encodings. No logic.

pub mod codec;
pub mod framing;
pub mod json;
pub mod replay;

use std::sync::LazyLock;

use bytes::Bytes;
use prost::{Message, Name};
use prost_reflect::DescriptorPool;

pub mod felix {
    tonic::include_proto!("felix");
}

/// etcd's v3 API, the part calc-flannel uses (clients only).
pub mod etcd {
    tonic::include_proto!("etcdserverpb");
}

pub mod vxmgr {
    // The generated server makes its codecs with `Default`, unit structs too.
    #[allow(clippy::default_constructed_unit_structs)]
    pub mod v1 {
        tonic::include_proto!("vxmgr.v1");
        include!(concat!(env!("OUT_DIR"), "/vxmgr.v1.Dataplane.rs"));
    }
}

/// Largest message accepted from a client of the socket or a replay file:
/// a whole message is held in memory before it is decoded. Felix's largest
/// messages are IP set updates: an IP set at Felix's default size limit
/// (1,048,576 members) of IPv6 "address,protocol:port" members is about
/// 50 MiB. Kinds vxmgr does not use are skipped while decoding, never
/// materialised, so such a message costs its bytes once.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// A `ToDataplane` as it arrived: its bytes, exactly as received (unknown
/// fields and kinds included), and what they decode to.
#[derive(Clone, Debug)]
pub struct Received {
    pub bytes: Bytes,
    pub message: Result<felix::ToDataplane, prost::DecodeError>,
}

impl Received {
    pub fn new(bytes: Bytes) -> Received {
        let message = felix::ToDataplane::decode(bytes.clone());
        Received { bytes, message }
    }

    /// The bytes of `message` as prost encodes it.
    pub fn encode(message: &felix::ToDataplane) -> Received {
        Received {
            bytes: message.encode_to_vec().into(),
            message: Ok(message.clone()),
        }
    }
}

/// Encoded `FileDescriptorSet` of proto/: serves gRPC reflection and the
/// proto3 JSON codecs.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vxmgr_descriptor.bin"));

static DESCRIPTORS: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(DESCRIPTOR_SET).expect("descriptor set built from proto/ is valid")
});

/// The descriptors of proto/.
pub fn descriptors() -> &'static DescriptorPool {
    &DESCRIPTORS
}

/// The name of the `ToDataplane` field `field`, when it is one of the kinds
/// vxmgr uses (proto/ leaves the others out).
pub fn payload_kind(field: u64) -> Option<String> {
    let field = u32::try_from(field).ok()?;
    let message = descriptors().get_message_by_name(&felix::ToDataplane::full_name())?;
    Some(message.get_field(field)?.name().to_string())
}

//! Nexthop objects (`ip nexthop`): netlink-packet-route has no
//! RTM_*NEXTHOP messages, so requests are built here (struct nhmsg and the
//! attributes vxmgr uses); dumps are parsed in place.

use std::net::IpAddr;

use rtnetlink::packet_core::{
    Emitable, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NetlinkSerializable, Nla,
};

use super::{NetlinkBackend, raw};
use crate::kernel::KernelError;
use crate::kernel::objects::{DumpedNexthop, KernelNexthop};

const RTM_NEWNEXTHOP: u16 = 104;
const RTM_DELNEXTHOP: u16 = 105;
const RTM_GETNEXTHOP: u16 = 106;

const NHA_ID: u16 = 1;
const NHA_GROUP: u16 = 2;
const NHA_BLACKHOLE: u16 = 3;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;

/// `RTNH_F_ONLINK`: the gateway is on the link whatever the link's addresses.
const RTNH_F_ONLINK: u32 = 4;

/// Length of struct nhmsg.
const HEADER_LEN: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NexthopMessageType {
    New,
    Del,
    Get,
}

/// An RTM_NEWNEXTHOP, RTM_DELNEXTHOP or RTM_GETNEXTHOP request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NexthopMessage {
    pub message_type: NexthopMessageType,
    /// `AF_INET`, `AF_INET6`, or `AF_UNSPEC` for deletes and dumps.
    pub family: u8,
    pub protocol: u8,
    /// `RTNH_F_*`
    pub flags: u32,
    pub attributes: Vec<NexthopAttribute>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NexthopAttribute {
    Id(u32),
    Oif(u32),
    Gateway(IpAddr),
}

impl NexthopMessage {
    fn new(message_type: NexthopMessageType) -> NexthopMessage {
        NexthopMessage {
            message_type,
            family: libc::AF_UNSPEC as u8,
            protocol: 0,
            flags: 0,
            attributes: Vec::new(),
        }
    }

    /// `ip nexthop replace id ID via GATEWAY dev IFINDEX onlink proto PROTOCOL`
    pub fn replace(nexthop: &KernelNexthop) -> NexthopMessage {
        NexthopMessage {
            family: match nexthop.gateway {
                IpAddr::V4(_) => libc::AF_INET as u8,
                IpAddr::V6(_) => libc::AF_INET6 as u8,
            },
            protocol: nexthop.protocol,
            flags: RTNH_F_ONLINK,
            attributes: vec![
                NexthopAttribute::Id(nexthop.id),
                NexthopAttribute::Oif(nexthop.ifindex),
                NexthopAttribute::Gateway(nexthop.gateway),
            ],
            ..NexthopMessage::new(NexthopMessageType::New)
        }
    }

    pub fn delete(id: u32) -> NexthopMessage {
        NexthopMessage {
            attributes: vec![NexthopAttribute::Id(id)],
            ..NexthopMessage::new(NexthopMessageType::Del)
        }
    }

    /// A dump of every nexthop. The kernel refuses protocol filters in a
    /// dump request, so the protocol is checked on the answers.
    pub fn dump() -> NexthopMessage {
        NexthopMessage::new(NexthopMessageType::Get)
    }
}

/// The nexthop in an RTM_NEWNEXTHOP payload (struct nhmsg and its
/// attributes): a single gateway onlink on an interface (vxmgr's shape) or,
/// for any other (a group, a blackhole, a gateway without `onlink`, as
/// hosts add them), its id alone; `None` when malformed.
fn parse_nexthop(payload: &[u8]) -> Option<DumpedNexthop> {
    // struct nhmsg { family, scope, protocol, resvd: u8; flags: u32 }
    let header = payload.get(..HEADER_LEN)?;
    let protocol = header[2];
    let flags = u32::from_ne_bytes(header[4..8].try_into().ok()?);
    let mut other = flags & RTNH_F_ONLINK == 0;
    let mut id = None;
    let mut ifindex = None;
    let mut gateway = None;
    for attribute in raw::attributes(&payload[HEADER_LEN..]) {
        match attribute.ok()? {
            (NHA_ID, value) => id = Some(raw::u32_value(value)?),
            (NHA_OIF, value) => ifindex = Some(raw::u32_value(value)?),
            (NHA_GATEWAY, value) => gateway = Some(raw::ip_value(value)?),
            (NHA_GROUP | NHA_BLACKHOLE, _) => other = true,
            _ => {}
        }
    }
    let id = id?;
    Some(match (gateway, ifindex) {
        (Some(gateway), Some(ifindex)) if !other => DumpedNexthop::Single(KernelNexthop {
            id,
            gateway,
            ifindex,
            protocol,
        }),
        _ => DumpedNexthop::Other(id),
    })
}

impl Nla for NexthopAttribute {
    fn value_len(&self) -> usize {
        match self {
            NexthopAttribute::Id(_) | NexthopAttribute::Oif(_) => 4,
            NexthopAttribute::Gateway(IpAddr::V4(_)) => 4,
            NexthopAttribute::Gateway(IpAddr::V6(_)) => 16,
        }
    }

    fn kind(&self) -> u16 {
        match self {
            NexthopAttribute::Id(_) => NHA_ID,
            NexthopAttribute::Oif(_) => NHA_OIF,
            NexthopAttribute::Gateway(_) => NHA_GATEWAY,
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            NexthopAttribute::Id(v) | NexthopAttribute::Oif(v) => {
                buffer.copy_from_slice(&v.to_ne_bytes())
            }
            NexthopAttribute::Gateway(IpAddr::V4(ip)) => buffer.copy_from_slice(&ip.octets()),
            NexthopAttribute::Gateway(IpAddr::V6(ip)) => buffer.copy_from_slice(&ip.octets()),
        }
    }
}

impl NetlinkSerializable for NexthopMessage {
    fn message_type(&self) -> u16 {
        match self.message_type {
            NexthopMessageType::New => RTM_NEWNEXTHOP,
            NexthopMessageType::Del => RTM_DELNEXTHOP,
            NexthopMessageType::Get => RTM_GETNEXTHOP,
        }
    }

    fn buffer_len(&self) -> usize {
        HEADER_LEN + self.attributes.as_slice().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        // struct nhmsg { family, scope, protocol, resvd: u8; flags: u32 };
        // the kernel refuses a non-zero scope.
        buffer[..4].copy_from_slice(&[self.family, 0, self.protocol, 0]);
        buffer[4..HEADER_LEN].copy_from_slice(&self.flags.to_ne_bytes());
        self.attributes.as_slice().emit(&mut buffer[HEADER_LEN..]);
    }
}

/// Creates a nexthop; the kernel refuses (EEXIST) if its id is taken.
pub(super) fn add_request(nexthop: &KernelNexthop) -> (NexthopMessage, u16) {
    (NexthopMessage::replace(nexthop), NLM_F_CREATE | NLM_F_EXCL)
}

/// Replaces one of vxmgr's nexthops.
pub(super) fn replace_request(nexthop: &KernelNexthop) -> (NexthopMessage, u16) {
    (
        NexthopMessage::replace(nexthop),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
}

/// The kernel removes the routes using the nexthop with it.
pub(super) fn delete_request(id: u32) -> (NexthopMessage, u16) {
    (NexthopMessage::delete(id), 0)
}

impl NetlinkBackend {
    /// What the kernel's refusal of an add or replace of `nexthop` means.
    /// It says EINVAL ("Invalid device index") where a route says ENODEV; a
    /// missing device is waited for, not retried.
    pub(super) async fn new_refused(
        &self,
        nexthop: &KernelNexthop,
        error: KernelError,
    ) -> KernelError {
        if error.errno == Some(libc::EINVAL) && !self.link_exists(nexthop.ifindex).await {
            return KernelError::from_errno(libc::ENODEV);
        }
        error
    }

    /// Every nexthop: whose each one is, the caller decides
    /// (`Ownership::sort_out`).
    pub(super) async fn dump_nexthops(&self) -> Result<Vec<DumpedNexthop>, KernelError> {
        self.dumps
            .dump(NexthopMessage::dump(), |message| {
                parse_nexthop(message.of_type(RTM_NEWNEXTHOP)?)
            })
            .await
    }

    /// Whether the kernel has nexthop objects: they came with Linux 5.3,
    /// and older kernels refuse the dump.
    pub(super) async fn nexthops_supported(&self) -> bool {
        self.dumps
            .dump(NexthopMessage::dump(), |_| None::<()>)
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::raw::build::attribute;
    use super::*;

    fn payload(message: &NexthopMessage) -> Vec<u8> {
        let mut buffer = vec![0; message.buffer_len()];
        message.serialize(&mut buffer);
        buffer
    }

    #[test]
    fn replace_message_parses_back_for_both_families() {
        for gateway in ["10.244.3.0", "fd10:244:3::"] {
            let nexthop = KernelNexthop {
                id: 0x7678_0001,
                gateway: gateway.parse().unwrap(),
                ifindex: 7,
                protocol: 80,
            };
            let message = NexthopMessage::replace(&nexthop);
            assert_eq!(message.flags, RTNH_F_ONLINK);
            assert_eq!(
                parse_nexthop(&payload(&message)),
                Some(DumpedNexthop::Single(nexthop))
            );
        }
    }

    #[test]
    fn serializes_the_kernel_layout() {
        let message = NexthopMessage::replace(&KernelNexthop {
            id: 100,
            gateway: "10.244.3.0".parse().unwrap(),
            ifindex: 4,
            protocol: 80,
        });
        let mut expected = vec![libc::AF_INET as u8, 0, 80, 0];
        expected.extend_from_slice(&RTNH_F_ONLINK.to_ne_bytes());
        expected.extend_from_slice(&[8, 0, 1, 0]);
        expected.extend_from_slice(&100u32.to_ne_bytes());
        expected.extend_from_slice(&[8, 0, 5, 0]);
        expected.extend_from_slice(&4u32.to_ne_bytes());
        expected.extend_from_slice(&[8, 0, 6, 0, 10, 244, 3, 0]);
        assert_eq!(payload(&message), expected);
    }

    #[test]
    fn blackhole_and_group_nexthops_are_known_by_their_id_alone() {
        let mut blackhole = vec![libc::AF_INET as u8, 0, 80, 0, 0, 0, 0, 0];
        blackhole.extend(attribute(NHA_ID, &5u32.to_ne_bytes()));
        blackhole.extend(attribute(NHA_BLACKHOLE, &[]));
        assert_eq!(parse_nexthop(&blackhole), Some(DumpedNexthop::Other(5)));
        let mut group = vec![0, 0, 80, 0, 0, 0, 0, 0];
        group.extend(attribute(NHA_ID, &6u32.to_ne_bytes()));
        group.extend(attribute(NHA_GROUP, &[5, 0, 0, 0, 0, 0, 0, 0]));
        assert_eq!(parse_nexthop(&group), Some(DumpedNexthop::Other(6)));
    }

    #[test]
    fn a_gateway_without_onlink_is_not_vxmgrs_shape() {
        let mut message = NexthopMessage::replace(&KernelNexthop {
            id: 7,
            gateway: "192.168.10.254".parse().unwrap(),
            ifindex: 2,
            protocol: 80,
        });
        message.flags = 0;
        assert_eq!(
            parse_nexthop(&payload(&message)),
            Some(DumpedNexthop::Other(7))
        );
    }
}

//! Nexthop objects (`ip nexthop`): netlink-packet-route has no
//! RTM_*NEXTHOP messages, so they are defined here (struct nhmsg and the
//! attributes vxmgr uses) and sent on a connection of their own.

use std::net::IpAddr;

use rtnetlink::packet_core::{
    DecodeError, DefaultNla, Emitable, NLM_F_CREATE, NLM_F_REPLACE, NetlinkDeserializable,
    NetlinkHeader, NetlinkSerializable, Nla, NlaBuffer, NlasIterator, Parseable, parse_ip,
    parse_u32,
};

use super::NetlinkBackend;
use crate::kernel::KernelError;
use crate::kernel::objects::KernelNexthop;

const RTM_NEWNEXTHOP: u16 = 104;
const RTM_DELNEXTHOP: u16 = 105;
const RTM_GETNEXTHOP: u16 = 106;

const NHA_ID: u16 = 1;
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

/// An RTM_NEWNEXTHOP, RTM_DELNEXTHOP or RTM_GETNEXTHOP message.
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
    Other(DefaultNla),
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

    /// The nexthop as vxmgr programs it, if it is one of that shape: a
    /// single gateway on an interface (not a group or a blackhole).
    pub fn to_kernel(&self) -> Option<KernelNexthop> {
        let mut id = None;
        let mut ifindex = None;
        let mut gateway = None;
        for attribute in &self.attributes {
            match attribute {
                NexthopAttribute::Id(v) => id = Some(*v),
                NexthopAttribute::Oif(v) => ifindex = Some(*v),
                NexthopAttribute::Gateway(v) => gateway = Some(*v),
                NexthopAttribute::Other(_) => {}
            }
        }
        Some(KernelNexthop {
            id: id?,
            gateway: gateway?,
            ifindex: ifindex?,
            protocol: self.protocol,
        })
    }
}

impl Nla for NexthopAttribute {
    fn value_len(&self) -> usize {
        match self {
            NexthopAttribute::Id(_) | NexthopAttribute::Oif(_) => 4,
            NexthopAttribute::Gateway(IpAddr::V4(_)) => 4,
            NexthopAttribute::Gateway(IpAddr::V6(_)) => 16,
            NexthopAttribute::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            NexthopAttribute::Id(_) => NHA_ID,
            NexthopAttribute::Oif(_) => NHA_OIF,
            NexthopAttribute::Gateway(_) => NHA_GATEWAY,
            NexthopAttribute::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            NexthopAttribute::Id(v) | NexthopAttribute::Oif(v) => {
                buffer.copy_from_slice(&v.to_ne_bytes())
            }
            NexthopAttribute::Gateway(IpAddr::V4(ip)) => buffer.copy_from_slice(&ip.octets()),
            NexthopAttribute::Gateway(IpAddr::V6(ip)) => buffer.copy_from_slice(&ip.octets()),
            NexthopAttribute::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&T>> for NexthopAttribute {
    fn parse(buffer: &NlaBuffer<&T>) -> Result<Self, DecodeError> {
        let value = buffer.value();
        Ok(match buffer.kind() {
            NHA_ID => NexthopAttribute::Id(parse_u32(value)?),
            NHA_OIF => NexthopAttribute::Oif(parse_u32(value)?),
            NHA_GATEWAY => NexthopAttribute::Gateway(parse_ip(value)?),
            _ => NexthopAttribute::Other(DefaultNla::parse(buffer)?),
        })
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

impl NetlinkDeserializable for NexthopMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        let message_type = match header.message_type {
            RTM_NEWNEXTHOP => NexthopMessageType::New,
            RTM_DELNEXTHOP => NexthopMessageType::Del,
            RTM_GETNEXTHOP => NexthopMessageType::Get,
            other => return Err(format!("not a nexthop message: type {other}").into()),
        };
        if payload.len() < HEADER_LEN {
            return Err(format!("nexthop message of {} bytes", payload.len()).into());
        }
        let attributes = NlasIterator::new(&payload[HEADER_LEN..])
            .map(|nla| NexthopAttribute::parse(&nla?))
            .collect::<Result<Vec<_>, DecodeError>>()?;
        Ok(NexthopMessage {
            message_type,
            family: payload[0],
            protocol: payload[2],
            flags: parse_u32(&payload[4..HEADER_LEN])?,
            attributes,
        })
    }
}

impl NetlinkBackend {
    pub(super) async fn replace_nexthop(&self, nexthop: &KernelNexthop) -> Result<(), KernelError> {
        let result = self
            .nexthops
            .request(
                NexthopMessage::replace(nexthop),
                NLM_F_CREATE | NLM_F_REPLACE,
            )
            .await;
        match result {
            Ok(_) => Ok(()),
            // The kernel says EINVAL ("Invalid device index") where a route
            // says ENODEV; a missing device is waited for, not retried.
            Err(e) if e.errno == Some(libc::EINVAL) && !self.link_exists(nexthop.ifindex).await => {
                Err(KernelError::from_errno(libc::ENODEV))
            }
            Err(e) => Err(e),
        }
    }

    /// The kernel removes the routes using the nexthop with it.
    pub(super) async fn delete_nexthop(&self, id: u32) -> Result<(), KernelError> {
        self.nexthops
            .request(NexthopMessage::delete(id), 0)
            .await
            .map(drop)
    }

    /// Our nexthops: those with our protocol.
    pub(super) async fn dump_nexthops(
        &self,
        protocol: u8,
    ) -> Result<Vec<KernelNexthop>, KernelError> {
        let answers = self.nexthops.dump(NexthopMessage::dump()).await?;
        Ok(answers
            .iter()
            .filter(|m| m.protocol == protocol)
            .filter_map(NexthopMessage::to_kernel)
            .collect())
    }

    /// Whether the kernel has nexthop objects: they came with Linux 5.3,
    /// and older kernels refuse the dump.
    pub(super) async fn nexthops_supported(&self) -> bool {
        self.nexthops.dump(NexthopMessage::dump()).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(message: &NexthopMessage) -> NexthopMessage {
        let mut buffer = vec![0; message.buffer_len()];
        message.serialize(&mut buffer);
        let mut header = NetlinkHeader::default();
        header.message_type = message.message_type();
        NexthopMessage::deserialize(&header, &buffer).unwrap()
    }

    #[test]
    fn replace_message_round_trips_for_both_families() {
        for gateway in ["10.244.3.0", "fd10:244:3::"] {
            let nexthop = KernelNexthop {
                id: 0x7678_0001,
                gateway: gateway.parse().unwrap(),
                ifindex: 7,
                protocol: 80,
            };
            let message = NexthopMessage::replace(&nexthop);
            assert_eq!(message.flags, RTNH_F_ONLINK);
            let parsed = round_trip(&message);
            assert_eq!(parsed, message);
            assert_eq!(parsed.to_kernel(), Some(nexthop));
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
        let mut buffer = vec![0; message.buffer_len()];
        message.serialize(&mut buffer);
        let mut expected = vec![libc::AF_INET as u8, 0, 80, 0];
        expected.extend_from_slice(&RTNH_F_ONLINK.to_ne_bytes());
        expected.extend_from_slice(&[8, 0, 1, 0]);
        expected.extend_from_slice(&100u32.to_ne_bytes());
        expected.extend_from_slice(&[8, 0, 5, 0]);
        expected.extend_from_slice(&4u32.to_ne_bytes());
        expected.extend_from_slice(&[8, 0, 6, 0, 10, 244, 3, 0]);
        assert_eq!(buffer, expected);
    }

    #[test]
    fn blackhole_and_group_nexthops_are_not_ours_to_parse() {
        let mut message = NexthopMessage::delete(5);
        message
            .attributes
            .push(NexthopAttribute::Other(DefaultNla::new(4, Vec::new())));
        let parsed = round_trip(&message);
        assert_eq!(parsed, message);
        assert_eq!(parsed.to_kernel(), None);
    }
}

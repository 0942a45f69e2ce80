//! ipset's netlink messages (NETLINK_NETFILTER, subsystem NFNL_SUBSYS_IPSET):
//! netlink-packet-* has none, so the commands vxmgr sends (type, create, add,
//! del, list, header) and the attributes it reads back are defined here, after the
//! kernel's include/uapi/linux/netfilter/ipset/ip_set.h.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use rtnetlink::packet_core::{
    DecodeError, DefaultNla, Emitable, NLA_F_NESTED, NLA_F_NET_BYTEORDER, NetlinkDeserializable,
    NetlinkHeader, NetlinkSerializable, Nla, NlaBuffer, NlasIterator, Parseable, parse_ip,
    parse_string, parse_u8, parse_u32_be,
};

use crate::model::Family;

/// The nfnetlink subsystem: the high byte of every ipset message type.
const NFNL_SUBSYS_IPSET: u16 = 6;

const IPSET_CMD_CREATE: u8 = 2;
const IPSET_CMD_LIST: u8 = 7;
const IPSET_CMD_ADD: u8 = 9;
const IPSET_CMD_DEL: u8 = 10;
const IPSET_CMD_HEADER: u8 = 12;
const IPSET_CMD_TYPE: u8 = 13;

// Attributes of a message.
const IPSET_ATTR_PROTOCOL: u16 = 1;
const IPSET_ATTR_SETNAME: u16 = 2;
const IPSET_ATTR_TYPENAME: u16 = 3;
const IPSET_ATTR_REVISION: u16 = 4;
const IPSET_ATTR_FAMILY: u16 = 5;
const IPSET_ATTR_DATA: u16 = 7;
const IPSET_ATTR_ADT: u16 = 8;
const IPSET_ATTR_LINENO: u16 = 9;

// Attributes inside IPSET_ATTR_DATA.
const IPSET_ATTR_IP: u16 = 1;
const IPSET_ATTR_CIDR: u16 = 3;
const IPSET_ATTR_MAXELEM: u16 = 19;

// Attributes inside IPSET_ATTR_IP.
const IPSET_ATTR_IPADDR_IPV4: u16 = 1;
const IPSET_ATTR_IPADDR_IPV6: u16 = 2;

/// The protocol version every message carries. Kernels of IPSET_PROTOCOL 6
/// accept exactly 6; those of protocol 7 accept anything from
/// IPSET_PROTOCOL_MIN (6) up, and 7 only adds the set's index to list
/// answers, which vxmgr does not read.
const PROTOCOL: u8 = 6;

/// `struct nfgenmsg`: family, NFNETLINK_V0, resource id.
const HEADER_LEN: usize = 4;

/// The family in the nfgenmsg header. The kernel reads the set's family
/// from IPSET_ATTR_FAMILY and ignores this one; `ipset` sends NFPROTO_IPV4
/// for sets of either family, and so does vxmgr.
const HEADER_FAMILY: u8 = libc::AF_INET as u8;

/// Codes of the kernel's ipset module beyond the errno range
/// (`enum ipset_errno`, and IPSET_ERR_HASH_FULL of the hash types) that a
/// request of vxmgr's can meet, worded after `ipset`'s messages.
const ERRORS: &[(i32, &str)] = &[
    (4097, "ipset protocol error"),
    (4098, "set type not supported by the kernel"),
    (4099, "the kernel's limit on the number of sets is reached"),
    (4104, "the prefix length is out of range for the set"),
    (4352, "the set is full (maxelem reached)"),
];

/// How a code of the kernel's ipset module reads.
pub fn error_text(errno: i32) -> Option<&'static str> {
    ERRORS
        .iter()
        .find(|(code, _)| *code == errno)
        .map(|(_, text)| *text)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpsetCommand {
    /// The revisions of a set type the kernel has.
    Type,
    Create,
    Add,
    Del,
    List,
    /// A set's type, family and creation parameters, without its members.
    Header,
}

/// One ipset request or answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpsetMessage {
    pub command: IpsetCommand,
    pub attributes: Vec<IpsetAttribute>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpsetAttribute {
    Protocol(u8),
    SetName(String),
    TypeName(String),
    /// In a type answer: the newest revision the kernel has.
    Revision(u8),
    Family(u8),
    /// A set's creation parameters, or its header in a list answer.
    Data(Vec<DataAttribute>),
    /// Elements of a request or a list answer, one DATA each.
    Adt(Vec<Vec<DataAttribute>>),
    /// `ipset restore`'s line number; the kernel wants one beside `Adt`.
    LineNo(u32),
    Other(DefaultNla),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataAttribute {
    Ip(IpAddr),
    Cidr(u8),
    MaxElem(u32),
    Other(DefaultNla),
}

impl IpsetMessage {
    fn new(command: IpsetCommand, mut attributes: Vec<IpsetAttribute>) -> IpsetMessage {
        attributes.insert(0, IpsetAttribute::Protocol(PROTOCOL));
        IpsetMessage {
            command,
            attributes,
        }
    }

    /// Asks which revisions of `set_type` the kernel has for `family`.
    pub fn type_query(set_type: &str, family: Family) -> IpsetMessage {
        IpsetMessage::new(
            IpsetCommand::Type,
            vec![
                IpsetAttribute::TypeName(set_type.to_string()),
                IpsetAttribute::Family(family_number(family)),
            ],
        )
    }

    /// `ipset create NAME SET_TYPE family FAMILY maxelem MAX_ELEMENTS`.
    pub fn create(
        name: &str,
        set_type: &str,
        revision: u8,
        family: Family,
        max_elements: u32,
    ) -> IpsetMessage {
        IpsetMessage::new(
            IpsetCommand::Create,
            vec![
                IpsetAttribute::SetName(name.to_string()),
                IpsetAttribute::TypeName(set_type.to_string()),
                IpsetAttribute::Revision(revision),
                IpsetAttribute::Family(family_number(family)),
                IpsetAttribute::Data(vec![DataAttribute::MaxElem(max_elements)]),
            ],
        )
    }

    /// `ipset add NAME MEMBER` or `ipset del NAME MEMBER` for each member,
    /// in one message as `ipset restore` sends them: the kernel applies
    /// them in order and stops at the first it refuses.
    pub fn members(command: IpsetCommand, name: &str, members: &[IpNetwork]) -> IpsetMessage {
        let elements = members
            .iter()
            .map(|m| vec![DataAttribute::Ip(m.ip()), DataAttribute::Cidr(m.prefix())])
            .collect();
        IpsetMessage::new(
            command,
            vec![
                IpsetAttribute::SetName(name.to_string()),
                // No element carries a line number of its own, so the
                // kernel answers a refusal with a plain error.
                IpsetAttribute::LineNo(0),
                IpsetAttribute::Adt(elements),
            ],
        )
    }

    /// `ipset list NAME`, sent as a dump.
    pub fn list(name: &str) -> IpsetMessage {
        IpsetMessage::new(
            IpsetCommand::List,
            vec![IpsetAttribute::SetName(name.to_string())],
        )
    }

    /// `ipset -terse list NAME`: the set's header only.
    pub fn header(name: &str) -> IpsetMessage {
        IpsetMessage::new(
            IpsetCommand::Header,
            vec![IpsetAttribute::SetName(name.to_string())],
        )
    }

    /// Whether the set a list or header answer describes is of `set_type`
    /// and `family`; `None` for a message without the set's header.
    pub fn is_set_of(&self, set_type: &str, family: Family) -> Option<bool> {
        let mut found_type = None;
        let mut found_family = None;
        for attribute in &self.attributes {
            match attribute {
                IpsetAttribute::TypeName(t) => found_type = Some(t.as_str()),
                IpsetAttribute::Family(f) => found_family = Some(*f),
                _ => {}
            }
        }
        Some(found_type? == set_type && found_family? == family_number(family))
    }

    /// The revision in a type answer.
    pub fn revision(&self) -> Option<u8> {
        self.attributes.iter().find_map(|a| match a {
            IpsetAttribute::Revision(r) => Some(*r),
            _ => None,
        })
    }

    /// The elements in one message of a list answer. The kernel gives every
    /// hash:net element its prefix length; one without is a host.
    pub fn listed_members(&self) -> impl Iterator<Item = IpNetwork> + '_ {
        self.attributes
            .iter()
            .filter_map(|a| match a {
                IpsetAttribute::Adt(elements) => Some(elements),
                _ => None,
            })
            .flatten()
            .filter_map(|element| {
                let mut ip = None;
                let mut prefix = None;
                for attribute in element {
                    match attribute {
                        DataAttribute::Ip(v) => ip = Some(*v),
                        DataAttribute::Cidr(v) => prefix = Some(*v),
                        _ => {}
                    }
                }
                let ip = ip?;
                let host = if ip.is_ipv4() { 32 } else { 128 };
                IpNetwork::new(ip, prefix.unwrap_or(host)).ok()
            })
    }
}

/// NFPROTO_IPV4 and NFPROTO_IPV6 are AF_INET and AF_INET6.
fn family_number(family: Family) -> u8 {
    match family {
        Family::V4 => libc::AF_INET as u8,
        Family::V6 => libc::AF_INET6 as u8,
    }
}

/// A nested attribute made of other attributes.
struct Nested<'a, T>(u16, &'a [T]);

impl<T: Nla> Nla for Nested<'_, T> {
    fn value_len(&self) -> usize {
        self.1.buffer_len()
    }

    fn kind(&self) -> u16 {
        self.0 | NLA_F_NESTED
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        self.1.emit(buffer)
    }
}

/// An address inside IPSET_ATTR_IP; the kernel wants it flagged as being in
/// network byte order.
struct Address(IpAddr);

impl Nla for Address {
    fn value_len(&self) -> usize {
        match self.0 {
            IpAddr::V4(_) => 4,
            IpAddr::V6(_) => 16,
        }
    }

    fn kind(&self) -> u16 {
        let kind = match self.0 {
            IpAddr::V4(_) => IPSET_ATTR_IPADDR_IPV4,
            IpAddr::V6(_) => IPSET_ATTR_IPADDR_IPV6,
        };
        kind | NLA_F_NET_BYTEORDER
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self.0 {
            IpAddr::V4(ip) => buffer.copy_from_slice(&ip.octets()),
            IpAddr::V6(ip) => buffer.copy_from_slice(&ip.octets()),
        }
    }
}

impl Nla for DataAttribute {
    fn value_len(&self) -> usize {
        match self {
            DataAttribute::Ip(ip) => Address(*ip).buffer_len(),
            DataAttribute::Cidr(_) => 1,
            DataAttribute::MaxElem(_) => 4,
            DataAttribute::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            DataAttribute::Ip(_) => IPSET_ATTR_IP | NLA_F_NESTED,
            DataAttribute::Cidr(_) => IPSET_ATTR_CIDR,
            DataAttribute::MaxElem(_) => IPSET_ATTR_MAXELEM | NLA_F_NET_BYTEORDER,
            DataAttribute::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            DataAttribute::Ip(ip) => Address(*ip).emit(buffer),
            DataAttribute::Cidr(v) => buffer[0] = *v,
            DataAttribute::MaxElem(v) => buffer.copy_from_slice(&v.to_be_bytes()),
            DataAttribute::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&T>> for DataAttribute {
    fn parse(buffer: &NlaBuffer<&T>) -> Result<Self, DecodeError> {
        let value = buffer.value();
        Ok(match buffer.kind() {
            IPSET_ATTR_IP => {
                let address = NlasIterator::new(value)
                    .next()
                    .ok_or("empty IPSET_ATTR_IP")??;
                DataAttribute::Ip(parse_ip(address.value())?)
            }
            IPSET_ATTR_CIDR => DataAttribute::Cidr(parse_u8(value)?),
            IPSET_ATTR_MAXELEM => DataAttribute::MaxElem(parse_u32_be(value)?),
            _ => DataAttribute::Other(DefaultNla::parse(buffer)?),
        })
    }
}

fn parse_data(value: &[u8]) -> Result<Vec<DataAttribute>, DecodeError> {
    NlasIterator::new(value)
        .map(|nla| DataAttribute::parse(&nla?))
        .collect()
}

impl IpsetAttribute {
    fn elements(
        elements: &[Vec<DataAttribute>],
    ) -> impl Iterator<Item = Nested<'_, DataAttribute>> {
        elements.iter().map(|e| Nested(IPSET_ATTR_DATA, e))
    }
}

impl Nla for IpsetAttribute {
    fn value_len(&self) -> usize {
        match self {
            IpsetAttribute::Protocol(_)
            | IpsetAttribute::Revision(_)
            | IpsetAttribute::Family(_) => 1,
            IpsetAttribute::LineNo(_) => 4,
            // NUL-terminated, as the kernel's NLA_NUL_STRING policy wants.
            IpsetAttribute::SetName(s) | IpsetAttribute::TypeName(s) => s.len() + 1,
            IpsetAttribute::Data(attributes) => attributes.as_slice().buffer_len(),
            IpsetAttribute::Adt(elements) => IpsetAttribute::elements(elements)
                .map(|e| e.buffer_len())
                .sum(),
            IpsetAttribute::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            IpsetAttribute::Protocol(_) => IPSET_ATTR_PROTOCOL,
            IpsetAttribute::SetName(_) => IPSET_ATTR_SETNAME,
            IpsetAttribute::TypeName(_) => IPSET_ATTR_TYPENAME,
            IpsetAttribute::Revision(_) => IPSET_ATTR_REVISION,
            IpsetAttribute::Family(_) => IPSET_ATTR_FAMILY,
            IpsetAttribute::Data(_) => IPSET_ATTR_DATA | NLA_F_NESTED,
            IpsetAttribute::Adt(_) => IPSET_ATTR_ADT | NLA_F_NESTED,
            IpsetAttribute::LineNo(_) => IPSET_ATTR_LINENO | NLA_F_NET_BYTEORDER,
            IpsetAttribute::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            IpsetAttribute::Protocol(v)
            | IpsetAttribute::Revision(v)
            | IpsetAttribute::Family(v) => buffer[0] = *v,
            IpsetAttribute::LineNo(v) => buffer.copy_from_slice(&v.to_be_bytes()),
            IpsetAttribute::SetName(s) | IpsetAttribute::TypeName(s) => {
                buffer[..s.len()].copy_from_slice(s.as_bytes());
                buffer[s.len()] = 0;
            }
            IpsetAttribute::Data(attributes) => attributes.as_slice().emit(buffer),
            IpsetAttribute::Adt(elements) => {
                let mut start = 0;
                for element in IpsetAttribute::elements(elements) {
                    let end = start + element.buffer_len();
                    element.emit(&mut buffer[start..end]);
                    start = end;
                }
            }
            IpsetAttribute::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&T>> for IpsetAttribute {
    fn parse(buffer: &NlaBuffer<&T>) -> Result<Self, DecodeError> {
        let value = buffer.value();
        Ok(match buffer.kind() {
            IPSET_ATTR_PROTOCOL => IpsetAttribute::Protocol(parse_u8(value)?),
            IPSET_ATTR_SETNAME => IpsetAttribute::SetName(parse_string(value)?),
            IPSET_ATTR_TYPENAME => IpsetAttribute::TypeName(parse_string(value)?),
            IPSET_ATTR_REVISION => IpsetAttribute::Revision(parse_u8(value)?),
            IPSET_ATTR_FAMILY => IpsetAttribute::Family(parse_u8(value)?),
            IPSET_ATTR_DATA => IpsetAttribute::Data(parse_data(value)?),
            IPSET_ATTR_LINENO => IpsetAttribute::LineNo(parse_u32_be(value)?),
            IPSET_ATTR_ADT => IpsetAttribute::Adt(
                NlasIterator::new(value)
                    .map(|element| parse_data(element?.value()))
                    .collect::<Result<_, _>>()?,
            ),
            _ => IpsetAttribute::Other(DefaultNla::parse(buffer)?),
        })
    }
}

impl NetlinkSerializable for IpsetMessage {
    fn message_type(&self) -> u16 {
        let command = match self.command {
            IpsetCommand::Type => IPSET_CMD_TYPE,
            IpsetCommand::Create => IPSET_CMD_CREATE,
            IpsetCommand::Add => IPSET_CMD_ADD,
            IpsetCommand::Del => IPSET_CMD_DEL,
            IpsetCommand::List => IPSET_CMD_LIST,
            IpsetCommand::Header => IPSET_CMD_HEADER,
        };
        NFNL_SUBSYS_IPSET << 8 | u16::from(command)
    }

    fn buffer_len(&self) -> usize {
        HEADER_LEN + self.attributes.as_slice().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        // struct nfgenmsg { family; version = NFNETLINK_V0; res_id = 0 }
        buffer[..HEADER_LEN].copy_from_slice(&[HEADER_FAMILY, 0, 0, 0]);
        self.attributes.as_slice().emit(&mut buffer[HEADER_LEN..]);
    }
}

impl NetlinkDeserializable for IpsetMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        let [subsystem, command] = header.message_type.to_be_bytes();
        let command = match (u16::from(subsystem), command) {
            (NFNL_SUBSYS_IPSET, IPSET_CMD_TYPE) => IpsetCommand::Type,
            (NFNL_SUBSYS_IPSET, IPSET_CMD_CREATE) => IpsetCommand::Create,
            (NFNL_SUBSYS_IPSET, IPSET_CMD_ADD) => IpsetCommand::Add,
            (NFNL_SUBSYS_IPSET, IPSET_CMD_DEL) => IpsetCommand::Del,
            (NFNL_SUBSYS_IPSET, IPSET_CMD_LIST) => IpsetCommand::List,
            (NFNL_SUBSYS_IPSET, IPSET_CMD_HEADER) => IpsetCommand::Header,
            _ => {
                return Err(
                    format!("not an ipset message: type {:#06x}", header.message_type).into(),
                );
            }
        };
        let attributes = payload
            .get(HEADER_LEN..)
            .ok_or_else(|| format!("ipset message of {} bytes", payload.len()))?;
        let attributes = NlasIterator::new(attributes)
            .map(|nla| IpsetAttribute::parse(&nla?))
            .collect::<Result<Vec<_>, DecodeError>>()?;
        Ok(IpsetMessage {
            command,
            attributes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> IpNetwork {
        text.parse().unwrap()
    }

    fn serialize(message: &IpsetMessage) -> Vec<u8> {
        let mut buffer = vec![0; message.buffer_len()];
        message.serialize(&mut buffer);
        buffer
    }

    fn round_trip(message: &IpsetMessage) -> IpsetMessage {
        let mut header = NetlinkHeader::default();
        header.message_type = message.message_type();
        IpsetMessage::deserialize(&header, &serialize(message)).unwrap()
    }

    /// What `ipset create s4 hash:net family inet maxelem 1048576` sent
    /// (strace), but for the protocol version.
    #[test]
    fn create_has_the_layout_ipset_sends() {
        let message = IpsetMessage::create("s4", "hash:net", 7, Family::V4, 1_048_576);
        assert_eq!(message.message_type(), 6 << 8 | 2);
        let mut expected = vec![2, 0, 0, 0];
        expected.extend_from_slice(&[5, 0, 1, 0, 6, 0, 0, 0]);
        expected.extend_from_slice(&[7, 0, 2, 0, b's', b'4', 0, 0]);
        expected.extend_from_slice(&[13, 0, 3, 0]);
        expected.extend_from_slice(b"hash:net\0\0\0\0");
        expected.extend_from_slice(&[5, 0, 4, 0, 7, 0, 0, 0]);
        expected.extend_from_slice(&[5, 0, 5, 0, 2, 0, 0, 0]);
        expected.extend_from_slice(&[12, 0, 7, 0x80, 8, 0, 19, 0x40, 0, 0x10, 0, 0]);
        assert_eq!(serialize(&message), expected);
    }

    /// What `ipset restore` sent for `add s4 10.7.0.2` and
    /// `add s4 10.99.0.0/16`, less its line numbers.
    #[test]
    fn members_have_the_layout_ipset_restore_sends() {
        let members = [net("10.7.0.2/32"), net("10.99.0.0/16")];
        let message = IpsetMessage::members(IpsetCommand::Add, "s4", &members);
        assert_eq!(message.message_type(), 6 << 8 | 9);
        let mut expected = vec![2, 0, 0, 0];
        expected.extend_from_slice(&[5, 0, 1, 0, 6, 0, 0, 0]);
        expected.extend_from_slice(&[7, 0, 2, 0, b's', b'4', 0, 0]);
        expected.extend_from_slice(&[8, 0, 9, 0x40, 0, 0, 0, 0]);
        expected.extend_from_slice(&[52, 0, 8, 0x80]);
        for (ip, cidr) in [([10, 7, 0, 2], 32), ([10, 99, 0, 0], 16)] {
            expected.extend_from_slice(&[24, 0, 7, 0x80, 12, 0, 1, 0x80, 8, 0, 1, 0x40]);
            expected.extend_from_slice(&ip);
            expected.extend_from_slice(&[5, 0, 3, 0, cidr, 0, 0, 0]);
        }
        assert_eq!(serialize(&message), expected);

        let message = IpsetMessage::members(IpsetCommand::Del, "s6", &[net("fd00::1/128")]);
        assert_eq!(message.message_type(), 6 << 8 | 10);
        let element = &serialize(&message)[28..];
        assert_eq!(
            &element[..12],
            &[40, 0, 8, 0x80, 36, 0, 7, 0x80, 24, 0, 1, 0x80]
        );
        assert_eq!(&element[12..17], &[20, 0, 2, 0x40, 0xfd]);
        assert_eq!(&element[32..], &[5, 0, 3, 0, 128, 0, 0, 0]);
    }

    #[test]
    fn requests_round_trip() {
        for message in [
            IpsetMessage::type_query("hash:net", Family::V6),
            IpsetMessage::create("s6", "hash:net", 7, Family::V6, 1_048_576),
            IpsetMessage::members(IpsetCommand::Add, "s", &[net("192.0.2.0/24")]),
            IpsetMessage::members(
                IpsetCommand::Del,
                "s",
                &[net("2001:db8::/64"), net("2001:db8:1::1/128")],
            ),
            IpsetMessage::list("s"),
        ] {
            assert_eq!(round_trip(&message), message);
        }
    }

    #[test]
    fn reads_the_revision_of_a_type_answer() {
        let mut answer = IpsetMessage::type_query("hash:net", Family::V4);
        answer.command = IpsetCommand::Type;
        answer.attributes.push(IpsetAttribute::Revision(7));
        assert_eq!(round_trip(&answer).revision(), Some(7));
    }

    #[test]
    fn reads_the_members_of_a_list_answer() {
        let element = |ip: &str, cidr: Option<u8>| {
            let mut data = vec![DataAttribute::Ip(ip.parse().unwrap())];
            data.extend(cidr.map(DataAttribute::Cidr));
            data
        };
        let mut answer = IpsetMessage::list("s");
        answer.attributes.extend([
            IpsetAttribute::Data(vec![
                DataAttribute::MaxElem(1_048_576),
                DataAttribute::Other(DefaultNla::new(18 | NLA_F_NET_BYTEORDER, vec![0, 0, 4, 0])),
            ]),
            IpsetAttribute::Adt(vec![
                element("10.99.0.0", Some(16)),
                element("192.0.2.2", None),
                element("2001:db8::", Some(64)),
            ]),
        ]);
        let parsed = round_trip(&answer);
        assert_eq!(parsed, answer);
        assert_eq!(
            parsed.listed_members().collect::<Vec<_>>(),
            vec![
                net("10.99.0.0/16"),
                net("192.0.2.2/32"),
                net("2001:db8::/64")
            ]
        );
    }

    #[test]
    fn tells_a_set_of_another_type_or_family() {
        let answer = |set_type: &str, family: u8| {
            let mut answer = IpsetMessage::header("s");
            answer.attributes.extend([
                IpsetAttribute::TypeName(set_type.into()),
                IpsetAttribute::Revision(6),
                IpsetAttribute::Family(family),
            ]);
            round_trip(&answer)
        };
        let (inet, inet6) = (libc::AF_INET as u8, libc::AF_INET6 as u8);
        assert_eq!(
            answer("hash:net", inet).is_set_of("hash:net", Family::V4),
            Some(true)
        );
        assert_eq!(
            answer("hash:ip", inet).is_set_of("hash:net", Family::V4),
            Some(false)
        );
        assert_eq!(
            answer("hash:net", inet6).is_set_of("hash:net", Family::V4),
            Some(false)
        );
        let members_only = IpsetMessage::members(IpsetCommand::Add, "s", &[net("10.0.0.1/32")]);
        assert_eq!(members_only.is_set_of("hash:net", Family::V4), None);
    }

    #[test]
    fn refuses_other_subsystems() {
        let mut header = NetlinkHeader::default();
        header.message_type = 1 << 8 | 9;
        assert!(IpsetMessage::deserialize(&header, &[2, 0, 0, 0]).is_err());
    }

    #[test]
    fn names_ipset_error_codes() {
        assert_eq!(
            error_text(4104),
            Some("the prefix length is out of range for the set")
        );
        assert_eq!(error_text(libc::ENOENT), None);
    }
}

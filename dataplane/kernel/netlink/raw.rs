//! Netlink messages and their attributes read in place from a receive
//! buffer. Nothing is copied or allocated: a dump of a hundred thousand
//! routes then costs little more than the kernel's time to write it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Address families, as struct rtmsg and struct ndmsg carry them.
pub(super) const AF_INET: u8 = 2;
pub(super) const AF_INET6: u8 = 10;
pub(super) const AF_BRIDGE: u8 = 7;

/// Length of struct nlmsghdr.
const HEADER_LEN: usize = 16;

pub(super) const NLMSG_ERROR: u16 = 2;
pub(super) const NLMSG_DONE: u16 = 3;

/// Set on every message of a dump that the kernel's tables changed under:
/// the dump may have missed or repeated objects.
pub(super) const NLM_F_DUMP_INTR: u16 = 0x10;
/// The ACK echoes only the request's header, not its payload.
const NLM_F_CAPPED: u16 = 0x100;
/// Extended-ACK attributes follow the error code (and the echoed request).
const NLM_F_ACK_TLVS: u16 = 0x200;

/// Attribute types carry two flag bits (nested, network byte order).
const NLA_TYPE_MASK: u16 = 0x3fff;

/// Messages and attributes start on 4-byte boundaries.
fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// A message or attribute whose length runs past its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Malformed;

/// One netlink message, its payload borrowed from the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Message<'a> {
    pub kind: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

impl<'a> Message<'a> {
    /// The payload, if the message is of this type.
    pub fn of_type(&self, kind: u16) -> Option<&'a [u8]> {
        (self.kind == kind).then_some(self.payload)
    }

    /// For an NLMSG_DONE or NLMSG_ERROR: 0 or a negative errno, and the
    /// extended-ACK attributes (empty without them).
    pub fn status(&self) -> Result<(i32, &'a [u8]), Malformed> {
        // Some kernel code sends an NLMSG_DONE without a payload.
        if self.payload.is_empty() {
            return Ok((0, &[]));
        }
        let code = self
            .payload
            .first_chunk::<4>()
            .map(|b| i32::from_ne_bytes(*b))
            .ok_or(Malformed)?;
        let mut rest = &self.payload[4..];
        if self.kind == NLMSG_ERROR {
            // The request the error answers comes back: its header, or the
            // whole of it unless capped.
            let echoed = if self.flags & NLM_F_CAPPED != 0 {
                HEADER_LEN
            } else {
                rest.first_chunk::<4>()
                    .map(|b| u32::from_ne_bytes(*b) as usize)
                    .ok_or(Malformed)?
            };
            rest = rest.get(align(echoed)..).unwrap_or_default();
        }
        if self.flags & NLM_F_ACK_TLVS == 0 {
            rest = &[];
        }
        Ok((code, rest))
    }
}

/// The messages of one received datagram.
pub(super) fn messages(datagram: &[u8]) -> Messages<'_> {
    Messages { rest: datagram }
}

pub(super) struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let message = self.rest.first_chunk::<HEADER_LEN>().and_then(|header| {
            let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let payload = self.rest.get(HEADER_LEN..len)?;
            Some((
                Message {
                    kind: u16::from_ne_bytes([header[4], header[5]]),
                    flags: u16::from_ne_bytes([header[6], header[7]]),
                    seq: u32::from_ne_bytes([header[8], header[9], header[10], header[11]]),
                    payload,
                },
                len,
            ))
        });
        match message {
            Some((message, len)) => {
                self.rest = self.rest.get(align(len)..).unwrap_or_default();
                Some(Ok(message))
            }
            None => {
                // Nothing after a bad length can be framed.
                self.rest = &[];
                Some(Err(Malformed))
            }
        }
    }
}

/// The attributes (struct rtattr / nlattr TLVs) in `buffer`, as type and
/// value.
pub(super) fn attributes(buffer: &[u8]) -> Attributes<'_> {
    Attributes { rest: buffer }
}

pub(super) struct Attributes<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Attributes<'a> {
    type Item = Result<(u16, &'a [u8]), Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let attribute = self.rest.first_chunk::<4>().and_then(|header| {
            let len = u16::from_ne_bytes([header[0], header[1]]) as usize;
            let kind = u16::from_ne_bytes([header[2], header[3]]) & NLA_TYPE_MASK;
            Some((kind, self.rest.get(4..len)?, len))
        });
        match attribute {
            Some((kind, value, len)) => {
                self.rest = self.rest.get(align(len)..).unwrap_or_default();
                Some(Ok((kind, value)))
            }
            None => {
                self.rest = &[];
                Some(Err(Malformed))
            }
        }
    }
}

/// A u32 attribute, in host byte order.
pub(super) fn u32_value(value: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(value).ok().map(u32::from_ne_bytes)
}

/// An address attribute: 4 bytes for IPv4, 16 for IPv6.
pub(super) fn ip_value(value: &[u8]) -> Option<IpAddr> {
    if let Ok(octets) = <[u8; 4]>::try_from(value) {
        return Some(IpAddr::V4(Ipv4Addr::from(octets)));
    }
    <[u8; 16]>::try_from(value)
        .ok()
        .map(|octets| IpAddr::V6(Ipv6Addr::from(octets)))
}

/// Hand-built kernel messages, for the parsers' tests.
#[cfg(test)]
pub(super) mod build {
    use std::collections::VecDeque;

    use crate::kernel::KernelError;

    /// Reads these datagrams in turn, as the kernel's answers, then fails
    /// as a socket whose answers stopped coming.
    pub fn replies(
        mut datagrams: VecDeque<Vec<u8>>,
    ) -> impl FnMut(&mut Vec<u8>) -> Result<(), KernelError> {
        move |buffer| {
            buffer.clear();
            buffer.extend(
                datagrams
                    .pop_front()
                    .ok_or_else(|| KernelError::other("no answer from the kernel"))?,
            );
            Ok(())
        }
    }

    /// An attribute: length, type, value, padding.
    pub fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(4 + value.len() as u16).to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(value);
        bytes.resize(super::align(bytes.len()), 0);
        bytes
    }

    /// A message: header, then the payload padded to 4 bytes.
    pub fn message(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(16 + payload.len() as u32).to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&flags.to_ne_bytes());
        bytes.extend_from_slice(&seq.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(payload);
        bytes.resize(super::align(bytes.len()), 0);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::build::{attribute, message};
    use super::*;

    #[test]
    fn messages_of_a_datagram_in_order() {
        let mut datagram = message(24, 2, 7, &[1, 2, 3]);
        datagram.extend(message(NLMSG_DONE, 2, 7, &0i32.to_ne_bytes()));
        let parsed: Vec<_> = messages(&datagram).collect();
        assert_eq!(
            parsed,
            vec![
                Ok(Message {
                    kind: 24,
                    flags: 2,
                    seq: 7,
                    payload: &[1, 2, 3]
                }),
                Ok(Message {
                    kind: NLMSG_DONE,
                    flags: 2,
                    seq: 7,
                    payload: &[0, 0, 0, 0]
                }),
            ]
        );
    }

    #[test]
    fn a_length_past_the_datagram_ends_it() {
        let mut datagram = message(24, 0, 1, &[]);
        let mut truncated = message(24, 0, 1, &[0; 8]);
        truncated.truncate(20);
        datagram.extend(truncated);
        let parsed: Vec<_> = messages(&datagram).collect();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[1], Err(Malformed));
        // A length shorter than the header cannot be stepped over.
        let mut short = message(24, 0, 1, &[]);
        short[0] = 8;
        short.extend(message(24, 0, 1, &[]));
        assert_eq!(messages(&short).collect::<Vec<_>>(), vec![Err(Malformed)]);
        assert_eq!(messages(&[1, 0]).collect::<Vec<_>>(), vec![Err(Malformed)]);
    }

    #[test]
    fn attributes_are_padded_and_lose_their_flag_bits() {
        let mut buffer = attribute(1, &[10, 0, 0, 1, 0]);
        buffer.extend(attribute(0x8000 | 8, &[]));
        buffer.extend(attribute(4, &7u32.to_ne_bytes()));
        let parsed: Vec<_> = attributes(&buffer).collect();
        assert_eq!(
            parsed,
            vec![
                Ok((1, &[10, 0, 0, 1, 0][..])),
                Ok((8, &[][..])),
                Ok((4, &7u32.to_ne_bytes()[..]))
            ]
        );
    }

    #[test]
    fn an_attribute_shorter_than_its_header_is_malformed() {
        let buffer = [2, 0, 1, 0, 9, 9, 9, 9];
        assert_eq!(
            attributes(&buffer).collect::<Vec<_>>(),
            vec![Err(Malformed)]
        );
    }

    #[test]
    fn values() {
        assert_eq!(u32_value(&5u32.to_ne_bytes()), Some(5));
        assert_eq!(u32_value(&[1, 2]), None);
        assert_eq!(ip_value(&[10, 0, 0, 1]), Some("10.0.0.1".parse().unwrap()));
        let v6: Ipv6Addr = "fd00::2".parse().unwrap();
        assert_eq!(ip_value(&v6.octets()), Some(IpAddr::V6(v6)));
        assert_eq!(ip_value(&[1, 2, 3]), None);
    }

    #[test]
    fn done_and_error_status_with_extended_acks() {
        let extack = attribute(1, b"bad filter\0");
        let mut done = (-22i32).to_ne_bytes().to_vec();
        done.extend(&extack);
        let datagram = message(NLMSG_DONE, 2 | NLM_F_ACK_TLVS, 1, &done);
        let parsed = messages(&datagram).next().unwrap().unwrap();
        assert_eq!(parsed.status(), Ok((-22, &extack[..])));

        // An uncapped error echoes the whole request, then the attributes.
        let request = message(26, 0x301, 1, &[0; 12]);
        let mut error = (-95i32).to_ne_bytes().to_vec();
        error.extend(&request);
        error.extend(&extack);
        let datagram = message(NLMSG_ERROR, NLM_F_ACK_TLVS, 1, &error);
        let parsed = messages(&datagram).next().unwrap().unwrap();
        assert_eq!(parsed.status(), Ok((-95, &extack[..])));

        // Capped, without attributes.
        let mut error = (-1i32).to_ne_bytes().to_vec();
        error.extend(&request[..16]);
        let datagram = message(NLMSG_ERROR, NLM_F_CAPPED, 1, &error);
        let parsed = messages(&datagram).next().unwrap().unwrap();
        assert_eq!(parsed.status(), Ok((-1, &[][..])));
    }
}

//! Permanent ARP/NDP entries and FDB entries on the VXLAN devices.

use std::net::IpAddr;

use netlink_packet_route::neighbour::{
    NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_REPLACE};

use super::NetlinkBackend;
use super::raw::{self, AF_BRIDGE, AF_INET, AF_INET6};
use crate::kernel::KernelError;
use crate::kernel::objects::{KernelFdb, KernelNeighbor};
use crate::model::MacAddr;

// From linux/rtnetlink.h and linux/neighbour.h.
pub(super) const RTM_NEWNEIGH: u16 = 28;
pub(super) const RTM_DELNEIGH: u16 = 29;
/// Length of struct ndmsg.
const NDMSG_LEN: usize = 12;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NUD_PERMANENT: u16 = 0x80;
const NTF_SELF: u8 = 0x02;

/// `ip neigh replace ADDRESS lladdr MAC dev IFINDEX nud permanent`
pub(super) fn replace_neighbor_request(neighbor: &KernelNeighbor) -> (RouteNetlinkMessage, u16) {
    let mut message = neighbor_message(neighbor);
    message.header.state = NeighbourState::Permanent;
    message
        .attributes
        .push(NeighbourAttribute::LinkLayerAddress(
            neighbor.mac.octets().to_vec(),
        ));
    (
        RouteNetlinkMessage::NewNeighbour(message),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
}

pub(super) fn delete_neighbor_request(neighbor: &KernelNeighbor) -> (RouteNetlinkMessage, u16) {
    (
        RouteNetlinkMessage::DelNeighbour(neighbor_message(neighbor)),
        0,
    )
}

/// `bridge fdb replace MAC dev IFINDEX dst DESTINATION self permanent`
pub(super) fn replace_fdb_request(entry: &KernelFdb) -> (RouteNetlinkMessage, u16) {
    let mut message = fdb_message(entry.ifindex, entry.mac);
    message.header.state = NeighbourState::Permanent;
    message
        .attributes
        .push(NeighbourAttribute::Destination(entry.destination.into()));
    (
        RouteNetlinkMessage::NewNeighbour(message),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
}

/// Without a destination the kernel removes the MAC's entry with all its
/// destinations, as the memory backend does.
pub(super) fn delete_fdb_request(entry: &KernelFdb) -> (RouteNetlinkMessage, u16) {
    (
        RouteNetlinkMessage::DelNeighbour(fdb_message(entry.ifindex, entry.mac)),
        0,
    )
}

impl NetlinkBackend {
    /// Permanent ARP and NDP entries on these devices.
    pub(super) async fn dump_neighbors(
        &self,
        devices: &[u32],
    ) -> Result<Vec<KernelNeighbor>, KernelError> {
        // AF_UNSPEC: the ARP and the NDP tables in one dump.
        self.dump_entries(AddressFamily::Unspec, devices, |entry| entry.neighbor())
            .await
    }

    /// Permanent FDB entries of these devices themselves (`self`) that send
    /// to a remote destination.
    pub(super) async fn dump_fdb(&self, devices: &[u32]) -> Result<Vec<KernelFdb>, KernelError> {
        self.dump_entries(AddressFamily::Bridge, devices, |entry| entry.fdb())
            .await
    }

    /// What `object` makes of the permanent entries of `family` on each
    /// device; the dumps run at once.
    async fn dump_entries<T: Send + 'static>(
        &self,
        family: AddressFamily,
        devices: &[u32],
        object: fn(&Entry) -> Option<T>,
    ) -> Result<Vec<T>, KernelError> {
        let dumps = devices.iter().map(|&ifindex| {
            self.dumps
                .dump(device_dump(family, ifindex), move |message| {
                    let entry = Entry::parse(message.of_type(RTM_NEWNEIGH)?)?;
                    object(&entry).filter(|_| entry.is_permanent())
                })
        });
        let found = futures::future::try_join_all(dumps).await?;
        Ok(found.into_iter().flatten().collect())
    }
}

/// The neighbour's key: family, device and address.
fn neighbor_message(neighbor: &KernelNeighbor) -> NeighbourMessage {
    let mut message = NeighbourMessage::default();
    message.header.family = match neighbor.address {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    message.header.ifindex = neighbor.ifindex;
    message
        .attributes
        .push(NeighbourAttribute::Destination(neighbor.address.into()));
    message
}

/// The FDB entry's key: the device's own (`NTF_SELF`) entry for the MAC.
fn fdb_message(ifindex: u32, mac: MacAddr) -> NeighbourMessage {
    let mut message = NeighbourMessage::default();
    message.header.family = AddressFamily::Bridge;
    message.header.ifindex = ifindex;
    message.header.flags = NeighbourFlags::Own;
    message
        .attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.octets().to_vec()));
    message
}

/// A dump of one device's entries, filtered by the kernel (strict socket).
fn device_dump(family: AddressFamily, ifindex: u32) -> RouteNetlinkMessage {
    let mut message = NeighbourMessage::default();
    message.header.family = family;
    message
        .attributes
        .push(NeighbourAttribute::IfIndex(ifindex));
    RouteNetlinkMessage::GetNeighbour(message)
}

/// An ARP, NDP or FDB entry as the kernel reports it: an RTM_NEWNEIGH or
/// RTM_DELNEIGH payload (struct ndmsg and its attributes), read in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    family: u8,
    pub ifindex: u32,
    /// `NUD_*`
    state: u16,
    /// `NTF_*`
    flags: u8,
    /// NDA_DST: the neighbour's address, an FDB entry's destination.
    pub address: Option<IpAddr>,
    /// NDA_LLADDR; an entry being deleted may have none.
    pub mac: Option<MacAddr>,
}

impl Entry {
    /// `None` for a message too short or with malformed attributes.
    pub fn parse(payload: &[u8]) -> Option<Entry> {
        let header = payload.get(..NDMSG_LEN)?;
        let mut entry = Entry {
            family: header[0],
            ifindex: u32::from_ne_bytes([header[4], header[5], header[6], header[7]]),
            state: u16::from_ne_bytes([header[8], header[9]]),
            flags: header[10],
            address: None,
            mac: None,
        };
        for attribute in raw::attributes(&payload[NDMSG_LEN..]) {
            // Addresses of other lengths (another link type's) are not ours.
            match attribute.ok()? {
                (NDA_DST, value) => entry.address = raw::ip_value(value),
                (NDA_LLADDR, value) => entry.mac = <[u8; 6]>::try_from(value).ok().map(MacAddr),
                _ => {}
            }
        }
        Some(entry)
    }

    /// Exactly `nud permanent`, as vxmgr makes its entries.
    pub fn is_permanent(&self) -> bool {
        self.state == NUD_PERMANENT
    }

    pub fn is_fdb(&self) -> bool {
        self.family == AF_BRIDGE
    }

    /// An ARP/NDP entry (whatever its state).
    pub fn neighbor(&self) -> Option<KernelNeighbor> {
        if !matches!(self.family, AF_INET | AF_INET6) {
            return None;
        }
        Some(KernelNeighbor {
            ifindex: self.ifindex,
            address: self.address?,
            mac: self.mac?,
        })
    }

    /// A device's own (`self`) FDB entry with a remote destination
    /// (whatever its state).
    pub fn fdb(&self) -> Option<KernelFdb> {
        if !self.is_fdb() || self.flags & NTF_SELF == 0 {
            return None;
        }
        Some(KernelFdb {
            ifindex: self.ifindex,
            mac: self.mac?,
            destination: self.address?,
        })
    }
}

#[cfg(test)]
mod tests {
    use rtnetlink::packet_core::Emitable;

    use super::raw::build::attribute;
    use super::*;

    /// An RTM_NEWNEIGH payload as the kernel writes it: struct ndmsg
    /// (family, padding, ifindex, state, flags, type), then attributes.
    fn ndmsg(family: u8, state: u16, flags: u8, attributes: &[Vec<u8>]) -> Vec<u8> {
        let mut payload = vec![family, 0, 0, 0];
        payload.extend_from_slice(&4u32.to_ne_bytes());
        payload.extend_from_slice(&state.to_ne_bytes());
        payload.extend_from_slice(&[flags, 1]);
        payload.extend(attributes.concat());
        payload
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn address(text: &str) -> Vec<u8> {
        match ip(text) {
            IpAddr::V4(ip) => attribute(NDA_DST, &ip.octets()),
            IpAddr::V6(ip) => attribute(NDA_DST, &ip.octets()),
        }
    }

    const MAC: MacAddr = MacAddr([0x66, 0xaa, 0, 0, 0, 2]);

    fn lladdr() -> Vec<u8> {
        attribute(NDA_LLADDR, &MAC.octets())
    }

    #[test]
    fn arp_and_ndp_entries() {
        for (family, text) in [(AF_INET, "10.244.1.0"), (AF_INET6, "fd10:244:1::")] {
            let entry =
                Entry::parse(&ndmsg(family, NUD_PERMANENT, 0, &[address(text), lladdr()])).unwrap();
            assert!(entry.is_permanent());
            assert_eq!(
                entry.neighbor(),
                Some(KernelNeighbor {
                    ifindex: 4,
                    address: ip(text),
                    mac: MAC
                })
            );
            assert_eq!(entry.fdb(), None);
        }
        const NUD_REACHABLE: u16 = 0x02;
        let learned = Entry::parse(&ndmsg(
            AF_INET,
            NUD_REACHABLE,
            0,
            &[address("10.0.0.1"), lladdr()],
        ))
        .unwrap();
        assert!(!learned.is_permanent());
    }

    #[test]
    fn fdb_entries_of_the_device_itself_with_either_destination() {
        for text in ["192.168.10.2", "fd00::2"] {
            let payload = ndmsg(
                AF_BRIDGE,
                NUD_PERMANENT,
                NTF_SELF,
                &[lladdr(), address(text)],
            );
            let entry = Entry::parse(&payload).unwrap();
            assert_eq!(
                entry.fdb(),
                Some(KernelFdb {
                    ifindex: 4,
                    mac: MAC,
                    destination: ip(text)
                })
            );
            assert_eq!(entry.neighbor(), None);
        }
        // A bridge port's entry (NTF_MASTER) is the bridge's, not the device's.
        const NTF_MASTER: u8 = 0x04;
        let port = ndmsg(
            AF_BRIDGE,
            NUD_PERMANENT,
            NTF_MASTER,
            &[lladdr(), address("192.168.10.2")],
        );
        assert_eq!(Entry::parse(&port).unwrap().fdb(), None);
    }

    #[test]
    fn a_deleted_entry_may_lack_its_mac_and_odd_addresses_are_none() {
        let deleted = Entry::parse(&ndmsg(AF_INET, 0, 0, &[address("10.0.0.1")])).unwrap();
        assert_eq!(deleted.mac, None);
        assert_eq!(deleted.address, Some(ip("10.0.0.1")));
        assert_eq!(deleted.neighbor(), None);
        let odd = Entry::parse(&ndmsg(
            AF_INET,
            0,
            0,
            &[attribute(NDA_DST, &[1, 2]), attribute(NDA_LLADDR, &[1; 16])],
        ))
        .unwrap();
        assert_eq!((odd.address, odd.mac), (None, None));
        let mut malformed = ndmsg(AF_INET, 0, 0, &[address("10.0.0.1")]);
        malformed.pop();
        assert_eq!(Entry::parse(&malformed), None);
        assert_eq!(Entry::parse(&[AF_INET, 0]), None);
    }

    #[test]
    fn fdb_key_is_a_self_entry_of_the_device() {
        let mac: MacAddr = "66:aa:00:00:00:02".parse().unwrap();
        let message = fdb_message(4, mac);
        assert_eq!(message.header.family, AddressFamily::Bridge);
        assert_eq!(message.header.flags, NeighbourFlags::Own);
        let mut payload = vec![0; message.buffer_len()];
        message.emit(&mut payload);
        let entry = Entry::parse(&payload).unwrap();
        assert_eq!((entry.ifindex, entry.mac), (4, Some(mac)));
        assert_eq!(entry.fdb(), None, "a delete carries no destination");
    }
}

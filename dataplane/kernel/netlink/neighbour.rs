//! Permanent ARP/NDP entries and FDB entries on the VXLAN devices.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_REPLACE};

use super::NetlinkBackend;
use crate::kernel::KernelError;
use crate::kernel::objects::{KernelFdb, KernelNeighbor};
use crate::model::MacAddr;

impl NetlinkBackend {
    /// `ip neigh replace ADDRESS lladdr MAC dev IFINDEX nud permanent`
    pub(super) async fn replace_neighbor(
        &self,
        neighbor: &KernelNeighbor,
    ) -> Result<(), KernelError> {
        let mut message = neighbor_message(neighbor);
        message.header.state = NeighbourState::Permanent;
        message
            .attributes
            .push(NeighbourAttribute::LinkLayerAddress(
                neighbor.mac.octets().to_vec(),
            ));
        self.change(
            RouteNetlinkMessage::NewNeighbour(message),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
    }

    pub(super) async fn delete_neighbor(
        &self,
        neighbor: &KernelNeighbor,
    ) -> Result<(), KernelError> {
        let message = neighbor_message(neighbor);
        self.change(RouteNetlinkMessage::DelNeighbour(message), 0)
            .await
    }

    /// `bridge fdb replace MAC dev IFINDEX dst DESTINATION self permanent`
    pub(super) async fn replace_fdb(&self, entry: &KernelFdb) -> Result<(), KernelError> {
        let mut message = fdb_message(entry.ifindex, entry.mac);
        message.header.state = NeighbourState::Permanent;
        message
            .attributes
            .push(NeighbourAttribute::Destination(entry.destination.into()));
        self.change(
            RouteNetlinkMessage::NewNeighbour(message),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
    }

    /// Without a destination the kernel removes the MAC's entry with all
    /// its destinations, as the memory backend does.
    pub(super) async fn delete_fdb(&self, entry: &KernelFdb) -> Result<(), KernelError> {
        let message = fdb_message(entry.ifindex, entry.mac);
        self.change(RouteNetlinkMessage::DelNeighbour(message), 0)
            .await
    }

    /// Permanent ARP and NDP entries on these devices.
    pub(super) async fn dump_neighbors(
        &self,
        devices: &[u32],
    ) -> Result<Vec<KernelNeighbor>, KernelError> {
        let mut neighbors = Vec::new();
        for &ifindex in devices {
            // AF_UNSPEC: the ARP and the NDP tables in one dump.
            let replies = self
                .dumps
                .dump(device_dump(AddressFamily::Unspec, ifindex))
                .await?;
            neighbors.extend(replies.iter().filter_map(|reply| match reply {
                RouteNetlinkMessage::NewNeighbour(m) if is_permanent(m) => parse_neighbor(m),
                _ => None,
            }));
        }
        Ok(neighbors)
    }

    /// Permanent FDB entries of these devices themselves (`self`) that send
    /// to a remote destination.
    pub(super) async fn dump_fdb(&self, devices: &[u32]) -> Result<Vec<KernelFdb>, KernelError> {
        let mut entries = Vec::new();
        for &ifindex in devices {
            let replies = self
                .dumps
                .dump(device_dump(AddressFamily::Bridge, ifindex))
                .await?;
            entries.extend(replies.iter().filter_map(|reply| match reply {
                RouteNetlinkMessage::NewNeighbour(m) if is_permanent(m) => parse_fdb(m),
                _ => None,
            }));
        }
        Ok(entries)
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

pub(super) fn is_permanent(message: &NeighbourMessage) -> bool {
    message.header.state == NeighbourState::Permanent
}

/// An ARP/NDP entry (whatever its state).
pub(super) fn parse_neighbor(message: &NeighbourMessage) -> Option<KernelNeighbor> {
    if !matches!(
        message.header.family,
        AddressFamily::Inet | AddressFamily::Inet6
    ) {
        return None;
    }
    let (address, mac) = destination_and_mac(message)?;
    Some(KernelNeighbor {
        ifindex: message.header.ifindex,
        address,
        mac,
    })
}

/// A device's own (`self`) FDB entry with a remote destination (whatever
/// its state).
pub(super) fn parse_fdb(message: &NeighbourMessage) -> Option<KernelFdb> {
    if message.header.family != AddressFamily::Bridge
        || !message.header.flags.contains(NeighbourFlags::Own)
    {
        return None;
    }
    let (destination, mac) = destination_and_mac(message)?;
    Some(KernelFdb {
        ifindex: message.header.ifindex,
        mac,
        destination,
    })
}

/// The neighbour's address (NDA_DST).
pub(super) fn address_of(message: &NeighbourMessage) -> Option<IpAddr> {
    message.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(address) => neighbour_ip(address),
        _ => None,
    })
}

/// The neighbour's MAC (NDA_LLADDR); an entry being deleted may have none.
pub(super) fn mac_of(message: &NeighbourMessage) -> Option<MacAddr> {
    message.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(octets) => {
            <[u8; 6]>::try_from(octets.as_slice()).ok().map(MacAddr)
        }
        _ => None,
    })
}

fn destination_and_mac(message: &NeighbourMessage) -> Option<(IpAddr, MacAddr)> {
    Some((address_of(message)?, mac_of(message)?))
}

/// netlink-packet-route decodes NDA_DST by the message's family, so an FDB
/// entry's (AF_BRIDGE) destination comes as raw bytes.
fn neighbour_ip(address: &NeighbourAddress) -> Option<IpAddr> {
    match address {
        NeighbourAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        NeighbourAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        NeighbourAddress::Other(bytes) => match bytes.len() {
            4 => <[u8; 4]>::try_from(bytes.as_slice())
                .ok()
                .map(|b| IpAddr::V4(Ipv4Addr::from(b))),
            16 => <[u8; 16]>::try_from(bytes.as_slice())
                .ok()
                .map(|b| IpAddr::V6(Ipv6Addr::from(b))),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdb_destinations_come_as_raw_bytes() {
        assert_eq!(
            neighbour_ip(&NeighbourAddress::Other(vec![192, 168, 10, 2])),
            Some("192.168.10.2".parse().unwrap())
        );
        let v6: Ipv6Addr = "fd00::2".parse().unwrap();
        assert_eq!(
            neighbour_ip(&NeighbourAddress::Other(v6.octets().to_vec())),
            Some(IpAddr::V6(v6))
        );
        assert_eq!(neighbour_ip(&NeighbourAddress::Other(vec![1, 2])), None);
    }

    #[test]
    fn fdb_key_is_a_self_entry_of_the_device() {
        let mac: MacAddr = "66:aa:00:00:00:02".parse().unwrap();
        let message = fdb_message(4, mac);
        assert_eq!(message.header.family, AddressFamily::Bridge);
        assert_eq!(message.header.flags, NeighbourFlags::Own);
        assert_eq!(
            destination_and_mac(&message),
            None,
            "a delete carries no destination"
        );
    }
}

//! What interface selection needs from this host (its network namespace):
//! the interfaces with their MTU and addresses, and which interface each
//! family's default route leaves by. Read over rtnetlink; nothing is changed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use netlink_packet_route::address::{AddressAttribute, AddressScope};
use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::route::{RouteAttribute, RouteMessage};
use rtnetlink::RouteMessageBuilder;
use vxmgr::model::Family;

/// An interface and its addresses (link-local ones aside).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    pub mtu: u32,
    pub addresses: Vec<IpNetwork>,
}

/// The host as selection sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNetwork {
    /// By index.
    pub interfaces: Vec<Interface>,
    /// The interface of the IPv4 and of the IPv6 default route, if any.
    pub default_v4: Option<u32>,
    pub default_v6: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
#[error("reading the host's interfaces: {0}")]
pub struct HostError(String);

impl HostNetwork {
    pub async fn read() -> Result<HostNetwork, HostError> {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|e| HostError(e.to_string()))?;
        let task = tokio::spawn(connection);
        let result = read_with(&handle).await;
        task.abort();
        result.map_err(|e| HostError(e.to_string()))
    }
}

async fn read_with(handle: &rtnetlink::Handle) -> Result<HostNetwork, rtnetlink::Error> {
    let mut interfaces: Vec<Interface> = handle
        .link()
        .get()
        .execute()
        .map_ok(|link| Interface {
            index: link.header.index,
            name: link
                .attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::IfName(name) => Some(name.clone()),
                    _ => None,
                })
                .unwrap_or_default(),
            mtu: link
                .attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::Mtu(mtu) => Some(*mtu),
                    _ => None,
                })
                .unwrap_or(0),
            addresses: Vec::new(),
        })
        .try_collect()
        .await?;
    interfaces.sort_by_key(|i| i.index);
    let addresses: Vec<_> = handle.address().get().execute().try_collect().await?;
    for message in addresses {
        // Link-local addresses are no one's to reach this node at.
        if message.header.scope == AddressScope::Link {
            continue;
        }
        // IFA_LOCAL is the interface's own address where both are given.
        let ip = message
            .attributes
            .iter()
            .find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            })
            .or_else(|| {
                message.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })
            });
        let Some(net) = ip.and_then(|ip| IpNetwork::new(ip, message.header.prefix_len).ok()) else {
            continue;
        };
        if let Some(i) = interfaces
            .iter_mut()
            .find(|i| i.index == message.header.index)
        {
            i.addresses.push(net);
        }
    }
    let default_v4 = default_route(
        handle,
        RouteMessageBuilder::<Ipv4Addr>::new().build(),
        Family::V4,
    )
    .await?;
    let default_v6 = default_route(
        handle,
        RouteMessageBuilder::<Ipv6Addr>::new().build(),
        Family::V6,
    )
    .await?;
    Ok(HostNetwork {
        interfaces,
        default_v4,
        default_v6,
    })
}

/// The main table's default route's interface (the first found).
async fn default_route(
    handle: &rtnetlink::Handle,
    dump: RouteMessage,
    family: Family,
) -> Result<Option<u32>, rtnetlink::Error> {
    const MAIN_TABLE: u8 = 254;
    let routes: Vec<RouteMessage> = handle.route().get(dump).execute().try_collect().await?;
    Ok(routes.iter().find_map(|r| {
        let main = r.header.table == MAIN_TABLE;
        let default = r.header.destination_prefix_length == 0;
        let same_family = match family {
            Family::V4 => r.header.address_family == netlink_packet_route::AddressFamily::Inet,
            Family::V6 => r.header.address_family == netlink_packet_route::AddressFamily::Inet6,
        };
        if !(main && default && same_family) {
            return None;
        }
        r.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(index) => Some(*index),
            _ => None,
        })
    }))
}

impl Interface {
    /// The first address of `family`.
    pub fn address(&self, family: Family) -> Option<IpAddr> {
        self.addresses
            .iter()
            .map(|n| n.ip())
            .find(|ip| Family::of_addr(ip) == family)
    }

    /// The networks of `family` on this interface.
    pub fn networks(&self, family: Family) -> impl Iterator<Item = IpNetwork> + '_ {
        self.addresses
            .iter()
            .filter(move |n| Family::of_net(n) == family)
            .map(|n| IpNetwork::new(n.network(), n.prefix()).expect("same prefix"))
    }
}

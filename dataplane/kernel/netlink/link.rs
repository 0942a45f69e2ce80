//! Links and their addresses: the VXLAN devices vxmgr creates and fixes
//! up, and the interface holding a parent address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arcstr::ArcStr;
use ipnetwork::IpNetwork;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use rtnetlink::{AddressMessageBuilder, LinkUnspec, LinkVxlan};

use super::NetlinkBackend;
use crate::desired::ParentInterface;
use crate::kernel::KernelError;
use crate::kernel::objects::{Link, VxlanAttrs, VxlanSpec};
use crate::model::MacAddr;

impl NetlinkBackend {
    /// Creates the device down, as `ip link add` does; the reconciler sets
    /// it up once its address is on.
    pub(super) async fn create_vxlan(&self, spec: &VxlanSpec) -> Result<(), KernelError> {
        let builder = LinkVxlan::new(&spec.name, spec.vni)
            .dev(spec.parent_index)
            .port(spec.port)
            .learning(false)
            .address(spec.mac.octets().to_vec())
            .mtu(spec.mtu);
        let builder = match spec.local {
            IpAddr::V4(ip) => builder.local(ip),
            IpAddr::V6(ip) => builder.local6(ip),
        };
        self.change(
            RouteNetlinkMessage::NewLink(builder.build()),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .await
    }

    pub(super) async fn delete_link(&self, index: u32) -> Result<(), KernelError> {
        let message = LinkUnspec::new_with_index(index).build();
        self.change(RouteNetlinkMessage::DelLink(message), 0).await
    }

    pub(super) async fn set_mtu(&self, index: u32, mtu: u32) -> Result<(), KernelError> {
        let message = LinkUnspec::new_with_index(index).mtu(mtu).build();
        self.change(RouteNetlinkMessage::SetLink(message), 0).await
    }

    pub(super) async fn set_up(&self, index: u32) -> Result<(), KernelError> {
        let message = LinkUnspec::new_with_index(index).up().build();
        self.change(RouteNetlinkMessage::SetLink(message), 0).await
    }

    pub(super) async fn add_address(
        &self,
        index: u32,
        address: IpNetwork,
    ) -> Result<(), KernelError> {
        let mut message = address_message(index, address);
        if address.is_ipv6() {
            // The address is the node's own: duplicate detection would only
            // hold it back.
            message
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        self.change(
            RouteNetlinkMessage::NewAddress(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .await
    }

    pub(super) async fn delete_address(
        &self,
        index: u32,
        address: IpNetwork,
    ) -> Result<(), KernelError> {
        let message = address_message(index, address);
        self.change(RouteNetlinkMessage::DelAddress(message), 0)
            .await
    }

    /// The links with these names that exist.
    pub(super) async fn read_links(&self, names: &[String]) -> Result<Vec<Link>, KernelError> {
        let mut links = Vec::new();
        for name in names {
            let request = LinkUnspec::new_with_name(name).build();
            if let Some(link) = self.read_link(request).await? {
                links.push(link);
            }
        }
        Ok(links)
    }

    /// Whether a link with this index exists (as far as the kernel answers).
    pub(super) async fn link_exists(&self, index: u32) -> bool {
        let request = LinkUnspec::new_with_index(index).build();
        !matches!(
            self.rtnl.request(RouteNetlinkMessage::GetLink(request), 0).await,
            Err(e) if e.is_missing_device()
        )
    }

    /// The link a get request (by name or index) finds, with its addresses
    /// and, for a VXLAN device, its TX checksum offload.
    async fn read_link(&self, request: LinkMessage) -> Result<Option<Link>, KernelError> {
        let replies = match self
            .rtnl
            .request(RouteNetlinkMessage::GetLink(request), 0)
            .await
        {
            Err(e) if e.is_missing_device() => return Ok(None),
            replies => replies?,
        };
        let Some(mut link) = replies.iter().find_map(|reply| match reply {
            RouteNetlinkMessage::NewLink(message) => Some(parse_link(message)),
            _ => None,
        }) else {
            return Ok(None);
        };
        link.addresses = self.addresses(link.index).await?;
        if link.vxlan.is_some() {
            link.tx_checksum = self.ethtool.tx_checksum(&link.name).ok();
        }
        Ok(Some(link))
    }

    /// The addresses of one interface.
    async fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>, KernelError> {
        let mut request = AddressMessage::default();
        request.header.index = index;
        let replies = self
            .address_dumps
            .dump(RouteNetlinkMessage::GetAddress(request))
            .await?;
        Ok(replies
            .iter()
            .filter_map(|reply| match reply {
                RouteNetlinkMessage::NewAddress(m) if m.header.index == index => {
                    IpNetwork::new(address_ip(m)?, m.header.prefix_len).ok()
                }
                _ => None,
            })
            .collect())
    }

    /// The interface holding `address`.
    pub(super) async fn interface_holding(
        &self,
        address: IpAddr,
    ) -> Result<Option<ParentInterface>, KernelError> {
        let mut request = AddressMessage::default();
        request.header.family = match address {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        let replies = self
            .address_dumps
            .dump(RouteNetlinkMessage::GetAddress(request))
            .await?;
        let holder = replies.iter().find_map(|reply| match reply {
            RouteNetlinkMessage::NewAddress(m) if address_ip(m) == Some(address) => {
                Some(m.header.index)
            }
            _ => None,
        });
        let Some(index) = holder else {
            return Ok(None);
        };
        // The interface may have gone since the dump: then nothing holds it.
        let link = self
            .read_link(LinkUnspec::new_with_index(index).build())
            .await?;
        Ok(link.map(|link| ParentInterface {
            name: ArcStr::from(link.name),
            index: link.index,
            mtu: link.mtu,
        }))
    }
}

impl NetlinkBackend {
    /// Every interface's addresses, by interface index.
    pub(super) async fn all_addresses(&self) -> Result<Vec<(u32, IpAddr)>, KernelError> {
        let replies = self
            .address_dumps
            .dump(RouteNetlinkMessage::GetAddress(AddressMessage::default()))
            .await?;
        Ok(replies
            .iter()
            .filter_map(|reply| match reply {
                RouteNetlinkMessage::NewAddress(m) => Some((m.header.index, address_ip(m)?)),
                _ => None,
            })
            .collect())
    }
}

fn address_message(index: u32, address: IpNetwork) -> AddressMessage {
    match address {
        IpNetwork::V4(net) => AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(net.ip(), net.prefix())
            .build(),
        IpNetwork::V6(net) => AddressMessageBuilder::<Ipv6Addr>::new()
            .index(index)
            .address(net.ip(), net.prefix())
            .build(),
    }
}

/// The interface's own address: on a point-to-point IPv4 interface
/// IFA_ADDRESS is the peer's and IFA_LOCAL the interface's.
fn address_ip(message: &AddressMessage) -> Option<IpAddr> {
    let attribute = |local: bool| {
        message.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) if local => Some(*ip),
            AddressAttribute::Address(ip) if !local => Some(*ip),
            _ => None,
        })
    };
    attribute(true).or_else(|| attribute(false))
}

/// A link as the kernel reports it, without its addresses and TX checksum
/// offload (which take requests of their own).
fn parse_link(message: &LinkMessage) -> Link {
    let mut link = Link {
        index: message.header.index,
        name: String::new(),
        mtu: 0,
        mac: None,
        up: message.header.flags.contains(LinkFlags::Up),
        vxlan: None,
        addresses: Vec::new(),
        tx_checksum: None,
    };
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(name) => link.name = name.clone(),
            LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
            LinkAttribute::Address(octets) => {
                link.mac = <[u8; 6]>::try_from(octets.as_slice()).ok().map(MacAddr)
            }
            LinkAttribute::LinkInfo(info) => link.vxlan = parse_vxlan(info),
            _ => {}
        }
    }
    link
}

fn parse_vxlan(info: &[LinkInfo]) -> Option<VxlanAttrs> {
    if !info.contains(&LinkInfo::Kind(InfoKind::Vxlan)) {
        return None;
    }
    let mut vxlan = VxlanAttrs {
        vni: 0,
        port: 0,
        parent_index: None,
        local: None,
        learning: false,
    };
    let data = info.iter().find_map(|i| match i {
        LinkInfo::Data(InfoData::Vxlan(data)) => Some(data),
        _ => None,
    });
    for attribute in data.into_iter().flatten() {
        match attribute {
            InfoVxlan::Id(vni) => vxlan.vni = *vni,
            InfoVxlan::Port(port) => vxlan.port = *port,
            InfoVxlan::Link(index) => vxlan.parent_index = Some(*index),
            InfoVxlan::Local(ip) => vxlan.local = Some(IpAddr::V4(*ip)),
            InfoVxlan::Local6(ip) => vxlan.local = Some(IpAddr::V6(*ip)),
            InfoVxlan::Learning(on) => vxlan.learning = *on,
            _ => {}
        }
    }
    Some(vxlan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_vxlan_link() {
        let spec = VxlanSpec {
            name: "vxlan.calico".into(),
            vni: 4096,
            port: 4789,
            parent_index: 3,
            local: "192.168.10.1".parse().unwrap(),
            mac: "66:aa:00:00:00:01".parse().unwrap(),
            mtu: 1450,
        };
        let mut message = LinkVxlan::new(&spec.name, spec.vni)
            .dev(spec.parent_index)
            .port(spec.port)
            .learning(false)
            .address(spec.mac.octets().to_vec())
            .mtu(spec.mtu)
            .local("192.168.10.1".parse().unwrap())
            .up()
            .build();
        message.header.index = 9;
        assert_eq!(
            parse_link(&message),
            Link {
                index: 9,
                name: spec.name.clone(),
                mtu: 1450,
                mac: Some(spec.mac),
                up: true,
                vxlan: Some(VxlanAttrs {
                    vni: 4096,
                    port: 4789,
                    parent_index: Some(3),
                    local: Some(spec.local),
                    learning: false,
                }),
                addresses: Vec::new(),
                tx_checksum: None,
            }
        );
    }

    #[test]
    fn interface_address_is_the_local_one() {
        let mut message = address_message(2, "10.0.0.1/32".parse().unwrap());
        message
            .attributes
            .retain(|a| !matches!(a, AddressAttribute::Address(_)));
        message
            .attributes
            .push(AddressAttribute::Address("10.0.0.2".parse().unwrap()));
        assert_eq!(address_ip(&message), Some("10.0.0.1".parse().unwrap()));
        let v6 = address_message(2, "fd00::1/128".parse().unwrap());
        assert_eq!(address_ip(&v6), Some("fd00::1".parse().unwrap()));
    }
}

//! Routes in the main table, in the four shapes vxmgr programs, and read
//! back in exactly those shapes so that a resync finds no false drift.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteMetric,
    RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_REPLACE};

use super::NetlinkBackend;
use crate::kernel::KernelError;
use crate::kernel::objects::{KernelRoute, KernelRouteVia};

impl NetlinkBackend {
    pub(super) async fn replace_route(&self, route: &KernelRoute) -> Result<(), KernelError> {
        self.change(
            RouteNetlinkMessage::NewRoute(route_message(route)),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
    }

    pub(super) async fn delete_route(&self, route: &KernelRoute) -> Result<(), KernelError> {
        self.change(RouteNetlinkMessage::DelRoute(delete_message(route)), 0)
            .await
    }

    /// Main-table routes with our protocol or through one of our devices,
    /// leaving out those the kernel makes for addresses and links (such as
    /// `fe80::/64` on every IPv6 device): they are the kernel's.
    pub(super) async fn dump_routes(
        &self,
        protocol: u8,
        devices: &[u32],
    ) -> Result<Vec<KernelRoute>, KernelError> {
        let mut routes = Vec::new();
        let mut seen = HashSet::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let filters = std::iter::once(dump_filter(family, protocol.into(), None)).chain(
                devices
                    .iter()
                    .map(|index| dump_filter(family, RouteProtocol::Unspec, Some(*index))),
            );
            for filter in filters {
                for reply in self
                    .dumps
                    .dump(RouteNetlinkMessage::GetRoute(filter))
                    .await?
                {
                    let RouteNetlinkMessage::NewRoute(message) = reply else {
                        continue;
                    };
                    if message.header.protocol == RouteProtocol::Kernel
                        && u8::from(message.header.protocol) != protocol
                    {
                        continue;
                    }
                    if let Some(route) = parse_route(&message)
                        && seen.insert(route)
                    {
                        routes.push(route);
                    }
                }
            }
        }
        Ok(routes)
    }
}

fn address_family(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

/// `ip route replace` of the route.
fn route_message(route: &KernelRoute) -> RouteMessage {
    let mut message = RouteMessage::default();
    let header = &mut message.header;
    header.address_family = address_family(route.dst.ip());
    header.destination_prefix_length = route.dst.prefix();
    header.table = RouteHeader::RT_TABLE_MAIN;
    header.protocol = RouteProtocol::from(route.protocol);
    header.scope = RouteScope::Universe;
    header.kind = RouteType::Unicast;
    message
        .attributes
        .push(RouteAttribute::Destination(route.dst.ip().into()));
    match route.via {
        KernelRouteVia::Gateway { gateway, ifindex } => {
            message.header.flags.insert(RouteFlags::Onlink);
            message
                .attributes
                .push(RouteAttribute::Gateway(gateway.into()));
            message.attributes.push(RouteAttribute::Oif(ifindex));
        }
        KernelRouteVia::Nexthop(id) => message.attributes.push(RouteAttribute::NhId(id)),
        KernelRouteVia::Link(ifindex) => {
            message.header.scope = RouteScope::Link;
            message.attributes.push(RouteAttribute::Oif(ifindex));
        }
        KernelRouteVia::Blackhole => message.header.kind = RouteType::BlackHole,
    }
    if let Some(mtu) = route.mtu {
        message
            .attributes
            .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
    }
    message
}

/// A delete that matches this route only (not another route to the same
/// destination with another protocol, device or nexthop), whatever its
/// scope.
fn delete_message(route: &KernelRoute) -> RouteMessage {
    let mut message = route_message(route);
    message.header.scope = RouteScope::NoWhere;
    message
        .attributes
        .retain(|a| !matches!(a, RouteAttribute::Metrics(_)));
    message
}

/// A dump of one family's main-table routes with `protocol` (`Unspec`:
/// any) through `oif` (`None`: any), for a strict-check socket.
fn dump_filter(family: AddressFamily, protocol: RouteProtocol, oif: Option<u32>) -> RouteMessage {
    let mut message = RouteMessage::default();
    message.header.address_family = family;
    message.header.table = RouteHeader::RT_TABLE_MAIN;
    message.header.protocol = protocol;
    message.header.scope = RouteScope::Universe;
    // Unspec, not Unicast: a type in the filter would leave blackholes out.
    message.header.kind = RouteType::Unspec;
    if let Some(oif) = oif {
        message.attributes.push(RouteAttribute::Oif(oif));
    }
    message
}

fn route_ip(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

/// The route in the form vxmgr renders it, or `None` for a route of
/// another table or of a shape vxmgr never programs (multipath, unreachable
/// and the like). A route through a nexthop also reports that nexthop's
/// gateway and device (unless the kernel's nexthop_compat_mode is off),
/// and an IPv6 blackhole reports the loopback device: neither changes what
/// the route is.
pub(super) fn parse_route(message: &RouteMessage) -> Option<KernelRoute> {
    let mut table = u32::from(message.header.table);
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut nhid = None;
    let mut mtu = None;
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(a) => dst = route_ip(a),
            RouteAttribute::Gateway(a) => gateway = route_ip(a),
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::NhId(id) => nhid = Some(*id),
            RouteAttribute::Metrics(metrics) => {
                mtu = metrics.iter().find_map(|m| match m {
                    RouteMetric::Mtu(mtu) => Some(*mtu),
                    _ => None,
                })
            }
            _ => {}
        }
    }
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    // A default route has no destination attribute.
    let dst = dst.or(match message.header.address_family {
        AddressFamily::Inet => Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        AddressFamily::Inet6 => Some(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
        _ => None,
    })?;
    let via = match (message.header.kind, nhid, gateway, oif) {
        (RouteType::BlackHole, ..) => KernelRouteVia::Blackhole,
        (RouteType::Unicast, Some(id), ..) => KernelRouteVia::Nexthop(id),
        (RouteType::Unicast, None, Some(gateway), Some(ifindex)) => {
            KernelRouteVia::Gateway { gateway, ifindex }
        }
        (RouteType::Unicast, None, None, Some(ifindex)) => KernelRouteVia::Link(ifindex),
        _ => return None,
    };
    Some(KernelRoute {
        dst: IpNetwork::new(dst, message.header.destination_prefix_length).ok()?,
        protocol: message.header.protocol.into(),
        via,
        mtu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Vec<KernelRoute> {
        let mut routes = Vec::new();
        for (dst, gateway) in [
            ("10.244.1.0/26", "10.244.1.0"),
            ("fd10:244:1::/122", "fd10:244:1::"),
        ] {
            for mtu in [None, Some(1400)] {
                for via in [
                    KernelRouteVia::Gateway {
                        gateway: gateway.parse().unwrap(),
                        ifindex: 4,
                    },
                    KernelRouteVia::Nexthop(0x7678_0000),
                    KernelRouteVia::Link(4),
                    KernelRouteVia::Blackhole,
                ] {
                    routes.push(KernelRoute {
                        dst: dst.parse().unwrap(),
                        protocol: 80,
                        via,
                        mtu,
                    });
                }
            }
        }
        routes
    }

    #[test]
    fn every_shape_parses_back_to_itself() {
        for route in routes() {
            assert_eq!(parse_route(&route_message(&route)), Some(route), "{route}");
        }
    }

    #[test]
    fn a_nexthop_route_in_compat_mode_is_still_a_nexthop_route() {
        let route = KernelRoute {
            dst: "10.244.3.0/26".parse().unwrap(),
            protocol: 80,
            via: KernelRouteVia::Nexthop(100),
            mtu: None,
        };
        let mut message = route_message(&route);
        message.header.flags.insert(RouteFlags::Onlink);
        message.attributes.push(RouteAttribute::Gateway(
            "10.244.3.0".parse::<IpAddr>().unwrap().into(),
        ));
        message.attributes.push(RouteAttribute::Oif(4));
        message.attributes.push(RouteAttribute::Table(254));
        assert_eq!(parse_route(&message), Some(route));
    }

    #[test]
    fn an_ipv6_blackhole_through_lo_is_a_blackhole() {
        let route = KernelRoute {
            dst: "fd10:244:1::/122".parse().unwrap(),
            protocol: 80,
            via: KernelRouteVia::Blackhole,
            mtu: None,
        };
        let mut message = route_message(&route);
        message.attributes.push(RouteAttribute::Oif(1));
        assert_eq!(parse_route(&message), Some(route));
    }

    #[test]
    fn other_tables_and_shapes_are_not_parsed() {
        let route = routes()[0];
        let mut other_table = route_message(&route);
        other_table.attributes.push(RouteAttribute::Table(1000));
        assert_eq!(parse_route(&other_table), None);
        let mut unreachable = route_message(&route);
        unreachable.header.kind = RouteType::Unreachable;
        assert_eq!(parse_route(&unreachable), None);
    }

    #[test]
    fn a_delete_matches_the_route_whatever_its_scope() {
        let route = KernelRoute {
            dst: "10.244.1.5/32".parse().unwrap(),
            protocol: 80,
            via: KernelRouteVia::Link(4),
            mtu: Some(1400),
        };
        let message = delete_message(&route);
        assert_eq!(message.header.scope, RouteScope::NoWhere);
        assert!(message.attributes.contains(&RouteAttribute::Oif(4)));
        assert!(
            !message
                .attributes
                .iter()
                .any(|a| matches!(a, RouteAttribute::Metrics(_)))
        );
    }
}

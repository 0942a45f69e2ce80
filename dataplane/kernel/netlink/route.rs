//! Routes in the main table, in the four shapes vxmgr programs, and read
//! back in exactly those shapes so that a resync finds no false drift.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use netlink_packet_route::route::{
    RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteMetric, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_REPLACE};

use super::NetlinkBackend;
use super::raw::{self, AF_INET, AF_INET6};
use crate::kernel::KernelError;
use crate::kernel::objects::{KernelRoute, KernelRouteVia};

// From linux/rtnetlink.h.
pub(super) const RTM_NEWROUTE: u16 = 24;
pub(super) const RTM_DELROUTE: u16 = 25;
/// Length of struct rtmsg.
const RTMSG_LEN: usize = 12;
const RTN_UNICAST: u8 = 1;
const RTN_BLACKHOLE: u8 = 6;
const RTPROT_KERNEL: u8 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_METRICS: u16 = 8;
const RTA_TABLE: u16 = 15;
const RTA_NH_ID: u16 = 30;
const RTAX_MTU: u16 = 2;

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
    /// `fe80::/64` on every IPv6 device): they are the kernel's. All the
    /// dumps run at once.
    /// Our routes: those with our protocol, and those through our devices
    /// (less the kernel's own). One dump of the main table per family,
    /// filtered here: the kernel can filter a dump by protocol or by device
    /// but not by either, and a dump of each would have it write every one
    /// of our routes twice, which is most of a resync's cost.
    pub(super) async fn dump_routes(
        &self,
        protocol: u8,
        devices: &[u32],
    ) -> Result<Vec<KernelRoute>, KernelError> {
        let dumps = [AddressFamily::Inet, AddressFamily::Inet6].map(|family| {
            let devices = devices.to_vec();
            let ours = move |route: &KernelRoute| {
                route.protocol == protocol
                    || (route.protocol != RTPROT_KERNEL
                        && route.ifindex().is_some_and(|i| devices.contains(&i)))
            };
            self.dumps.dump(
                RouteNetlinkMessage::GetRoute(dump_filter(family)),
                move |message| parse_route(message.of_type(RTM_NEWROUTE)?).filter(&ours),
            )
        });
        let [v4, v6] = dumps;
        let (mut v4, v6) = futures::try_join!(v4, v6)?;
        v4.extend(v6);
        Ok(v4)
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
fn dump_filter(family: AddressFamily) -> RouteMessage {
    let mut message = RouteMessage::default();
    message.header.address_family = family;
    message.header.table = RouteHeader::RT_TABLE_MAIN;
    message.header.protocol = RouteProtocol::Unspec;
    message.header.scope = RouteScope::Universe;
    // Unspec, not Unicast: a type in the filter would leave blackholes out.
    message.header.kind = RouteType::Unspec;
    message
}

/// The route in an RTM_NEWROUTE or RTM_DELROUTE payload (struct rtmsg and
/// its attributes) in the form vxmgr renders it, or `None` for a route of
/// another table or of a shape vxmgr never programs (multipath,
/// unreachable and the like). A route through a nexthop also reports that
/// nexthop's gateway and device (unless the kernel's nexthop_compat_mode
/// is off), and an IPv6 blackhole reports the loopback device: neither
/// changes what the route is.
pub(super) fn parse_route(payload: &[u8]) -> Option<KernelRoute> {
    let header = payload.get(..RTMSG_LEN)?;
    let (family, prefix_len, protocol, kind) = (header[0], header[1], header[5], header[7]);
    let mut table = u32::from(header[4]);
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut nhid = None;
    let mut mtu = None;
    for attribute in raw::attributes(&payload[RTMSG_LEN..]) {
        let (attribute, value) = attribute.ok()?;
        match attribute {
            RTA_TABLE => table = raw::u32_value(value)?,
            RTA_DST => dst = Some(raw::ip_value(value)?),
            RTA_GATEWAY => gateway = Some(raw::ip_value(value)?),
            RTA_OIF => oif = Some(raw::u32_value(value)?),
            RTA_NH_ID => nhid = Some(raw::u32_value(value)?),
            RTA_METRICS => mtu = metrics_mtu(value)?,
            _ => {}
        }
    }
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    // A default route has no destination attribute.
    let dst = dst.or(match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
        _ => None,
    })?;
    let via = match (kind, nhid, gateway, oif) {
        (RTN_BLACKHOLE, ..) => KernelRouteVia::Blackhole,
        (RTN_UNICAST, Some(id), ..) => KernelRouteVia::Nexthop(id),
        (RTN_UNICAST, None, Some(gateway), Some(ifindex)) => {
            KernelRouteVia::Gateway { gateway, ifindex }
        }
        (RTN_UNICAST, None, None, Some(ifindex)) => KernelRouteVia::Link(ifindex),
        _ => return None,
    };
    Some(KernelRoute {
        dst: IpNetwork::new(dst, prefix_len).ok()?,
        protocol,
        via,
        mtu,
    })
}

/// The MTU among a route's metrics (nested RTAX_* attributes), if set;
/// `None` for malformed metrics.
fn metrics_mtu(metrics: &[u8]) -> Option<Option<u32>> {
    let mut mtu = None;
    for metric in raw::attributes(metrics) {
        let (metric, value) = metric.ok()?;
        if metric == RTAX_MTU {
            mtu = Some(raw::u32_value(value)?);
        }
    }
    Some(mtu)
}

#[cfg(test)]
mod tests {
    use rtnetlink::packet_core::Emitable;

    use super::raw::build::attribute;
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

    /// An RTM_NEWROUTE payload as the kernel writes it: struct rtmsg
    /// (family, dst_len, src_len, tos, table, protocol, scope, type,
    /// flags), then the attributes.
    fn rtmsg(family: u8, dst_len: u8, kind: u8, attributes: &[Vec<u8>]) -> Vec<u8> {
        let mut payload = vec![family, dst_len, 0, 0, 254, 80, 0, kind];
        payload.extend_from_slice(&0u32.to_ne_bytes());
        payload.extend(attributes.concat());
        payload
    }

    fn u32_attribute(kind: u16, value: u32) -> Vec<u8> {
        attribute(kind, &value.to_ne_bytes())
    }

    fn ip_attribute(kind: u16, ip: &str) -> Vec<u8> {
        match ip.parse::<IpAddr>().unwrap() {
            IpAddr::V4(ip) => attribute(kind, &ip.octets()),
            IpAddr::V6(ip) => attribute(kind, &ip.octets()),
        }
    }

    fn mtu_attribute(mtu: u32) -> Vec<u8> {
        attribute(RTA_METRICS, &u32_attribute(RTAX_MTU, mtu))
    }

    fn route(dst: &str, via: KernelRouteVia, mtu: Option<u32>) -> Option<KernelRoute> {
        Some(KernelRoute {
            dst: dst.parse().unwrap(),
            protocol: 80,
            via,
            mtu,
        })
    }

    #[test]
    fn every_shape_parses_back_to_itself() {
        for route in routes() {
            let message = route_message(&route);
            let mut payload = vec![0; message.buffer_len()];
            message.emit(&mut payload);
            assert_eq!(parse_route(&payload), Some(route), "{route}");
        }
    }

    #[test]
    fn ipv4_routes_of_every_shape_as_the_kernel_writes_them() {
        let table = u32_attribute(RTA_TABLE, 254);
        let dst = ip_attribute(RTA_DST, "10.244.1.0");
        let gateway = ip_attribute(RTA_GATEWAY, "10.244.1.0");
        let oif = u32_attribute(RTA_OIF, 4);
        let gateway_route = rtmsg(
            AF_INET,
            26,
            RTN_UNICAST,
            &[table.clone(), dst.clone(), gateway.clone(), oif.clone()],
        );
        assert_eq!(
            parse_route(&gateway_route),
            route(
                "10.244.1.0/26",
                KernelRouteVia::Gateway {
                    gateway: "10.244.1.0".parse().unwrap(),
                    ifindex: 4
                },
                None
            )
        );
        let nexthop_route = rtmsg(
            AF_INET,
            26,
            RTN_UNICAST,
            &[
                table.clone(),
                dst.clone(),
                u32_attribute(RTA_NH_ID, 7),
                mtu_attribute(1450),
            ],
        );
        assert_eq!(
            parse_route(&nexthop_route),
            route("10.244.1.0/26", KernelRouteVia::Nexthop(7), Some(1450))
        );
        let link_route = rtmsg(
            AF_INET,
            32,
            RTN_UNICAST,
            &[table.clone(), ip_attribute(RTA_DST, "10.244.1.5"), oif],
        );
        assert_eq!(
            parse_route(&link_route),
            route("10.244.1.5/32", KernelRouteVia::Link(4), None)
        );
        let blackhole = rtmsg(AF_INET, 26, RTN_BLACKHOLE, &[table, dst]);
        assert_eq!(
            parse_route(&blackhole),
            route("10.244.1.0/26", KernelRouteVia::Blackhole, None)
        );
    }

    #[test]
    fn ipv6_routes_of_every_shape_as_the_kernel_writes_them() {
        let table = u32_attribute(RTA_TABLE, 254);
        let dst = ip_attribute(RTA_DST, "fd10:244:1::");
        let oif = u32_attribute(RTA_OIF, 5);
        let gateway_route = rtmsg(
            AF_INET6,
            122,
            RTN_UNICAST,
            &[
                table.clone(),
                dst.clone(),
                ip_attribute(RTA_GATEWAY, "fd10:244:1::"),
                oif.clone(),
                mtu_attribute(1430),
            ],
        );
        assert_eq!(
            parse_route(&gateway_route),
            route(
                "fd10:244:1::/122",
                KernelRouteVia::Gateway {
                    gateway: "fd10:244:1::".parse().unwrap(),
                    ifindex: 5
                },
                Some(1430)
            )
        );
        let nexthop_route = rtmsg(
            AF_INET6,
            122,
            RTN_UNICAST,
            &[table.clone(), dst.clone(), u32_attribute(RTA_NH_ID, 9)],
        );
        assert_eq!(
            parse_route(&nexthop_route),
            route("fd10:244:1::/122", KernelRouteVia::Nexthop(9), None)
        );
        let link_route = rtmsg(
            AF_INET6,
            128,
            RTN_UNICAST,
            &[table.clone(), ip_attribute(RTA_DST, "fd10:244:1::5"), oif],
        );
        assert_eq!(
            parse_route(&link_route),
            route("fd10:244:1::5/128", KernelRouteVia::Link(5), None)
        );
        // The kernel puts IPv6 blackholes on lo.
        let blackhole = rtmsg(
            AF_INET6,
            122,
            RTN_BLACKHOLE,
            &[table, dst, u32_attribute(RTA_OIF, 1)],
        );
        assert_eq!(
            parse_route(&blackhole),
            route("fd10:244:1::/122", KernelRouteVia::Blackhole, None)
        );
    }

    #[test]
    fn a_default_route_has_no_destination_attribute() {
        let oif = u32_attribute(RTA_OIF, 4);
        assert_eq!(
            parse_route(&rtmsg(AF_INET, 0, RTN_UNICAST, std::slice::from_ref(&oif))),
            route("0.0.0.0/0", KernelRouteVia::Link(4), None)
        );
        assert_eq!(
            parse_route(&rtmsg(AF_INET6, 0, RTN_UNICAST, &[oif])),
            route("::/0", KernelRouteVia::Link(4), None)
        );
    }

    #[test]
    fn a_nexthop_route_in_compat_mode_is_still_a_nexthop_route() {
        let payload = rtmsg(
            AF_INET,
            26,
            RTN_UNICAST,
            &[
                u32_attribute(RTA_TABLE, 254),
                ip_attribute(RTA_DST, "10.244.3.0"),
                u32_attribute(RTA_NH_ID, 100),
                ip_attribute(RTA_GATEWAY, "10.244.3.0"),
                u32_attribute(RTA_OIF, 4),
            ],
        );
        assert_eq!(
            parse_route(&payload),
            route("10.244.3.0/26", KernelRouteVia::Nexthop(100), None)
        );
    }

    #[test]
    fn other_tables_and_shapes_are_not_parsed() {
        let dst = ip_attribute(RTA_DST, "10.244.1.0");
        let oif = u32_attribute(RTA_OIF, 4);
        // Tables above 255 are in RTA_TABLE only.
        let other_table = rtmsg(
            AF_INET,
            26,
            RTN_UNICAST,
            &[u32_attribute(RTA_TABLE, 1000), dst.clone(), oif.clone()],
        );
        assert_eq!(parse_route(&other_table), None);
        let mut local_table = rtmsg(AF_INET, 26, RTN_UNICAST, &[dst.clone(), oif.clone()]);
        local_table[4] = 255;
        assert_eq!(parse_route(&local_table), None);
        const RTN_UNREACHABLE: u8 = 7;
        let unreachable = rtmsg(AF_INET, 26, RTN_UNREACHABLE, std::slice::from_ref(&dst));
        assert_eq!(parse_route(&unreachable), None);
        // Multipath: the paths are in RTA_MULTIPATH, no RTA_OIF.
        const RTA_MULTIPATH: u16 = 9;
        let multipath = rtmsg(
            AF_INET,
            26,
            RTN_UNICAST,
            &[dst.clone(), attribute(RTA_MULTIPATH, &[0; 16])],
        );
        assert_eq!(parse_route(&multipath), None);
        let mut malformed = rtmsg(AF_INET, 26, RTN_UNICAST, &[dst, oif]);
        malformed.pop();
        assert_eq!(parse_route(&malformed), None);
        assert_eq!(parse_route(&[AF_INET, 26]), None);
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

//! Routes in the main table, in the four shapes vxmgr programs, and read
//! back in exactly those shapes so that a resync finds no false drift.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU32;

use ipnetwork::IpNetwork;
use netlink_packet_route::route::{
    RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteMetric, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};

use super::NetlinkBackend;
use super::raw::{self, AF_INET, AF_INET6};
use crate::kernel::KernelError;
use crate::kernel::objects::{
    ForeignRoute, KernelRoute, KernelRouteVia, TableRoute, default_metric,
};

// From linux/rtnetlink.h.
pub(super) const RTM_NEWROUTE: u16 = 24;
pub(super) const RTM_DELROUTE: u16 = 25;
/// Length of struct rtmsg.
const RTMSG_LEN: usize = 12;
const RTN_UNICAST: u8 = 1;
const RTN_BLACKHOLE: u8 = 6;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_METRICS: u16 = 8;
const RTA_MULTIPATH: u16 = 9;
/// `RTNH_F_ONLINK`, in struct rtmsg's flags.
const RTNH_F_ONLINK: u32 = 4;
/// Length of struct rtnexthop, which starts each path of RTA_MULTIPATH.
const RTNEXTHOP_LEN: usize = 8;
const RTA_TABLE: u16 = 15;
const RTA_NH_ID: u16 = 30;
const RTAX_MTU: u16 = 2;

/// `ip route add`: the kernel refuses it (EEXIST) when another route
/// holds the place, and vxmgr never overwrites a route it does not own.
pub(super) fn add_request(route: &KernelRoute) -> (RouteNetlinkMessage, u16) {
    (
        RouteNetlinkMessage::NewRoute(route_message(route)),
        NLM_F_CREATE | NLM_F_EXCL,
    )
}

/// What the kernel's refusal of `add_request` means.
pub(super) fn add_refused(route: &KernelRoute, error: KernelError) -> KernelError {
    match error.errno {
        Some(libc::EEXIST) => KernelError {
            errno: error.errno,
            message: format!(
                "another route to {} is in the kernel, and vxmgr does not own it",
                route.dst
            ),
        },
        _ => error,
    }
}

/// `ip route replace` of one of vxmgr's routes.
pub(super) fn replace_request(route: &KernelRoute) -> (RouteNetlinkMessage, u16) {
    (
        RouteNetlinkMessage::NewRoute(route_message(route)),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
}

pub(super) fn delete_request(route: &KernelRoute) -> (RouteNetlinkMessage, u16) {
    (RouteNetlinkMessage::DelRoute(delete_message(route)), 0)
}

impl NetlinkBackend {
    /// Every main-table route, both families at once: whose each one is,
    /// the caller decides (`Ownership::sort_out`). One dump per family
    /// serves both ours and the host's, which vxmgr keeps out of the way of.
    pub(super) async fn dump_routes(&self) -> Result<Vec<TableRoute>, KernelError> {
        let dumps = [AddressFamily::Inet, AddressFamily::Inet6].map(|family| {
            self.dumps.dump(
                RouteNetlinkMessage::GetRoute(dump_filter(family)),
                |message| parse_route(message.of_type(RTM_NEWROUTE)?),
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
    // Explicit, so that a delete matches this metric's route only.
    message
        .attributes
        .push(RouteAttribute::Priority(default_metric(&route.dst)));
    if let Some(mtu) = route.mtu {
        message
            .attributes
            .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu.get())]));
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

/// The main-table route in an RTM_NEWROUTE or RTM_DELROUTE payload (struct
/// rtmsg and its attributes): in the form vxmgr renders it when it has one
/// of vxmgr's shapes, else as a foreign route; `None` for another table or
/// a malformed message. A route through a nexthop also reports that
/// nexthop's gateway and device (unless the kernel's nexthop_compat_mode
/// is off), and an IPv6 blackhole reports the loopback device: neither
/// changes what the route is.
pub(super) fn parse_route(payload: &[u8]) -> Option<TableRoute> {
    let header = payload.get(..RTMSG_LEN)?;
    let (family, prefix_len, protocol, kind) = (header[0], header[1], header[5], header[7]);
    let flags = u32::from_ne_bytes(*header[8..12].first_chunk()?);
    let mut table = u32::from(header[4]);
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut nhid = None;
    let mut mtu = None;
    let mut metric = None;
    let mut paths = Vec::new();
    for attribute in raw::attributes(&payload[RTMSG_LEN..]) {
        let (attribute, value) = attribute.ok()?;
        match attribute {
            RTA_TABLE => table = raw::u32_value(value)?,
            RTA_DST => dst = Some(raw::ip_value(value)?),
            RTA_GATEWAY => gateway = Some(raw::ip_value(value)?),
            RTA_OIF => oif = Some(raw::u32_value(value)?),
            RTA_NH_ID => nhid = Some(raw::u32_value(value)?),
            RTA_METRICS => mtu = metrics_mtu(value)?,
            RTA_PRIORITY => metric = Some(raw::u32_value(value)?),
            RTA_MULTIPATH => paths = multipath_gateways(value)?,
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
    let dst = IpNetwork::new(dst, prefix_len).ok()?;
    let metric = metric.unwrap_or(0);
    let onlink = flags & RTNH_F_ONLINK != 0;
    let shaped = match (kind, nhid, gateway, oif) {
        _ if metric != default_metric(&dst) => None,
        (RTN_BLACKHOLE, ..) => Some(KernelRouteVia::Blackhole),
        (RTN_UNICAST, Some(id), ..) => Some(KernelRouteVia::Nexthop(id)),
        (RTN_UNICAST, None, Some(gateway), Some(ifindex)) if onlink => {
            Some(KernelRouteVia::Gateway { gateway, ifindex })
        }
        (RTN_UNICAST, None, None, Some(ifindex)) => Some(KernelRouteVia::Link(ifindex)),
        _ => None,
    };
    if let Some(via) = shaped {
        return Some(TableRoute::Shaped(KernelRoute {
            dst,
            protocol,
            via,
            mtu,
        }));
    }
    let mut target = match kind {
        RTN_UNICAST => String::new(),
        RTN_BLACKHOLE => "blackhole".to_string(),
        other => format!("type {other}"),
    };
    let gateways: Vec<IpAddr> = gateway.into_iter().chain(paths).collect();
    for gateway in &gateways {
        target = format!("{target} via {gateway}");
    }
    if let Some(ifindex) = oif {
        target = format!("{target} dev #{ifindex}");
    }
    if let Some(id) = nhid {
        target = format!("{target} nhid {id}");
    }
    if onlink {
        target.push_str(" onlink");
    }
    Some(TableRoute::Other(Box::new(ForeignRoute {
        dst,
        protocol,
        metric,
        target: target.trim_start().to_string(),
        gateways,
        ifindex: oif,
    })))
}

/// The gateways of RTA_MULTIPATH's paths (struct rtnexthop, then each
/// path's attributes); `None` when malformed.
fn multipath_gateways(mut value: &[u8]) -> Option<Vec<IpAddr>> {
    let mut gateways = Vec::new();
    while value.len() >= RTNEXTHOP_LEN {
        let len = usize::from(u16::from_ne_bytes(*value.first_chunk()?));
        let path = value.get(RTNEXTHOP_LEN..len)?;
        for attribute in raw::attributes(path) {
            if let (RTA_GATEWAY, gateway) = attribute.ok()? {
                gateways.push(raw::ip_value(gateway)?);
            }
        }
        value = value.get(len.next_multiple_of(4).min(value.len())..)?;
    }
    Some(gateways)
}

/// The MTU among a route's metrics (nested RTAX_* attributes), if set;
/// `None` for malformed metrics.
/// The route's MTU metric (`Some(None)`: none, or 0, which the kernel
/// treats as none).
fn metrics_mtu(metrics: &[u8]) -> Option<Option<NonZeroU32>> {
    let mut mtu = None;
    for metric in raw::attributes(metrics) {
        let (metric, value) = metric.ok()?;
        if metric == RTAX_MTU {
            mtu = NonZeroU32::new(raw::u32_value(value)?);
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
            for mtu in [None, NonZeroU32::new(1400)] {
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
    /// flags), then the attributes; onlink, and IPv6 ones with the
    /// kernel's default metric.
    fn rtmsg(family: u8, dst_len: u8, kind: u8, attributes: &[Vec<u8>]) -> Vec<u8> {
        let mut payload = vec![family, dst_len, 0, 0, 254, 80, 0, kind];
        payload.extend_from_slice(&RTNH_F_ONLINK.to_ne_bytes());
        payload.extend(attributes.concat());
        if family == AF_INET6 {
            payload.extend(u32_attribute(RTA_PRIORITY, 1024));
        }
        payload
    }

    fn shaped(route: Option<KernelRoute>) -> Option<TableRoute> {
        route.map(TableRoute::Shaped)
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

    fn route(dst: &str, via: KernelRouteVia, mtu: Option<u32>) -> Option<TableRoute> {
        shaped(Some(KernelRoute {
            dst: dst.parse().unwrap(),
            protocol: 80,
            via,
            mtu: mtu.and_then(NonZeroU32::new),
        }))
    }

    #[test]
    fn every_shape_parses_back_to_itself() {
        for route in routes() {
            let message = route_message(&route);
            let mut payload = vec![0; message.buffer_len()];
            message.emit(&mut payload);
            assert_eq!(parse_route(&payload), shaped(Some(route)), "{route}");
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
    fn other_tables_are_not_parsed() {
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
        let mut malformed = rtmsg(AF_INET, 26, RTN_UNICAST, &[dst, oif]);
        malformed.pop();
        assert_eq!(parse_route(&malformed), None);
        assert_eq!(parse_route(&[AF_INET, 26]), None);
    }

    fn foreign(payload: &[u8]) -> ForeignRoute {
        match parse_route(payload) {
            Some(TableRoute::Other(route)) => *route,
            other => panic!("not a foreign route: {other:?}"),
        }
    }

    #[test]
    fn other_shapes_are_foreign_routes_with_their_gateways() {
        let dst = ip_attribute(RTA_DST, "10.244.1.0");
        let oif = u32_attribute(RTA_OIF, 4);
        let gateway = ip_attribute(RTA_GATEWAY, "172.0.0.1");
        const RTN_UNREACHABLE: u8 = 7;
        let unreachable = foreign(&rtmsg(
            AF_INET,
            26,
            RTN_UNREACHABLE,
            std::slice::from_ref(&dst),
        ));
        assert_eq!(unreachable.target, "type 7 onlink");
        // A static route: via a gateway, not onlink.
        let mut plain = rtmsg(AF_INET, 0, RTN_UNICAST, &[gateway.clone(), oif.clone()]);
        plain[8..12].copy_from_slice(&0u32.to_ne_bytes());
        let plain = foreign(&plain);
        assert_eq!(plain.dst.to_string(), "0.0.0.0/0");
        assert_eq!(plain.gateways, ["172.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            plain.to_string(),
            "route 0.0.0.0/0 via 172.0.0.1 dev #4 proto 80 metric 0"
        );
        // A DHCP route: another metric.
        let dhcp = foreign(&rtmsg(
            AF_INET,
            26,
            RTN_UNICAST,
            &[dst.clone(), gateway, oif, u32_attribute(RTA_PRIORITY, 100)],
        ));
        assert_eq!(dhcp.metric, 100);
        // Multipath: the paths' gateways are in RTA_MULTIPATH.
        let path = |ifindex: u32, ip: &str| {
            let mut path = 16u16.to_ne_bytes().to_vec();
            path.extend([0, 0]);
            path.extend(ifindex.to_ne_bytes());
            path.extend(ip_attribute(RTA_GATEWAY, ip));
            path
        };
        let paths = [path(4, "172.0.0.1"), path(5, "172.0.1.1")].concat();
        let multipath = foreign(&rtmsg(
            AF_INET,
            26,
            RTN_UNICAST,
            &[dst, attribute(RTA_MULTIPATH, &paths)],
        ));
        assert_eq!(
            multipath.gateways,
            ["172.0.0.1", "172.0.1.1"].map(|ip| ip.parse::<IpAddr>().unwrap())
        );
        assert_eq!(multipath.ifindex, None);
    }

    #[test]
    fn a_delete_matches_the_route_whatever_its_scope() {
        let route = KernelRoute {
            dst: "10.244.1.5/32".parse().unwrap(),
            protocol: 80,
            via: KernelRouteVia::Link(4),
            mtu: NonZeroU32::new(1400),
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

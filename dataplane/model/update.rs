//! Turns a `felix.ToDataplane` into a validated [`Update`], or a rejection
//! that quotes the offending value. This is the only place wire strings are
//! parsed, so the managers never see a malformed address.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::family::Family;
use super::mac::MacAddr;
use crate::wire::felix::{self, to_dataplane::Payload};

/// Longest value quoted verbatim in a rejection reason.
const QUOTE_LIMIT: usize = 80;

/// One message from the calc process, validated.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    InSync,
    Config(BTreeMap<String, String>),
    Route(RouteIntent),
    RouteRemove(IpNetwork),
    /// A VTEP update for a named node; each family's part may be invalid
    /// on its own (see [`VtepPart`]).
    Vtep(VtepUpdate),
    VtepRemove(String),
    /// An IP pool declared or changed, by its id.
    Pool(IpPool),
    /// An IP pool gone, by its id.
    PoolRemove(String),
}

/// A validated IP pool: Felix's `IPAMPool` under its id. The encapsulation
/// modes and allowed uses are not vxmgr's business.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpPool {
    pub id: String,
    /// Masked, never of prefix length 0.
    pub cidr: IpNetwork,
    /// Felix's natOutgoing: traffic from the pool to outside every pool is
    /// masqueraded.
    pub masquerade: bool,
}

/// Felix's `IPPoolType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolType {
    None,
    NoEncap,
    Vxlan,
    Ipip,
    Unknown(i32),
}

impl From<i32> for PoolType {
    fn from(v: i32) -> Self {
        match felix::IpPoolType::try_from(v) {
            Ok(felix::IpPoolType::None) => PoolType::None,
            Ok(felix::IpPoolType::NoEncap) => PoolType::NoEncap,
            Ok(felix::IpPoolType::Vxlan) => PoolType::Vxlan,
            Ok(felix::IpPoolType::Ipip) => PoolType::Ipip,
            Err(_) => PoolType::Unknown(v),
        }
    }
}

/// Felix's `RouteType`, which the calc graph uses as a bitmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteTypes(pub i32);

impl RouteTypes {
    /// Felix's `isType`: every bit of `t` is set.
    pub fn has(self, t: felix::RouteType) -> bool {
        let bits = t as i32;
        self.0 & bits == bits
    }
}

/// What a remote route becomes in the kernel, before VTEP and parent
/// interface are taken into account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteRouteKind {
    /// A remote IPAM block: tunnelled via the node's VTEP, or direct to the
    /// node when same-subnet / no-encap and the parent interface is known.
    Block,
    /// A remote node's tunnel address (or a borrowed one): connected on the device.
    TunnelAddress,
}

/// A validated `RouteUpdate`.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteIntent {
    /// Masked: `172.0.0.1/26` arrives as `172.0.0.0/26`.
    pub dst: IpNetwork,
    pub pool: PoolType,
    pub types: RouteTypes,
    pub node: String,
    pub node_ip: Option<IpAddr>,
    pub same_subnet: bool,
    pub local_workload: bool,
    pub borrowed: bool,
}

impl RouteIntent {
    pub fn family(&self) -> Family {
        Family::of_net(&self.dst)
    }

    fn is_vxlan_or_no_encap(&self) -> bool {
        matches!(self.pool, PoolType::Vxlan | PoolType::NoEncap)
    }

    fn is_remote_tunnel_address(&self) -> bool {
        self.pool == PoolType::Vxlan
            && self.types.has(felix::RouteType::RemoteTunnel)
            && (self.types.has(felix::RouteType::RemoteWorkload) || self.borrowed)
    }

    /// Whether vxmgr keeps this as a route to a remote node, and of which kind.
    pub fn remote_kind(&self) -> Option<RemoteRouteKind> {
        if self.is_remote_tunnel_address() {
            Some(RemoteRouteKind::TunnelAddress)
        } else if self.types.has(felix::RouteType::RemoteWorkload) && self.is_vxlan_or_no_encap() {
            Some(RemoteRouteKind::Block)
        } else {
            None
        }
    }

    /// A block of this node's: blackholed so that unallocated addresses in it
    /// are not routed elsewhere. Single-workload host routes are not blocks.
    pub fn is_local_block(&self) -> bool {
        self.types.has(felix::RouteType::LocalWorkload)
            && self.is_vxlan_or_no_encap()
            && !self.local_workload
            && self.dst.prefix() != self.family().host_prefix()
    }

    /// One of a node's own addresses (Felix's LOCAL_HOST route, as a host
    /// prefix with the node's address): the address that names the parent
    /// interface when the node has no VTEP of this family (host-gw).
    pub fn local_host_address(&self) -> Option<IpAddr> {
        let host = self.types.has(felix::RouteType::LocalHost)
            && self.dst.prefix() == self.family().host_prefix();
        self.node_ip.filter(|_| host)
    }

    /// A no-encap (host-gw) pool's route is never tunnelled: it goes direct
    /// or not at all.
    pub fn is_no_encap(&self) -> bool {
        self.pool == PoolType::NoEncap
    }

    /// The node address to route to over the parent interface, bypassing the
    /// tunnel: same-subnet and no-encap routes that name one.
    pub fn direct_via(&self) -> Option<IpAddr> {
        self.node_ip
            .filter(|_| self.same_subnet || self.is_no_encap())
    }
}

/// The addresses a VTEP has in one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VtepAddresses {
    pub mac: MacAddr,
    /// The VXLAN device's own address on that node.
    pub tunnel_ip: IpAddr,
    /// The underlay address VXLAN packets are sent to (or from, for the local VTEP).
    pub parent_ip: IpAddr,
}

/// One family's part of a VTEP update. Felix runs one VXLAN manager per
/// family, so each part stands or falls on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VtepPart {
    Valid(VtepAddresses),
    /// A malformed part, rejected. Felix keeps a node's newest VTEP even
    /// when its MAC does not parse: it still routes the node's blocks via
    /// the tunnel address, and only leaves out the ARP/FDB entries and the
    /// ipset member. `tunnel_ip` is that address, when it is valid itself.
    Invalid {
        tunnel_ip: Option<IpAddr>,
        rejection: Rejection,
    },
}

/// A `VXLANTunnelEndpointUpdate` with its node name checked: the per-family
/// parts are present only when that family's tunnel address was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VtepUpdate {
    pub node: String,
    pub v4: Option<VtepPart>,
    pub v6: Option<VtepPart>,
}

impl VtepUpdate {
    pub fn part(&self, family: Family) -> Option<&VtepPart> {
        match family {
            Family::V4 => self.v4.as_ref(),
            Family::V6 => self.v6.as_ref(),
        }
    }
}

/// Why a message was rejected. The text quotes the offending value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Rejection(pub String);

impl Rejection {
    pub fn bad_value(field: &str, value: &str, why: impl std::fmt::Display) -> Rejection {
        Rejection(format!("{field} {}: {why}", quote(value)))
    }
}

/// Quotes a value for an error message, shortening very long ones.
pub fn quote(value: &str) -> String {
    if value.chars().count() <= QUOTE_LIMIT {
        format!("{value:?}")
    } else {
        let head: String = value.chars().take(QUOTE_LIMIT).collect();
        format!("{head:?}... ({} bytes)", value.len())
    }
}

impl Update {
    /// Validates one message. `Ok(None)`: nothing vxmgr understands (an
    /// unknown payload), to be ignored and counted.
    pub fn from_message(msg: felix::ToDataplane) -> Result<Option<Update>, Rejection> {
        let Some(payload) = msg.payload else {
            return Ok(None);
        };
        Ok(Some(match payload {
            Payload::InSync(_) => Update::InSync,
            Payload::ConfigUpdate(c) => Update::Config(c.config.into_iter().collect()),
            Payload::RouteUpdate(r) => Update::Route(parse_route(r)?),
            Payload::RouteRemove(r) => {
                Update::RouteRemove(parse_route_dst("route_remove.dst", &r.dst)?)
            }
            Payload::VtepUpdate(v) => Update::Vtep(parse_vtep(v)?),
            Payload::VtepRemove(v) => Update::VtepRemove(parse_node("vtep_remove.node", v.node)?),
            Payload::IpamPoolUpdate(p) => Update::Pool(parse_pool(p)?),
            Payload::IpamPoolRemove(p) => {
                Update::PoolRemove(parse_node("ipam_pool_remove.id", p.id)?)
            }
        }))
    }
}

fn parse_node(field: &str, node: String) -> Result<String, Rejection> {
    if node.is_empty() {
        return Err(Rejection(format!("{field} is empty")));
    }
    Ok(node)
}

/// Parses and masks a CIDR. A bare address is taken as a host route.
pub fn parse_cidr(field: &str, value: &str) -> Result<IpNetwork, Rejection> {
    let bad = || Rejection::bad_value(field, value, "not a CIDR (address/prefix length)");
    let net: IpNetwork = value.parse().map_err(|_| bad())?;
    IpNetwork::new(net.network(), net.prefix()).map_err(|_| bad())
}

/// A route's destination: a CIDR that is not a default route (prefix
/// length 0), which would take every destination from the host's own
/// routes.
fn parse_route_dst(field: &str, value: &str) -> Result<IpNetwork, Rejection> {
    let dst = parse_cidr(field, value)?;
    if dst.prefix() == 0 {
        return Err(Rejection::bad_value(
            field,
            value,
            "a prefix length of 0 would take every destination; vxmgr never programs a default route",
        ));
    }
    Ok(dst)
}

fn parse_ip(field: &str, value: &str, family: Option<Family>) -> Result<IpAddr, Rejection> {
    let ip: IpAddr = value
        .parse()
        .map_err(|_| Rejection::bad_value(field, value, "not an IP address"))?;
    match family {
        Some(f) if Family::of_addr(&ip) != f => Err(Rejection::bad_value(
            field,
            value,
            format_args!("expected an {f} address"),
        )),
        _ => Ok(ip),
    }
}

fn parse_mac(field: &str, value: &str) -> Result<MacAddr, Rejection> {
    value
        .parse()
        .map_err(|e| Rejection::bad_value(field, value, e))
}

fn parse_route(r: felix::RouteUpdate) -> Result<RouteIntent, Rejection> {
    let dst = parse_route_dst("route_update.dst", &r.dst)?;
    let node_ip = if r.dst_node_ip.is_empty() {
        None
    } else {
        Some(parse_ip(
            "route_update.dst_node_ip",
            &r.dst_node_ip,
            Some(Family::of_net(&dst)),
        )?)
    };
    Ok(RouteIntent {
        dst,
        pool: PoolType::from(r.ip_pool_type),
        types: RouteTypes(r.types),
        node: r.dst_node_name,
        node_ip,
        same_subnet: r.same_subnet,
        local_workload: r.local_workload,
        borrowed: r.borrowed,
    })
}

/// A pool needs an id and a CIDR. A prefix length of 0 would make every
/// destination part of the pool (nothing would ever be masqueraded) and
/// accept all forwarded traffic: refused like a default route.
fn parse_pool(p: felix::IpamPoolUpdate) -> Result<IpPool, Rejection> {
    let id = parse_node("ipam_pool_update.id", p.id)?;
    let Some(pool) = p.pool else {
        return Err(Rejection(format!(
            "ipam_pool_update.pool of pool {} is missing",
            quote(&id)
        )));
    };
    let field = "ipam_pool_update.pool.cidr";
    let cidr = parse_cidr(field, &pool.cidr)?;
    if cidr.prefix() == 0 {
        return Err(Rejection::bad_value(
            field,
            &pool.cidr,
            "a pool of prefix length 0 would hold every address",
        ));
    }
    Ok(IpPool {
        id,
        cidr,
        masquerade: pool.masquerade,
    })
}

/// A VTEP update is rejected as a whole only when its node name is bad;
/// otherwise each family's part is checked on its own.
fn parse_vtep(v: felix::VxlanTunnelEndpointUpdate) -> Result<VtepUpdate, Rejection> {
    Ok(VtepUpdate {
        node: parse_node("vtep_update.node", v.node)?,
        v4: parse_vtep_part(
            Family::V4,
            ("vtep_update.mac", &v.mac),
            ("vtep_update.ipv4_addr", &v.ipv4_addr),
            ("vtep_update.parent_device_ip", &v.parent_device_ip),
        ),
        v6: parse_vtep_part(
            Family::V6,
            ("vtep_update.mac_v6", &v.mac_v6),
            ("vtep_update.ipv6_addr", &v.ipv6_addr),
            ("vtep_update.parent_device_ipv6", &v.parent_device_ipv6),
        ),
    })
}

/// A family's part of a VTEP exists when its tunnel address is set; then its
/// MAC and parent address must be valid too.
fn parse_vtep_part(
    family: Family,
    (mac_field, mac): (&str, &str),
    (ip_field, ip): (&str, &str),
    (parent_field, parent): (&str, &str),
) -> Option<VtepPart> {
    if ip.is_empty() {
        return None;
    }
    let tunnel_ip = parse_unicast_ip(ip_field, ip, family);
    let addresses = parse_mac(mac_field, mac).and_then(|mac| {
        Ok(VtepAddresses {
            mac,
            tunnel_ip: tunnel_ip.clone()?,
            parent_ip: parse_unicast_ip(parent_field, parent, family)?,
        })
    });
    Some(match addresses {
        Ok(addresses) => VtepPart::Valid(addresses),
        Err(rejection) => VtepPart::Invalid {
            tunnel_ip: tunnel_ip.ok(),
            rejection,
        },
    })
}

/// A VTEP address is one host's: the kernel would take an unspecified,
/// multicast, loopback or broadcast one and black-hole the tunnel.
fn parse_unicast_ip(field: &str, value: &str, family: Family) -> Result<IpAddr, Rejection> {
    let ip = parse_ip(field, value, Some(family))?;
    let why = if ip.is_unspecified() {
        "the unspecified address"
    } else if ip.is_multicast() {
        "a multicast address"
    } else if ip.is_loopback() {
        "a loopback address"
    } else if matches!(ip, IpAddr::V4(v4) if v4.is_broadcast()) {
        "the broadcast address"
    } else {
        return Ok(ip);
    };
    Err(Rejection::bad_value(
        field,
        value,
        format_args!("{why} cannot be a VTEP address"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dst: &str) -> felix::RouteUpdate {
        felix::RouteUpdate {
            dst: dst.into(),
            ..Default::default()
        }
    }

    fn parse(payload: Payload) -> Result<Option<Update>, Rejection> {
        Update::from_message(felix::ToDataplane {
            sequence_number: 1,
            payload: Some(payload),
        })
    }

    #[test]
    fn cidrs_are_masked() {
        let Ok(Some(Update::Route(r))) = parse(Payload::RouteUpdate(route("172.0.0.1/26"))) else {
            panic!("route rejected")
        };
        assert_eq!(r.dst.to_string(), "172.0.0.0/26");
    }

    #[test]
    fn rejections_quote_the_value() {
        let err = parse(Payload::RouteUpdate(route("10.0.0.300/26"))).unwrap_err();
        assert!(err.0.contains("\"10.0.0.300/26\""), "{err}");
        let err = parse(Payload::RouteRemove(felix::RouteRemove {
            dst: "fd00::/129".into(),
        }))
        .unwrap_err();
        assert!(err.0.contains("\"fd00::/129\""), "{err}");
    }

    #[test]
    fn a_route_of_prefix_length_zero_is_rejected() {
        for dst in ["0.0.0.0/0", "10.1.2.3/0", "::/0"] {
            let err = parse(Payload::RouteUpdate(route(dst))).unwrap_err();
            assert!(err.0.contains("prefix length of 0"), "{dst}: {err}");
        }
    }

    #[test]
    fn node_ip_must_match_dst_family() {
        let mut r = route("10.0.1.0/26");
        r.dst_node_ip = "fd00::1".into();
        let err = parse(Payload::RouteUpdate(r)).unwrap_err();
        assert!(err.0.contains("expected an IPv4 address"), "{err}");
    }

    #[test]
    fn unknown_payload_is_ignored() {
        assert_eq!(
            Update::from_message(felix::ToDataplane::default()),
            Ok(None)
        );
    }

    fn vtep_parts(v: felix::VxlanTunnelEndpointUpdate) -> [Option<VtepPart>; 2] {
        match parse(Payload::VtepUpdate(v)) {
            Ok(Some(Update::Vtep(u))) => [u.v4, u.v6],
            other => panic!("not a VTEP update: {other:?}"),
        }
    }

    /// The rejection of the one invalid family part of a VTEP update.
    fn vtep_rejection(v: felix::VxlanTunnelEndpointUpdate) -> Rejection {
        let invalid: Vec<Rejection> = vtep_parts(v)
            .into_iter()
            .flatten()
            .filter_map(|p| match p {
                VtepPart::Invalid { rejection, .. } => Some(rejection),
                VtepPart::Valid(_) => None,
            })
            .collect();
        assert_eq!(invalid.len(), 1, "{invalid:?}");
        invalid.into_iter().next().unwrap()
    }

    #[test]
    fn vtep_family_parts_follow_tunnel_address() {
        let v = felix::VxlanTunnelEndpointUpdate {
            node: "n".into(),
            mac: "66:aa:00:00:00:01".into(),
            ipv4_addr: "10.0.0.1".into(),
            parent_device_ip: "192.168.0.1".into(),
            ..Default::default()
        };
        let Ok(Some(Update::Vtep(u))) = parse(Payload::VtepUpdate(v.clone())) else {
            panic!()
        };
        assert!(u.v4.is_some() && u.v6.is_none());

        let bad_v6 = felix::VxlanTunnelEndpointUpdate {
            ipv6_addr: "fd00::1".into(),
            mac_v6: "not-a-mac".into(),
            parent_device_ipv6: "fd01::1".into(),
            ..v
        };
        let err = vtep_rejection(bad_v6);
        assert!(err.0.contains("vtep_update.mac_v6 \"not-a-mac\""), "{err}");
    }

    #[test]
    fn each_family_part_stands_alone_and_a_bad_mac_keeps_the_tunnel_address() {
        let v = felix::VxlanTunnelEndpointUpdate {
            node: "n".into(),
            mac: "66:aa:00:00:00:01".into(),
            ipv4_addr: "10.0.0.1".into(),
            parent_device_ip: "192.168.0.1".into(),
            mac_v6: "not-a-mac".into(),
            ipv6_addr: "fd00::1".into(),
            parent_device_ipv6: "fd01::1".into(),
        };
        let [v4, v6] = vtep_parts(v.clone());
        assert!(matches!(v4, Some(VtepPart::Valid(_))), "{v4:?}");
        let Some(VtepPart::Invalid { tunnel_ip, .. }) = v6 else {
            panic!("{v6:?}")
        };
        assert_eq!(tunnel_ip, Some("fd00::1".parse().unwrap()));

        let bad_parent = felix::VxlanTunnelEndpointUpdate {
            parent_device_ip: "nope".into(),
            ..v.clone()
        };
        let [v4, _] = vtep_parts(bad_parent);
        let Some(VtepPart::Invalid { tunnel_ip, .. }) = v4 else {
            panic!("{v4:?}")
        };
        assert_eq!(tunnel_ip, Some("10.0.0.1".parse().unwrap()));

        let bad_tunnel = felix::VxlanTunnelEndpointUpdate {
            ipv4_addr: "10.0.0.300".into(),
            ..v
        };
        let [v4, _] = vtep_parts(bad_tunnel);
        let Some(VtepPart::Invalid {
            tunnel_ip,
            rejection,
        }) = v4
        else {
            panic!("{v4:?}")
        };
        assert_eq!(tunnel_ip, None);
        assert!(rejection.0.contains("\"10.0.0.300\""), "{rejection}");
    }

    #[test]
    fn vtep_addresses_must_be_unicast_host_addresses() {
        let good = felix::VxlanTunnelEndpointUpdate {
            node: "n".into(),
            mac: "66:aa:00:00:00:01".into(),
            ipv4_addr: "10.0.0.1".into(),
            parent_device_ip: "192.168.0.1".into(),
            mac_v6: "66:bb:00:00:00:01".into(),
            ipv6_addr: "fd00::1".into(),
            parent_device_ipv6: "fd01::1".into(),
        };
        assert!(parse(Payload::VtepUpdate(good.clone())).is_ok());
        type Field = fn(&mut felix::VxlanTunnelEndpointUpdate) -> &mut String;
        let cases: [(Field, &str, &str); 8] = [
            (|v| &mut v.ipv4_addr, "0.0.0.0", "unspecified"),
            (|v| &mut v.parent_device_ip, "224.0.0.1", "multicast"),
            (|v| &mut v.ipv4_addr, "127.0.0.1", "loopback"),
            (|v| &mut v.parent_device_ip, "255.255.255.255", "broadcast"),
            (|v| &mut v.ipv6_addr, "::", "unspecified"),
            (|v| &mut v.parent_device_ipv6, "ff02::1", "multicast"),
            (|v| &mut v.ipv6_addr, "::1", "loopback"),
            (|v| &mut v.parent_device_ipv6, "::", "unspecified"),
        ];
        for (field, value, why) in cases {
            let mut v = good.clone();
            *field(&mut v) = value.into();
            let err = vtep_rejection(v);
            assert!(err.0.contains(&format!("{value:?}")), "{err}");
            assert!(err.0.contains(why), "{err}");
        }
    }

    fn pool(id: &str, cidr: &str) -> Payload {
        Payload::IpamPoolUpdate(felix::IpamPoolUpdate {
            id: id.into(),
            pool: Some(felix::IpamPool {
                cidr: cidr.into(),
                masquerade: true,
                ..Default::default()
            }),
        })
    }

    #[test]
    fn pools_are_validated_by_value() {
        let Ok(Some(Update::Pool(p))) = parse(pool("p1", "10.244.1.7/16")) else {
            panic!("pool rejected")
        };
        assert_eq!(
            (p.id.as_str(), p.cidr.to_string()),
            ("p1", "10.244.0.0/16".into())
        );
        assert!(p.masquerade);
        let cases = [
            (pool("p1", "10.244.0.0/33"), "\"10.244.0.0/33\""),
            (pool("p1", "not-a-cidr"), "\"not-a-cidr\""),
            (pool("p1", "0.0.0.0/0"), "prefix length 0"),
            (pool("", "10.244.0.0/16"), "ipam_pool_update.id is empty"),
            (
                Payload::IpamPoolUpdate(felix::IpamPoolUpdate {
                    id: "p1".into(),
                    pool: None,
                }),
                "pool of pool \"p1\" is missing",
            ),
            (
                Payload::IpamPoolRemove(felix::IpamPoolRemove { id: "".into() }),
                "ipam_pool_remove.id is empty",
            ),
        ];
        for (payload, why) in cases {
            let err = parse(payload).unwrap_err();
            assert!(err.0.contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn long_values_are_shortened_in_reasons() {
        let long = "x".repeat(10_000);
        let err = parse(Payload::RouteUpdate(route(&long))).unwrap_err();
        assert!(err.0.len() < 300, "{}", err.0.len());
        assert!(err.0.contains("10000 bytes"));
    }
}

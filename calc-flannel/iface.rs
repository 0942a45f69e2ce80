//! Which interface and addresses this node uses, as flannel picks them:
//! `--iface` (a name or an address; tried in order), else `--iface-regex`
//! (matched against addresses, then names), else the interface of the
//! default route. `--public-ip` / `--public-ipv6` change only what other
//! nodes are told.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use regex::Regex;
use vxmgr::model::Family;

use crate::host::{HostNetwork, Interface};

#[derive(Clone, Debug, Default)]
pub struct IfaceSpec {
    pub ifaces: Vec<String>,
    pub regexes: Vec<Regex>,
    pub public_ip: Option<Ipv4Addr>,
    pub public_ipv6: Option<Ipv6Addr>,
}

/// The node's underlay, per family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Underlay {
    pub interface: String,
    pub mtu: u32,
    /// The interface's addresses: the VXLAN devices send from these.
    pub address_v4: Ipv4Addr,
    pub address_v6: Option<Ipv6Addr>,
    /// What other nodes are told (the interface's addresses unless
    /// overridden).
    pub public_v4: Ipv4Addr,
    pub public_v6: Option<Ipv6Addr>,
    /// The networks the addresses are on.
    pub networks: Vec<IpNetwork>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("no usable interface: {}", .tried.join("; "))]
pub struct NoInterface {
    tried: Vec<String>,
}

/// The interface of one family and its address.
struct Pick<'a> {
    interface: &'a Interface,
    address: IpAddr,
}

fn by_address(host: &HostNetwork, ip: IpAddr) -> Option<&Interface> {
    host.interfaces
        .iter()
        .find(|i| i.addresses.iter().any(|n| n.ip() == ip))
}

/// `interface` with its first address of `family`, or why not.
fn usable(interface: &Interface, family: Family) -> Result<Pick<'_>, String> {
    interface
        .address(family)
        .map(|address| Pick { interface, address })
        .ok_or_else(|| format!("{} has no {family} address", interface.name))
}

pub fn select(spec: &IfaceSpec, host: &HostNetwork, ipv6: bool) -> Result<Underlay, NoInterface> {
    let mut tried = Vec::new();
    let families: &[Family] = if ipv6 { &Family::ALL } else { &[Family::V4] };
    let mut picks: Vec<Pick> = Vec::new();
    if !spec.ifaces.is_empty() {
        for wanted in &spec.ifaces {
            let interface = match wanted.parse::<IpAddr>() {
                Ok(ip) => by_address(host, ip),
                Err(_) => host.interfaces.iter().find(|i| i.name == *wanted),
            };
            let Some(interface) = interface else {
                tried.push(format!("--iface {wanted}: no such interface or address"));
                continue;
            };
            match families
                .iter()
                .map(|f| pick_on(interface, *f, wanted))
                .collect()
            {
                Ok(all) => {
                    picks = all;
                    break;
                }
                Err(why) => tried.push(format!("--iface {wanted}: {why}")),
            }
        }
    } else if !spec.regexes.is_empty() {
        'regexes: for regex in &spec.regexes {
            let by_addr = host.interfaces.iter().filter(|i| {
                i.addresses
                    .iter()
                    .any(|n| regex.is_match(&n.ip().to_string()))
            });
            let by_name = host.interfaces.iter().filter(|i| regex.is_match(&i.name));
            let mut matched = false;
            for interface in by_addr.chain(by_name) {
                matched = true;
                match families.iter().map(|f| usable(interface, *f)).collect() {
                    Ok(all) => {
                        picks = all;
                        break 'regexes;
                    }
                    Err(why) => tried.push(format!("--iface-regex {regex}: {why}")),
                }
            }
            if !matched {
                tried.push(format!(
                    "--iface-regex {regex}: matches no interface or address"
                ));
            }
        }
    } else {
        for family in families {
            let default = match family {
                Family::V4 => host.default_v4,
                // Without an IPv6 default route, IPv6 goes where IPv4 does.
                Family::V6 => host.default_v6.or(host.default_v4),
            };
            let interface =
                default.and_then(|index| host.interfaces.iter().find(|i| i.index == index));
            let Some(interface) = interface else {
                tried.push(format!("no {family} default route"));
                picks.clear();
                break;
            };
            match usable(interface, *family) {
                Ok(pick) => picks.push(pick),
                Err(why) => {
                    tried.push(format!("the {family} default route's interface: {why}"));
                    picks.clear();
                    break;
                }
            }
        }
    }
    let [v4, rest @ ..] = picks.as_slice() else {
        return Err(NoInterface { tried });
    };
    let v6 = rest.first();
    let address_v4 = match v4.address {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => unreachable!("picked for IPv4"),
    };
    let address_v6 = v6.and_then(|p| match p.address {
        IpAddr::V6(a) => Some(a),
        IpAddr::V4(_) => None,
    });
    let mut networks: Vec<IpNetwork> = v4.interface.networks(Family::V4).collect();
    if let Some(v6) = v6 {
        networks.extend(v6.interface.networks(Family::V6));
    }
    Ok(Underlay {
        interface: v4.interface.name.clone(),
        mtu: v4.interface.mtu,
        address_v4,
        address_v6,
        public_v4: spec.public_ip.unwrap_or(address_v4),
        public_v6: spec.public_ipv6.or(address_v6),
        networks,
    })
}

/// `--iface` given as an address picks that address for its family.
fn pick_on<'a>(interface: &'a Interface, family: Family, wanted: &str) -> Result<Pick<'a>, String> {
    match wanted.parse::<IpAddr>() {
        Ok(ip) if Family::of_addr(&ip) == family => Ok(Pick {
            interface,
            address: ip,
        }),
        _ => usable(interface, family),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostNetwork {
        let interface = |index: u32, name: &str, addresses: &[&str]| Interface {
            name: name.into(),
            index,
            mtu: 1500,
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        };
        HostNetwork {
            interfaces: vec![
                interface(1, "lo", &["127.0.0.1/8"]),
                interface(2, "eth0", &["192.168.10.1/24", "fd00:10::1/64"]),
                interface(3, "eth1", &["172.20.0.5/16"]),
                interface(4, "eth2", &[]),
            ],
            default_v4: Some(3),
            default_v6: None,
        }
    }

    fn spec(ifaces: &[&str], regexes: &[&str]) -> IfaceSpec {
        IfaceSpec {
            ifaces: ifaces.iter().map(|s| s.to_string()).collect(),
            regexes: regexes.iter().map(|r| Regex::new(r).unwrap()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_default_routes_interface_unless_told() {
        let u = select(&spec(&[], &[]), &host(), false).unwrap();
        assert_eq!(
            (u.interface.as_str(), u.address_v4.to_string()),
            ("eth1", "172.20.0.5".into())
        );
        assert_eq!(u.networks, ["172.20.0.0/16".parse::<IpNetwork>().unwrap()]);
        let err = select(&spec(&[], &[]), &host(), true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the IPv6 default route's interface: eth1 has no IPv6 address"),
            "{err}"
        );
    }

    #[test]
    fn iface_names_and_addresses_are_tried_in_order() {
        let u = select(&spec(&["eth9", "eth2", "eth0"], &[]), &host(), true).unwrap();
        assert_eq!(u.interface, "eth0");
        assert_eq!(u.address_v6, Some("fd00:10::1".parse().unwrap()));
        assert_eq!(u.networks.len(), 2);
        let u = select(&spec(&["172.20.0.5"], &[]), &host(), false).unwrap();
        assert_eq!(u.interface, "eth1");
        let err = select(&spec(&["eth9", "eth2", "10.9.9.9"], &[]), &host(), false)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "no usable interface: --iface eth9: no such interface or address; \
             --iface eth2: eth2 has no IPv4 address; --iface 10.9.9.9: no such interface or address"
        );
    }

    #[test]
    fn regexes_match_addresses_then_names() {
        let u = select(&spec(&[], &["^192\\.168\\."]), &host(), false).unwrap();
        assert_eq!(u.interface, "eth0");
        let u = select(&spec(&[], &["^nothing$", "eth[01]"]), &host(), false).unwrap();
        assert_eq!(u.interface, "eth0");
        let err = select(&spec(&[], &["^eth2$"]), &host(), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--iface-regex ^eth2$: eth2 has no IPv4 address"),
            "{err}"
        );
    }

    #[test]
    fn public_addresses_override_what_others_are_told() {
        let mut s = spec(&["eth0"], &[]);
        s.public_ip = Some("203.0.113.7".parse().unwrap());
        let u = select(&s, &host(), true).unwrap();
        assert_eq!(u.address_v4.to_string(), "192.168.10.1");
        assert_eq!(u.public_v4.to_string(), "203.0.113.7");
        assert_eq!(u.public_v6, u.address_v6);
    }
}

//! Choosing a subnet for a new lease, as flannel does: among the first 100
//! free subnets of the range, one at random, so that nodes starting at the
//! same time seldom try the same one (the create transaction settles it
//! when they do). A node asks first for the subnet it had before (its
//! subnet file names it), as flanneld does, when that one is still free.

use std::fmt;

use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use vxmgr::subnet_env::Subnets;

use crate::network::NetworkConfig;
use crate::subnet::{SubnetKey, SubnetRange, to_bits};

/// How many free subnets the random choice is made among.
const CANDIDATES: usize = 100;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("no free subnet left: every /{} from {} to {} in {} is leased", .0.subnet_len, .0.min, .0.max, .0.network)]
pub struct NetworkFull(SubnetRange);

/// The subnets this node had before: those its subnet file names, or the
/// lease it held until someone deleted it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Previous {
    pub v4: Option<Ipv4Network>,
    pub v6: Option<Ipv6Network>,
}

impl Previous {
    pub fn is_empty(&self) -> bool {
        self.v4.is_none() && self.v6.is_none()
    }
}

impl From<Subnets> for Previous {
    /// The file names each subnet by its first address: the subnets
    /// themselves are what is asked for.
    fn from(subnets: Subnets) -> Previous {
        let masked = |net: IpNetwork| IpNetwork::new(net.network(), net.prefix()).ok();
        Previous {
            v4: subnets.v4.and_then(masked).and_then(|n| match n {
                IpNetwork::V4(n) => Some(n),
                IpNetwork::V6(_) => None,
            }),
            v6: subnets.v6.and_then(masked).and_then(|n| match n {
                IpNetwork::V6(n) => Some(n),
                IpNetwork::V4(_) => None,
            }),
        }
    }
}

impl From<SubnetKey> for Previous {
    fn from(key: SubnetKey) -> Previous {
        Previous {
            v4: Some(key.v4),
            v6: key.v6,
        }
    }
}

impl fmt::Display for Previous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v4 = self.v4.map(|n| n.to_string());
        let v6 = self.v6.map(|n| n.to_string());
        let names: Vec<String> = v4.into_iter().chain(v6).collect();
        write!(f, "{}", names.join(","))
    }
}

/// Why a node cannot have its previous subnets again.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NotReusable {
    #[error("no IPv4 subnet")]
    NoV4,
    #[error("no IPv6 subnet, and the network is dual-stack")]
    NoV6,
    #[error("{subnet} is not one of the network's subnets (a /{} from {} to {} in {})", .range.subnet_len, .range.min, .range.max, .range.network)]
    OutOfRange {
        subnet: IpNetwork,
        range: SubnetRange,
    },
    #[error("{subnet} overlaps a lease of another node")]
    Leased { subnet: IpNetwork },
}

/// `previous` as a lease key, when it is one the config hands out and
/// nobody in `leased` holds (flanneld's rules for the subnet of its subnet
/// file: in the range, the range's prefix length, not leased). An IPv6
/// subnet on an IPv4-only network is left out.
pub fn reuse(
    config: &NetworkConfig,
    previous: Previous,
    leased: &[SubnetKey],
) -> Result<SubnetKey, NotReusable> {
    let v4 = previous.v4.ok_or(NotReusable::NoV4)?;
    let v6 = match &config.v6 {
        Some(_) => Some(previous.v6.ok_or(NotReusable::NoV6)?),
        None => None,
    };
    let check = |subnet: IpNetwork, range: &SubnetRange, taken: Taken| {
        if !range.holds(&subnet) {
            return Err(NotReusable::OutOfRange {
                subnet,
                range: range.clone(),
            });
        }
        if taken.overlaps(&subnet) {
            return Err(NotReusable::Leased { subnet });
        }
        Ok(())
    };
    check(
        IpNetwork::V4(v4),
        &config.v4,
        Taken::of(leased.iter().map(|k| IpNetwork::V4(k.v4))),
    )?;
    if let (Some(range), Some(v6)) = (&config.v6, v6) {
        check(
            IpNetwork::V6(v6),
            range,
            Taken::of(leased.iter().filter_map(|k| k.v6.map(IpNetwork::V6))),
        )?;
    }
    Ok(SubnetKey { v4, v6 })
}

/// A free subnet of each family the config enables. `random(n)` picks an
/// index below `n`. The IPv6 subnet is the one at the IPv4 subnet's place
/// in its range when that is free: two nodes that want the same IPv4
/// subnet then want the same key, and the create transaction lets one
/// have it.
pub fn choose(
    config: &NetworkConfig,
    leased: &[SubnetKey],
    random: &mut impl FnMut(usize) -> usize,
) -> Result<SubnetKey, NetworkFull> {
    let taken = Taken::of(leased.iter().map(|k| IpNetwork::V4(k.v4)));
    let v4 = pick(&config.v4, &taken, random)?;
    let place = (to_bits(v4.ip()) - to_bits(config.v4.min)) / config.v4.subnet_size();
    let v6 = config
        .v6
        .as_ref()
        .map(|range| {
            let taken = Taken::of(leased.iter().filter_map(|k| k.v6.map(IpNetwork::V6)));
            let paired = usize::try_from(place)
                .ok()
                .and_then(|place| range.subnets().nth(place))
                .filter(|n| !taken.overlaps(n));
            match paired {
                Some(paired) => Ok(paired),
                None => pick(range, &taken, random),
            }
        })
        .transpose()?;
    let (IpNetwork::V4(v4), None | Some(IpNetwork::V6(_))) = (v4, v6) else {
        unreachable!("each range holds subnets of its own family");
    };
    let v6 = v6.and_then(|n| match n {
        IpNetwork::V6(n) => Some(n),
        IpNetwork::V4(_) => None,
    });
    Ok(SubnetKey { v4, v6 })
}

fn pick(
    range: &SubnetRange,
    taken: &Taken,
    random: &mut impl FnMut(usize) -> usize,
) -> Result<IpNetwork, NetworkFull> {
    let free: Vec<IpNetwork> = range
        .subnets()
        .filter(|net| !taken.overlaps(net))
        .take(CANDIDATES)
        .collect();
    if free.is_empty() {
        return Err(NetworkFull(range.clone()));
    }
    Ok(free[random(free.len()) % free.len()])
}

/// Leased address ranges of one family, sorted and merged, so each
/// candidate costs a binary search however many leases there are.
struct Taken(Vec<(u128, u128)>);

fn bounds(net: &IpNetwork) -> (u128, u128) {
    (to_bits(net.network()), to_bits(net.broadcast()))
}

impl Taken {
    fn of(nets: impl Iterator<Item = IpNetwork>) -> Taken {
        let mut ranges: Vec<(u128, u128)> = nets.map(|n| bounds(&n)).collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        Taken(merged)
    }

    fn overlaps(&self, net: &IpNetwork) -> bool {
        let (start, end) = bounds(net);
        let after = self.0.partition_point(|(s, _)| *s <= end);
        after > 0 && self.0[after - 1].1 >= start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> NetworkConfig {
        NetworkConfig::parse(text).unwrap()
    }

    fn key(text: &str) -> SubnetKey {
        text.parse().unwrap()
    }

    #[test]
    fn picks_among_the_first_free_subnets() {
        let c = config(r#"{"Network": "10.0.0.0/16", "Backend": {"Type": "vxlan"}}"#);
        let leased = [key("10.0.1.0-24"), key("10.0.2.0-24"), key("10.0.4.0-23")];
        let mut seen = Vec::new();
        let first = choose(&c, &leased, &mut |n| {
            seen.push(n);
            0
        })
        .unwrap();
        assert_eq!(first.to_string(), "10.0.3.0-24");
        assert_eq!(seen, [100]);
        let last = choose(&c, &leased, &mut |n| n - 1).unwrap();
        assert_eq!(last.to_string(), "10.0.104.0-24");
    }

    #[test]
    fn dual_stack_keys_pair_the_ipv6_subnet_with_the_ipv4_one() {
        let c = config(
            r#"{"Network": "10.0.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00::/48", "Backend": {"Type": "vxlan"}}"#,
        );
        let leased = [key("10.0.1.0-24&fd00:0:0:1::-64")];
        let k = choose(&c, &leased, &mut |_| 0).unwrap();
        assert_eq!(k.to_string(), "10.0.2.0-24&fd00:0:0:2::-64");
        let k = choose(&c, &leased, &mut |_| 5).unwrap();
        assert_eq!(k.to_string(), "10.0.7.0-24&fd00:0:0:7::-64");
        // Its partner taken (a flanneld chooses at random): any free one.
        let leased = [key("10.0.1.0-24&fd00:0:0:2::-64")];
        let k = choose(&c, &leased, &mut |_| 0).unwrap();
        assert_eq!(k.to_string(), "10.0.2.0-24&fd00:0:0:1::-64");
    }

    fn previous(text: &str) -> Previous {
        text.parse::<Subnets>().unwrap().into()
    }

    #[test]
    fn the_previous_subnet_is_reused_when_it_is_free_and_fits() {
        let c = config(r#"{"Network": "10.0.0.0/16", "Backend": {"Type": "vxlan"}}"#);
        let file = previous("FLANNEL_SUBNET=10.0.87.1/24\n");
        assert_eq!(file.to_string(), "10.0.87.0/24");
        let leased = [key("10.0.19.0-24"), key("10.0.86.0-23")];
        let cases = [
            (&leased[..1], Ok(key("10.0.87.0-24"))),
            (
                &leased[..],
                Err("10.0.87.0/24 overlaps a lease of another node"),
            ),
        ];
        for (leased, want) in cases {
            let got = reuse(&c, file, leased).map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_string));
        }
        let err = |text: &str| reuse(&c, previous(text), &[]).unwrap_err().to_string();
        assert_eq!(
            err("FLANNEL_SUBNET=10.1.87.1/24\n"),
            "10.1.87.0/24 is not one of the network's subnets (a /24 from 10.0.1.0 to 10.0.255.0 in 10.0.0.0/16)"
        );
        assert!(err("FLANNEL_SUBNET=10.0.87.1/25\n").contains("10.0.87.0/25 is not one"));
        assert_eq!(err("FLANNEL_MTU=1450\n"), "no IPv4 subnet");
        // An IPv6 subnet of an earlier dual-stack network is left out.
        let k = reuse(
            &c,
            previous("FLANNEL_SUBNET=10.0.87.1/24\nFLANNEL_IPV6_SUBNET=fd00:0:0:57::1/64\n"),
            &[],
        );
        assert_eq!(k, Ok(key("10.0.87.0-24")));
    }

    #[test]
    fn a_dual_stack_node_reuses_both_families() {
        let c = config(
            r#"{"Network": "10.0.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00::/48", "Backend": {"Type": "vxlan"}}"#,
        );
        let file = previous("FLANNEL_SUBNET=10.0.87.1/24\nFLANNEL_IPV6_SUBNET=fd00:0:0:57::1/64\n");
        assert_eq!(
            reuse(&c, file, &[]),
            Ok(key("10.0.87.0-24&fd00:0:0:57::-64"))
        );
        let leased = [key("10.0.3.0-24&fd00:0:0:57::-64")];
        assert_eq!(
            reuse(&c, file, &leased).unwrap_err().to_string(),
            "fd00:0:0:57::/64 overlaps a lease of another node"
        );
        assert_eq!(
            reuse(&c, previous("FLANNEL_SUBNET=10.0.87.1/24\n"), &[]),
            Err(NotReusable::NoV6)
        );
    }

    #[test]
    fn a_full_network_is_an_error_naming_the_range() {
        let c = config(r#"{"Network": "10.0.0.0/28", "Backend": {"Type": "host-gw"}}"#);
        let leased: Vec<SubnetKey> = ["10.0.0.4-30", "10.0.0.8-30", "10.0.0.12-30"]
            .iter()
            .map(|k| key(k))
            .collect();
        let err = choose(&c, &leased, &mut |_| 0).unwrap_err().to_string();
        assert!(
            err.contains("every /30 from 10.0.0.4 to 10.0.0.12 in 10.0.0.0/28"),
            "{err}"
        );
        assert!(choose(&c, &leased[1..], &mut |_| 0).is_ok());
    }

    #[test]
    fn thousands_of_leases_cost_one_search_each() {
        let c = config(r#"{"Network": "10.0.0.0/8", "Backend": {"Type": "vxlan"}}"#);
        let leased: Vec<SubnetKey> = (1..=60_000u32)
            .map(|i| key(&format!("10.{}.{}.0-24", i >> 8, i & 0xff)))
            .collect();
        let k = choose(&c, &leased, &mut |_| 0).unwrap();
        assert_eq!(k.to_string(), "10.234.97.0-24");
    }
}

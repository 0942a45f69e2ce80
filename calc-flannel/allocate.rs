//! Choosing a subnet for a new lease, as flannel does: among the first 100
//! free subnets of the range, one at random, so that nodes starting at the
//! same time seldom try the same one (the create transaction settles it
//! when they do).

use ipnetwork::IpNetwork;

use crate::network::NetworkConfig;
use crate::subnet::{SubnetKey, SubnetRange, to_bits};

/// How many free subnets the random choice is made among.
const CANDIDATES: usize = 100;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("no free subnet left: every /{} from {} to {} in {} is leased", .0.subnet_len, .0.min, .0.max, .0.network)]
pub struct NetworkFull(SubnetRange);

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

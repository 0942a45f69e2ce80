//! The destinations of one remote node's routes, packed: a node has a
//! handful (its blocks and its tunnel address), and a hundred thousand
//! nodes each keeping a list of 18-byte networks on the heap would cost
//! more than their routes themselves. Six IPv4 destinations fit inline.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use smallvec::SmallVec;

/// Each destination is a prefix byte, then the address: an IPv4 prefix
/// length as it is (0–32, then 4 bytes), an IPv6 one plus `V6` (then 16).
#[derive(Clone, Debug, Default)]
pub struct NodeRoutes {
    bytes: SmallVec<[u8; 30]>,
}

const V6: u8 = 64;

impl NodeRoutes {
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn push(&mut self, dst: IpNetwork) {
        match dst {
            IpNetwork::V4(net) => {
                self.bytes.push(net.prefix());
                self.bytes.extend_from_slice(&net.ip().octets());
            }
            IpNetwork::V6(net) => {
                self.bytes.push(V6 + net.prefix());
                self.bytes.extend_from_slice(&net.ip().octets());
            }
        }
    }

    /// Removes `dst` if it is there.
    pub fn remove(&mut self, dst: IpNetwork) {
        let mut at = 0;
        while let Some((net, len)) = self.decode(at) {
            if net == dst {
                self.bytes.drain(at..at + len);
                return;
            }
            at += len;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = IpNetwork> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            let (net, len) = self.decode(at)?;
            at += len;
            Some(net)
        })
    }

    /// The destination encoded at `at`, and its length in bytes.
    fn decode(&self, at: usize) -> Option<(IpNetwork, usize)> {
        let prefix = *self.bytes.get(at)?;
        let address = &self.bytes[at + 1..];
        Some(if prefix < V6 {
            let octets: [u8; 4] = address[..4].try_into().ok()?;
            let net = Ipv4Network::new(Ipv4Addr::from(octets), prefix).ok()?;
            (IpNetwork::V4(net), 5)
        } else {
            let octets: [u8; 16] = address[..16].try_into().ok()?;
            let net = Ipv6Network::new(Ipv6Addr::from(octets), prefix - V6).ok()?;
            (IpNetwork::V6(net), 17)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::NodeRoutes;
    use ipnetwork::IpNetwork;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    #[test]
    fn holds_both_families_and_removes_any_one() {
        let all = [
            "10.0.0.0/26",
            "0.0.0.0/0",
            "fd00::/64",
            "10.0.0.64/26",
            "10.9.8.7/32",
            "fd00:1::5/128",
        ]
        .map(net);
        let mut routes = NodeRoutes::default();
        for dst in all {
            routes.push(dst);
        }
        assert_eq!(routes.iter().collect::<Vec<_>>(), all);
        routes.remove(net("fd00::/64"));
        routes.remove(net("10.0.0.0/26"));
        routes.remove(net("10.1.0.0/26"));
        assert_eq!(
            routes.iter().collect::<Vec<_>>(),
            [all[1], all[3], all[4], all[5]]
        );
        for dst in [all[1], all[3], all[4], all[5]] {
            routes.remove(dst);
        }
        assert!(routes.is_empty());
    }

    #[test]
    fn six_ipv4_destinations_fit_inline() {
        let mut routes = NodeRoutes::default();
        for i in 0..6 {
            routes.push(net(&format!("10.0.{i}.0/26")));
        }
        assert!(!routes.bytes.spilled());
        assert!(std::mem::size_of::<NodeRoutes>() <= 40);
    }
}

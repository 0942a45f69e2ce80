//! Subnets as flannel names them in etcd: the lease key `10.244.3.0-24`,
//! or `10.244.3.0-24&fd00:244:0:3::-64` for a dual-stack lease (the
//! address, `-`, the prefix length; `&` between the families), and the
//! arithmetic over a range of equal-sized subnets.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};

/// The subnets of one lease: always an IPv4 one (flannel's etcd layout keys
/// every lease by it), and an IPv6 one on dual-stack networks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubnetKey {
    pub v4: Ipv4Network,
    pub v6: Option<Ipv6Network>,
}

impl fmt::Display for SubnetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.v4.network(), self.v4.prefix())?;
        if let Some(v6) = self.v6 {
            write!(f, "&{}-{}", v6.network(), v6.prefix())?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{key:?} is not a subnet key (like 10.244.3.0-24 or 10.244.3.0-24&fd00:244:0:3::-64): {why}"
)]
pub struct KeyError {
    key: String,
    why: &'static str,
}

impl FromStr for SubnetKey {
    type Err = KeyError;

    fn from_str(key: &str) -> Result<SubnetKey, KeyError> {
        let bad = |why| KeyError {
            key: key.to_string(),
            why,
        };
        let (v4, v6) = match key.split_once('&') {
            Some((v4, v6)) => (v4, Some(v6)),
            None => (key, None),
        };
        let v4 = match subnet::<Ipv4Addr>(v4).map_err(bad)? {
            IpNetwork::V4(n) => n,
            IpNetwork::V6(_) => return Err(bad("the first subnet is not IPv4")),
        };
        let v6 = match v6.map(subnet::<Ipv6Addr>).transpose().map_err(bad)? {
            Some(IpNetwork::V6(n)) => Some(n),
            Some(IpNetwork::V4(_)) => return Err(bad("the second subnet is not IPv6")),
            None => None,
        };
        Ok(SubnetKey { v4, v6 })
    }
}

/// `address-length` of one family, the address being the subnet's first.
fn subnet<A: FromStr + Into<IpAddr>>(part: &str) -> Result<IpNetwork, &'static str> {
    let (address, length) = part
        .rsplit_once('-')
        .ok_or("no '-' before the prefix length")?;
    let address: IpAddr = address.parse::<A>().map_err(|_| "not an address")?.into();
    let length: u8 = length.parse().map_err(|_| "not a prefix length")?;
    let net = IpNetwork::new(address, length).map_err(|_| "prefix length out of range")?;
    if net.network() != address {
        return Err("the address is not the subnet's first");
    }
    Ok(net)
}

/// Bits in an address of `net`'s family.
fn width(net: &IpNetwork) -> u8 {
    match net {
        IpNetwork::V4(_) => 32,
        IpNetwork::V6(_) => 128,
    }
}

pub fn to_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4).into(),
        IpAddr::V6(v6) => v6.into(),
    }
}

/// The address of `like`'s family with these bits.
pub fn from_bits(like: &IpNetwork, bits: u128) -> IpAddr {
    match like {
        IpNetwork::V4(_) => IpAddr::V4(Ipv4Addr::from(bits as u32)),
        IpNetwork::V6(_) => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

/// Where a family's leases come from: subnets of `subnet_len` bits in
/// `network`, starting from `min` up to and including `max`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubnetRange {
    pub network: IpNetwork,
    pub subnet_len: u8,
    pub min: IpAddr,
    pub max: IpAddr,
}

impl SubnetRange {
    /// Addresses in one subnet.
    pub fn subnet_size(&self) -> u128 {
        1u128 << (width(&self.network) - self.subnet_len)
    }

    /// Whether `net` is one of this range's subnets.
    pub fn holds(&self, net: &IpNetwork) -> bool {
        let start = to_bits(net.ip());
        net.prefix() == self.subnet_len
            && net.is_ipv4() == self.network.is_ipv4()
            && (to_bits(self.min)..=to_bits(self.max)).contains(&start)
    }

    /// Every subnet from `min` to `max`, in order.
    pub fn subnets(&self) -> impl Iterator<Item = IpNetwork> + '_ {
        let size = self.subnet_size();
        let (min, max) = (to_bits(self.min), to_bits(self.max));
        (0..)
            .map(move |i: u128| min.checked_add(i.checked_mul(size)?))
            .map_while(move |start| start.filter(|s| *s <= max))
            .map(|start| {
                IpNetwork::new(from_bits(&self.network, start), self.subnet_len)
                    .expect("the subnet length was checked against the network")
            })
    }
}

/// The first address of a subnet plus `n` (flannel gives the subnet's
/// network address to the VXLAN device and its next one to the bridge).
pub fn nth_address(net: &IpNetwork, n: u128) -> IpAddr {
    from_bits(net, to_bits(net.network()) + n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_flannels() {
        for text in ["10.244.3.0-24", "10.244.3.0-24&fd00:244:0:3::-64"] {
            let key: SubnetKey = text.parse().unwrap();
            assert_eq!(key.to_string(), text);
        }
        let key: SubnetKey = "10.244.58.0-24&fd00:244:0:3a::-64".parse().unwrap();
        assert_eq!(key.v4.to_string(), "10.244.58.0/24");
        assert_eq!(key.v6.unwrap().to_string(), "fd00:244:0:3a::/64");
    }

    #[test]
    fn bad_keys_say_why() {
        for (text, why) in [
            ("10.244.3.0/24", "no '-'"),
            ("10.244.3.5-24", "not the subnet's first"),
            ("10.244.3.0-33", "out of range"),
            ("10.244.3.0-x", "not a prefix length"),
            ("fd00::-64", "not an address"),
            ("10.244.3.0-24&10.0.0.0-8", "not an address"),
            ("10.244.3.0-24&fd00::1-64", "not the subnet's first"),
            ("config", "no '-'"),
        ] {
            let err = text.parse::<SubnetKey>().unwrap_err().to_string();
            assert!(err.contains(why) && err.contains(text), "{text}: {err}");
        }
    }

    #[test]
    fn ranges_list_their_subnets_and_hold_only_them() {
        let range = SubnetRange {
            network: "10.244.0.0/16".parse().unwrap(),
            subnet_len: 24,
            min: "10.244.1.0".parse().unwrap(),
            max: "10.244.255.0".parse().unwrap(),
        };
        let all: Vec<IpNetwork> = range.subnets().collect();
        assert_eq!(all.len(), 255);
        assert_eq!(all[0].to_string(), "10.244.1.0/24");
        assert_eq!(all[254].to_string(), "10.244.255.0/24");
        assert!(range.holds(&"10.244.7.0/24".parse().unwrap()));
        assert!(!range.holds(&"10.244.0.0/24".parse().unwrap()));
        assert!(!range.holds(&"10.244.7.0/25".parse().unwrap()));
        assert!(!range.holds(&"fd00::/24".parse().unwrap()));

        let v6 = SubnetRange {
            network: "fd00:244::/48".parse().unwrap(),
            subnet_len: 64,
            min: "fd00:244:0:1::".parse().unwrap(),
            max: "fd00:244:0:ffff::".parse().unwrap(),
        };
        assert_eq!(v6.subnets().count(), 0xffff);
        assert_eq!(
            nth_address(&"fd00:244:0:3::/64".parse().unwrap(), 1).to_string(),
            "fd00:244:0:3::1"
        );
    }
}

//! flannel's `subnet.env`: what the subnet manager tells the CNI plugin
//! about this node (the networks, the node's subnets, the MTU, whether it
//! masquerades). One type with its text both ways, so the writer
//! (calc-flannel) and the reader (the `flannel` CNI plugin) agree on it.

use std::fmt;
use std::str::FromStr;

use ipnetwork::IpNetwork;

/// The file's content. Subnets keep the address flannel writes (the
/// subnet's first address, e.g. `10.244.58.1/24`); [`IpNetwork::network`]
/// gives the subnet itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubnetEnv {
    /// `FLANNEL_NETWORK`: the IPv4 networks (flannel writes a comma-separated list).
    pub networks: Vec<IpNetwork>,
    /// `FLANNEL_SUBNET`.
    pub subnet: Option<IpNetwork>,
    /// `FLANNEL_IPV6_NETWORK`.
    pub ipv6_networks: Vec<IpNetwork>,
    /// `FLANNEL_IPV6_SUBNET`.
    pub ipv6_subnet: Option<IpNetwork>,
    /// `FLANNEL_MTU`.
    pub mtu: u32,
    /// `FLANNEL_IPMASQ`: the subnet manager masquerades the pods' traffic
    /// itself (so the CNI plugin should not).
    pub ip_masq: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubnetEnvError {
    #[error("line {line}: {text:?}: {reason}")]
    Line {
        line: usize,
        text: String,
        reason: String,
    },
    #[error("missing {0}")]
    Missing(String),
}

const NETWORK: &str = "FLANNEL_NETWORK";
const SUBNET: &str = "FLANNEL_SUBNET";
const IPV6_NETWORK: &str = "FLANNEL_IPV6_NETWORK";
const IPV6_SUBNET: &str = "FLANNEL_IPV6_SUBNET";
const MTU: &str = "FLANNEL_MTU";
const IPMASQ: &str = "FLANNEL_IPMASQ";

impl fmt::Display for SubnetEnv {
    /// The text calc-flannel writes: one `KEY=value` a line, IPv6 lines
    /// only for a dual-stack node.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |nets: &[IpNetwork]| {
            nets.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        if !self.networks.is_empty() {
            writeln!(f, "{NETWORK}={}", list(&self.networks))?;
        }
        if let Some(subnet) = self.subnet {
            writeln!(f, "{SUBNET}={subnet}")?;
        }
        if !self.ipv6_networks.is_empty() {
            writeln!(f, "{IPV6_NETWORK}={}", list(&self.ipv6_networks))?;
        }
        if let Some(subnet) = self.ipv6_subnet {
            writeln!(f, "{IPV6_SUBNET}={subnet}")?;
        }
        writeln!(f, "{MTU}={}\n{IPMASQ}={}", self.mtu, self.ip_masq)
    }
}

impl FromStr for SubnetEnv {
    type Err = SubnetEnvError;

    /// Parses what flannel (and calc-flannel) writes. As flannel's CNI
    /// plugin requires: a network and a subnet of at least one family, the
    /// MTU and IPMASQ. Unknown keys are skipped; blank and `#` lines too.
    fn from_str(text: &str) -> Result<SubnetEnv, SubnetEnvError> {
        let mut networks = None;
        let mut subnet = None;
        let mut ipv6_networks = None;
        let mut ipv6_subnet = None;
        let mut mtu = None;
        let mut ip_masq = None;
        for entry in entries(text) {
            let entry = entry?;
            let bad = |reason| entry.bad(reason);
            let value = entry.value;
            match entry.key {
                NETWORK => networks = Some(parse_list(value, false, NETWORK).map_err(bad)?),
                SUBNET => subnet = Some(parse_one(value, false, SUBNET).map_err(bad)?),
                IPV6_NETWORK => {
                    ipv6_networks = Some(parse_list(value, true, IPV6_NETWORK).map_err(bad)?)
                }
                IPV6_SUBNET => {
                    ipv6_subnet = Some(parse_one(value, true, IPV6_SUBNET).map_err(bad)?)
                }
                MTU => {
                    mtu = Some(
                        value
                            .parse::<u32>()
                            .ok()
                            .filter(|m| *m > 0)
                            .ok_or_else(|| bad(format!("{MTU}: not an MTU")))?,
                    )
                }
                IPMASQ => {
                    ip_masq = Some(
                        parse_bool(value).ok_or_else(|| bad(format!("{IPMASQ}: not a boolean")))?,
                    )
                }
                _ => {}
            }
        }
        let mut missing = Vec::new();
        if networks.is_none() && ipv6_networks.is_none() {
            missing.push(format!("{NETWORK} or {IPV6_NETWORK}"));
        }
        if subnet.is_none() && ipv6_subnet.is_none() {
            missing.push(format!("{SUBNET} or {IPV6_SUBNET}"));
        }
        if mtu.is_none() {
            missing.push(MTU.into());
        }
        if ip_masq.is_none() {
            missing.push(IPMASQ.into());
        }
        if !missing.is_empty() {
            return Err(SubnetEnvError::Missing(missing.join(", ")));
        }
        Ok(SubnetEnv {
            networks: networks.unwrap_or_default(),
            subnet,
            ipv6_networks: ipv6_networks.unwrap_or_default(),
            ipv6_subnet,
            mtu: mtu.unwrap_or_default(),
            ip_masq: ip_masq.unwrap_or_default(),
        })
    }
}

/// The subnets a file names, as flanneld reads them back when it starts
/// (to ask for the same ones again): only `FLANNEL_SUBNET` and
/// `FLANNEL_IPV6_SUBNET` count, the rest of the file may be anything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Subnets {
    pub v4: Option<IpNetwork>,
    pub v6: Option<IpNetwork>,
}

impl FromStr for Subnets {
    type Err = SubnetEnvError;

    fn from_str(text: &str) -> Result<Subnets, SubnetEnvError> {
        let mut subnets = Subnets::default();
        for entry in entries(text) {
            let entry = entry?;
            match entry.key {
                SUBNET => {
                    subnets.v4 =
                        Some(parse_one(entry.value, false, SUBNET).map_err(|r| entry.bad(r))?)
                }
                IPV6_SUBNET => {
                    subnets.v6 =
                        Some(parse_one(entry.value, true, IPV6_SUBNET).map_err(|r| entry.bad(r))?)
                }
                _ => {}
            }
        }
        Ok(subnets)
    }
}

/// One `KEY=value` line.
struct Entry<'a> {
    line: usize,
    raw: &'a str,
    key: &'a str,
    value: &'a str,
}

impl Entry<'_> {
    fn bad(&self, reason: String) -> SubnetEnvError {
        SubnetEnvError::Line {
            line: self.line,
            text: self.raw.to_string(),
            reason,
        }
    }
}

/// The file's `KEY=value` lines, trimmed; blank and `#` lines skipped.
fn entries(text: &str) -> impl Iterator<Item = Result<Entry<'_>, SubnetEnvError>> {
    text.lines().enumerate().filter_map(|(index, raw)| {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let mut entry = Entry {
            line: index + 1,
            raw,
            key: "",
            value: "",
        };
        Some(match line.split_once('=') {
            Some((key, value)) => {
                entry.key = key.trim();
                entry.value = value.trim();
                Ok(entry)
            }
            None => Err(entry.bad("not KEY=value".into())),
        })
    })
}

fn parse_one(value: &str, v6: bool, key: &str) -> Result<IpNetwork, String> {
    // ipnetwork takes a bare address as a /32 (/128); flannel wants CIDRs.
    if !value.contains('/') {
        return Err(format!("{key}: {value:?} is not a CIDR: no prefix length"));
    }
    let net: IpNetwork = value
        .parse()
        .map_err(|e| format!("{key}: {value:?} is not a CIDR: {e}"))?;
    if net.is_ipv6() != v6 {
        let family = if v6 { "IPv6" } else { "IPv4" };
        return Err(format!("{key}: {value} is not {family}"));
    }
    Ok(net)
}

fn parse_list(value: &str, v6: bool, key: &str) -> Result<Vec<IpNetwork>, String> {
    value
        .split(',')
        .map(|part| parse_one(part.trim(), v6, key))
        .collect()
}

/// Go's `strconv.ParseBool`, which flannel's plugin uses.
fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUAL_STACK: &str = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.58.1/24\n\
         FLANNEL_IPV6_NETWORK=fd00:244::/48\nFLANNEL_IPV6_SUBNET=fd00:244:0:3::1/64\n\
         FLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n";

    #[test]
    fn reads_what_it_writes() {
        let env: SubnetEnv = DUAL_STACK.parse().unwrap();
        assert_eq!(env.subnet.unwrap().to_string(), "10.244.58.1/24");
        assert_eq!(env.subnet.unwrap().network().to_string(), "10.244.58.0");
        assert_eq!(env.ipv6_networks[0].to_string(), "fd00:244::/48");
        assert_eq!((env.mtu, env.ip_masq), (1450, false));
        assert_eq!(env.to_string(), DUAL_STACK);
    }

    #[test]
    fn flannels_own_variants() {
        let env: SubnetEnv = "# written by flanneld\n\nFLANNEL_NETWORK=10.1.0.0/16, 10.2.0.0/16\n\
             FLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=TRUE\nFLANNEL_OTHER=x\n"
            .parse()
            .unwrap();
        assert_eq!(env.networks.len(), 2);
        assert!(env.ip_masq);
        assert_eq!(env.ipv6_subnet, None);
        let v6_only: SubnetEnv =
            "FLANNEL_IPV6_NETWORK=fd00::/48\nFLANNEL_IPV6_SUBNET=fd00:0:0:1::1/64\n\
             FLANNEL_MTU=1450\nFLANNEL_IPMASQ=0\n"
                .parse()
                .unwrap();
        assert!(v6_only.networks.is_empty() && v6_only.subnet.is_none());
    }

    #[test]
    fn the_subnets_alone_are_read_back() {
        let subnets: Subnets = DUAL_STACK.parse().unwrap();
        assert_eq!(subnets.v4.unwrap().to_string(), "10.244.58.1/24");
        assert_eq!(subnets.v6.unwrap().to_string(), "fd00:244:0:3::1/64");
        // Nothing else is needed, nor checked.
        let only: Subnets = "FLANNEL_SUBNET=10.244.87.1/24\nFLANNEL_MTU=big\n"
            .parse()
            .unwrap();
        assert_eq!(only.v4.unwrap().to_string(), "10.244.87.1/24");
        assert_eq!(only.v6, None);
        assert_eq!("".parse::<Subnets>().unwrap(), Subnets::default());
        let error = "FLANNEL_IPV6_SUBNET=10.0.0.1/24\n"
            .parse::<Subnets>()
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("line 1") && error.contains("is not IPv6"),
            "{error}"
        );
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        let cases = [
            (
                "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.300.1/24\n",
                "line 2",
                "FLANNEL_SUBNET",
            ),
            ("FLANNEL_SUBNET=fd00::1/64\n", "line 1", "is not IPv4"),
            ("FLANNEL_SUBNET=10.244.58.1\n", "line 1", "no prefix length"),
            ("FLANNEL_MTU=big\n", "line 1", "FLANNEL_MTU: not an MTU"),
            (
                "FLANNEL_IPMASQ=maybe\n",
                "line 1",
                "FLANNEL_IPMASQ: not a boolean",
            ),
            ("\nflannel\n", "line 2", "not KEY=value"),
        ];
        for (text, line, field) in cases {
            let error = text.parse::<SubnetEnv>().unwrap_err().to_string();
            assert!(
                error.starts_with(line) && error.contains(field),
                "{text:?}: {error}"
            );
        }
        let missing = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_MTU=1450\n"
            .parse::<SubnetEnv>()
            .unwrap_err();
        assert_eq!(
            missing,
            SubnetEnvError::Missing("FLANNEL_SUBNET or FLANNEL_IPV6_SUBNET, FLANNEL_IPMASQ".into())
        );
    }
}

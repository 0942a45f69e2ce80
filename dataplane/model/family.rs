use std::fmt;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

/// An IP family. vxmgr runs one manager, one device and one ipset per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    pub fn of_addr(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn of_net(net: &IpNetwork) -> Family {
        Family::of_addr(&net.ip())
    }

    /// Prefix length of a single host address.
    pub fn host_prefix(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// Felix's default VXLAN device name for this family.
    pub fn device_name(self) -> &'static str {
        match self {
            Family::V4 => "vxlan.calico",
            Family::V6 => "vxlan-v6.calico",
        }
    }

    /// Felix's name for the set of hosts allowed to send VXLAN traffic.
    pub fn ipset_name(self) -> &'static str {
        match self {
            Family::V4 => "cali40all-vxlan-net",
            Family::V6 => "cali60all-vxlan-net",
        }
    }

    /// Bytes of encapsulation the VXLAN device's MTU leaves for the outer headers.
    pub fn encap_overhead(self) -> u32 {
        match self {
            Family::V4 => 50,
            Family::V6 => 70,
        }
    }

    /// The host route (`/32` or `/128`) for an address of this family.
    pub fn host_net(addr: IpAddr) -> IpNetwork {
        IpNetwork::new(addr, Family::of_addr(&addr).host_prefix())
            .expect("host prefix is always valid")
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

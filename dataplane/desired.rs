//! The kernel state the managers want, in their own terms (names, nodes),
//! and the delta type they hand to the reconciler.

use std::fmt;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use ipnetwork::IpNetwork;

use crate::model::{Family, IpPool, MacAddr};

/// A network interface the kernel reports: the parent (underlay) interface
/// holding the local VTEP's parent address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentInterface {
    pub name: Arc<str>,
    pub index: u32,
    pub mtu: u32,
}

/// The VXLAN tunnel device of one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanDevice {
    pub name: Arc<str>,
    pub family: Family,
    pub vni: u32,
    pub port: u16,
    pub parent: ParentInterface,
    /// Source address of encapsulated packets: the local VTEP's parent address.
    pub local_ip: IpAddr,
    pub mac: MacAddr,
    pub mtu: u32,
    /// The local VTEP's tunnel address as a host prefix; the only address the
    /// device carries (IPv6 link-local aside).
    pub address: IpNetwork,
}

/// Where a route sends traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteTarget {
    /// `via <remote VTEP tunnel IP> dev <vxlan device> onlink`, through the
    /// node's nexthop when the kernel has nexthop objects.
    Tunnel { node: Arc<str>, gateway: IpAddr },
    /// `dev <vxlan device> scope link`: a remote node's tunnel address.
    Connected { node: Arc<str> },
    /// `via <node IP> dev <parent> onlink`: same subnet or no-encap pool.
    Direct {
        gateway: IpAddr,
        interface: ParentInterface,
    },
    /// `blackhole`: a block of this node's.
    Blackhole,
}

/// A route in the main table, with vxmgr's route protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNetwork,
    pub target: RouteTarget,
    pub protocol: u8,
    /// Path MTU of tunnelled routes: the device's MTU.
    pub mtu: Option<u32>,
}

/// The gateway shared by every tunnel route to one remote node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunnelNexthop {
    pub family: Family,
    pub node: Arc<str>,
    pub gateway: IpAddr,
    pub protocol: u8,
}

/// Permanent ARP/NDP entry on the VXLAN device: remote tunnel IP → VTEP MAC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbor {
    pub address: IpAddr,
    pub mac: MacAddr,
}

/// Permanent FDB entry on the VXLAN device: VTEP MAC → its parent address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdbEntry {
    pub family: Family,
    pub mac: MacAddr,
    pub destination: IpAddr,
}

/// A member of the allowed-VXLAN-sources ipset of one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpsetMember(pub IpNetwork);

/// A kind of desired kernel object: how it is keyed and named.
pub trait Desired: Clone + PartialEq + fmt::Debug + fmt::Display {
    /// What the kind is called in messages ("route", "neighbor", ...).
    const KIND: &'static str;
    type Key: Clone + Eq + Hash + Ord + fmt::Debug + fmt::Display;
    fn key(&self) -> Self::Key;
}

/// What the kernel should hold for `key`: `None` means nothing of ours.
#[derive(Clone, Debug, PartialEq)]
pub struct Change<T: Desired> {
    pub key: T::Key,
    pub desired: Option<T>,
}

/// Everything one `complete_deferred_work` changed, in both families.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delta {
    /// `None`: no device to program; an existing one is left as it is.
    pub devices: Vec<Change<VxlanDevice>>,
    pub nexthops: Vec<Change<TunnelNexthop>>,
    pub routes: Vec<Change<Route>>,
    pub neighbors: Vec<Change<Neighbor>>,
    pub fdb: Vec<Change<FdbEntry>>,
    pub ipset: Vec<Change<IpsetMember>>,
    /// IP pools: what the firewall rules are made of.
    pub pools: Vec<Change<IpPool>>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.devices.len()
            + self.nexthops.len()
            + self.routes.len()
            + self.neighbors.len()
            + self.fdb.len()
            + self.ipset.len()
            + self.pools.len()
    }

    pub fn extend(&mut self, other: Delta) {
        self.devices.extend(other.devices);
        self.nexthops.extend(other.nexthops);
        self.routes.extend(other.routes);
        self.neighbors.extend(other.neighbors);
        self.fdb.extend(other.fdb);
        self.ipset.extend(other.ipset);
        self.pools.extend(other.pools);
    }
}

/// Key of a node's nexthop: nodes have one per family.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NexthopKey(pub Family, pub Arc<str>);

impl fmt::Display for NexthopKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} node {}", self.0, self.1)
    }
}

/// Key of an FDB entry: MACs are per device, and there is a device per family.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FdbKey(pub Family, pub MacAddr);

impl fmt::Display for FdbKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} dev {}", self.1, self.0.device_name())
    }
}

impl Desired for VxlanDevice {
    const KIND: &'static str = "device";
    type Key = Family;
    fn key(&self) -> Family {
        self.family
    }
}

impl Desired for TunnelNexthop {
    const KIND: &'static str = "nexthop";
    type Key = NexthopKey;
    fn key(&self) -> NexthopKey {
        NexthopKey(self.family, self.node.clone())
    }
}

impl Desired for Route {
    const KIND: &'static str = "route";
    type Key = IpNetwork;
    fn key(&self) -> IpNetwork {
        self.dst
    }
}

impl Desired for Neighbor {
    const KIND: &'static str = "neighbor";
    type Key = IpAddr;
    fn key(&self) -> IpAddr {
        self.address
    }
}

impl Desired for FdbEntry {
    const KIND: &'static str = "fdb entry";
    type Key = FdbKey;
    fn key(&self) -> FdbKey {
        FdbKey(self.family, self.mac)
    }
}

impl Desired for IpsetMember {
    const KIND: &'static str = "ipset member";
    type Key = IpNetwork;
    fn key(&self) -> IpNetwork {
        self.0
    }
}

impl Desired for IpPool {
    const KIND: &'static str = "ip pool";
    type Key = String;
    fn key(&self) -> String {
        self.id.clone()
    }
}

impl fmt::Display for IpPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nat = if self.masquerade { " masquerade" } else { "" };
        write!(f, "ip pool {} {}{nat}", self.id, self.cidr)
    }
}

impl fmt::Display for VxlanDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "device {} (vxlan id {} dstport {} dev {} local {} address {} mac {} mtu {})",
            self.name,
            self.vni,
            self.port,
            self.parent.name,
            self.local_ip,
            self.address,
            self.mac,
            self.mtu
        )
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dev = Family::of_net(&self.dst).device_name();
        match &self.target {
            RouteTarget::Tunnel { gateway, .. } => {
                write!(f, "route {} via {gateway} dev {dev} onlink", self.dst)
            }
            RouteTarget::Connected { .. } => write!(f, "route {} dev {dev} scope link", self.dst),
            RouteTarget::Direct { gateway, interface } => {
                write!(
                    f,
                    "route {} via {gateway} dev {} onlink",
                    self.dst, interface.name
                )
            }
            RouteTarget::Blackhole => write!(f, "route blackhole {}", self.dst),
        }
    }
}

impl fmt::Display for TunnelNexthop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nexthop of node {} via {} dev {} onlink",
            self.node,
            self.gateway,
            self.family.device_name()
        )
    }
}

impl fmt::Display for Neighbor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "neighbor {} lladdr {} dev {}",
            self.address,
            self.mac,
            Family::of_addr(&self.address).device_name()
        )
    }
}

impl fmt::Display for FdbEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fdb {} dev {} dst {}",
            self.mac,
            self.family.device_name(),
            self.destination
        )
    }
}

impl fmt::Display for IpsetMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = Family::of_net(&self.0);
        write!(f, "ipset {} member {}", family.ipset_name(), self.0)
    }
}

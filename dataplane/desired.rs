//! The kernel state the managers want, in their own terms (names, nodes),
//! and the delta type they hand to the reconciler.

use std::fmt;
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use arcstr::ArcStr;

use ipnetwork::IpNetwork;

use crate::config::DeviceNames;
use crate::model::{Family, IpPool, MacAddr};

/// A network interface the kernel reports: the parent (underlay) interface
/// holding the local VTEP's parent address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentInterface {
    pub name: ArcStr,
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
    Tunnel { node: ArcStr, gateway: IpAddr },
    /// `dev <vxlan device> scope link`: a remote node's tunnel address.
    Connected { node: ArcStr },
    /// `via <node IP> dev <parent> onlink`: same subnet or no-encap pool.
    Direct {
        gateway: IpAddr,
        interface: Arc<ParentInterface>,
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
    pub mtu: Option<NonZeroU32>,
}

/// The gateway shared by the routes through it: a remote node's tunnel
/// address on the VXLAN device, or a node's address on the parent for
/// direct routes (nexthop objects spare the kernel the cost of many
/// distinct inline gateways, DESIGN.md §5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nexthop {
    pub gateway: IpAddr,
    pub via: NexthopVia,
    pub protocol: u8,
}

/// Where a nexthop's gateway is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NexthopVia {
    /// `via <remote VTEP tunnel IP> dev <vxlan device> onlink`
    Tunnel { family: Family, node: ArcStr },
    /// `via <node IP> dev <parent> onlink`
    Direct { interface: Arc<ParentInterface> },
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
pub trait Desired: Clone + PartialEq + fmt::Debug {
    /// What the kind is called in messages ("route", "neighbor", ...).
    const KIND: &'static str;
    type Key: Clone + Eq + Hash + Ord + fmt::Debug + fmt::Display + Send;
    fn key(&self) -> Self::Key;
    /// The object as `ip` shows it, naming the VXLAN devices in effect.
    fn describe(&self, devices: &DeviceNames) -> String;
    /// An object by its key alone (one no longer wanted).
    fn describe_key(key: &Self::Key, _devices: &DeviceNames) -> String {
        format!("{} {key}", Self::KIND)
    }
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
    pub nexthops: Vec<Change<Nexthop>>,
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

/// Key of a nexthop: a remote node's tunnel gateway (one per family), or
/// a direct gateway (one per address, whichever nodes' routes use it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NexthopKey {
    Tunnel(Family, ArcStr),
    Direct(IpAddr),
}

impl NexthopKey {
    pub fn family(&self) -> Family {
        match self {
            NexthopKey::Tunnel(family, _) => *family,
            NexthopKey::Direct(gateway) => Family::of_addr(gateway),
        }
    }
}

impl fmt::Display for NexthopKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NexthopKey::Tunnel(family, node) => write!(f, "{family} node {node}"),
            NexthopKey::Direct(gateway) => write!(f, "via {gateway}"),
        }
    }
}

/// Key of an FDB entry: MACs are per device, and there is a device per family.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FdbKey(pub Family, pub MacAddr);

impl fmt::Display for FdbKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.1, self.0)
    }
}

impl Desired for VxlanDevice {
    const KIND: &'static str = "device";
    type Key = Family;
    fn key(&self) -> Family {
        self.family
    }
    fn describe(&self, _: &DeviceNames) -> String {
        self.to_string()
    }
}

impl Desired for Nexthop {
    const KIND: &'static str = "nexthop";
    type Key = NexthopKey;
    fn key(&self) -> NexthopKey {
        match &self.via {
            NexthopVia::Tunnel { family, node } => NexthopKey::Tunnel(*family, node.clone()),
            NexthopVia::Direct { .. } => NexthopKey::Direct(self.gateway),
        }
    }
    fn describe(&self, devices: &DeviceNames) -> String {
        match &self.via {
            NexthopVia::Tunnel { family, node } => format!(
                "nexthop of node {node} via {} dev {} onlink",
                self.gateway,
                devices.of(*family)
            ),
            NexthopVia::Direct { interface } => {
                format!("nexthop via {} dev {} onlink", self.gateway, interface.name)
            }
        }
    }
}

impl Desired for Route {
    const KIND: &'static str = "route";
    type Key = IpNetwork;
    fn key(&self) -> IpNetwork {
        self.dst
    }
    fn describe(&self, devices: &DeviceNames) -> String {
        let dst = self.dst;
        let dev = devices.of(Family::of_net(&dst));
        match &self.target {
            RouteTarget::Tunnel { gateway, .. } => {
                format!("route {dst} via {gateway} dev {dev} onlink")
            }
            RouteTarget::Connected { .. } => format!("route {dst} dev {dev} scope link"),
            RouteTarget::Direct { gateway, interface } => {
                format!("route {dst} via {gateway} dev {} onlink", interface.name)
            }
            RouteTarget::Blackhole => format!("route blackhole {dst}"),
        }
    }
}

impl Desired for Neighbor {
    const KIND: &'static str = "neighbor";
    type Key = IpAddr;
    fn key(&self) -> IpAddr {
        self.address
    }
    fn describe(&self, devices: &DeviceNames) -> String {
        format!(
            "neighbor {} lladdr {} dev {}",
            self.address,
            self.mac,
            devices.of(Family::of_addr(&self.address))
        )
    }
}

impl Desired for FdbEntry {
    const KIND: &'static str = "fdb entry";
    type Key = FdbKey;
    fn key(&self) -> FdbKey {
        FdbKey(self.family, self.mac)
    }
    fn describe(&self, devices: &DeviceNames) -> String {
        format!(
            "fdb {} dev {} dst {}",
            self.mac,
            devices.of(self.family),
            self.destination
        )
    }
    fn describe_key(key: &FdbKey, devices: &DeviceNames) -> String {
        format!("fdb entry {} dev {}", key.1, devices.of(key.0))
    }
}

impl Desired for IpsetMember {
    const KIND: &'static str = "ipset member";
    type Key = IpNetwork;
    fn key(&self) -> IpNetwork {
        self.0
    }
    fn describe(&self, _: &DeviceNames) -> String {
        let family = Family::of_net(&self.0);
        format!("ipset {} member {}", family.ipset_name(), self.0)
    }
}

impl Desired for IpPool {
    const KIND: &'static str = "ip pool";
    type Key = String;
    fn key(&self) -> String {
        self.id.clone()
    }
    fn describe(&self, _: &DeviceNames) -> String {
        self.to_string()
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

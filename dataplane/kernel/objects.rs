//! Kernel objects as the kernel holds them (interface indexes, nexthop ids),
//! and the operations that change them. Both backends speak these.

use std::fmt;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::model::{Family, MacAddr};

/// VXLAN attributes of a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanAttrs {
    pub vni: u32,
    pub port: u16,
    pub parent_index: Option<u32>,
    pub local: Option<IpAddr>,
    pub learning: bool,
}

/// A network interface, with what vxmgr checks on its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub mac: Option<MacAddr>,
    /// Administratively up.
    pub up: bool,
    /// `None` when the link is not a VXLAN device.
    pub vxlan: Option<VxlanAttrs>,
    pub addresses: Vec<IpNetwork>,
    /// Whether TX checksum offload is on, where the backend can tell.
    pub tx_checksum: Option<bool>,
}

/// A VXLAN device to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanSpec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub parent_index: u32,
    pub local: IpAddr,
    pub mac: MacAddr,
    pub mtu: u32,
}

/// Where a kernel route goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelRouteVia {
    /// `via <gateway> dev <ifindex> onlink`
    Gateway {
        gateway: IpAddr,
        ifindex: u32,
    },
    /// `nhid <id>`
    Nexthop(u32),
    /// `dev <ifindex> scope link`
    Link(u32),
    Blackhole,
}

/// A route in the main table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelRoute {
    pub dst: IpNetwork,
    pub protocol: u8,
    pub via: KernelRouteVia,
    pub mtu: Option<u32>,
}

impl KernelRoute {
    /// The interface the route leaves through, if it names one directly.
    pub fn ifindex(&self) -> Option<u32> {
        match self.via {
            KernelRouteVia::Gateway { ifindex, .. } | KernelRouteVia::Link(ifindex) => {
                Some(ifindex)
            }
            KernelRouteVia::Nexthop(_) | KernelRouteVia::Blackhole => None,
        }
    }
}

/// A nexthop object: `id <id> via <gateway> dev <ifindex> onlink proto <protocol>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelNexthop {
    pub id: u32,
    pub gateway: IpAddr,
    pub ifindex: u32,
    pub protocol: u8,
}

/// A permanent ARP/NDP entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelNeighbor {
    pub ifindex: u32,
    pub address: IpAddr,
    pub mac: MacAddr,
}

/// A permanent FDB entry of a VXLAN device (`self`, with a remote destination).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelFdb {
    pub ifindex: u32,
    pub mac: MacAddr,
    pub destination: IpAddr,
}

/// An ipset change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpsetChange {
    /// Add and delete members, creating the set if needed. Adding a member
    /// that is there, or deleting one that is not, is no error; members are
    /// changed one by one, so one that fails leaves the others changed.
    Update {
        add: Vec<IpNetwork>,
        del: Vec<IpNetwork>,
    },
    /// Make the set hold exactly these members, atomically (create a
    /// temporary set, swap it in, destroy it).
    Replace { members: Vec<IpNetwork> },
}

/// One change to the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelOp {
    CreateVxlan(VxlanSpec),
    DeleteLink {
        index: u32,
        name: String,
    },
    SetMtu {
        index: u32,
        mtu: u32,
    },
    SetUp {
        index: u32,
    },
    AddAddress {
        index: u32,
        address: IpNetwork,
    },
    DeleteAddress {
        index: u32,
        address: IpNetwork,
    },
    DisableTxChecksum {
        name: String,
    },
    ReplaceNexthop(KernelNexthop),
    DeleteNexthop(KernelNexthop),
    ReplaceRoute(KernelRoute),
    DeleteRoute(KernelRoute),
    ReplaceNeighbor(KernelNeighbor),
    DeleteNeighbor(KernelNeighbor),
    ReplaceFdb(KernelFdb),
    DeleteFdb(KernelFdb),
    Ipset {
        name: String,
        family: Family,
        change: IpsetChange,
    },
}

/// What identifies vxmgr's objects in the kernel (DESIGN.md §4, ownership).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ownership {
    /// Routes and nexthops with this protocol are ours.
    pub protocol: u8,
    /// Routes through these devices, and permanent neighbour and FDB
    /// entries on them, are ours.
    pub devices: Vec<String>,
    /// ipsets vxmgr maintains.
    pub ipsets: Vec<(String, Family)>,
}

impl Ownership {
    /// vxmgr's objects: its devices and ipsets of both families, and routes
    /// and nexthops with `protocol`.
    pub fn of_vxmgr(protocol: u8) -> Ownership {
        Ownership {
            protocol,
            devices: Family::ALL
                .iter()
                .map(|f| f.device_name().to_string())
                .collect(),
            ipsets: Family::ALL
                .iter()
                .map(|f| (f.ipset_name().to_string(), *f))
                .collect(),
        }
    }
}

/// Everything of ours the kernel holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelState {
    /// Our devices that exist (by name in `Ownership::devices`).
    pub devices: Vec<Link>,
    pub routes: Vec<KernelRoute>,
    pub nexthops: Vec<KernelNexthop>,
    pub neighbors: Vec<KernelNeighbor>,
    pub fdb: Vec<KernelFdb>,
    /// Members of each of our ipsets that exists.
    pub ipsets: Vec<(String, Vec<IpNetwork>)>,
}

impl fmt::Display for KernelRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.via {
            KernelRouteVia::Gateway { gateway, ifindex } => {
                write!(f, "route {} via {gateway} dev #{ifindex} onlink", self.dst)?
            }
            KernelRouteVia::Nexthop(id) => write!(f, "route {} nhid {id}", self.dst)?,
            KernelRouteVia::Link(ifindex) => {
                write!(f, "route {} dev #{ifindex} scope link", self.dst)?
            }
            KernelRouteVia::Blackhole => write!(f, "route blackhole {}", self.dst)?,
        }
        write!(f, " proto {}", self.protocol)?;
        match self.mtu {
            Some(mtu) => write!(f, " mtu {mtu}"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for KernelOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelOp::CreateVxlan(s) => write!(
                f,
                "creating vxlan device {} (id {} dstport {} dev #{} local {})",
                s.name, s.vni, s.port, s.parent_index, s.local
            ),
            KernelOp::DeleteLink { name, .. } => write!(f, "deleting device {name}"),
            KernelOp::SetMtu { index, mtu } => write!(f, "setting mtu {mtu} on device #{index}"),
            KernelOp::SetUp { index } => write!(f, "setting device #{index} up"),
            KernelOp::AddAddress { index, address } => {
                write!(f, "adding address {address} to device #{index}")
            }
            KernelOp::DeleteAddress { index, address } => {
                write!(f, "deleting address {address} from device #{index}")
            }
            KernelOp::DisableTxChecksum { name } => {
                write!(f, "disabling tx checksum offload on {name}")
            }
            KernelOp::ReplaceNexthop(n) => write!(
                f,
                "replacing nexthop {} via {} dev #{} onlink",
                n.id, n.gateway, n.ifindex
            ),
            KernelOp::DeleteNexthop(n) => write!(f, "deleting nexthop {}", n.id),
            KernelOp::ReplaceRoute(r) => write!(f, "replacing {r}"),
            KernelOp::DeleteRoute(r) => write!(f, "deleting {r}"),
            KernelOp::ReplaceNeighbor(n) => write!(
                f,
                "replacing neighbor {} lladdr {} dev #{}",
                n.address, n.mac, n.ifindex
            ),
            KernelOp::DeleteNeighbor(n) => {
                write!(f, "deleting neighbor {} dev #{}", n.address, n.ifindex)
            }
            KernelOp::ReplaceFdb(e) => write!(
                f,
                "replacing fdb {} dev #{} dst {}",
                e.mac, e.ifindex, e.destination
            ),
            KernelOp::DeleteFdb(e) => write!(f, "deleting fdb {} dev #{}", e.mac, e.ifindex),
            KernelOp::Ipset { name, change, .. } => match change {
                IpsetChange::Update { add, del } => {
                    write!(f, "updating ipset {name} (+{} -{})", add.len(), del.len())
                }
                IpsetChange::Replace { members } => {
                    write!(f, "replacing ipset {name} ({} members)", members.len())
                }
            },
        }
    }
}

/// A change the kernel reported, by whoever made it (vxmgr's own changes
/// come back too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notification {
    /// A main-table route appeared or changed.
    Route(KernelRoute),
    RouteGone(KernelRoute),
    /// A permanent ARP/NDP entry appeared or changed.
    Neighbor(KernelNeighbor),
    /// A neighbour entry went, or is no longer permanent.
    NeighborGone {
        ifindex: u32,
        address: std::net::IpAddr,
    },
    /// A permanent FDB entry of a device appeared or changed.
    Fdb(KernelFdb),
    FdbGone {
        ifindex: u32,
        mac: MacAddr,
    },
    /// A link was set administratively down.
    LinkDown {
        index: u32,
    },
    /// A link appeared, changed or went, or an address changed, somewhere.
    Links,
    /// Notifications were lost (the socket overran): re-read everything.
    Overrun,
}

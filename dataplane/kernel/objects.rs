//! Kernel objects as the kernel holds them (interface indexes, nexthop ids),
//! and the operations that change them. Both backends speak these.

use std::fmt;
use std::net::IpAddr;
use std::num::NonZeroU32;

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
    pub mtu: Option<NonZeroU32>,
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

/// The metric the kernel gives a route added without one: vxmgr's routes
/// all have it.
pub fn default_metric(dst: &IpNetwork) -> u32 {
    match dst {
        IpNetwork::V4(_) => 0,
        IpNetwork::V6(_) => 1024,
    }
}

/// A main-table route that is not vxmgr's: the host's own (its default and
/// static routes, the kernel's connected routes) or another agent's.
/// vxmgr never changes one, and keeps its own routes out of their way.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ForeignRoute {
    pub dst: IpNetwork,
    pub protocol: u8,
    pub metric: u32,
    /// What the route does, as `ip route` shows it ("via 172.0.0.1 dev #2",
    /// "blackhole", "nhid 7", "unreachable").
    pub target: String,
    /// Where it sends traffic through another host: the node's gateways.
    pub gateways: Vec<IpAddr>,
    /// The interface it names, if it names one.
    pub ifindex: Option<u32>,
}

impl ForeignRoute {
    /// A route of one of vxmgr's shapes that is not vxmgr's.
    pub fn of_shape(route: &KernelRoute) -> ForeignRoute {
        let (gateways, target) = match route.via {
            KernelRouteVia::Gateway { gateway, ifindex } => (
                vec![gateway],
                format!("via {gateway} dev #{ifindex} onlink"),
            ),
            KernelRouteVia::Nexthop(id) => (Vec::new(), format!("nhid {id}")),
            KernelRouteVia::Link(ifindex) => (Vec::new(), format!("dev #{ifindex}")),
            KernelRouteVia::Blackhole => (Vec::new(), "blackhole".to_string()),
        };
        ForeignRoute {
            dst: route.dst,
            protocol: route.protocol,
            metric: default_metric(&route.dst),
            target,
            gateways,
            ifindex: route.ifindex(),
        }
    }

    /// Whether it holds the place in the kernel that a route of vxmgr's to
    /// the same destination would take (same destination and metric).
    pub fn takes_the_place_of_ours(&self) -> bool {
        self.metric == default_metric(&self.dst)
    }
}

impl fmt::Display for ForeignRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "route {} {} proto {} metric {}",
            self.dst, self.target, self.protocol, self.metric
        )
    }
}

/// A main-table route as a dump or a notification gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableRoute {
    /// One of the shapes vxmgr programs (with the default metric and, via a
    /// gateway, onlink): vxmgr's if `Ownership::owns_route` says so.
    Shaped(KernelRoute),
    /// Any other route: never vxmgr's. Boxed: ours are the many, and a
    /// dump or a burst of notifications holds them all at once.
    Other(Box<ForeignRoute>),
}

/// A nexthop object: `id <id> via <gateway> dev <ifindex> onlink proto <protocol>`,
/// on a VXLAN device (tunnel) or a parent interface (direct).
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
    /// Creates a nexthop; the kernel refuses if the id is taken.
    AddNexthop(KernelNexthop),
    /// Replaces one of vxmgr's nexthops.
    ReplaceNexthop(KernelNexthop),
    DeleteNexthop(KernelNexthop),
    /// Creates a route; the kernel refuses if another route holds its place.
    AddRoute(KernelRoute),
    /// Replaces one of vxmgr's routes.
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
/// An object is vxmgr's only when its protocol (where it has one) and its
/// shape are both vxmgr's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ownership {
    /// Routes and nexthops of vxmgr's shapes with this protocol are ours;
    /// never one of the reserved protocols 0-4 (see `config`).
    pub protocol: u8,
    /// Routes through these devices, and permanent neighbour and FDB
    /// entries on them, are ours.
    pub devices: Vec<String>,
    /// ipsets vxmgr maintains, by exact name.
    pub ipsets: Vec<(String, Family)>,
    /// Interfaces that have been a parent: vxmgr's same-subnet routes go
    /// onlink via a node's address on them.
    pub parents: Vec<u32>,
    /// Protocols vxmgr used before `protocol` (the calc process changed
    /// it): what it programmed with them is still its own, to be replaced.
    pub earlier_protocols: Vec<u8>,
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
            parents: Vec::new(),
            earlier_protocols: Vec::new(),
        }
    }

    /// Makes `protocol` vxmgr's protocol for what it programs from now on;
    /// returns whether it changed.
    pub fn set_protocol(&mut self, protocol: u8) -> bool {
        if protocol == self.protocol {
            return false;
        }
        if !self.earlier_protocols.contains(&self.protocol) {
            self.earlier_protocols.push(self.protocol);
        }
        self.protocol = protocol;
        true
    }

    fn is_ours(&self, protocol: u8) -> bool {
        protocol == self.protocol || self.earlier_protocols.contains(&protocol)
    }

    /// Whether a nexthop (a single gateway, onlink) is ours: our protocol,
    /// via a gateway on one of our devices (`devices`: their interface
    /// indexes) or on a parent (direct routes' nexthops). A nexthop without
    /// `onlink` is never dumped as one of vxmgr's shape.
    pub fn owns_nexthop(&self, nexthop: &KernelNexthop, devices: &[u32]) -> bool {
        self.is_ours(nexthop.protocol)
            && (devices.contains(&nexthop.ifindex) || self.parents.contains(&nexthop.ifindex))
    }

    /// Whether a route of one of vxmgr's shapes is ours: our protocol, and
    /// somewhere vxmgr sends routes: a blackhole (a local block), through
    /// one of our devices or our nexthops (`our_nexthop`), or onlink via a
    /// gateway on a parent (a same-subnet or no-encap route). Anything else
    /// with our protocol is another agent's that happens to use it.
    pub fn owns_route(
        &self,
        route: &KernelRoute,
        devices: &[u32],
        our_nexthop: impl Fn(u32) -> bool,
    ) -> bool {
        self.is_ours(route.protocol)
            && match route.via {
                KernelRouteVia::Blackhole => true,
                KernelRouteVia::Gateway { ifindex, .. } => {
                    devices.contains(&ifindex) || self.parents.contains(&ifindex)
                }
                KernelRouteVia::Link(ifindex) => devices.contains(&ifindex),
                KernelRouteVia::Nexthop(id) => our_nexthop(id),
            }
    }

    /// Sorts what a dump of routes and nexthops found into ours and the
    /// rest; `devices`: the interface indexes of our devices.
    pub fn sort_out(
        &self,
        devices: &[u32],
        routes: Vec<TableRoute>,
        nexthops: Vec<DumpedNexthop>,
    ) -> RouteDump {
        let mut dump = RouteDump::default();
        for nexthop in nexthops {
            match nexthop {
                DumpedNexthop::Single(n) if self.owns_nexthop(&n, devices) => dump.nexthops.push(n),
                DumpedNexthop::Single(n) => dump.foreign_nexthops.push(n.id),
                DumpedNexthop::Other(id) => dump.foreign_nexthops.push(id),
            }
        }
        let ours: std::collections::HashSet<u32> = dump.nexthops.iter().map(|n| n.id).collect();
        for route in routes {
            match route {
                TableRoute::Shaped(r) if self.owns_route(&r, devices, |id| ours.contains(&id)) => {
                    dump.routes.push(r)
                }
                TableRoute::Shaped(r) => dump.foreign_routes.push(ForeignRoute::of_shape(&r)),
                TableRoute::Other(r) => dump.foreign_routes.push(*r),
            }
        }
        dump
    }
}

/// A nexthop object as a dump gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpedNexthop {
    /// A gateway on an interface: vxmgr's shape.
    Single(KernelNexthop),
    /// A group, a blackhole or the like, by id: never vxmgr's.
    Other(u32),
}

/// The main table's routes and the nexthops, as a dump sorted them out:
/// routes go through nexthops, so they are read and handed over together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteDump {
    pub routes: Vec<KernelRoute>,
    pub nexthops: Vec<KernelNexthop>,
    /// Every other main-table route: vxmgr keeps out of their way.
    pub foreign_routes: Vec<ForeignRoute>,
    /// Ids of every other nexthop: never taken for one of ours.
    pub foreign_nexthops: Vec<u32>,
}

/// Where a dump's parts go, each as soon as it is read: the devices first,
/// then the others in whatever order their reads end. A part that comes is
/// whole; a dump that fails leaves out the parts not yet read.
pub trait DumpSink: Send {
    /// Our devices that exist (by name in `Ownership::devices`).
    fn devices(&mut self, devices: Vec<Link>);
    fn routes(&mut self, routes: RouteDump);
    fn neighbors(&mut self, neighbors: Vec<KernelNeighbor>);
    fn fdb(&mut self, fdb: Vec<KernelFdb>);
    /// Members of each of our ipsets that exists.
    fn ipsets(&mut self, ipsets: Vec<(String, Vec<IpNetwork>)>);
}

/// Everything of ours the kernel holds, all parts of a dump together.
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
    /// Every other main-table route: vxmgr keeps out of their way.
    pub foreign_routes: Vec<ForeignRoute>,
    /// Ids of every other nexthop: never taken for one of ours.
    pub foreign_nexthops: Vec<u32>,
}

impl KernelState {
    /// Hands every part to `sink`, in a dump's order.
    pub fn hand_to(self, sink: &mut dyn DumpSink) {
        sink.devices(self.devices);
        sink.routes(RouteDump {
            routes: self.routes,
            nexthops: self.nexthops,
            foreign_routes: self.foreign_routes,
            foreign_nexthops: self.foreign_nexthops,
        });
        sink.neighbors(self.neighbors);
        sink.fdb(self.fdb);
        sink.ipsets(self.ipsets);
    }
}

/// Gathers a dump's parts.
impl DumpSink for KernelState {
    fn devices(&mut self, devices: Vec<Link>) {
        self.devices = devices;
    }
    fn routes(&mut self, routes: RouteDump) {
        self.routes = routes.routes;
        self.nexthops = routes.nexthops;
        self.foreign_routes = routes.foreign_routes;
        self.foreign_nexthops = routes.foreign_nexthops;
    }
    fn neighbors(&mut self, neighbors: Vec<KernelNeighbor>) {
        self.neighbors = neighbors;
    }
    fn fdb(&mut self, fdb: Vec<KernelFdb>) {
        self.fdb = fdb;
    }
    fn ipsets(&mut self, ipsets: Vec<(String, Vec<IpNetwork>)>) {
        self.ipsets = ipsets;
    }
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
            KernelOp::AddNexthop(n) => write!(
                f,
                "adding nexthop {} via {} dev #{} onlink",
                n.id, n.gateway, n.ifindex
            ),
            KernelOp::ReplaceNexthop(n) => write!(
                f,
                "replacing nexthop {} via {} dev #{} onlink",
                n.id, n.gateway, n.ifindex
            ),
            KernelOp::DeleteNexthop(n) => write!(f, "deleting nexthop {}", n.id),
            KernelOp::AddRoute(r) => write!(f, "adding {r}"),
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
    Route(TableRoute),
    RouteGone(TableRoute),
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
    /// nftables changed vxmgr's table or iptables-nft's `filter` tables.
    Firewall,
    /// Notifications were lost (the socket overran): re-read everything.
    Overrun,
}

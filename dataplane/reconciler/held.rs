//! How a table holds each kind of object beside its key, without the parts
//! the key already says. Every kind is held per family, in a map of its
//! own: an IPv4 route keeps its destination in 5 bytes and its gateway in
//! 4, where an address of either family takes 17.

use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::Arc;

use arcstr::ArcStr;
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};

use super::slots::{Found, HeldSlots, Holding, Slots};
use super::table::Programmable;
use crate::desired::{
    FdbEntry, FdbKey, IpsetMember, Neighbor, Nexthop, NexthopKey, NexthopVia, ParentInterface,
    Route, RouteTarget,
};
use crate::kernel::objects::{
    KernelFdb, KernelNeighbor, KernelNexthop, KernelRoute, KernelRouteVia,
};
use crate::model::{Family, MacAddr};

/// An address of one family. Everything a route of that family holds is of
/// that family: the model rejects a node address of the other, and the
/// kernel gives a route's gateway in its own family.
pub trait FamilyAddr: Copy + std::hash::Hash + Eq + Into<IpAddr> + Send + Sync {
    const FAMILY: Family;
    fn of(ip: IpAddr) -> Self;
}

impl FamilyAddr for Ipv4Addr {
    const FAMILY: Family = Family::V4;
    fn of(ip: IpAddr) -> Ipv4Addr {
        match ip {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(ip) => unreachable!("IPv6 address {ip} in an IPv4 route"),
        }
    }
}

impl FamilyAddr for Ipv6Addr {
    const FAMILY: Family = Family::V6;
    fn of(ip: IpAddr) -> Ipv6Addr {
        match ip {
            IpAddr::V6(ip) => ip,
            IpAddr::V4(ip) => unreachable!("IPv4 address {ip} in an IPv6 route"),
        }
    }
}

/// A destination of one family.
pub trait FamilyNet: Copy + std::hash::Hash + Eq + Send + Sync {
    fn of(net: &IpNetwork) -> Self;
    fn net(self) -> IpNetwork;
}

impl FamilyNet for Ipv4Network {
    fn of(net: &IpNetwork) -> Ipv4Network {
        match net {
            IpNetwork::V4(net) => *net,
            IpNetwork::V6(net) => unreachable!("IPv6 destination {net} among IPv4 routes"),
        }
    }
    fn net(self) -> IpNetwork {
        IpNetwork::V4(self)
    }
}

impl FamilyNet for Ipv6Network {
    fn of(net: &IpNetwork) -> Ipv6Network {
        match net {
            IpNetwork::V6(net) => *net,
            IpNetwork::V4(net) => unreachable!("IPv4 destination {net} among IPv6 routes"),
        }
    }
    fn net(self) -> IpNetwork {
        IpNetwork::V6(self)
    }
}

/// A route's target with the family's addresses.
#[derive(Clone, Debug)]
pub enum HeldTarget<A> {
    Tunnel {
        node: ArcStr,
        gateway: A,
    },
    Connected {
        node: ArcStr,
    },
    Direct {
        gateway: A,
        interface: Arc<ParentInterface>,
    },
    Blackhole,
}

/// A route less its destination.
#[derive(Clone, Debug)]
pub struct HeldRoute<A> {
    target: HeldTarget<A>,
    mtu: Option<NonZeroU32>,
    protocol: u8,
}

#[derive(Clone, Copy, Debug)]
pub enum HeldVia<A> {
    Gateway { gateway: A, ifindex: u32 },
    Nexthop(u32),
    Link(u32),
    Blackhole,
}

/// A kernel route less its destination.
#[derive(Clone, Copy, Debug)]
pub struct HeldKernelRoute<A> {
    via: HeldVia<A>,
    mtu: Option<NonZeroU32>,
    protocol: u8,
}

/// Routes of one family: destinations of type `N`, addresses of type `A`.
pub struct FamilyRoutes<N, A>(PhantomData<(N, A)>);

impl<N: FamilyNet, A: FamilyAddr> Holding for FamilyRoutes<N, A> {
    type Object = Route;
    type Stored = N;
    type Held = HeldRoute<A>;
    type HeldKernel = HeldKernelRoute<A>;

    fn store_key(dst: &IpNetwork) -> N {
        N::of(dst)
    }

    fn key(dst: &N) -> IpNetwork {
        dst.net()
    }

    fn hold(route: Route) -> HeldRoute<A> {
        let target = match route.target {
            RouteTarget::Tunnel { node, gateway } => HeldTarget::Tunnel {
                node,
                gateway: A::of(gateway),
            },
            RouteTarget::Connected { node } => HeldTarget::Connected { node },
            RouteTarget::Direct { gateway, interface } => HeldTarget::Direct {
                gateway: A::of(gateway),
                interface,
            },
            RouteTarget::Blackhole => HeldTarget::Blackhole,
        };
        HeldRoute {
            target,
            mtu: route.mtu,
            protocol: route.protocol,
        }
    }

    fn unhold(dst: &N, held: &HeldRoute<A>) -> Route {
        let target = match &held.target {
            HeldTarget::Tunnel { node, gateway } => RouteTarget::Tunnel {
                node: node.clone(),
                gateway: (*gateway).into(),
            },
            HeldTarget::Connected { node } => RouteTarget::Connected { node: node.clone() },
            HeldTarget::Direct { gateway, interface } => RouteTarget::Direct {
                gateway: (*gateway).into(),
                interface: interface.clone(),
            },
            HeldTarget::Blackhole => RouteTarget::Blackhole,
        };
        Route {
            dst: dst.net(),
            target,
            protocol: held.protocol,
            mtu: held.mtu,
        }
    }

    fn hold_kernel(kernel: KernelRoute) -> HeldKernelRoute<A> {
        let via = match kernel.via {
            KernelRouteVia::Gateway { gateway, ifindex } => HeldVia::Gateway {
                gateway: A::of(gateway),
                ifindex,
            },
            KernelRouteVia::Nexthop(id) => HeldVia::Nexthop(id),
            KernelRouteVia::Link(ifindex) => HeldVia::Link(ifindex),
            KernelRouteVia::Blackhole => HeldVia::Blackhole,
        };
        HeldKernelRoute {
            via,
            mtu: kernel.mtu,
            protocol: kernel.protocol,
        }
    }

    fn unhold_kernel(dst: &N, held: HeldKernelRoute<A>) -> KernelRoute {
        let via = match held.via {
            HeldVia::Gateway { gateway, ifindex } => KernelRouteVia::Gateway {
                gateway: gateway.into(),
                ifindex,
            },
            HeldVia::Nexthop(id) => KernelRouteVia::Nexthop(id),
            HeldVia::Link(ifindex) => KernelRouteVia::Link(ifindex),
            HeldVia::Blackhole => KernelRouteVia::Blackhole,
        };
        KernelRoute {
            dst: dst.net(),
            protocol: held.protocol,
            via,
            mtu: held.mtu,
        }
    }
}

/// The family a key belongs to.
pub trait FamilyKey {
    fn family(&self) -> Family;
}

impl FamilyKey for IpNetwork {
    fn family(&self) -> Family {
        Family::of_net(self)
    }
}

impl FamilyKey for IpAddr {
    fn family(&self) -> Family {
        Family::of_addr(self)
    }
}

impl FamilyKey for FdbKey {
    fn family(&self) -> Family {
        self.0
    }
}

impl FamilyKey for NexthopKey {
    fn family(&self) -> Family {
        NexthopKey::family(self)
    }
}

/// A table's slots in one map per family, each with its own holding.
pub struct ByFamily<V4: Holding, V6: Holding> {
    v4: HeldSlots<V4>,
    v6: HeldSlots<V6>,
}

impl<V4: Holding, V6: Holding> Default for ByFamily<V4, V6> {
    fn default() -> Self {
        ByFamily {
            v4: HeldSlots::default(),
            v6: HeldSlots::default(),
        }
    }
}

/// Calls `$call` on the slots of `$key`'s family.
macro_rules! by_family {
    ($slots:expr, $key:expr, $call:ident($($arg:expr),*)) => {
        match $key.family() {
            Family::V4 => $slots.v4.$call($key, $($arg),*),
            Family::V6 => $slots.v6.$call($key, $($arg),*),
        }
    };
}

impl<D, V4, V6> Slots<D> for ByFamily<V4, V6>
where
    D: Programmable,
    D::Key: FamilyKey,
    V4: Holding<Object = D>,
    V6: Holding<Object = D>,
{
    fn desired(&self, key: &D::Key) -> Option<D> {
        by_family!(self, key, desired())
    }
    fn is_desired(&self, key: &D::Key) -> bool {
        by_family!(self, key, is_desired())
    }
    fn actual(&self, key: &D::Key) -> Option<D::Kernel> {
        by_family!(self, key, actual())
    }
    fn contains(&self, key: &D::Key) -> bool {
        by_family!(self, key, contains())
    }
    fn set_desired(&mut self, key: &D::Key, desired: Option<D>) {
        by_family!(self, key, set_desired(desired))
    }
    fn set_actual(&mut self, key: &D::Key, actual: Option<D::Kernel>) -> Option<D::Kernel> {
        by_family!(self, key, set_actual(actual))
    }
    fn clear_desired(&mut self) {
        self.v4.clear_desired();
        self.v6.clear_desired();
    }
    type Found = (Found, Found);
    fn find_actual(
        &mut self,
        dumped: impl IntoIterator<Item = (D::Key, D::Kernel)>,
    ) -> (Found, Found) {
        let (mut found_v4, mut found_v6) = (Found::default(), Found::default());
        for (key, kernel) in dumped {
            match key.family() {
                Family::V4 => self.v4.found(&mut found_v4, &key, kernel),
                Family::V6 => self.v6.found(&mut found_v6, &key, kernel),
            }
        }
        (found_v4, found_v6)
    }
    fn settle(
        &mut self,
        (found_v4, found_v6): (Found, Found),
        render: impl Fn(&D) -> Option<D::Kernel> + Sync,
    ) -> Vec<D::Key> {
        let mut wrong = Vec::new();
        self.v4.settle(found_v4, &render, &mut wrong);
        self.v6.settle(found_v6, &render, &mut wrong);
        wrong
    }
    fn each(&self) -> impl Iterator<Item = (D::Key, bool, Option<D::Kernel>)> {
        self.v4.each().chain(self.v6.each())
    }
    fn each_desired(&self) -> impl Iterator<Item = (D::Key, D, Option<D::Kernel>)> {
        self.v4.each_desired().chain(self.v6.each_desired())
    }
}

/// The routes table's slots.
pub type RouteSlots =
    ByFamily<FamilyRoutes<Ipv4Network, Ipv4Addr>, FamilyRoutes<Ipv6Network, Ipv6Addr>>;

/// A nexthop's key less its family: a node, or a direct gateway.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HeldNexthopKey<A> {
    Tunnel(ArcStr),
    Direct(A),
}

/// A nexthop less what its key says (its node, or a direct gateway).
#[derive(Clone, Debug)]
pub struct HeldNexthop<A> {
    gateway: A,
    /// The parent interface of a direct nexthop.
    interface: Option<Arc<ParentInterface>>,
    protocol: u8,
}

#[derive(Clone, Copy, Debug)]
pub struct HeldKernelNexthop<A> {
    id: u32,
    gateway: A,
    ifindex: u32,
    protocol: u8,
}

/// Nexthops of one family.
pub struct FamilyNexthops<A>(PhantomData<A>);

impl<A: FamilyAddr> Holding for FamilyNexthops<A> {
    type Object = Nexthop;
    type Stored = HeldNexthopKey<A>;
    type Held = HeldNexthop<A>;
    type HeldKernel = HeldKernelNexthop<A>;

    fn store_key(key: &NexthopKey) -> HeldNexthopKey<A> {
        match key {
            NexthopKey::Tunnel(_, node) => HeldNexthopKey::Tunnel(node.clone()),
            NexthopKey::Direct(gateway) => HeldNexthopKey::Direct(A::of(*gateway)),
        }
    }
    fn key(stored: &HeldNexthopKey<A>) -> NexthopKey {
        match stored {
            HeldNexthopKey::Tunnel(node) => NexthopKey::Tunnel(A::FAMILY, node.clone()),
            HeldNexthopKey::Direct(gateway) => NexthopKey::Direct((*gateway).into()),
        }
    }
    fn hold(nexthop: Nexthop) -> HeldNexthop<A> {
        let interface = match nexthop.via {
            NexthopVia::Tunnel { .. } => None,
            NexthopVia::Direct { interface } => Some(interface),
        };
        HeldNexthop {
            gateway: A::of(nexthop.gateway),
            interface,
            protocol: nexthop.protocol,
        }
    }
    fn unhold(key: &HeldNexthopKey<A>, held: &HeldNexthop<A>) -> Nexthop {
        let via = match (key, &held.interface) {
            (HeldNexthopKey::Direct(_), Some(interface)) => NexthopVia::Direct {
                interface: interface.clone(),
            },
            (HeldNexthopKey::Tunnel(node), _) => NexthopVia::Tunnel {
                family: A::FAMILY,
                node: node.clone(),
            },
            (HeldNexthopKey::Direct(_), None) => {
                unreachable!("a direct nexthop is held with its interface")
            }
        };
        Nexthop {
            gateway: held.gateway.into(),
            via,
            protocol: held.protocol,
        }
    }
    fn hold_kernel(kernel: KernelNexthop) -> HeldKernelNexthop<A> {
        HeldKernelNexthop {
            id: kernel.id,
            gateway: A::of(kernel.gateway),
            ifindex: kernel.ifindex,
            protocol: kernel.protocol,
        }
    }
    fn unhold_kernel(_: &HeldNexthopKey<A>, held: HeldKernelNexthop<A>) -> KernelNexthop {
        KernelNexthop {
            id: held.id,
            gateway: held.gateway.into(),
            ifindex: held.ifindex,
            protocol: held.protocol,
        }
    }
}

pub type NexthopSlots = ByFamily<FamilyNexthops<Ipv4Addr>, FamilyNexthops<Ipv6Addr>>;

/// A kernel neighbour less its address, the key.
#[derive(Clone, Copy, Debug)]
pub struct HeldKernelNeighbor {
    ifindex: u32,
    mac: MacAddr,
}

/// Neighbours of one family, by address.
pub struct FamilyNeighbors<A>(PhantomData<A>);

impl<A: FamilyAddr> Holding for FamilyNeighbors<A> {
    type Object = Neighbor;
    type Stored = A;
    type Held = MacAddr;
    type HeldKernel = HeldKernelNeighbor;

    fn store_key(address: &IpAddr) -> A {
        A::of(*address)
    }
    fn key(address: &A) -> IpAddr {
        (*address).into()
    }
    fn hold(neighbor: Neighbor) -> MacAddr {
        neighbor.mac
    }
    fn unhold(address: &A, mac: &MacAddr) -> Neighbor {
        Neighbor {
            address: (*address).into(),
            mac: *mac,
        }
    }
    fn hold_kernel(kernel: KernelNeighbor) -> HeldKernelNeighbor {
        HeldKernelNeighbor {
            ifindex: kernel.ifindex,
            mac: kernel.mac,
        }
    }
    fn unhold_kernel(address: &A, held: HeldKernelNeighbor) -> KernelNeighbor {
        KernelNeighbor {
            ifindex: held.ifindex,
            address: (*address).into(),
            mac: held.mac,
        }
    }
}

pub type NeighborSlots = ByFamily<FamilyNeighbors<Ipv4Addr>, FamilyNeighbors<Ipv6Addr>>;

/// A kernel FDB entry less its MAC, which the key holds.
#[derive(Clone, Copy, Debug)]
pub struct HeldKernelFdb<A> {
    ifindex: u32,
    destination: A,
}

/// FDB entries of one family's device, by MAC.
pub struct FamilyFdb<A>(PhantomData<A>);

impl<A: FamilyAddr> Holding for FamilyFdb<A> {
    type Object = FdbEntry;
    type Stored = MacAddr;
    /// The destination.
    type Held = A;
    type HeldKernel = HeldKernelFdb<A>;

    fn store_key(key: &FdbKey) -> MacAddr {
        key.1
    }
    fn key(mac: &MacAddr) -> FdbKey {
        FdbKey(A::FAMILY, *mac)
    }
    fn hold(entry: FdbEntry) -> A {
        A::of(entry.destination)
    }
    fn unhold(mac: &MacAddr, destination: &A) -> FdbEntry {
        FdbEntry {
            family: A::FAMILY,
            mac: *mac,
            destination: (*destination).into(),
        }
    }
    fn hold_kernel(kernel: KernelFdb) -> HeldKernelFdb<A> {
        HeldKernelFdb {
            ifindex: kernel.ifindex,
            destination: A::of(kernel.destination),
        }
    }
    fn unhold_kernel(mac: &MacAddr, held: HeldKernelFdb<A>) -> KernelFdb {
        KernelFdb {
            ifindex: held.ifindex,
            mac: *mac,
            destination: held.destination.into(),
        }
    }
}

pub type FdbSlots = ByFamily<FamilyFdb<Ipv4Addr>, FamilyFdb<Ipv6Addr>>;

/// Members of one family's ipset: a member is its key.
pub struct FamilyMembers<N>(PhantomData<N>);

impl<N: FamilyNet> Holding for FamilyMembers<N> {
    type Object = IpsetMember;
    type Stored = N;
    type Held = ();
    type HeldKernel = ();

    fn store_key(member: &IpNetwork) -> N {
        N::of(member)
    }
    fn key(member: &N) -> IpNetwork {
        member.net()
    }
    fn hold(_: IpsetMember) {}
    fn unhold(member: &N, _: &()) -> IpsetMember {
        IpsetMember(member.net())
    }
    fn hold_kernel(_: IpNetwork) {}
    fn unhold_kernel(member: &N, _: ()) -> IpNetwork {
        member.net()
    }
}

pub type IpsetSlots = ByFamily<FamilyMembers<Ipv4Network>, FamilyMembers<Ipv6Network>>;

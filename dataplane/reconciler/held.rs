//! How a table holds each kind of object beside its key, without the parts
//! the key already says. Routes, the many, are held per family: an IPv4
//! route keeps its destination in 5 bytes and its gateways in 4.

use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::Arc;

use arcstr::ArcStr;
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};

use super::slots::{HeldSlots, Holding, Slots};
use crate::desired::{
    FdbEntry, FdbKey, IpsetMember, Neighbor, Nexthop, NexthopKey, ParentInterface, Route,
    RouteTarget,
};
use crate::kernel::objects::{
    KernelFdb, KernelNeighbor, KernelNexthop, KernelRoute, KernelRouteVia,
};
use crate::model::MacAddr;

/// An address of one family. Everything a route of that family holds is of
/// that family: the model rejects a node address of the other, and the
/// kernel gives a route's gateway in its own family.
pub trait FamilyAddr: Copy + Into<IpAddr> {
    fn of(ip: IpAddr) -> Self;
}

impl FamilyAddr for Ipv4Addr {
    fn of(ip: IpAddr) -> Ipv4Addr {
        match ip {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(ip) => unreachable!("IPv6 address {ip} in an IPv4 route"),
        }
    }
}

impl FamilyAddr for Ipv6Addr {
    fn of(ip: IpAddr) -> Ipv6Addr {
        match ip {
            IpAddr::V6(ip) => ip,
            IpAddr::V4(ip) => unreachable!("IPv4 address {ip} in an IPv6 route"),
        }
    }
}

/// A destination of one family.
pub trait FamilyNet: Copy + std::hash::Hash + Eq {
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

type V4Routes = FamilyRoutes<Ipv4Network, Ipv4Addr>;
type V6Routes = FamilyRoutes<Ipv6Network, Ipv6Addr>;

/// The routes table's slots: one map per family.
#[derive(Default)]
pub struct RouteSlots {
    v4: HeldSlots<V4Routes>,
    v6: HeldSlots<V6Routes>,
}

/// Calls `$call` on the slots of `$dst`'s family.
macro_rules! by_family {
    ($slots:expr, $dst:expr, $call:ident($($arg:expr),*)) => {
        match $dst {
            IpNetwork::V4(_) => $slots.v4.$call($dst, $($arg),*),
            IpNetwork::V6(_) => $slots.v6.$call($dst, $($arg),*),
        }
    };
}

impl Slots<Route> for RouteSlots {
    fn desired(&self, dst: &IpNetwork) -> Option<Route> {
        by_family!(self, dst, desired())
    }
    fn is_desired(&self, dst: &IpNetwork) -> bool {
        by_family!(self, dst, is_desired())
    }
    fn actual(&self, dst: &IpNetwork) -> Option<KernelRoute> {
        by_family!(self, dst, actual())
    }
    fn contains(&self, dst: &IpNetwork) -> bool {
        by_family!(self, dst, contains())
    }
    fn set_desired(&mut self, dst: &IpNetwork, desired: Option<Route>) {
        by_family!(self, dst, set_desired(desired))
    }
    fn set_actual(&mut self, dst: &IpNetwork, actual: Option<KernelRoute>) -> Option<KernelRoute> {
        by_family!(self, dst, set_actual(actual))
    }
    fn clear_desired(&mut self) {
        self.v4.clear_desired();
        self.v6.clear_desired();
    }
    fn clear_actual(&mut self) {
        self.v4.clear_actual();
        self.v6.clear_actual();
    }
    fn each(&self) -> impl Iterator<Item = (IpNetwork, bool, Option<KernelRoute>)> {
        self.v4.each().chain(self.v6.each())
    }
    fn each_desired(&self) -> impl Iterator<Item = (IpNetwork, Route, Option<KernelRoute>)> {
        self.v4.each_desired().chain(self.v6.each_desired())
    }
}

/// Nexthops are few (one per node), and their key says little of them:
/// held whole.
impl Holding for Nexthop {
    type Object = Nexthop;
    type Stored = NexthopKey;
    type Held = Nexthop;
    type HeldKernel = KernelNexthop;

    fn store_key(key: &NexthopKey) -> NexthopKey {
        key.clone()
    }
    fn key(key: &NexthopKey) -> NexthopKey {
        key.clone()
    }
    fn hold(nexthop: Nexthop) -> Nexthop {
        nexthop
    }
    fn unhold(_: &NexthopKey, held: &Nexthop) -> Nexthop {
        held.clone()
    }
    fn hold_kernel(kernel: KernelNexthop) -> KernelNexthop {
        kernel
    }
    fn unhold_kernel(_: &NexthopKey, held: KernelNexthop) -> KernelNexthop {
        held
    }
}

/// A kernel neighbour less its address, the key.
#[derive(Clone, Copy, Debug)]
pub struct HeldKernelNeighbor {
    ifindex: u32,
    mac: MacAddr,
}

impl Holding for Neighbor {
    type Object = Neighbor;
    type Stored = IpAddr;
    /// The address is the key.
    type Held = MacAddr;
    type HeldKernel = HeldKernelNeighbor;

    fn store_key(address: &IpAddr) -> IpAddr {
        *address
    }
    fn key(address: &IpAddr) -> IpAddr {
        *address
    }
    fn hold(neighbor: Neighbor) -> MacAddr {
        neighbor.mac
    }
    fn unhold(address: &IpAddr, mac: &MacAddr) -> Neighbor {
        Neighbor {
            address: *address,
            mac: *mac,
        }
    }
    fn hold_kernel(kernel: KernelNeighbor) -> HeldKernelNeighbor {
        HeldKernelNeighbor {
            ifindex: kernel.ifindex,
            mac: kernel.mac,
        }
    }
    fn unhold_kernel(address: &IpAddr, held: HeldKernelNeighbor) -> KernelNeighbor {
        KernelNeighbor {
            ifindex: held.ifindex,
            address: *address,
            mac: held.mac,
        }
    }
}

/// A kernel FDB entry less its MAC, which the key holds.
#[derive(Clone, Copy, Debug)]
pub struct HeldKernelFdb {
    ifindex: u32,
    destination: IpAddr,
}

impl Holding for FdbEntry {
    type Object = FdbEntry;
    type Stored = FdbKey;
    /// The family and the MAC are the key.
    type Held = IpAddr;
    type HeldKernel = HeldKernelFdb;

    fn store_key(key: &FdbKey) -> FdbKey {
        key.clone()
    }
    fn key(key: &FdbKey) -> FdbKey {
        key.clone()
    }
    fn hold(entry: FdbEntry) -> IpAddr {
        entry.destination
    }
    fn unhold(key: &FdbKey, destination: &IpAddr) -> FdbEntry {
        FdbEntry {
            family: key.0,
            mac: key.1,
            destination: *destination,
        }
    }
    fn hold_kernel(kernel: KernelFdb) -> HeldKernelFdb {
        HeldKernelFdb {
            ifindex: kernel.ifindex,
            destination: kernel.destination,
        }
    }
    fn unhold_kernel(key: &FdbKey, held: HeldKernelFdb) -> KernelFdb {
        KernelFdb {
            ifindex: held.ifindex,
            mac: key.1,
            destination: held.destination,
        }
    }
}

/// A member is its key.
impl Holding for IpsetMember {
    type Object = IpsetMember;
    type Stored = IpNetwork;
    type Held = ();
    type HeldKernel = ();

    fn store_key(member: &IpNetwork) -> IpNetwork {
        *member
    }
    fn key(member: &IpNetwork) -> IpNetwork {
        *member
    }
    fn hold(_: IpsetMember) {}
    fn unhold(member: &IpNetwork, _: &()) -> IpsetMember {
        IpsetMember(*member)
    }
    fn hold_kernel(_: IpNetwork) {}
    fn unhold_kernel(member: &IpNetwork, _: ()) -> IpNetwork {
        *member
    }
}

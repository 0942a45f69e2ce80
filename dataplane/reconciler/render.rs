//! Desired objects in kernel terms: device names become interface indexes,
//! a route's gateway becomes its nexthop's id when nexthops are in use.
//! Also how a table holds each kind beside its key, without the parts the
//! key already says.

use std::net::IpAddr;
use std::num::NonZeroU32;

use ipnetwork::IpNetwork;

use super::table::{Programmable, RenderContext};
use crate::desired::Desired;
use crate::desired::{
    FdbEntry, FdbKey, IpsetMember, Neighbor, Nexthop, NexthopKey, NexthopVia, Route, RouteTarget,
};
use crate::kernel::objects::{
    IpsetChange, KernelFdb, KernelNeighbor, KernelNexthop, KernelOp, KernelRoute, KernelRouteVia,
};
use crate::model::{Family, MacAddr};

/// A route less its destination, the key of the routes table.
#[derive(Clone, Debug)]
pub struct HeldRoute {
    target: RouteTarget,
    protocol: u8,
    mtu: Option<NonZeroU32>,
}

/// A kernel route less its destination.
#[derive(Clone, Copy, Debug)]
pub struct HeldKernelRoute {
    via: KernelRouteVia,
    mtu: Option<NonZeroU32>,
    protocol: u8,
}

impl Programmable for Route {
    type Kernel = KernelRoute;
    type Held = HeldRoute;
    type HeldKernel = HeldKernelRoute;

    fn hold(self) -> HeldRoute {
        HeldRoute {
            target: self.target,
            protocol: self.protocol,
            mtu: self.mtu,
        }
    }

    fn unhold(dst: &IpNetwork, held: &HeldRoute) -> Route {
        Route {
            dst: *dst,
            target: held.target.clone(),
            protocol: held.protocol,
            mtu: held.mtu,
        }
    }

    fn hold_kernel(kernel: KernelRoute) -> HeldKernelRoute {
        HeldKernelRoute {
            via: kernel.via,
            mtu: kernel.mtu,
            protocol: kernel.protocol,
        }
    }

    fn unhold_kernel(dst: &IpNetwork, held: HeldKernelRoute) -> KernelRoute {
        KernelRoute {
            dst: *dst,
            protocol: held.protocol,
            via: held.via,
            mtu: held.mtu,
        }
    }

    fn render(&self, ctx: &dyn RenderContext) -> Option<KernelRoute> {
        let family = Family::of_net(&self.dst);
        let via = match &self.target {
            RouteTarget::Tunnel { node, gateway } => {
                if ctx.use_nexthops() {
                    let key = NexthopKey::Tunnel(family, node.clone());
                    KernelRouteVia::Nexthop(ctx.programmed_nexthop(&key)?)
                } else {
                    KernelRouteVia::Gateway {
                        gateway: *gateway,
                        ifindex: ctx.device_index(family)?,
                    }
                }
            }
            RouteTarget::Connected { .. } => KernelRouteVia::Link(ctx.device_index(family)?),
            RouteTarget::Direct { gateway, interface } => {
                let ifindex = Some(interface.index).filter(|i| ctx.interface_up(*i))?;
                if ctx.use_nexthops() {
                    let key = NexthopKey::Direct(*gateway);
                    KernelRouteVia::Nexthop(ctx.programmed_nexthop(&key)?)
                } else {
                    KernelRouteVia::Gateway {
                        gateway: *gateway,
                        ifindex,
                    }
                }
            }
            RouteTarget::Blackhole => KernelRouteVia::Blackhole,
        };
        Some(KernelRoute {
            dst: self.dst,
            protocol: self.protocol,
            via,
            mtu: self.mtu,
        })
    }

    fn replace_op(kernel: &KernelRoute) -> KernelOp {
        KernelOp::ReplaceRoute(*kernel)
    }

    fn add_op(kernel: &KernelRoute) -> KernelOp {
        KernelOp::AddRoute(*kernel)
    }

    fn delete_op(kernel: &KernelRoute) -> KernelOp {
        KernelOp::DeleteRoute(*kernel)
    }

    /// Routes through the same gateway one after another: the kernel's cost
    /// of inline-gateway routes grows with the distinct gateways it has to
    /// compare, and adding them grouped is several times faster (DESIGN.md §5).
    fn order(route: &KernelRoute) -> u128 {
        match route.via {
            KernelRouteVia::Gateway { gateway, .. } => match gateway {
                std::net::IpAddr::V4(ip) => u32::from(ip).into(),
                std::net::IpAddr::V6(ip) => ip.into(),
            },
            KernelRouteVia::Nexthop(id) => id.into(),
            KernelRouteVia::Link(index) => index.into(),
            KernelRouteVia::Blackhole => 0,
        }
    }
}

/// Nexthops are few (one per node), and their key says little of them:
/// held whole.
impl Programmable for Nexthop {
    type Kernel = KernelNexthop;
    type Held = Nexthop;
    type HeldKernel = KernelNexthop;

    fn hold(self) -> Nexthop {
        self
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

    fn render(&self, ctx: &dyn RenderContext) -> Option<KernelNexthop> {
        let ifindex = match &self.via {
            NexthopVia::Tunnel { family, .. } => ctx.device_index(*family)?,
            NexthopVia::Direct { interface } => {
                Some(interface.index).filter(|i| ctx.interface_up(*i))?
            }
        };
        Some(KernelNexthop {
            id: ctx.nexthop_id(&self.key())?,
            gateway: self.gateway,
            ifindex,
            protocol: self.protocol,
        })
    }

    fn replace_op(kernel: &KernelNexthop) -> KernelOp {
        KernelOp::ReplaceNexthop(*kernel)
    }

    fn add_op(kernel: &KernelNexthop) -> KernelOp {
        KernelOp::AddNexthop(*kernel)
    }

    fn delete_op(kernel: &KernelNexthop) -> KernelOp {
        KernelOp::DeleteNexthop(*kernel)
    }
}

/// A kernel neighbour less its address, the key.
#[derive(Clone, Copy, Debug)]
pub struct HeldKernelNeighbor {
    ifindex: u32,
    mac: MacAddr,
}

impl Programmable for Neighbor {
    type Kernel = KernelNeighbor;
    /// The address is the key.
    type Held = MacAddr;
    type HeldKernel = HeldKernelNeighbor;

    fn hold(self) -> MacAddr {
        self.mac
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

    fn render(&self, ctx: &dyn RenderContext) -> Option<KernelNeighbor> {
        Some(KernelNeighbor {
            ifindex: ctx.device_index(Family::of_addr(&self.address))?,
            address: self.address,
            mac: self.mac,
        })
    }

    fn replace_op(kernel: &KernelNeighbor) -> KernelOp {
        KernelOp::ReplaceNeighbor(*kernel)
    }

    fn delete_op(kernel: &KernelNeighbor) -> KernelOp {
        KernelOp::DeleteNeighbor(*kernel)
    }
}

/// A kernel FDB entry less its MAC, which the key holds.
#[derive(Clone, Copy, Debug)]
pub struct HeldKernelFdb {
    ifindex: u32,
    destination: IpAddr,
}

impl Programmable for FdbEntry {
    type Kernel = KernelFdb;
    /// The family and the MAC are the key.
    type Held = IpAddr;
    type HeldKernel = HeldKernelFdb;

    fn hold(self) -> IpAddr {
        self.destination
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

    fn render(&self, ctx: &dyn RenderContext) -> Option<KernelFdb> {
        Some(KernelFdb {
            ifindex: ctx.device_index(self.family)?,
            mac: self.mac,
            destination: self.destination,
        })
    }

    fn replace_op(kernel: &KernelFdb) -> KernelOp {
        KernelOp::ReplaceFdb(*kernel)
    }

    fn delete_op(kernel: &KernelFdb) -> KernelOp {
        KernelOp::DeleteFdb(*kernel)
    }
}

/// ipset members are added and deleted one by one here; the reconciler
/// merges each family's into one `IpsetChange`.
impl Programmable for IpsetMember {
    type Kernel = IpNetwork;
    /// A member is its key.
    type Held = ();
    type HeldKernel = ();

    fn hold(self) {}

    fn unhold(member: &IpNetwork, _: &()) -> IpsetMember {
        IpsetMember(*member)
    }

    fn hold_kernel(_: IpNetwork) {}

    fn unhold_kernel(member: &IpNetwork, _: ()) -> IpNetwork {
        *member
    }

    fn render(&self, _: &dyn RenderContext) -> Option<IpNetwork> {
        Some(self.0)
    }

    fn replace_op(member: &IpNetwork) -> KernelOp {
        ipset_op(
            *member,
            IpsetChange::Update {
                add: vec![*member],
                del: Vec::new(),
            },
        )
    }

    fn delete_op(member: &IpNetwork) -> KernelOp {
        ipset_op(
            *member,
            IpsetChange::Update {
                add: Vec::new(),
                del: vec![*member],
            },
        )
    }
}

fn ipset_op(member: IpNetwork, change: IpsetChange) -> KernelOp {
    let family = Family::of_net(&member);
    KernelOp::Ipset {
        name: family.ipset_name().to_string(),
        family,
        change,
    }
}

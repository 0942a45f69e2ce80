//! Desired objects in kernel terms: device names become interface indexes,
//! a route's gateway becomes its nexthop's id when nexthops are in use.

use ipnetwork::IpNetwork;

use super::held::{FdbSlots, IpsetSlots, NeighborSlots, NexthopSlots, RouteSlots};
use super::table::{Programmable, RenderContext};
use crate::desired::Desired;
use crate::desired::{
    FdbEntry, IpsetMember, Neighbor, Nexthop, NexthopKey, NexthopVia, Route, RouteTarget,
};
use crate::kernel::objects::{
    IpsetChange, KernelFdb, KernelNeighbor, KernelNexthop, KernelOp, KernelRoute, KernelRouteVia,
};
use crate::model::Family;

impl Programmable for Route {
    type Kernel = KernelRoute;
    type Slots = RouteSlots;

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

impl Programmable for Nexthop {
    type Kernel = KernelNexthop;
    type Slots = NexthopSlots;

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

impl Programmable for Neighbor {
    type Kernel = KernelNeighbor;
    type Slots = NeighborSlots;

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

impl Programmable for FdbEntry {
    type Kernel = KernelFdb;
    type Slots = FdbSlots;

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
    type Slots = IpsetSlots;

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

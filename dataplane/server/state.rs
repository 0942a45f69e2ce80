//! GetState's answer: the manager's desired state in strings a person (and
//! grpcurl) can read.

use std::num::NonZeroU32;

use crate::desired::RouteTarget;
use crate::kernel::firewall::{TABLE, TABLE_FAMILY};
use crate::manager::{FamilySnapshot, Manager, RemoteVtep};
use crate::model::{Family, VtepAddresses};
use crate::reconciler::{FirewallStatus, ObjectError};
use crate::wire::vxmgr::v1::{
    BatchStatus, ConnectedRoute, DataplaneState, Device, DirectRoute, FamilyState, FdbEntry,
    FirewallRules, IpPool, KernelError, Neighbor, TunnelRoute, Vtep, WaitingRoute,
};

pub fn dataplane_state(
    manager: &Manager,
    last_batch: Option<BatchStatus>,
    failing: &[ObjectError],
) -> DataplaneState {
    let family = |f: Family| family_state(f, manager.family(f).snapshot());
    DataplaneState {
        hostname: manager.hostname().to_string(),
        in_sync: manager.in_sync(),
        last_batch,
        ipv4: Some(family(Family::V4)),
        ipv6: Some(family(Family::V6)),
        failing_objects: failing
            .iter()
            .map(|e| KernelError {
                object: e.object.clone(),
                error: e.error.clone(),
            })
            .collect(),
        ip_pools: manager
            .pools()
            .map(|p| IpPool {
                id: p.id.clone(),
                cidr: p.cidr.to_string(),
                masquerade: p.masquerade,
            })
            .collect(),
        firewall_rules: None,
    }
}

/// GetState's view of the firewall rules, from the kernel task.
pub fn firewall_rules(status: &FirewallStatus) -> FirewallRules {
    let forward = status.forward.map(|b| {
        let value = clap::ValueEnum::to_possible_value(&b);
        value.map(|v| v.get_name().to_string()).unwrap_or_default()
    });
    FirewallRules {
        table: format!("{TABLE_FAMILY} {TABLE}"),
        programmed: status.programmed,
        pools: status.pools.clone(),
        masquerading_pools: status.masquerading.clone(),
        forward_rules: forward.unwrap_or_else(|| "off".into()),
        foreign_forward_drops: status.forward_drops.clone(),
        error: status.error.clone().unwrap_or_default(),
        iptables_backend: status
            .forward
            .and(status.mode)
            .map(|m| m.name().to_string())
            .unwrap_or_default(),
    }
}

fn vtep(node: &str, v: &VtepAddresses) -> Vtep {
    Vtep {
        node: node.to_string(),
        mac: v.mac.to_string(),
        tunnel_address: v.tunnel_ip.to_string(),
        parent_address: v.parent_ip.to_string(),
    }
}

fn remote_vtep(node: &str, v: &RemoteVtep) -> Vtep {
    match v {
        RemoteVtep::Complete(v) => vtep(node, v),
        RemoteVtep::TunnelOnly(ip) => Vtep {
            node: node.to_string(),
            tunnel_address: ip.to_string(),
            ..Default::default()
        },
    }
}

fn family_state(family: Family, s: FamilySnapshot) -> FamilyState {
    let mut state = FamilyState {
        device: s.device.map(|d| Device {
            name: d.name.to_string(),
            vni: d.vni,
            port: d.port.into(),
            parent_interface: d.parent.name.to_string(),
            local_address: d.local_ip.to_string(),
            mac: d.mac.to_string(),
            mtu: d.mtu,
            address: d.address.to_string(),
        }),
        local_vtep: s.local_vtep.map(|(node, v)| vtep(&node, &v)),
        remote_vteps: s
            .remote_vteps
            .iter()
            .map(|(n, v)| remote_vtep(n, v))
            .collect(),
        waiting_routes: s
            .waiting_routes
            .iter()
            .map(|w| WaitingRoute {
                dst: w.dst.to_string(),
                node: w.node.to_string(),
                reason: w.reason.to_string(),
            })
            .collect(),
        neighbors: s
            .neighbors
            .iter()
            .map(|n| Neighbor {
                address: n.address.to_string(),
                mac: n.mac.to_string(),
            })
            .collect(),
        fdb_entries: s
            .fdb
            .iter()
            .map(|e| FdbEntry {
                mac: e.mac.to_string(),
                destination: e.destination.to_string(),
            })
            .collect(),
        ipset_name: family.ipset_name().to_string(),
        ipset_members: s.ipset.iter().map(|m| m.0.to_string()).collect(),
        parent_interface: s.parent.map(|p| p.name.to_string()).unwrap_or_default(),
        ..Default::default()
    };
    for route in s.routes {
        let dst = route.dst.to_string();
        let mtu = route.mtu.map_or(0, NonZeroU32::get);
        match route.target {
            RouteTarget::Tunnel { node, gateway } => state.tunnel_routes.push(TunnelRoute {
                dst,
                gateway: gateway.to_string(),
                node: node.to_string(),
                mtu,
            }),
            RouteTarget::Direct { gateway, interface } => state.direct_routes.push(DirectRoute {
                dst,
                gateway: gateway.to_string(),
                interface: interface.name.to_string(),
            }),
            RouteTarget::Connected { node } => state.connected_routes.push(ConnectedRoute {
                dst,
                node: node.to_string(),
                mtu,
            }),
            RouteTarget::Blackhole => state.blackhole_routes.push(dst),
        }
    }
    state
}

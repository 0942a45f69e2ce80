//! What the host holds that vxmgr keeps out of the way of: the main table's
//! routes that are not vxmgr's, the addresses of interfaces that are not
//! vxmgr's devices, and the gateways the host's routes go through. A route
//! of vxmgr's that would take the place of a host route, or capture traffic
//! to one of the host's addresses or gateways, is refused (and reported)
//! instead of programmed.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::ops::RangeInclusive;

use foldhash::HashMap;
use ipnetwork::IpNetwork;

use super::table::{Effect, Plan, Table};
use super::{Report, record};
use crate::desired::Route;
use crate::kernel::KernelError;
use crate::kernel::objects::{ForeignRoute, KernelRoute};

#[derive(Default)]
pub struct HostView {
    /// The main table's routes that are not vxmgr's, by destination.
    routes: HashMap<IpNetwork, Vec<ForeignRoute>>,
    /// Gateways of the host's routes that leave through an interface of
    /// the host's, with the destinations of the routes through each.
    gateways: BTreeMap<IpAddr, Vec<IpNetwork>>,
    /// Addresses of the interfaces that are not vxmgr's, and the interface.
    addresses: BTreeMap<IpAddr, u32>,
}

impl HostView {
    /// Takes what a dump found; `our_devices` are vxmgr's devices' indexes.
    pub fn reset_routes(&mut self, routes: Vec<ForeignRoute>, our_devices: &[u32]) {
        self.routes.clear();
        self.gateways.clear();
        for route in routes {
            self.route_appeared(route, our_devices);
        }
    }

    /// Takes every interface's addresses, leaving vxmgr's devices' out.
    pub fn set_addresses(&mut self, addresses: Vec<(u32, IpAddr)>, our_devices: &[u32]) {
        self.addresses = addresses
            .into_iter()
            .filter(|(index, _)| !our_devices.contains(index))
            .map(|(index, ip)| (ip, index))
            .collect();
    }

    pub fn route_appeared(&mut self, route: ForeignRoute, our_devices: &[u32]) {
        let same = self.routes.entry(route.dst).or_default();
        if same.contains(&route) {
            return;
        }
        if !route.ifindex.is_some_and(|i| our_devices.contains(&i)) {
            for gateway in &route.gateways {
                self.gateways.entry(*gateway).or_default().push(route.dst);
            }
        }
        same.push(route);
    }

    pub fn route_gone(&mut self, route: &ForeignRoute) {
        let Some(same) = self.routes.get_mut(&route.dst) else {
            return;
        };
        let Some(at) = same.iter().position(|r| r == route) else {
            return;
        };
        same.swap_remove(at);
        if same.is_empty() {
            self.routes.remove(&route.dst);
        }
        for gateway in &route.gateways {
            if let Some(dsts) = self.gateways.get_mut(gateway) {
                if let Some(at) = dsts.iter().position(|d| *d == route.dst) {
                    dsts.swap_remove(at);
                }
                if dsts.is_empty() {
                    self.gateways.remove(gateway);
                }
            }
        }
    }

    /// Why vxmgr may not program `route`, if it may not: `adding` a route
    /// whose place a host route holds, or any route that would capture
    /// traffic to an address or a gateway of the host's.
    pub fn conflict(&self, route: &KernelRoute, adding: bool) -> Option<String> {
        if adding && let Some(host) = self.routes.get(&route.dst).and_then(|r| r.first()) {
            return Some(format!(
                "the kernel holds {host}, which is not vxmgr's: vxmgr adds its route once that one is gone"
            ));
        }
        let covered = addresses_in(&route.dst);
        if let Some((ip, index)) = self.addresses.range(covered.clone()).next() {
            return Some(format!(
                "it would capture {ip}, an address of interface #{index}, which is not vxmgr's"
            ));
        }
        if let Some((gateway, dsts)) = self.gateways.range(covered).next() {
            return Some(format!(
                "it would capture {gateway}, the gateway of the host's route to {}",
                dsts.first().map_or(String::new(), |d| d.to_string())
            ));
        }
        None
    }
}

/// Every address in `net`, as a range of `IpAddr`.
fn addresses_in(net: &IpNetwork) -> RangeInclusive<IpAddr> {
    match net {
        IpNetwork::V4(n) => IpAddr::V4(n.network())..=IpAddr::V4(n.broadcast()),
        IpNetwork::V6(n) => IpAddr::V6(n.network())..=IpAddr::V6(n.broadcast()),
    }
}

/// Takes out of `plan` the routes the host's objects forbid, recording each
/// as a failure of its object (reported, retried, and in health); the rest
/// is returned to be applied.
pub(super) fn keep_clear_of_host(
    plan: Plan<Route>,
    host: &HostView,
    table: &mut Table<Route>,
    report: &mut Report,
) -> Plan<Route> {
    let mut allowed = plan;
    let mut errors = Vec::new();
    let refused = allowed
        .entries
        .extract_if(.., |entry| {
            let why = entry
                .after()
                .and_then(|r| host.conflict(r, entry.effect == Effect::Added));
            why.map(|why| errors.push(Err(KernelError::other(why))))
                .is_some()
        })
        .collect();
    let refused = Plan { entries: refused };
    if !refused.is_empty() {
        record(table, refused, &mut errors.into_iter(), report);
    }
    allowed
}

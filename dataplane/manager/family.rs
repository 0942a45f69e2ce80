//! One IP family's VXLAN manager: Felix's rules (DESIGN.md §4), incremental.
//!
//! `on_*` methods record intent and mark the keys they touch dirty;
//! `complete_deferred_work` re-derives only those keys. Each derivation is a
//! `desired_*` function of the current intent, which the full snapshot for
//! GetState uses too, so the delta and the snapshot cannot disagree.
//!
//! | intent | kernel object |
//! |---|---|
//! | local VTEP + parent interface | the device; without them an existing device is left as it is (Felix only notes that local information is missing) |
//! | removed local VTEP | nothing changes: the device stays, and so does the parent address the parent interface is found by |
//! | remote VTEP | nexthop via its tunnel address; ARP/NDP and FDB entries and ipset member only when its MAC and parent address are good |
//! | node address of direct routes | nexthop via it on the parent, while the parent is known |
//! | remote block, VXLAN pool | `via <tunnel address> dev <device> onlink`, waiting for the node's VTEP; direct when same-subnet with a node address and the parent known |
//! | remote block, NO_ENCAP pool | `via <node address> dev <parent> onlink` only: never tunnelled, waiting for the parent or a node address |
//! | remote tunnel address | connected on the device |
//! | local block | blackhole |

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::held_vtep::HeldVtep;
use super::node_routes::NodeRoutes;
use crate::dense_map::DenseMap;
use crate::family_map::FamilyMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use arcstr::ArcStr;
use ipnetwork::IpNetwork;

use crate::config::Settings;
use crate::desired::{
    Change, Delta, Desired, FdbEntry, FdbKey, IpsetMember, Neighbor, Nexthop, NexthopKey,
    NexthopVia, ParentInterface, Route, RouteTarget, VxlanDevice,
};
use crate::model::update::{Rejection, quote};
use crate::model::{
    Family, MacAddr, RemoteRouteKind, RouteIntent, VtepAddresses, VtepPart, VtepUpdate,
};

/// The settings that matter to one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilySettings {
    pub device_name: Arc<str>,
    pub vni: u32,
    pub port: u16,
    pub mtu: Option<u32>,
    pub route_protocol: u8,
    pub external_nodes: Vec<IpNetwork>,
}

impl FamilySettings {
    pub fn from_settings(family: Family, s: &Settings) -> FamilySettings {
        FamilySettings {
            device_name: s.device_names.of(family).clone(),
            vni: s.vni,
            port: s.port,
            mtu: match family {
                Family::V4 => s.mtu_v4,
                Family::V6 => s.mtu_v6,
            },
            route_protocol: s.route_protocol,
            external_nodes: s
                .external_nodes
                .iter()
                .filter(|n| Family::of_net(n) == family)
                .copied()
                .collect(),
        }
    }
}

/// A route to another node's pods or tunnel address, by its destination.
#[derive(Clone, Debug)]
struct RemoteRoute {
    node: ArcStr,
    kind: RemoteRouteKind,
    /// A no-encap pool's route: direct or nothing, never through the device.
    no_encap: bool,
}

/// What the manager knows of a remote node's VTEP in one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteVtep {
    Complete(VtepAddresses),
    /// The node's latest update had a bad MAC or parent address, or another
    /// node's MAC. As in Felix, its routes keep going via its tunnel address
    /// (so its blocks never fall through to the host's default route); it
    /// gets no ARP/FDB entries and no ipset member.
    TunnelOnly(IpAddr),
}

impl RemoteVtep {
    pub fn tunnel_ip(&self) -> IpAddr {
        match self {
            RemoteVtep::Complete(a) => a.tunnel_ip,
            RemoteVtep::TunnelOnly(ip) => *ip,
        }
    }

    /// MAC and parent address, for the L2 entries and the ipset.
    pub fn complete(&self) -> Option<&VtepAddresses> {
        match self {
            RemoteVtep::Complete(a) => Some(a),
            RemoteVtep::TunnelOnly(_) => None,
        }
    }
}

/// Why a remote route is not programmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// Its node has no usable VTEP in this family yet.
    NoVtep,
    /// A no-encap route while the parent interface is not known.
    NoParent,
    /// A no-encap route without `dst_node_ip`: nothing to route it to until
    /// an update gives one.
    NoNodeAddress,
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WaitReason::NoVtep => "no VTEP for its node yet",
            WaitReason::NoParent => {
                "no-encap route, never tunnelled: waiting for the parent interface"
            }
            WaitReason::NoNodeAddress => {
                "no-encap route, never tunnelled: the calc gave no dstNodeIp to route it to (none, or none on this node's network)"
            }
        })
    }
}

/// A route the manager wants but cannot program yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingRoute {
    pub dst: IpNetwork,
    pub node: ArcStr,
    pub reason: WaitReason,
}

/// Everything one family wants, for GetState.
#[derive(Clone, Debug, Default)]
pub struct FamilySnapshot {
    pub device: Option<VxlanDevice>,
    pub parent: Option<ParentInterface>,
    pub local_vtep: Option<(ArcStr, VtepAddresses)>,
    pub remote_vteps: Vec<(ArcStr, RemoteVtep)>,
    pub routes: Vec<Route>,
    pub waiting_routes: Vec<WaitingRoute>,
    pub neighbors: Vec<Neighbor>,
    pub fdb: Vec<FdbEntry>,
    pub ipset: Vec<IpsetMember>,
}

/// Keys whose desired state may have changed since the last delta.
#[derive(Debug, Default)]
struct Dirty {
    device: bool,
    routes: HashSet<IpNetwork>,
    nexthops: HashSet<NexthopKey>,
    neighbors: HashSet<IpAddr>,
    fdb: HashSet<MacAddr>,
    ipset: HashSet<IpNetwork>,
}

pub struct FamilyManager {
    family: Family,
    hostname: ArcStr,
    settings: FamilySettings,
    /// Our own VTEP, as the stream declares it.
    local_vtep: Option<VtepAddresses>,
    /// The latest local VTEP's parent address, kept when that VTEP is
    /// removed: the parent interface stays as it is.
    parent_ip: Option<IpAddr>,
    /// Shared by every direct route and nexthop through it.
    parent: Option<Arc<ParentInterface>>,
    remote_vteps: DenseMap<ArcStr, HeldVtep>,
    /// MACs of complete remote VTEPs.
    node_by_mac: DenseMap<MacAddr, ArcStr>,
    /// Tunnel addresses of every remote VTEP.
    node_by_tunnel_ip: FamilyMap<IpAddr, ArcStr>,
    /// How many reasons each ipset member has to be there (external CIDR,
    /// parent address of one or more VTEPs).
    ipset_refs: FamilyMap<IpNetwork, u32>,
    remote_routes: FamilyMap<IpNetwork, RemoteRoute>,
    local_blocks: HashSet<IpNetwork>,
    /// Each remote node's routes, in no order: a node has a handful of
    /// blocks, and a packed list holds them in a fraction of a set's memory.
    routes_by_node: DenseMap<ArcStr, NodeRoutes>,
    /// Remote routes that go direct when the parent interface is known,
    /// and the node address they go via: kept apart from `remote_routes`,
    /// so that routes through the tunnel do not pay for the address.
    direct_routes: HashMap<IpNetwork, IpAddr>,
    /// How many remote routes go direct via each node address: one
    /// nexthop each.
    direct_gateways: HashMap<IpAddr, u32>,
    /// Our own addresses from LOCAL_HOST routes (by route): without a local
    /// VTEP, the lowest names the parent interface.
    local_hosts: HashMap<IpNetwork, IpAddr>,
    dirty: Dirty,
}

impl FamilyManager {
    pub fn new(family: Family, hostname: ArcStr, settings: FamilySettings) -> FamilyManager {
        let mut m = FamilyManager {
            family,
            hostname,
            settings: FamilySettings {
                external_nodes: Vec::new(),
                ..settings.clone()
            },
            local_vtep: None,
            parent_ip: None,
            parent: None,
            remote_vteps: DenseMap::default(),
            node_by_mac: DenseMap::default(),
            node_by_tunnel_ip: FamilyMap::default(),
            ipset_refs: FamilyMap::default(),
            remote_routes: FamilyMap::default(),
            local_blocks: HashSet::new(),
            routes_by_node: DenseMap::default(),
            direct_routes: HashMap::new(),
            direct_gateways: HashMap::new(),
            local_hosts: HashMap::new(),
            dirty: Dirty::default(),
        };
        m.set_settings(settings);
        m
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn parent(&self) -> Option<&ParentInterface> {
        self.parent.as_deref()
    }

    /// The underlay address the local VTEP sends from, or without a local
    /// VTEP (no-encap routes only, flannel's host-gw) the node's own
    /// address: the parent interface is whichever interface holds it.
    pub fn parent_ip(&self) -> Option<IpAddr> {
        let own = || self.local_hosts.values().min().copied();
        self.parent_ip.or_else(own)
    }

    /// What a new stream takes over from the previous one: the underlay
    /// address and the interface holding it. Like a removed local VTEP, a
    /// stream that has not (yet) declared ours leaves them as they are, so
    /// direct routes do not flap through the tunnel on a reconnect.
    pub(super) fn inherit_underlay(&mut self, previous: &FamilyManager) {
        self.parent_ip = previous.parent_ip;
        self.set_parent(previous.parent.as_deref().cloned());
    }

    pub fn set_settings(&mut self, settings: FamilySettings) {
        let old = std::mem::replace(&mut self.settings, settings);
        let new = self.settings.clone();
        if (&old.device_name, old.vni, old.port, old.mtu)
            != (&new.device_name, new.vni, new.port, new.mtu)
        {
            self.dirty.device = true;
        }
        if old.mtu != new.mtu || old.route_protocol != new.route_protocol {
            self.mark_all_routes_dirty();
        }
        if old.route_protocol != new.route_protocol {
            let keys: Vec<NexthopKey> = self.nexthop_keys().collect();
            self.dirty.nexthops.extend(keys);
        }
        for net in old.external_nodes {
            self.unref_ipset(net);
        }
        for net in new.external_nodes {
            self.ref_ipset(net);
        }
    }

    /// The interface holding the local VTEP's parent address, as the kernel
    /// reports it (`None`: not found).
    pub fn set_parent(&mut self, parent: Option<ParentInterface>) {
        if self.parent.as_deref() == parent.as_ref() {
            return;
        }
        let old_mtu = self.tunnel_mtu();
        self.parent = parent.map(Arc::new);
        self.dirty.device = true;
        if self.tunnel_mtu() != old_mtu {
            self.mark_all_routes_dirty();
        } else {
            self.dirty.routes.extend(self.direct_routes.keys().copied());
        }
        self.mark_direct_nexthops_dirty();
    }

    /// Every nexthop this family may want: one per remote VTEP, one per
    /// direct gateway.
    fn nexthop_keys(&self) -> impl Iterator<Item = NexthopKey> + '_ {
        let tunnel = (self.remote_vteps.keys()).map(|n| NexthopKey::Tunnel(self.family, n.clone()));
        let direct = self.direct_gateways.keys().map(|g| NexthopKey::Direct(*g));
        tunnel.chain(direct)
    }

    fn mark_direct_nexthops_dirty(&mut self) {
        let keys = self.direct_gateways.keys().map(|g| NexthopKey::Direct(*g));
        self.dirty.nexthops.extend(keys);
    }

    fn mark_all_routes_dirty(&mut self) {
        self.dirty.routes.extend(self.remote_routes.keys());
        self.dirty.routes.extend(self.local_blocks.iter().copied());
    }

    /// Felix's RouteUpdate: forget `dst`, then keep it if it is a remote route
    /// or a local block. Returns false when the update had no effect.
    pub fn on_route(&mut self, route: RouteIntent) -> bool {
        debug_assert_eq!(route.family(), self.family);
        let forgot = self.forget_route(route.dst);
        if let Some(kind) = route.remote_kind() {
            let node = self.intern_node(&route.node);
            (self.routes_by_node)
                .get_or_insert_with(node.clone(), NodeRoutes::default)
                .push(route.dst);
            if let Some(gateway) = route.direct_via() {
                self.direct_routes.insert(route.dst, gateway);
                let users = self.direct_gateways.entry(gateway).or_insert(0);
                *users += 1;
                if *users == 1 {
                    self.dirty.nexthops.insert(NexthopKey::Direct(gateway));
                }
            }
            let remote = RemoteRoute {
                node,
                kind,
                no_encap: route.is_no_encap(),
            };
            self.remote_routes.insert(route.dst, remote);
        } else if route.is_local_block() {
            self.local_blocks.insert(route.dst);
        } else if let Some(ip) = route
            .local_host_address()
            .filter(|_| *route.node == *self.hostname)
        {
            // Not a route of ours: it only says where the parent is.
            self.local_hosts.insert(route.dst, ip);
            return true;
        } else {
            return forgot;
        }
        self.dirty.routes.insert(route.dst);
        true
    }

    /// RouteRemove. Returns false for a `dst` that was not known.
    pub fn on_route_remove(&mut self, dst: IpNetwork) -> bool {
        self.forget_route(dst)
    }

    fn forget_route(&mut self, dst: IpNetwork) -> bool {
        let remote = self.remote_routes.remove(&dst);
        if let Some(r) = &remote {
            if let Some(routes) = self.routes_by_node.get_mut(&r.node) {
                routes.remove(dst);
                if routes.is_empty() {
                    self.routes_by_node.remove(&r.node);
                }
            }
            if let Some(gateway) = self.direct_routes.remove(&dst)
                && let Some(users) = self.direct_gateways.get_mut(&gateway)
            {
                *users -= 1;
                if *users == 0 {
                    self.direct_gateways.remove(&gateway);
                    self.dirty.nexthops.insert(NexthopKey::Direct(gateway));
                }
            }
        }
        let local = self.local_blocks.remove(&dst);
        let forgot = remote.is_some() || local;
        if forgot {
            self.dirty.routes.insert(dst);
        }
        self.local_hosts.remove(&dst).is_some() || forgot
    }

    /// Reuses the node name already held, so each node's name is stored once.
    fn intern_node(&self, node: &str) -> ArcStr {
        self.routes_by_node
            .get_key_value(node)
            .map(|(k, _)| k.clone())
            .or_else(|| {
                self.remote_vteps
                    .get_key_value(node)
                    .map(|(k, _)| k.clone())
            })
            .unwrap_or_else(|| ArcStr::from(node))
    }

    /// Two nodes may not claim the same MAC or tunnel address, the local
    /// VTEP included. The newer claim is the one rejected, whichever side
    /// makes it (a remote claiming our addresses, or our own VTEP arriving
    /// with a remote's): what is already programmed, our device or the other
    /// node's routes and L2 entries, keeps working, and the batch status
    /// names both nodes. Evicting the holder instead would cut a live node
    /// off on the strength of one message.
    fn claim(
        &self,
        node: &str,
        local: bool,
        remote: Option<&ArcStr>,
        what: impl FnOnce() -> String,
    ) -> Result<(), Rejection> {
        let holder = if local { Some(&self.hostname) } else { remote };
        match holder.filter(|h| ***h != *node) {
            Some(other) => Err(Rejection(format!(
                "vtep_update for node {}: {} of node {}",
                quote(node),
                what(),
                quote(other)
            ))),
            None => Ok(()),
        }
    }

    fn mac_claim(&self, node: &str, mac: MacAddr) -> Result<(), Rejection> {
        let local = self.local_vtep.as_ref().is_some_and(|l| l.mac == mac);
        self.claim(node, local, self.node_by_mac.get(&mac), || {
            format!("{} mac {mac} is already the VTEP MAC", self.family)
        })
    }

    fn tunnel_claim(&self, node: &str, ip: IpAddr) -> Result<(), Rejection> {
        let local = self.local_vtep.as_ref().is_some_and(|l| l.tunnel_ip == ip);
        self.claim(node, local, self.node_by_tunnel_ip.get(&ip), || {
            format!("tunnel address {ip} is already the tunnel address")
        })
    }

    /// This family's part of a VTEP update. `Ok(false)`: the update has
    /// none. A rejected part of a remote node's update still replaces its
    /// VTEP with what is usable of it, as Felix keeps a node's newest VTEP.
    pub fn on_vtep(&mut self, update: &VtepUpdate) -> Result<bool, Rejection> {
        let Some(part) = update.part(self.family) else {
            return Ok(false);
        };
        if *update.node == *self.hostname {
            return self.on_local_vtep(part).map(|()| true);
        }
        let node = self.intern_node(&update.node);
        let (vtep, outcome) = match part {
            VtepPart::Valid(addrs) => match (
                self.tunnel_claim(&node, addrs.tunnel_ip),
                self.mac_claim(&node, addrs.mac),
            ) {
                (Err(rejection), _) => (None, Err(rejection)),
                (Ok(()), Err(rejection)) => (
                    Some(RemoteVtep::TunnelOnly(addrs.tunnel_ip)),
                    Err(rejection),
                ),
                (Ok(()), Ok(())) => (Some(RemoteVtep::Complete(addrs.clone())), Ok(true)),
            },
            VtepPart::Invalid {
                tunnel_ip,
                rejection,
            } => {
                let usable = tunnel_ip.filter(|ip| self.tunnel_claim(&node, *ip).is_ok());
                (usable.map(RemoteVtep::TunnelOnly), Err(rejection.clone()))
            }
        };
        self.set_remote_vtep(node, vtep);
        outcome
    }

    /// A bad part keeps the local VTEP as it was: one bad message must not
    /// take the device, and the node's connectivity, away.
    fn on_local_vtep(&mut self, part: &VtepPart) -> Result<(), Rejection> {
        let addrs = match part {
            VtepPart::Valid(addrs) => addrs,
            VtepPart::Invalid { rejection, .. } => return Err(rejection.clone()),
        };
        self.mac_claim(&self.hostname, addrs.mac)?;
        self.tunnel_claim(&self.hostname, addrs.tunnel_ip)?;
        if self.local_vtep.as_ref() != Some(addrs) {
            self.local_vtep = Some(addrs.clone());
            self.parent_ip = Some(addrs.parent_ip);
            self.dirty.device = true;
        }
        Ok(())
    }

    /// A VTEP remove. Returns false for an unknown node.
    ///
    /// Removing our own VTEP programs no device any more, which leaves the
    /// existing one as it is (Felix only notes that local information is
    /// missing); the parent address stays, and with it the parent interface
    /// and the routes over it.
    pub fn on_vtep_remove(&mut self, node: &str) -> bool {
        if *node == *self.hostname {
            let known = self.local_vtep.take().is_some();
            self.dirty.device |= known;
            return known;
        }
        self.remove_remote_vtep(node)
    }

    fn set_remote_vtep(&mut self, node: ArcStr, vtep: Option<RemoteVtep>) {
        if self.remote_vteps.get(&node).map(HeldVtep::unhold) == vtep {
            return;
        }
        self.remove_remote_vtep(&node);
        let Some(vtep) = vtep else {
            return;
        };
        self.node_by_tunnel_ip
            .insert(vtep.tunnel_ip(), node.clone());
        if let Some(addrs) = vtep.complete() {
            self.node_by_mac.insert(addrs.mac, node.clone());
            self.ref_ipset(Family::host_net(addrs.parent_ip));
        }
        self.mark_vtep_dirty(&node, &vtep);
        self.remote_vteps.insert(node, HeldVtep::hold(vtep));
    }

    fn remove_remote_vtep(&mut self, node: &str) -> bool {
        let Some((node, held)) = self.remote_vteps.remove_entry(node) else {
            return false;
        };
        let vtep = held.unhold();
        self.node_by_tunnel_ip.remove(&vtep.tunnel_ip());
        if let Some(addrs) = vtep.complete() {
            self.node_by_mac.remove(&addrs.mac);
            self.unref_ipset(Family::host_net(addrs.parent_ip));
        }
        self.mark_vtep_dirty(&node, &vtep);
        true
    }

    /// Everything derived from one remote VTEP.
    fn mark_vtep_dirty(&mut self, node: &ArcStr, vtep: &RemoteVtep) {
        self.dirty.neighbors.insert(vtep.tunnel_ip());
        if let Some(addrs) = vtep.complete() {
            self.dirty.fdb.insert(addrs.mac);
        }
        self.dirty
            .nexthops
            .insert(NexthopKey::Tunnel(self.family, node.clone()));
        if let Some(routes) = self.routes_by_node.get(node) {
            self.dirty.routes.extend(routes.iter());
        }
    }

    fn ref_ipset(&mut self, net: IpNetwork) {
        let refs = self.ipset_refs.get_or_insert_with(net, || 0);
        *refs += 1;
        if *refs == 1 {
            self.dirty.ipset.insert(net);
        }
    }

    fn unref_ipset(&mut self, net: IpNetwork) {
        if let Some(refs) = self.ipset_refs.get_mut(&net) {
            *refs -= 1;
            if *refs == 0 {
                self.ipset_refs.remove(&net);
                self.dirty.ipset.insert(net);
            }
        }
    }

    /// MTU of the device and of routes through it.
    fn tunnel_mtu(&self) -> Option<u32> {
        self.settings.mtu.or_else(|| {
            self.parent
                .as_ref()
                .map(|p| p.mtu.saturating_sub(self.family.encap_overhead()))
        })
    }

    pub fn desired_device(&self) -> Option<VxlanDevice> {
        let local = self.local_vtep.as_ref()?;
        let parent = ParentInterface::clone(self.parent.as_ref()?);
        Some(VxlanDevice {
            name: self.settings.device_name.clone(),
            family: self.family,
            vni: self.settings.vni,
            port: self.settings.port,
            local_ip: local.parent_ip,
            mac: local.mac,
            mtu: self.tunnel_mtu()?,
            address: Family::host_net(local.tunnel_ip),
            parent,
        })
    }

    pub fn desired_route(&self, dst: &IpNetwork) -> Option<Route> {
        let protocol = self.settings.route_protocol;
        let route = |target, mtu| Route {
            dst: *dst,
            target,
            protocol,
            mtu,
        };
        let Some(remote) = self.remote_routes.get(dst) else {
            return self
                .local_blocks
                .contains(dst)
                .then(|| route(RouteTarget::Blackhole, None));
        };
        if let (Some(gateway), Some(parent)) = (self.direct_routes.get(dst), &self.parent) {
            let target = RouteTarget::Direct {
                gateway: *gateway,
                interface: parent.clone(),
            };
            return Some(route(target, None));
        }
        if remote.no_encap {
            return None;
        }
        let target = match remote.kind {
            RemoteRouteKind::TunnelAddress => RouteTarget::Connected {
                node: remote.node.clone(),
            },
            RemoteRouteKind::Block => RouteTarget::Tunnel {
                node: remote.node.clone(),
                gateway: self.remote_vteps.get(&remote.node)?.tunnel_ip(),
            },
        };
        Some(route(target, self.tunnel_mtu().and_then(NonZeroU32::new)))
    }

    /// Why a remote route that `desired_route` leaves out waits.
    fn wait_reason(&self, dst: &IpNetwork, remote: &RemoteRoute) -> WaitReason {
        match (remote.no_encap, self.direct_routes.get(dst)) {
            (false, _) => WaitReason::NoVtep,
            (true, Some(_)) => WaitReason::NoParent,
            (true, None) => WaitReason::NoNodeAddress,
        }
    }

    fn desired_nexthop(&self, key: &NexthopKey) -> Option<Nexthop> {
        let (gateway, via) = match key {
            NexthopKey::Tunnel(_, node) => {
                let (node, vtep) = self.remote_vteps.get_key_value(node)?;
                let via = NexthopVia::Tunnel {
                    family: self.family,
                    node: node.clone(),
                };
                (vtep.tunnel_ip(), via)
            }
            NexthopKey::Direct(gateway) => {
                self.direct_gateways.get(gateway)?;
                let interface = self.parent.clone()?;
                (*gateway, NexthopVia::Direct { interface })
            }
        };
        Some(Nexthop {
            gateway,
            via,
            protocol: self.settings.route_protocol,
        })
    }

    fn complete_vtep(&self, node: &ArcStr) -> Option<VtepAddresses> {
        self.remote_vteps.get(node)?.unhold().complete().cloned()
    }

    fn desired_neighbor(&self, address: &IpAddr) -> Option<Neighbor> {
        let node = self.node_by_tunnel_ip.get(address)?;
        Some(Neighbor {
            address: *address,
            mac: self.complete_vtep(node)?.mac,
        })
    }

    fn desired_fdb(&self, mac: &MacAddr) -> Option<FdbEntry> {
        let node = self.node_by_mac.get(mac)?;
        Some(FdbEntry {
            family: self.family,
            mac: *mac,
            destination: self.complete_vtep(node)?.parent_ip,
        })
    }

    fn desired_ipset_member(&self, net: &IpNetwork) -> Option<IpsetMember> {
        self.ipset_refs
            .contains_key(net)
            .then_some(IpsetMember(*net))
    }

    /// Felix's CompleteDeferredWork: the desired state of every key touched
    /// since the last call.
    pub fn complete_deferred_work(&mut self, delta: &mut Delta) {
        let dirty = std::mem::take(&mut self.dirty);
        if dirty.device {
            delta.devices.push(Change {
                key: self.family,
                desired: self.desired_device(),
            });
        }
        delta
            .nexthops
            .extend(dirty.nexthops.into_iter().map(|key| Change {
                desired: self.desired_nexthop(&key),
                key,
            }));
        delta
            .routes
            .extend(dirty.routes.into_iter().map(|dst| Change {
                desired: self.desired_route(&dst),
                key: dst,
            }));
        delta
            .neighbors
            .extend(dirty.neighbors.into_iter().map(|ip| Change {
                desired: self.desired_neighbor(&ip),
                key: ip,
            }));
        delta.fdb.extend(dirty.fdb.into_iter().map(|mac| Change {
            desired: self.desired_fdb(&mac),
            key: FdbKey(self.family, mac),
        }));
        delta
            .ipset
            .extend(dirty.ipset.into_iter().map(|net| Change {
                desired: self.desired_ipset_member(&net),
                key: net,
            }));
    }

    /// Every desired object, as a delta from nothing.
    pub fn full_delta(&self, delta: &mut Delta) {
        fn all<T: Desired>(objects: impl Iterator<Item = T>) -> impl Iterator<Item = Change<T>> {
            objects.map(|o| Change {
                key: o.key(),
                desired: Some(o),
            })
        }
        let s = self.snapshot();
        delta.devices.extend(all(s.device.into_iter()));
        delta.nexthops.extend(all(self
            .nexthop_keys()
            .filter_map(|k| self.desired_nexthop(&k))));
        delta.routes.extend(all(s.routes.into_iter()));
        delta.neighbors.extend(all(s.neighbors.into_iter()));
        delta.fdb.extend(all(s.fdb.into_iter()));
        delta.ipset.extend(all(s.ipset.into_iter()));
    }

    /// The whole desired state, sorted for stable output.
    pub fn snapshot(&self) -> FamilySnapshot {
        let mut routes = Vec::new();
        let mut waiting_routes = Vec::new();
        for (dst, remote) in self.remote_routes.iter() {
            match self.desired_route(&dst) {
                Some(r) => routes.push(r),
                None => waiting_routes.push(WaitingRoute {
                    dst,
                    node: remote.node.clone(),
                    reason: self.wait_reason(&dst, remote),
                }),
            }
        }
        let blackholes = self.local_blocks.iter();
        routes.extend(blackholes.filter_map(|dst| self.desired_route(dst)));
        routes.sort_by_key(|r| r.dst);
        routes.dedup_by_key(|r| r.dst);
        waiting_routes.sort_by_key(|r| r.dst);
        let mut remote_vteps: Vec<_> = self
            .remote_vteps
            .iter()
            .map(|(n, v)| (n.clone(), v.unhold()))
            .collect();
        remote_vteps.sort_by(|a, b| a.0.cmp(&b.0));
        let mut neighbors: Vec<_> = self
            .node_by_tunnel_ip
            .keys()
            .filter_map(|ip| self.desired_neighbor(&ip))
            .collect();
        neighbors.sort_by_key(|n| n.address);
        let mut fdb: Vec<_> = self
            .node_by_mac
            .keys()
            .filter_map(|mac| self.desired_fdb(mac))
            .collect();
        fdb.sort_by_key(|f| f.mac);
        let mut ipset: Vec<_> = self.ipset_refs.keys().map(IpsetMember).collect();
        ipset.sort_by_key(|m| m.0);
        FamilySnapshot {
            device: self.desired_device(),
            parent: self.parent.as_deref().cloned(),
            local_vtep: self.local_vtep.clone().map(|v| (self.hostname.clone(), v)),
            remote_vteps,
            routes,
            waiting_routes,
            neighbors,
            fdb,
            ipset,
        }
    }
}

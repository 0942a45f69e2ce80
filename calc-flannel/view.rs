//! The pure core: the network config, this node's lease and the other
//! nodes' leases, as the Felix messages vxmgrd programs (DESIGN.md §4b).
//!
//! vxlan: a lease is one VTEP (tunnel address = the subnet's network
//! address, MAC = VtepMAC, parent = PublicIP) and one route per family to
//! its subnet through it; this node's lease is the local VTEP, which gives
//! vxmgrd the device. host-gw: a lease is one no-encap route per family via
//! its PublicIP, and this node's lease names the parent address (a
//! LOCAL_HOST route); there is no device. A lease whose PublicIP is off
//! this node's networks goes without its address: vxmgrd does not route
//! it, and GetState lists it among the waiting routes.
//!
//! The view remembers what it sent for every lease, so a change sends the
//! difference and a relisting sends only what changed while it was away.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use tracing::{info, warn};
use vxmgr::model::{Family, MacAddr};
use vxmgr::wire::felix::{
    ConfigUpdate, InSync, IpPoolType, IpamPool, IpamPoolUpdate, RouteRemove, RouteType,
    RouteUpdate, ToDataplane, VxlanTunnelEndpointRemove, VxlanTunnelEndpointUpdate,
    to_dataplane::Payload,
};

use crate::iface::Underlay;
use crate::lease::Lease;
use crate::network::{Backend, NetworkConfig};
use crate::subnet::SubnetKey;

#[cfg(test)]
mod tests;

/// This node, as the messages need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Local {
    /// vxmgrd's name for this node: the local VTEP's node.
    pub hostname: String,
    pub lease: Lease,
    pub underlay: Underlay,
    /// flannel's --ip-masq: the pods' traffic to outside the network is
    /// masqueraded.
    pub ip_masq: bool,
}

impl Local {
    /// On this node's L2 segment.
    fn on_link(&self, ip: IpAddr) -> bool {
        self.underlay.networks.iter().any(|n| n.contains(ip))
    }

    /// The interface address of `family`: the VXLAN device's source, the
    /// parent interface's address.
    fn address(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => Some(IpAddr::V4(self.underlay.address_v4)),
            Family::V6 => self.underlay.address_v6.map(IpAddr::V6),
        }
    }
}

/// What one lease was sent as, in typed form: the messages are made from
/// it as they are sent (tens of thousands of leases are held at once, and
/// their messages' strings would be most of calc-flannel's memory).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Programmed {
    /// The VTEP's address, MAC and parent of each family it has.
    vtep: [Option<VtepFamily>; 2],
    /// At most one route per family.
    routes: [Option<Route>; 2],
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct VtepFamily {
    mac: MacAddr,
    tunnel: IpAddr,
    parent: IpAddr,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Route {
    types: RouteType,
    pool: IpPoolType,
    dst: IpNetwork,
    /// None: sent without a node address (vxmgrd holds it unprogrammed).
    node_ip: Option<IpAddr>,
    same_subnet: bool,
}

impl Programmed {
    fn has_vtep(&self) -> bool {
        self.vtep.iter().any(Option::is_some)
    }

    /// The routes in the order of their destinations' text.
    fn routes(&self) -> impl Iterator<Item = &Route> {
        let mut routes: Vec<&Route> = self.routes.iter().flatten().collect();
        routes.sort_by_cached_key(|r| r.dst.to_string());
        routes.into_iter()
    }

    fn route_to(&self, dst: IpNetwork) -> Option<&Route> {
        self.routes.iter().flatten().find(|r| r.dst == dst)
    }
}

impl Route {
    fn message(&self, node: &str) -> RouteUpdate {
        RouteUpdate {
            types: self.types as i32,
            ip_pool_type: self.pool as i32,
            dst: self.dst.to_string(),
            dst_node_name: node.to_string(),
            dst_node_ip: self.node_ip.map(|ip| ip.to_string()).unwrap_or_default(),
            same_subnet: self.same_subnet,
            ..Default::default()
        }
    }
}

/// The VTEP update of `node` with the families in `vtep`.
fn vtep_message(node: &str, vtep: &[Option<VtepFamily>; 2]) -> VxlanTunnelEndpointUpdate {
    let mut update = VxlanTunnelEndpointUpdate {
        node: node.to_string(),
        ..Default::default()
    };
    for (family, data) in Family::ALL.into_iter().zip(vtep) {
        let Some(data) = data else { continue };
        let (mac, tunnel, parent) = (
            data.mac.to_string(),
            data.tunnel.to_string(),
            data.parent.to_string(),
        );
        match family {
            Family::V4 => {
                (update.mac, update.ipv4_addr, update.parent_device_ip) = (mac, tunnel, parent);
            }
            Family::V6 => {
                (update.mac_v6, update.ipv6_addr, update.parent_device_ipv6) =
                    (mac, tunnel, parent);
            }
        }
    }
    update
}

pub struct View {
    config: NetworkConfig,
    local: Local,
    local_sent: Programmed,
    remotes: BTreeMap<SubnetKey, Programmed>,
    /// Why parts of a lease are not used, as last logged.
    problems: BTreeMap<SubnetKey, Vec<String>>,
}

fn message(payload: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(payload),
    }
}

impl View {
    pub fn new(config: NetworkConfig, local: Local) -> View {
        let mut view = View {
            config,
            local,
            local_sent: Programmed::default(),
            remotes: BTreeMap::new(),
            problems: BTreeMap::new(),
        };
        view.local_sent = view.local_programmed();
        view
    }

    pub fn local(&self) -> &Local {
        &self.local
    }

    pub fn config(&self) -> &NetworkConfig {
        &self.config
    }

    /// Leases of other nodes known, usable or not.
    pub fn remote_count(&self) -> usize {
        self.remotes.len()
    }

    /// The whole state, as a new stream starts: config, this node, every
    /// other lease, InSync. Made lease by lease as it is sent, so that
    /// vxmgrd programs the first leases while the last are made.
    pub fn snapshot(&self) -> impl Iterator<Item = ToDataplane> + '_ {
        let mut head = vec![self.config_update()];
        head.extend(self.pools());
        diff(
            &self.local.hostname,
            &Programmed::default(),
            &self.local_sent,
            &mut head,
        );
        let remotes = self.remotes.iter().flat_map(|(key, sent)| {
            let mut out = Vec::new();
            diff(&key.to_string(), &Programmed::default(), sent, &mut out);
            out
        });
        head.into_iter()
            .chain(remotes)
            .chain(std::iter::once(message(Payload::InSync(InSync {}))))
    }

    /// Another node's lease, new or changed.
    pub fn put(&mut self, lease: &Lease) -> Vec<ToDataplane> {
        let mut out = Vec::new();
        self.put_into(lease, Some(&mut out));
        out
    }

    /// Takes in a lease; its messages go to `out`, if any.
    fn put_into(&mut self, lease: &Lease, out: Option<&mut Vec<ToDataplane>>) {
        if lease.key == self.local.lease.key {
            return;
        }
        let (wanted, problems) = self.remote_programmed(lease);
        self.note_problems(lease.key, problems);
        let sent = self.remotes.entry(lease.key).or_default();
        if let Some(out) = out {
            diff(&lease.key.to_string(), sent, &wanted, out);
        }
        *sent = wanted;
    }

    /// Another node's lease deleted or expired.
    pub fn delete(&mut self, key: &SubnetKey) -> Vec<ToDataplane> {
        let mut out = Vec::new();
        self.delete_into(key, Some(&mut out));
        out
    }

    fn delete_into(&mut self, key: &SubnetKey, out: Option<&mut Vec<ToDataplane>>) {
        self.problems.remove(key);
        if let (Some(sent), Some(out)) = (self.remotes.remove(key), out) {
            diff(&key.to_string(), &sent, &Programmed::default(), out);
        }
    }

    /// Every lease as listed again (after a compaction or an outage):
    /// what changed since the view last heard. Keys listed with a value
    /// that cannot be read keep what they had.
    pub fn resync(
        &mut self,
        leases: &[Lease],
        unreadable: &BTreeSet<SubnetKey>,
    ) -> Vec<ToDataplane> {
        let mut out = Vec::new();
        self.resync_into(leases, unreadable, Some(&mut out));
        out
    }

    /// The listing at start-up, before vxmgrd has a stream: taken in
    /// without messages, as the [`View::snapshot`] a stream starts with
    /// carries every lease.
    pub fn load(&mut self, leases: &[Lease], unreadable: &BTreeSet<SubnetKey>) {
        self.resync_into(leases, unreadable, None);
    }

    fn resync_into(
        &mut self,
        leases: &[Lease],
        unreadable: &BTreeSet<SubnetKey>,
        mut out: Option<&mut Vec<ToDataplane>>,
    ) {
        if !self.remotes.is_empty() {
            let listed: BTreeSet<SubnetKey> = leases.iter().map(|l| l.key).collect();
            let gone: Vec<SubnetKey> = self
                .remotes
                .keys()
                .filter(|k| !listed.contains(k) && !unreadable.contains(k))
                .copied()
                .collect();
            for key in &gone {
                self.delete_into(key, out.as_deref_mut());
            }
        }
        for lease in leases {
            self.put_into(lease, out.as_deref_mut());
        }
    }

    /// This node's lease is another one now (acquired again).
    pub fn set_local_lease(&mut self, lease: Lease) -> Vec<ToDataplane> {
        let mut out = Vec::new();
        self.local.lease = lease;
        let wanted = self.local_programmed();
        diff(&self.local.hostname, &self.local_sent, &wanted, &mut out);
        self.local_sent = wanted;
        // A lease we knew as another node's may be ours now.
        let key = self.local.lease.key;
        self.delete_into(&key, Some(&mut out));
        out
    }

    fn note_problems(&mut self, key: SubnetKey, problems: Vec<String>) {
        let before = self.problems.get(&key).cloned().unwrap_or_default();
        if before == problems {
            return;
        }
        for problem in &problems {
            warn!(lease = %key, "{problem}");
        }
        if problems.is_empty() {
            info!(lease = %key, "lease usable again");
            self.problems.remove(&key);
        } else {
            self.problems.insert(key, problems);
        }
    }

    fn config_update(&self) -> ToDataplane {
        let mut config = std::collections::HashMap::new();
        if let Backend::Vxlan(vxlan) = &self.config.backend {
            let mtu = vxlan.mtu.map_or("0".to_string(), |m| m.to_string());
            for (key, value) in [
                ("VXLANVNI", vxlan.vni.to_string()),
                ("VXLANPort", vxlan.port().to_string()),
                ("VXLANMTU", mtu.clone()),
                ("VXLANMTUV6", mtu),
                ("VXLANDeviceName", format!("flannel.{}", vxlan.vni)),
                ("VXLANDeviceNameV6", format!("flannel-v6.{}", vxlan.vni)),
            ] {
                config.insert(key.to_string(), value);
            }
        }
        message(Payload::ConfigUpdate(ConfigUpdate {
            config,
            ..Default::default()
        }))
    }

    /// The network of each family as an IP pool, masquerading with
    /// --ip-masq: vxmgrd masquerades what leaves the network, as flannel
    /// does. Without it no pool is declared, and vxmgrd adds no rule.
    fn pools(&self) -> Vec<ToDataplane> {
        if !self.local.ip_masq {
            return Vec::new();
        }
        let networks = std::iter::once((Family::V4, self.config.v4.network))
            .chain(self.config.v6.as_ref().map(|r| (Family::V6, r.network)));
        networks
            .map(|(family, network)| {
                message(Payload::IpamPoolUpdate(IpamPoolUpdate {
                    id: format!("flannel-{}", family.to_string().to_lowercase()),
                    pool: Some(IpamPool {
                        cidr: network.to_string(),
                        masquerade: true,
                        ..Default::default()
                    }),
                }))
            })
            .collect()
    }

    /// The families a lease is used in: IPv4 always, IPv6 when the network
    /// has it and the lease has an IPv6 subnet and address.
    fn families(&self, lease: &Lease) -> Vec<(Family, IpNetwork, Option<IpAddr>)> {
        let mut families = vec![(
            Family::V4,
            IpNetwork::V4(lease.key.v4),
            Some(IpAddr::V4(lease.attrs.public_ip)),
        )];
        if let (Some(_), Some(v6)) = (&self.config.v6, lease.key.v6) {
            families.push((
                Family::V6,
                IpNetwork::V6(v6),
                lease.attrs.public_ipv6.map(IpAddr::V6),
            ));
        }
        families
    }

    fn local_programmed(&self) -> Programmed {
        let lease = &self.local.lease;
        let mut p = Programmed::default();
        for (family, subnet, public) in self.families(lease) {
            let (Some(_), Some(address)) = (public, self.local.address(family)) else {
                continue;
            };
            let slot = family as usize;
            match &self.config.backend {
                Backend::Vxlan(_) => {
                    // Our own lease: we wrote its data.
                    if let Ok(data) = lease.attrs.vxlan_data(family) {
                        p.vtep[slot] = Some(VtepFamily {
                            mac: data.vtep_mac,
                            tunnel: subnet.network(),
                            parent: address,
                        });
                    }
                }
                Backend::HostGw => {
                    p.routes[slot] = Some(Route {
                        types: RouteType::LocalHost,
                        pool: IpPoolType::NoEncap,
                        dst: Family::host_net(address),
                        node_ip: Some(address),
                        same_subnet: false,
                    });
                }
            }
        }
        p
    }

    /// What another node's lease is sent as, and why any part of it is not.
    fn remote_programmed(&self, lease: &Lease) -> (Programmed, Vec<String>) {
        let mut p = Programmed::default();
        let mut problems = Vec::new();
        let ours = self.config.backend.lease_type();
        if lease.attrs.backend_type != ours {
            problems.push(format!(
                "ignored: backend type {:?}, this network's is {ours:?}",
                lease.attrs.backend_type
            ));
            return (p, problems);
        }
        for (family, subnet, public) in self.families(lease) {
            let Some(public) = public else {
                problems.push(format!("{family} not used: no PublicIPv6"));
                continue;
            };
            let slot = family as usize;
            let mut route = Route {
                types: RouteType::RemoteWorkload,
                pool: IpPoolType::Vxlan,
                dst: subnet,
                node_ip: Some(public),
                same_subnet: false,
            };
            match &self.config.backend {
                Backend::Vxlan(vxlan) => {
                    let data = match lease.attrs.vxlan_data(family) {
                        Ok(data) => data,
                        Err(e) => {
                            problems.push(format!("{family} not used: {e}"));
                            continue;
                        }
                    };
                    p.vtep[slot] = Some(VtepFamily {
                        mac: data.vtep_mac,
                        tunnel: subnet.network(),
                        parent: public,
                    });
                    route.same_subnet = vxlan.direct_routing && self.local.on_link(public);
                }
                Backend::HostGw => {
                    route.pool = IpPoolType::NoEncap;
                    if !self.local.on_link(public) {
                        problems.push(format!(
                            "{family} route not programmed: host-gw needs every node on one L2 segment, and PublicIP {public} is on none of this node's networks ({}); vxmgrd's GetState lists it among the waiting routes",
                            self.underlay_text()
                        ));
                        // Sent without a node address, vxmgrd holds the
                        // route unprogrammed and reports it as waiting.
                        route.node_ip = None;
                    }
                }
            }
            p.routes[slot] = Some(route);
        }
        (p, problems)
    }

    fn underlay_text(&self) -> String {
        let nets: Vec<String> = self
            .local
            .underlay
            .networks
            .iter()
            .map(|n| n.to_string())
            .collect();
        nets.join(", ")
    }
}

/// The messages that take vxmgrd from `before` to `after` for `node`:
/// routes going first, then the VTEP, then routes coming (so they find it).
fn diff(node: &str, before: &Programmed, after: &Programmed, out: &mut Vec<ToDataplane>) {
    for route in before.routes() {
        if after.route_to(route.dst).is_none() {
            out.push(message(Payload::RouteRemove(RouteRemove {
                dst: route.dst.to_string(),
            })));
        }
    }
    // vxmgrd ignores a VTEP update's missing family: a family that goes
    // needs the VTEP removed first.
    let dropped = (before.vtep.iter().zip(&after.vtep)).any(|(b, a)| b.is_some() && a.is_none());
    if before.has_vtep() && (!after.has_vtep() || dropped) {
        out.push(message(Payload::VtepRemove(VxlanTunnelEndpointRemove {
            node: node.to_string(),
        })));
    }
    if after.has_vtep() && (before.vtep != after.vtep || dropped) {
        out.push(message(Payload::VtepUpdate(vtep_message(
            node,
            &after.vtep,
        ))));
    }
    for route in after.routes() {
        if before.route_to(route.dst) != Some(route) {
            out.push(message(Payload::RouteUpdate(route.message(node))));
        }
    }
}

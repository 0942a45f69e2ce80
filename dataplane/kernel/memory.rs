//! The in-memory kernel: the semantics of the parts of Linux vxmgr uses
//! (interface indexes, routes that vanish with their device or nexthop or
//! when it goes down, EEXIST/ENODEV/ENETDOWN/ENOENT), held in maps, with every operation recorded.
//! Clones share one kernel, so a test can inspect what the daemon did.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use arcstr::ArcStr;
use foldhash::HashMap;
use ipnetwork::IpNetwork;
use tokio::sync::{mpsc, watch};

use super::firewall::memory::FirewallModel;
use super::firewall::{Firewall, FirewallChanges, FirewallError, FirewallState};
use super::objects::{
    DumpSink, DumpedNexthop, IpsetChange, KernelFdb, KernelNeighbor, KernelNexthop, KernelOp,
    KernelRoute, KernelRouteVia, KernelState, Link, Notification, Ownership, TableRoute,
    VxlanAttrs,
};
use super::watch::Watch;
use super::{KernelBackend, KernelError};
use crate::desired::ParentInterface;
use crate::model::MacAddr;

/// A fault to inject: operations it matches fail with `errno`.
type FaultRule = Box<dyn Fn(&KernelOp) -> bool + Send>;

#[derive(Default)]
pub struct MemoryKernel {
    pub links: BTreeMap<u32, Link>,
    pub routes: HashMap<IpNetwork, KernelRoute>,
    pub nexthops: BTreeMap<u32, KernelNexthop>,
    /// Ids of nexthops added without `onlink` (as hosts add them): never
    /// of vxmgr's shape, whatever their protocol and interface.
    pub plain_nexthops: BTreeSet<u32>,
    pub neighbors: HashMap<(u32, IpAddr), KernelNeighbor>,
    pub fdb: HashMap<(u32, MacAddr), KernelFdb>,
    pub ipsets: HashMap<String, BTreeSet<IpNetwork>>,
    pub firewall: FirewallModel,
    /// Every operation applied (successful or not), in order, once
    /// `record_operations` was called.
    pub log: Vec<KernelOp>,
    record: bool,
    next_index: u32,
    faults: Vec<(FaultRule, i32)>,
    /// Dumps fail with this errno.
    dump_fault: Option<i32>,
    /// Dumps read (or failed), to count the reconciler's reads of the kernel.
    pub dumps: u32,
    /// Applies wait here until released (see `hold_applies`).
    hold: Option<HeldApplies>,
    /// Answers address lookups that match no interface, standing in for a
    /// host's underlay (see `with_underlay`).
    underlay: Option<ParentInterface>,
    /// Where changes by others (`interfere`) are notified.
    watcher: Option<mpsc::UnboundedSender<Notification>>,
}

/// What an apply waits on while held: the release, and where it says it
/// has arrived.
#[derive(Clone)]
struct HeldApplies {
    released: watch::Receiver<bool>,
    arrived: Arc<watch::Sender<u32>>,
}

/// Holds every apply of a memory kernel before its first operation, the way
/// a long apply keeps the kernel task busy, until released or dropped.
pub struct ApplyHold {
    release: watch::Sender<bool>,
    arrived: watch::Receiver<u32>,
}

impl ApplyHold {
    /// Waits until an apply is held.
    pub async fn applying(&mut self) {
        let _ = self.arrived.wait_for(|applies| *applies > 0).await;
    }

    pub fn release(self) {
        let _ = self.release.send(true);
    }
}

/// A handle on a shared in-memory kernel.
#[derive(Clone)]
pub struct MemoryBackend(Arc<Mutex<MemoryKernel>>);

impl Default for MemoryBackend {
    fn default() -> Self {
        let mut kernel = MemoryKernel {
            next_index: 1,
            ..Default::default()
        };
        kernel.add_link("lo", 65536);
        MemoryBackend(Arc::new(Mutex::new(kernel)))
    }
}

impl MemoryBackend {
    /// A kernel with a loopback interface only.
    pub fn new() -> MemoryBackend {
        MemoryBackend::default()
    }

    /// A kernel with an underlay interface `name` that holds every address
    /// asked for: the local VTEP's parent address is always found. This is
    /// what `--kernel memory` runs with.
    pub fn with_underlay(name: &str, mtu: u32) -> MemoryBackend {
        let backend = MemoryBackend::new();
        {
            let mut k = backend.lock();
            let index = k.add_link(name, mtu);
            k.underlay = Some(ParentInterface {
                name: ArcStr::from(name),
                index,
                mtu,
            });
        }
        backend
    }

    pub fn lock(&self) -> MutexGuard<'_, MemoryKernel> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes every later operation matching `rule` fail with `errno`.
    pub fn inject_fault(&self, rule: impl Fn(&KernelOp) -> bool + Send + 'static, errno: i32) {
        self.lock().faults.push((Box::new(rule), errno));
    }

    /// Another agent changes the kernel: the change is made and notified
    /// like the kernel notifies it (IPv4 routes that go with their device
    /// are not notified, as in Linux).
    pub fn interfere(&self, op: KernelOp) -> Result<(), KernelError> {
        let mut k = self.lock();
        k.apply_one(&op)?;
        let notification = match op {
            KernelOp::AddRoute(r) | KernelOp::ReplaceRoute(r) => {
                Notification::Route(TableRoute::Shaped(r))
            }
            KernelOp::DeleteRoute(r) => Notification::RouteGone(TableRoute::Shaped(r)),
            KernelOp::ReplaceNeighbor(n) => Notification::Neighbor(n),
            KernelOp::DeleteNeighbor(n) => Notification::NeighborGone {
                ifindex: n.ifindex,
                address: n.address,
            },
            KernelOp::ReplaceFdb(e) => Notification::Fdb(e),
            KernelOp::DeleteFdb(e) => Notification::FdbGone {
                ifindex: e.ifindex,
                mac: e.mac,
            },
            KernelOp::CreateVxlan(_)
            | KernelOp::DeleteLink { .. }
            | KernelOp::SetMtu { .. }
            | KernelOp::SetUp { .. }
            | KernelOp::AddAddress { .. }
            | KernelOp::DeleteAddress { .. } => Notification::Links,
            KernelOp::DisableTxChecksum { .. }
            | KernelOp::AddNexthop(_)
            | KernelOp::ReplaceNexthop(_)
            | KernelOp::DeleteNexthop(_)
            | KernelOp::Ipset { .. } => return Ok(()),
        };
        if let Some(watcher) = &k.watcher {
            let _ = watcher.send(notification);
        }
        Ok(())
    }

    /// Another agent sets a link down or up, notified as Linux notifies it.
    pub fn set_link_up(&self, index: u32, up: bool) -> Result<(), KernelError> {
        let mut k = self.lock();
        let gone = if up {
            k.link_mut(index)?.up = true;
            Vec::new()
        } else {
            k.set_down(index)?
        };
        if let Some(watcher) = &k.watcher {
            let _ = watcher.send(if up {
                Notification::Links
            } else {
                Notification::LinkDown { index }
            });
            for n in gone {
                let _ = watcher.send(Notification::NeighborGone {
                    ifindex: n.ifindex,
                    address: n.address,
                });
            }
        }
        Ok(())
    }

    /// Another agent changes the firewall. A change made through nftables
    /// (`notified`: vxmgr's table, iptables-nft) is notified as Linux
    /// notifies it; legacy iptables' changes are not.
    pub fn change_firewall(&self, notified: bool, change: impl FnOnce(&mut FirewallModel)) {
        let mut k = self.lock();
        change(&mut k.firewall);
        if let Some(watcher) = k.watcher.as_ref().filter(|_| notified) {
            let _ = watcher.send(Notification::Firewall);
        }
    }

    /// Starts keeping every operation in `MemoryKernel::log`.
    pub fn record_operations(&self) {
        self.lock().record = true;
    }

    pub fn clear_faults(&self) {
        let mut k = self.lock();
        k.faults.clear();
        k.dump_fault = None;
    }

    /// Makes every later dump fail with `errno`, until `clear_faults`.
    pub fn fail_dumps(&self, errno: i32) {
        self.lock().dump_fault = Some(errno);
    }

    /// Holds every later apply until the hold is released.
    pub fn hold_applies(&self) -> ApplyHold {
        let (release, released) = watch::channel(false);
        let (arrived, arrived_rx) = watch::channel(0);
        self.lock().hold = Some(HeldApplies {
            released,
            arrived: Arc::new(arrived),
        });
        ApplyHold {
            release,
            arrived: arrived_rx,
        }
    }
}

impl MemoryKernel {
    /// Adds a plain (non-VXLAN) interface; returns its index.
    pub fn add_link(&mut self, name: &str, mtu: u32) -> u32 {
        let index = self.next_index;
        self.next_index += 1;
        self.links.insert(
            index,
            Link {
                index,
                name: name.to_string(),
                mtu,
                mac: None,
                up: true,
                vxlan: None,
                addresses: Vec::new(),
                tx_checksum: None,
            },
        );
        index
    }

    pub fn link_by_name(&self, name: &str) -> Option<&Link> {
        self.links.values().find(|l| l.name == name)
    }

    fn link_mut(&mut self, index: u32) -> Result<&mut Link, KernelError> {
        self.links
            .get_mut(&index)
            .ok_or(KernelError::from_errno(libc::ENODEV))
    }

    fn require_link(&self, index: u32) -> Result<(), KernelError> {
        if self.links.contains_key(&index) {
            Ok(())
        } else {
            Err(KernelError::from_errno(libc::ENODEV))
        }
    }

    /// Removes a link and everything the kernel removes with it.
    pub fn delete_link(&mut self, index: u32) -> Result<(), KernelError> {
        self.links
            .remove(&index)
            .ok_or(KernelError::from_errno(libc::ENODEV))?;
        self.drop_routes_through(index);
        self.neighbors.retain(|(i, _), _| *i != index);
        self.fdb.retain(|(i, _), _| *i != index);
        Ok(())
    }

    /// Sets a link down, dropping what Linux drops with it: its routes
    /// (IPv4 ones without a notification), its nexthops and the routes
    /// through them, and its neighbours, which are returned (those are
    /// notified). FDB entries stay.
    pub fn set_down(&mut self, index: u32) -> Result<Vec<KernelNeighbor>, KernelError> {
        self.link_mut(index)?.up = false;
        self.drop_routes_through(index);
        let gone: Vec<KernelNeighbor> = self
            .neighbors
            .values()
            .filter(|n| n.ifindex == index)
            .copied()
            .collect();
        self.neighbors.retain(|(i, _), _| *i != index);
        Ok(gone)
    }

    /// Removes the routes and nexthops through a link that goes.
    fn drop_routes_through(&mut self, index: u32) {
        let gone_nexthops: BTreeSet<u32> = self
            .nexthops
            .values()
            .filter(|n| n.ifindex == index)
            .map(|n| n.id)
            .collect();
        self.nexthops.retain(|id, _| !gone_nexthops.contains(id));
        self.routes.retain(|_, r| match r.via {
            KernelRouteVia::Nexthop(id) => !gone_nexthops.contains(&id),
            _ => r.ifindex() != Some(index),
        });
    }

    /// The link a route or nexthop goes through must exist and be up.
    fn require_up(&self, index: u32) -> Result<(), KernelError> {
        match self.links.get(&index) {
            None => Err(KernelError::from_errno(libc::ENODEV)),
            Some(link) if !link.up => Err(KernelError::from_errno(libc::ENETDOWN)),
            Some(_) => Ok(()),
        }
    }

    fn apply_one(&mut self, op: &KernelOp) -> Result<(), KernelError> {
        if let Some((_, errno)) = self.faults.iter().find(|(rule, _)| rule(op)) {
            return Err(KernelError::from_errno(*errno));
        }
        match op {
            KernelOp::CreateVxlan(spec) => {
                if self.link_by_name(&spec.name).is_some() {
                    return Err(KernelError::from_errno(libc::EEXIST));
                }
                self.require_link(spec.parent_index)?;
                let index = self.add_link(&spec.name, spec.mtu);
                let link = self.link_mut(index)?;
                link.up = false;
                link.mac = Some(spec.mac);
                link.vxlan = Some(VxlanAttrs {
                    vni: spec.vni,
                    port: spec.port,
                    parent_index: Some(spec.parent_index),
                    local: Some(spec.local),
                    learning: false,
                });
                link.tx_checksum = Some(true);
            }
            KernelOp::DeleteLink { index, .. } => self.delete_link(*index)?,
            KernelOp::SetMtu { index, mtu } => self.link_mut(*index)?.mtu = *mtu,
            KernelOp::SetUp { index } => self.link_mut(*index)?.up = true,
            KernelOp::AddAddress { index, address } => {
                let link = self.link_mut(*index)?;
                if link.addresses.contains(address) {
                    return Err(KernelError::from_errno(libc::EEXIST));
                }
                link.addresses.push(*address);
            }
            KernelOp::DeleteAddress { index, address } => {
                let link = self.link_mut(*index)?;
                let before = link.addresses.len();
                link.addresses.retain(|a| a != address);
                if link.addresses.len() == before {
                    return Err(KernelError::from_errno(libc::EADDRNOTAVAIL));
                }
            }
            KernelOp::DisableTxChecksum { name } => {
                let index = self
                    .link_by_name(name)
                    .map(|l| l.index)
                    .ok_or(KernelError::from_errno(libc::ENODEV))?;
                self.link_mut(index)?.tx_checksum = Some(false);
            }
            KernelOp::AddNexthop(n) => {
                if self.nexthops.contains_key(&n.id) {
                    return Err(KernelError::from_errno(libc::EEXIST));
                }
                self.require_up(n.ifindex)?;
                self.nexthops.insert(n.id, *n);
            }
            KernelOp::ReplaceNexthop(n) => {
                self.require_up(n.ifindex)?;
                self.nexthops.insert(n.id, *n);
                self.plain_nexthops.remove(&n.id);
            }
            KernelOp::DeleteNexthop(n) => {
                self.plain_nexthops.remove(&n.id);
                self.nexthops
                    .remove(&n.id)
                    .ok_or(KernelError::from_errno(libc::ENOENT))?;
                self.routes
                    .retain(|_, r| r.via != KernelRouteVia::Nexthop(n.id));
            }
            KernelOp::AddRoute(r) | KernelOp::ReplaceRoute(r) => {
                if matches!(op, KernelOp::AddRoute(_)) && self.routes.contains_key(&r.dst) {
                    return Err(KernelError::from_errno(libc::EEXIST));
                }
                match r.via {
                    KernelRouteVia::Nexthop(id) if !self.nexthops.contains_key(&id) => {
                        return Err(KernelError::from_errno(libc::EINVAL));
                    }
                    _ => {}
                }
                if let Some(index) = r.ifindex() {
                    self.require_up(index)?;
                }
                self.routes.insert(r.dst, *r);
            }
            KernelOp::DeleteRoute(r) => {
                self.routes
                    .remove(&r.dst)
                    .ok_or(KernelError::from_errno(libc::ESRCH))?;
            }
            KernelOp::ReplaceNeighbor(n) => {
                self.require_link(n.ifindex)?;
                self.neighbors.insert((n.ifindex, n.address), *n);
            }
            KernelOp::DeleteNeighbor(n) => {
                self.neighbors
                    .remove(&(n.ifindex, n.address))
                    .ok_or(KernelError::from_errno(libc::ENOENT))?;
            }
            KernelOp::ReplaceFdb(e) => {
                self.require_link(e.ifindex)?;
                self.fdb.insert((e.ifindex, e.mac), *e);
            }
            KernelOp::DeleteFdb(e) => {
                self.fdb
                    .remove(&(e.ifindex, e.mac))
                    .ok_or(KernelError::from_errno(libc::ENOENT))?;
            }
            KernelOp::Ipset { name, change, .. } => {
                let set = self.ipsets.entry(name.clone()).or_default();
                match change {
                    IpsetChange::Update { add, del } => {
                        set.extend(add.iter().copied());
                        for m in del {
                            set.remove(m);
                        }
                    }
                    IpsetChange::Replace { members } => {
                        *set = members.iter().copied().collect();
                    }
                }
            }
        }
        Ok(())
    }

    fn owned_state(&self, ownership: &Ownership) -> KernelState {
        let devices: Vec<Link> = self
            .links
            .values()
            .filter(|l| ownership.devices.contains(&l.name))
            .cloned()
            .collect();
        let ours = |index: u32| devices.iter().any(|d| d.index == index);
        let neighbors = self
            .neighbors
            .values()
            .filter(|n| ours(n.ifindex))
            .copied()
            .collect();
        let fdb = self
            .fdb
            .values()
            .filter(|e| ours(e.ifindex))
            .copied()
            .collect();
        let ipsets = ownership
            .ipsets
            .iter()
            .filter_map(|(name, _)| {
                let set = self.ipsets.get(name)?;
                Some((name.clone(), set.iter().copied().collect()))
            })
            .collect();
        let routes = self.routes.values().map(|r| TableRoute::Shaped(*r));
        let nexthops = self
            .nexthops
            .values()
            .map(|n| match self.plain_nexthops.contains(&n.id) {
                true => DumpedNexthop::Other(n.id),
                false => DumpedNexthop::Single(*n),
            });
        let indexes: Vec<u32> = devices.iter().map(|d| d.index).collect();
        let sorted = ownership.sort_out(&indexes, routes.collect(), nexthops.collect());
        KernelState {
            devices,
            routes: sorted.routes,
            nexthops: sorted.nexthops,
            neighbors,
            fdb,
            ipsets,
            foreign_routes: sorted.foreign_routes,
            foreign_nexthops: sorted.foreign_nexthops,
        }
    }
}

impl Firewall for MemoryBackend {
    async fn read(&mut self, forward: bool) -> Result<FirewallState, FirewallError> {
        self.lock().firewall.read(forward)
    }

    async fn apply(&mut self, changes: &FirewallChanges) -> Result<(), FirewallError> {
        self.lock().firewall.apply(changes)
    }

    async fn legacy_filter_digest(&mut self) -> u64 {
        self.lock().firewall.legacy_filter_digest()
    }
}

impl KernelBackend for MemoryBackend {
    type Firewall = MemoryBackend;

    fn firewall(&mut self) -> &mut MemoryBackend {
        self
    }

    async fn dump_into(
        &mut self,
        ownership: &Ownership,
        sink: &mut dyn DumpSink,
    ) -> Result<(), KernelError> {
        let state = {
            let mut k = self.lock();
            k.dumps += 1;
            match k.dump_fault {
                Some(errno) => return Err(KernelError::from_errno(errno)),
                None => k.owned_state(ownership),
            }
        };
        state.hand_to(sink);
        Ok(())
    }

    async fn addresses(&mut self) -> Result<Vec<(u32, IpAddr)>, KernelError> {
        let k = self.lock();
        Ok(k.links
            .values()
            .flat_map(|l| l.addresses.iter().map(|a| (l.index, a.ip())))
            .collect())
    }

    async fn links(&mut self, names: &[String]) -> Result<Vec<Link>, KernelError> {
        let k = self.lock();
        Ok(names
            .iter()
            .filter_map(|n| k.link_by_name(n).cloned())
            .collect())
    }

    async fn find_interface(
        &mut self,
        address: IpAddr,
    ) -> Result<Option<ParentInterface>, KernelError> {
        let k = self.lock();
        let holder = k
            .links
            .values()
            .find(|l| l.addresses.iter().any(|a| a.ip() == address));
        Ok(match holder {
            Some(l) => Some(ParentInterface {
                name: ArcStr::from(l.name.as_str()),
                index: l.index,
                mtu: l.mtu,
            }),
            None => k.underlay.clone(),
        })
    }

    async fn apply(&mut self, ops: &[KernelOp]) -> Vec<Result<(), KernelError>> {
        let hold = self.lock().hold.clone();
        if let Some(mut hold) = hold {
            hold.arrived.send_modify(|applies| *applies += 1);
            // A dropped hold releases too.
            let _ = hold.released.wait_for(|released| *released).await;
        }
        let mut k = self.lock();
        ops.iter()
            .map(|op| {
                if k.record {
                    k.log.push(op.clone());
                }
                k.apply_one(op)
            })
            .collect()
    }

    async fn supports_nexthops(&mut self) -> bool {
        true
    }

    fn watch(&mut self) -> Result<Watch, KernelError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().watcher = Some(tx);
        Ok(Watch::new(rx, None))
    }
}

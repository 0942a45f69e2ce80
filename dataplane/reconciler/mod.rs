//! Owns the desired and actual view of every kernel object vxmgr manages,
//! turns manager deltas into kernel operations, retries failures with
//! backoff, and runs full resyncs from kernel dumps.

pub mod census;
mod device;
mod firewall;
mod held;
mod host;
mod ipsets;
mod links;
mod nexthops;
mod notifications;
mod render;
mod resync;
mod slots;
mod table;
#[cfg(test)]
pub(crate) mod tests;

use foldhash::{HashSet, HashSetExt};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use tracing::{debug, info, warn};

use crate::config::DeviceNames;
use crate::desired::{
    Delta, FdbEntry, FdbKey, IpsetMember, Neighbor, Nexthop, NexthopKey, NexthopVia,
    ParentInterface, Route, RouteTarget, VxlanDevice,
};
use crate::kernel::firewall::IptablesBackend;
use crate::kernel::objects::{
    ForeignRoute, IpsetChange, KernelNexthop, KernelOp, KernelRoute, KernelRouteVia, Link,
    Notification, Ownership, TableRoute,
};
use crate::kernel::watch::Watch;
use crate::kernel::{KernelBackend, KernelError};
use crate::model::Family;
use firewall::FirewallSlot;
pub use firewall::FirewallStatus;
use host::HostView;
use nexthops::NexthopIds;
use table::{AnyTable, Effect, Plan, Programmable, RenderContext, Table};

/// Whether tunnel and direct routes use nexthop objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NexthopMode {
    /// Use them when the kernel has them.
    Auto,
    On,
    Off,
}

#[derive(Clone, Debug)]
pub struct ReconcilerOptions {
    pub nexthops: NexthopMode,
    pub disable_tx_checksum: bool,
    /// Route protocol until the first batch says otherwise.
    pub route_protocol: u8,
    /// More than 5 repairs of one object within this window make it
    /// contested: vxmgr stops repairing it for half the window, doubling
    /// with each fight up to 30 windows.
    pub contest_window: Duration,
}

/// The contest window unless told otherwise.
pub const CONTEST_WINDOW: Duration = Duration::from_secs(10);

/// One batch from the manager.
#[derive(Clone, Debug, Default)]
pub struct ApplyRequest {
    pub delta: Delta,
    /// The stream's InSync has been seen: objects nobody declared may go.
    pub in_sync: bool,
    pub route_protocol: u8,
    pub device_names: DeviceNames,
}

/// A kernel operation that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectError {
    /// "adding route 10.0.1.0/26 via 10.0.80.0 dev vxlan.calico onlink"
    pub object: String,
    pub error: String,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub added: u32,
    pub changed: u32,
    pub removed: u32,
    pub errors: Vec<ObjectError>,
    /// Parent interfaces found, lost or moved: feed these to the manager.
    pub parent_changes: Vec<(Family, Option<ParentInterface>)>,
    /// Operations attempted.
    pub operations: u32,
    /// Objects the kernel refused because their interface is missing or
    /// down: they wait for it, they are not errors.
    pub waiting: u32,
    /// Adds the kernel refused because something held the place: what
    /// vxmgr knows of the kernel is out of date.
    pub taken: u32,
}

impl Report {
    /// Adds what another pass did.
    pub fn merge(&mut self, other: Report) {
        self.added += other.added;
        self.changed += other.changed;
        self.removed += other.removed;
        self.errors.extend(other.errors);
        self.parent_changes.extend(other.parent_changes);
        self.operations += other.operations;
        self.waiting += other.waiting;
        self.taken += other.taken;
    }

    fn count(&mut self, effect: Effect) {
        match effect {
            Effect::Added => self.added += 1,
            Effect::Changed => self.changed += 1,
            Effect::Removed => self.removed += 1,
        }
    }

    fn fail(&mut self, object: String, error: &KernelError) {
        warn!(%object, %error, "kernel operation failed");
        self.errors.push(ObjectError {
            object,
            error: error.to_string(),
        });
    }
}

/// One family's device: what is wanted and the link as last read.
#[derive(Default)]
struct DeviceSlot {
    desired: Option<VxlanDevice>,
    link: Option<Link>,
    dirty: bool,
    wanted_parent_ip: Option<IpAddr>,
    parent: Option<ParentInterface>,
    /// The parent was found administratively down: nothing goes through it.
    parent_down: bool,
    /// The last device operation's failure, until one succeeds.
    error: Option<ObjectError>,
}

pub struct Reconciler<B: KernelBackend> {
    backend: B,
    options: ReconcilerOptions,
    use_nexthops: bool,
    /// The devices of these names are ours (Felix's until a batch says otherwise).
    device_names: DeviceNames,
    /// Which objects are ours; its protocol is the stream's route protocol,
    /// its devices those `device_names` names.
    ownership: Ownership,
    /// The host's routes, addresses and gateways: ours keep out of their way.
    host: HostView,
    /// After the stream's InSync: undeclared objects of ours are removed.
    sweep: bool,
    devices: [DeviceSlot; 2],
    nexthop_ids: NexthopIds,
    nexthops: Table<Nexthop>,
    routes: Table<Route>,
    neighbors: Table<Neighbor>,
    fdb: Table<FdbEntry>,
    ipset: Table<IpsetMember>,
    /// Our ipsets that exist in the kernel.
    ipsets_present: HashSet<String>,
    /// Wanted nexthops still without an id (their device may be missing).
    unassigned: HashSet<NexthopKey>,
    /// Nexthops of nodes whose tunnel address moved, replaced by fresh ones:
    /// deleted once the nodes' routes have moved over.
    retired_nexthops: Vec<KernelNexthop>,
    /// The routes of those nodes: all that may still use a retired nexthop.
    moved_routes: Vec<IpNetwork>,
    /// Notifications said a link or address changed.
    links_changed: bool,
    /// A full resync is due from this instant: notifications were lost, or
    /// the last resync failed (then it is retried with backoff).
    resync_due: Option<Instant>,
    /// Resyncs that failed in a row.
    resync_failures: u32,
    /// The pools' firewall rules.
    firewall: FirewallSlot,
}

/// Interface indexes and nexthop ids as the reconciler knows them now.
struct Context<'a> {
    /// Our devices that are up: nothing goes through one that is down.
    device_index: [Option<u32>; 2],
    /// Parent interfaces that are down.
    parents_down: [Option<u32>; 2],
    ids: &'a NexthopIds,
    /// Nexthops in the kernel; not needed to render nexthops themselves.
    programmed: Option<&'a Table<Nexthop>>,
    use_nexthops: bool,
}

impl<'a> Context<'a> {
    fn new(
        devices: &[DeviceSlot; 2],
        ids: &'a NexthopIds,
        programmed: Option<&'a Table<Nexthop>>,
        use_nexthops: bool,
    ) -> Context<'a> {
        Context {
            device_index: [0, 1].map(|i| {
                let link = devices[i].link.as_ref().filter(|l| l.up);
                link.map(|l| l.index)
            }),
            parents_down: [0, 1].map(|i| {
                let parent = devices[i]
                    .parent
                    .as_ref()
                    .filter(|_| devices[i].parent_down);
                parent.map(|p| p.index)
            }),
            ids,
            programmed,
            use_nexthops,
        }
    }
}

impl RenderContext for Context<'_> {
    fn device_index(&self, family: Family) -> Option<u32> {
        self.device_index[family as usize]
    }

    fn interface_up(&self, index: u32) -> bool {
        !self.parents_down.contains(&Some(index))
    }

    fn nexthop_id(&self, key: &NexthopKey) -> Option<u32> {
        self.ids.get(key)
    }

    fn programmed_nexthop(&self, key: &NexthopKey) -> Option<u32> {
        self.programmed?.actual(key).map(|n| n.id)
    }

    fn use_nexthops(&self) -> bool {
        self.use_nexthops
    }
}

impl<B: KernelBackend> Reconciler<B> {
    /// Detects what the kernel supports; reads nothing else yet.
    pub async fn new(mut backend: B, options: ReconcilerOptions) -> Reconciler<B> {
        let use_nexthops = match options.nexthops {
            NexthopMode::On => true,
            NexthopMode::Off => false,
            NexthopMode::Auto => backend.supports_nexthops().await,
        };
        info!(use_nexthops, "kernel backend ready");
        let window = options.contest_window;
        Reconciler {
            backend,
            device_names: DeviceNames::default(),
            ownership: Ownership::of_vxmgr(options.route_protocol),
            host: HostView::default(),
            options,
            use_nexthops,
            sweep: false,
            devices: Default::default(),
            nexthop_ids: NexthopIds::default(),
            nexthops: Table::new(window),
            routes: Table::new(window),
            neighbors: Table::new(window),
            fdb: Table::new(window),
            ipset: Table::new(window),
            ipsets_present: HashSet::new(),
            unassigned: HashSet::new(),
            retired_nexthops: Vec::new(),
            moved_routes: Vec::new(),
            links_changed: false,
            resync_due: None,
            resync_failures: 0,
            firewall: FirewallSlot::default(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Subscribes to the kernel's change notifications (see `notice`).
    pub fn watch(&mut self) -> Result<Watch, KernelError> {
        self.backend.watch()
    }

    /// Forwarding rules through this iptables backend; `None`: none
    /// (the host's firewall is managed elsewhere). Off until set.
    pub fn set_forward_rules(&mut self, forward: Option<IptablesBackend>) {
        self.firewall.forward = forward;
    }

    pub fn firewall_status(&self) -> FirewallStatus {
        self.firewall.status()
    }

    pub fn uses_nexthops(&self) -> bool {
        self.use_nexthops
    }

    /// Every table, for what is done to all of them alike.
    fn tables(&self) -> [&dyn AnyTable; 5] {
        [
            &self.nexthops,
            &self.routes,
            &self.neighbors,
            &self.fdb,
            &self.ipset,
        ]
    }

    fn tables_mut(&mut self) -> [&mut dyn AnyTable; 5] {
        [
            &mut self.nexthops,
            &mut self.routes,
            &mut self.neighbors,
            &mut self.fdb,
            &mut self.ipset,
        ]
    }

    /// A new stream starts: it will declare everything again, and nothing is
    /// removed until its InSync.
    pub fn begin_stream(&mut self) {
        self.sweep = false;
        for slot in &mut self.devices {
            slot.desired = None;
        }
        self.unassigned.clear();
        self.firewall.clear_pools();
        self.tables_mut()
            .into_iter()
            .for_each(|t| t.clear_desired());
    }

    /// Applies one batch from the manager.
    pub async fn apply(&mut self, request: ApplyRequest) -> Report {
        let delta = request.delta;
        for change in delta.devices {
            let slot = &mut self.devices[change.key as usize];
            slot.desired = change.desired;
            slot.dirty = true;
        }
        for change in delta.nexthops {
            if let Some(Nexthop {
                via: NexthopVia::Direct { interface },
                ..
            }) = &change.desired
            {
                self.claim_parent(interface.index);
            }
            let key = change.key.clone();
            let wanted = change.desired.is_some();
            if let Some(nexthop) = &change.desired {
                self.retire_if_moved(&key, nexthop);
            }
            self.nexthops.set_desired(change);
            if wanted && self.nexthop_ids.get(&key).is_none() {
                self.unassigned.insert(key);
            } else if self.nexthops.is_gone(&key) {
                self.nexthop_ids.release(&key);
            }
        }
        for change in delta.routes {
            match &change.desired {
                Some(Route {
                    target: RouteTarget::Direct { interface, .. },
                    ..
                }) => self.claim_parent(interface.index),
                // A node's tunnel address moved: its routes change with it.
                Some(Route {
                    target: RouteTarget::Tunnel { .. },
                    ..
                }) if !self.retired_nexthops.is_empty() => self.moved_routes.push(change.key),
                _ => {}
            }
            self.routes.set_desired(change);
        }
        delta
            .neighbors
            .into_iter()
            .for_each(|c| self.neighbors.set_desired(c));
        delta.fdb.into_iter().for_each(|c| self.fdb.set_desired(c));
        delta
            .ipset
            .into_iter()
            .for_each(|c| self.ipset.set_desired(c));
        self.firewall.set_pools(delta.pools);
        let mut report = Report::default();
        if self.ownership.set_protocol(request.route_protocol) {
            info!(
                protocol = request.route_protocol,
                "route protocol changed: resyncing"
            );
            self.resync_due = Some(Instant::now());
        }
        if request.device_names != self.device_names {
            // Other devices are ours now: read what the kernel has of them
            // before changing anything, so that what is already right stays.
            info!(names = ?request.device_names, "VXLAN device names changed");
            // Routes through the devices of the earlier names stay ours, to
            // be moved onto the new devices (the devices themselves stay).
            for name in Family::ALL.map(|f| request.device_names.of(f).to_string()) {
                if !self.ownership.devices.contains(&name) {
                    self.ownership.devices.push(name);
                }
            }
            self.device_names = request.device_names;
            let names = self.device_names.clone();
            (self.tables_mut().into_iter()).for_each(|t| t.set_device_names(&names));
            self.resync_due = Some(Instant::now());
        }
        self.read_kernel_if_due(&mut report).await;
        if request.in_sync && !self.sweep {
            info!("stream in sync: removing objects it did not declare");
            self.sweep = true;
            self.mark_stale();
        }
        self.pass(&mut report).await;
        report
    }

    /// Finds the interfaces holding each family's local VTEP parent address
    /// (and remembers the addresses, to re-check them periodically). A
    /// parent newly claimed makes a resync due, which the apply that always
    /// follows does: a stream's first batch, which also brings new device
    /// names, then reads the kernel once, not twice.
    pub async fn find_parents(
        &mut self,
        parent_ips: [Option<IpAddr>; 2],
    ) -> (Report, [Option<ParentInterface>; 2]) {
        let mut report = Report::default();
        for family in Family::ALL {
            self.devices[family as usize].wanted_parent_ip = parent_ips[family as usize];
            self.find_parent(family, &mut report).await;
        }
        let parents = [0, 1].map(|i| self.devices[i].parent.clone());
        (report, parents)
    }

    /// Same-subnet routes on `index` are ours from now on: a resync is due
    /// to see those the kernel already holds.
    fn claim_parent(&mut self, index: u32) {
        if !self.ownership.parents.contains(&index) {
            self.ownership.parents.push(index);
            self.resync_due = Some(Instant::now());
        }
    }

    /// What is ours changed (a new parent, another protocol): the kernel is
    /// read again before the batch's pass programs anything over what it
    /// holds. A read that fails is logged and tried again with backoff.
    async fn read_kernel_if_due(&mut self, report: &mut Report) {
        if self.resync_due.is_some_and(|at| at <= Instant::now())
            && let Ok(read) = self.read_kernel().await
        {
            report.merge(read);
        }
    }

    /// Everything in the kernel that nothing wants is to be deleted.
    fn mark_stale(&mut self) {
        for slot in &mut self.devices {
            slot.dirty = true;
        }
        self.firewall.recheck();
        self.tables_mut().into_iter().for_each(|t| t.mark_stale());
    }

    /// Every wanted object is to be checked again.
    fn mark_all_pending(&mut self) {
        self.tables_mut()
            .into_iter()
            .for_each(|t| t.mark_all_pending());
    }

    /// Re-reads our devices and parent interfaces, and repairs drift.
    pub async fn check_devices(&mut self) -> Report {
        let mut report = Report::default();
        // Objects that found their interface missing or down try again
        // (those whose interface is still down keep waiting quietly).
        self.tables_mut()
            .into_iter()
            .for_each(|t| t.release_waiting());
        for family in Family::ALL {
            self.find_parent(family, &mut report).await;
            self.refresh_link(family, &mut report).await;
            self.devices[family as usize].dirty = true;
        }
        self.read_host_addresses(&mut report).await;
        self.pass(&mut report).await;
        report
    }

    /// The interface indexes of our devices that exist.
    fn device_indexes(&self) -> Vec<u32> {
        let links = self.devices.iter().filter_map(|d| d.link.as_ref());
        links.map(|l| l.index).collect()
    }

    /// Re-reads the host's addresses, which our routes must not capture.
    async fn read_host_addresses(&mut self, report: &mut Report) {
        match self.backend.addresses().await {
            Ok(addresses) => {
                let ours = self.device_indexes();
                self.host.set_addresses(addresses, &ours);
            }
            Err(e) => report.fail("reading the host's addresses".to_string(), &e),
        }
    }

    /// Retries failed objects whose backoff has passed, and repairs
    /// contested ones whose back-off has ended.
    pub async fn retry(&mut self, now: Instant) -> Report {
        if self.resync_due.is_some_and(|at| at <= now) {
            // A failed resync is logged by `resync` and tried again later.
            return self.resync().await.unwrap_or_default();
        }
        self.tables_mut().into_iter().for_each(|t| t.retry_due(now));
        if self.firewall.due(now) {
            self.firewall.recheck();
        }
        let mut report = Report::default();
        self.pass(&mut report).await;
        report
    }

    pub fn next_retry(&self) -> Option<Instant> {
        self.tables()
            .into_iter()
            .filter_map(|t| t.next_retry())
            .chain(self.resync_due)
            .chain(self.firewall.next_retry())
            .min()
    }

    /// Objects whose last operation failed, for GetState and health.
    pub fn failing(&self) -> Vec<ObjectError> {
        let devices = self.devices.iter().filter_map(|d| d.error.clone());
        let devices = devices.chain(self.firewall.error());
        let mut failing: Vec<ObjectError> = self
            .tables()
            .into_iter()
            .flat_map(|t| t.failures())
            .map(|f| ObjectError {
                object: f.what.clone(),
                error: f.error.to_string(),
            })
            .chain(devices)
            .collect();
        failing.sort_by(|a, b| a.object.cmp(&b.object));
        failing
    }

    /// One reconciliation pass over everything pending, in dependency
    /// order: devices, then what routes lean on (nexthops, neighbours, FDB),
    /// routes, the ipsets; deletes last, in reverse.
    async fn pass(&mut self, report: &mut Report) {
        let (waiting, taken) = (report.waiting, report.taken);
        for family in Family::ALL {
            if self.devices[family as usize].dirty {
                self.reconcile_device(family, report).await;
            }
        }
        // Nexthops, neighbours and FDB entries do not depend on one another:
        // one pipelined call for all of them. The ipset changes go in the
        // same call: they take no RTNL, so the kernel makes them while the
        // others wait for it (10,000 members took 25-43 ms after the routes).
        if self.use_nexthops {
            self.assign_nexthop_ids();
        }
        let ctx = Context::new(&self.devices, &self.nexthop_ids, None, self.use_nexthops);
        let nexthops = if self.use_nexthops {
            self.nexthops.plan_upserts(&ctx)
        } else {
            Plan::default()
        };
        let neighbors = self.neighbors.plan_upserts(&ctx);
        let fdb = self.fdb.plan_upserts(&ctx);
        let (ipset_ops, ipsets) = self.plan_ipsets();
        let ops: Vec<KernelOp> = nexthops
            .ops()
            .chain(neighbors.ops())
            .chain(fdb.ops())
            .chain(ipset_ops)
            .collect();
        if !ops.is_empty() {
            let mut results = self.backend.apply(&ops).await.into_iter();
            report.operations += ops.len() as u32;
            record(&mut self.nexthops, nexthops, &mut results, report);
            record(&mut self.neighbors, neighbors, &mut results, report);
            record(&mut self.fdb, fdb, &mut results, report);
            self.record_ipsets(ipsets, &mut results, report);
        }
        // Routes go through the nexthops now in the kernel.
        let ctx = Context::new(
            &self.devices,
            &self.nexthop_ids,
            Some(&self.nexthops),
            self.use_nexthops,
        );
        let routes = self.routes.plan_upserts(&ctx);
        let routes = host::keep_clear_of_host(routes, &self.host, &mut self.routes, report);
        execute(&mut self.backend, &mut self.routes, routes, report).await;
        let retired = std::mem::take(&mut self.retired_nexthops);
        let moved = std::mem::take(&mut self.moved_routes);
        self.delete_unused_nexthops(retired, Some(&moved), report)
            .await;

        // Before InSync these let go of would-be deletes without doing them.
        let routes = self.routes.plan_deletes(self.sweep);
        execute(&mut self.backend, &mut self.routes, routes, report).await;
        let nexthops = self.nexthops.plan_deletes(self.sweep);
        let gone = execute(&mut self.backend, &mut self.nexthops, nexthops, report).await;
        for key in gone {
            self.nexthop_ids.release(&key);
        }
        if self.sweep {
            let stale = self.nexthop_ids.take_unclaimed();
            self.delete_unused_nexthops(stale, None, report).await;
        }
        let neighbors = self.neighbors.plan_deletes(self.sweep);
        let fdb = self.fdb.plan_deletes(self.sweep);
        execute(&mut self.backend, &mut self.neighbors, neighbors, report).await;
        execute(&mut self.backend, &mut self.fdb, fdb, report).await;
        self.reconcile_firewall(report).await;
        if report.taken > taken {
            // Something of which vxmgr knew nothing holds a route's or a
            // nexthop id's place: read the kernel again to see what it is.
            info!("the kernel refused to add an object over another: resyncing");
            self.resync_due = Some(Instant::now());
        }
        if report.waiting > waiting {
            // An interface went missing or down since it was last read:
            // read them again, so that what goes through it waits.
            for family in Family::ALL {
                self.find_parent(family, report).await;
                self.refresh_link(family, report).await;
            }
        }
    }

    /// Gives the wanted nexthops that have none an id, adopting matching
    /// kernel nexthops. Only nexthops new since the last pass are looked at.
    fn assign_nexthop_ids(&mut self) {
        let devices = &self.devices;
        let nexthops = &mut self.nexthops;
        let ids = &mut self.nexthop_ids;
        self.unassigned.retain(|key| {
            let Some(nexthop) = nexthops.desired(key) else {
                return false;
            };
            if ids.get(key).is_some() {
                return false;
            }
            let interface = match &nexthop.via {
                NexthopVia::Tunnel { family, .. } => {
                    devices[*family as usize].link.as_ref().map(|l| l.index)
                }
                NexthopVia::Direct { interface } => Some(interface.index),
            };
            let Some(index) = interface else {
                return true;
            };
            if let (_, Some(adopted)) = ids.assign(&nexthop, index) {
                nexthops.set_actual(key.clone(), Some(adopted));
            }
            false
        });
    }

    /// A node whose tunnel address moved gets a fresh nexthop. Changing the
    /// gateway in place would make the kernel walk every route in every
    /// table (`fib_info_notify_update`), a cost that grows with the cluster;
    /// a new nexthop costs only the node's own routes moving over to it.
    fn retire_if_moved(&mut self, key: &NexthopKey, wanted: &Nexthop) {
        let moved = self
            .nexthops
            .actual(key)
            .is_some_and(|programmed| programmed.gateway != wanted.gateway);
        if !self.use_nexthops || !moved {
            return;
        }
        if let Some(old) = self.nexthops.set_actual(key.clone(), None) {
            self.retired_nexthops.push(old);
        }
        self.nexthop_ids.retire(key);
    }

    /// Our nexthops in the kernel that nothing uses: those no node claimed,
    /// and those replaced when a node's tunnel address moved. The kernel
    /// takes a route that still uses one with it, without telling: these
    /// are looked for among `routes` (`None`: every route).
    async fn delete_unused_nexthops(
        &mut self,
        unused: Vec<KernelNexthop>,
        routes: Option<&[IpNetwork]>,
        report: &mut Report,
    ) {
        if unused.is_empty() {
            return;
        }
        let ops: Vec<KernelOp> = unused.iter().map(|n| KernelOp::DeleteNexthop(*n)).collect();
        let results = self.backend.apply(&ops).await;
        report.operations += ops.len() as u32;
        for (nexthop, result) in unused.iter().zip(results) {
            match ignore_missing(result) {
                Ok(()) => {
                    self.nexthop_ids.forget(nexthop.id);
                    report.count(Effect::Removed);
                }
                Err(e) => report.fail(format!("deleting unused nexthop {}", nexthop.id), &e),
            }
        }
        let ids: HashSet<u32> = unused.iter().map(|n| n.id).collect();
        let uses_one =
            |r: &KernelRoute| matches!(r.via, KernelRouteVia::Nexthop(id) if ids.contains(&id));
        match routes {
            Some(routes) => self.routes.forget_actual_among(routes, uses_one),
            None => self.routes.forget_actual(uses_one),
        }
    }
}

impl<B: KernelBackend> Reconciler<B> {
    /// One kernel operation on its own, counted in the report (a backend
    /// answers every operation it is given).
    async fn apply_one(&mut self, op: &KernelOp, report: &mut Report) -> Result<(), KernelError> {
        report.operations += 1;
        self.backend.apply(std::slice::from_ref(op)).await.remove(0)
    }
}

/// Applies one table's plan in one pipelined call and records the
/// outcomes. Returns the keys whose objects were removed.
async fn execute<B: KernelBackend, D: Programmable>(
    backend: &mut B,
    table: &mut Table<D>,
    plan: Plan<D>,
    report: &mut Report,
) -> Vec<D::Key> {
    if plan.is_empty() {
        return Vec::new();
    }
    let ops: Vec<KernelOp> = plan.ops().collect();
    let mut results = backend.apply(&ops).await.into_iter();
    report.operations += ops.len() as u32;
    // Freed before the table grows with the outcomes.
    drop(ops);
    record(table, plan, &mut results, report)
}

/// Records the outcomes of a plan's operations, taken in order from
/// `results`. Returns the keys whose objects were removed.
fn record<D: Programmable>(
    table: &mut Table<D>,
    plan: Plan<D>,
    results: &mut impl Iterator<Item = Result<(), KernelError>>,
    report: &mut Report,
) -> Vec<D::Key> {
    let mut removed = Vec::new();
    let now = Instant::now();
    for (p, result) in plan.entries.into_iter().zip(results) {
        let result = if p.effect == Effect::Removed {
            ignore_missing(result)
        } else {
            result
        };
        match &result {
            Ok(()) => {
                debug!(change = %table.describe(&p), "kernel");
                report.count(p.effect);
                if p.effect == Effect::Removed {
                    removed.push(p.key.clone());
                }
            }
            Err(e) if e.is_missing_device() && p.after().is_some() => report.waiting += 1,
            Err(e) => {
                if p.effect == Effect::Added && e.errno == Some(libc::EEXIST) {
                    report.taken += 1;
                }
                report.fail(table.describe(&p), e)
            }
        }
        table.record(p, result, now);
    }
    removed
}

/// A route that is not ours, whatever its shape.
fn foreign(route: TableRoute) -> ForeignRoute {
    match route {
        TableRoute::Shaped(r) => ForeignRoute::of_shape(&r),
        TableRoute::Other(r) => *r,
    }
}

/// Deleting what is already gone succeeded.
fn ignore_missing(result: Result<(), KernelError>) -> Result<(), KernelError> {
    match result {
        Err(e) if matches!(e.errno, Some(libc::ENOENT | libc::ESRCH | libc::ENODEV)) => Ok(()),
        other => other,
    }
}

//! Full resyncs: every part of a kernel dump taken in as it is read, so
//! that the routes (the most of it) are compared while the kernel is still
//! writing the slower FDB dump, and each part is let go once taken in.

use std::time::Instant;

use foldhash::HashSet;
use ipnetwork::IpNetwork;
use tracing::{debug, warn};

use super::host::HostView;
use super::nexthops::NexthopIds;
use super::table::{self, Table};
use super::{Context, DeviceSlot, Reconciler, Report};
use crate::config::DeviceNames;
use crate::desired::{FdbEntry, FdbKey, IpsetMember, Neighbor, Nexthop, NexthopKey, Route};
use crate::kernel::objects::{DumpSink, KernelFdb, KernelNeighbor, Link, RouteDump};
use crate::kernel::{KernelBackend, KernelError};
use crate::model::Family;

impl<B: KernelBackend> Reconciler<B> {
    /// Reads everything of ours from the kernel and makes it match: the
    /// start-up adoption, the periodic refresh and the repair after an overrun.
    /// A resync that cannot read the kernel is logged and tried again with
    /// backoff (see `next_retry`); the parts read before the failure are
    /// taken in, each whole.
    pub async fn resync(&mut self) -> Result<Report, KernelError> {
        let started = Instant::now();
        let mut report = self.read_kernel().await?;
        self.pass(&mut report).await;
        debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "resync");
        Ok(report)
    }

    /// Takes in what the kernel holds of ours, without changing it: a batch
    /// that calls for a resync reads here and makes the kernel match in its
    /// own pass.
    pub(super) async fn read_kernel(&mut self) -> Result<Report, KernelError> {
        let started = Instant::now();
        let mut taking = TakingIn {
            devices: &mut self.devices,
            device_names: &self.device_names,
            host: &mut self.host,
            nexthop_ids: &mut self.nexthop_ids,
            nexthops: &mut self.nexthops,
            routes: &mut self.routes,
            neighbors: &mut self.neighbors,
            fdb: &mut self.fdb,
            ipset: &mut self.ipset,
            ipsets_present: &mut self.ipsets_present,
            unassigned: &mut self.unassigned,
            use_nexthops: self.use_nexthops,
            routes_read: 0,
        };
        let dumped = self.backend.dump_into(&self.ownership, &mut taking).await;
        let routes = taking.routes_read;
        if let Err(error) = dumped {
            self.resync_failures += 1;
            let wait = table::retry_backoff(self.resync_failures);
            self.resync_due = Some(Instant::now() + wait);
            warn!(%error, retry_in_ms = wait.as_millis() as u64, "resync failed: reading the kernel");
            return Err(error);
        }
        self.resync_failures = 0;
        self.resync_due = None;
        let mut report = Report::default();
        self.read_host_addresses(&mut report).await;
        for family in Family::ALL {
            self.find_parent(family, &mut report).await;
        }
        self.firewall.recheck();
        debug!(
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            routes, "kernel read"
        );
        Ok(report)
    }
}

/// The reconciler's tables taking in a dump's parts.
struct TakingIn<'a> {
    devices: &'a mut [DeviceSlot; 2],
    device_names: &'a DeviceNames,
    host: &'a mut HostView,
    nexthop_ids: &'a mut NexthopIds,
    nexthops: &'a mut Table<Nexthop>,
    routes: &'a mut Table<Route>,
    neighbors: &'a mut Table<Neighbor>,
    fdb: &'a mut Table<FdbEntry>,
    ipset: &'a mut Table<IpsetMember>,
    ipsets_present: &'a mut HashSet<String>,
    unassigned: &'a mut HashSet<NexthopKey>,
    use_nexthops: bool,
    routes_read: usize,
}

impl DumpSink for TakingIn<'_> {
    fn devices(&mut self, devices: Vec<Link>) {
        for family in Family::ALL {
            let slot = &mut self.devices[family as usize];
            slot.link = (devices.iter())
                .find(|l| *l.name == **self.device_names.of(family))
                .cloned();
            slot.dirty = true;
        }
    }

    fn routes(&mut self, dump: RouteDump) {
        let RouteDump {
            routes,
            nexthops,
            foreign_routes,
            foreign_nexthops,
        } = dump;
        self.routes_read = routes.len();
        let table = &mut *self.routes;
        // The routes are found on a thread of their own while the nexthops,
        // through which they render, are taken in here: a large dump's
        // take-in is otherwise one CPU's work with the others idle.
        let found = std::thread::scope(|scope| {
            let finding =
                scope.spawn(move || table.find_actual(routes.into_iter().map(|r| (r.dst, r))));
            let ours: Vec<u32> = (self.devices.iter())
                .filter_map(|d| d.link.as_ref().map(|l| l.index))
                .collect();
            self.host.reset_routes(foreign_routes, &ours);
            let keyed = self.nexthop_ids.reset(nexthops, foreign_nexthops);
            let ctx = Context::new(self.devices, self.nexthop_ids, None, self.use_nexthops);
            // A nexthop without an id does not render: it is among the wrong.
            let wrong = self.nexthops.reset_actual(keyed, &ctx);
            let ids = &*self.nexthop_ids;
            (self.unassigned).extend(wrong.into_iter().filter(|k| ids.get(k).is_none()));
            (finding.join()).unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        let ctx = Context::new(
            self.devices,
            self.nexthop_ids,
            Some(self.nexthops),
            self.use_nexthops,
        );
        self.routes.settle_actual(found, &ctx);
    }

    fn neighbors(&mut self, neighbors: Vec<KernelNeighbor>) {
        let ctx = Context::new(self.devices, self.nexthop_ids, None, self.use_nexthops);
        let neighbors = neighbors.into_iter().map(|n| (n.address, n));
        self.neighbors.reset_actual(neighbors, &ctx);
    }

    fn fdb(&mut self, fdb: Vec<KernelFdb>) {
        let ctx = Context::new(self.devices, self.nexthop_ids, None, self.use_nexthops);
        let devices = &*self.devices;
        let family_of = |index: u32| {
            Family::ALL
                .into_iter()
                .find(|f| (devices[*f as usize].link.as_ref()).is_some_and(|l| l.index == index))
        };
        let entries =
            (fdb.into_iter()).filter_map(|e| Some((FdbKey(family_of(e.ifindex)?, e.mac), e)));
        self.fdb.reset_actual(entries, &ctx);
    }

    fn ipsets(&mut self, ipsets: Vec<(String, Vec<IpNetwork>)>) {
        *self.ipsets_present = ipsets.iter().map(|(name, _)| name.clone()).collect();
        let ctx = Context::new(self.devices, self.nexthop_ids, None, self.use_nexthops);
        let members =
            (ipsets.into_iter()).flat_map(|(_, members)| members.into_iter().map(|m| (m, m)));
        self.ipset.reset_actual(members, &ctx);
    }
}

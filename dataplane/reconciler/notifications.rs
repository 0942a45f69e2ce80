//! What the kernel reports, by whoever made the change: repairs of
//! vxmgr's objects, and the host's routes kept in view.

use super::*;

impl<B: KernelBackend> Reconciler<B> {
    /// Takes in what the kernel reported; returns whether a repair pass is
    /// due. Only vxmgr's objects count (the ownership rules of DESIGN.md §4).
    pub fn notice(&mut self, notification: Notification, now: Instant) -> bool {
        let device_family = |devices: &[DeviceSlot; 2], ifindex: u32| {
            Family::ALL.into_iter().find(|f| {
                devices[*f as usize]
                    .link
                    .as_ref()
                    .is_some_and(|l| l.index == ifindex)
            })
        };
        match notification {
            Notification::Route(TableRoute::Shaped(route)) if self.owns_route(&route) => {
                self.routes.observe(route.dst, Some(route), now)
            }
            Notification::RouteGone(TableRoute::Shaped(route)) if self.owns_route(&route) => {
                // Only the route we know going counts, not another one for the
                // same destination.
                self.routes.actual(&route.dst) == Some(route)
                    && self.routes.observe(route.dst, None, now)
            }
            Notification::Route(route) => self.host_route_appeared(foreign(route), now),
            Notification::RouteGone(route) => self.host_route_gone(foreign(route)),
            Notification::Neighbor(n) => {
                device_family(&self.devices, n.ifindex).is_some()
                    && self.neighbors.observe(n.address, Some(n), now)
            }
            Notification::NeighborGone { ifindex, address } => {
                self.neighbors
                    .actual(&address)
                    .is_some_and(|n| n.ifindex == ifindex)
                    && self.neighbors.observe(address, None, now)
            }
            Notification::Fdb(entry) => match device_family(&self.devices, entry.ifindex) {
                Some(family) => self
                    .fdb
                    .observe(FdbKey(family, entry.mac), Some(entry), now),
                None => false,
            },
            Notification::FdbGone { ifindex, mac } => match device_family(&self.devices, ifindex) {
                Some(family) => self.fdb.observe(FdbKey(family, mac), None, now),
                None => false,
            },
            Notification::LinkDown { index } => {
                self.link_went_down(index);
                self.links_changed = true;
                true
            }
            Notification::Links => {
                self.links_changed = true;
                true
            }
            Notification::Firewall => {
                self.firewall.recheck();
                true
            }
            Notification::Overrun => {
                warn!("kernel notifications were lost: resyncing");
                self.resync_due = Some(now);
                true
            }
        }
    }

    /// One of our devices or a parent went down: the kernel dropped what
    /// went through it (see `forget_link_down`). Noted at once, so that a
    /// quick down and up is not missed by the re-read that follows.
    pub(super) fn link_went_down(&mut self, index: u32) {
        let parent_of = Family::ALL.into_iter().find(|f| {
            let slot = &self.devices[*f as usize];
            slot.parent.as_ref().is_some_and(|p| p.index == index)
        });
        if let Some(family) = parent_of {
            self.set_parent_down(family, true);
        }
        let ours = self
            .devices
            .iter()
            .any(|d| d.link.as_ref().is_some_and(|l| l.index == index));
        if ours {
            self.forget_link_down(index);
        }
    }

    /// Whether a route is ours (`Ownership::owns_route`).
    pub(super) fn owns_route(&self, route: &KernelRoute) -> bool {
        self.ownership
            .owns_route(route, &self.device_indexes(), |id| {
                self.nexthop_ids.is_ours(id)
            })
    }

    /// A route that is not ours appeared. If it took the place of one of
    /// ours, ours is gone: vxmgr does not put it back over the other.
    pub(super) fn host_route_appeared(&mut self, route: ForeignRoute, now: Instant) -> bool {
        let displaced = route.takes_the_place_of_ours() && self.routes.actual(&route.dst).is_some();
        if displaced {
            warn!(route = %route, "a route that is not vxmgr's took the place of one of vxmgr's");
        }
        let dst = route.dst;
        self.host.route_appeared(route, &self.device_indexes());
        displaced && self.routes.observe(dst, None, now)
    }

    /// A route that is not ours went: one of ours it held up goes in now.
    pub(super) fn host_route_gone(&mut self, route: ForeignRoute) -> bool {
        self.host.route_gone(&route);
        self.routes.recheck(&route.dst);
        self.routes.is_desired(&route.dst)
    }

    /// Repairs what notifications reported: a pass, after re-reading the
    /// devices and parents when links changed, or a full resync after an
    /// overrun.
    pub async fn repair(&mut self, now: Instant) -> Result<Report, KernelError> {
        self.tables_mut()
            .into_iter()
            .for_each(|t| t.expire_contests(now));
        if self.resync_due.is_some_and(|at| at <= now) {
            self.links_changed = false;
            return self.resync().await;
        }
        if std::mem::take(&mut self.links_changed) {
            return Ok(self.check_devices().await);
        }
        let mut report = Report::default();
        self.pass(&mut report).await;
        Ok(report)
    }

    /// Objects vxmgr stops repairing for a while because another agent
    /// keeps changing them.
    pub fn contested(&self, now: Instant) -> Vec<ObjectError> {
        let describe = |c: table::Contested| ObjectError {
            error: format!(
                "another agent changed it {} times within seconds; not repaired for the next {} s",
                c.repairs,
                c.until.duration_since(now).as_secs() + 1
            ),
            object: c.what,
        };
        let mut contested: Vec<ObjectError> = self
            .tables()
            .into_iter()
            .flat_map(|t| t.contested(now))
            .map(describe)
            .collect();
        contested.sort_by(|a, b| a.object.cmp(&b.object));
        contested
    }
}

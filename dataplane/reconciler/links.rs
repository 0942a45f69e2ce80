//! The devices and parent interfaces as the kernel has them: found,
//! lost, set down, and what the kernel drops with them.

use super::*;

impl<B: KernelBackend> Reconciler<B> {
    pub(super) async fn find_parent(&mut self, family: Family, report: &mut Report) {
        let slot = &self.devices[family as usize];
        let found = match slot.wanted_parent_ip {
            None => None,
            Some(ip) => match self.backend.find_interface(ip).await {
                Ok(found) => found,
                Err(e) => {
                    report.fail(format!("finding the interface holding {ip}"), &e);
                    return;
                }
            },
        };
        let down = match &found {
            Some(parent) => !self.link_up(&parent.name, report).await,
            None => false,
        };
        if let Some(parent) = &found {
            self.claim_parent(parent.index);
        }
        let slot = &mut self.devices[family as usize];
        if slot.parent != found {
            info!(%family, parent = ?found.as_ref().map(|p| &p.name), "parent interface changed");
            slot.parent = found.clone();
            report.parent_changes.push((family, found));
        }
        self.set_parent_down(family, down);
    }

    /// Whether the interface `name` is administratively up (as far as it can
    /// be read: a failed read takes it as up and is reported).
    pub(super) async fn link_up(&mut self, name: &str, report: &mut Report) -> bool {
        match self.backend.links(&[name.to_string()]).await {
            Ok(links) => links.first().is_none_or(|l| l.up),
            Err(e) => {
                report.fail(format!("reading interface {name}"), &e);
                true
            }
        }
    }

    /// While the parent is down, the kernel has dropped the routes through
    /// it (IPv4 ones without a word) and refuses new ones: they wait, and
    /// go back in when it is up.
    pub(super) fn set_parent_down(&mut self, family: Family, down: bool) {
        let slot = &mut self.devices[family as usize];
        if slot.parent_down != down {
            let parent = slot.parent.as_ref().map(|p| &p.name);
            info!(%family, ?parent, down, "parent interface admin state changed");
        }
        slot.parent_down = down;
        if let Some(index) = slot.parent.as_ref().filter(|_| down).map(|p| p.index) {
            self.forget_link_down(index);
        }
    }

    pub(super) async fn refresh_link(&mut self, family: Family, report: &mut Report) {
        let name = self.device_names.of(family).to_string();
        let link = match self.backend.links(std::slice::from_ref(&name)).await {
            Ok(links) => links.into_iter().next(),
            Err(e) => return report.fail(format!("reading device {name}"), &e),
        };
        let before = self.devices[family as usize].link.as_ref().map(|l| l.index);
        if let Some(gone) = before.filter(|b| Some(*b) != link.as_ref().map(|l| l.index)) {
            // Deleted behind our back: what was on it went with it.
            self.forget_device_objects(gone);
            self.mark_all_pending();
        }
        if let Some(down) = link.as_ref().filter(|l| !l.up) {
            // Set down behind our back: what the kernel dropped goes back
            // once the device is up again.
            self.forget_link_down(down.index);
        }
        self.devices[family as usize].link = link;
    }

    /// The kernel drops a device's routes, nexthops, neighbours and FDB
    /// entries with it.
    pub(super) fn forget_device_objects(&mut self, index: u32) {
        self.forget_link_down(index);
        self.fdb.forget_actual(|e| e.ifindex == index);
    }

    /// The kernel drops the routes, nexthops and neighbours of a link that
    /// goes down (IPv4 routes and nexthops without a notification); FDB
    /// entries stay. The ones wanted are programmed again once it is up.
    pub(super) fn forget_link_down(&mut self, index: u32) {
        let gone: HashSet<u32> = self
            .nexthops
            .all_actual()
            .filter(|n| n.ifindex == index)
            .map(|n| n.id)
            .collect();
        self.nexthops.forget_actual(|n| n.ifindex == index);
        self.routes.forget_actual(|r| {
            r.ifindex() == Some(index)
                || matches!(r.via, KernelRouteVia::Nexthop(id) if gone.contains(&id))
        });
        self.neighbors.forget_actual(|n| n.ifindex == index);
    }
}

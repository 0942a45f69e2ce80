//! Nexthop ids: one per remote node and family, and one per direct
//! gateway. Ids found in the kernel are adopted by the nexthop whose gateway
//! and interface they already have, so a restart re-uses them instead of
//! rewriting every route.

use std::net::IpAddr;

use foldhash::{HashMap, HashSet};

use crate::dense_map::DenseMap;

use crate::desired::{Desired, Nexthop, NexthopKey};
use crate::kernel::objects::KernelNexthop;

/// Ids start high so they are unlikely to meet another agent's.
const FIRST_ID: u32 = 0x7678_0000;

#[derive(Default)]
pub struct NexthopIds {
    by_key: DenseMap<NexthopKey, u32>,
    /// Ids of our nexthops: assigned ones and unclaimed kernel ones.
    in_use: HashSet<u32>,
    /// Ids of other nexthops in the kernel: never taken.
    foreign: HashSet<u32>,
    /// Our nexthops in the kernel that no node has claimed yet, by where
    /// they lead (gateway and interface): a restart adopts each in one
    /// lookup.
    unclaimed: HashMap<(IpAddr, u32), Vec<KernelNexthop>>,
    next: u32,
}

impl NexthopIds {
    pub fn get(&self, key: &NexthopKey) -> Option<u32> {
        self.by_key.get(key).copied()
    }

    /// After a dump: nexthops already assigned keep their keys; the others
    /// wait to be claimed. A node whose id turns out to be another's
    /// (`foreign`) loses it, to get a fresh one. Returns the assigned
    /// nexthops, keyed.
    pub fn reset(
        &mut self,
        dumped: Vec<KernelNexthop>,
        foreign: Vec<u32>,
    ) -> Vec<(NexthopKey, KernelNexthop)> {
        self.foreign = foreign.into_iter().collect();
        let taken = &self.foreign;
        let in_use = &mut self.in_use;
        self.by_key.retain(|_, id| {
            let keep = !taken.contains(id);
            if !keep {
                in_use.remove(id);
            }
            keep
        });
        // Positions, not cloned keys: this map is built at every resync.
        let by_id: HashMap<u32, usize> = (self.by_key.values().enumerate())
            .map(|(at, id)| (*id, at))
            .collect();
        self.unclaimed.clear();
        let mut keyed = Vec::new();
        for nh in dumped {
            match by_id.get(&nh.id) {
                Some(&at) => keyed.push((self.by_key.at(at).0.clone(), nh)),
                None => {
                    self.in_use.insert(nh.id);
                    self.unclaimed
                        .entry((nh.gateway, nh.ifindex))
                        .or_default()
                        .push(nh);
                }
            }
        }
        keyed
    }

    /// Whether `id` is one of our nexthops'.
    pub fn is_ours(&self, id: u32) -> bool {
        self.in_use.contains(&id)
    }

    /// An id for `nexthop`: one it already has, an unclaimed kernel nexthop
    /// with the same gateway on the same device (returned, to be taken as
    /// actual state), or a fresh one.
    pub fn assign(&mut self, nexthop: &Nexthop, interface: u32) -> (u32, Option<KernelNexthop>) {
        let key = nexthop.key();
        if let Some(id) = self.by_key.get(&key) {
            return (*id, None);
        }
        let leading_here = (nexthop.gateway, interface);
        let adopted = self.unclaimed.get_mut(&leading_here).and_then(Vec::pop);
        if self.unclaimed.get(&leading_here).is_some_and(Vec::is_empty) {
            self.unclaimed.remove(&leading_here);
        }
        let id = match adopted {
            Some(n) => n.id,
            None => self.fresh_id(),
        };
        self.by_key.insert(key, id);
        (id, adopted)
    }

    fn fresh_id(&mut self) -> u32 {
        loop {
            let id = FIRST_ID.wrapping_add(self.next);
            self.next = self.next.wrapping_add(1);
            if id != 0 && !self.foreign.contains(&id) && self.in_use.insert(id) {
                return id;
            }
        }
    }

    /// Releases the id of a node whose nexthop is gone.
    pub fn release(&mut self, key: &NexthopKey) {
        if let Some(id) = self.by_key.remove(key) {
            self.in_use.remove(&id);
        }
    }

    /// Takes a node's id away, so that it gets a fresh one. The old id stays
    /// ours until it is forgotten: its nexthop is still in the kernel.
    pub fn retire(&mut self, key: &NexthopKey) {
        self.by_key.remove(key);
    }

    /// An id whose nexthop was deleted from the kernel.
    pub fn forget(&mut self, id: u32) {
        self.in_use.remove(&id);
    }

    /// Kernel nexthops of ours that nobody claimed: stale, swept after
    /// InSync. Their ids stay ours until they are forgotten.
    pub fn take_unclaimed(&mut self) -> Vec<KernelNexthop> {
        self.unclaimed.drain().flat_map(|(_, n)| n).collect()
    }
}

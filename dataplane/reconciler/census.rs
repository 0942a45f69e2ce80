//! How many objects of each kind the reconciler has in the kernel, per
//! family: what it programmed or last read.

use super::Reconciler;
use crate::kernel::KernelBackend;
use crate::model::Family;

/// How many objects of a kind and family the kernel holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectCount {
    pub kind: &'static str,
    pub family: Family,
    pub count: usize,
}

/// Objects per family, counted by the family `family_of` gives each.
fn by_family<K>(objects: impl Iterator<Item = K>, family_of: impl Fn(&K) -> Family) -> [usize; 2] {
    let mut counts = [0; 2];
    for object in objects {
        counts[family_of(&object) as usize] += 1;
    }
    counts
}

impl<B: KernelBackend> Reconciler<B> {
    /// Walks every table: call it when asked, not per batch.
    pub fn census(&self) -> Vec<ObjectCount> {
        let kinds = [
            (
                "device",
                [0, 1].map(|i| usize::from(self.devices[i].link.is_some())),
            ),
            (
                "route",
                by_family(self.routes.all_actual(), |r| Family::of_net(&r.dst)),
            ),
            (
                "nexthop",
                by_family(self.nexthops.all_actual(), |n| Family::of_addr(&n.gateway)),
            ),
            (
                "neighbor",
                by_family(self.neighbors.all_actual(), |n| Family::of_addr(&n.address)),
            ),
            (
                "fdb",
                by_family(self.fdb.all_actual(), |f| Family::of_addr(&f.destination)),
            ),
            (
                "ipset_member",
                by_family(self.ipset.all_actual(), Family::of_net),
            ),
        ];
        kinds
            .into_iter()
            .flat_map(|(kind, counts)| {
                Family::ALL.into_iter().map(move |family| ObjectCount {
                    kind,
                    family,
                    count: counts[family as usize],
                })
            })
            .collect()
    }
}

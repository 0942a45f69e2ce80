//! vxmgr's ipsets: member adds and deletes, or a full replace, planned
//! and recorded around the call that carries them out.

use super::table::Planned;
use super::*;

/// One family's ipset change, as recorded once made: the set, the change
/// as logged, and the member changes it carries out.
pub(super) struct IpsetSync {
    name: &'static str,
    what: String,
    members: Vec<Planned<IpsetMember>>,
}

impl<B: KernelBackend> Reconciler<B> {
    /// The change that brings each family's ipset in line: member adds and
    /// deletes, or a full replace when the set is missing. They need no
    /// RTNL, so the caller sends them beside the RTNL-bound steps.
    pub(super) fn plan_ipsets(&mut self) -> (Vec<KernelOp>, Vec<IpsetSync>) {
        let ctx = Context::new(&self.devices, &self.nexthop_ids, None, false);
        let mut planned = self.ipset.plan_upserts(&ctx).entries;
        planned.extend(self.ipset.plan_deletes(self.sweep).entries);
        let (mut ops, mut syncs) = (Vec::new(), Vec::new());
        for family in Family::ALL {
            let name = family.ipset_name();
            let (mine, rest): (Vec<_>, Vec<_>) = planned
                .into_iter()
                .partition(|p| Family::of_net(&p.key) == family);
            planned = rest;
            let present = self.ipsets_present.contains(name);
            if mine.is_empty() && present {
                continue;
            }
            let change = if present {
                let (add, del): (Vec<_>, Vec<_>) = mine.iter().partition(|p| p.after().is_some());
                IpsetChange::Update {
                    add: add.iter().map(|p| p.key).collect(),
                    del: del.iter().map(|p| p.key).collect(),
                }
            } else {
                let mut members: Vec<_> = self
                    .ipset
                    .all_desired()
                    .map(|(key, _)| key)
                    .filter(|m| Family::of_net(m) == family)
                    .collect();
                members.sort();
                IpsetChange::Replace { members }
            };
            let op = KernelOp::Ipset {
                name: name.to_string(),
                family,
                change,
            };
            syncs.push(IpsetSync {
                name,
                what: op.to_string(),
                members: mine,
            });
            ops.push(op);
        }
        (ops, syncs)
    }

    /// Records the outcomes of `syncs`, taken in order from `results`.
    pub(super) fn record_ipsets(
        &mut self,
        syncs: Vec<IpsetSync>,
        results: &mut impl Iterator<Item = Result<(), KernelError>>,
        report: &mut Report,
    ) {
        for (sync, result) in syncs.into_iter().zip(results) {
            let now = Instant::now();
            match &result {
                Ok(()) => {
                    debug!(change = %sync.what, "kernel");
                    self.ipsets_present.insert(sync.name.to_string());
                }
                Err(e) => {
                    report.fail(sync.what, e);
                    // The set may be of another type or family now: the
                    // retry replaces it whole.
                    self.ipsets_present.remove(sync.name);
                }
            }
            for p in sync.members {
                if result.is_ok() {
                    report.count(p.effect);
                }
                self.ipset.record(p, result.clone(), now);
            }
        }
    }
}

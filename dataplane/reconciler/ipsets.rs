//! vxmgr's ipsets: member adds and deletes, or a full replace.

use super::*;

impl<B: KernelBackend> Reconciler<B> {
    /// Brings each family's ipset in line with one change: member adds and
    /// deletes, or a full replace when the set is missing.
    pub(super) async fn sync_ipsets(&mut self, report: &mut Report) {
        let ctx = Context::new(&self.devices, &self.nexthop_ids, None, false);
        let mut planned = self.ipset.plan_upserts(&ctx).entries;
        planned.extend(self.ipset.plan_deletes(self.sweep).entries);
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
            let what = op.to_string();
            let result = self.apply_one(&op, report).await;
            let now = Instant::now();
            match &result {
                Ok(()) => {
                    debug!(change = %what, "kernel");
                    self.ipsets_present.insert(name.to_string());
                }
                Err(e) => {
                    report.fail(what, e);
                    // The set may be of another type or family now: the
                    // retry replaces it whole.
                    self.ipsets_present.remove(name);
                }
            }
            for p in mine {
                if result.is_ok() {
                    report.count(p.effect);
                }
                self.ipset.record(p, result.clone(), now);
            }
        }
    }
}

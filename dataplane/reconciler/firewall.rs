//! The firewall rules made of the IP pools: vxmgr's nftables table (the
//! pools' sets and the masquerade rules) and its forward chains. Read from
//! the firewall when due (start-up, resyncs, after a failure, when
//! nftables reports a change of the tables concerned or the legacy iptables
//! poll sees one), compared with what the pools call for, and changed in
//! one transaction. Each read chooses the iptables backend again (see
//! `detect::choose`): the forward chains follow the host's firewall.
//! Before the stream's InSync, CIDRs found in the table that no declared
//! pool covers stay (a restart changes nothing); after it they go.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use ipnetwork::IpNetwork;
use tracing::{debug, info, warn};

use super::{ObjectError, Reconciler, Report, table};
use crate::desired::Change;
use crate::kernel::KernelBackend;
use crate::kernel::firewall::detect;
use crate::kernel::firewall::{
    Firewall, FirewallChanges, FirewallError, FirewallState, ForwardChange, ForwardOp,
    IptablesBackend, IptablesMode, PoolSet, PoolSets, TableOp, forward_rules,
};
use crate::model::{Family, IpPool};

/// What the firewall object is called in errors.
const OBJECT: &str = "firewall rules (nftables table inet vxmgr, iptables chain VXMGR-FORWARD)";

/// The pools, the firewall as last read, and the state of the last attempt.
#[derive(Default)]
pub(super) struct FirewallSlot {
    pools: BTreeMap<String, IpPool>,
    /// Forwarding rules through this iptables backend; `None`: off.
    pub forward: Option<IptablesBackend>,
    /// The iptables backend the forward chains are in, once chosen.
    mode: Option<IptablesMode>,
    /// The legacy backend's filter tables as last polled.
    legacy_digest: Option<u64>,
    /// As last read, or as the last apply left it; `None`: to be read.
    actual: Option<FirewallState>,
    /// The pools changed, or the firewall is to be checked again.
    dirty: bool,
    error: Option<ObjectError>,
    failures: u32,
    retry_at: Option<Instant>,
    /// Other tables' forward drop policies already warned about.
    warned_drops: BTreeSet<String>,
    /// The last read found no table of vxmgr's (or no nft): while no pool
    /// is declared there is nothing to read again at every resync.
    no_table: bool,
}

/// What GetState shows of the firewall rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FirewallStatus {
    /// The table holds exactly what the pools call for.
    pub programmed: bool,
    /// The CIDRs in the table's sets as last read: all pools, masquerading ones.
    pub pools: Vec<String>,
    pub masquerading: Vec<String>,
    /// Forwarding rules: off, or the iptables backend asked for.
    pub forward: Option<IptablesBackend>,
    /// The iptables backend the forward chains are in, once chosen.
    pub mode: Option<IptablesMode>,
    pub forward_drops: Vec<String>,
    pub error: Option<String>,
}

impl FirewallSlot {
    pub fn set_pools(&mut self, changes: Vec<Change<IpPool>>) {
        for change in changes {
            self.dirty = true;
            match change.desired {
                Some(pool) => self.pools.insert(change.key, pool),
                None => self.pools.remove(&change.key),
            };
        }
    }

    /// A new stream declares its pools afresh.
    pub fn clear_pools(&mut self) {
        self.pools.clear();
    }

    /// To be read again and repaired (a resync, the sweep).
    pub fn recheck(&mut self) {
        self.actual = None;
        self.dirty = true;
    }

    /// Whether the legacy iptables backend needs polling: forwarding rules
    /// on through a backend that may be legacy, and something to keep.
    pub fn polls_legacy(&self) -> bool {
        self.forward
            .is_some_and(|flag| flag != IptablesBackend::Nft && !self.no_table)
    }

    /// Takes in a poll of the legacy backend; whether it changed since the
    /// last (then the firewall is read again).
    pub fn legacy_polled(&mut self, digest: u64) -> bool {
        let changed = self.legacy_digest.replace(digest) != Some(digest);
        if changed {
            self.recheck();
        }
        changed
    }

    pub fn due(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|at| at <= now)
    }

    pub fn next_retry(&self) -> Option<Instant> {
        self.retry_at
    }

    pub fn error(&self) -> Option<ObjectError> {
        self.error.clone()
    }

    pub fn status(&self) -> FirewallStatus {
        let sets = self.actual.as_ref().and_then(|a| a.table.as_ref());
        let members = |masquerading| -> Vec<String> {
            let Some(table) = sets else { return Vec::new() };
            Family::ALL
                .into_iter()
                .flat_map(|f| table.sets.get(PoolSet::new(f, masquerading)).iter())
                .map(IpNetwork::to_string)
                .collect()
        };
        FirewallStatus {
            programmed: !self.dirty
                && self.error.is_none()
                && (self.actual.is_some() || (self.pools.is_empty() && self.no_table)),
            pools: members(false),
            masquerading: members(true),
            forward: self.forward,
            mode: self.mode,
            forward_drops: self
                .actual
                .as_ref()
                .map(|a| a.forward_drops.clone())
                .unwrap_or_default(),
            error: self.error.as_ref().map(|e| e.error.clone()),
        }
    }

    /// What each set should hold: the declared pools', and before the
    /// sweep also the table's CIDRs that no declared pool covers.
    fn wanted_with(&self, sweep: bool, actual: &FirewallState) -> PoolSets {
        let mut sets = PoolSets::default();
        for pool in self.pools.values() {
            let family = Family::of_net(&pool.cidr);
            sets.get_mut(PoolSet::new(family, false)).insert(pool.cidr);
            if pool.masquerade {
                sets.get_mut(PoolSet::new(family, true)).insert(pool.cidr);
            }
        }
        if let Some(table) = actual.table.as_ref().filter(|_| !sweep) {
            let declared: BTreeSet<IpNetwork> = self.pools.values().map(|p| p.cidr).collect();
            for set in PoolSet::ALL {
                let adopted = table.sets.get(set).difference(&declared).copied();
                let adopted: Vec<IpNetwork> = adopted.collect();
                sets.get_mut(set).extend(adopted);
            }
        }
        sets
    }
}

/// The changes that make `actual` what `wanted` calls for, the forward
/// chains in backend `mode` (and none in the other). No table and no chain
/// are made while there is no pool.
pub(super) fn plan(
    wanted: &PoolSets,
    actual: &FirewallState,
    mode: IptablesMode,
) -> FirewallChanges {
    let mut changes = FirewallChanges::default();
    let any_pool = PoolSet::ALL.iter().any(|s| !wanted.get(*s).is_empty());
    match &actual.table {
        None if !any_pool => {}
        Some(table) if table.intact => {
            for family in Family::ALL {
                let rule = table.masquerade_rules[family as usize];
                match (wanted.masquerades(family), rule) {
                    (false, Some(handle)) => changes
                        .table
                        .push(TableOp::DeleteMasquerade { family, handle }),
                    (true, None) => changes.table.push(TableOp::AddMasquerade(family)),
                    _ => {}
                }
            }
            for set in PoolSet::ALL {
                let (want, have) = (wanted.get(set), table.sets.get(set));
                let gone: Vec<IpNetwork> = have.difference(want).copied().collect();
                let new: Vec<IpNetwork> = want.difference(have).copied().collect();
                if !gone.is_empty() {
                    changes.table.push(TableOp::DeleteElements(set, gone));
                }
                if !new.is_empty() {
                    changes.table.push(TableOp::AddElements(set, new));
                }
            }
            // Rule adds after the elements: a new rule never matches early.
            changes
                .table
                .sort_by_key(|op| matches!(op, TableOp::AddMasquerade(_)));
        }
        _ => changes.table.push(TableOp::Create(wanted.clone())),
    }
    let Some(backends) = &actual.forward else {
        return changes;
    };
    for (family, chain) in Family::ALL.iter().zip(&backends[mode as usize].chains) {
        let pools = wanted.get(PoolSet::new(*family, false));
        if pools.is_empty() && chain.rules.is_none() {
            continue;
        }
        let rules = forward_rules(pools);
        if chain.rules.as_ref() != Some(&rules) || !chain.jump_in_place() {
            changes.forward.push(ForwardChange {
                mode,
                family: *family,
                op: ForwardOp::Write {
                    rules,
                    replace_jumps: (!chain.jump_in_place()).then_some(chain.jumps),
                },
            });
        }
    }
    let other = mode.other();
    for (family, chain) in Family::ALL.iter().zip(&backends[other as usize].chains) {
        if chain.rules.is_some() || chain.jumps > 0 {
            changes.forward.push(ForwardChange {
                mode: other,
                family: *family,
                op: ForwardOp::Remove { jumps: chain.jumps },
            });
        }
    }
    changes
}

/// Counts a plan's changes into the report.
fn count(changes: &FirewallChanges, had_table: bool, report: &mut Report) {
    for op in &changes.table {
        match op {
            TableOp::Create(_) if had_table => report.changed += 1,
            TableOp::Create(_) | TableOp::AddMasquerade(_) => report.added += 1,
            TableOp::AddElements(_, nets) => report.added += nets.len() as u32,
            TableOp::DeleteElements(_, nets) => report.removed += nets.len() as u32,
            TableOp::DeleteMasquerade { .. } => report.removed += 1,
        }
    }
    for change in &changes.forward {
        match change.op {
            ForwardOp::Write { .. } => report.changed += 1,
            ForwardOp::Remove { .. } => report.removed += 1,
        }
    }
}

impl<B: KernelBackend> Reconciler<B> {
    /// Makes the firewall match the pools when something is to be done.
    pub(super) async fn reconcile_firewall(&mut self, report: &mut Report) {
        if !self.firewall.dirty {
            return;
        }
        if self.firewall.pools.is_empty() && self.firewall.no_table {
            self.firewall.dirty = false;
            return;
        }
        match self.sync_firewall(report).await {
            Ok(()) => {
                self.firewall.dirty = false;
                self.firewall.error = None;
                self.firewall.failures = 0;
                self.firewall.retry_at = None;
            }
            Err(error) if self.firewall.pools.is_empty() => {
                // Nothing to program: a host without nft is no failure.
                debug!(%error, "firewall not read; no IP pools");
                self.firewall.no_table = true;
                self.firewall.actual = None;
                self.firewall.dirty = false;
                self.firewall.error = None;
            }
            Err(error) => {
                self.firewall.actual = None;
                self.firewall.failures += 1;
                let wait = table::retry_backoff(self.firewall.failures);
                self.firewall.retry_at = Some(Instant::now() + wait);
                let error = crate::kernel::KernelError::other(error.to_string());
                report.fail(OBJECT.to_string(), &error);
                self.firewall.error = Some(ObjectError {
                    object: OBJECT.to_string(),
                    error: error.message,
                });
            }
        }
    }

    /// Reads the firewall when needed, and applies what the pools call for.
    async fn sync_firewall(&mut self, report: &mut Report) -> Result<(), FirewallError> {
        let forward = self.firewall.forward;
        // A read that left the forward chains out (no pools then) is no
        // answer once they are wanted.
        let complete = |a: &FirewallState| a.forward.is_some() || forward.is_none();
        let actual = match self.firewall.actual.take().filter(complete) {
            Some(actual) => actual,
            None => self.read_firewall().await?,
        };
        self.warn_forward_drops(&actual);
        let mode = self.choose_backend(&actual)?;
        let changes = plan(
            &self.firewall.wanted_with(self.sweep, &actual),
            &actual,
            mode,
        );
        if changes.is_empty() {
            self.firewall.no_table = actual.table.is_none();
            self.firewall.actual = Some(actual);
            return Ok(());
        }
        debug!(?changes, "firewall");
        report.operations += 1;
        self.backend.apply_firewall(&changes).await?;
        count(&changes, actual.table.is_some(), report);
        // Read back: the new rules' handles, and what GetState shows.
        let after = self.backend.firewall().read(forward.is_some()).await?;
        self.firewall.no_table = after.table.is_none();
        self.firewall.actual = Some(after);
        Ok(())
    }

    /// Reads the firewall. Without pools the forward chains are read only
    /// when vxmgr's table says pools were programmed: a host that never has
    /// any is spared iptables' backend detection.
    async fn read_firewall(&mut self) -> Result<FirewallState, FirewallError> {
        let forward = self.firewall.forward.is_some();
        if !self.firewall.pools.is_empty() || !forward {
            return self.backend.firewall().read(forward).await;
        }
        let actual = self.backend.firewall().read(false).await?;
        match actual.table {
            Some(_) => self.backend.firewall().read(true).await,
            None => Ok(actual),
        }
    }

    /// The iptables backend for the forward chains, chosen again from what
    /// was just read (any backend when forwarding rules are off: there
    /// is nothing to plan in it). An unreadable backend in use is an error.
    fn choose_backend(&mut self, actual: &FirewallState) -> Result<IptablesMode, FirewallError> {
        let (Some(flag), Some(census)) = (self.firewall.forward, &actual.forward) else {
            return Ok(self.firewall.mode.unwrap_or(IptablesMode::Nft));
        };
        let mode = detect::choose(flag, census, self.firewall.mode);
        if let Some(error) = &census[mode as usize].error {
            return Err(FirewallError(error.clone()));
        }
        if self.firewall.mode.replace(mode) != Some(mode) {
            info!(backend = %mode, "iptables backend for the forward rules");
        }
        Ok(mode)
    }

    /// Polls the legacy iptables backend (it sends no notification);
    /// whether the firewall is to be repaired.
    pub async fn poll_legacy_iptables(&mut self) -> bool {
        if !self.firewall.polls_legacy() {
            return false;
        }
        let digest = self.backend.firewall().legacy_filter_digest().await;
        self.firewall.legacy_polled(digest)
    }

    /// Nobody can override another table's drop: said once per chain.
    fn warn_forward_drops(&mut self, actual: &FirewallState) {
        for chain in &actual.forward_drops {
            if self.firewall.warned_drops.insert(chain.clone()) {
                warn!(
                    %chain,
                    "another nftables table drops forwarded traffic by policy: a drop in any table is final, so pod traffic it does not accept is dropped; vxmgr leaves that table alone"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::firewall::{BackendCensus, ForwardChain, NatTable};

    const NFT: IptablesMode = IptablesMode::Nft;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    fn sets(all: &[&str], masq: &[&str]) -> PoolSets {
        let mut sets = PoolSets::default();
        for (cidrs, masquerading) in [(all, false), (masq, true)] {
            for cidr in cidrs {
                let n = net(cidr);
                sets.get_mut(PoolSet::new(Family::of_net(&n), masquerading))
                    .insert(n);
            }
        }
        sets
    }

    /// The v4 chain `chain` in the nft backend, legacy's as given.
    fn state_with(
        table: Option<NatTable>,
        chain: ForwardChain,
        legacy: [ForwardChain; 2],
    ) -> FirewallState {
        let backend = |chains| BackendCensus {
            available: true,
            chains,
            ..Default::default()
        };
        FirewallState {
            table,
            forward: Some([backend([chain, ForwardChain::default()]), backend(legacy)]),
            forward_drops: Vec::new(),
        }
    }

    fn state(table: Option<NatTable>, chain: ForwardChain) -> FirewallState {
        state_with(table, chain, Default::default())
    }

    fn write(family: Family, rules: Vec<String>, replace_jumps: Option<u32>) -> ForwardChange {
        ForwardChange {
            mode: NFT,
            family,
            op: ForwardOp::Write {
                rules,
                replace_jumps,
            },
        }
    }

    #[test]
    fn nothing_is_made_without_pools_and_a_missing_table_is_created_whole() {
        let empty = state(None, ForwardChain::default());
        assert!(plan(&PoolSets::default(), &empty, NFT).is_empty());
        let wanted = sets(&["10.244.0.0/16"], &["10.244.0.0/16"]);
        let changes = plan(&wanted, &empty, NFT);
        assert_eq!(changes.table, [TableOp::Create(wanted.clone())]);
        assert_eq!(
            changes.forward,
            [write(
                Family::V4,
                forward_rules(&[net("10.244.0.0/16")]),
                Some(0)
            )]
        );
    }

    #[test]
    fn sets_change_by_element_and_the_rule_follows_the_masquerading_pools() {
        let table = NatTable {
            intact: true,
            sets: sets(&["10.244.0.0/16", "10.1.0.0/16"], &["10.244.0.0/16"]),
            masquerade_rules: [Some(7), None],
        };
        let chain = ForwardChain {
            rules: Some(forward_rules(&[net("10.1.0.0/16"), net("10.244.0.0/16")])),
            jumps: 1,
            jump_first: true,
        };
        let actual = state(Some(table.clone()), chain);
        assert!(
            plan(&table.sets, &actual, NFT).is_empty(),
            "a restart changes nothing"
        );
        let wanted = sets(&["10.244.0.0/16", "fd00:244::/48"], &["fd00:244::/48"]);
        let v4_all = PoolSet::new(Family::V4, false);
        let v4_masq = PoolSet::new(Family::V4, true);
        let v6_all = PoolSet::new(Family::V6, false);
        let v6_masq = PoolSet::new(Family::V6, true);
        assert_eq!(
            plan(&wanted, &actual, NFT).table,
            [
                TableOp::DeleteMasquerade {
                    family: Family::V4,
                    handle: 7
                },
                TableOp::DeleteElements(v4_all, vec![net("10.1.0.0/16")]),
                TableOp::DeleteElements(v4_masq, vec![net("10.244.0.0/16")]),
                TableOp::AddElements(v6_all, vec![net("fd00:244::/48")]),
                TableOp::AddElements(v6_masq, vec![net("fd00:244::/48")]),
                TableOp::AddMasquerade(Family::V6),
            ]
        );
    }

    #[test]
    fn a_table_changed_by_hand_is_rebuilt_and_a_moved_jump_put_back() {
        let wanted = sets(&["10.244.0.0/16"], &[]);
        let tampered = NatTable {
            intact: false,
            sets: wanted.clone(),
            masquerade_rules: [None, None],
        };
        let chain = ForwardChain {
            rules: Some(forward_rules(&[net("10.244.0.0/16")])),
            jumps: 1,
            jump_first: false,
        };
        let changes = plan(&wanted, &state(Some(tampered), chain), NFT);
        assert_eq!(changes.table, [TableOp::Create(wanted)]);
        assert_eq!(
            changes.forward,
            [write(
                Family::V4,
                forward_rules(&[net("10.244.0.0/16")]),
                Some(1)
            )]
        );
    }

    #[test]
    fn a_move_writes_the_chain_in_use_first_then_takes_ours_out_of_the_other_backend() {
        let wanted = sets(&["10.244.0.0/16"], &[]);
        let table = NatTable {
            intact: true,
            sets: wanted.clone(),
            masquerade_rules: [None, None],
        };
        let rules = forward_rules(&[net("10.244.0.0/16")]);
        let legacy = [
            ForwardChain {
                rules: Some(rules.clone()),
                jumps: 1,
                jump_first: true,
            },
            // An empty chain of ours goes too.
            ForwardChain {
                rules: Some(Vec::new()),
                ..Default::default()
            },
        ];
        let actual = state_with(Some(table), ForwardChain::default(), legacy);
        let changes = plan(&wanted, &actual, NFT);
        assert!(changes.table.is_empty());
        let remove = |family, jumps| ForwardChange {
            mode: IptablesMode::Legacy,
            family,
            op: ForwardOp::Remove { jumps },
        };
        assert_eq!(
            changes.forward,
            [
                write(Family::V4, rules, Some(0)),
                remove(Family::V4, 1),
                remove(Family::V6, 0)
            ]
        );
    }
}

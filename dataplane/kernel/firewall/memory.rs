//! The firewall in memory: vxmgr's table and forward chains as the binaries
//! would leave them, with their refusals (no table, no such element or
//! rule), every apply recorded, and the faults and drift tests need.

use std::hash::{DefaultHasher, Hash, Hasher};

use super::{
    BackendCensus, FirewallChanges, FirewallError, FirewallState, ForwardChain, ForwardOp,
    IptablesMode, NatTable, TableOp,
};
use crate::model::Family;

/// nft's refusal to change what is not there.
fn missing(what: String) -> FirewallError {
    FirewallError(format!("nft: {what}: No such file or directory"))
}

#[derive(Clone, Debug)]
pub struct FirewallModel {
    pub table: Option<NatTable>,
    /// Each iptables backend (by `IptablesMode`): both installed, empty.
    pub iptables: [BackendCensus; 2],
    /// Other tables' forward chains with a drop policy.
    pub forward_drops: Vec<String>,
    /// Applies that succeeded, and the last of them (a count, not a log:
    /// `--kernel memory` daemons run for long).
    pub applies: u32,
    pub last_apply: Option<FirewallChanges>,
    /// Reads made.
    pub reads: u32,
    /// The `nft` binary is missing: every read and apply fails.
    pub nft_missing: bool,
    next_handle: u64,
}

impl Default for FirewallModel {
    fn default() -> Self {
        let installed = BackendCensus {
            available: true,
            ..Default::default()
        };
        FirewallModel {
            table: None,
            iptables: [installed.clone(), installed],
            forward_drops: Vec::new(),
            applies: 0,
            last_apply: None,
            reads: 0,
            nft_missing: false,
            next_handle: 0,
        }
    }
}

impl FirewallModel {
    pub fn read(&mut self, forward: bool) -> Result<FirewallState, FirewallError> {
        self.reads += 1;
        self.check_nft()?;
        Ok(FirewallState {
            table: self.table.clone(),
            forward: forward.then(|| self.iptables.clone()),
            forward_drops: self.forward_drops.clone(),
        })
    }

    /// One backend's forward chains.
    pub fn forward(&self, mode: IptablesMode) -> &[ForwardChain; 2] {
        &self.iptables[mode as usize].chains
    }

    /// As the real digest: it changes with the legacy backend's rules and
    /// policies.
    pub fn legacy_filter_digest(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.iptables[IptablesMode::Legacy as usize].hash(&mut hasher);
        hasher.finish()
    }

    /// All or nothing, as one nft transaction.
    pub fn apply(&mut self, changes: &FirewallChanges) -> Result<(), FirewallError> {
        self.check_nft()?;
        let mut next = self.clone();
        for op in &changes.table {
            next.apply_table_op(op)?;
        }
        for change in &changes.forward {
            let backend = &mut next.iptables[change.mode as usize];
            if !backend.available {
                return Err(FirewallError(format!(
                    "iptables-{}-restore: not installed",
                    change.mode
                )));
            }
            let chain = &mut backend.chains[change.family as usize];
            match &change.op {
                ForwardOp::Write {
                    rules,
                    replace_jumps,
                } => {
                    chain.rules = Some(rules.clone());
                    if replace_jumps.is_some() {
                        chain.jumps = 1;
                        chain.jump_first = true;
                    }
                }
                ForwardOp::Remove { .. } => *chain = ForwardChain::default(),
            }
        }
        next.applies += 1;
        next.last_apply = Some(changes.clone());
        *self = next;
        Ok(())
    }

    fn check_nft(&self) -> Result<(), FirewallError> {
        match self.nft_missing {
            true => Err(FirewallError(
                "the nft binary is missing (install nftables)".into(),
            )),
            false => Ok(()),
        }
    }

    fn apply_table_op(&mut self, op: &TableOp) -> Result<(), FirewallError> {
        let handle = self.handle();
        match op {
            TableOp::Create(sets) => {
                let mut table = NatTable {
                    intact: true,
                    sets: sets.clone(),
                    ..Default::default()
                };
                for family in Family::ALL.into_iter().filter(|f| sets.masquerades(*f)) {
                    table.masquerade_rules[family as usize] = Some(handle + family as u64);
                }
                self.next_handle += 1;
                self.table = Some(table);
            }
            TableOp::AddElements(set, nets) => self.existing()?.sets.get_mut(*set).extend(nets),
            TableOp::DeleteElements(set, nets) => {
                let members = self.existing()?.sets.get_mut(*set);
                for net in nets {
                    if !members.remove(net) {
                        return Err(missing(format!("element {net} of set {}", set.name())));
                    }
                }
            }
            TableOp::AddMasquerade(family) => {
                self.existing()?.masquerade_rules[*family as usize].get_or_insert(handle);
            }
            TableOp::DeleteMasquerade { family, handle } => {
                let rule = &mut self.existing()?.masquerade_rules[*family as usize];
                if *rule != Some(*handle) {
                    return Err(missing(format!("rule handle {handle}")));
                }
                *rule = None;
            }
        }
        Ok(())
    }

    fn existing(&mut self) -> Result<&mut NatTable, FirewallError> {
        self.table
            .as_mut()
            .ok_or_else(|| missing("table inet vxmgr".into()))
    }

    fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }
}

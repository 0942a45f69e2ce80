//! The firewall rules vxmgr keeps for its IP pools: outgoing NAT in an
//! nftables table of its own, and forwarding in a chain of its own in
//! iptables' `filter` table (with one jump from the top of `FORWARD`: a
//! drop in any table is final, so only a rule in the table whose FORWARD
//! policy drops can let pod traffic through). One trait, two
//! implementations: the `nft` and `iptables-restore` binaries, and a model
//! in memory for kernel-free tests and `--kernel memory`.

pub mod detect;
mod iptables;
pub mod memory;
mod nft;

use std::collections::BTreeSet;
use std::future::Future;

use ipnetwork::IpNetwork;

use crate::model::Family;

pub use detect::{BackendCensus, IptablesMode};
pub use iptables::IptablesBackend;
pub use nft::NftFirewall;

/// vxmgr's nftables table, by exact name.
pub const TABLE: &str = "vxmgr";
/// Its family: one table for both IP families.
pub const TABLE_FAMILY: &str = "inet";
/// The base chain masquerading pool traffic that leaves the pools.
pub const NAT_CHAIN: &str = "postrouting";
/// vxmgr's chain in iptables' and ip6tables' `filter` table.
pub const FORWARD_CHAIN: &str = "VXMGR-FORWARD";

/// One of the table's nftables sets of pool CIDRs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolSet {
    pub family: Family,
    /// Only the masquerading pools (otherwise all of them).
    pub masquerading: bool,
}

impl PoolSet {
    pub const ALL: [PoolSet; 4] = [
        PoolSet::new(Family::V4, false),
        PoolSet::new(Family::V4, true),
        PoolSet::new(Family::V6, false),
        PoolSet::new(Family::V6, true),
    ];

    pub const fn new(family: Family, masquerading: bool) -> PoolSet {
        PoolSet {
            family,
            masquerading,
        }
    }

    pub fn name(self) -> &'static str {
        match (self.family, self.masquerading) {
            (Family::V4, false) => "all-pools-v4",
            (Family::V4, true) => "masq-pools-v4",
            (Family::V6, false) => "all-pools-v6",
            (Family::V6, true) => "masq-pools-v6",
        }
    }

    fn index(self) -> usize {
        self.family as usize * 2 + self.masquerading as usize
    }
}

/// The CIDRs of each of the table's sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSets([BTreeSet<IpNetwork>; 4]);

impl PoolSets {
    pub fn get(&self, set: PoolSet) -> &BTreeSet<IpNetwork> {
        &self.0[set.index()]
    }

    pub fn get_mut(&mut self, set: PoolSet) -> &mut BTreeSet<IpNetwork> {
        &mut self.0[set.index()]
    }

    /// Whether the family has a masquerade rule: only while it has a
    /// masquerading pool, as in Felix.
    pub fn masquerades(&self, family: Family) -> bool {
        !self.get(PoolSet::new(family, true)).is_empty()
    }
}

/// vxmgr's nftables table as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatTable {
    /// It holds exactly vxmgr's sets, chain and rules, each as vxmgr makes
    /// them (nothing added or changed by hand).
    pub intact: bool,
    pub sets: PoolSets,
    /// The handle of each family's masquerade rule.
    pub masquerade_rules: [Option<u64>; 2],
}

/// One family's forward chain as read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ForwardChain {
    /// The chain's rules as `iptables-save` prints them; `None`: no chain.
    pub rules: Option<Vec<String>>,
    /// Rules in `FORWARD` that jump to the chain.
    pub jumps: u32,
    /// The first rule of `FORWARD` is such a jump.
    pub jump_first: bool,
}

impl ForwardChain {
    /// The jump is in place: once, at the top.
    pub fn jump_in_place(&self) -> bool {
        self.jump_first && self.jumps == 1
    }
}

/// Everything of vxmgr's firewall as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FirewallState {
    /// `None`: no table.
    pub table: Option<NatTable>,
    /// Each iptables backend (by `IptablesMode`) with vxmgr's forward
    /// chains in it; `None` when forwarding rules are off.
    pub forward: Option<[BackendCensus; 2]>,
    /// Base chains of other nftables tables on the forward hook whose
    /// policy is drop ("inet filter forward"): nobody can override those.
    pub forward_drops: Vec<String>,
}

/// A change to vxmgr's nftables table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableOp {
    /// Creates the table afresh with these sets (deleting whatever a table
    /// of its name held) and the masquerade rules they call for.
    Create(PoolSets),
    AddElements(PoolSet, Vec<IpNetwork>),
    DeleteElements(PoolSet, Vec<IpNetwork>),
    AddMasquerade(Family),
    DeleteMasquerade {
        family: Family,
        handle: u64,
    },
}

/// A change to one family's forward chain in one iptables backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardChange {
    pub mode: IptablesMode,
    pub family: Family,
    pub op: ForwardOp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForwardOp {
    /// The chain rewritten with these rules, and the jump put back at the
    /// top of `FORWARD` when it is not in place.
    Write {
        rules: Vec<String>,
        /// Jumps to delete (all there are) before one is inserted at the
        /// top; `None`: the jump is in place.
        replace_jumps: Option<u32>,
    },
    /// The jumps (this many) and the chain go: the backend is not in use.
    Remove { jumps: u32 },
}

/// What one apply changes: the table in one nftables transaction, each
/// family's forward chain in one `iptables-restore` per backend (the
/// backend in use first: a move never leaves a gap).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FirewallChanges {
    pub table: Vec<TableOp>,
    pub forward: Vec<ForwardChange>,
}

impl FirewallChanges {
    pub fn is_empty(&self) -> bool {
        self.table.is_empty() && self.forward.is_empty()
    }
}

/// The rules of a family's forward chain for these pools, as
/// `iptables-save` prints them: traffic from and to each pool is accepted.
pub fn forward_rules<'a>(pools: impl IntoIterator<Item = &'a IpNetwork>) -> Vec<String> {
    pools
        .into_iter()
        .flat_map(|p| ["-s", "-d"].map(|dir| format!("-A {FORWARD_CHAIN} {dir} {p} -j ACCEPT")))
        .collect()
}

/// The jump from `FORWARD`, as `iptables-save` prints it.
pub fn forward_jump() -> String {
    format!("-A FORWARD -j {FORWARD_CHAIN}")
}

/// Why the firewall could not be read or changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FirewallError(pub String);

/// What vxmgr needs of a firewall.
pub trait Firewall: Send + 'static {
    /// Reads vxmgr's table, other tables' forward drop policies, and, with
    /// `forward` (forwarding rules on), both iptables backends.
    fn read(
        &mut self,
        forward: bool,
    ) -> impl Future<Output = Result<FirewallState, FirewallError>> + Send;

    /// A digest of the legacy iptables backend's filter tables: it changes
    /// when their rules or policies do, and is cheap enough to poll (legacy
    /// iptables sends no notification). 0: no legacy filter table.
    fn legacy_filter_digest(&mut self) -> impl Future<Output = u64> + Send;

    /// Applies the table's changes in one transaction, then each forward
    /// chain's. Nothing of the table changes when its transaction fails.
    fn apply(
        &mut self,
        changes: &FirewallChanges,
    ) -> impl Future<Output = Result<(), FirewallError>> + Send;
}

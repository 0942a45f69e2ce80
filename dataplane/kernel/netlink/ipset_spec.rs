//! What vxmgr's ipsets are, shared by the two ways they are changed: member
//! updates over netlink (ipset.rs) and full replaces through `ipset restore`
//! (ipset_restore.rs).

/// The type of vxmgr's sets: members are addresses and prefixes.
pub(super) const SET_TYPE: &str = "hash:net";

/// Felix's set size: a set refuses members beyond its maxelem, and
/// creating a set that exists only succeeds when it has the same one.
pub(super) const MAX_ELEMENTS: u32 = 1_048_576;

/// What a set of vxmgr's name is in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExistingSet {
    Missing,
    /// Of vxmgr's type and family.
    Ours,
    /// Of another type or family: it cannot take vxmgr's members, nor be
    /// swapped with a set of vxmgr's.
    Other,
}

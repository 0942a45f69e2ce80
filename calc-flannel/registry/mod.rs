//! Where leases live, as flannel's subnet managers: etcd (`etcd/`, the
//! leases are keys flannel creates and renews) or the Kubernetes API
//! (`kube/`, the leases are Nodes' podCIDRs and flannel's annotations).
//! The agent follows either the same way through [`SubnetManager`].

pub mod etcd;
pub mod kube;

use std::collections::BTreeSet;
use std::future::Future;

use crate::allocate::Previous;
use crate::lease::{Lease, LeaseAttrs};
use crate::network::NetworkConfig;
use crate::subnet::SubnetKey;

/// A change to the other nodes' leases, or to this node's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseChange {
    /// Every lease, as listed again: anything not listed is gone, except
    /// the keys in `unreadable` (listed, but their values cannot be read
    /// now; they keep what they had).
    Resync {
        leases: Vec<Lease>,
        unreadable: BTreeSet<SubnetKey>,
    },
    Put(Lease),
    Delete(SubnetKey),
    /// This node holds another lease now.
    Local(Lease),
}

/// flannel's subnet manager: where the network config and the leases come
/// from. Every step waits (retrying, logging what it waits for) until it
/// can do what it says; none fails for good.
pub trait SubnetManager: Send {
    /// What `due` found to do.
    type Due: Send;

    /// The network config, once there is a usable one.
    fn network_config(&mut self) -> impl Future<Output = NetworkConfig> + Send;

    /// Holds this node's lease, `attrs` being its value as this node sees
    /// it, asking for the `previous` subnets first where the manager
    /// chooses subnets, and lists every other lease. Returns the lease as held (its
    /// value may differ from `attrs`, e.g. an address overwritten by the
    /// operator) and the listing, as a [`LeaseChange::Resync`].
    fn acquire(
        &mut self,
        config: &NetworkConfig,
        attrs: LeaseAttrs,
        previous: Previous,
    ) -> impl Future<Output = (Lease, LeaseChange)> + Send;

    /// Waits until there is something to do. Cancel-safe: dropped, it
    /// loses nothing (the agent waits for vxmgrd at the same time).
    fn due(&mut self) -> impl Future<Output = Self::Due> + Send;

    /// Does it, to the end: the lease changes it brings.
    fn handle(&mut self, due: Self::Due) -> impl Future<Output = Vec<LeaseChange>> + Send;

    /// vxmgrd has programmed this node's view of the network.
    fn programmed(&mut self) -> impl Future<Output = ()> + Send;
}

//! The Linux kernel over rtnetlink: operations are pipelined on one socket,
//! dumps are filtered by the kernel on strict-check sockets (those of
//! routes, neighbours, FDB entries and nexthops read and parsed in place,
//! several at once), nexthop objects change over a socket of their own,
//! ipsets over a NETLINK_NETFILTER socket (full replaces through `ipset
//! restore`) and TX checksum offload through the SIOCETHTOOL ioctl.
//!
//! The sockets belong to the network namespace of the thread that opens
//! them: a caller that wants another namespace enters it (setns) on a
//! dedicated thread before creating the backend there.

mod dump;
mod ethtool;
mod ipset;
mod ipset_message;
mod ipset_restore;
mod ipset_spec;
mod link;
mod neighbour;
mod nexthop;
mod raw;
mod route;
mod socket;
mod watch;

use std::io;
use std::net::IpAddr;

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use netlink_packet_route::RouteNetlinkMessage;

use super::firewall::NftFirewall;
use super::objects::{KernelOp, KernelState, Link, Notification, Ownership};
use super::{KernelBackend, KernelError};
use crate::desired::ParentInterface;
use dump::Dumps;
use ethtool::Ethtool;
use ipset_message::IpsetMessage;
use nexthop::NexthopMessage;
use socket::{DumpFilters, NetlinkSocket};

/// Requests in flight on the operations socket at once: enough to hide the
/// kernel's per-request round trip (DESIGN.md §5), few enough that their
/// ACKs fit the socket's receive buffer.
const MAX_IN_FLIGHT: usize = 512;

pub struct NetlinkBackend {
    /// Changes and single gets.
    rtnl: NetlinkSocket<RouteNetlinkMessage>,
    /// Address dumps, filtered by the kernel.
    address_dumps: NetlinkSocket<RouteNetlinkMessage>,
    /// Dumps of routes, neighbours, FDB entries and nexthops.
    dumps: Dumps,
    nexthops: NetlinkSocket<NexthopMessage>,
    ipsets: NetlinkSocket<IpsetMessage>,
    ethtool: Ethtool,
    firewall: NftFirewall,
}

impl NetlinkBackend {
    /// Opens the sockets in the calling thread's network namespace; their
    /// connections run on the current tokio runtime.
    pub fn new() -> Result<NetlinkBackend, KernelError> {
        let opened = || -> io::Result<NetlinkBackend> {
            Ok(NetlinkBackend {
                rtnl: NetlinkSocket::open(DumpFilters::Ignored)?,
                address_dumps: NetlinkSocket::open(DumpFilters::Strict)?,
                dumps: Dumps::open()?,
                nexthops: NetlinkSocket::open(DumpFilters::Ignored)?,
                ipsets: NetlinkSocket::open_netfilter()?,
                ethtool: Ethtool::open()?,
                firewall: NftFirewall::new(),
            })
        };
        opened().map_err(|e| KernelError {
            errno: e.raw_os_error(),
            message: format!("opening kernel sockets: {e}"),
        })
    }

    /// A request that changes something and returns nothing.
    async fn change(&self, message: RouteNetlinkMessage, flags: u16) -> Result<(), KernelError> {
        self.rtnl.request(message, flags).await.map(drop)
    }

    async fn apply_one(&self, op: &KernelOp) -> Result<(), KernelError> {
        match op {
            KernelOp::CreateVxlan(spec) => self.create_vxlan(spec).await,
            KernelOp::DeleteLink { index, .. } => self.delete_link(*index).await,
            KernelOp::SetMtu { index, mtu } => self.set_mtu(*index, *mtu).await,
            KernelOp::SetUp { index } => self.set_up(*index).await,
            KernelOp::AddAddress { index, address } => self.add_address(*index, *address).await,
            KernelOp::DeleteAddress { index, address } => {
                self.delete_address(*index, *address).await
            }
            KernelOp::DisableTxChecksum { name } => self
                .ethtool
                .set_tx_checksum(name, false)
                .map_err(|e| io_error(&e)),
            KernelOp::AddNexthop(nexthop) => self.add_nexthop(nexthop).await,
            KernelOp::ReplaceNexthop(nexthop) => self.replace_nexthop(nexthop).await,
            KernelOp::DeleteNexthop(nexthop) => self.delete_nexthop(nexthop.id).await,
            KernelOp::AddRoute(route) => self.add_route(route).await,
            KernelOp::ReplaceRoute(route) => self.replace_route(route).await,
            KernelOp::DeleteRoute(route) => self.delete_route(route).await,
            KernelOp::ReplaceNeighbor(neighbor) => self.replace_neighbor(neighbor).await,
            KernelOp::DeleteNeighbor(neighbor) => self.delete_neighbor(neighbor).await,
            KernelOp::ReplaceFdb(entry) => self.replace_fdb(entry).await,
            KernelOp::DeleteFdb(entry) => self.delete_fdb(entry).await,
            KernelOp::Ipset {
                name,
                family,
                change,
            } => self.apply_ipset(name, *family, change).await,
        }
    }
}

/// An I/O error: its errno when it has one.
fn io_error(error: &io::Error) -> KernelError {
    match error.raw_os_error() {
        Some(errno) => KernelError::from_errno(errno),
        None => KernelError::other(error.to_string()),
    }
}

impl KernelBackend for NetlinkBackend {
    type Firewall = NftFirewall;

    fn firewall(&mut self) -> &mut NftFirewall {
        &mut self.firewall
    }

    async fn dump(&mut self, ownership: &Ownership) -> Result<KernelState, KernelError> {
        let devices = self.read_links(&ownership.devices).await?;
        let indexes: Vec<u32> = devices.iter().map(|l| l.index).collect();
        // All at once, the largest first: they take the dump sockets in
        // the order they ask for them; the ipset socket works alongside.
        let (routes, nexthops, neighbors, fdb, ipsets) = futures::try_join!(
            self.dump_routes(),
            self.dump_nexthops(),
            self.dump_neighbors(&indexes),
            self.dump_fdb(&indexes),
            self.dump_ipsets(&ownership.ipsets),
        )?;
        Ok(KernelState {
            neighbors,
            fdb,
            ipsets,
            ..ownership.sort_out(devices, routes, nexthops)
        })
    }

    async fn addresses(&mut self) -> Result<Vec<(u32, IpAddr)>, KernelError> {
        self.all_addresses().await
    }

    async fn links(&mut self, names: &[String]) -> Result<Vec<Link>, KernelError> {
        self.read_links(names).await
    }

    async fn find_interface(
        &mut self,
        address: IpAddr,
    ) -> Result<Option<ParentInterface>, KernelError> {
        self.interface_holding(address).await
    }

    async fn apply(&mut self, ops: &[KernelOp]) -> Vec<Result<(), KernelError>> {
        // Results come back in the order of the operations, whatever order
        // the kernel answers in.
        let mut in_flight = FuturesOrdered::new();
        let mut results = Vec::with_capacity(ops.len());
        let mut ops = ops.iter();
        loop {
            while in_flight.len() < MAX_IN_FLIGHT {
                match ops.next() {
                    Some(op) => in_flight.push_back(self.apply_one(op)),
                    None => break,
                }
            }
            match in_flight.next().await {
                Some(result) => results.push(result),
                None => return results,
            }
        }
    }

    async fn supports_nexthops(&mut self) -> bool {
        self.nexthops_supported().await
    }

    fn watch(&mut self) -> Result<tokio::sync::mpsc::UnboundedReceiver<Notification>, KernelError> {
        watch::subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_outside_a_tokio_runtime_is_an_error() {
        let Err(error) = NetlinkBackend::new() else {
            panic!("opened without a runtime to run the connections on");
        };
        assert!(
            error.message.starts_with("opening kernel sockets"),
            "{error}"
        );
    }
}

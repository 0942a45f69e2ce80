//! The Linux kernel over rtnetlink: changes of routes, nexthops,
//! neighbours and FDB entries go many to a datagram (see `batch`), other
//! operations are pipelined on one socket, dumps are filtered by the kernel on strict-check sockets (those of
//! routes, neighbours, FDB entries and nexthops read and parsed in place,
//! several at once), ipsets over a NETLINK_NETFILTER socket (full replaces through `ipset
//! restore`) and TX checksum offload through the SIOCETHTOOL ioctl.
//!
//! The sockets belong to the network namespace of the thread that opens
//! them: a caller that wants another namespace enters it (setns) on a
//! dedicated thread before creating the backend there.

mod batch;
mod dump;
mod echo_filter;
mod ethtool;
mod ipset;
mod ipset_message;
mod ipset_restore;
mod ipset_spec;
mod link;
mod neighbour;
mod nexthop;
mod nft_watch;
mod raw;
mod route;
mod socket;
mod watch;

use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, FuturesUnordered};
use ipnetwork::IpNetwork;
use netlink_packet_route::RouteNetlinkMessage;

use super::firewall::NftFirewall;
use super::objects::{DumpSink, KernelFdb, KernelNeighbor, KernelOp, Link, Ownership, RouteDump};
use super::watch::Watch;
use super::{KernelBackend, KernelError};
use crate::desired::ParentInterface;
use batch::{BatchSocket, Datagram, REQUESTS_PER_DATAGRAM};
use dump::Dumps;
use ethtool::Ethtool;
use ipset_message::IpsetMessage;
use socket::{DumpFilters, NetlinkSocket};

/// Requests in flight on the operations socket at once (those not sent in
/// batches): enough to hide the kernel's per-request round trip (DESIGN.md
/// §5), few enough that their ACKs fit the socket's receive buffer.
const MAX_IN_FLIGHT: usize = 512;

/// Batch sockets, each sending from a thread of its own: the kernel makes
/// a change in the thread that sends it, and changes of one namespace sent
/// from two threads take half the time (100,000 routes by `ip -batch`:
/// 1.52 s from one, 0.80 s from two; neighbours 1.18 → 0.70 s, FDB entries
/// 1.16 → 0.79 s). One per CPU, up to this many.
const MAX_BATCH_SOCKETS: usize = 4;

pub struct NetlinkBackend {
    /// Changes and single gets.
    rtnl: NetlinkSocket<RouteNetlinkMessage>,
    /// Address dumps, filtered by the kernel.
    address_dumps: NetlinkSocket<RouteNetlinkMessage>,
    /// Dumps of routes, neighbours, FDB entries and nexthops.
    dumps: Dumps,
    /// Changes of routes, nexthops, neighbours and FDB entries, each
    /// socket used on a blocking thread, datagrams sent on all at once.
    batches: Vec<Arc<Mutex<BatchSocket>>>,
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
                batches: batch_sockets()?,
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

    /// Operations that are not sent in batches, pipelined; each result
    /// with the operation's index.
    async fn apply_one_by_one(&self, ops: &[KernelOp]) -> Vec<(usize, Result<(), KernelError>)> {
        // Results come back in the order of the operations, whatever order
        // the kernel answers in.
        let mut in_flight = FuturesOrdered::new();
        let mut results = Vec::new();
        let mut ops = ops.iter().enumerate();
        loop {
            while in_flight.len() < MAX_IN_FLIGHT {
                match ops.next() {
                    Some((_, op)) if batched(op) => {}
                    Some((index, op)) => {
                        in_flight.push_back(async move { (index, self.apply_one(op).await) })
                    }
                    None => break,
                }
            }
            match in_flight.next().await {
                Some(result) => results.push(result),
                None => return results,
            }
        }
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
            KernelOp::Ipset {
                name,
                family,
                change,
            } => self.apply_ipset(name, *family, change).await,
            other => Err(KernelError::other(format!("{other}: sent in batches only"))),
        }
    }

    /// The operations sent in batches, a datagram at a time; each result
    /// with the operation's index. The operations of one call do not
    /// depend on one another, so their datagrams go out on every batch
    /// socket at once: datagram `n` on socket `n % sockets`, never more in
    /// flight than sockets, so each socket has one at a time.
    async fn apply_batched(&self, all: &[KernelOp]) -> Vec<(usize, Result<(), KernelError>)> {
        let mut results = Vec::new();
        let indexes: Vec<usize> = (0..all.len()).filter(|&i| batched(&all[i])).collect();
        let sockets = self.batches.len();
        let mut in_flight = VecDeque::with_capacity(sockets);
        for (n, chunk) in indexes.chunks(REQUESTS_PER_DATAGRAM).enumerate() {
            if in_flight.len() == sockets
                && let Some((chunk, sent)) = in_flight.pop_front()
            {
                self.answered(all, chunk, sent, &mut results).await;
            }
            let mut datagram = Datagram::default();
            for &index in chunk {
                push_request(&mut datagram, &all[index]);
            }
            let socket = Arc::clone(&self.batches[n % sockets]);
            let sent = tokio::task::spawn_blocking(move || {
                let mut socket = socket.lock().unwrap_or_else(PoisonError::into_inner);
                socket.send(datagram)
            });
            in_flight.push_back((chunk, sent));
        }
        while let Some((chunk, sent)) = in_flight.pop_front() {
            self.answered(all, chunk, sent, &mut results).await;
        }
        results
    }

    /// Takes in the answers to the datagram of `chunk`'s operations.
    async fn answered(
        &self,
        all: &[KernelOp],
        chunk: &[usize],
        sent: tokio::task::JoinHandle<Vec<Result<(), KernelError>>>,
        results: &mut Vec<(usize, Result<(), KernelError>)>,
    ) {
        let answers = match sent.await {
            Ok(answers) => answers,
            Err(e) => vec![Err(KernelError::other(format!("batch thread: {e}"))); chunk.len()],
        };
        for (&index, result) in chunk.iter().zip(answers) {
            let result = match result {
                Err(error) => Err(self.refused(&all[index], error).await),
                ok => ok,
            };
            results.push((index, result));
        }
    }

    /// What the kernel's refusal of a batched operation means.
    async fn refused(&self, op: &KernelOp, error: KernelError) -> KernelError {
        match op {
            KernelOp::AddRoute(route) => route::add_refused(route, error),
            KernelOp::AddNexthop(nexthop) | KernelOp::ReplaceNexthop(nexthop) => {
                self.new_refused(nexthop, error).await
            }
            _ => error,
        }
    }
}

fn batch_sockets() -> io::Result<Vec<Arc<Mutex<BatchSocket>>>> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..cpus.min(MAX_BATCH_SOCKETS))
        .map(|_| Ok(Arc::new(Mutex::new(BatchSocket::open()?))))
        .collect()
}

/// Whether the operation is sent in batches.
fn batched(op: &KernelOp) -> bool {
    matches!(
        op,
        KernelOp::AddNexthop(_)
            | KernelOp::ReplaceNexthop(_)
            | KernelOp::DeleteNexthop(_)
            | KernelOp::AddRoute(_)
            | KernelOp::ReplaceRoute(_)
            | KernelOp::DeleteRoute(_)
            | KernelOp::ReplaceNeighbor(_)
            | KernelOp::DeleteNeighbor(_)
            | KernelOp::ReplaceFdb(_)
            | KernelOp::DeleteFdb(_)
    )
}

/// Appends a batched operation's request (nothing for another).
fn push_request(datagram: &mut Datagram, op: &KernelOp) {
    match op {
        KernelOp::AddNexthop(n) => datagram.push(nexthop::add_request(n)),
        KernelOp::ReplaceNexthop(n) => datagram.push(nexthop::replace_request(n)),
        KernelOp::DeleteNexthop(n) => datagram.push(nexthop::delete_request(n.id)),
        KernelOp::AddRoute(r) => datagram.push(route::add_request(r)),
        KernelOp::ReplaceRoute(r) => datagram.push(route::replace_request(r)),
        KernelOp::DeleteRoute(r) => datagram.push(route::delete_request(r)),
        KernelOp::ReplaceNeighbor(n) => datagram.push(neighbour::replace_neighbor_request(n)),
        KernelOp::DeleteNeighbor(n) => datagram.push(neighbour::delete_neighbor_request(n)),
        KernelOp::ReplaceFdb(e) => datagram.push(neighbour::replace_fdb_request(e)),
        KernelOp::DeleteFdb(e) => datagram.push(neighbour::delete_fdb_request(e)),
        _ => {}
    }
}

/// An I/O error: its errno when it has one.
fn io_error(error: &io::Error) -> KernelError {
    match error.raw_os_error() {
        Some(errno) => KernelError::from_errno(errno),
        None => KernelError::other(error.to_string()),
    }
}

/// One part of a dump, read.
enum DumpPart {
    Routes(RouteDump),
    Neighbors(Vec<KernelNeighbor>),
    Fdb(Vec<KernelFdb>),
    Ipsets(Vec<(String, Vec<IpNetwork>)>),
}

impl KernelBackend for NetlinkBackend {
    type Firewall = NftFirewall;

    fn firewall(&mut self) -> &mut NftFirewall {
        &mut self.firewall
    }

    async fn dump_into(
        &mut self,
        ownership: &Ownership,
        sink: &mut dyn DumpSink,
    ) -> Result<(), KernelError> {
        let devices = self.read_links(&ownership.devices).await?;
        let indexes: Vec<u32> = devices.iter().map(|l| l.index).collect();
        sink.devices(devices);
        // All at once, and each handed over as soon as it is read, so that
        // taking one in overlaps the reading of the others. They take the
        // dump sockets in the order they ask for them: the FDB first, whose
        // dump the kernel writes slowest (it walks the device's table from
        // the start for every datagram), then the routes, the largest.
        let this = &*self;
        let indexes = &indexes;
        let mut parts: FuturesUnordered<BoxFuture<'_, Result<DumpPart, KernelError>>> =
            FuturesUnordered::new();
        parts.push(Box::pin(async move {
            this.dump_fdb(indexes).await.map(DumpPart::Fdb)
        }));
        parts.push(Box::pin(async move {
            let (routes, nexthops) = futures::try_join!(this.dump_routes(), this.dump_nexthops())?;
            Ok(DumpPart::Routes(
                ownership.sort_out(indexes, routes, nexthops),
            ))
        }));
        parts.push(Box::pin(async move {
            this.dump_neighbors(indexes).await.map(DumpPart::Neighbors)
        }));
        parts.push(Box::pin(async move {
            this.dump_ipsets(&ownership.ipsets)
                .await
                .map(DumpPart::Ipsets)
        }));
        while let Some(part) = parts.next().await {
            match part? {
                DumpPart::Routes(routes) => sink.routes(routes),
                DumpPart::Neighbors(neighbors) => sink.neighbors(neighbors),
                DumpPart::Fdb(fdb) => sink.fdb(fdb),
                DumpPart::Ipsets(ipsets) => sink.ipsets(ipsets),
            }
        }
        Ok(())
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
        let mut results = vec![Ok(()); ops.len()];
        let (batched, one_by_one) =
            futures::join!(self.apply_batched(ops), self.apply_one_by_one(ops));
        for (index, result) in batched.into_iter().chain(one_by_one) {
            results[index] = result;
        }
        results
    }

    async fn supports_nexthops(&mut self) -> bool {
        self.nexthops_supported().await
    }

    fn watch(&mut self) -> Result<Watch, KernelError> {
        let ports: Vec<u32> = (self.batches.iter())
            .map(|b| b.lock().unwrap_or_else(PoisonError::into_inner).port())
            .collect();
        watch::subscribe(&ports)
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

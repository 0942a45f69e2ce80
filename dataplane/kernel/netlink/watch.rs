//! The kernel's change notifications (what `ip monitor` shows) for links,
//! addresses, routes and neighbours, as `Notification`s, and nftables'
//! changes of the tables vxmgr's firewall rules live in (`nft_watch`).
//! Each is read on a socket of its own and parsed in place.

use std::io;

use rtnetlink::sys::{
    Socket, SocketAddr,
    protocols::{NETLINK_NETFILTER, NETLINK_ROUTE},
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::echo_filter;
use super::neighbour::{Entry, RTM_DELNEIGH, RTM_NEWNEIGH};
use super::nft_watch::{self, NFNLGRP_NFTABLES};
use super::raw::{self, Message};
use super::route::{RTM_DELROUTE, RTM_NEWROUTE, parse_route};
use crate::kernel::KernelError;
use crate::kernel::objects::Notification;
use crate::kernel::watch::Watch;

/// Receive buffer of the notification socket: a burst of route changes
/// (ours echoed back) must not overrun it.
const RECEIVE_BUFFER: usize = 32 << 20;

/// Room for one datagram: a notification is one message, and only a link's
/// (with many SR-IOV VFs) comes near this.
const DATAGRAM_BUFFER: usize = 256 << 10;

// From linux/rtnetlink.h.
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_IFADDR: u32 = 9;
const RTNLGRP_IPV6_ROUTE: u32 = 11;

/// Subscribes, in the calling thread's network namespace, on the current
/// tokio runtime. Without nftables notifications (no nf_tables in the
/// kernel) vxmgr's firewall is repaired at resyncs only. The barrier covers
/// the routing socket: nftables' changes are only ever rechecked, so an old
/// one taken in late misleads nothing. The echoes of the route and
/// neighbour changes sent from `own_ports` are not queued (`echo_filter`).
pub(super) fn subscribe(own_ports: &[u32]) -> Result<Watch, KernelError> {
    const ROUTE_GROUPS: [u32; 6] = [
        RTNLGRP_LINK,
        RTNLGRP_NEIGH,
        RTNLGRP_IPV4_IFADDR,
        RTNLGRP_IPV4_ROUTE,
        RTNLGRP_IPV6_IFADDR,
        RTNLGRP_IPV6_ROUTE,
    ];
    let socket = open(NETLINK_ROUTE, &ROUTE_GROUPS)
        .and_then(|socket| echo_filter::attach(socket.get_ref(), own_ports).map(|()| socket))
        .map_err(|e| KernelError {
            errno: e.raw_os_error(),
            message: format!("subscribing to kernel notifications: {e}"),
        })?;
    let (tx, rx) = mpsc::unbounded_channel();
    let (barriers, barriers_rx) = mpsc::unbounded_channel();
    let routing = Forwarder {
        tx: tx.clone(),
        parse: notifications_in,
        overrun: Notification::Overrun,
    };
    tokio::spawn(routing.run(socket, Some(barriers_rx)));
    match open(NETLINK_NETFILTER, &[NFNLGRP_NFTABLES]) {
        Ok(socket) => {
            let nftables = Forwarder {
                tx,
                parse: nft_watch::notifications_in,
                overrun: Notification::Firewall,
            };
            tokio::spawn(nftables.run(socket, None));
        }
        Err(e) => {
            warn!(error = %e, "no nftables notifications: the firewall rules are repaired at resyncs only");
        }
    }
    Ok(Watch::new(rx, Some(barriers)))
}

fn open(protocol: isize, groups: &[u32]) -> io::Result<AsyncFd<Socket>> {
    let mut socket = Socket::new(protocol)?;
    socket.bind(&SocketAddr::new(0, 0))?;
    for group in groups {
        socket.add_membership(*group)?;
    }
    super::socket::raise_receive_buffer(&mut socket, RECEIVE_BUFFER)?;
    socket.set_non_blocking(true)?;
    // SAFETY: the socket owns its descriptor and closes it only when
    // dropped, and the AsyncFd owns the socket: the descriptor stays open
    // and the same for as long as it is registered.
    unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE) }.map_err(io::Error::from)
}

/// The notifications in one datagram.
type Parser = for<'a> fn(&'a [u8]) -> Box<dyn Iterator<Item = Notification> + 'a>;

/// A barrier's answer: sent once what the socket held is queued.
type Barrier = oneshot::Sender<()>;

/// Moves one socket's notifications into the queue.
struct Forwarder {
    tx: mpsc::UnboundedSender<Notification>,
    parse: Parser,
    /// What a lost notification is reported as.
    overrun: Notification,
}

impl Forwarder {
    /// Reads notifications until the receiver goes away or the socket
    /// fails. A barrier is answered after the socket has been read empty:
    /// the kernel queues a change's notification before it acknowledges the
    /// change, so everything sent before the barrier is queued by then.
    async fn run(
        self,
        socket: AsyncFd<Socket>,
        mut barriers: Option<mpsc::UnboundedReceiver<Barrier>>,
    ) {
        let mut buffer = Vec::with_capacity(DATAGRAM_BUFFER);
        loop {
            let barrier = tokio::select! {
                ready = socket.readable() => match ready {
                    // Cleared before reading to empty: what arrives after
                    // the last read sets it again.
                    Ok(mut ready) => {
                        ready.clear_ready();
                        None
                    }
                    Err(e) => {
                        warn!(error = %e, "waiting for kernel notifications failed");
                        return;
                    }
                },
                barrier = next_barrier(&mut barriers) => match barrier {
                    Some(barrier) => Some(barrier),
                    None => {
                        barriers = None;
                        continue;
                    }
                },
            };
            if !self.read_to_empty(&socket, &mut buffer) {
                return;
            }
            if let Some(barrier) = barrier {
                let _ = barrier.send(());
            }
        }
    }

    /// Queues every datagram the socket holds; false once the receiver is
    /// gone or the socket has failed. Lost notifications are queued as the
    /// overrun.
    fn read_to_empty(&self, socket: &AsyncFd<Socket>, buffer: &mut Vec<u8>) -> bool {
        let send = |n| self.tx.send(n).is_ok();
        loop {
            buffer.clear();
            // MSG_TRUNC: the datagram's whole length, even if it did not fit.
            let open = match socket.get_ref().recv(buffer, libc::MSG_TRUNC) {
                // A datagram that did not fit is lost, as in an overrun.
                Ok(len) if len > buffer.capacity() => send(self.overrun.clone()),
                Ok(_) => (self.parse)(buffer).all(send),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => send(self.overrun.clone()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
                Err(e) => {
                    warn!(error = %e, "reading kernel notifications failed");
                    false
                }
            };
            if !open {
                return false;
            }
        }
    }
}

/// The next barrier; `None` when there are none to wait for (never, or no
/// longer: the watch was dropped), and then never again.
async fn next_barrier(barriers: &mut Option<mpsc::UnboundedReceiver<Barrier>>) -> Option<Barrier> {
    match barriers {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The notifications in one datagram. Messages of other kinds are
/// skipped; a message whose framing is broken takes the rest of the
/// datagram with it, which is lost as in an overrun.
fn notifications_in(datagram: &[u8]) -> Box<dyn Iterator<Item = Notification> + '_> {
    let mut broken = false;
    let notifications = raw::messages(datagram)
        .map_while(move |message| match message {
            _ if broken => None,
            Ok(message) => Some(notification(message)),
            Err(_) => {
                broken = true;
                Some(Some(Notification::Overrun))
            }
        })
        .flatten();
    Box::new(notifications)
}

fn notification(message: Message<'_>) -> Option<Notification> {
    Some(match message.kind {
        RTM_NEWROUTE => Notification::Route(parse_route(message.payload)?),
        RTM_DELROUTE => Notification::RouteGone(parse_route(message.payload)?),
        RTM_NEWNEIGH => neighbour(&Entry::parse(message.payload)?, false)?,
        RTM_DELNEIGH => neighbour(&Entry::parse(message.payload)?, true)?,
        RTM_NEWLINK => link(message.payload)?,
        RTM_DELLINK | RTM_NEWADDR | RTM_DELADDR => Notification::Links,
        _ => return None,
    })
}

/// A link set down, or another link change, from the struct ifinfomsg
/// that starts the message (family, pad, type, index, flags, change).
/// Only a change of IFF_UP to down counts: a new link (all flags changed)
/// starts down too, and vxmgr's own new devices must not look downed.
fn link(payload: &[u8]) -> Option<Notification> {
    let field = |at: usize| Some(u32::from_ne_bytes(*payload.get(at..at + 4)?.first_chunk()?));
    let (index, flags, change) = (field(4)?, field(8)?, field(12)?);
    let up = libc::IFF_UP as u32;
    Some(
        if flags & up == 0 && change & up != 0 && change != u32::MAX {
            Notification::LinkDown { index }
        } else {
            Notification::Links
        },
    )
}

/// An entry that stops being permanent is gone as far as vxmgr is concerned.
fn neighbour(entry: &Entry, deleted: bool) -> Option<Notification> {
    let present = !deleted && entry.is_permanent();
    if let Some(fdb) = entry.fdb().filter(|_| present) {
        return Some(Notification::Fdb(fdb));
    }
    if let Some(neighbor) = entry.neighbor().filter(|_| present) {
        return Some(Notification::Neighbor(neighbor));
    }
    if entry.is_fdb() {
        return Some(Notification::FdbGone {
            ifindex: entry.ifindex,
            mac: entry.mac?,
        });
    }
    Some(Notification::NeighborGone {
        ifindex: entry.ifindex,
        address: entry.address?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::raw::build::message;
    use super::*;

    /// struct ifinfomsg: family, pad, type, index, flags, change.
    fn ifinfomsg(index: u32, flags: u32, change: u32) -> Vec<u8> {
        let mut payload = vec![0u8; 4];
        payload.extend(index.to_ne_bytes());
        payload.extend(flags.to_ne_bytes());
        payload.extend(change.to_ne_bytes());
        payload
    }

    fn parsed(datagram: &[u8]) -> Vec<Notification> {
        notifications_in(datagram).collect()
    }

    #[test]
    fn only_a_link_set_down_is_told_apart() {
        let (up, broadcast) = (libc::IFF_UP as u32, libc::IFF_BROADCAST as u32);
        let messages = [
            // `ip link set down`, then up.
            (RTM_NEWLINK, ifinfomsg(7, broadcast, up)),
            (RTM_NEWLINK, ifinfomsg(7, broadcast | up, up)),
            // A new link, down; another change of a down link; a deletion.
            (RTM_NEWLINK, ifinfomsg(8, broadcast, u32::MAX)),
            (RTM_NEWLINK, ifinfomsg(8, broadcast, 0)),
            (RTM_DELLINK, ifinfomsg(9, 0, u32::MAX)),
        ];
        let datagram: Vec<u8> = messages
            .iter()
            .flat_map(|(kind, payload)| message(*kind, 0, 0, payload))
            .collect();
        let mut expected = vec![Notification::Links; 5];
        expected[0] = Notification::LinkDown { index: 7 };
        assert_eq!(parsed(&datagram), expected);
    }

    #[test]
    fn a_short_link_message_is_skipped() {
        let datagram = message(RTM_NEWLINK, 0, 0, &[0; 8]);
        assert_eq!(parsed(&datagram), []);
    }

    #[test]
    fn a_broken_message_loses_the_rest_of_its_datagram_as_an_overrun() {
        let down = ifinfomsg(7, 0, libc::IFF_UP as u32);
        let mut datagram = message(RTM_NEWLINK, 0, 0, &down);
        let second = message(RTM_NEWLINK, 0, 0, &down);
        // The second message's header claims more bytes than follow.
        datagram.extend(&second[..second.len() - 4]);
        assert_eq!(
            parsed(&datagram),
            [Notification::LinkDown { index: 7 }, Notification::Overrun]
        );
    }
}

//! The kernel's change notifications (what `ip monitor` shows) for links,
//! addresses, routes and neighbours, as `Notification`s.

use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::neighbour::NeighbourMessage;
use rtnetlink::MulticastGroup;
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::sys::AsyncSocket;
use tokio::sync::mpsc;
use tracing::warn;

use super::neighbour::{address_of, is_permanent, mac_of, parse_fdb, parse_neighbor};
use super::route::parse_route;
use crate::kernel::objects::Notification;
use crate::kernel::{KernelError, NOTIFICATION_BUFFER};

/// Receive buffer of the notification socket: a burst of route changes
/// (ours echoed back) must not overrun it.
const RECEIVE_BUFFER: usize = 32 << 20;

/// Subscribes, in the calling thread's network namespace, on the current
/// tokio runtime.
pub(super) fn subscribe() -> Result<mpsc::Receiver<Notification>, KernelError> {
    let opened = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
        MulticastGroup::Ipv4Route,
        MulticastGroup::Ipv6Route,
        MulticastGroup::Neigh,
    ])
    .and_then(|(mut connection, _, messages)| {
        super::socket::raise_receive_buffer(connection.socket_mut().socket_mut(), RECEIVE_BUFFER)?;
        Ok((connection, messages))
    });
    let (connection, mut messages) = opened.map_err(|e| KernelError {
        errno: e.raw_os_error(),
        message: format!("subscribing to kernel notifications: {e}"),
    })?;
    tokio::spawn(connection);
    let (tx, rx) = mpsc::channel(NOTIFICATION_BUFFER);
    tokio::spawn(async move {
        let mut overrun = false;
        while let Some((message, _)) = messages.next().await {
            let notification = match message.payload {
                NetlinkPayload::InnerMessage(m) => match notification(m) {
                    Some(n) => n,
                    None => continue,
                },
                NetlinkPayload::Overrun(_) => Notification::Overrun,
                _ => continue,
            };
            // A reader that falls behind gets one overrun, then resyncs.
            if overrun {
                if tx.try_send(Notification::Overrun).is_ok() {
                    overrun = false;
                }
                continue;
            }
            match tx.try_send(notification) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    warn!("kernel notifications arrive faster than they are handled");
                    overrun = true;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
    });
    Ok(rx)
}

fn notification(message: RouteNetlinkMessage) -> Option<Notification> {
    Some(match message {
        RouteNetlinkMessage::NewRoute(m) => Notification::Route(parse_route(&m)?),
        RouteNetlinkMessage::DelRoute(m) => Notification::RouteGone(parse_route(&m)?),
        RouteNetlinkMessage::NewNeighbour(m) => neighbour(&m, false)?,
        RouteNetlinkMessage::DelNeighbour(m) => neighbour(&m, true)?,
        RouteNetlinkMessage::NewLink(_)
        | RouteNetlinkMessage::DelLink(_)
        | RouteNetlinkMessage::NewAddress(_)
        | RouteNetlinkMessage::DelAddress(_) => Notification::Links,
        _ => return None,
    })
}

/// An entry that stops being permanent is gone as far as vxmgr is concerned.
fn neighbour(message: &NeighbourMessage, deleted: bool) -> Option<Notification> {
    let present = !deleted && is_permanent(message);
    let ifindex = message.header.ifindex;
    if let Some(entry) = parse_fdb(message).filter(|_| present) {
        return Some(Notification::Fdb(entry));
    }
    if let Some(neighbor) = parse_neighbor(message).filter(|_| present) {
        return Some(Notification::Neighbor(neighbor));
    }
    if message.header.family == netlink_packet_route::AddressFamily::Bridge {
        return Some(Notification::FdbGone {
            ifindex,
            mac: mac_of(message)?,
        });
    }
    Some(Notification::NeighborGone {
        ifindex,
        address: address_of(message)?,
    })
}

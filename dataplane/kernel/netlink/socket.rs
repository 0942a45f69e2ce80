//! One netlink connection (NETLINK_ROUTE, or NETLINK_NETFILTER for ipsets)
//! for any message type: requests answered by an ACK (or a reply, then an
//! ACK) and dumps. Every answer must come within
//! a bound, and kernel refusals become `KernelError`s carrying the errno and
//! the kernel's extended-ACK text.

use std::fmt::Debug;
use std::io;
use std::pin::pin;
use std::time::Duration;

use futures::StreamExt;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable,
};
use rtnetlink::proto::ConnectionHandle;
use rtnetlink::sys::{
    AsyncSocket, Socket, SocketAddr,
    protocols::{NETLINK_NETFILTER, NETLINK_ROUTE},
};
use tokio::sync::Mutex;
use tracing::debug;

use super::{io_error, raw};
use crate::kernel::KernelError;

/// How long the kernel may take to send the next message of an answer.
/// Answers only go missing when a reply cannot be decoded; this turns that
/// into an error instead of a hang.
pub(super) const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Receive buffer of every socket. With hundreds of requests in flight the
/// kernel queues their ACKs faster than they are read, and an ACK that finds
/// the buffer full is dropped.
const RECEIVE_BUFFER: usize = 8 << 20;

/// `NLMSGERR_ATTR_MSG`: the kernel's explanation in an extended ACK.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// Length of the request header echoed in an ACK (`NETLINK_CAP_ACK` keeps
/// the kernel from echoing the whole request).
const ECHOED_HEADER_LEN: usize = 16;

/// A blocking NETLINK_ROUTE socket whose answers vxmgr reads itself:
/// refusals explained (extended ACKs), ACKs without the echoed request,
/// and a receive timeout, so that a kernel that stops answering becomes an
/// error, not a hung thread.
pub(super) fn blocking_route_socket() -> io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.set_ext_ack(true)?;
    socket.set_cap_ack(true)?;
    let timeout = TimeVal::seconds(REPLY_TIMEOUT.as_secs() as i64);
    setsockopt(&socket, sockopt::ReceiveTimeout, &timeout)?;
    Ok(socket)
}

/// Sets a socket's receive buffer: root may exceed net.core.rmem_max,
/// others get what it allows.
pub(super) fn raise_receive_buffer(
    socket: &mut rtnetlink::sys::Socket,
    bytes: usize,
) -> io::Result<()> {
    if let Err(e) = setsockopt(&*socket, sockopt::RcvBufForce, &bytes) {
        debug!(error = %e, "SO_RCVBUFFORCE refused, asking for SO_RCVBUF");
        socket.set_rx_buf_sz(bytes)?;
    }
    Ok(())
}

pub(super) struct NetlinkSocket<T: Debug> {
    handle: ConnectionHandle<T>,
    /// The kernel runs one dump at a time per socket (EBUSY otherwise).
    dumping: Mutex<()>,
}

/// How a socket treats dump requests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum DumpFilters {
    /// The kernel ignores dump filters in request headers.
    Ignored,
    /// `NETLINK_GET_STRICT_CHK`: the kernel filters dumps by the request's
    /// header and attributes.
    Strict,
}

impl<T> NetlinkSocket<T>
where
    T: Debug + NetlinkSerializable + NetlinkDeserializable + Unpin + Send + 'static,
{
    /// Opens a NETLINK_ROUTE socket and runs its connection on the current
    /// tokio runtime, in the network namespace of the calling thread.
    pub fn open(filters: DumpFilters) -> io::Result<NetlinkSocket<T>> {
        NetlinkSocket::open_protocol(NETLINK_ROUTE, filters)
    }

    /// The same for a NETLINK_NETFILTER socket, whose dumps are unfiltered.
    pub fn open_netfilter() -> io::Result<NetlinkSocket<T>> {
        NetlinkSocket::open_protocol(NETLINK_NETFILTER, DumpFilters::Ignored)
    }

    fn open_protocol(protocol: isize, filters: DumpFilters) -> io::Result<NetlinkSocket<T>> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let (mut connection, handle, _) = rtnetlink::proto::new_connection::<T>(protocol)?;
        let socket = connection.socket_mut().socket_mut();
        socket.set_ext_ack(true)?;
        socket.set_cap_ack(true)?;
        if filters == DumpFilters::Strict {
            socket.set_netlink_get_strict_chk(true)?;
        }
        raise_receive_buffer(socket, RECEIVE_BUFFER)?;
        // Without ACKs and DONEs a request whose connection died would look
        // like one that succeeded.
        connection.set_forward_ack(true);
        connection.set_forward_done(true);
        runtime.spawn(connection);
        Ok(NetlinkSocket {
            handle,
            dumping: Mutex::new(()),
        })
    }

    /// Sends a request and waits for its ACK; returns the replies before it.
    pub async fn request(&self, message: T, flags: u16) -> Result<Vec<T>, KernelError> {
        self.exchange(message, NLM_F_REQUEST | NLM_F_ACK | flags)
            .await
    }

    /// Dumps the objects `message` asks for.
    pub async fn dump(&self, message: T) -> Result<Vec<T>, KernelError> {
        let _one_at_a_time = self.dumping.lock().await;
        self.exchange(message, NLM_F_REQUEST | NLM_F_DUMP).await
    }

    async fn exchange(&self, message: T, flags: u16) -> Result<Vec<T>, KernelError> {
        let mut request = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::InnerMessage(message),
        );
        request.header.flags = flags;
        let replies = self
            .handle
            .request(request, SocketAddr::new(0, 0))
            .map_err(|e| KernelError::other(format!("netlink connection closed: {e}")))?;
        let mut replies = pin!(replies);
        let mut messages = Vec::new();
        loop {
            let reply = tokio::time::timeout(REPLY_TIMEOUT, replies.next())
                .await
                .map_err(|_| KernelError::other("no answer from the kernel"))?;
            match reply.map(|r| r.payload) {
                Some(NetlinkPayload::InnerMessage(m)) => messages.push(m),
                Some(NetlinkPayload::Error(e)) => {
                    return match e.code {
                        None => Ok(messages),
                        Some(code) => Err(refusal(
                            -code.get(),
                            e.header.get(ECHOED_HEADER_LEN..).unwrap_or_default(),
                        )),
                    };
                }
                Some(NetlinkPayload::Done(done)) => {
                    return match done.code {
                        0 => Ok(messages),
                        code => Err(refusal(-code, &done.extended_ack)),
                    };
                }
                Some(NetlinkPayload::Overrun(_)) => {
                    return Err(KernelError::from_errno(libc::ENOBUFS));
                }
                Some(_) => {}
                None => return Err(KernelError::other("netlink connection closed")),
            }
        }
    }
}

/// Reads the next datagram into `buffer`.
pub(super) fn receive(socket: &Socket, buffer: &mut Vec<u8>) -> Result<(), KernelError> {
    loop {
        buffer.clear();
        // MSG_TRUNC: the datagram's whole length, even if it did not fit.
        match socket.recv(buffer, libc::MSG_TRUNC) {
            Ok(len) if len > buffer.capacity() => {
                return Err(KernelError::other(format!(
                    "a {len}-byte netlink datagram does not fit the {}-byte buffer",
                    buffer.capacity()
                )));
            }
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(KernelError::other("no answer from the kernel"));
            }
            Err(e) => return Err(io_error(&e)),
        }
    }
}

/// A kernel refusal: errno, and the extended-ACK message when there is one.
pub(super) fn refusal(errno: i32, ack_attributes: &[u8]) -> KernelError {
    let mut error = KernelError::from_errno(errno);
    if let Some(text) = extack_message(ack_attributes) {
        error.message = format!("{} ({text})", error.message);
    }
    error
}

fn extack_message(attributes: &[u8]) -> Option<String> {
    raw::attributes(attributes)
        .map_while(Result::ok)
        .find(|(kind, _)| *kind == NLMSGERR_ATTR_MSG)
        .map(|(_, text)| {
            String::from_utf8_lossy(text)
                .trim_end_matches('\0')
                .to_string()
        })
        .filter(|text| !text.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_carries_errno_and_extack_text() {
        // NLMSGERR_ATTR_MSG "Cannot change VNI\0", then NLMSGERR_ATTR_OFFS.
        let mut attributes = vec![22, 0, 1, 0];
        attributes.extend_from_slice(b"Cannot change VNI\0");
        attributes.extend_from_slice(&[0, 0]);
        attributes.extend_from_slice(&[8, 0, 2, 0, 40, 0, 0, 0]);
        let error = refusal(libc::EOPNOTSUPP, &attributes);
        assert_eq!(error.errno, Some(libc::EOPNOTSUPP));
        assert!(
            error.message.ends_with("(Cannot change VNI)"),
            "{}",
            error.message
        );
    }

    #[test]
    fn refusal_without_extack_is_the_errno_text() {
        assert_eq!(
            refusal(libc::ENODEV, &[]),
            KernelError::from_errno(libc::ENODEV)
        );
    }
}

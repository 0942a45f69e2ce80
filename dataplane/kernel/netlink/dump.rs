//! Dumps of many objects (routes, neighbours, FDB entries, nexthops): read
//! on sockets of their own, a datagram at a time into a buffer that lives
//! with the socket, and parsed in place into vxmgr's kernel objects.
//!
//! Each dump runs on a blocking thread, so that it never holds up a tokio
//! worker, and several run at once: the kernel writes a dump's messages in
//! the thread that reads them, so parallel readers use parallel CPUs.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use rtnetlink::packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use rtnetlink::sys::Socket;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::debug;

use super::io_error;
use super::raw::{self, Message, NLM_F_DUMP_INTR, NLMSG_DONE, NLMSG_ERROR};
use super::socket::{blocking_route_socket, receive, refusal};
use crate::kernel::KernelError;

/// Dumps that run at once. A resync's dumps are two of all our routes (by
/// protocol, and through the device) next to several smaller ones: three
/// readers keep two CPUs busy without one large dump waiting for a free
/// socket behind the small ones.
const SOCKETS: usize = 3;

/// Room for one datagram. The kernel writes a dump in datagrams of at most
/// 32 KiB however large the reader's buffer (32,269 bytes of routes per
/// datagram with a 1 MiB buffer); one that does not fit is an error rather
/// than a silently truncated answer.
const BUFFER: usize = 64 << 10;

/// A dump that the kernel flags as interrupted by changes is read again,
/// up to this many times in all.
const ATTEMPTS: u32 = 10;

/// Sockets for dumps, each with its receive buffer.
pub(super) struct Dumps {
    idle: Arc<Mutex<Vec<DumpSocket>>>,
    /// One permit per idle socket.
    free: Arc<Semaphore>,
}

impl Dumps {
    /// Opens the sockets in the calling thread's network namespace; the
    /// threads that later read them may be in any.
    pub fn open() -> io::Result<Dumps> {
        let sockets = (0..SOCKETS)
            .map(|_| DumpSocket::open())
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Dumps {
            idle: Arc::new(Mutex::new(sockets)),
            free: Arc::new(Semaphore::new(SOCKETS)),
        })
    }

    /// Sends `request` as a dump and keeps what `parse` makes of each
    /// message of the answer.
    pub async fn dump<T, P>(
        &self,
        request: impl NetlinkSerializable,
        parse: P,
    ) -> Result<Vec<T>, KernelError>
    where
        T: Send + 'static,
        P: FnMut(Message<'_>) -> Option<T> + Send + 'static,
    {
        let request = encode(request);
        let permit = Arc::clone(&self.free)
            .acquire_owned()
            .await
            .map_err(|_| KernelError::other("dump sockets closed"))?;
        let mut lease = Lease::take(&self.idle, permit);
        tokio::task::spawn_blocking(move || lease.socket().dump(request, parse))
            .await
            .map_err(|e| KernelError::other(format!("dump thread: {e}")))?
    }
}

/// A socket taken from the idle ones; it goes back when the lease is
/// dropped, however the dump ended, before its permit is released.
struct Lease {
    socket: Option<DumpSocket>,
    idle: Arc<Mutex<Vec<DumpSocket>>>,
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    fn take(idle: &Arc<Mutex<Vec<DumpSocket>>>, permit: OwnedSemaphorePermit) -> Lease {
        let socket = idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        Lease {
            socket,
            idle: Arc::clone(idle),
            _permit: permit,
        }
    }

    fn socket(&mut self) -> &mut DumpSocket {
        self.socket
            .as_mut()
            .expect("a permit is only granted with an idle socket")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(socket) = self.socket.take() {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            idle.push(socket);
        }
    }
}

struct DumpSocket {
    socket: Socket,
    buffer: Vec<u8>,
    /// Sequence number of the last request: the answer carries it, which
    /// tells it from what is left of an earlier dump that ended in an error.
    seq: u32,
}

impl DumpSocket {
    fn open() -> io::Result<DumpSocket> {
        let socket = blocking_route_socket()?;
        // The kernel filters dumps by the request's header and attributes.
        socket.set_netlink_get_strict_chk(true)?;
        Ok(DumpSocket {
            socket,
            buffer: Vec::with_capacity(BUFFER),
            seq: 0,
        })
    }

    fn dump<T>(
        &mut self,
        mut request: Vec<u8>,
        mut parse: impl FnMut(Message<'_>) -> Option<T>,
    ) -> Result<Vec<T>, KernelError> {
        until_complete(|| {
            self.seq = self.seq.wrapping_add(1);
            request[8..12].copy_from_slice(&self.seq.to_ne_bytes());
            self.socket.send(&request, 0).map_err(|e| io_error(&e))?;
            let socket = &self.socket;
            read_answer(
                |buffer| receive(socket, buffer),
                &mut self.buffer,
                self.seq,
                &mut parse,
            )
        })
    }
}

/// Runs `dump` until it is not interrupted, `ATTEMPTS` times at most.
fn until_complete<T>(
    mut dump: impl FnMut() -> Result<Option<Vec<T>>, KernelError>,
) -> Result<Vec<T>, KernelError> {
    for _ in 0..ATTEMPTS {
        match dump()? {
            Some(objects) => return Ok(objects),
            None => debug!("a dump was interrupted by changes: reading it again"),
        }
    }
    Err(KernelError::other(format!(
        "{ATTEMPTS} dumps in a row were interrupted by changes"
    )))
}

/// The request as bytes, its sequence number to be filled in.
fn encode(message: impl NetlinkSerializable) -> Vec<u8> {
    let mut request = NetlinkMessage::new(
        NetlinkHeader::default(),
        NetlinkPayload::InnerMessage(message),
    );
    request.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);
    bytes
}

/// Reads the answer to the dump numbered `seq` up to its NLMSG_DONE (or
/// NLMSG_ERROR): the objects parsed, or `None` if the kernel flagged the
/// dump as interrupted.
fn read_answer<T>(
    mut receive: impl FnMut(&mut Vec<u8>) -> Result<(), KernelError>,
    buffer: &mut Vec<u8>,
    seq: u32,
    parse: &mut impl FnMut(Message<'_>) -> Option<T>,
) -> Result<Option<Vec<T>>, KernelError> {
    let mut objects = Vec::new();
    let mut interrupted = false;
    loop {
        receive(buffer)?;
        for message in raw::messages(buffer) {
            let message =
                message.map_err(|_| KernelError::other("a malformed netlink message in a dump"))?;
            if message.seq != seq {
                continue;
            }
            interrupted |= message.flags & NLM_F_DUMP_INTR != 0;
            if matches!(message.kind, NLMSG_DONE | NLMSG_ERROR) {
                let (code, extended_ack) = message
                    .status()
                    .map_err(|_| KernelError::other("a malformed end of a dump"))?;
                return match code {
                    0 if interrupted => Ok(None),
                    0 => Ok(Some(objects)),
                    _ => Err(refusal(-code, extended_ack)),
                };
            }
            // The rest of an interrupted dump is read only to reach its end.
            if !interrupted {
                objects.extend(parse(message));
            }
        }
    }
}

// The integration tests' rule for tests that need what may be missing.
#[cfg(test)]
#[path = "../../../tests/support/require.rs"]
#[allow(dead_code)]
mod require;

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::raw::build::{message, replies};
    use super::*;

    const NEW: u16 = 24;
    const MULTI: u16 = 2;

    /// Reads `datagrams` as the kernel's answer to dump 7; messages of type
    /// NEW parse to their first payload byte.
    fn answer(datagrams: Vec<Vec<u8>>) -> Result<Option<Vec<u8>>, KernelError> {
        let mut parse = |m: Message<'_>| m.of_type(NEW).map(|p| p[0]);
        read_answer(replies(datagrams.into()), &mut Vec::new(), 7, &mut parse)
    }

    fn done(flags: u16, code: i32) -> Vec<u8> {
        message(NLMSG_DONE, flags, 7, &code.to_ne_bytes())
    }

    #[test]
    fn a_multipart_answer_is_read_to_its_done() {
        let mut first = message(NEW, MULTI, 7, &[1]);
        first.extend(message(NEW, MULTI, 7, &[2]));
        let mut second = message(NEW, MULTI, 7, &[3]);
        second.extend(done(MULTI, 0));
        assert_eq!(answer(vec![first, second]), Ok(Some(vec![1, 2, 3])));
    }

    #[test]
    fn messages_of_an_earlier_dump_are_skipped() {
        let mut datagram = message(NEW, MULTI, 6, &[9]);
        datagram.extend(message(NLMSG_DONE, MULTI, 6, &0i32.to_ne_bytes()));
        datagram.extend(message(NEW, MULTI, 7, &[1]));
        datagram.extend(done(MULTI, 0));
        assert_eq!(answer(vec![datagram]), Ok(Some(vec![1])));
    }

    #[test]
    fn a_done_with_an_error_is_the_kernels_refusal() {
        let mut datagram = message(NEW, MULTI, 7, &[1]);
        datagram.extend(done(MULTI, -libc::EMSGSIZE));
        assert_eq!(
            answer(vec![datagram]),
            Err(KernelError::from_errno(libc::EMSGSIZE))
        );
    }

    #[test]
    fn an_error_instead_of_an_answer_is_the_kernels_refusal() {
        let mut error = (-libc::EINVAL).to_ne_bytes().to_vec();
        error.extend(message(26, 0x301, 7, &[0; 12]));
        let datagram = message(NLMSG_ERROR, 0, 7, &error);
        assert_eq!(
            answer(vec![datagram]),
            Err(KernelError::from_errno(libc::EINVAL))
        );
    }

    #[test]
    fn an_interrupted_dump_is_read_to_its_end_and_reported() {
        let first = message(NEW, MULTI, 7, &[1]);
        let mut second = message(NEW, MULTI | NLM_F_DUMP_INTR, 7, &[2]);
        second.extend(message(NEW, MULTI, 7, &[3]));
        let third = done(MULTI, 0);
        assert_eq!(answer(vec![first, second, third]), Ok(None));
        // The flag may come on the NLMSG_DONE alone.
        let datagram = done(MULTI | NLM_F_DUMP_INTR, 0);
        assert_eq!(
            answer(vec![message(NEW, MULTI, 7, &[1]), datagram]),
            Ok(None)
        );
    }

    #[test]
    fn an_interrupted_dump_is_read_again() {
        let mut answers = VecDeque::from([Ok(None), Ok(None), Ok(Some(vec![1]))]);
        assert_eq!(until_complete(|| answers.pop_front().unwrap()), Ok(vec![1]));
        let mut failing = VecDeque::from([Ok(None), Err(KernelError::from_errno(libc::EIO))]);
        assert_eq!(
            until_complete(|| failing.pop_front().unwrap()),
            Err::<Vec<u8>, _>(KernelError::from_errno(libc::EIO))
        );
        let mut calls = 0;
        let endless = until_complete(|| {
            calls += 1;
            Ok(None::<Vec<u8>>)
        });
        assert!(endless.is_err());
        assert_eq!(calls, ATTEMPTS);
    }

    #[test]
    fn a_real_dump_reads_the_link_table() {
        // Links can be dumped without privileges, in any namespace.
        let mut socket = match DumpSocket::open() {
            Ok(socket) => socket,
            Err(e) => {
                let why = format!("needs a netlink socket: {e}");
                super::require::skip("a_real_dump_reads_the_link_table", "NETNS", &why);
                return;
            }
        };
        const RTM_NEWLINK: u16 = 16;
        let links = socket.dump(
            encode(netlink_packet_route::RouteNetlinkMessage::GetLink(
                Default::default(),
            )),
            |m| m.of_type(RTM_NEWLINK).map(drop),
        );
        assert!(links.is_ok_and(|links| !links.is_empty()));
        assert_eq!(socket.seq, 1);
    }

    #[test]
    fn a_malformed_datagram_is_an_error() {
        let mut datagram = message(NEW, MULTI, 7, &[1, 2, 3, 4]);
        datagram.truncate(18);
        assert!(answer(vec![datagram]).is_err());
    }
}

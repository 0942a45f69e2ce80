//! Changes sent many to a system call. Requests that do not depend on one
//! another go back to back into one datagram, and only the last of each
//! datagram asks for an ACK: the kernel handles a datagram's requests in
//! order, answers one it refuses with an error carrying that request's
//! sequence number, and answers the last one after all the others. So every
//! refusal is still its own object's, and the system calls and ACKs are a
//! few per hundred changes instead of two per change.
//!
//! The socket is blocking and used on a blocking thread: the kernel makes
//! the changes in the thread that sends them, and the tokio thread that
//! hands them over goes on reading the notifications they cause.

use std::io;
use std::ops::Range;

use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use rtnetlink::sys::{Socket, SocketAddr};

use super::io_error;
use super::raw::{self, NLMSG_ERROR};
use super::socket::{blocking_route_socket, raise_receive_buffer, receive, refusal};
use crate::kernel::KernelError;

/// Requests per datagram: enough to make the system calls few; the kernel
/// holds its lock for one request at a time whatever the datagram.
pub(super) const REQUESTS_PER_DATAGRAM: usize = 256;

/// Room for the answers to one datagram: at most one per request, each a
/// few hundred bytes with the kernel's explanation.
const RECEIVE_BUFFER: usize = 4 << 20;

/// Room for one answer.
const ANSWER_BUFFER: usize = 64 << 10;

/// Offset and length of the header fields a datagram's requests get when
/// they are sent.
const FLAGS: Range<usize> = 6..8;
const SEQ: Range<usize> = 8..12;

/// Requests written back to back, to be sent as one datagram.
#[derive(Default)]
pub(super) struct Datagram {
    bytes: Vec<u8>,
    /// Where each request starts.
    starts: Vec<usize>,
}

impl Datagram {
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Appends a request with these flags (besides NLM_F_REQUEST).
    pub fn push(&mut self, (message, flags): (impl NetlinkSerializable, u16)) {
        let mut request = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::InnerMessage(message),
        );
        request.header.flags = NLM_F_REQUEST | flags;
        request.finalize();
        let start = self.bytes.len();
        self.bytes.resize(start + request.buffer_len(), 0);
        request.serialize(&mut self.bytes[start..]);
        // Each message starts on a 4-byte boundary.
        self.bytes.resize(self.bytes.len().next_multiple_of(4), 0);
        self.starts.push(start);
    }

    /// Numbers the requests from `first` and asks for the last one's ACK.
    fn number(&mut self, first: u32) {
        for (i, &start) in self.starts.iter().enumerate() {
            let seq = first.wrapping_add(i as u32);
            self.bytes[start + SEQ.start..start + SEQ.end].copy_from_slice(&seq.to_ne_bytes());
        }
        if let Some(&last) = self.starts.last() {
            let at = last + FLAGS.start..last + FLAGS.end;
            let flags = u16::from_ne_bytes([self.bytes[at.start], self.bytes[at.start + 1]]);
            self.bytes[at].copy_from_slice(&(flags | NLM_F_ACK).to_ne_bytes());
        }
    }
}

pub(super) struct BatchSocket {
    socket: Socket,
    /// The socket's netlink port id: the kernel's notifications of its
    /// changes carry it.
    port: u32,
    buffer: Vec<u8>,
    /// Sequence number of the next request.
    seq: u32,
}

impl BatchSocket {
    pub fn open() -> io::Result<BatchSocket> {
        let mut socket = blocking_route_socket()?;
        raise_receive_buffer(&mut socket, RECEIVE_BUFFER)?;
        let mut address = SocketAddr::new(0, 0);
        socket.get_address(&mut address)?;
        Ok(BatchSocket {
            socket,
            port: address.port_number(),
            buffer: Vec::with_capacity(ANSWER_BUFFER),
            seq: 1,
        })
    }

    pub fn port(&self) -> u32 {
        self.port
    }

    /// Sends the datagram's requests; one result per request, in order.
    pub fn send(&mut self, mut datagram: Datagram) -> Vec<Result<(), KernelError>> {
        let count = datagram.len();
        let first = self.seq;
        self.seq = self.seq.wrapping_add(count as u32);
        datagram.number(first);
        if let Err(e) = send(&self.socket, &datagram.bytes) {
            return vec![Err(e); count];
        }
        let socket = &self.socket;
        read_answers(
            |buffer| receive(socket, buffer),
            &mut self.buffer,
            first,
            count,
        )
    }
}

fn send(socket: &Socket, bytes: &[u8]) -> Result<(), KernelError> {
    loop {
        match socket.send(bytes, 0) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(&e)),
        }
    }
}

/// Reads the answers to `count` requests numbered from `first`, up to the
/// last one's: the refused ones get their errors, the others succeeded.
/// If reading fails, the requests not yet answered fail with that error.
fn read_answers(
    mut receive: impl FnMut(&mut Vec<u8>) -> Result<(), KernelError>,
    buffer: &mut Vec<u8>,
    first: u32,
    count: usize,
) -> Vec<Result<(), KernelError>> {
    let mut results: Vec<Option<Result<(), KernelError>>> = vec![None; count];
    let last = count.saturating_sub(1);
    // The requests before the latest one answered have all been handled.
    let mut handled = 0;
    while count > 0 && results[last].is_none() {
        if let Err(e) = receive(buffer) {
            return results
                .into_iter()
                .enumerate()
                .map(|(i, r)| {
                    r.unwrap_or_else(|| if i < handled { Ok(()) } else { Err(e.clone()) })
                })
                .collect();
        }
        for message in raw::messages(buffer).map_while(Result::ok) {
            // Answers to earlier datagrams that gave up waiting are skipped.
            let index = message.seq.wrapping_sub(first) as usize;
            if message.kind != NLMSG_ERROR || index >= count {
                continue;
            }
            let result = match message.status() {
                Ok((0, _)) => Ok(()),
                Ok((code, extended_ack)) => Err(refusal(-code, extended_ack)),
                Err(_) => Err(KernelError::other("a malformed answer from the kernel")),
            };
            results[index] = Some(result);
            handled = handled.max(index);
        }
    }
    // A request the kernel did not refuse was done.
    results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
}

#[cfg(test)]
mod tests {
    use super::raw::build::{message, replies};
    use super::*;

    /// An NLMSG_ERROR answer to request `seq`: 0 is an ACK.
    fn answer(seq: u32, code: i32) -> Vec<u8> {
        let mut payload = code.to_ne_bytes().to_vec();
        payload.extend(message(24, NLM_F_REQUEST, seq, &[]));
        message(NLMSG_ERROR, 0, seq, &payload)
    }

    fn read(datagrams: Vec<Vec<u8>>, first: u32, count: usize) -> Vec<Result<(), KernelError>> {
        read_answers(replies(datagrams.into()), &mut Vec::new(), first, count)
    }

    #[test]
    fn refusals_are_their_own_requests_and_the_rest_succeeded() {
        let results = read(vec![answer(11, -libc::EEXIST), answer(13, 0)], 10, 4);
        assert_eq!(
            results,
            vec![
                Ok(()),
                Err(KernelError::from_errno(libc::EEXIST)),
                Ok(()),
                Ok(()),
            ]
        );
    }

    #[test]
    fn the_last_request_may_be_refused_too() {
        let results = read(vec![answer(5, -libc::ENODEV)], 4, 2);
        assert_eq!(
            results,
            vec![Ok(()), Err(KernelError::from_errno(libc::ENODEV))]
        );
    }

    #[test]
    fn answers_to_an_earlier_datagram_are_skipped() {
        let results = read(vec![answer(2, -libc::EEXIST), answer(8, 0)], 7, 2);
        assert_eq!(results, vec![Ok(()), Ok(())]);
    }

    #[test]
    fn requests_left_unanswered_fail_with_the_reading_error() {
        let results = read(vec![answer(4, -libc::EINVAL)], 2, 4);
        assert_eq!(
            results,
            vec![
                Ok(()),
                Ok(()),
                Err(KernelError::from_errno(libc::EINVAL)),
                Err(KernelError::other("no answer from the kernel")),
            ]
        );
    }

    #[test]
    fn only_the_last_request_asks_for_an_ack() {
        let mut datagram = Datagram::default();
        for _ in 0..3 {
            datagram.push((
                netlink_packet_route::RouteNetlinkMessage::GetLink(Default::default()),
                0,
            ));
        }
        datagram.number(40);
        let messages: Vec<_> = raw::messages(&datagram.bytes)
            .map(Result::unwrap)
            .map(|m| (m.seq, m.flags & NLM_F_ACK != 0))
            .collect();
        assert_eq!(messages, [(40, false), (41, false), (42, true)]);
    }
}

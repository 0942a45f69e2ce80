//! A socket filter that keeps the kernel from queueing, on the notification
//! socket, the echoes of route and neighbour changes vxmgr made itself.
//!
//! A notification carries the port id of the socket whose request caused
//! it. A cold start of 100,000 nodes makes 600,000 such echoes; each was
//! copied to the socket, parsed and compared with what vxmgr had just
//! written, to no effect. Only
//! additions and replacements are dropped: a deletion the kernel makes as
//! a side effect of one of vxmgr's requests carries vxmgr's port id too,
//! and must still be seen. FDB notifications carry no port id (the VXLAN
//! driver sends them with 0) and all pass.

use std::io;
use std::os::fd::AsRawFd;

use libc::{BPF_ABS, BPF_H, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W, sock_filter};

use super::neighbour::RTM_NEWNEIGH;
use super::route::RTM_NEWROUTE;

/// Offsets in `struct nlmsghdr`.
const TYPE_OFFSET: u32 = 4;
const PORT_OFFSET: u32 = 12;

/// What a filter returns: keep the whole datagram, or none of it.
const KEEP: u32 = u32::MAX;
const DROP: u32 = 0;

/// The program: the echoes of additions and replacements of routes and
/// neighbours made from `ports` are dropped, everything else kept.
pub(super) fn program(ports: &[u32]) -> Vec<sock_filter> {
    let statement = |code: u32, k: u32| sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump_if_equal = |k: u32, jt: usize| sock_filter {
        code: (BPF_JMP | BPF_JEQ | BPF_K) as u16,
        jt: u8::try_from(jt).expect("a short jump"),
        jf: 0,
        k,
    };
    // Loads read in network byte order; the header is in the host's.
    let loaded_u16 = |value: u16| u32::from(u16::from_be_bytes(value.to_ne_bytes()));
    let loaded_u32 = |value: u32| u32::from_be_bytes(value.to_ne_bytes());
    let mut program = vec![
        statement(BPF_LD | BPF_H | BPF_ABS, TYPE_OFFSET),
        // Either type goes on to the port check, two and one further on.
        jump_if_equal(loaded_u16(RTM_NEWROUTE), 2),
        jump_if_equal(loaded_u16(RTM_NEWNEIGH), 1),
        statement(BPF_RET | BPF_K, KEEP),
        statement(BPF_LD | BPF_W | BPF_ABS, PORT_OFFSET),
    ];
    for (at, port) in ports.iter().enumerate() {
        // Past the other ports' checks and the KEEP after them, to DROP.
        program.push(jump_if_equal(loaded_u32(*port), ports.len() - at));
    }
    program.push(statement(BPF_RET | BPF_K, KEEP));
    program.push(statement(BPF_RET | BPF_K, DROP));
    program
}

/// Attaches the program for `ports` to `socket`.
pub(super) fn attach(socket: &impl AsRawFd, ports: &[u32]) -> io::Result<()> {
    let mut program = program(ports);
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| io::Error::other("too many ports"))?,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `program`, which outlives the call; the
    // kernel copies the program before it returns.
    let done = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&raw const fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

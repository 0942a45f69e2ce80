//! Routes added and deleted in a namespace, as the kernel announces them,
//! read on a netlink socket of the bench's own. The watcher must cost the
//! machine little: `ip monitor route` formats and prints every route, and
//! at 10,000 routes on a 2-CPU machine that took about 135 ms of CPU from
//! the programs being measured, and its lines reached the bench some 30 ms
//! after the kernel had sent them.

use std::collections::HashMap;
use std::ffi::CStr;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};
use rtnetlink::packet_core::{NetlinkBuffer, NetlinkMessage, NetlinkPayload};
use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::netns;

// From linux/rtnetlink.h.
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_ROUTE: u32 = 11;
/// Enough for every notification of a 50,000-lease burst, should the
/// watcher fall behind.
const RECEIVE_BUFFER: usize = 64 << 20;
/// How often the watcher looks whether it should stop.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// One route change.
#[derive(Debug)]
pub struct RouteChange {
    pub added: bool,
    /// The destination as `ip route` writes it: `10.1.0.0/24`.
    pub dst: String,
    pub protocol: u8,
    /// The route's device, if it names one that still exists.
    pub device: Option<String>,
}

enum Event {
    Change(Instant, RouteChange),
    /// The socket overran: changes were lost.
    Overrun,
    /// The socket failed: nothing more will be read.
    Failed(String),
}

/// How a wait ended.
pub enum Waited {
    /// The last change waited for was received at this instant.
    Seen(Instant),
    /// Changes were lost (the socket overran): they cannot be counted.
    Overrun,
}

pub struct RouteWatch {
    ns: String,
    events: mpsc::Receiver<Event>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RouteWatch {
    /// Watches `ns` from now on: every change made after this returns is
    /// reported.
    pub fn start(ns: &str) -> Result<RouteWatch> {
        let (tx, events) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let name = ns.to_string();
        let thread = std::thread::spawn(move || match subscribe(&name) {
            Ok(socket) => {
                let _ = ready_tx.send(Ok(()));
                read(&socket, &tx, &stopping);
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        });
        ready
            .recv()
            .map_err(|_| anyhow!("the route watcher of {ns} stopped"))??;
        Ok(RouteWatch {
            ns: ns.to_string(),
            events,
            stop,
            thread: Some(thread),
        })
    }

    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// Waits until `count` changes that are `wanted` have been received.
    pub fn wait_for(
        &mut self,
        count: usize,
        timeout: Duration,
        wanted: impl Fn(&RouteChange) -> bool,
    ) -> Result<Waited> {
        if count == 0 {
            return Ok(Waited::Seen(Instant::now()));
        }
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Overrun) => return Ok(Waited::Overrun),
                Ok(Event::Failed(e)) => bail!("{}: reading route changes: {e}", self.ns),
                Ok(Event::Change(at, change)) => {
                    if wanted(&change) {
                        seen += 1;
                        if seen == count {
                            return Ok(Waited::Seen(at));
                        }
                    }
                }
                Err(_) => bail!(
                    "{}: {seen} of {count} route changes after {timeout:?}",
                    self.ns
                ),
            }
        }
    }
}

impl Drop for RouteWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A socket in namespace `ns` that receives its route changes. The thread
/// stays in the namespace, where the devices' names are looked up.
fn subscribe(ns: &str) -> Result<Socket> {
    netns::enter(ns)?;
    let mut socket = Socket::new(NETLINK_ROUTE).context("opening a netlink socket")?;
    socket.bind(&SocketAddr::new(0, 0))?;
    for group in [RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE] {
        socket.add_membership(group)?;
    }
    setsockopt(&socket, sockopt::RcvBufForce, &RECEIVE_BUFFER)?;
    let timeout = TimeVal::milliseconds(STOP_CHECK.as_millis() as i64);
    setsockopt(&socket, sockopt::ReceiveTimeout, &timeout)?;
    Ok(socket)
}

/// Reads until told to stop or the receiver is gone.
fn read(socket: &Socket, tx: &mpsc::Sender<Event>, stop: &AtomicBool) {
    let mut buffer = vec![0u8; 1 << 20];
    let mut devices = Devices::default();
    while !stop.load(Ordering::Relaxed) {
        let event = match nix::sys::socket::recv(
            socket.as_raw_fd(),
            &mut buffer,
            nix::sys::socket::MsgFlags::empty(),
        ) {
            Ok(len) => {
                let at = Instant::now();
                for change in changes(&buffer[..len], &mut devices) {
                    if tx.send(Event::Change(at, change)).is_err() {
                        return;
                    }
                }
                continue;
            }
            Err(nix::errno::Errno::ENOBUFS) => Event::Overrun,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
            Err(e) => Event::Failed(e.to_string()),
        };
        let failed = matches!(event, Event::Failed(_));
        if tx.send(event).is_err() || failed {
            return;
        }
    }
}

/// The route changes in one datagram.
fn changes(mut datagram: &[u8], devices: &mut Devices) -> Vec<RouteChange> {
    let mut out = Vec::new();
    while let Ok(header) = NetlinkBuffer::new_checked(datagram) {
        let len = (header.length() as usize).min(datagram.len());
        if let Ok(message) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&datagram[..len]) {
            match message.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(route)) => {
                    out.push(change(true, &route, devices));
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelRoute(route)) => {
                    out.push(change(false, &route, devices));
                }
                _ => {}
            }
        }
        // Messages start on 4-byte boundaries.
        let next = (len + 3) & !3;
        if len == 0 || next >= datagram.len() {
            break;
        }
        datagram = &datagram[next..];
    }
    out
}

fn change(added: bool, route: &RouteMessage, devices: &mut Devices) -> RouteChange {
    let mut address = None;
    let mut device = None;
    for attribute in &route.attributes {
        match attribute {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => address = Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => address = Some(IpAddr::V6(*ip)),
            RouteAttribute::Oif(index) => device = devices.name(*index),
            _ => {}
        }
    }
    let prefix = route.header.destination_prefix_length;
    let dst = match address {
        Some(ip) => format!("{ip}/{prefix}"),
        None => "default".to_string(),
    };
    RouteChange {
        added,
        dst,
        protocol: route.header.protocol.into(),
        device,
    }
}

/// Device names by index, as looked up in the watcher's namespace.
#[derive(Default)]
struct Devices(HashMap<u32, String>);

impl Devices {
    fn name(&mut self, index: u32) -> Option<String> {
        if let Some(name) = self.0.get(&index) {
            return Some(name.clone());
        }
        let mut buffer = [0 as libc::c_char; libc::IF_NAMESIZE];
        // SAFETY: the buffer holds IF_NAMESIZE bytes, as if_indextoname
        // requires, and it writes a NUL-terminated name into it or fails.
        let found = unsafe { libc::if_indextoname(index, buffer.as_mut_ptr()) };
        if found.is_null() {
            return None;
        }
        // SAFETY: on success the buffer holds a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(buffer.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        self.0.insert(index, name.clone());
        Some(name)
    }
}

//! The kernel backend: one trait, two implementations. `netlink` programs the
//! real kernel; `memory` keeps the same semantics in maps and records every
//! operation, for kernel-free tests and `--kernel memory`.

pub mod firewall;
pub mod memory;
pub mod netlink;
pub mod objects;
pub mod watch;

use std::future::Future;
use std::net::IpAddr;

use crate::desired::ParentInterface;
use firewall::{Firewall, FirewallChanges, FirewallError};
use objects::{DumpSink, KernelOp, KernelState, Link, Ownership};
use watch::Watch;

/// Why the kernel refused an operation or a read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct KernelError {
    pub errno: Option<i32>,
    pub message: String,
}

impl KernelError {
    pub fn from_errno(errno: i32) -> KernelError {
        KernelError {
            errno: Some(errno),
            message: std::io::Error::from_raw_os_error(errno).to_string(),
        }
    }

    pub fn other(message: impl Into<String>) -> KernelError {
        KernelError {
            errno: None,
            message: message.into(),
        }
    }

    /// The interface the operation needs is missing or down: the object
    /// waits for it (see the reconciler), it is not retried with backoff.
    pub fn is_missing_device(&self) -> bool {
        matches!(self.errno, Some(libc::ENODEV | libc::ENETDOWN))
    }
}

/// What vxmgr needs from a kernel. One task owns the backend.
pub trait KernelBackend: Send + 'static {
    /// The same host's firewall (or its model, for the memory kernel).
    type Firewall: Firewall;

    fn firewall(&mut self) -> &mut Self::Firewall;

    /// Applies firewall changes (`Firewall::apply`); here so that a backend
    /// wrapping another can see them.
    fn apply_firewall(
        &mut self,
        changes: &FirewallChanges,
    ) -> impl Future<Output = Result<(), FirewallError>> + Send {
        self.firewall().apply(changes)
    }

    /// Every object vxmgr owns, by the rules in `ownership`, handed to
    /// `sink` part by part as each is read (the parts are read at once).
    fn dump_into(
        &mut self,
        ownership: &Ownership,
        sink: &mut dyn DumpSink,
    ) -> impl Future<Output = Result<(), KernelError>> + Send;

    /// Every object vxmgr owns, all parts together.
    fn dump(
        &mut self,
        ownership: &Ownership,
    ) -> impl Future<Output = Result<KernelState, KernelError>> + Send {
        async move {
            let mut state = KernelState::default();
            self.dump_into(ownership, &mut state).await?;
            Ok(state)
        }
    }

    /// Every interface's addresses, by interface index: vxmgr's routes
    /// must never cover the host's own.
    fn addresses(&mut self)
    -> impl Future<Output = Result<Vec<(u32, IpAddr)>, KernelError>> + Send;

    /// The links with these names that exist.
    fn links(
        &mut self,
        names: &[String],
    ) -> impl Future<Output = Result<Vec<Link>, KernelError>> + Send;

    /// The interface holding `address`, if any.
    fn find_interface(
        &mut self,
        address: IpAddr,
    ) -> impl Future<Output = Result<Option<ParentInterface>, KernelError>> + Send;

    /// Applies operations that do not depend on one another, as concurrently
    /// as the backend can; one result per operation, in order.
    fn apply(
        &mut self,
        ops: &[KernelOp],
    ) -> impl Future<Output = Vec<Result<(), KernelError>>> + Send;

    /// Whether the kernel has nexthop objects.
    fn supports_nexthops(&mut self) -> impl Future<Output = bool> + Send;

    /// Subscribes to the kernel's change notifications. They queue without
    /// bound while the reconciler is busy (a big apply echoes every change
    /// back); the kernel socket's buffer is the bound, and its overrun is
    /// reported as `Notification::Overrun`.
    fn watch(&mut self) -> Result<Watch, KernelError>;
}

//! A subscription to the kernel's change notifications, with a way to know
//! that every notification the kernel has sent so far has been received.
//!
//! The kernel echoes vxmgr's own changes back. The echo is sent before the
//! change's acknowledgement, but read later, by another task: taken in after
//! a later change to the same object, a stale echo would make vxmgr believe
//! the object is as it was (a route it had just deleted, still there). So
//! before vxmgr changes or reads the kernel, it takes in everything up to
//! now (`caught_up`).

use tokio::sync::{mpsc, oneshot};

use super::objects::Notification;

/// Notifications as they arrive, and the barrier that says all sent so
/// far are queued.
pub struct Watch {
    notifications: mpsc::UnboundedReceiver<Notification>,
    barriers: Option<mpsc::UnboundedSender<oneshot::Sender<()>>>,
}

impl Watch {
    /// `barriers` reaches the reader of the kernel's socket, which answers
    /// each once it has queued everything the socket held. Without one, the
    /// queue is complete at every moment (a kernel in memory queues its
    /// notifications as it changes).
    pub fn new(
        notifications: mpsc::UnboundedReceiver<Notification>,
        barriers: Option<mpsc::UnboundedSender<oneshot::Sender<()>>>,
    ) -> Watch {
        Watch {
            notifications,
            barriers,
        }
    }

    /// The next notification; `None` once the subscription has ended.
    pub async fn recv(&mut self) -> Option<Notification> {
        self.notifications.recv().await
    }

    /// The next queued notification, if there is one.
    pub fn try_recv(&mut self) -> Option<Notification> {
        self.notifications.try_recv().ok()
    }

    /// Returns once every notification the kernel had sent when it was
    /// called is queued (or the reader has stopped, which ends the
    /// subscription too).
    pub async fn caught_up(&mut self) {
        let Some(barriers) = &self.barriers else {
            return;
        };
        let (done, answered) = oneshot::channel();
        if barriers.send(done).is_ok() {
            let _ = answered.await;
        }
    }
}

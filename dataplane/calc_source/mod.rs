//! What a calc source (a Sync stream on the socket, Felix's pipes) hands
//! the manager task, and how the manager task's reports go back to it.

pub mod responses;

use crate::wire::felix::ToDataplane;
use responses::Responder;

/// What a calc source tells the manager task.
pub enum EngineInput {
    StreamStarted {
        id: u64,
        peer: String,
        responder: Responder,
    },
    /// Messages of a stream, in order.
    Messages {
        id: u64,
        messages: Vec<ToDataplane>,
    },
    StreamEnded {
        id: u64,
    },
    /// The daemon is stopping.
    Shutdown,
}

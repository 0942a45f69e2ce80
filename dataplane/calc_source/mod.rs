//! What a calc source (a Sync stream on the socket, Felix's pipes) hands
//! the manager task, and how the manager task's reports go back to it.

pub mod felix_pipes;
pub mod recorder;
pub mod responses;

use crate::wire::Received;
use crate::wire::felix::ToDataplane;
use responses::Responder;

/// Most messages a calc source hands the manager task at once.
pub const MESSAGE_CHUNK: usize = 1024;

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
        messages: Vec<Incoming>,
    },
    StreamEnded {
        id: u64,
    },
    /// The daemon is stopping.
    Shutdown,
}

/// One message of a stream.
#[derive(Debug)]
pub enum Incoming {
    Message(ToDataplane),
    /// A message that is not applied, but numbered and reported rejected
    /// like any other: its bytes do not decode, or it is too large. Its
    /// sequence number, when the source could read one.
    Refused {
        sequence: Option<u64>,
        reason: String,
    },
}

impl Incoming {
    /// The number it was sent with; 0 (proto3's "none") when it has none.
    pub fn sent_sequence(&self) -> u64 {
        match self {
            Incoming::Message(msg) => msg.sequence_number,
            Incoming::Refused { sequence, .. } => sequence.unwrap_or(0),
        }
    }
}

impl From<Received> for Incoming {
    fn from(received: Received) -> Incoming {
        match received.message {
            Ok(message) => Incoming::Message(message),
            Err(e) => Incoming::Refused {
                sequence: None,
                reason: format!(
                    "a message of {} bytes does not decode as a ToDataplane: {e}",
                    received.bytes.len()
                ),
            },
        }
    }
}

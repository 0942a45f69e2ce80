//! vxmgrd, through the library's client: its hostname (which lease is the
//! local VTEP), and the Sync stream the view's messages go down. Batch
//! statuses are read on a task of their own and anything vxmgrd rejected
//! or could not program is logged.

use std::path::{Path, PathBuf};

use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};
use vxmgr::wire::felix::ToDataplane;
use vxmgr::wire::vxmgr::v1::{BatchResult, GetStateRequest, sync_response::Payload};

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("connecting to vxmgrd on {}: {source}", socket.display())]
    Connect {
        socket: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("vxmgrd on {}: {status}", socket.display())]
    Rpc {
        socket: PathBuf,
        status: tonic::Status,
    },
}

pub struct Dataplane {
    socket: PathBuf,
}

/// An open Sync stream. Dropping it closes the stream; vxmgrd keeps the
/// kernel as it is.
pub struct Stream {
    tx: mpsc::Sender<ToDataplane>,
    next_sequence: u64,
    progress: watch::Receiver<Progress>,
}

/// How far vxmgrd is with a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    Open,
    /// vxmgrd has programmed everything up to the InSync.
    InSync,
    Ended,
}

/// Messages that may wait unsent before `send` waits for vxmgrd.
const SEND_BUFFER: usize = 4096;

impl Dataplane {
    pub fn new(socket: &Path) -> Dataplane {
        Dataplane {
            socket: socket.to_path_buf(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn client(
        &self,
    ) -> Result<
        vxmgr::wire::vxmgr::v1::dataplane_client::DataplaneClient<tonic::transport::Channel>,
        DataplaneError,
    > {
        vxmgr::client::dataplane(&self.socket)
            .await
            .map_err(|source| DataplaneError::Connect {
                socket: self.socket.clone(),
                source,
            })
    }

    fn rpc(&self, status: tonic::Status) -> DataplaneError {
        DataplaneError::Rpc {
            socket: self.socket.clone(),
            status,
        }
    }

    /// vxmgrd's name for this node.
    pub async fn hostname(&self) -> Result<String, DataplaneError> {
        let state = self
            .client()
            .await?
            .get_state(GetStateRequest {})
            .await
            .map_err(|s| self.rpc(s))?;
        Ok(state.into_inner().hostname)
    }

    /// Opens a Sync stream (a resync for vxmgrd).
    pub async fn open(&self) -> Result<Stream, DataplaneError> {
        let (tx, rx) = mpsc::channel(SEND_BUFFER);
        let mut responses = self
            .client()
            .await?
            .sync(ReceiverStream::new(rx))
            .await
            .map_err(|s| self.rpc(s))?
            .into_inner();
        let (progress_tx, progress) = watch::channel(Progress::Open);
        tokio::spawn(async move {
            loop {
                match responses.next().await {
                    Some(Ok(response)) => {
                        if report(response.payload) {
                            let _ = progress_tx.send(Progress::InSync);
                        }
                    }
                    Some(Err(status)) => {
                        warn!(%status, "vxmgrd ended the stream");
                        break;
                    }
                    None => {
                        info!("vxmgrd closed the stream");
                        break;
                    }
                }
            }
            let _ = progress_tx.send(Progress::Ended);
        });
        Ok(Stream {
            tx,
            next_sequence: 1,
            progress,
        })
    }
}

/// Logs a response; true when it says vxmgrd is in sync.
fn report(payload: Option<Payload>) -> bool {
    match payload {
        Some(Payload::BatchStatus(status)) => {
            for rejected in &status.rejected {
                warn!(sequence = rejected.sequence_number, reason = %rejected.reason, "vxmgrd rejected a message");
            }
            for error in &status.kernel_errors {
                warn!(object = %error.object, error = %error.error, "vxmgrd could not program an object (it retries)");
            }
            if status.result == BatchResult::Ok as i32 {
                debug!(
                    first = status.first_sequence,
                    last = status.last_sequence,
                    apply_micros = status.apply_micros,
                    "batch programmed"
                );
            }
        }
        Some(Payload::DataplaneInSync(_)) => {
            info!("vxmgrd in sync");
            return true;
        }
        Some(Payload::Heartbeat(_)) | None => {}
    }
    false
}

#[derive(Debug, thiserror::Error)]
#[error("the stream to vxmgrd has ended")]
pub struct StreamEnded;

impl Stream {
    /// Sends `messages` in order, numbered on from the last; how many.
    pub async fn send(
        &mut self,
        messages: impl IntoIterator<Item = ToDataplane>,
    ) -> Result<usize, StreamEnded> {
        let first = self.next_sequence;
        for mut message in messages {
            message.sequence_number = self.next_sequence;
            self.next_sequence += 1;
            self.tx.send(message).await.map_err(|_| StreamEnded)?;
        }
        Ok((self.next_sequence - first) as usize)
    }

    /// Resolves when the stream is further than `seen`: in sync, or
    /// ended.
    pub async fn progressed(&mut self, seen: Progress) -> Progress {
        match self.progress.wait_for(|p| *p != seen).await {
            Ok(progress) => *progress,
            Err(_) => Progress::Ended,
        }
    }
}

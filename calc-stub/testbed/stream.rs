//! The calc side of a Sync stream: numbers messages, sends them as fast as
//! the stream takes them and waits for the batch statuses covering them,
//! or for DataplaneInSync.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use vxmgr::wire::felix::ToDataplane;
use vxmgr::wire::vxmgr::v1::{BatchResult, BatchStatus, SyncResponse, sync_response};

/// Messages queued ahead of the stream: small, so "handed to the stream"
/// is close to "taken by the stream".
const QUEUE: usize = 64;

const STATUS_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a new stream waits for the previous one's slot.
const SLOT_WAIT: Duration = Duration::from_secs(10);

pub struct Session {
    tx: mpsc::Sender<ToDataplane>,
    responses: Streaming<SyncResponse>,
    next_sequence: u64,
}

/// What one `send` saw.
pub struct Delivery {
    /// From the first message sent until the last was handed to the stream.
    pub sent: Duration,
    /// From the first message sent until the status covering the last one.
    pub covered: Duration,
    /// The statuses that arrived meanwhile, the covering one last.
    pub statuses: Vec<BatchStatus>,
}

impl Delivery {
    pub fn all_ok(&self) -> bool {
        self.statuses
            .iter()
            .all(|s| s.result == BatchResult::Ok as i32)
    }

    /// An error naming `what` and, for each status that was not OK, its
    /// messages, result, rejections and kernel errors (a few of each).
    pub fn ensure_ok(&self, what: &str) -> Result<()> {
        let not_ok: Vec<String> = (self.statuses.iter())
            .filter(|s| s.result != BatchResult::Ok as i32)
            .take(SHOWN)
            .map(describe_not_ok)
            .collect();
        ensure!(
            not_ok.is_empty(),
            "{what}: not every batch was OK:\n{}",
            not_ok.join("\n")
        );
        Ok(())
    }

    /// The daemon's own apply time for these messages.
    pub fn apply_time(&self) -> Duration {
        self.statuses
            .iter()
            .map(|s| Duration::from_micros(u64::from(s.apply_micros)))
            .sum()
    }
}

impl Session {
    /// Opens a Sync stream: for the daemon, the start of a resync.
    pub async fn open(socket: &Path) -> Result<Session> {
        let mut client = vxmgr::client::dataplane(socket)
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let responses = client.sync(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Session {
            tx,
            responses,
            next_sequence: 1,
        })
    }

    /// Opens a Sync stream once the previous one's slot is free: it frees
    /// when vxmgrd has seen the stream end, of which the client hears
    /// nothing, so the refusal is retried.
    pub async fn open_after_another(socket: &Path) -> Result<Session> {
        let started = Instant::now();
        loop {
            match Session::open(socket).await {
                Err(e)
                    if started.elapsed() < SLOT_WAIT
                        && e.downcast_ref::<tonic::Status>()
                            .is_some_and(|s| s.code() == tonic::Code::FailedPrecondition) =>
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                opened => return opened,
            }
        }
    }

    /// Sends `messages`, numbered on from the previous ones, and waits for
    /// the status covering the last of them.
    pub async fn send(&mut self, messages: Vec<ToDataplane>) -> Result<Delivery> {
        let first = self.next_sequence;
        let last = first + messages.len() as u64 - 1;
        self.next_sequence = last + 1;
        let started = Instant::now();
        let (tx, responses) = (&self.tx, &mut self.responses);
        let sending = async move {
            for (sequence, mut msg) in (first..).zip(messages) {
                msg.sequence_number = sequence;
                tx.send(msg).await.context("the stream closed")?;
            }
            Ok::<_, anyhow::Error>(started.elapsed())
        };
        let waiting = async {
            let statuses = statuses_until(responses, last).await?;
            Ok::<_, anyhow::Error>((started.elapsed(), statuses))
        };
        let waiting = async {
            tokio::time::timeout(STATUS_TIMEOUT, waiting)
                .await
                .with_context(|| {
                    format!("no status covering message {last} in {STATUS_TIMEOUT:?}")
                })?
        };
        let (sent, (covered, statuses)) = tokio::try_join!(sending, waiting)?;
        Ok(Delivery {
            sent,
            covered,
            statuses,
        })
    }
}

impl Session {
    /// Waits for DataplaneInSync: the daemon has applied everything up to
    /// an InSync and nothing is left to do.
    pub async fn in_sync(&mut self) -> Result<()> {
        let waiting = async {
            while let Some(response) = self.responses.next().await {
                if let Some(sync_response::Payload::DataplaneInSync(_)) = response?.payload {
                    return Ok(());
                }
            }
            bail!("the daemon ended the stream before DataplaneInSync")
        };
        tokio::time::timeout(STATUS_TIMEOUT, waiting)
            .await
            .with_context(|| format!("no DataplaneInSync in {STATUS_TIMEOUT:?}"))?
    }
}

/// Statuses, and rejections and kernel errors in one, that an error shows.
const SHOWN: usize = 5;

fn describe_not_ok(status: &BatchStatus) -> String {
    let result = BatchResult::try_from(status.result).map_or_else(
        |_| status.result.to_string(),
        |r| r.as_str_name().to_string(),
    );
    let rejected = (status.rejected.iter().take(SHOWN))
        .map(|r| format!("message {} rejected: {}", r.sequence_number, r.reason));
    let errors =
        (status.kernel_errors.iter().take(SHOWN)).map(|e| format!("{}: {}", e.object, e.error));
    let details: Vec<String> = rejected.chain(errors).collect();
    format!(
        "messages {}-{}: {result} ({} rejected, {} kernel errors){}{}",
        status.first_sequence,
        status.last_sequence,
        status.rejected.len(),
        status.kernel_errors.len(),
        if details.is_empty() { "" } else { ": " },
        details.join("; ")
    )
}

/// Batch statuses up to the one covering message `last`; heartbeats and
/// DataplaneInSync are passed over.
async fn statuses_until(
    responses: &mut Streaming<SyncResponse>,
    last: u64,
) -> Result<Vec<BatchStatus>> {
    let mut statuses = Vec::new();
    while let Some(response) = responses.next().await {
        if let Some(sync_response::Payload::BatchStatus(status)) = response?.payload {
            let done = status.last_sequence >= last;
            statuses.push(status);
            if done {
                return Ok(statuses);
            }
        }
    }
    bail!("the daemon ended the stream before reporting message {last}")
}

/// A whole replay: a new stream carrying `messages`.
pub async fn replay(socket: &Path, messages: Vec<ToDataplane>) -> Result<Delivery> {
    Session::open(socket).await?.send(messages).await
}

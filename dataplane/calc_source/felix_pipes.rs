//! Felix's pipes as the calc source: vxmgrd as Felix's external dataplane
//! driver. With FELIX_USEINTERNALDATAPLANEDRIVER=false Felix execs its
//! FELIX_DATAPLANEDRIVER with no arguments, writes `ToDataplane` messages
//! to the child's fd 3 and reads `FromDataplane` messages from its fd 4,
//! each an 8-byte little-endian length and then the protobuf bytes. Felix
//! numbers its messages from 0 and sends no acknowledgements; of what a
//! driver may send back, vxmgr sends heartbeats (ProcessStatusUpdate) and
//! one DataplaneInSync. Batch statuses, for which Felix has no message, go
//! to the log only.

use std::fs::File;
use std::io::{self, BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};

use futures::StreamExt;
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::recorder::Recorder;
use super::responses::{self, Responses};
use super::{EngineInput, Incoming, MESSAGE_CHUNK};
use crate::wire::felix::{FromDataplane, ToDataplane, from_dataplane};
use crate::wire::framing::{Frame, FrameError, FrameReader, Skimmed};
use crate::wire::vxmgr::v1::sync_response;
use crate::wire::{MAX_MESSAGE_BYTES, Received, payload_kind};

/// Felix writes the calc stream to the driver's fd 3 …
pub const CALC_FD: RawFd = 3;
/// … and reads the driver's reports from its fd 4.
pub const REPORTS_FD: RawFd = 4;

/// The stream's id: the only stream while the pipes are the source.
const STREAM: u64 = 1;

/// Felix's ends of the pipes, as vxmgrd inherited them.
#[derive(Debug)]
pub struct FelixPipes {
    calc: File,
    reports: File,
}

#[derive(Debug, thiserror::Error)]
pub enum PipeError {
    #[error(
        "fd {0} is not open: with the felix-pipes calc source, vxmgrd must be started by Felix as its dataplane driver (FELIX_DATAPLANEDRIVER), which opens fds 3 and 4"
    )]
    NotOpen(RawFd),
    #[error("Felix's messages on fd 3: {0}")]
    Read(#[from] FrameError),
    #[error("the reader of fd 3 stopped: {0}")]
    Reader(String),
}

impl FelixPipes {
    /// Takes fds 3 and 4. Call before anything else opens a file: an fd
    /// the process opened itself would otherwise pass for Felix's.
    pub fn take() -> Result<FelixPipes, PipeError> {
        for fd in [CALC_FD, REPORTS_FD] {
            // SAFETY: fcntl on an fd number only reads and sets its flags.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            if flags < 0 {
                return Err(PipeError::NotOpen(fd));
            }
            // Not inherited by the processes vxmgrd runs (`ipset`): Felix
            // must see the pipes close when vxmgrd ends.
            // SAFETY: as above.
            unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        }
        // SAFETY: both fds are open (checked above) and nothing else in
        // the process owns them.
        let (calc, reports) =
            unsafe { (File::from_raw_fd(CALC_FD), File::from_raw_fd(REPORTS_FD)) };
        Ok(FelixPipes { calc, reports })
    }

    /// Feeds Felix's stream to the manager task and its reports back to
    /// Felix, until Felix closes fd 3 (`Ok`) or fd 3 fails.
    pub async fn run(
        self,
        engine: mpsc::Sender<EngineInput>,
        recorder: Recorder,
        response_buffer: usize,
    ) -> Result<(), PipeError> {
        let (responder, responses) = responses::channel(STREAM, response_buffer);
        let started = EngineInput::StreamStarted {
            id: STREAM,
            peer: "Felix, on fds 3 and 4".into(),
            responder,
        };
        if engine.send(started).await.is_err() {
            return Ok(());
        }
        let reports = tokio::spawn(report_to_felix(responses, self.reports));
        // Plain threads for the blocking pipe I/O: a read or write that
        // never returns must not hold up the daemon's exit.
        let (done_tx, done) = oneshot::channel();
        let reader_engine = engine.clone();
        std::thread::Builder::new()
            .name("vxmgr-felix-in".into())
            .spawn(move || {
                let _ = done_tx.send(read_calc_stream(self.calc, &reader_engine, &recorder));
            })
            .map_err(|e| PipeError::Reader(e.to_string()))?;
        let ended = done
            .await
            .unwrap_or_else(|_| Err(PipeError::Reader("its thread ended".into())));
        let _ = engine.send(EngineInput::StreamEnded { id: STREAM }).await;
        reports.abort();
        ended
    }
}

/// Reads frames from fd 3 and hands them on in the chunks they arrive in.
fn read_calc_stream(
    calc: File,
    engine: &mpsc::Sender<EngineInput>,
    recorder: &Recorder,
) -> Result<(), PipeError> {
    let mut frames = FrameReader::new(BufReader::with_capacity(1 << 16, calc), MAX_MESSAGE_BYTES);
    let mut chunk = Vec::new();
    let hand_over = |chunk: &mut Vec<Incoming>| {
        if chunk.is_empty() {
            return true;
        }
        recorder.flush();
        let messages = std::mem::take(chunk);
        engine
            .blocking_send(EngineInput::Messages {
                id: STREAM,
                messages,
            })
            .is_ok()
    };
    loop {
        let incoming = match frames.next_frame() {
            Ok(None) => {
                hand_over(&mut chunk);
                info!("Felix closed fd 3");
                return Ok(());
            }
            Ok(Some(Frame::Whole(body))) => {
                let received = Received::new(body.into());
                recorder.record(&received);
                Incoming::from(received)
            }
            Ok(Some(Frame::Oversized(len))) => match frames.skim(len) {
                Ok(skimmed) => oversized(len, skimmed),
                Err(e) => {
                    hand_over(&mut chunk);
                    return Err(e.into());
                }
            },
            Err(e) => {
                hand_over(&mut chunk);
                return Err(e.into());
            }
        };
        chunk.push(incoming);
        // What the buffer holds has arrived already: it goes in the same
        // chunk. Otherwise the next read may wait for Felix.
        if (chunk.len() >= MESSAGE_CHUNK || frames.get_ref().buffer().is_empty())
            && !hand_over(&mut chunk)
        {
            // The daemon is stopping.
            return Ok(());
        }
    }
}

/// A message over the size limit, read past without being held: a kind
/// vxmgr does not use is skipped as such; one it uses is refused.
/// (A record leaves it out: it was never held.)
fn oversized(len: u64, skimmed: Result<Skimmed, String>) -> Incoming {
    let limit = MAX_MESSAGE_BYTES >> 20;
    match skimmed {
        Err(why) => Incoming::Refused {
            sequence: None,
            reason: format!(
                "a message of {len} bytes, over the {limit} MiB limit, is malformed: {why}"
            ),
        },
        Ok(s) => match s.payload_field.and_then(payload_kind) {
            Some(kind) => Incoming::Refused {
                sequence: Some(s.sequence_number),
                reason: format!("a {kind} of {len} bytes is over the {limit} MiB limit"),
            },
            None => {
                debug!(
                    sequence = s.sequence_number,
                    field = s.payload_field,
                    len,
                    "skipped a large message of a kind vxmgr does not use"
                );
                Incoming::Message(ToDataplane {
                    sequence_number: s.sequence_number,
                    payload: None,
                })
            }
        },
    }
}

/// Sends the stream's heartbeats and DataplaneInSync to Felix on fd 4.
async fn report_to_felix(mut responses: Responses, reports: File) {
    let (frames, frames_rx) = mpsc::channel(64);
    if let Err(e) = std::thread::Builder::new()
        .name("vxmgr-felix-out".into())
        .spawn(move || write_reports(reports, frames_rx))
    {
        warn!(error = %e, "cannot report to Felix");
        return;
    }
    let mut sequence_number = 0;
    while let Some(response) = responses.next().await {
        let payload = match response {
            Ok(response) => match response.payload {
                Some(sync_response::Payload::Heartbeat(h)) => {
                    from_dataplane::Payload::ProcessStatusUpdate(h)
                }
                Some(sync_response::Payload::DataplaneInSync(d)) => {
                    from_dataplane::Payload::DataplaneInSync(d)
                }
                Some(sync_response::Payload::BatchStatus(_)) | None => continue,
            },
            Err(status) => {
                warn!(%status, "Felix is not reading fd 4: no more reports");
                return;
            }
        };
        let message = FromDataplane {
            sequence_number,
            payload: Some(payload),
        };
        sequence_number += 1;
        if frames.send(message.encode_to_vec()).await.is_err() {
            return;
        }
    }
}

fn write_reports(mut reports: File, mut frames: mpsc::Receiver<Vec<u8>>) {
    while let Some(body) = frames.blocking_recv() {
        let written = reports
            .write_all(&(body.len() as u64).to_le_bytes())
            .and_then(|()| reports.write_all(&body));
        if let Err(e) = written {
            if e.kind() == io::ErrorKind::BrokenPipe {
                // Felix has gone: its end of fd 3 closes next.
                info!("Felix closed fd 4");
            } else {
                warn!(error = %e, "writing to Felix on fd 4");
            }
            return;
        }
    }
}

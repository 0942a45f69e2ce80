//! `calc-stub replay`: streams messages into vxmgrd and reports its verdicts.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use crate::StubError;
use vxmgr::client::SyncError;
use vxmgr::wire::json;
use vxmgr::wire::replay::{MessageBytes, ReplayError};
use vxmgr::wire::vxmgr::v1::{BatchResult, BatchStatus, GetStateRequest, sync_response};

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// vxmgrd's unix socket.
    #[arg(
        long,
        env = "VXMGR_SOCKET",
        default_value = "/run/vxmgr/dataplane.sock"
    )]
    socket: PathBuf,
    /// Send one message per batch, waiting for each one's status.
    #[arg(long)]
    step: bool,
    /// Compare the final GetState with this golden file; print a diff.
    #[arg(long, value_name = "STATE.json")]
    expect: Option<PathBuf>,
    /// Write the final GetState (as compared by --expect) to this file.
    #[arg(long, value_name = "STATE.json")]
    save_state: Option<PathBuf>,
    /// Give up when the daemon has not reported the last message by then.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "120s")]
    timeout: Duration,
    /// Replay files: .jsonl, or Felix framing for any other extension.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
}

/// How long the daemon gets to end the stream after the last status.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Messages read ahead of the stream.
const READ_AHEAD: usize = 1024;

pub async fn run(args: ReplayArgs) -> Result<bool, StubError> {
    let (tx, rx) = mpsc::channel(READ_AHEAD);
    // How many messages the statuses so far covered, for --step. Counted
    // rather than compared by number: files may number their messages in
    // any way.
    let (covered_tx, covered_rx) = args.step.then(std::sync::mpsc::channel::<u64>).unzip();
    let mut read_done = spawn_reader(args.files.clone(), tx, covered_rx);
    let unreachable = |source| StubError::Connect {
        socket: args.socket.clone(),
        source,
    };
    let connected = vxmgr::client::sync_bytes(&args.socket, ReceiverStream::new(rx)).await;
    let mut responses = match connected {
        Ok(responses) => responses,
        Err(SyncError::Connect(source)) => {
            // A file that does not read says more than a daemon that cannot
            // be reached. The stream was dropped unopened, so the reader
            // checks the files to the end without waiting.
            if let Ok(ReadOutcome { error: Some(e), .. }) = read_done.await {
                return Err(e.into());
            }
            return Err(unreachable(source));
        }
        Err(SyncError::Rpc(status)) => return Err(StubError::Rpc(status)),
    };

    let mut all_ok = true;
    // Statuses go to stdout until it closes (say, piped into head).
    let mut stdout = Some(std::io::stdout());
    let mut covered = 0;
    let mut read = None;
    let wait = async {
        loop {
            if let Some(outcome) = read.take_if(|o: &mut ReadOutcome| covered >= o.sent) {
                return Ok(outcome);
            }
            tokio::select! {
                outcome = &mut read_done, if read.is_none() => {
                    read = Some(outcome.map_err(|_| {
                        StubError::Other("the reader of the files stopped".into())
                    })?);
                }
                response = responses.next() => {
                    let Some(response) = response else {
                        return Err(StubError::Other(
                            "the daemon ended the stream before reporting every message".into(),
                        ));
                    };
                    match response?.payload {
                        Some(sync_response::Payload::BatchStatus(status)) => {
                            if let Some(out) = &mut stdout
                                && writeln!(out, "{}", json::to_line(&status)).is_err()
                            {
                                stdout = None;
                            }
                            all_ok &= is_ok(&status);
                            covered += u64::from(status.message_count);
                            if let Some(covered_tx) = &covered_tx {
                                let _ = covered_tx.send(covered);
                            }
                        }
                        Some(sync_response::Payload::DataplaneInSync(_)) => {
                            eprintln!("calc-stub: dataplane in sync");
                        }
                        Some(sync_response::Payload::Heartbeat(_)) | None => {}
                    }
                }
            }
        }
    };
    let outcome = tokio::time::timeout(args.timeout, wait)
        .await
        .map_err(|_| {
            StubError::Other(format!(
                "timed out after {} waiting for the batches covering every message",
                humantime::format_duration(args.timeout)
            ))
        })??;
    // Our side closes only now: closing it before the last status is in
    // would end the daemon's stream before it reports.
    drop(outcome.stream);
    drop(covered_tx);
    // Let the daemon end the stream, so it sees a clean close rather than a
    // dropped connection.
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        while let Ok(Some(_)) = responses.message().await {}
    })
    .await;
    // The messages before a malformed one were sent and reported.
    if let Some(e) = outcome.error {
        return Err(e.into());
    }

    if args.expect.is_none() && args.save_state.is_none() {
        return Ok(all_ok);
    }
    let mut client = vxmgr::client::dataplane(&args.socket)
        .await
        .map_err(unreachable)?;
    let state = client.get_state(GetStateRequest {}).await?.into_inner();
    let actual = comparable_state(json::to_value(&state));
    let actual_text = serde_json::to_string_pretty(&actual).expect("JSON values print") + "\n";
    if let Some(path) = &args.save_state {
        std::fs::write(path, &actual_text)
            .map_err(|e| StubError::Other(format!("writing {}: {e}", path.display())))?;
    }
    if let Some(path) = &args.expect {
        let golden = std::fs::read_to_string(path)
            .map_err(|e| StubError::Other(format!("reading {}: {e}", path.display())))?;
        let golden: serde_json::Value = serde_json::from_str(&golden)
            .map_err(|e| StubError::Other(format!("parsing {}: {e}", path.display())))?;
        let golden_text = serde_json::to_string_pretty(&comparable_state(golden))
            .expect("JSON values print")
            + "\n";
        if golden_text != actual_text {
            eprintln!("calc-stub: state differs from {}:", path.display());
            let diff = similar::TextDiff::from_lines(&golden_text, &actual_text);
            eprint!(
                "{}",
                diff.unified_diff()
                    .header(&path.display().to_string(), "GetState")
            );
            all_ok = false;
        }
    }
    Ok(all_ok)
}

fn is_ok(status: &BatchStatus) -> bool {
    status.result == BatchResult::Ok as i32
}

/// The state without what changes from run to run (the last batch).
fn comparable_state(mut state: serde_json::Value) -> serde_json::Value {
    if let Some(map) = state.as_object_mut() {
        map.remove("lastBatch");
    }
    state
}

/// How reading the files ended.
struct ReadOutcome {
    /// Messages handed to the stream.
    sent: u64,
    /// The first file, line or frame that does not read: nothing from it on
    /// was sent.
    error: Option<ReplayError>,
    /// The stream's sending side, kept open until the last status is in.
    stream: mpsc::Sender<Bytes>,
}

/// Reads the files on a thread of its own and hands each message to
/// `stream` as soon as it is read, so the daemon works while the rest is
/// parsed. With `covered` (--step), waits after each message until the
/// statuses cover it. Once the stream is gone the files are still read to
/// the end, for their errors.
fn spawn_reader(
    files: Vec<PathBuf>,
    stream: mpsc::Sender<Bytes>,
    covered: Option<std::sync::mpsc::Receiver<u64>>,
) -> oneshot::Receiver<ReadOutcome> {
    let (done, outcome) = oneshot::channel();
    std::thread::spawn(move || {
        let mut sent = 0;
        let mut open = true;
        let mut read = || -> Result<(), ReplayError> {
            for file in &files {
                for msg in MessageBytes::open(file)? {
                    let msg = msg?;
                    open = open && stream.blocking_send(msg).is_ok();
                    if !open {
                        continue;
                    }
                    sent += 1;
                    if let Some(covered) = &covered {
                        while covered.recv().is_ok_and(|c| c < sent) {}
                    }
                }
            }
            Ok(())
        };
        let error = read().err();
        let _ = done.send(ReadOutcome {
            sent,
            error,
            stream,
        });
    });
    outcome
}

//! `calc-stub replay`: streams messages into vxmgrd and reports its verdicts.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use crate::StubError;
use vxmgr::client::SyncError;
use vxmgr::wire::vxmgr::v1::{BatchResult, BatchStatus, GetStateRequest, sync_response};
use vxmgr::wire::{json, replay};

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

pub async fn run(args: ReplayArgs) -> Result<bool, StubError> {
    // Sent as they are, byte for byte: the daemon numbers messages that
    // carry no number.
    let mut messages: Vec<Bytes> = Vec::new();
    for file in &args.files {
        messages.extend(replay::read_file_bytes(file)?);
    }
    let total = messages.len() as u64;
    let unreachable = |source| StubError::Connect {
        socket: args.socket.clone(),
        source,
    };
    let (tx, rx) = mpsc::channel(1024);
    let mut responses = vxmgr::client::sync_bytes(&args.socket, ReceiverStream::new(rx))
        .await
        .map_err(|e| match e {
            SyncError::Connect(source) => unreachable(source),
            SyncError::Rpc(status) => StubError::Rpc(status),
        })?;

    let step = args.step;
    // How many messages the statuses so far covered. Counted rather than
    // compared by number: files may number their messages in any way.
    let (covered_tx, mut covered_rx) = mpsc::unbounded_channel::<u64>();
    let sender = tokio::spawn(async move {
        for (sent, msg) in (1..).zip(messages) {
            if tx.send(msg).await.is_err() {
                return;
            }
            if step {
                while let Some(covered) = covered_rx.recv().await {
                    if covered >= sent {
                        break;
                    }
                }
            }
        }
        // Keep the stream open until the last status is in: closing it
        // early would end the daemon's stream before it reports.
        while covered_rx.recv().await.is_some() {}
        drop(tx);
    });

    let mut all_ok = true;
    // Statuses go to stdout until it closes (say, piped into head).
    let mut stdout = Some(std::io::stdout());
    let mut covered = 0;
    let wait = async {
        if total == 0 {
            return Ok(());
        }
        while let Some(response) = responses.next().await {
            let payload = response?.payload;
            match payload {
                Some(sync_response::Payload::BatchStatus(status)) => {
                    if let Some(out) = &mut stdout
                        && writeln!(out, "{}", json::to_line(&status)).is_err()
                    {
                        stdout = None;
                    }
                    all_ok &= is_ok(&status);
                    covered += u64::from(status.message_count);
                    let _ = covered_tx.send(covered);
                    if covered >= total {
                        return Ok(());
                    }
                }
                Some(sync_response::Payload::DataplaneInSync(_)) => {
                    eprintln!("calc-stub: dataplane in sync");
                }
                Some(sync_response::Payload::Heartbeat(_)) | None => {}
            }
        }
        Err(StubError::Other(
            "the daemon ended the stream before reporting every message".into(),
        ))
    };
    tokio::time::timeout(args.timeout, wait)
        .await
        .map_err(|_| {
            StubError::Other(format!(
                "timed out after {} waiting for the batches covering all {total} messages",
                humantime::format_duration(args.timeout)
            ))
        })??;
    drop(covered_tx);
    let _ = sender.await;
    // Our side is closed: let the daemon end the stream, so it sees a clean
    // close rather than a dropped connection.
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        while let Ok(Some(_)) = responses.message().await {}
    })
    .await;

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

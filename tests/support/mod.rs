//! Running the real binaries in tests: a vxmgrd on a private socket that is
//! stopped however the test ends, and calc-stub runs.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tempfile::TempDir;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use vxmgr::wire::felix::ToDataplane;
use vxmgr::wire::vxmgr::v1::{
    BatchStatus, DataplaneState, GetStateRequest, SyncResponse, sync_response::Payload,
};

pub const VXMGRD: &str = env!("CARGO_BIN_EXE_vxmgrd");
pub const CALC_STUB: &str = env!("CARGO_BIN_EXE_calc-stub");

/// How long vxmgrd may take to serve, or to log what a test waits for.
const DAEMON_WAIT: Duration = Duration::from_secs(30);

/// A running vxmgrd. Dropping it stops it (SIGTERM, then SIGKILL).
pub struct Daemon {
    child: Child,
    pub dir: TempDir,
    pub socket: PathBuf,
    log: Arc<Log>,
    /// Copies the daemon's stderr into `log`, to its end.
    log_copier: Option<std::thread::JoinHandle<()>>,
}

/// The daemon's stderr, and a way to wait for a line in it.
#[derive(Default)]
struct Log {
    text: Mutex<String>,
    grew: Condvar,
    /// Standard error is closed: nothing more will come.
    ended: AtomicBool,
}

impl Log {
    fn push(&self, line: &str) {
        let mut text = self.text.lock().unwrap();
        text.push_str(line);
        text.push('\n');
        self.grew.notify_all();
    }

    fn end(&self) {
        let _text = self.text.lock().unwrap();
        self.ended.store(true, Ordering::SeqCst);
        self.grew.notify_all();
    }
}

impl Daemon {
    /// Starts `vxmgrd --kernel memory --hostname node-a` with `extra`
    /// arguments, and waits until it serves.
    pub fn memory(extra: &[&str]) -> Daemon {
        Daemon::memory_with_env(extra, &[])
    }

    /// [`Daemon::memory`] with these variables in vxmgrd's environment.
    pub fn memory_with_env(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut args = vec!["--kernel", "memory", "--hostname", "node-a"];
        args.extend_from_slice(extra);
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("vxmgr.sock");
        Daemon::spawn(dir, socket, &args, env)
    }

    pub fn start(args: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("vxmgr.sock");
        Daemon::start_on(dir, socket, args)
    }

    pub fn start_on(dir: TempDir, socket: PathBuf, args: &[&str]) -> Daemon {
        Daemon::spawn(dir, socket, args, &[])
    }

    fn spawn(dir: TempDir, socket: PathBuf, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut command = Command::new(VXMGRD);
        command
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .envs(env.iter().copied())
            .env("VXMGR_LOG", "info,vxmgr=debug")
            .env("NO_COLOR", "1");
        Daemon::spawn_command(dir, socket, command)
    }

    /// Runs `command` (a vxmgrd serving on `socket`) with its standard
    /// error captured, and waits until it serves.
    pub fn spawn_command(dir: TempDir, socket: PathBuf, mut command: Command) -> Daemon {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("vxmgrd starts");
        let log = Arc::new(Log::default());
        let lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let sink = log.clone();
        let log_copier = std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.push(&line);
            }
            sink.end();
        });
        let mut daemon = Daemon {
            child,
            dir,
            socket,
            log,
            log_copier: Some(log_copier),
        };
        // Wait for the line that says the socket is served.
        let (serving, text) = {
            let log = &daemon.log;
            let text = log.text.lock().unwrap();
            let (text, _) = log
                .grew
                .wait_timeout_while(text, DAEMON_WAIT, |t| {
                    !t.contains("serving gRPC") && !log.ended.load(Ordering::SeqCst)
                })
                .unwrap();
            (text.contains("serving gRPC"), text.clone())
        };
        if !serving {
            // Dropping the daemon kills it if it still runs.
            let status = daemon.child.try_wait().expect("vxmgrd exit status");
            panic!(
                "vxmgrd did not serve within {DAEMON_WAIT:?} (exit status: {status:?}):\n{text}"
            );
        }
        daemon
    }

    /// What the daemon logged so far, for messages and for checks that
    /// something was logged; [`Daemon::terminate`] gives all of it.
    pub fn log(&self) -> String {
        self.log.text.lock().unwrap().clone()
    }

    /// Waits until the daemon has logged `count` lines containing `needle`.
    pub fn wait_for_log(&self, needle: &str, count: usize) {
        let text = self.log.text.lock().unwrap();
        let (text, timeout) = self
            .log
            .grew
            .wait_timeout_while(text, DAEMON_WAIT, |t| t.matches(needle).count() < count)
            .unwrap();
        assert!(
            !timeout.timed_out(),
            "vxmgrd did not log {needle:?} {count} times:\n{text}"
        );
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends SIGTERM and waits for the exit status and the end of the
    /// log: after this, [`Daemon::log`] is all the daemon wrote.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        signal(self.pid(), libc::SIGTERM);
        let status = self.child.wait().expect("vxmgrd exit status");
        self.join_log_copier();
        status
    }

    fn join_log_copier(&mut self) {
        if let Some(copier) = self.log_copier.take() {
            copier.join().expect("the log copier");
        }
    }

    /// Waits for the daemon to exit by itself; kills it and fails the test
    /// if it has not within 30 s.
    pub fn exit_status(&mut self) -> std::process::ExitStatus {
        let pid = self.pid();
        let log = self.log.clone();
        let (exited, status) = std::sync::mpsc::channel();
        let status = std::thread::scope(|scope| {
            let child = &mut self.child;
            scope.spawn(move || {
                let _ = exited.send(child.wait().expect("vxmgrd exit status"));
            });
            match status.recv_timeout(Duration::from_secs(30)) {
                Ok(status) => status,
                Err(_) => {
                    signal(pid, libc::SIGKILL);
                    let log = log.text.lock().unwrap();
                    panic!("vxmgrd did not exit within 30 s:\n{log}");
                }
            }
        });
        self.join_log_copier();
        status
    }

    /// A Sync that must be refused: its status.
    pub async fn refused_sync(&self) -> tonic::Status {
        // The typed client: what a calc process built on the proto sends.
        let (_tx, rx) = mpsc::channel::<ToDataplane>(1);
        self.client()
            .await
            .sync(ReceiverStream::new(rx))
            .await
            .expect_err("Sync refused")
    }

    /// A gRPC client on this daemon's socket.
    pub async fn client(
        &self,
    ) -> vxmgr::wire::vxmgr::v1::dataplane_client::DataplaneClient<tonic::transport::Channel> {
        vxmgr::client::dataplane(&self.socket)
            .await
            .expect("connect to vxmgrd")
    }

    /// GetState, from a fresh client.
    pub async fn state(&self) -> DataplaneState {
        self.client()
            .await
            .get_state(GetStateRequest {})
            .await
            .expect("GetState answered")
            .into_inner()
    }

    /// `calc-stub replay --socket <ours> <args>`.
    pub fn replay(&self, args: &[&str]) -> Output {
        calc_stub_replay(&self.socket, args)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal(self.pid(), libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// `calc-stub replay --socket <socket> <args>`.
pub fn calc_stub_replay(socket: &Path, args: &[&str]) -> Output {
    Command::new(CALC_STUB)
        .arg("replay")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("calc-stub runs")
}

/// `calc-stub replay --socket SOCKET ARGS` running on its own, its standard
/// output piped; dropping it kills it.
pub struct BackgroundReplay {
    child: Child,
}

impl BackgroundReplay {
    pub fn start<S: AsRef<OsStr>>(
        socket: &Path,
        args: impl IntoIterator<Item = S>,
    ) -> BackgroundReplay {
        let child = Command::new(CALC_STUB)
            .arg("replay")
            .arg("--socket")
            .arg(socket)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("calc-stub runs");
        BackgroundReplay { child }
    }

    /// Its standard output, line by line (once).
    pub fn lines(&mut self) -> impl Iterator<Item = String> + use<> {
        let stdout = self.child.stdout.take().expect("stdout taken once");
        BufReader::new(stdout).lines().map_while(Result::ok)
    }

    /// Waits for it to end, however it ends.
    pub fn wait(mut self) {
        let _ = self.child.wait();
    }
}

impl Drop for BackgroundReplay {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Writes `lines` as a .jsonl replay file in `dir`.
pub fn replay_file(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").expect("write replay file");
    path
}

/// The BatchStatus JSON lines calc-stub printed.
pub fn statuses(output: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("calc-stub prints JSON lines"))
        .collect()
}

/// Writes to stderr past the test harness's output capture (which takes
/// `eprintln!`), so that a skipped test is seen.
/// `curl` on `path`: the status code, the content type and the body.
pub fn http_get(address: &str, path: &str) -> (u16, String, String) {
    let output = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "30"])
        .args(["--write-out", "\n%{http_code} %{content_type}"])
        .arg(format!("http://{address}{path}"))
        .output()
        .expect("curl runs (apt-get install curl)");
    assert!(output.status.success(), "{}", stderr(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, trailer) = text.rsplit_once('\n').unwrap();
    let (code, content_type) = trailer.split_once(' ').unwrap();
    (
        code.parse().unwrap(),
        content_type.to_string(),
        body.to_string(),
    )
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
pub mod cni;
pub mod felix;
pub mod flannel;
pub mod kube;
pub mod netns;
pub mod require;
pub use require::say;
/// The namespace testbed, from calc-stub's sources (its demo runs on it).
/// Each test uses a part of it.
#[path = "../../calc-stub/testbed/mod.rs"]
#[allow(unused_imports)]
pub mod testbed;

/// An open Sync stream. Messages go as bytes, so that a test can send what
/// a typed client could not: Felix's kinds vxmgr does not know, bytes that
/// do not decode.
pub struct Stream {
    tx: Option<mpsc::Sender<Bytes>>,
    pub responses: tonic::Streaming<SyncResponse>,
    /// The sequence number `apply` gives its next message.
    next_sequence: u64,
}

impl Stream {
    pub async fn open(daemon: &Daemon) -> Stream {
        Stream::connect(&daemon.socket).await
    }

    /// Opens a Sync stream to the daemon on `socket`.
    pub async fn connect(socket: &Path) -> Stream {
        let (tx, rx) = mpsc::channel(64);
        let responses = vxmgr::client::sync_bytes(socket, ReceiverStream::new(rx))
            .await
            .expect("Sync accepted");
        Stream {
            tx: Some(tx),
            responses,
            next_sequence: 1,
        }
    }

    pub async fn send(&self, messages: Vec<ToDataplane>) {
        self.send_bytes(messages.iter().map(encode).collect()).await;
    }

    pub async fn send_bytes(&self, messages: Vec<Bytes>) {
        let tx = self.tx.as_ref().expect("send side open");
        for m in messages {
            tx.send(m).await.expect("stream open");
        }
    }

    /// Another way in to the request stream (which stays open while it lives).
    pub fn sender(&self) -> mpsc::Sender<Bytes> {
        self.tx.clone().expect("send side open")
    }

    /// Ends the request stream (as `grpcurl -d @` does at the end of its
    /// input); responses still come.
    pub fn close_send(&mut self) {
        self.tx = None;
    }

    /// Sends `messages` numbered on from the previous ones `apply` sent,
    /// and returns the batch statuses up to the one covering the last.
    pub async fn apply(&mut self, messages: Vec<ToDataplane>) -> Vec<BatchStatus> {
        let first = self.next_sequence;
        let last = first + messages.len() as u64 - 1;
        self.next_sequence = last + 1;
        let numbered = (first..)
            .zip(messages)
            .map(|(sequence, mut msg)| {
                msg.sequence_number = sequence;
                msg
            })
            .collect();
        self.send(numbered).await;
        self.statuses_until(last).await
    }

    /// The batch statuses up to the one covering message `last`.
    pub async fn statuses_until(&mut self, last: u64) -> Vec<BatchStatus> {
        let mut statuses = Vec::new();
        loop {
            let status = self.next_status().await;
            let done = status.last_sequence >= last;
            statuses.push(status);
            if done {
                return statuses;
            }
        }
    }

    /// The batch statuses until they cover `count` messages (counted, so
    /// whatever the messages' numbers).
    pub async fn statuses_covering(&mut self, count: u32) -> Vec<BatchStatus> {
        let mut statuses = Vec::new();
        let mut covered = 0;
        while covered < count {
            let status = self.next_status().await;
            covered += status.message_count;
            statuses.push(status);
        }
        statuses
    }

    /// The next batch status, skipping other responses.
    pub async fn next_status(&mut self) -> BatchStatus {
        self.next(|p| match p {
            Payload::BatchStatus(s) => Some(s),
            _ => None,
        })
        .await
    }

    /// The next response whose payload `want` picks, skipping the others.
    pub async fn next<T>(&mut self, mut want: impl FnMut(Payload) -> Option<T>) -> T {
        let wait = async {
            while let Some(r) = self.responses.next().await {
                if let Some(t) = r.expect("response").payload.and_then(&mut want) {
                    return t;
                }
            }
            panic!("the stream ended");
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .expect("response within 30 s")
    }

    /// Reads on until the stream fails; its status.
    pub async fn failure(&mut self) -> tonic::Status {
        loop {
            match self.responses.message().await {
                Err(status) => return status,
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without an error"),
            }
        }
    }

    pub async fn batch_covering(&mut self, sequence: u64) {
        self.statuses_until(sequence).await;
    }
}

/// A message's bytes, as prost encodes it.
pub fn encode(message: &ToDataplane) -> Bytes {
    message.encode_to_vec().into()
}

/// What a status covers: first and last sequence number, message count.
pub type Covered = (u64, u64, u32);

pub fn covered(status: &BatchStatus) -> Covered {
    (
        status.first_sequence,
        status.last_sequence,
        status.message_count,
    )
}

/// The runs of consecutive numbers that `statuses` cover: how the messages
/// were split into batches depends on when they arrived, but a run never
/// spans a break in the numbers.
pub fn covered_runs(statuses: &[BatchStatus]) -> Vec<Covered> {
    let mut runs: Vec<Covered> = Vec::new();
    for (first, last, count) in statuses.iter().map(covered) {
        match runs.last_mut() {
            Some(run) if run.1.checked_add(1) == Some(first) => {
                run.1 = last;
                run.2 += count;
            }
            _ => runs.push((first, last, count)),
        }
    }
    runs
}

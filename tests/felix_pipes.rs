//! vxmgrd as Felix's external dataplane driver, started exactly as Felix
//! starts one: no arguments, configured by its environment alone, Felix's
//! messages on fd 3 and its reports read back from fd 4, each framed with
//! an 8-byte little-endian length (Felix's felix/dataplane/external).

mod support;

use std::fs::File;
use std::io::{BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use nix::fcntl::OFlag;
use prost::Message;
use support::{Daemon, VXMGRD, felix};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use vxmgr::wire::MAX_MESSAGE_BYTES;
use vxmgr::wire::felix::{
    FromDataplane, RouteRemove, RouteUpdate, ToDataplane, from_dataplane, to_dataplane::Payload,
};
use vxmgr::wire::framing::{Frame, FrameReader};

/// vxmgrd running as Felix's driver, and Felix's ends of the pipes.
struct Driver {
    daemon: Daemon,
    /// Felix's end of fd 3; dropping it is Felix closing the stream.
    calc: Option<File>,
    /// What vxmgrd wrote to fd 4, message by message.
    reports: mpsc::Receiver<FromDataplane>,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe")
}

/// In the child, between fork and exec: `fd` becomes `target` and stays
/// open across exec. Copied above 3 and 4 first, so that placing one end
/// cannot close the other.
fn inherit_as(fds: [(RawFd, RawFd); 2]) -> std::io::Result<()> {
    let mut high = [0; 2];
    for (i, (fd, _)) in fds.iter().enumerate() {
        // SAFETY: fcntl and dup2 are async-signal-safe, as pre_exec needs.
        high[i] = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10) };
        if high[i] < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    for (i, (_, target)) in fds.iter().enumerate() {
        // SAFETY: as above; dup2 leaves the new fd without close-on-exec.
        if unsafe { libc::dup2(high[i], *target) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Felix's environment (some of it) and vxmgrd's settings.
fn environment(dir: &std::path::Path) -> Vec<(String, String)> {
    [
        ("FELIX_USEINTERNALDATAPLANEDRIVER", "false"),
        ("FELIX_DATAPLANEDRIVER", VXMGRD),
        ("FELIX_FELIXHOSTNAME", "node-a"),
        ("VXMGR_CALC_SOURCE", "felix-pipes"),
        ("VXMGR_KERNEL", "memory"),
        ("VXMGR_HOSTNAME", "node-a"),
        ("VXMGR_HEARTBEAT_INTERVAL", "50ms"),
        ("VXMGR_BATCH_INTERVAL", "5ms"),
        ("VXMGR_LOG", "info,vxmgr=debug"),
        ("NO_COLOR", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([(
        "VXMGR_SOCKET".to_string(),
        dir.join("vxmgr.sock").display().to_string(),
    )])
    .collect()
}

impl Driver {
    fn start() -> Driver {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("vxmgr.sock");
        let (calc_child, calc) = pipe();
        let (reports, reports_child) = pipe();
        let mut command = Command::new(VXMGRD);
        command.env_clear().envs(environment(dir.path()));
        let fds = [(calc_child.as_raw_fd(), 3), (reports_child.as_raw_fd(), 4)];
        // SAFETY: the closure calls only async-signal-safe functions.
        unsafe {
            command.pre_exec(move || inherit_as(fds));
        }
        let daemon = Daemon::spawn_command(dir, socket, command);
        // As Felix does: its copies of the child's ends close once it runs.
        drop((calc_child, reports_child));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut frames = FrameReader::new(BufReader::new(File::from(reports)), 1 << 20);
            while let Ok(Some(Frame::Whole(body))) = frames.next_frame() {
                let report = FromDataplane::decode(body.as_slice()).expect("a FromDataplane");
                if tx.send(report).is_err() {
                    return;
                }
            }
        });
        Driver {
            daemon,
            calc: Some(File::from(calc)),
            reports: rx,
        }
    }

    /// Writes `messages` to fd 3 in Felix's framing.
    fn send(&mut self, messages: &[Bytes]) {
        let calc = self.calc.as_mut().expect("fd 3 open");
        for m in messages {
            calc.write_all(&(m.len() as u64).to_le_bytes()).unwrap();
            calc.write_all(m).unwrap();
        }
    }

    /// The next report vxmgrd wrote to fd 4.
    fn next_report(&self) -> from_dataplane::Payload {
        let report = self
            .reports
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no report on fd 4 ({e}):\n{}", self.daemon.log()));
        report.payload.expect("a payload")
    }

    /// Reads reports until DataplaneInSync; heartbeats may come before it.
    fn wait_for_in_sync(&self) {
        loop {
            match self.next_report() {
                from_dataplane::Payload::ProcessStatusUpdate(h) => {
                    assert!(h.iso_timestamp.ends_with('Z'), "{h:?}");
                }
                from_dataplane::Payload::DataplaneInSync(_) => return,
            }
        }
    }

    /// Felix closes fd 3: vxmgrd's exit status and its log.
    fn close(mut self) -> (std::process::ExitStatus, String) {
        self.calc = None;
        let status = self.daemon.exit_status();
        (status, self.daemon.log())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vxmgrd_runs_as_felixs_dataplane_driver() {
    let mut driver = Driver::start();
    // Felix's stream: ConfigUpdate, the snapshot with the kinds vxmgr
    // ignores in between, InSync; numbered from 0.
    driver.send(&felix::two_node_stream());
    driver.wait_for_in_sync();
    // Heartbeats go on, and DataplaneInSync comes once.
    match driver.next_report() {
        from_dataplane::Payload::ProcessStatusUpdate(h) => {
            assert!(h.uptime > 0.0, "{h:?}");
        }
        from_dataplane::Payload::DataplaneInSync(_) => panic!("DataplaneInSync twice"),
    }

    // GetState, health and reflection stay on the socket.
    let state = driver.daemon.state().await;
    assert!(state.in_sync);
    let batch = state.last_batch.expect("a batch applied");
    assert_eq!(batch.last_sequence, 9, "Felix's own numbers");
    let v4 = state.ipv4.expect("IPv4");
    let device = v4.device.expect("the device");
    assert_eq!((device.vni, device.port), (4096, 4789));
    let tunnel: Vec<&str> = v4.tunnel_routes.iter().map(|r| r.dst.as_str()).collect();
    assert_eq!(tunnel, ["10.244.1.0/26"]);
    assert_eq!(v4.blackhole_routes, ["10.244.0.0/26"]);
    let channel = vxmgr::client::connect(&driver.daemon.socket).await.unwrap();
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "vxmgr.v1.Dataplane".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);

    // Felix is the calc process: a Sync on the socket is refused.
    let refused = driver.daemon.refused_sync().await;
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("Felix's pipes"),
        "{}",
        refused.message()
    );

    // Felix closes fd 3 (it is stopping or restarting): vxmgrd exits 0.
    let (status, log) = driver.close();
    assert!(status.success(), "{status}\n{log}");
    assert!(log.contains("Felix closed fd 3"), "{log}");
}

#[test]
fn without_felixs_fds_vxmgrd_says_how_it_must_be_started() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(VXMGRD);
    command.env_clear().envs(environment(dir.path()));
    // SAFETY: close is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::close(3);
            libc::close(4);
            Ok(())
        });
    }
    let output = command.output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let err = support::stderr(&output);
    assert!(
        err.contains("fd 3 is not open") && err.contains("FELIX_DATAPLANEDRIVER"),
        "{err}"
    );
    assert!(!dir.path().join("vxmgr.sock").exists(), "nothing served");
}

/// `RouteRemove` of the remote block, numbered `sequence_number`.
fn remove_remote_block(sequence_number: u64) -> Bytes {
    support::encode(&ToDataplane {
        sequence_number,
        payload: Some(Payload::RouteRemove(RouteRemove {
            dst: "10.244.1.0/26".into(),
        })),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_frame_is_reported_and_a_truncated_one_ends_the_driver() {
    let mut driver = Driver::start();
    driver.send(&felix::two_node_stream());
    driver.wait_for_in_sync();
    // A frame that does not decode takes number 10; the stream goes on.
    driver.send(&[Bytes::from_static(&[0x0f, 0x01]), remove_remote_block(11)]);
    driver.daemon.wait_for_log("last=11", 1);
    let log = driver.daemon.log();
    assert!(
        log.contains("message refused sequence=10")
            && log.contains("a message of 2 bytes does not decode as a ToDataplane"),
        "{log}"
    );
    let v4 = driver.daemon.state().await.ipv4.unwrap();
    assert!(v4.tunnel_routes.is_empty(), "the remove after it applied");
    // Felix goes away in the middle of a message.
    let calc = driver.calc.as_mut().unwrap();
    calc.write_all(&100u64.to_le_bytes()).unwrap();
    calc.write_all(&[0; 10]).unwrap();
    let (status, log) = driver.close();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("Felix's messages on fd 3: truncated frame at byte"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_over_the_limit_are_read_past_without_being_held() {
    let mut driver = Driver::start();
    driver.send(&felix::two_node_stream());
    driver.wait_for_in_sync();
    let over = MAX_MESSAGE_BYTES + 1;
    let huge_route = support::encode(&ToDataplane {
        sequence_number: 11,
        payload: Some(Payload::RouteUpdate(RouteUpdate {
            dst: "9".repeat(over),
            ..Default::default()
        })),
    });
    driver.send(&[
        // A kind vxmgr ignores: skipped.
        felix::ipset_update(10, over),
        // A kind vxmgr applies: refused, its number reported.
        huge_route.clone(),
        remove_remote_block(12),
    ]);
    driver.daemon.wait_for_log("last=12", 1);
    let log = driver.daemon.log();
    assert!(
        log.contains("skipped a large message of a kind vxmgr does not use sequence=10 field=2"),
        "{log}"
    );
    let refusal = format!(
        "message refused sequence=11 reason=a route_update of {} bytes is over the 64 MiB limit",
        huge_route.len()
    );
    assert!(log.contains(&refusal), "{log}");
    let v4 = driver.daemon.state().await.ipv4.unwrap();
    assert!(v4.tunnel_routes.is_empty(), "the remove after them applied");
    let (status, log) = driver.close();
    assert!(status.success(), "{status}\n{log}");
}

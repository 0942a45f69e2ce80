//! vxmgrd as a process, kernel-free (memory backend): the socket, the one
//! active stream, heartbeats, DataplaneInSync, health, recording, shutdown.

mod support;

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use prost::Message;
use support::{Covered, Daemon, Stream, VXMGRD, covered_runs, felix};
use tokio_stream::StreamExt;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use vxmgr::wire::felix::ToDataplane;
use vxmgr::wire::vxmgr::v1::{
    BatchResult, DataplaneState, GetStateRequest, sync_response::Payload,
};
use vxmgr::wire::{json, replay};

fn two_nodes() -> Vec<ToDataplane> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays/two-nodes.jsonl");
    let mut messages = replay::read_file(&path).expect("replay file");
    for (i, m) in messages.iter_mut().enumerate() {
        m.sequence_number = i as u64 + 1;
    }
    messages
}

#[tokio::test]
async fn a_second_sync_is_refused_naming_the_active_peer() {
    let daemon = Daemon::memory(&[]);
    let _first = Stream::open(&daemon).await;
    let err = daemon.refused_sync().await;
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let me = format!("pid {} uid {}", std::process::id(), nix::unistd::getuid());
    assert!(err.message().contains(&me), "{}", err.message());
}

// Multi-threaded: waiting for the log blocks this thread while the client
// connection still has to send the end of the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_frees_when_the_stream_ends_and_state_stays() {
    let daemon = Daemon::memory(&[]);
    let mut first = Stream::open(&daemon).await;
    first.send(two_nodes()).await;
    first.batch_covering(7).await;
    drop(first);
    daemon.wait_for_log("calc stream ended", 1);
    let state = daemon.state().await;
    let v4 = state.ipv4.unwrap();
    assert_eq!(v4.tunnel_routes.len(), 1, "intent stays");
    assert_eq!(v4.blackhole_routes, ["10.244.0.0/26"]);
    // The slot is free for the next calc process.
    Stream::open(&daemon).await;
}

#[tokio::test]
async fn heartbeats_and_one_dataplane_in_sync() {
    let daemon = Daemon::memory(&["--heartbeat-interval", "20ms"]);
    let mut stream = Stream::open(&daemon).await;
    stream.send(two_nodes()).await;
    let mut in_sync = 0;
    let mut heartbeats = 0;
    let mut covered = false;
    while !(covered && in_sync == 1 && heartbeats >= 2) {
        stream
            .next(|p| {
                match p {
                    Payload::BatchStatus(s) => covered |= s.last_sequence == 7,
                    Payload::DataplaneInSync(_) => in_sync += 1,
                    Payload::Heartbeat(h) => {
                        assert!(h.iso_timestamp.ends_with('Z'), "{h:?}");
                        heartbeats += 1;
                    }
                }
                Some(())
            })
            .await;
    }
    // More updates after InSync: no second DataplaneInSync.
    let mut more = two_nodes();
    more.truncate(3);
    for (i, m) in more.iter_mut().enumerate() {
        m.sequence_number = 8 + i as u64;
    }
    stream.send(more).await;
    loop {
        let done = stream
            .next(|p| match p {
                Payload::BatchStatus(s) => Some(s.last_sequence == 10),
                Payload::DataplaneInSync(_) => panic!("DataplaneInSync sent twice"),
                Payload::Heartbeat(_) => Some(false),
            })
            .await;
        if done {
            break;
        }
    }
}

#[tokio::test]
async fn health_is_not_serving_until_in_sync() {
    let daemon = Daemon::memory(&[]);
    let channel = vxmgr::client::connect(&daemon.socket).await.unwrap();
    let mut health = HealthClient::new(channel);
    let request = || HealthCheckRequest {
        service: "vxmgr.v1.Dataplane".into(),
    };
    let status = health.check(request()).await.unwrap().into_inner().status;
    assert_eq!(status, ServingStatus::NotServing as i32);
    let mut watch = health.watch(request()).await.unwrap().into_inner();
    let mut stream = Stream::open(&daemon).await;
    stream.send(two_nodes()).await;
    stream.batch_covering(7).await;
    let serving = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(update) = watch.next().await {
            if update.unwrap().status == ServingStatus::Serving as i32 {
                return true;
            }
        }
        false
    })
    .await
    .expect("health changes within 30 s");
    assert!(serving);
}

#[tokio::test]
async fn a_client_that_half_closes_after_in_sync_still_hears_it() {
    let daemon = Daemon::memory(&[]);
    let mut stream = Stream::open(&daemon).await;
    stream.send(two_nodes()).await;
    stream.close_send();
    stream.batch_covering(7).await;
    stream
        .next(|p| matches!(p, Payload::DataplaneInSync(_)).then_some(()))
        .await;
    let channel = vxmgr::client::connect(&daemon.socket).await.unwrap();
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "vxmgr.v1.Dataplane".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);
    // Its responses end once the daemon is done with its messages.
    assert!(stream.responses.message().await.unwrap().is_none());
}

/// GetState without what differs between runs (the last batch).
fn comparable(mut state: DataplaneState) -> DataplaneState {
    state.last_batch = None;
    state
}

// Multi-threaded: calc-stub's replay blocks this thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_is_what_was_received_and_replays_to_the_same_state() {
    let sent = felix::two_node_stream();
    let dir = tempfile::tempdir().unwrap();
    for name in ["capture.bin", "capture.jsonl"] {
        let record = dir.path().join(name);
        let daemon = Daemon::memory(&["--record", record.to_str().unwrap()]);
        let mut stream = Stream::open(&daemon).await;
        stream.send_bytes(sent.clone()).await;
        stream.batch_covering(9).await;
        if name.ends_with(".bin") {
            // Felix framing, every message byte for byte: the kinds and the
            // field vxmgr does not know are in it.
            let framed: Vec<u8> = sent
                .iter()
                .flat_map(|m| (m.len() as u64).to_le_bytes().into_iter().chain(m.to_vec()))
                .collect();
            assert!(std::fs::read(&record).unwrap() == framed, "{name}");
        } else {
            let decoded: Vec<ToDataplane> = sent
                .iter()
                .map(|m| ToDataplane::decode(m.clone()).unwrap())
                .collect();
            assert_eq!(replay::read_file(&record).unwrap(), decoded, "{name}");
        }
        let state = comparable(daemon.state().await);

        let replayed = Daemon::memory(&[]);
        let output = replayed.replay(&[record.to_str().unwrap()]);
        assert!(output.status.success(), "{}", support::stderr(&output));
        let statuses = support::statuses(&output);
        let count: u64 = statuses
            .iter()
            .map(|s| s["messageCount"].as_u64().unwrap())
            .sum();
        assert_eq!(count, 10, "nothing dropped: {statuses:?}");
        let last = statuses.last().unwrap();
        assert_eq!(last["lastSequence"], "9", "numbers as sent: {statuses:?}");
        assert_eq!(comparable(replayed.state().await), state, "{name}");
    }
}

/// A memory-kernel daemon serving on `socket`, which must be 0600.
fn private_daemon_on(socket: &Path) -> Daemon {
    let daemon = Daemon::start_on(
        tempfile::tempdir().unwrap(),
        socket.to_path_buf(),
        &["--kernel", "memory", "--hostname", "node-a"],
    );
    let mode = std::fs::metadata(socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    daemon
}

/// A second memory-kernel daemon on `socket` stops at start, saying why.
fn assert_a_second_daemon_is_refused(socket: &Path) {
    let second = Command::new(VXMGRD)
        .arg("--socket")
        .arg(socket)
        .args(["--kernel", "memory", "--hostname", "node-a"])
        .output()
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("another vxmgrd is already serving on"),
        "{err}"
    );
}

#[test]
fn the_socket_is_private_and_a_stale_one_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/vxmgr.sock");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    // A socket file nobody serves: what a crashed daemon leaves.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut daemon = private_daemon_on(&socket);

    assert_a_second_daemon_is_refused(&socket);

    let status = daemon.terminate();
    assert!(status.success(), "SIGTERM is a clean stop: {status}");
    assert!(!socket.exists(), "the socket is removed on exit");
}

#[test]
fn a_second_daemon_is_refused_even_when_the_first_ones_socket_file_was_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vxmgr.sock");
    let mut daemon = private_daemon_on(&socket);
    std::fs::remove_file(&socket).unwrap();

    assert_a_second_daemon_is_refused(&socket);
    assert!(!socket.exists(), "the refused daemon bound nothing");

    let status = daemon.terminate();
    assert!(status.success(), "SIGTERM is a clean stop: {status}");
    // Its lock went with it: the next daemon starts.
    private_daemon_on(&socket).terminate();
}

#[tokio::test]
async fn the_socket_directory_is_created_and_holds_only_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/nested/vxmgr/dataplane.sock");
    let daemon = private_daemon_on(&socket);
    let entries: Vec<_> = std::fs::read_dir(socket.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut entries: Vec<_> = entries.iter().map(|e| e.to_string_lossy()).collect();
    entries.sort();
    assert_eq!(
        entries,
        ["dataplane.sock", "dataplane.sock.lock"],
        "nothing left from binding"
    );
    // Served on the socket's final path.
    assert_eq!(daemon.state().await.hostname, "node-a");
}

#[test]
fn a_socket_group_opens_the_socket_to_that_group() {
    let group = nix::unistd::Group::from_gid(nix::unistd::getgid())
        .unwrap()
        .expect("our group has a name");
    let daemon = Daemon::memory(&["--socket-group", &group.name]);
    let meta = std::fs::metadata(&daemon.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), group.gid.as_raw());
}

#[test]
fn bad_flags_are_refused_with_their_value() {
    for (flag, value) in [
        ("--vxlan-vni", "16777216"),
        ("--vxlan-port", "65536"),
        ("--vxlan-mtu-v6", "1000"),
        ("--external-nodes-cidr", "10.0.0.0/33"),
        ("--route-protocol", "256"),
        ("--vxlan-mtu", "67"),
        ("--route-refresh-interval", "soon"),
        ("--contest-window", "2d"),
    ] {
        let out = Command::new(VXMGRD)
            .args(["--kernel", "memory", flag, value])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(value) && err.contains(flag), "{err}");
    }
}

// Multi-threaded: the end of the stream has to reach the daemon while this
// test waits for the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_message_is_rejected_and_the_rest_applies() {
    let daemon = Daemon::memory(&[]);
    let mut stream = Stream::open(&daemon).await;
    let lines = [
        r#"{"vtepUpdate": {"node": "node-b", "mac": "66:aa:00:00:00:02", "ipv4Addr": "10.244.1.0", "parentDeviceIp": "192.168.10.2"}}"#,
        r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.244.1.0/26", "dstNodeName": "node-b"}}"#,
        r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.244.1.0/33", "dstNodeName": "node-b"}}"#,
        r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.244.1.64/26", "dstNodeName": "node-b"}}"#,
    ];
    let messages = lines
        .iter()
        .enumerate()
        .map(|(i, line)| ToDataplane {
            sequence_number: i as u64 + 1,
            ..json::from_str(line).expect("test JSON")
        })
        .collect();
    stream.send(messages).await;
    stream.close_send();
    let statuses = stream.statuses_covering(4).await;
    assert_eq!(covered_runs(&statuses), [(1, 4, 4)], "{statuses:?}");
    let (with_bad, others): (Vec<_>, Vec<_>) = statuses
        .iter()
        .partition(|s| s.first_sequence <= 3 && 3 <= s.last_sequence);
    let [status] = with_bad[..] else {
        panic!("one status covers message 3: {statuses:?}");
    };
    // Batches close by backpressure, so on a busy host the bad message may
    // make a batch of its own: then nothing in it applied.
    let expected = if status.message_count > 1 {
        BatchResult::Partial
    } else {
        BatchResult::Failed
    };
    assert_eq!(status.result, expected as i32, "{status:?}");
    assert_eq!(status.rejected.len(), 1, "{status:?}");
    assert_eq!(status.rejected[0].sequence_number, 3);
    assert!(
        status.rejected[0].reason.contains("\"10.244.1.0/33\""),
        "{}",
        status.rejected[0].reason
    );
    assert!(
        others.iter().all(|s| s.result == BatchResult::Ok as i32),
        "{statuses:?}"
    );
    let state = daemon.state().await;
    let v4 = state.ipv4.unwrap();
    let routes: Vec<&str> = v4.tunnel_routes.iter().map(|r| r.dst.as_str()).collect();
    assert_eq!(routes, ["10.244.1.0/26", "10.244.1.64/26"]);
    assert_eq!(v4.remote_vteps.len(), 1);
}

/// The runs of numbers covered by the statuses of one stream that sends
/// messages numbered `numbers` and closes.
async fn runs_of_a_stream_numbered(numbers: &[u64]) -> Vec<Covered> {
    let daemon = Daemon::memory(&[]);
    let mut stream = Stream::open(&daemon).await;
    let messages = two_nodes().into_iter().cycle().zip(numbers);
    stream
        .send(
            messages
                .map(|(msg, &sequence_number)| ToDataplane {
                    sequence_number,
                    ..msg
                })
                .collect(),
        )
        .await;
    stream.close_send();
    let statuses = stream.statuses_covering(numbers.len() as u32).await;
    covered_runs(&statuses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_message_is_reported_once_under_the_number_it_was_sent_with() {
    let cases: [(&str, &[u64], &[Covered]); 5] = [
        ("Felix numbers from 0", &[0, 1, 2, 3], &[(0, 3, 4)]),
        ("numbered from 1", &[1, 2, 3], &[(1, 3, 3)]),
        ("no numbers: by position from 0", &[0, 0, 0], &[(0, 2, 3)]),
        ("no number: the next one", &[5, 0, 0], &[(5, 7, 3)]),
        (
            "counting starts again: never in a batch with the earlier numbers",
            &[1, 2, 3, 1, 2],
            &[(1, 3, 3), (1, 2, 2)],
        ),
    ];
    for (what, numbers, want) in cases {
        assert_eq!(runs_of_a_stream_numbered(numbers).await, want, "{what}");
    }
}

#[tokio::test]
async fn a_flag_beats_the_environment_and_both_beat_the_calc_config() {
    let daemon = Daemon::memory_with_env(&["--vxlan-vni", "77"], &[("VXMGR_VXLAN_PORT", "9000")]);
    let mut stream = Stream::open(&daemon).await;
    let mut messages = two_nodes();
    messages[0] = ToDataplane {
        sequence_number: 1,
        ..json::from_str(
            r#"{"configUpdate": {"config": {"VXLANVNI": "5000", "VXLANPort": "4790", "VXLANMTU": "1300"}}}"#,
        )
        .unwrap()
    };
    stream.send(messages).await;
    stream.batch_covering(7).await;
    let state = daemon.state().await;
    let device = state.ipv4.unwrap().device.expect("the device is up");
    assert_eq!(
        (device.vni, device.port, device.mtu),
        (77, 9000, 1300),
        "VNI from the flag, port from the environment, MTU from the calc"
    );
}

#[test]
fn the_route_refresh_flag_takes_a_duration_or_bare_seconds() {
    for value in ["2m", "90s", "45", "0"] {
        // Starting fails the test if vxmgrd refuses the value.
        let status = Daemon::memory(&["--route-refresh-interval", value]).terminate();
        assert!(
            status.success(),
            "--route-refresh-interval {value}: {status}"
        );
    }
}

#[tokio::test]
async fn get_state_reads_well_as_json() {
    let daemon = Daemon::memory(&[]);
    let mut stream = Stream::open(&daemon).await;
    stream.send(two_nodes()).await;
    stream.batch_covering(7).await;
    let state = daemon.state().await;
    let v = json::to_value(&state);
    assert_eq!(v["ipv4"]["device"]["mac"], "66:aa:00:00:00:01");
    assert_eq!(v["ipv4"]["fdbEntries"][0]["destination"], "192.168.10.2");
    assert_eq!(v["ipv4"]["ipsetMembers"][0], "192.168.10.2/32");
    assert_eq!(v["lastBatch"]["lastSequence"], "7");
}

#[test]
fn in_sync_is_reported_only_from_the_batch_that_holds_it() {
    let daemon = Daemon::memory(&[]);
    let cluster = daemon.dir.path().join("cluster.bin");
    let generated = Command::new(support::CALC_STUB)
        .args([
            "generate",
            "--nodes",
            "3000",
            "--blocks-per-node",
            "4",
            "-o",
        ])
        .arg(&cluster)
        .output()
        .unwrap();
    assert!(
        generated.status.success(),
        "{}",
        support::stderr(&generated)
    );
    let output = daemon.replay(&[cluster.to_str().unwrap()]);
    assert!(output.status.success(), "{}", support::stderr(&output));
    let statuses = support::statuses(&output);
    // The messages carry no numbers: the daemon numbers them from 0.
    let last: u64 = 1 + 3000 + 3000 * 4 + 2999;
    for s in &statuses {
        let covers_in_sync = s["lastSequence"].as_str().unwrap().parse::<u64>().unwrap() == last;
        assert_eq!(s["inSync"] == true, covers_in_sync, "{s}");
    }
}

#[tokio::test]
async fn only_allowed_uids_get_in() {
    let me = nix::unistd::getuid().as_raw();
    let stranger = me.wrapping_add(4242).to_string();
    let refusing = Daemon::memory(&["--allow-uid", &stranger]);
    let refused = match vxmgr::client::dataplane(&refusing.socket).await {
        Err(_) => true,
        Ok(mut client) => client.get_state(GetStateRequest {}).await.is_err(),
    };
    assert!(refused, "uid {me} is not in --allow-uid {stranger}");
    refusing.wait_for_log("refused a connection from a uid not allowed", 1);

    let allowing = Daemon::memory(&["--allow-uid", &format!("{stranger},{me}")]);
    // An allowed uid gets in.
    assert_eq!(allowing.state().await.hostname, "node-a");
}

/// Inodes of the TCP sockets in LISTEN state, from /proc/net/tcp{,6}.
fn listening_tcp_inodes() -> Vec<String> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}")))
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
                .filter(|fields| fields.get(3).is_some_and(|st| st == "0A"))
                .filter_map(|mut fields| (fields.len() > 9).then(|| fields.swap_remove(9)))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn there_is_no_tcp_listener() {
    let daemon = Daemon::memory(&[]);
    // A listener of the test's own shows that listeners are seen at all.
    let own = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let own_inode = socket_inode(&format!("/proc/self/fd/{}", own.as_raw_fd()));
    let listening = listening_tcp_inodes();
    assert!(
        own_inode.as_ref().is_some_and(|i| listening.contains(i)),
        "the test's own listener ({own_inode:?}) is not among {listening:?}"
    );
    let fds = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid())).unwrap();
    for fd in fds {
        if let Some(inode) = socket_inode(&fd.unwrap().path().to_string_lossy()) {
            assert!(
                !listening.contains(&inode),
                "vxmgrd listens on TCP (socket inode {inode})"
            );
        }
    }
}

/// The inode of the socket a `/proc/<pid>/fd/<n>` link points to; `None`
/// for another kind of file, or an fd closed meanwhile.
fn socket_inode(fd: &str) -> Option<String> {
    let target = std::fs::read_link(fd).ok()?;
    let target = target.to_string_lossy();
    let inode = target.strip_prefix("socket:[")?.strip_suffix(']')?;
    Some(inode.to_string())
}

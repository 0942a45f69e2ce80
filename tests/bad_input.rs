//! Malformed input, table-driven: every bad message is rejected with a
//! reason that quotes its value, every good message beside it applies, and
//! the daemon stays up. Also junk on the socket and oversized messages.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use bytes::Bytes;
use support::{Daemon, Stream, covered, covered_runs, encode, felix};
use vxmgr::wire::felix::{RouteUpdate, ToDataplane, to_dataplane::Payload};
use vxmgr::wire::vxmgr::v1::RejectedMessage;
use vxmgr::wire::{MAX_MESSAGE_BYTES, json};

const NODE_A: &str = r#"{"vtepUpdate": {"node": "node-a", "mac": "66:aa:00:00:00:01", "ipv4Addr": "10.244.0.0", "parentDeviceIp": "192.168.10.1"}}"#;
const NODE_B: &str = r#"{"vtepUpdate": {"node": "node-b", "mac": "66:aa:00:00:00:02", "ipv4Addr": "10.244.1.0", "parentDeviceIp": "192.168.10.2"}}"#;

fn route(dst: &str, node_ip: &str) -> String {
    format!(
        r#"{{"routeUpdate": {{"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "{dst}", "dstNodeName": "node-b", "dstNodeIp": "{node_ip}"}}}}"#
    )
}

fn vtep(node: &str, mac: &str, ip: &str, parent: &str) -> String {
    format!(
        r#"{{"vtepUpdate": {{"node": "{node}", "mac": "{mac}", "ipv4Addr": "{ip}", "parentDeviceIp": "{parent}"}}}}"#
    )
}

fn vtep_v6(node: &str, mac: &str, ip: &str, parent: &str) -> String {
    format!(
        r#"{{"vtepUpdate": {{"node": "{node}", "macV6": "{mac}", "ipv6Addr": "{ip}", "parentDeviceIpv6": "{parent}"}}}}"#
    )
}

fn config(key: &str, value: &str) -> String {
    format!(r#"{{"configUpdate": {{"config": {{"{key}": "{value}"}}}}}}"#)
}

/// (what, the bad message, a piece of the reason that quotes the value)
fn cases() -> Vec<(&'static str, String, String)> {
    let huge = "1".repeat(100_000);
    vec![
        (
            "prefix length out of range",
            route("10.244.9.0/33", ""),
            "\"10.244.9.0/33\"".into(),
        ),
        (
            "IPv6 prefix length out of range",
            route("fd00::/129", ""),
            "\"fd00::/129\"".into(),
        ),
        ("garbage CIDR", route("banana", ""), "\"banana\"".into()),
        ("empty CIDR", route("", ""), "route_update.dst \"\"".into()),
        (
            "node address of the wrong family",
            route("10.244.9.0/26", "fd00::2"),
            "\"fd00::2\"".into(),
        ),
        (
            "garbage node address",
            route("10.244.9.0/26", "192.168.10.300"),
            "\"192.168.10.300\"".into(),
        ),
        (
            "garbage remove",
            r#"{"routeRemove": {"dst": "10.0.0.0/x"}}"#.into(),
            "\"10.0.0.0/x\"".into(),
        ),
        (
            "MAC too short",
            vtep("node-c", "66:aa:00:00:00", "10.244.2.0", "192.168.10.3"),
            "\"66:aa:00:00:00\"".into(),
        ),
        (
            "MAC not hex",
            vtep("node-c", "66:aa:00:00:00:zz", "10.244.2.0", "192.168.10.3"),
            "\"66:aa:00:00:00:zz\"".into(),
        ),
        (
            "multicast MAC",
            vtep("node-c", "01:00:5e:00:00:01", "10.244.2.0", "192.168.10.3"),
            "\"01:00:5e:00:00:01\": multicast".into(),
        ),
        (
            "zero MAC",
            vtep("node-c", "00:00:00:00:00:00", "10.244.2.0", "192.168.10.3"),
            "\"00:00:00:00:00:00\": the all-zero".into(),
        ),
        (
            "MAC too long",
            vtep(
                "node-c",
                "66:aa:00:00:00:03:04",
                "10.244.2.0",
                "192.168.10.3",
            ),
            "\"66:aa:00:00:00:03:04\"".into(),
        ),
        (
            "empty MAC",
            vtep("node-c", "", "10.244.2.0", "192.168.10.3"),
            "vtep_update.mac \"\"".into(),
        ),
        (
            "MAC with a sign",
            vtep("node-c", "+6:aa:00:00:00:03", "10.244.2.0", "192.168.10.3"),
            "\"+6:aa:00:00:00:03\"".into(),
        ),
        (
            "bad IPv6 MAC",
            vtep_v6("node-c", "66:bb:00:00:00:zz", "fd00:244:2::", "fd00:10::3"),
            "vtep_update.mac_v6 \"66:bb:00:00:00:zz\"".into(),
        ),
        (
            "bad IPv6 tunnel address",
            vtep_v6(
                "node-c",
                "66:bb:00:00:00:03",
                "fd00:244:2::zz",
                "fd00:10::3",
            ),
            "vtep_update.ipv6_addr \"fd00:244:2::zz\"".into(),
        ),
        (
            "IPv4 address as the IPv6 tunnel address",
            vtep_v6("node-c", "66:bb:00:00:00:03", "10.244.2.0", "fd00:10::3"),
            "vtep_update.ipv6_addr \"10.244.2.0\"".into(),
        ),
        (
            "unspecified tunnel address",
            vtep("node-c", "66:aa:00:00:00:03", "0.0.0.0", "192.168.10.3"),
            "\"0.0.0.0\": the unspecified address".into(),
        ),
        (
            "loopback tunnel address",
            vtep("node-c", "66:aa:00:00:00:03", "127.0.0.1", "192.168.10.3"),
            "\"127.0.0.1\": a loopback address".into(),
        ),
        (
            "multicast parent address",
            vtep("node-c", "66:aa:00:00:00:03", "10.244.2.0", "224.0.0.1"),
            "\"224.0.0.1\": a multicast address".into(),
        ),
        (
            "broadcast parent address",
            vtep(
                "node-c",
                "66:aa:00:00:00:03",
                "10.244.2.0",
                "255.255.255.255",
            ),
            "\"255.255.255.255\": the broadcast address".into(),
        ),
        (
            "unspecified IPv6 parent address",
            vtep_v6("node-c", "66:bb:00:00:00:03", "fd00:244:2::", "::"),
            "vtep_update.parent_device_ipv6 \"::\": the unspecified address".into(),
        ),
        (
            "multicast IPv6 tunnel address",
            vtep_v6("node-c", "66:bb:00:00:00:03", "ff02::1", "fd00:10::3"),
            "\"ff02::1\": a multicast address".into(),
        ),
        (
            "tunnel address of the wrong family",
            vtep("node-c", "66:aa:00:00:00:03", "fd00::3", "192.168.10.3"),
            "\"fd00::3\"".into(),
        ),
        (
            "garbage parent address",
            vtep("node-c", "66:aa:00:00:00:03", "10.244.2.0", "nope"),
            "\"nope\"".into(),
        ),
        (
            "empty node",
            vtep("", "66:aa:00:00:00:03", "10.244.2.0", "192.168.10.3"),
            "vtep_update.node is empty".into(),
        ),
        (
            "another node's MAC",
            vtep("node-c", "66:aa:00:00:00:02", "10.244.2.0", "192.168.10.3"),
            "already the VTEP MAC of node \"node-b\"".into(),
        ),
        (
            "another node's tunnel address",
            vtep("node-c", "66:aa:00:00:00:03", "10.244.1.0", "192.168.10.3"),
            "already the tunnel address of node \"node-b\"".into(),
        ),
        (
            "the local node's MAC",
            vtep("node-c", "66:aa:00:00:00:01", "10.244.2.0", "192.168.10.3"),
            "already the VTEP MAC of node \"node-a\"".into(),
        ),
        (
            "the local node's tunnel address",
            vtep("node-c", "66:aa:00:00:00:03", "10.244.0.0", "192.168.10.3"),
            "already the tunnel address of node \"node-a\"".into(),
        ),
        ("huge string", route(&huge, ""), "(100000 bytes)".into()),
        (
            "VNI over 2^24-1",
            config("VXLANVNI", "16777216"),
            "VXLANVNI \"16777216\"".into(),
        ),
        (
            "negative port",
            config("VXLANPort", "-1"),
            "VXLANPort \"-1\"".into(),
        ),
        (
            "port over 65535",
            config("VXLANPort", "65536"),
            "VXLANPort \"65536\"".into(),
        ),
        (
            "MTU too small",
            config("VXLANMTU", "20"),
            "VXLANMTU \"20\"".into(),
        ),
        (
            "MTU too big",
            config("VXLANMTU", "65536"),
            "VXLANMTU \"65536\"".into(),
        ),
        (
            "empty config value",
            config("VXLANVNI", ""),
            "VXLANVNI \"\"".into(),
        ),
        (
            "IPv6 MTU too small",
            config("VXLANMTUV6", "1279"),
            "VXLANMTUV6 \"1279\"".into(),
        ),
        (
            "bad CIDR list",
            config("ExternalNodesCIDRList", "10.0.0.0/8,zz"),
            "ExternalNodesCIDRList \"10.0.0.0/8,zz\"".into(),
        ),
        (
            "route protocol out of range",
            config("DeviceRouteProtocol", "300"),
            "DeviceRouteProtocol \"300\"".into(),
        ),
    ]
}

fn message(line: &str, sequence: u64) -> ToDataplane {
    let mut msg: ToDataplane = json::from_str(line).expect("test JSON");
    msg.sequence_number = sequence;
    msg
}

#[tokio::test]
async fn every_bad_message_is_rejected_by_value_and_its_neighbours_apply() {
    let daemon = Daemon::memory(&[]);
    let mut stream = Stream::open(&daemon).await;
    let mut messages = vec![message(NODE_A, 1), message(NODE_B, 2)];
    let mut expected = Vec::new();
    let mut good_routes = Vec::new();
    for (i, (what, bad, quoted)) in cases().into_iter().enumerate() {
        let base = 3 + 3 * i as u64;
        let before = format!("10.250.{i}.0/26");
        let after = format!("10.250.{i}.64/26");
        messages.push(message(&route(&before, ""), base));
        messages.push(message(&bad, base + 1));
        messages.push(message(&route(&after, ""), base + 2));
        expected.push((what, base + 1, quoted));
        good_routes.extend([before, after]);
    }
    let last = messages.last().unwrap().sequence_number;
    stream.send(messages).await;
    let rejected: Vec<RejectedMessage> = stream
        .statuses_until(last)
        .await
        .into_iter()
        .flat_map(|s| s.rejected)
        .collect();
    for (what, sequence, quoted) in &expected {
        let found = rejected.iter().find(|r| r.sequence_number == *sequence);
        let Some(r) = found else {
            panic!("{what}: message {sequence} was not rejected; rejected: {rejected:#?}");
        };
        assert!(
            r.reason.contains(quoted.as_str()),
            "{what}: {:?} lacks {quoted:?}",
            r.reason
        );
    }
    assert_eq!(
        rejected.len(),
        expected.len(),
        "only the bad ones: {rejected:#?}"
    );

    let state = daemon.state().await;
    let v4 = state.ipv4.unwrap();
    let programmed: Vec<&str> = v4.tunnel_routes.iter().map(|r| r.dst.as_str()).collect();
    for dst in &good_routes {
        assert!(
            programmed.contains(&dst.as_str()),
            "{dst} missing: {programmed:?}"
        );
    }
    // node-c's last update of each family claims a tunnel address it cannot
    // have: nothing of it is usable.
    assert_eq!(
        v4.remote_vteps.len(),
        1,
        "only node-b: {:?}",
        v4.remote_vteps
    );
    let v6 = state.ipv6.unwrap();
    assert!(v6.remote_vteps.is_empty(), "{:?}", v6.remote_vteps);
}

#[test]
fn an_unknown_oneof_member_is_ignored() {
    use prost::Message;
    // A ToDataplane with sequence number 7 and a payload in field 99, which
    // vxmgr does not know (as a newer Felix might send).
    let mut bytes = Vec::new();
    prost::encoding::uint64::encode(15, &7, &mut bytes);
    prost::encoding::bytes::encode(99, &vec![1u8, 2, 3], &mut bytes);
    let msg = ToDataplane::decode(bytes.as_slice()).expect("unknown fields are skipped");
    assert_eq!(msg.sequence_number, 7);
    assert!(msg.payload.is_none());
    assert_eq!(vxmgr::model::Update::from_message(msg), Ok(None));
}

#[tokio::test]
async fn a_message_over_the_limit_ends_its_stream_with_resource_exhausted() {
    let daemon = Daemon::memory(&[]);
    let mut stream = Stream::open(&daemon).await;
    let big = ToDataplane {
        sequence_number: 1,
        payload: Some(Payload::RouteUpdate(RouteUpdate {
            dst: "9".repeat(MAX_MESSAGE_BYTES),
            ..Default::default()
        })),
    };
    stream.send(vec![big]).await;
    let status = stream.failure().await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("message length too large")
            && status.message().contains("up to 64 MiB"),
        "{status:?}"
    );
    // The daemon goes on serving the next calc process.
    daemon.wait_for_log("calc stream ended", 1);
    let mut next = Stream::open(&daemon).await;
    next.send(vec![message(NODE_B, 1)]).await;
    next.batch_covering(1).await;
}

/// Node B's VTEP (message 0), `middle` (1) and a route through node B (2).
fn between_vtep_and_route(middle: Bytes) -> Vec<Bytes> {
    vec![
        encode(&message(NODE_B, 0)),
        middle,
        encode(&message(&route("10.244.1.0/26", ""), 2)),
    ]
}

#[tokio::test]
async fn a_large_message_of_a_kind_vxmgr_ignores_is_skipped_and_the_stream_goes_on() {
    let daemon = Daemon::memory(&[]);
    let mut stream = Stream::open(&daemon).await;
    // Over the 4 MiB that gRPC allows by default, as a large cluster's
    // IP set update is.
    let ipset = felix::ipset_update(1, 20 << 20);
    assert!(ipset.len() > 20 << 20);
    stream.send_bytes(between_vtep_and_route(ipset)).await;
    let statuses = stream.statuses_covering(3).await;
    let ignored: u32 = statuses.iter().map(|s| s.ignored).sum();
    assert_eq!(ignored, 1, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| s.rejected.is_empty()),
        "{statuses:?}"
    );
    let last = statuses.last().unwrap();
    assert_eq!(last.last_sequence, 2, "{statuses:?}");
    let v4 = daemon.state().await.ipv4.unwrap();
    assert_eq!(v4.tunnel_routes.len(), 1, "the route after it applies");
}

#[tokio::test]
async fn a_message_that_does_not_decode_is_rejected_and_the_stream_goes_on() {
    let daemon = Daemon::memory(&[]);
    let mut stream = Stream::open(&daemon).await;
    // A field of wire type 7, which does not exist.
    let junk = Bytes::from_static(&[0x0f, 0x01]);
    stream.send_bytes(between_vtep_and_route(junk)).await;
    stream.close_send();
    let statuses = stream.statuses_covering(3).await;
    assert_eq!(
        covered_runs(&statuses),
        [(0, 2, 3)],
        "numbered like the rest: {statuses:?}"
    );
    let rejected: Vec<_> = statuses.iter().flat_map(|s| &s.rejected).collect();
    let [rejected] = rejected[..] else {
        panic!("one message rejected: {statuses:?}");
    };
    assert_eq!(rejected.sequence_number, 1);
    assert!(
        rejected
            .reason
            .contains("a message of 2 bytes does not decode as a ToDataplane"),
        "{rejected:?}"
    );
    let v4 = daemon.state().await.ipv4.unwrap();
    assert_eq!(v4.tunnel_routes.len(), 1, "the route after it applies");
}

/// Writes `junk` on a raw connection and reads until the daemon hangs up.
fn send_junk(daemon: &Daemon, junk: &[u8]) -> Vec<u8> {
    let mut conn = UnixStream::connect(&daemon.socket).expect("connect");
    // A daemon that kept the connection would fail the test, not hang it.
    conn.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    conn.write_all(junk).expect("write junk");
    let mut answer = Vec::new();
    match conn.read_to_end(&mut answer) {
        Ok(_) => answer,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => answer,
        Err(e) => panic!("the daemon did not hang up on junk: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_on_the_socket_drops_that_connection_only() {
    let daemon = Daemon::memory(&[]);
    let random: Vec<u8> = (0u32..4096)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    // The HTTP/2 preface, then a SETTINGS frame whose length is not a
    // multiple of 6: a connection error.
    let broken_h2 = [
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".as_slice(),
        &[0, 0, 5, 4, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5],
    ]
    .concat();
    for junk in [
        random,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        broken_h2,
    ] {
        send_junk(&daemon, &junk);
        // Still serving.
        assert_eq!(daemon.state().await.hostname, "node-a");
    }
}

// Multi-threaded: waiting for the log blocks this thread while the flood
// goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_loses_its_stream_not_the_daemon() {
    let daemon = Daemon::memory(&["--heartbeat-interval", "1ms", "--response-buffer", "8"]);
    let mut stalled = Stream::open(&daemon).await;
    stalled.send(vec![message(NODE_B, 1)]).await;
    // Never read the responses: rejections of bad messages fill the
    // connection's buffers, then the stream's, however large they are.
    let tx = stalled.sender();
    let bad = route(&"9".repeat(100), "");
    let flood = tokio::spawn(async move {
        for n in 2.. {
            if tx.send(encode(&message(&bad, n))).await.is_err() {
                return;
            }
        }
    });
    daemon.wait_for_log(
        "calc client is not reading its responses: ending its stream",
        1,
    );
    daemon.wait_for_log("calc stream ended", 1);
    flood.abort();

    let state = daemon.state().await;
    let v4 = state.ipv4.unwrap();
    assert_eq!(v4.remote_vteps.len(), 1, "the kernel state stays");
    // The slot is free for the next calc process.
    let mut next = Stream::open(&daemon).await;
    next.send(vec![message(NODE_B, 1)]).await;
    next.batch_covering(1).await;
    // The stalled client, reading at last, learns why its stream ended.
    let status = stalled.failure().await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("not reading its responses"),
        "{status:?}"
    );
}

#[tokio::test]
async fn the_largest_sequence_number_is_reported_and_the_next_one_follows() {
    let daemon = Daemon::memory(&[]);
    let mut stream = Stream::open(&daemon).await;
    stream.send(vec![message(NODE_B, u64::MAX)]).await;
    let status = stream.next_status().await;
    assert_eq!(covered(&status), (u64::MAX, u64::MAX, 1));
    // A message without a number after it gets the next one: numbers wrap.
    stream
        .send(vec![message(&route("10.244.1.0/26", ""), 0)])
        .await;
    let status = stream.next_status().await;
    assert_eq!(covered(&status), (0, 0, 1));
    let state = daemon.state().await;
    assert_eq!(state.ipv4.unwrap().remote_vteps.len(), 1);
}

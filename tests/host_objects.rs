//! A node that also holds what real hosts hold: a default route, static,
//! boot, DHCP and BGP-daemon routes, routes through the same gateways as
//! vxmgr's, another agent's nexthop group and VXLAN device, permanent
//! neighbours and FDB entries on other devices, ipsets named like vxmgr's.
//! vxmgrd is driven through a cold start, the sweep after InSync, periodic
//! resyncs, drift repair, a restart and a stream that declares nothing,
//! with each route protocol a ConfigUpdate or a flag can set: every one of
//! the host's objects survives byte for byte. A stream that declares the
//! host's own destinations gets them refused and reported. Needs root;
//! skips without it unless VXMGR_REQUIRE_NETNS=1.

mod support;

use std::collections::BTreeSet;

use support::netns::{can_run, cluster, wait_until};
use support::testbed::{self, Cluster, host};

/// The host's objects are all there, as they were.
fn assert_host_intact(ns: &str, before: &BTreeSet<String>, phase: &str) {
    let missing = host::lost(ns, before).unwrap();
    assert!(
        missing.is_empty(),
        "{phase}: the host lost or saw changed: {missing:#?}"
    );
}

/// Routes with `protocol`, the host's among them.
fn routes_with(ns: &str, protocol: &str) -> usize {
    let v4 = testbed::sh(ns, &format!("ip route show proto {protocol}")).unwrap();
    let v6 = testbed::sh(ns, &format!("ip -6 route show proto {protocol}")).unwrap();
    v4.lines().chain(v6.lines()).count()
}

fn resyncs(cluster: &Cluster) -> usize {
    cluster
        .node(1)
        .log_text()
        .matches("vxmgr::reconciler::resync: resync")
        .count()
}

/// node-1 with the host's objects, and their listing before vxmgrd.
fn host_node() -> (Cluster, BTreeSet<String>) {
    let cluster = cluster(2);
    let before = host::install(&cluster.node(1).ns).unwrap();
    (cluster, before)
}

/// node-1's view, with `config` as its ConfigUpdate.
fn view(cluster: &Cluster, config: &str) -> Vec<String> {
    let mut lines = cluster.view(1, false);
    lines[0] = format!(r#"{{"configUpdate": {{"config": {{{config}}}}}}}"#);
    lines
}

/// Every phase of a daemon's life with one route protocol setting.
fn every_phase_leaves_the_host_alone(test: &str, flags: &[&str], config: &str, protocol: &str) {
    if !can_run(test) {
        return;
    }
    let (mut cluster, before) = host_node();
    let ns = cluster.node(1).ns.clone();
    let dir = cluster.dir.clone();
    let mut daemon_flags = vec!["--route-refresh-interval", "1"];
    daemon_flags.extend_from_slice(flags);
    let hosts_own = routes_with(&ns, protocol);
    let our_routes = || routes_with(&ns, protocol) - hosts_own;

    cluster.node_mut(1).start_daemon(&daemon_flags).unwrap();
    assert_host_intact(&ns, &before, "start-up adoption");
    let view = view(&cluster, config);
    cluster.node(1).replay_ok(&dir, "view", &view).unwrap();
    assert!(our_routes() > 0, "vxmgr programmed its routes");
    assert_host_intact(&ns, &before, "cold start and the sweep after InSync");

    let seen = resyncs(&cluster);
    wait_until("two periodic resyncs", || resyncs(&cluster) >= seen + 2);
    assert_host_intact(&ns, &before, "periodic resyncs");

    let block = cluster.node(2).block_v4();
    testbed::sh(&ns, &format!("ip route del {block}")).unwrap();
    wait_until("the deleted route's repair", || {
        testbed::sh(&ns, &format!("ip -N route show {block}"))
            .unwrap()
            .contains(&format!("proto {protocol} "))
    });
    assert_host_intact(&ns, &before, "drift repair");

    cluster.node_mut(1).start_daemon(&daemon_flags).unwrap();
    cluster.node(1).replay_ok(&dir, "view", &view).unwrap();
    assert_host_intact(&ns, &before, "a restart");

    let nothing = [view[0].clone(), r#"{"inSync": {}}"#.to_string()];
    cluster
        .node(1)
        .replay_ok(&dir, "nothing", &nothing)
        .unwrap();
    assert_eq!(our_routes(), 0, "vxmgr's routes are gone");
    let seen = resyncs(&cluster);
    wait_until("a periodic resync", || resyncs(&cluster) > seen);
    assert_host_intact(&ns, &before, "a stream that declares nothing");
}

#[test]
fn felix_default_protocol_leaves_the_host_alone() {
    every_phase_leaves_the_host_alone(
        "felix_default_protocol_leaves_the_host_alone",
        &[],
        r#""VXLANVNI": "4096", "DeviceRouteProtocol": "3""#,
        "80",
    );
}

#[test]
fn a_bgp_daemons_protocol_from_a_flag_leaves_its_routes_alone() {
    every_phase_leaves_the_host_alone(
        "a_bgp_daemons_protocol_from_a_flag_leaves_its_routes_alone",
        &["--route-protocol", "186"],
        r#""VXLANVNI": "4096""#,
        "186",
    );
}

#[test]
fn a_bgp_daemons_protocol_from_the_calc_leaves_its_routes_alone() {
    every_phase_leaves_the_host_alone(
        "a_bgp_daemons_protocol_from_the_calc_leaves_its_routes_alone",
        &[],
        r#""VXLANVNI": "4096", "DeviceRouteProtocol": "186""#,
        "186",
    );
}

#[test]
fn a_stream_declaring_the_hosts_destinations_is_refused_and_reported() {
    let test = "a_stream_declaring_the_hosts_destinations_is_refused_and_reported";
    if !can_run(test) {
        return;
    }
    let (mut cluster, before) = host_node();
    let ns = cluster.node(1).ns.clone();
    cluster.node_mut(1).start_daemon(&[]).unwrap();
    let mut lines = view(&cluster, r#""DeviceRouteProtocol": "3""#);
    let in_sync = lines.pop().unwrap();
    for extra in [
        r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "0.0.0.0/0", "dstNodeName": "node-2"}}"#,
        r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "192.0.2.0/24", "dstNodeName": "node-2"}}"#,
        r#"{"routeUpdate": {"types": "LOCAL_WORKLOAD", "ipPoolType": "VXLAN", "dst": "192.168.10.0/24", "dstNodeName": "node-1"}}"#,
        r#"{"routeUpdate": {"types": "LOCAL_WORKLOAD", "ipPoolType": "VXLAN", "dst": "192.168.0.0/16", "dstNodeName": "node-1"}}"#,
        r#"{"routeUpdate": {"types": 17, "ipPoolType": "VXLAN", "dst": "192.168.10.254/32", "dstNodeName": "node-2"}}"#,
    ] {
        lines.push(extra.to_string());
    }
    lines.push(in_sync);
    let path = cluster.dir.join("host-destinations.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let output = cluster.node(1).replay(&[&path.to_string_lossy()]).unwrap();
    let statuses = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{statuses}");
    for expected in [
        "prefix length of 0",
        "adding route 192.0.2.0/24",
        "route 192.0.2.0/24 via 192.168.10.254 dev #",
        "adding route blackhole 192.168.10.0/24",
        "the kernel holds route 192.168.10.0/24 dev #",
        "adding route blackhole 192.168.0.0/16",
        "it would capture 192.168.10.1, an address of interface",
        "adding route 192.168.10.254/32",
        "the gateway of the host's route to 0.0.0.0/0",
    ] {
        assert!(
            statuses.contains(expected),
            "{expected:?} missing from {statuses}"
        );
    }
    // Batches close by backpressure, so on a busy host the refused messages
    // may make a batch of their own: then nothing in it applied.
    for status in statuses.lines() {
        let status: serde_json::Value = serde_json::from_str(status).unwrap();
        if status.get("kernelErrors").is_none() {
            continue;
        }
        let applied = status["objects"]
            .as_object()
            .is_some_and(|counts| !counts.is_empty());
        let expected = if applied {
            "BATCH_RESULT_PARTIAL"
        } else {
            "BATCH_RESULT_FAILED"
        };
        assert_eq!(status["result"], expected, "{status}");
    }
    // Everything else of the stream applied, and the host is as it was.
    let block = cluster.node(2).block_v4();
    let route = testbed::sh(&ns, &format!("ip route show {block}")).unwrap();
    assert!(route.contains("proto 80"), "{route}");
    assert_host_intact(&ns, &before, "a stream declaring the host's destinations");
}

//! The netlink backend against the real kernel, in network namespaces: a
//! small cluster with vxmgrd on every node, fed by calc-stub. Needs root;
//! skips without it unless VXMGR_REQUIRE_NETNS=1.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::time::Duration;

use serde_json::Value;
use support::BackgroundReplay;
use support::netns::{
    assert_census, binaries, can_run, cluster, generated_cluster, generated_world,
};
use support::testbed::stream::Session;
use support::testbed::{self, Census, Cluster, Monitor, census, churn};
use vxmgr::model::Family;
use vxmgr::wire::felix::{InSync, to_dataplane::Payload};

const WAIT: Duration = Duration::from_secs(20);

/// No periodic resync, no device check: only notifications can repair.
const NOTIFICATIONS_ONLY: [&str; 4] = [
    "--route-refresh-interval",
    "0",
    "--device-check-interval",
    "1h",
];

/// A cluster of `n` nodes, each running vxmgrd with `flags` and fed its view.
fn running_cluster(n: u8, flags: &[&str], same_subnet: bool) -> Cluster {
    let mut cluster = cluster(n);
    cluster.start_all(flags, same_subnet).unwrap();
    cluster
}

fn ip_json(ns: &str, args: &[&str]) -> Value {
    testbed::ip_json(ns, args).unwrap()
}

fn run_in(ns: &str, args: &[&str]) -> String {
    testbed::run_in(ns, args).unwrap()
}

fn link(ns: &str, name: &str) -> Value {
    ip_json(ns, &["-d", "-s", "link", "show", name])[0].clone()
}

fn tx_packets(ns: &str, dev: &str) -> u64 {
    link(ns, dev)["stats64"]["tx"]["packets"]
        .as_u64()
        .expect("tx packets")
}

fn rx_packets(ns: &str, dev: &str) -> u64 {
    link(ns, dev)["stats64"]["rx"]["packets"]
        .as_u64()
        .expect("rx packets")
}

/// Our routes of `family`, described as the census does.
fn routes(ns: &str, family: Family) -> BTreeSet<String> {
    census::routes(ns, family).unwrap()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn ipset_members(ns: &str, set: &str) -> BTreeSet<String> {
    census::ipset_members(ns, set).unwrap()
}

fn ping(ns: &str, target: &str) -> bool {
    let v6 = target.contains(':');
    let mut args = vec!["ping", "-c", "3", "-i", "0.2", "-W", "2", target];
    if v6 {
        args.insert(1, "-6");
    }
    testbed::try_in(ns, &args).unwrap().status.success()
}

#[test]
fn exact_kernel_state_for_a_felix_scenario() {
    if !can_run("exact_kernel_state_for_a_felix_scenario") {
        return;
    }
    let cluster = running_cluster(3, &[], false);
    let ns = &cluster.node(1).ns;

    let dev = link(ns, "vxlan.calico");
    assert_eq!(dev["address"], "66:aa:00:00:00:01");
    assert_eq!(dev["mtu"], 1450);
    assert!(dev["flags"].as_array().unwrap().iter().any(|f| f == "UP"));
    let info = &dev["linkinfo"]["info_data"];
    assert_eq!(info["id"], 4096);
    assert_eq!(info["port"], 4789);
    assert_eq!(info["local"], "192.168.10.1");
    assert_eq!(info["link"], "eth0");
    assert_eq!(info["learning"], false);
    let global: Vec<String> = addresses(ns, "vxlan.calico")
        .into_iter()
        .filter(|a| !a.ends_with(" link"))
        .collect();
    assert_eq!(global, ["10.244.1.0/32 global"]);

    let dev6 = link(ns, "vxlan-v6.calico");
    assert_eq!(dev6["address"], "66:bb:00:00:00:01");
    assert_eq!(dev6["mtu"], 1430);
    assert_eq!(dev6["linkinfo"]["info_data"]["local6"], "fd00:10::1");
    let addrs6 = addresses(ns, "vxlan-v6.calico");
    assert_eq!(addrs6.len(), 2, "{addrs6:?}");
    assert!(addrs6.contains(&"fd00:244:0:1::/128 global".to_string()));
    assert!(
        addrs6
            .iter()
            .any(|a| a.starts_with("fe80:") && a.ends_with("/64 link")),
        "the link-local address is kept: {addrs6:?}"
    );

    assert_eq!(
        routes(ns, Family::V4),
        set(&[
            "blackhole 10.244.1.0/26",
            "10.244.2.0/26 nhid via 10.244.2.0 dev vxlan.calico onlink mtu 1450",
            "10.244.3.0/26 nhid via 10.244.3.0 dev vxlan.calico onlink mtu 1450",
            "10.244.2.0 dev vxlan.calico scope link mtu 1450",
            "10.244.3.0 dev vxlan.calico scope link mtu 1450",
        ])
    );
    assert_eq!(
        routes(ns, Family::V6),
        set(&[
            "blackhole fd00:244:0:1::/122",
            "fd00:244:0:2::/122 nhid via fd00:244:0:2:: dev vxlan-v6.calico onlink mtu 1430",
            "fd00:244:0:3::/122 nhid via fd00:244:0:3:: dev vxlan-v6.calico onlink mtu 1430",
            "fd00:244:0:2:: dev vxlan-v6.calico mtu 1430",
            "fd00:244:0:3:: dev vxlan-v6.calico mtu 1430",
        ])
    );
    let census = Census::of(ns).unwrap();
    assert_eq!(
        census.v4.nexthops,
        set(&["10.244.2.0 dev vxlan.calico", "10.244.3.0 dev vxlan.calico"])
    );
    assert_eq!(
        census.v6.nexthops,
        set(&[
            "fd00:244:0:2:: dev vxlan-v6.calico",
            "fd00:244:0:3:: dev vxlan-v6.calico",
        ])
    );
    assert_eq!(
        permanent_neighbors(ns, "vxlan.calico"),
        set(&[
            "10.244.2.0 66:aa:00:00:00:02",
            "10.244.3.0 66:aa:00:00:00:03"
        ])
    );
    assert_eq!(
        permanent_neighbors(ns, "vxlan-v6.calico"),
        set(&[
            "fd00:244:0:2:: 66:bb:00:00:00:02",
            "fd00:244:0:3:: 66:bb:00:00:00:03"
        ])
    );
    assert_eq!(
        census.v4.fdb,
        set(&[
            "66:aa:00:00:00:02 192.168.10.2",
            "66:aa:00:00:00:03 192.168.10.3"
        ])
    );
    assert_eq!(
        census.v6.fdb,
        set(&[
            "66:bb:00:00:00:02 fd00:10::2",
            "66:bb:00:00:00:03 fd00:10::3"
        ])
    );
    assert_eq!(census.v4.ipset, set(&["192.168.10.2", "192.168.10.3"]));
    assert_eq!(census.v6.ipset, set(&["fd00:10::2", "fd00:10::3"]));
}

#[test]
fn pods_ping_each_other_through_the_tunnel_v4_and_v6() {
    if !can_run("pods_ping_each_other_through_the_tunnel_v4_and_v6") {
        return;
    }
    let cluster = running_cluster(2, &[], false);
    let (a, b) = (cluster.node(1), cluster.node(2));
    for (dev, target) in [
        ("vxlan.calico", b.pod_v4()),
        ("vxlan-v6.calico", b.pod_v6()),
    ] {
        let sent = tx_packets(&a.ns, dev);
        let received = rx_packets(&b.ns, dev);
        assert!(
            ping(&a.pod_ns(), &target),
            "ping {target} from node-1's pod"
        );
        assert!(
            tx_packets(&a.ns, dev) >= sent + 3,
            "{dev} on node-1 encapsulated the echo requests"
        );
        assert!(
            rx_packets(&b.ns, dev) >= received + 3,
            "{dev} on node-2 decapsulated them"
        );
    }
}

#[test]
fn same_subnet_routes_carry_traffic_without_encapsulation() {
    if !can_run("same_subnet_routes_carry_traffic_without_encapsulation") {
        return;
    }
    let cluster = running_cluster(2, &[], true);
    let (a, b) = (cluster.node(1), cluster.node(2));
    // Through a nexthop object per node address, as tunnelled routes go.
    assert!(
        routes(&a.ns, Family::V4).contains("10.244.2.0/26 nhid via 192.168.10.2 dev eth0 onlink")
    );
    assert!(
        routes(&a.ns, Family::V6)
            .contains("fd00:244:0:2::/122 nhid via fd00:10::2 dev eth0 onlink")
    );
    for (dev, target) in [
        ("vxlan.calico", b.pod_v4()),
        ("vxlan-v6.calico", b.pod_v6()),
    ] {
        let sent = tx_packets(&a.ns, dev);
        assert!(ping(&a.pod_ns(), &target), "ping {target}");
        assert_eq!(tx_packets(&a.ns, dev), sent, "{dev} carried nothing");
    }
}

#[test]
fn a_reconnect_with_a_smaller_world_sweeps_exactly_the_stale_objects() {
    if !can_run("a_reconnect_with_a_smaller_world_sweeps_exactly_the_stale_objects") {
        return;
    }
    let cluster = running_cluster(3, &[], false);
    let a = cluster.node(1);
    let mut monitor = Monitor::start(&a.ns, &["neigh"]).unwrap();
    let output = a
        .replay_ok(&cluster.dir, "smaller", &cluster.view_of(1, &[1, 2], false))
        .unwrap();
    // Node-3's, per family: its block and tunnel address routes, nexthop,
    // neighbour, FDB entry and ipset member.
    assert_eq!(objects(&output), [0, 0, 12], "added, changed, removed");
    monitor.sync().unwrap();
    // The kernel's own neighbour traffic on other links is not vxmgr's.
    let ours: Vec<&String> = monitor
        .seen
        .iter()
        .filter(|l| l.contains("vxlan") || l.contains("proto 80"))
        .collect();
    let deleted: BTreeSet<String> = ours
        .iter()
        .filter(|l| l.starts_with("Deleted"))
        .map(|l| l.to_string())
        .collect();
    let of_node_3 = [
        "10.244.3.",
        "fd00:244:0:3:",
        "192.168.10.3",
        "fd00:10::3",
        "66:aa:00:00:00:03",
        "66:bb:00:00:00:03",
    ];
    assert!(
        deleted
            .iter()
            .all(|l| of_node_3.iter().any(|n| l.contains(n))),
        "only node-3's objects go: {deleted:#?}"
    );
    // The kernel reports a deleted neighbour as FAILED before it goes.
    assert!(
        ours.iter()
            .all(|l| l.starts_with("Deleted") || l.trim_end().ends_with("FAILED")),
        "nothing is added or replaced: {ours:#?}"
    );
    assert_eq!(
        routes(&a.ns, Family::V4),
        set(&[
            "blackhole 10.244.1.0/26",
            "10.244.2.0/26 nhid via 10.244.2.0 dev vxlan.calico onlink mtu 1450",
            "10.244.2.0 dev vxlan.calico scope link mtu 1450",
        ])
    );
    assert_eq!(
        ipset_members(&a.ns, "cali40all-vxlan-net"),
        set(&["192.168.10.2"])
    );
    let neighbors = ip_json(&a.ns, &["neigh", "show", "dev", "vxlan.calico"]);
    assert_eq!(neighbors.as_array().unwrap().len(), 1, "{neighbors}");
    let nexthops = ip_json(&a.ns, &["nexthop", "show", "proto", "80"]);
    assert_eq!(nexthops.as_array().unwrap().len(), 2, "{nexthops}");
}

#[test]
fn a_restarted_daemon_deletes_and_re_adds_nothing() {
    if !can_run("a_restarted_daemon_deletes_and_re_adds_nothing") {
        return;
    }
    let mut cluster = running_cluster(2, &[], false);
    let ns = cluster.node(1).ns.clone();
    let before = routes(&ns, Family::V4);
    let mut monitor = Monitor::start(&ns, &["neigh", "nexthop"]).unwrap();
    let status = cluster.node_mut(1).stop_daemon(libc::SIGTERM).unwrap();
    assert!(status.success(), "SIGTERM stops cleanly: {status}");
    cluster.node_mut(1).start_daemon(&[]).unwrap();
    let view = cluster.view(1, false);
    let output = cluster
        .node(1)
        .replay_ok(&cluster.dir, "again", &view)
        .unwrap();
    assert_eq!(objects(&output), [0, 0, 0], "added, changed, removed");
    monitor.sync().unwrap();
    // The kernel's own neighbour traffic on other links is not vxmgr's.
    let ours: Vec<&String> = monitor
        .seen
        .iter()
        .filter(|l| l.contains("vxlan") || l.contains("proto 80"))
        .collect();
    assert!(ours.is_empty(), "the restart changed the kernel: {ours:#?}");
    assert_eq!(routes(&ns, Family::V4), before);
}

#[test]
fn deleted_routes_neighbors_and_devices_come_back() {
    if !can_run("deleted_routes_neighbors_and_devices_come_back") {
        return;
    }
    let flags = [
        "--route-refresh-interval",
        "1",
        "--device-check-interval",
        "200ms",
    ];
    let cluster = running_cluster(2, &flags, false);
    let ns = &cluster.node(1).ns;
    let mut monitor = Monitor::start(ns, &["neigh", "link"]).unwrap();

    run_in(ns, &["ip", "route", "del", "10.244.2.0/26"]);
    monitor
        .wait_for("the route re-added", WAIT, |l| {
            l.starts_with("10.244.2.0/26") && l.contains("proto 80")
        })
        .unwrap();

    testbed::sh(ns, "ip neigh del 10.244.2.0 dev vxlan.calico").unwrap();
    monitor
        .wait_for("the neighbour re-added", WAIT, |l| {
            l.starts_with("10.244.2.0 dev vxlan.calico lladdr")
        })
        .unwrap();

    run_in(ns, &["ip", "link", "del", "vxlan.calico"]);
    monitor
        .wait_for("the device re-created", WAIT, |l| {
            !l.starts_with("Deleted") && l.contains("vxlan.calico:") && l.contains("state UNKNOWN")
        })
        .unwrap();
    monitor
        .wait_for("its routes re-added", WAIT, |l| {
            l.starts_with("10.244.2.0/26") && l.contains("proto 80")
        })
        .unwrap();
    assert!(ping(&cluster.node(1).pod_ns(), &cluster.node(2).pod_v4()));
}

#[test]
fn a_vni_change_recreates_the_device() {
    if !can_run("a_vni_change_recreates_the_device") {
        return;
    }
    let cluster = running_cluster(2, &[], false);
    let before = link(&cluster.node(1).ns, "vxlan.calico")["ifindex"].clone();
    for i in 1..=2 {
        let view: Vec<String> = cluster
            .view(i, false)
            .into_iter()
            .map(|l| l.replace("\"VXLANVNI\": \"4096\"", "\"VXLANVNI\": \"5000\""))
            .collect();
        cluster
            .node(i)
            .replay_ok(&cluster.dir, "vni", &view)
            .unwrap();
    }
    let after = link(&cluster.node(1).ns, "vxlan.calico");
    assert_eq!(after["linkinfo"]["info_data"]["id"], 5000);
    assert_ne!(after["ifindex"], before, "a new device");
    assert!(ping(&cluster.node(1).pod_ns(), &cluster.node(2).pod_v4()));
}

/// Each VNI change recreates both devices and programs a 5,000-node world
/// on them again, while the kernel's echoes of the previous programming
/// are still being read. Once an echo taken in late passed for the
/// kernel's state: vxmgrd believed routes it had just deleted were still
/// there (and left them out: thousands missing at DataplaneInSync), and
/// re-added routes it had just added (refused: "another route ... vxmgr
/// does not own it"). After each change the kernel holds the whole world,
/// and no operation failed.
#[test]
fn vni_changes_back_and_forth_reprogram_a_large_world_each_time() {
    if !can_run("vni_changes_back_and_forth_reprogram_a_large_world_each_time") {
        return;
    }
    let mut cluster = generated_cluster();
    let ns = cluster.node(1).ns.clone();
    let (_, world) = generated_world(&cluster, "vni-changes", 5000);
    let topology = churn::topology(world);
    let view = |vni| {
        let mut view = vec![churn::config(vni)];
        view.extend(topology.iter().cloned());
        view.push(churn::message(Payload::InSync(InSync {})));
        view
    };
    cluster.node_mut(1).start_daemon(&[]).unwrap();
    let socket = cluster.node(1).socket.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // What each VNI's first view left: a clean convergence, then the first
    // change.
    let mut first: BTreeMap<u32, Census> = BTreeMap::new();
    let mut session = None;
    for vni in [4096, 4097].repeat(3) {
        // A new stream for each view, as a calc side restarted with
        // another VNI opens one.
        drop(session.take());
        let opened = runtime.block_on(async {
            let mut opened = Session::open_after_another(&socket).await?;
            opened.send(view(vni)).await?.ensure_ok("the view")?;
            opened.in_sync().await?;
            anyhow::Ok(opened)
        });
        session = Some(opened.unwrap());
        let census = Census::of(&ns).unwrap();
        if let Some(clean) = first.get(&4096) {
            assert_eq!(census.counts(), clean.counts(), "VNI {vni}: {census}");
        }
        match first.get(&vni) {
            None => _ = first.insert(vni, census),
            Some(first) => assert_census(&ns, first, &format!("after the change to VNI {vni}")),
        }
    }
    drop(session);
    let log = cluster.node(1).log_text();
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("kernel operation failed"))
        .take(5)
        .collect();
    assert!(failed.is_empty(), "operations failed: {failed:#?}");
}

#[test]
fn same_subnet_routes_follow_the_parent_address_to_another_interface() {
    if !can_run("same_subnet_routes_follow_the_parent_address_to_another_interface") {
        return;
    }
    let flags = ["--device-check-interval", "200ms"];
    let cluster = running_cluster(2, &flags, true);
    let a = cluster.node(1);
    let mut monitor = Monitor::start(&a.ns, &[]).unwrap();
    // A second underlay interface takes over node-1's address.
    let peer = format!("{}f1", cluster.prefix);
    cluster.add_underlay_link(&a.ns, "eth1", &peer).unwrap();
    testbed::sh(&a.ns, "ip addr del 192.168.10.1/24 dev eth0").unwrap();
    testbed::sh(&a.ns, "ip addr add 192.168.10.1/24 dev eth1").unwrap();
    monitor
        .wait_for("the route moved to eth1", WAIT, |l| {
            l.starts_with("10.244.2.0/26 nhid ") && l.contains(" via 192.168.10.2 dev eth1 ")
        })
        .unwrap();
    let info = &link(&a.ns, "vxlan.calico")["linkinfo"]["info_data"];
    assert_eq!(info["link"], "eth1", "the device follows its parent");
    assert!(ping(&a.pod_ns(), &cluster.node(2).pod_v4()));
}

#[test]
fn changes_by_others_are_repaired_from_kernel_notifications() {
    if !can_run("changes_by_others_are_repaired_from_kernel_notifications") {
        return;
    }
    let cluster = running_cluster(2, &NOTIFICATIONS_ONLY, false);
    let ns = &cluster.node(1).ns;
    let mut monitor = Monitor::start(ns, &["neigh", "link"]).unwrap();
    let route_back = |l: &str| l.starts_with("10.244.2.0/26") && l.contains("proto 80");

    run_in(ns, &["ip", "route", "del", "10.244.2.0/26"]);
    monitor
        .wait_for("the route re-added", WAIT, route_back)
        .unwrap();

    // Still one of vxmgr's (its protocol and shape: onlink on the parent),
    // pointing elsewhere: drift, repaired. (Without onlink it would be
    // another agent's route, which vxmgr leaves alone.)
    testbed::sh(
        ns,
        "ip route replace 10.244.2.0/26 via 192.168.10.2 dev eth0 proto 80 onlink",
    )
    .unwrap();
    monitor
        .wait_for("the route replaced back", WAIT, |l| {
            route_back(l) && l.contains("vxlan.calico")
        })
        .unwrap();

    testbed::sh(ns, "ip neigh del 10.244.2.0 dev vxlan.calico").unwrap();
    monitor
        .wait_for("the neighbour re-added", WAIT, |l| {
            l.starts_with("10.244.2.0 dev vxlan.calico lladdr")
        })
        .unwrap();

    testbed::sh(ns, "bridge fdb del 66:aa:00:00:00:02 dev vxlan.calico self").unwrap();
    monitor
        .wait_for("the FDB entry re-added", WAIT, |l| {
            // `ip monitor` shows an FDB entry as its destination and MAC.
            l.starts_with("192.168.10.2 dev vxlan.calico lladdr 66:aa:00:00:00:02")
        })
        .unwrap();

    testbed::sh(ns, "ip link del vxlan.calico").unwrap();
    monitor
        .wait_for("the device and its routes back", WAIT, route_back)
        .unwrap();
    assert!(ping(&cluster.node(1).pod_ns(), &cluster.node(2).pod_v4()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fight_with_another_agent_backs_off_and_shows_in_health() {
    if !can_run("a_fight_with_another_agent_backs_off_and_shows_in_health") {
        return;
    }
    // However slow the repairs, they all count as one fight, and the
    // back-off outlasts the test.
    let flags = ["--route-refresh-interval", "0", "--contest-window", "1h"];
    let cluster = running_cluster(2, &flags, false);
    let node = cluster.node(1);
    let channel = vxmgr::client::connect(&node.socket).await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest {
        service: "vxmgr.v1.Dataplane".into(),
    };
    let mut watch = health.watch(request).await.unwrap().into_inner();
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    use tokio_stream::StreamExt;
    assert_eq!(watch.next().await.unwrap().unwrap().status, serving);

    let ns = node.ns.clone();
    let fight = tokio::task::spawn_blocking(move || {
        let mut monitor = Monitor::start(&ns, &[]).unwrap();
        // Five deletions are repaired; the sixth is left alone.
        for _ in 0..5 {
            testbed::sh(&ns, "ip route del 10.244.2.0/26").unwrap();
            monitor
                .wait_for("the route re-added", WAIT, |l| {
                    l.starts_with("10.244.2.0/26") && l.contains("proto 80")
                })
                .unwrap();
        }
        testbed::sh(&ns, "ip route del 10.244.2.0/26").unwrap();
    });
    fight.await.unwrap();
    let status = tokio::time::timeout(WAIT, watch.next())
        .await
        .expect("health changes")
        .unwrap()
        .unwrap()
        .status;
    assert_ne!(
        status, serving,
        "a contested route makes the dataplane NOT_SERVING"
    );
    let state = vxmgr::client::dataplane(&node.socket)
        .await
        .unwrap()
        .get_state(vxmgr::wire::vxmgr::v1::GetStateRequest {})
        .await
        .unwrap()
        .into_inner();
    let contested: Vec<_> = state
        .failing_objects
        .iter()
        .filter(|o| o.object.contains("10.244.2.0/26"))
        .collect();
    assert_eq!(contested.len(), 1, "{:?}", state.failing_objects);
    assert!(
        contested[0].error.contains("another agent"),
        "{contested:?}"
    );
    let log = node.log_text();
    assert!(log.contains("another agent keeps changing"), "{log}");
}

/// Node 1's view with `extra` more (fake) remote nodes, so that its
/// snapshot takes several batches.
fn big_view(cluster: &Cluster, extra: u32) -> Vec<String> {
    let mut view = cluster.view(1, false);
    let in_sync = view.pop().expect("the view ends with InSync");
    for i in 0..extra {
        let (hi, lo) = (i / 200, i % 200);
        view.push(format!(
            r#"{{"vtepUpdate": {{"node": "fake-{i}", "mac": "66:cc:00:00:{hi:02x}:{lo:02x}", "ipv4Addr": "10.200.{hi}.{lo}", "parentDeviceIp": "172.20.{hi}.{lo}"}}}}"#
        ));
        view.push(format!(
            r#"{{"routeUpdate": {{"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.{}.{}.0/24", "dstNodeName": "fake-{i}"}}}}"#,
            100 + hi,
            lo
        ));
    }
    view.push(in_sync);
    view
}

#[test]
fn a_daemon_killed_at_any_point_converges_after_a_restart() {
    if !can_run("a_daemon_killed_at_any_point_converges_after_a_restart") {
        return;
    }
    let mut cluster = running_cluster(2, &[], false);
    let view = big_view(&cluster, 1000);
    let file = cluster.dir.join("big.jsonl");
    std::fs::write(&file, view.join("\n") + "\n").unwrap();
    cluster
        .node(1)
        .replay_ok(&cluster.dir, "big", &view)
        .unwrap();
    let ns = cluster.node(1).ns.clone();
    let converged = Census::of(&ns).unwrap();
    // IPv4: 1 blackhole, 2 for node-2, 1000 fake blocks; IPv6: node-2's.
    assert_eq!(
        converged.counts(),
        [1003 + 3, 1002, 1002, 1002, 1002],
        "{converged}"
    );

    for kill_after in [0usize, 1, 3] {
        // Restart from scratch each round: a world of node-2 only, then the
        // big one, killed after `kill_after` statuses.
        cluster.node_mut(1).start_daemon(&[]).unwrap();
        cluster
            .node(1)
            .replay_ok(&cluster.dir, "small", &cluster.view(1, false))
            .unwrap();
        let mut replay = BackgroundReplay::start(
            &cluster.node(1).socket,
            [OsStr::new("--step"), file.as_os_str()],
        );
        let mut statuses = replay.lines();
        for _ in 0..kill_after {
            statuses.next().expect("a status");
        }
        cluster.node_mut(1).stop_daemon(libc::SIGKILL).unwrap();
        replay.wait();

        cluster.node_mut(1).start_daemon(&[]).unwrap();
        cluster
            .node(1)
            .replay_ok(&cluster.dir, "again", &view)
            .unwrap();
        assert_census(
            &ns,
            &converged,
            &format!("killed after {kill_after} statuses"),
        );
    }
    assert!(ping(&cluster.node(1).pod_ns(), &cluster.node(2).pod_v4()));
}

#[test]
fn a_calc_process_that_disconnects_mid_snapshot_removes_nothing() {
    if !can_run("a_calc_process_that_disconnects_mid_snapshot_removes_nothing") {
        return;
    }
    let cluster = running_cluster(3, &[], false);
    let a = cluster.node(1);
    let mut monitor = Monitor::start(&a.ns, &["neigh"]).unwrap();
    // A new stream that declares only part of the world, then goes away
    // before its InSync.
    let mut partial = cluster.view_of(1, &[1, 2], false);
    partial.pop();
    a.replay_ok(&cluster.dir, "partial", &partial).unwrap();
    monitor.sync().unwrap();
    let ours: Vec<&String> = monitor
        .seen
        .iter()
        .filter(|l| l.contains("vxlan") || l.contains("proto 80"))
        .collect();
    assert!(
        ours.is_empty(),
        "nothing changes before an InSync: {ours:#?}"
    );
    assert!(
        routes(&a.ns, Family::V4)
            .iter()
            .any(|r| r.starts_with("10.244.3.0/26"))
    );
    assert!(ping(&a.pod_ns(), &cluster.node(3).pod_v4()));
}

/// Waits until the monitor has reported (now or before) a line matching
/// each of `wanted`.
fn await_all(monitor: &mut Monitor, wanted: &[&str]) {
    for want in wanted {
        if !monitor.seen.iter().any(|l| l.starts_with(want)) {
            monitor
                .wait_for(want, WAIT, |l| l.starts_with(want))
                .unwrap();
        }
    }
}

#[test]
fn a_device_set_down_gets_the_routes_the_kernel_dropped_back() {
    if !can_run("a_device_set_down_gets_the_routes_the_kernel_dropped_back") {
        return;
    }
    // The kernel drops the device's IPv4 routes and nexthops without a
    // notification.
    let cluster = running_cluster(2, &NOTIFICATIONS_ONLY, false);
    let ns = &cluster.node(1).ns;
    let before = [routes(ns, Family::V4), routes(ns, Family::V6)];
    let (pod, remote) = (cluster.node(1).pod_ns(), cluster.node(2));
    let mut monitor = Monitor::start(ns, &["neigh", "nexthop"]).unwrap();
    // Down and up again at once: only the link's notification tells.
    let flap = cluster.dir.join("flap.batch");
    std::fs::write(
        &flap,
        "link set vxlan.calico down\nlink set vxlan.calico up\n",
    )
    .unwrap();
    run_in(ns, &["ip", "-batch", &flap.to_string_lossy()]);
    await_all(
        &mut monitor,
        &[
            "id ",
            "10.244.2.0/26 nhid",
            "10.244.2.0 dev vxlan.calico proto 80 scope link",
            "10.244.2.0 dev vxlan.calico lladdr",
        ],
    );
    assert_eq!(routes(ns, Family::V4), before[0]);
    assert!(ping(&pod, &remote.pod_v4()));

    // IPv6 routes and the device's address go with a notification each.
    monitor.seen.clear();
    run_in(ns, &["ip", "link", "set", "vxlan-v6.calico", "down"]);
    await_all(
        &mut monitor,
        &[
            "id ",
            "fd00:244:0:2::/122 nhid",
            "fd00:244:0:2:: dev vxlan-v6.calico proto 80",
            "fd00:244:0:2:: dev vxlan-v6.calico lladdr",
        ],
    );
    assert_eq!(routes(ns, Family::V6), before[1]);
    let addrs = addresses(ns, "vxlan-v6.calico");
    assert!(
        addrs.contains(&"fd00:244:0:1::/128 global".to_string()),
        "{addrs:?}"
    );
    assert!(ping(&pod, &remote.pod_v6()));
}

#[test]
fn same_subnet_routes_wait_while_the_parent_is_down_and_come_back_with_it() {
    if !can_run("same_subnet_routes_wait_while_the_parent_is_down_and_come_back_with_it") {
        return;
    }
    let mut cluster = running_cluster(2, &NOTIFICATIONS_ONLY, true);
    let a = cluster.node(1);
    // The IPv6 parent address stays on eth0 while it is down.
    testbed::sh(&a.ns, "sysctl -q -w net.ipv6.conf.eth0.keep_addr_on_down=1").unwrap();
    let before = [routes(&a.ns, Family::V4), routes(&a.ns, Family::V6)];
    let mut monitor = Monitor::start(&a.ns, &[]).unwrap();
    run_in(&a.ns, &["ip", "link", "set", "eth0", "down"]);
    // A batch while the parent is down: its routes wait, no error.
    a.replay_ok(&cluster.dir, "down", &cluster.view(1, true))
        .unwrap();
    run_in(&a.ns, &["ip", "link", "set", "eth0", "up"]);
    await_all(
        &mut monitor,
        &["10.244.2.0/26 nhid", "fd00:244:0:2::/122 nhid"],
    );
    assert_eq!(
        [routes(&a.ns, Family::V4), routes(&a.ns, Family::V6)],
        before
    );
    assert!(ping(&a.pod_ns(), &cluster.node(2).pod_v4()));
    assert!(ping(&a.pod_ns(), &cluster.node(2).pod_v6()));
    let log = cluster.node_mut(1).stop_and_read_log().unwrap();
    assert!(!log.contains("kernel operation failed"), "{log}");
}

/// The `Type:` and `Header:` lines of `ipset list`.
fn ipset_header(ns: &str, set: &str) -> Vec<String> {
    run_in(ns, &["ipset", "list", "-terse", set])
        .lines()
        .filter(|l| l.starts_with("Type:") || l.starts_with("Header:"))
        .map(|l| l.split(" hashsize").next().unwrap_or(l).to_string())
        .collect()
}

#[test]
fn ipsets_of_another_type_or_family_are_replaced_whole() {
    if !can_run("ipsets_of_another_type_or_family_are_replaced_whole") {
        return;
    }
    let mut cluster = cluster(2);
    let ns = cluster.node(1).ns.clone();
    for command in [
        "ipset create cali40all-vxlan-net hash:ip",
        "ipset add cali40all-vxlan-net 10.9.9.9",
        "ipset create cali60all-vxlan-net hash:net family inet",
        "ipset add cali60all-vxlan-net 10.9.9.0/24",
    ] {
        testbed::sh(&ns, command).unwrap();
    }
    cluster.start_all(&[], false).unwrap();
    assert_eq!(
        ipset_header(&ns, "cali40all-vxlan-net"),
        ["Type: hash:net", "Header: family inet"]
    );
    assert_eq!(
        ipset_members(&ns, "cali40all-vxlan-net"),
        set(&["192.168.10.2"])
    );
    assert_eq!(
        ipset_header(&ns, "cali60all-vxlan-net"),
        ["Type: hash:net", "Header: family inet6"]
    );
    assert_eq!(
        ipset_members(&ns, "cali60all-vxlan-net"),
        set(&["fd00:10::2"])
    );
    let log = cluster.node_mut(1).stop_and_read_log().unwrap();
    assert!(!log.contains("kernel operation failed"), "{log}");
}

/// Objects added, changed and removed, over every BatchStatus calc-stub
/// printed.
fn objects(output: &std::process::Output) -> [u64; 3] {
    let mut sums = [0; 3];
    for status in support::statuses(output) {
        for (sum, field) in sums.iter_mut().zip(["added", "changed", "removed"]) {
            *sum += status["objects"][field].as_u64().unwrap_or(0);
        }
    }
    sums
}

/// A device's addresses as `address/prefix scope`.
fn addresses(ns: &str, dev: &str) -> Vec<String> {
    ip_json(ns, &["addr", "show", "dev", dev])[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            format!(
                "{}/{} {}",
                a["local"].as_str().unwrap(),
                a["prefixlen"],
                a["scope"].as_str().unwrap()
            )
        })
        .collect()
}

/// A device's neighbour entries as `address lladdr`; every one permanent.
fn permanent_neighbors(ns: &str, dev: &str) -> BTreeSet<String> {
    ip_json(ns, &["neigh", "show", "dev", dev])
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let state = n["state"].as_array().unwrap();
            assert!(state.iter().any(|s| s == "PERMANENT"), "{n}");
            format!(
                "{} {}",
                n["dst"].as_str().unwrap(),
                n["lladdr"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn a_node_failing_half_way_leaves_no_namespace_behind() {
    let test = "a_node_failing_half_way_leaves_no_namespace_behind";
    if !can_run(test) {
        return;
    }
    // Link names have at most 15 characters: with this tag the node's
    // underlay link is refused after its namespace was created.
    let tag = "vxhalfbuilt-overlong";
    let Err(error) = Cluster::new(tag, 1, &binaries()) else {
        panic!("a cluster with over-long link names was built");
    };
    assert!(error.to_string().contains("ip link add eth0"), "{error}");
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(list.status.success(), "ip netns list: {list:?}");
    let left: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|l| l.starts_with(tag))
        .map(String::from)
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

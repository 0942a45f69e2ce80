//! The reconciler over the in-memory kernel, driven by the real manager.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

mod firewall;
mod host;
mod table;

use super::*;
use crate::config::Config;
use crate::kernel::memory::MemoryBackend;
use crate::kernel::objects::{
    KernelNeighbor, KernelNexthop, KernelRoute, KernelRouteVia, Notification,
};
use crate::manager::Manager;
use crate::model::Update;
use crate::wire::felix::ToDataplane;
use crate::wire::json;

const NODE_A: &str = "node-a";

fn options(nexthops: NexthopMode) -> ReconcilerOptions {
    ReconcilerOptions {
        nexthops,
        disable_tx_checksum: false,
        route_protocol: 80,
        contest_window: CONTEST_WINDOW,
    }
}

/// A manager and reconciler as the daemon wires them, on a memory kernel.
struct Rig {
    manager: Manager,
    reconciler: Reconciler<MemoryBackend>,
    kernel: MemoryBackend,
}

impl Rig {
    async fn new(kernel: MemoryBackend, nexthops: NexthopMode) -> Rig {
        let mut reconciler = Reconciler::new(kernel.clone(), options(nexthops)).await;
        reconciler.resync().await.expect("memory dump");
        Rig {
            manager: Manager::new(NODE_A, Config::default()),
            reconciler,
            kernel,
        }
    }

    fn send(&mut self, lines: &[&str]) {
        for line in lines {
            let msg: ToDataplane = json::from_str(line).expect("test JSON");
            let update = Update::from_message(msg).expect("valid").expect("known");
            self.manager.on_update(update).expect("accepted");
        }
    }

    /// Resolves parents like the engine does, then applies the delta.
    async fn apply(&mut self) -> Report {
        let ips = Family::ALL.map(|f| self.manager.family(f).parent_ip());
        let (_, parents) = self.reconciler.find_parents(ips).await;
        for (f, p) in Family::ALL.into_iter().zip(parents) {
            self.manager.set_parent(f, p);
        }
        let request = ApplyRequest {
            delta: self.manager.complete_deferred_work(),
            in_sync: self.manager.in_sync(),
            route_protocol: 80,
            device_names: self.manager.settings().device_names,
        };
        self.reconciler.apply(request).await
    }

    /// A new stream on the same daemon.
    fn new_stream(&mut self) {
        self.manager = self.manager.fresh();
        self.reconciler.begin_stream();
    }

    fn routes(&self) -> Vec<String> {
        let k = self.kernel.lock();
        let mut routes: Vec<String> = k.routes.values().map(|r| r.to_string()).collect();
        routes.sort();
        routes
    }

    fn log_len(&self) -> usize {
        self.kernel.lock().log.len()
    }
}

pub(crate) const CLUSTER: &[&str] = &[
    r#"{"vtepUpdate": {"node": "node-a", "mac": "66:aa:00:00:00:01", "ipv4Addr": "10.244.0.0", "parentDeviceIp": "192.168.10.1"}}"#,
    r#"{"vtepUpdate": {"node": "node-b", "mac": "66:aa:00:00:00:02", "ipv4Addr": "10.244.1.0", "parentDeviceIp": "192.168.10.2"}}"#,
    r#"{"vtepUpdate": {"node": "node-c", "mac": "66:aa:00:00:00:03", "ipv4Addr": "10.244.2.0", "parentDeviceIp": "192.168.10.3"}}"#,
    r#"{"routeUpdate": {"types": "LOCAL_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.244.0.0/26", "dstNodeName": "node-a"}}"#,
    r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.244.1.0/26", "dstNodeName": "node-b"}}"#,
    r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.244.2.0/26", "dstNodeName": "node-c"}}"#,
    r#"{"routeUpdate": {"types": 17, "ipPoolType": "VXLAN", "dst": "10.244.1.0/32", "dstNodeName": "node-b"}}"#,
];
pub(crate) const IN_SYNC: &str = r#"{"inSync": {}}"#;

/// A node with `messages` and InSync programmed, recording operations.
async fn programmed_rig(messages: &[&str], nexthops: NexthopMode) -> Rig {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), nexthops).await;
    rig.kernel.record_operations();
    rig.send(messages);
    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    rig
}

async fn cluster_rig(nexthops: NexthopMode) -> Rig {
    programmed_rig(CLUSTER, nexthops).await
}

/// The ipset takes no RTNL: its members go in the call that carries the
/// nexthops, neighbours and FDB entries, so the kernel adds them while the
/// others wait for the RTNL, not after the routes.
#[tokio::test]
async fn ipset_members_go_with_the_nexthops_before_the_routes() {
    let rig = cluster_rig(NexthopMode::On).await;
    let k = rig.kernel.lock();
    let first = |what: &str, wanted: &dyn Fn(&KernelOp) -> bool| {
        k.log
            .iter()
            .position(wanted)
            .unwrap_or_else(|| panic!("no {what} in {:?}", k.log))
    };
    let members = first("ipset change with members", &|op| match op {
        KernelOp::Ipset {
            change: IpsetChange::Replace { members } | IpsetChange::Update { add: members, .. },
            ..
        } => !members.is_empty(),
        _ => false,
    });
    let fdb = first("FDB entry", &|op| matches!(op, KernelOp::ReplaceFdb(_)));
    let route = first("route", &|op| matches!(op, KernelOp::AddRoute(_)));
    assert!(fdb < members && members < route, "{:?}", k.log);
}

#[tokio::test]
async fn programs_the_design_example_through_nexthops() {
    let rig = cluster_rig(NexthopMode::On).await;
    let k = rig.kernel.lock();
    let device = k.link_by_name("vxlan.calico").expect("device").clone();
    assert_eq!(device.mtu, 1450);
    assert!(device.up);
    assert_eq!(device.addresses[0].to_string(), "10.244.0.0/32");
    let vx = device.vxlan.clone().unwrap();
    assert_eq!((vx.vni, vx.port, vx.learning), (4096, 4789, false));
    assert_eq!(k.nexthops.len(), 2);
    assert_eq!(k.neighbors.len(), 2);
    assert_eq!(k.fdb.len(), 2);
    let members: Vec<String> = k.ipsets["cali40all-vxlan-net"]
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(members, ["192.168.10.2/32", "192.168.10.3/32"]);
    let tunnel = k.routes[&"10.244.1.0/26".parse().unwrap()];
    assert!(matches!(tunnel.via, KernelRouteVia::Nexthop(_)));
    assert_eq!((tunnel.protocol, tunnel.mtu), (80, NonZeroU32::new(1450)));
    let blackhole = k.routes[&"10.244.0.0/26".parse().unwrap()];
    assert_eq!(blackhole.via, KernelRouteVia::Blackhole);
    let connected = k.routes[&"10.244.1.0/32".parse().unwrap()];
    assert_eq!(connected.via, KernelRouteVia::Link(device.index));
}

#[tokio::test]
async fn inline_gateways_without_nexthops() {
    let rig = cluster_rig(NexthopMode::Off).await;
    let k = rig.kernel.lock();
    assert!(k.nexthops.is_empty());
    let index = k.link_by_name("vxlan.calico").unwrap().index;
    let tunnel = k.routes[&"10.244.1.0/26".parse().unwrap()];
    assert_eq!(
        tunnel.via,
        KernelRouteVia::Gateway {
            gateway: "10.244.1.0".parse().unwrap(),
            ifindex: index
        }
    );
}

#[tokio::test]
async fn resync_without_drift_does_nothing_and_repairs_drift() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let before = rig.log_len();
    let report = rig.reconciler.resync().await.unwrap();
    assert_eq!(report.operations, 0, "{report:?}");
    assert_eq!(rig.log_len(), before);

    let dst = "10.244.2.0/26".parse().unwrap();
    rig.kernel.lock().routes.remove(&dst);
    let neighbor = *rig.kernel.lock().neighbors.keys().next().unwrap();
    rig.kernel.lock().neighbors.remove(&neighbor);
    rig.kernel
        .lock()
        .ipsets
        .get_mut("cali40all-vxlan-net")
        .unwrap()
        .clear();
    let report = rig.reconciler.resync().await.unwrap();
    assert_eq!(
        report.added, 4,
        "route, neighbour, two ipset members: {report:?}"
    );
    assert!(rig.kernel.lock().routes.contains_key(&dst));
    assert_eq!(rig.kernel.lock().neighbors.len(), 2);
}

/// A daemon restarted on `rig`'s kernel and fed `messages` and InSync
/// deletes, adds and changes nothing.
async fn assert_a_restart_touches_nothing(rig: Rig, messages: &[&str]) {
    let kernel = rig.kernel.clone();
    let routes_before = rig.routes();
    drop(rig);
    let mut restarted = Rig::new(kernel, NexthopMode::On).await;
    let before = restarted.log_len();
    restarted.send(messages);
    restarted.send(&[IN_SYNC]);
    let report = restarted.apply().await;
    assert_eq!(report.operations, 0, "{report:?}");
    assert_eq!(restarted.log_len(), before, "no operation at all");
    assert_eq!(restarted.routes(), routes_before);
}

#[tokio::test]
async fn a_restart_adopts_the_kernel_without_touching_it() {
    let rig = cluster_rig(NexthopMode::On).await;
    assert_a_restart_touches_nothing(rig, CLUSTER).await;
}

#[tokio::test]
async fn a_new_stream_sweeps_exactly_the_stale_objects_after_its_in_sync() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    rig.new_stream();
    // node-c and its block are gone from the new stream's world.
    rig.send(&CLUSTER[..2]);
    rig.send(&[CLUSTER[3], CLUSTER[4], CLUSTER[6]]);
    let report = rig.apply().await;
    assert_eq!(
        report.removed, 0,
        "nothing removed before InSync: {report:?}"
    );
    assert_eq!(report.operations, 0, "nothing else changed: {report:?}");
    assert!(rig.routes().iter().any(|r| r.contains("10.244.2.0/26")));

    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    // node-c's route, nexthop, neighbour, FDB entry and ipset member.
    assert_eq!(report.removed, 5, "{report:?}");
    assert_eq!((report.added, report.changed), (0, 0));
    assert!(!rig.routes().iter().any(|r| r.contains("10.244.2.0/26")));
    let k = rig.kernel.lock();
    assert_eq!(
        (k.nexthops.len(), k.neighbors.len(), k.fdb.len()),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn the_device_stays_when_the_local_vtep_goes_or_a_stream_never_declares_it() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let device = |rig: &Rig| rig.kernel.lock().link_by_name("vxlan.calico").cloned();
    let before = device(&rig).expect("device");
    let routes = rig.routes();
    rig.send(&[r#"{"vtepRemove": {"node": "node-a"}}"#]);
    let report = rig.apply().await;
    assert_eq!(report.operations, 0, "{report:?}");
    let report = rig.reconciler.resync().await.unwrap();
    assert_eq!(report.operations, 0, "a resync keeps it: {report:?}");

    rig.new_stream();
    rig.send(&CLUSTER[1..]);
    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    assert_eq!(report.operations, 0, "the sweep keeps it: {report:?}");

    let kernel = rig.kernel.clone();
    drop(rig);
    let mut restarted = Rig::new(kernel, NexthopMode::On).await;
    restarted.send(&CLUSTER[1..]);
    restarted.send(&[IN_SYNC]);
    let report = restarted.apply().await;
    assert_eq!(report.removed, 0, "after a restart too: {report:?}");
    assert_eq!(device(&restarted), Some(before));
    // Only their MTU may differ: without a local VTEP the parent interface,
    // which the MTU follows, is unknown to a restarted daemon.
    let destinations = |routes: Vec<String>| -> Vec<String> {
        routes.iter().map(|r| r.replace(" mtu 1450", "")).collect()
    };
    assert_eq!(destinations(restarted.routes()), destinations(routes));
}

/// Not a nexthop replace: the kernel would walk every route of the cluster.
#[tokio::test]
async fn a_vtep_address_change_moves_only_that_nodes_routes_to_a_fresh_nexthop() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let old = *rig
        .kernel
        .lock()
        .nexthops
        .values()
        .find(|n| n.gateway.to_string() == "10.244.1.0")
        .expect("node-b's nexthop");
    rig.kernel.lock().log.clear();
    rig.send(&[
        r#"{"vtepUpdate": {"node": "node-b", "mac": "66:aa:00:00:00:02", "ipv4Addr": "10.244.1.64", "parentDeviceIp": "192.168.10.2"}}"#,
    ]);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    let k = rig.kernel.lock();
    let nexthop_ops: Vec<&KernelOp> = k
        .log
        .iter()
        .filter(|op| {
            matches!(
                op,
                KernelOp::AddNexthop(_) | KernelOp::ReplaceNexthop(_) | KernelOp::DeleteNexthop(_)
            )
        })
        .collect();
    let [
        KernelOp::AddNexthop(fresh),
        KernelOp::DeleteNexthop(deleted),
    ] = nexthop_ops[..]
    else {
        panic!("one nexthop added and the old one deleted: {:#?}", k.log);
    };
    assert_eq!(fresh.gateway.to_string(), "10.244.1.64");
    assert_ne!(fresh.id, old.id);
    assert_eq!(deleted.id, old.id);
    let moved: Vec<String> = k
        .log
        .iter()
        .filter_map(|op| match op {
            KernelOp::AddRoute(r) | KernelOp::ReplaceRoute(r) => Some(r.dst.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(
        moved,
        ["10.244.1.0/26"],
        "only node-b's routes: {:#?}",
        k.log
    );
    assert_eq!(
        k.routes[&"10.244.1.0/26".parse().unwrap()].via,
        KernelRouteVia::Nexthop(fresh.id)
    );
    assert!(!k.nexthops.contains_key(&old.id));
}

/// A route that could not move over goes with the old nexthop, and comes
/// back through the fresh one on the retry.
#[tokio::test]
async fn a_route_that_fails_to_move_with_its_vtep_is_put_back_on_retry() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let dst = "10.244.1.0/26".parse().unwrap();
    rig.kernel.inject_fault(
        move |op| matches!(op, KernelOp::ReplaceRoute(r) if r.dst == dst),
        libc::EBUSY,
    );
    rig.send(&[
        r#"{"vtepUpdate": {"node": "node-b", "mac": "66:aa:00:00:00:02", "ipv4Addr": "10.244.1.64", "parentDeviceIp": "192.168.10.2"}}"#,
    ]);
    let report = rig.apply().await;
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert!(
        !rig.kernel.lock().routes.contains_key(&dst),
        "gone with the old nexthop"
    );
    rig.kernel.clear_faults();
    let retry_at = rig.reconciler.next_retry().expect("a retry is scheduled");
    let report = rig.reconciler.retry(retry_at).await;
    assert_eq!((report.added, report.errors.len()), (1, 0), "{report:?}");
    let k = rig.kernel.lock();
    let KernelRouteVia::Nexthop(id) = k.routes[&dst].via else {
        panic!("{:?}", k.routes[&dst]);
    };
    assert_eq!(k.nexthops[&id].gateway.to_string(), "10.244.1.64");
}

#[tokio::test]
async fn a_vni_change_recreates_the_device_and_everything_on_it() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let old_index = rig
        .kernel
        .lock()
        .link_by_name("vxlan.calico")
        .unwrap()
        .index;
    rig.send(&[r#"{"configUpdate": {"config": {"VXLANVNI": "7"}}}"#]);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    let k = rig.kernel.lock();
    let device = k.link_by_name("vxlan.calico").unwrap();
    assert_ne!(device.index, old_index);
    assert_eq!(device.vxlan.as_ref().unwrap().vni, 7);
    assert_eq!(k.routes.len(), 4, "routes re-added: {:?}", k.routes.keys());
    assert_eq!(
        (k.nexthops.len(), k.neighbors.len(), k.fdb.len()),
        (2, 2, 2)
    );
}

#[tokio::test]
async fn device_drift_is_repaired_in_place() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    {
        let mut k = rig.kernel.lock();
        let index = k.link_by_name("vxlan.calico").unwrap().index;
        k.set_down(index).unwrap();
        let link = k.links.get_mut(&index).unwrap();
        link.mtu = 9000;
        link.addresses.push("10.9.9.9/32".parse().unwrap());
        link.addresses.push("fe80::1/64".parse().unwrap());
    }
    let report = rig.reconciler.check_devices().await;
    assert!(report.errors.is_empty(), "{report:?}");
    let k = rig.kernel.lock();
    let link = k.link_by_name("vxlan.calico").unwrap();
    assert_eq!((link.mtu, link.up), (1450, true));
    let addresses: Vec<String> = link.addresses.iter().map(|a| a.to_string()).collect();
    assert_eq!(
        addresses,
        ["10.244.0.0/32", "fe80::1/64"],
        "link-local kept"
    );
}

#[tokio::test]
async fn a_failing_object_is_reported_retried_and_does_not_block_the_others() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    let bad = "10.244.2.0/26".parse().unwrap();
    rig.kernel.inject_fault(
        move |op| matches!(op, KernelOp::AddRoute(r) | KernelOp::ReplaceRoute(r) if r.dst == bad),
        libc::EBUSY,
    );
    rig.send(CLUSTER);
    let report = rig.apply().await;
    assert_eq!(report.errors.len(), 1, "{report:?}");
    let error = &report.errors[0];
    assert!(
        error
            .object
            .starts_with("adding route 10.244.2.0/26 via 10.244.2.0 dev vxlan.calico"),
        "{error:?}"
    );
    assert!(error.error.contains("busy"), "{error:?}");
    assert_eq!(rig.kernel.lock().routes.len(), 3, "the other routes are in");
    assert_eq!(rig.reconciler.failing().len(), 1);

    let retry_at = rig.reconciler.next_retry().expect("a retry is scheduled");
    let report = rig.reconciler.retry(Instant::now()).await;
    assert_eq!(report.operations, 0, "not before its backoff");
    rig.kernel.clear_faults();
    let report = rig.reconciler.retry(retry_at).await;
    assert_eq!((report.added, report.errors.len()), (1, 0), "{report:?}");
    assert!(rig.reconciler.failing().is_empty());
    assert!(rig.reconciler.next_retry().is_none());
}

#[tokio::test]
async fn routes_wait_for_their_device() {
    let mut rig = Rig::new(MemoryBackend::new(), NexthopMode::Off).await;
    rig.send(CLUSTER);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "no error storm: {report:?}");
    assert_eq!(rig.routes(), ["route blackhole 10.244.0.0/26 proto 80"]);

    // The parent address appears on an interface: the device and every
    // route through it follow.
    {
        let mut k = rig.kernel.lock();
        let index = k.add_link("eth0", 1500);
        k.links
            .get_mut(&index)
            .unwrap()
            .addresses
            .push("192.168.10.1/24".parse().unwrap());
    }
    let report = rig.reconciler.check_devices().await;
    assert_eq!(report.parent_changes.len(), 1);
    for (family, parent) in report.parent_changes {
        rig.manager.set_parent(family, parent);
    }
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(rig.routes().len(), 4);
}

#[tokio::test]
async fn backoff_grows() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    rig.kernel
        .inject_fault(|op| matches!(op, KernelOp::ReplaceFdb(_)), libc::EIO);
    rig.send(&CLUSTER[..2]);
    rig.apply().await;
    let first = rig.reconciler.next_retry().unwrap();
    let retried = Instant::now();
    rig.reconciler.retry(first).await;
    let second = rig.reconciler.next_retry().unwrap();
    assert!(
        second >= retried + Duration::from_millis(500),
        "the second wait doubles the first (250 ms): {:?}",
        second - retried
    );
}

/// Feeds the memory kernel's notifications to the reconciler, as the kernel
/// task does; returns whether a repair was due.
fn notice_all(rig: &mut Rig, rx: &mut Watch) -> bool {
    let mut due = false;
    while let Some(n) = rx.try_recv() {
        due |= rig.reconciler.notice(n, Instant::now());
    }
    due
}

#[tokio::test]
async fn changes_by_others_are_noticed_and_repaired() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let mut rx = rig.reconciler.watch().unwrap();
    let dst = "10.244.1.0/26".parse().unwrap();
    let ours = rig.kernel.lock().routes[&dst];
    rig.kernel.interfere(KernelOp::DeleteRoute(ours)).unwrap();
    let neighbor = *rig.kernel.lock().neighbors.values().next().unwrap();
    rig.kernel
        .interfere(KernelOp::ReplaceNeighbor(KernelNeighbor {
            mac: "66:ee:00:00:00:09".parse().unwrap(),
            ..neighbor
        }))
        .unwrap();
    assert!(notice_all(&mut rig, &mut rx));
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert_eq!((report.added, report.changed), (1, 1), "{report:?}");
    let k = rig.kernel.lock();
    assert_eq!(k.routes[&dst], ours);
    assert_eq!(k.neighbors[&(neighbor.ifindex, neighbor.address)], neighbor);
}

#[tokio::test]
async fn our_own_changes_echoed_back_are_not_drift() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let routes: Vec<KernelRoute> = rig.kernel.lock().routes.values().copied().collect();
    for route in routes {
        assert!(!rig.reconciler.notice(
            Notification::Route(TableRoute::Shaped(route)),
            Instant::now()
        ));
    }
    let foreign = KernelRoute {
        dst: "192.0.2.0/24".parse().unwrap(),
        protocol: 4,
        via: KernelRouteVia::Blackhole,
        mtu: None,
    };
    assert!(
        !rig.reconciler.notice(
            Notification::Route(TableRoute::Shaped(foreign)),
            Instant::now()
        ),
        "routes of other protocols are not ours"
    );
}

#[tokio::test]
async fn an_unwanted_object_of_ours_that_appears_is_removed_after_in_sync() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let mut rx = rig.reconciler.watch().unwrap();
    let stray = KernelRoute {
        dst: "10.99.0.0/26".parse().unwrap(),
        protocol: 80,
        via: KernelRouteVia::Blackhole,
        mtu: None,
    };
    rig.kernel.interfere(KernelOp::ReplaceRoute(stray)).unwrap();
    assert!(notice_all(&mut rig, &mut rx));
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert_eq!(report.removed, 1, "{report:?}");
    assert!(!rig.kernel.lock().routes.contains_key(&stray.dst));
}

/// Another agent deletes the route to 10.244.2.0/26 whenever vxmgr puts
/// it back, until vxmgr stops; returns how many times vxmgr did.
async fn fight_over_a_route(rig: &mut Rig) -> u32 {
    let mut rx = rig.reconciler.watch().unwrap();
    let dst = "10.244.2.0/26".parse().unwrap();
    let mut repairs = 0;
    for _ in 0..10 {
        let ours = rig.kernel.lock().routes.get(&dst).copied();
        let Some(ours) = ours else { break };
        rig.kernel.interfere(KernelOp::DeleteRoute(ours)).unwrap();
        notice_all(rig, &mut rx);
        let report = rig.reconciler.repair(Instant::now()).await.unwrap();
        repairs += report.added;
    }
    repairs
}

#[tokio::test]
async fn a_fight_over_an_object_backs_off_and_is_reported() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let dst = "10.244.2.0/26".parse().unwrap();
    let repairs = fight_over_a_route(&mut rig).await;
    assert_eq!(repairs, 5, "five repairs, then vxmgr backs off");
    assert!(!rig.kernel.lock().routes.contains_key(&dst));
    let contested = rig.reconciler.contested(Instant::now());
    assert_eq!(contested.len(), 1, "{contested:?}");
    assert!(
        contested[0].object.contains("10.244.2.0/26"),
        "{contested:?}"
    );
    assert!(
        contested[0].error.contains("another agent"),
        "{contested:?}"
    );

    // The periodic resync, the safety net, still puts it back.
    let report = rig.reconciler.resync().await.unwrap();
    assert_eq!(report.added, 1, "{report:?}");
}

#[tokio::test]
async fn a_contested_object_is_repaired_when_its_back_off_ends() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let dst = "10.244.2.0/26".parse().unwrap();
    fight_over_a_route(&mut rig).await;
    let fought = Instant::now();
    assert_eq!(rig.reconciler.contested(fought).len(), 1);
    let resume = rig
        .reconciler
        .next_retry()
        .expect("the end of the back-off is a wake-up");
    assert!(resume > fought, "{:?}", resume - fought);

    let report = rig.reconciler.retry(fought).await;
    assert_eq!(report.operations, 0, "not during the back-off: {report:?}");
    let report = rig.reconciler.retry(resume).await;
    assert_eq!(report.added, 1, "{report:?}");
    assert!(rig.kernel.lock().routes.contains_key(&dst));
    assert!(rig.reconciler.contested(resume).is_empty());
    assert_eq!(
        rig.reconciler.next_retry(),
        None,
        "nothing left to wake up for"
    );
}

#[tokio::test]
async fn a_device_deleted_behind_our_back_comes_back_with_everything_on_it() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let mut rx = rig.reconciler.watch().unwrap();
    let index = rig
        .kernel
        .lock()
        .link_by_name("vxlan.calico")
        .unwrap()
        .index;
    rig.kernel
        .interfere(KernelOp::DeleteLink {
            index,
            name: "vxlan.calico".into(),
        })
        .unwrap();
    assert!(notice_all(&mut rig, &mut rx));
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    let k = rig.kernel.lock();
    assert!(k.link_by_name("vxlan.calico").is_some());
    assert_eq!(k.routes.len(), 4);
    assert_eq!(
        (k.nexthops.len(), k.neighbors.len(), k.fdb.len()),
        (2, 2, 2)
    );
}

#[tokio::test]
async fn an_overrun_resyncs() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let dst = "10.244.2.0/26".parse().unwrap();
    rig.kernel.lock().routes.remove(&dst);
    assert!(rig.reconciler.notice(Notification::Overrun, Instant::now()));
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert_eq!(report.added, 1, "{report:?}");
}

fn device_index(rig: &Rig) -> u32 {
    rig.kernel
        .lock()
        .link_by_name("vxlan.calico")
        .expect("device")
        .index
}

/// Routes, nexthops, neighbours and FDB entries in the memory kernel.
fn census(rig: &Rig) -> [usize; 4] {
    let k = rig.kernel.lock();
    [
        k.routes.len(),
        k.nexthops.len(),
        k.neighbors.len(),
        k.fdb.len(),
    ]
}

#[tokio::test]
async fn a_device_set_down_gets_what_the_kernel_dropped_back_from_the_notification() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let converged = census(&rig);
    let mut rx = rig.reconciler.watch().unwrap();
    let index = device_index(&rig);
    // Down and up again before vxmgr looks: only the notification tells.
    rig.kernel.set_link_up(index, false).unwrap();
    rig.kernel.set_link_up(index, true).unwrap();
    assert_eq!(
        census(&rig),
        [1, 0, 0, 2],
        "only the blackhole and FDB stay"
    );
    assert!(notice_all(&mut rig, &mut rx));
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(census(&rig), converged);
}

#[tokio::test]
async fn a_device_found_down_by_the_check_is_set_up_with_everything_on_it() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let converged = census(&rig);
    let index = device_index(&rig);
    rig.kernel.lock().set_down(index).unwrap();
    let report = rig.reconciler.check_devices().await;
    assert!(report.errors.is_empty(), "{report:?}");
    assert!(rig.kernel.lock().links[&index].up);
    assert_eq!(census(&rig), converged);
}

const SAME_SUBNET: &[&str] = &[
    r#"{"vtepUpdate": {"node": "node-a", "mac": "66:aa:00:00:00:01", "ipv4Addr": "10.244.0.0", "parentDeviceIp": "192.168.10.1"}}"#,
    r#"{"vtepUpdate": {"node": "node-b", "mac": "66:aa:00:00:00:02", "ipv4Addr": "10.244.1.0", "parentDeviceIp": "192.168.10.2"}}"#,
    r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.244.1.0/26", "dstNodeName": "node-b", "dstNodeIp": "192.168.10.2", "sameSubnet": true}}"#,
    r#"{"inSync": {}}"#,
];

fn direct_route(rig: &Rig) -> Option<KernelRoute> {
    rig.kernel
        .lock()
        .routes
        .get(&"10.244.1.0/26".parse().unwrap())
        .copied()
}

/// The nexthop a route goes through.
fn nexthop_of(rig: &Rig, route: &KernelRoute) -> KernelNexthop {
    let KernelRouteVia::Nexthop(id) = route.via else {
        panic!("{route} has no nexthop");
    };
    rig.kernel.lock().nexthops[&id]
}

/// flannel's host-gw: no-encap routes to two blocks of one node and one
/// block of another, via their addresses on the parent.
const NO_ENCAP: &[&str] = &[
    r#"{"routeUpdate": {"types": "LOCAL_HOST", "ipPoolType": "NO_ENCAP", "dst": "192.168.10.1/32", "dstNodeName": "node-a", "dstNodeIp": "192.168.10.1"}}"#,
    r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "NO_ENCAP", "dst": "10.244.1.0/26", "dstNodeName": "node-b", "dstNodeIp": "192.168.10.2"}}"#,
    r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "NO_ENCAP", "dst": "10.244.1.64/26", "dstNodeName": "node-b", "dstNodeIp": "192.168.10.2"}}"#,
    r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "NO_ENCAP", "dst": "10.244.2.0/26", "dstNodeName": "node-c", "dstNodeIp": "192.168.10.3"}}"#,
];

#[tokio::test]
async fn direct_routes_share_a_nexthop_per_node_address_on_the_parent() {
    let rig = programmed_rig(NO_ENCAP, NexthopMode::On).await;
    let eth0 = rig.kernel.lock().link_by_name("eth0").unwrap().index;
    let mut nexthops: Vec<(u32, String)> = (rig.kernel.lock().nexthops.values())
        .map(|n| (n.ifindex, n.gateway.to_string()))
        .collect();
    nexthops.sort();
    assert_eq!(
        nexthops,
        [(eth0, "192.168.10.2".into()), (eth0, "192.168.10.3".into())]
    );
    let route = direct_route(&rig).unwrap();
    let other_block = rig.kernel.lock().routes[&"10.244.1.64/26".parse().unwrap()];
    assert_eq!(
        route.via, other_block.via,
        "one nexthop for the node's blocks"
    );
    assert_a_restart_touches_nothing(rig, NO_ENCAP).await;
}

#[tokio::test]
async fn a_direct_nexthop_goes_with_the_last_route_through_it() {
    let mut rig = programmed_rig(NO_ENCAP, NexthopMode::On).await;
    rig.send(&[r#"{"routeRemove": {"dst": "10.244.1.0/26"}}"#]);
    assert!(rig.apply().await.errors.is_empty());
    assert_eq!(rig.kernel.lock().nexthops.len(), 2, "node-b's other block");
    rig.send(&[r#"{"routeRemove": {"dst": "10.244.1.64/26"}}"#]);
    assert!(rig.apply().await.errors.is_empty());
    let k = rig.kernel.lock();
    let gateways: Vec<String> = k.nexthops.values().map(|n| n.gateway.to_string()).collect();
    assert_eq!(gateways, ["192.168.10.3"]);
}

#[tokio::test]
async fn direct_routes_have_inline_gateways_without_nexthops() {
    let rig = programmed_rig(NO_ENCAP, NexthopMode::Off).await;
    let eth0 = rig.kernel.lock().link_by_name("eth0").unwrap().index;
    assert!(rig.kernel.lock().nexthops.is_empty());
    let gateway = "192.168.10.2".parse().unwrap();
    let via = KernelRouteVia::Gateway {
        gateway,
        ifindex: eth0,
    };
    assert_eq!(direct_route(&rig).map(|r| r.via), Some(via));
}

#[tokio::test]
async fn same_subnet_routes_wait_while_the_parent_is_down_and_come_back_with_it() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    rig.kernel.record_operations();
    rig.send(SAME_SUBNET);
    assert!(rig.apply().await.errors.is_empty());
    let route = direct_route(&rig).expect("the same-subnet route");
    let eth0 = rig.kernel.lock().link_by_name("eth0").unwrap().index;
    let nexthop = nexthop_of(&rig, &route);
    assert_eq!(
        (nexthop.ifindex, nexthop.gateway),
        (eth0, "192.168.10.2".parse().unwrap())
    );

    let mut rx = rig.reconciler.watch().unwrap();
    rig.kernel.set_link_up(eth0, false).unwrap();
    assert_eq!(direct_route(&rig), None, "the kernel dropped it");
    assert!(notice_all(&mut rig, &mut rx));
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    // The parent stays down: the route waits, nothing is tried or retried.
    let tried = rig.log_len();
    for _ in 0..3 {
        let report = rig.reconciler.check_devices().await;
        assert!(report.errors.is_empty(), "no error storm: {report:?}");
    }
    assert_eq!(rig.reconciler.next_retry(), None);
    assert!(rig.reconciler.failing().is_empty());
    let routes_tried = rig.kernel.lock().log[tried..]
        .iter()
        .filter(|op| {
            matches!(
                op,
                KernelOp::AddRoute(_)
                    | KernelOp::ReplaceRoute(_)
                    | KernelOp::AddNexthop(_)
                    | KernelOp::ReplaceNexthop(_)
            )
        })
        .count();
    assert_eq!(routes_tried, 0, "nothing goes to a down interface");

    rig.kernel.set_link_up(eth0, true).unwrap();
    assert!(notice_all(&mut rig, &mut rx));
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert_eq!((report.added, report.errors.len()), (2, 0), "{report:?}");
    assert_eq!(direct_route(&rig), Some(route), "the nexthop and its route");
}

#[tokio::test]
async fn a_route_refused_for_a_down_interface_waits_for_it_without_retries() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    let eth0 = rig.kernel.lock().link_by_name("eth0").unwrap().index;
    // The parent is found up, then goes down before the route's nexthop
    // is added.
    rig.kernel.inject_fault(
        move |op| matches!(op, KernelOp::AddNexthop(n) | KernelOp::ReplaceNexthop(n) if n.ifindex == eth0),
        libc::ENETDOWN,
    );
    rig.send(SAME_SUBNET);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "waiting is no error: {report:?}");
    assert_eq!(report.waiting, 1, "{report:?}");
    assert_eq!(rig.reconciler.next_retry(), None, "no backoff retries");
    assert!(rig.reconciler.failing().is_empty());

    // The links are checked again (as on the interface's notification).
    rig.kernel.clear_faults();
    let report = rig.reconciler.check_devices().await;
    assert_eq!((report.added, report.errors.len()), (2, 0), "{report:?}");
    assert!(direct_route(&rig).is_some());
}

#[tokio::test]
async fn a_failed_ipset_update_is_retried_as_a_full_replace() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    // The set is no longer one that takes our members (another agent
    // recreated it as another type, say).
    rig.kernel.inject_fault(
        |op| {
            matches!(
                op,
                KernelOp::Ipset {
                    change: IpsetChange::Update { .. },
                    ..
                }
            )
        },
        libc::EINVAL,
    );
    rig.send(&[
        r#"{"vtepUpdate": {"node": "node-d", "mac": "66:aa:00:00:00:04", "ipv4Addr": "10.244.3.0", "parentDeviceIp": "192.168.10.4"}}"#,
    ]);
    let report = rig.apply().await;
    assert_eq!(report.errors.len(), 1, "{report:?}");
    let retry_at = rig.reconciler.next_retry().expect("a retry");
    let tried = rig.log_len();
    let report = rig.reconciler.retry(retry_at).await;
    assert!(report.errors.is_empty(), "{report:?}");
    let k = rig.kernel.lock();
    let ipset_ops: Vec<&KernelOp> = k.log[tried..]
        .iter()
        .filter(|op| matches!(op, KernelOp::Ipset { .. }))
        .collect();
    assert!(
        matches!(
            ipset_ops[..],
            [KernelOp::Ipset {
                change: IpsetChange::Replace { .. },
                ..
            }]
        ),
        "{ipset_ops:?}"
    );
    assert_eq!(k.ipsets["cali40all-vxlan-net"].len(), 3);
}

#[tokio::test]
async fn a_resync_that_cannot_read_the_kernel_is_tried_again() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let dst = "10.244.2.0/26".parse().unwrap();
    rig.kernel.lock().routes.remove(&dst);
    rig.kernel.fail_dumps(libc::ENOBUFS);
    let noticed = Instant::now();
    assert!(rig.reconciler.notice(Notification::Overrun, noticed));
    assert!(rig.reconciler.repair(noticed).await.is_err());
    let retry_at = rig.reconciler.next_retry().expect("the resync is retried");
    assert!(retry_at > noticed, "with backoff");
    // Still failing: tried again later.
    rig.reconciler.retry(retry_at).await;
    let later = rig.reconciler.next_retry().expect("the resync is retried");
    assert!(later > retry_at, "with a longer backoff");
    rig.kernel.clear_faults();
    let report = rig.reconciler.retry(later).await;
    assert_eq!(report.added, 1, "{report:?}");
    assert_eq!(rig.reconciler.next_retry(), None);
}

const FLANNEL_NAMES: &str = r#"{"configUpdate": {"config": {"VXLANDeviceName": "flannel.1", "VXLANDeviceNameV6": "flannel-v6.1"}}}"#;

#[tokio::test]
async fn devices_take_the_names_the_stream_gives_and_a_restart_adopts_them() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    rig.send(&[FLANNEL_NAMES]);
    rig.send(CLUSTER);
    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    let index = {
        let k = rig.kernel.lock();
        assert!(k.link_by_name("vxlan.calico").is_none());
        k.link_by_name("flannel.1").expect("flannel.1").index
    };
    let connected = rig.kernel.lock().routes[&"10.244.1.0/32".parse().unwrap()];
    assert_eq!(connected.via, KernelRouteVia::Link(index));

    // A restarted daemon starts out with Felix's names: flannel.1 and what
    // is on it are not its own until the stream names them, and are then
    // adopted as they are.
    let messages: Vec<&str> = std::iter::once(FLANNEL_NAMES)
        .chain(CLUSTER.iter().copied())
        .collect();
    assert_a_restart_touches_nothing(rig, &messages).await;
}

#[tokio::test]
async fn a_first_batch_claiming_a_parent_and_naming_devices_reads_the_kernel_once() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    let before = rig.kernel.lock().dumps;
    rig.send(&[FLANNEL_NAMES]);
    rig.send(CLUSTER);
    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    assert!(rig.kernel.lock().link_by_name("flannel.1").is_some());
    assert_eq!(rig.kernel.lock().dumps - before, 1);
}

#[tokio::test]
async fn a_batch_that_reads_the_kernel_again_tries_each_object_once() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    let creates_device = |op: &KernelOp| matches!(op, KernelOp::CreateVxlan(_));
    rig.kernel.inject_fault(creates_device, libc::EPERM);
    rig.kernel.record_operations();
    rig.send(&[FLANNEL_NAMES]);
    rig.send(CLUSTER);
    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    assert_eq!(report.errors.len(), 1, "{report:?}");
    let tries = rig
        .kernel
        .lock()
        .log
        .iter()
        .filter(|op| creates_device(op))
        .count();
    assert_eq!(tries, 1);
}

#[tokio::test]
async fn a_device_of_names_no_longer_in_effect_is_left_alone() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    rig.new_stream();
    rig.send(&[FLANNEL_NAMES]);
    rig.send(CLUSTER);
    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    let k = rig.kernel.lock();
    assert!(k.link_by_name("flannel.1").is_some());
    assert!(
        k.link_by_name("vxlan.calico").is_some(),
        "not vxmgr's device any more: not deleted"
    );
}

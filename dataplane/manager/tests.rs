//! Every rule of DESIGN.md §4, at the manager level.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use arcstr::ArcStr;

use super::*;
use crate::config::{DeviceNames, SettingsLayer};
use crate::desired::{Change, Desired, Route, RouteTarget};
use crate::model::update::Rejection;
use crate::wire::felix::{
    self, IpPoolType, RouteRemove, RouteType, RouteUpdate, ToDataplane, VxlanTunnelEndpointRemove,
    VxlanTunnelEndpointUpdate, to_dataplane::Payload,
};

const RW: i32 = RouteType::RemoteWorkload as i32;
const RT: i32 = RouteType::RemoteTunnel as i32;
const LW: i32 = RouteType::LocalWorkload as i32;

fn send(m: &mut Manager, payload: Payload) -> Result<Outcome, Rejection> {
    let update = Update::from_message(ToDataplane {
        sequence_number: 0,
        payload: Some(payload),
    })?
    .expect("known payload");
    m.on_update(update)
}

fn ok(m: &mut Manager, payload: Payload) -> Outcome {
    send(m, payload).expect("accepted")
}

fn route(types: i32, pool: IpPoolType, dst: &str, node: &str) -> RouteUpdate {
    RouteUpdate {
        types,
        ip_pool_type: pool as i32,
        dst: dst.into(),
        dst_node_name: node.into(),
        ..Default::default()
    }
}

fn vtep(node: &str, n: u8) -> VxlanTunnelEndpointUpdate {
    VxlanTunnelEndpointUpdate {
        node: node.into(),
        mac: format!("66:aa:00:00:00:{n:02x}"),
        ipv4_addr: format!("10.244.{}.0", n - 1),
        parent_device_ip: format!("192.168.10.{n}"),
        mac_v6: format!("66:bb:00:00:00:{n:02x}"),
        ipv6_addr: format!("fd00:244:0:{}::", n - 1),
        parent_device_ipv6: format!("fd00:10::{n}"),
    }
}

/// node-b's block, in the same subnet as node-a.
fn same_subnet_block() -> Payload {
    let mut r = route(RW, IpPoolType::Vxlan, "10.244.1.0/26", "node-b");
    r.same_subnet = true;
    r.dst_node_ip = "192.168.10.2".into();
    Payload::RouteUpdate(r)
}

fn eth0() -> Option<ParentInterface> {
    Some(ParentInterface {
        name: ArcStr::from("eth0"),
        index: 2,
        mtu: 1500,
    })
}

/// node-a with its own VTEP and parent interface known, and nothing else.
fn node_a() -> Manager {
    let mut m = Manager::new("node-a", Config::default());
    ok(&mut m, Payload::VtepUpdate(vtep("node-a", 1)));
    m.set_parent(Family::V4, eth0());
    m.set_parent(Family::V6, eth0());
    m.complete_deferred_work();
    m
}

/// [`node_a`] with node-b's VTEP and its block 10.244.1.0/26 programmed.
fn node_a_with_a_block_of_node_b() -> Manager {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    let block = route(RW, IpPoolType::Vxlan, "10.244.1.0/26", "node-b");
    ok(&mut m, Payload::RouteUpdate(block));
    m.complete_deferred_work();
    m
}

fn route_change<'a>(delta: &'a Delta, dst: &str) -> &'a Change<Route> {
    let dst = dst.parse().unwrap();
    let found: Vec<_> = delta.routes.iter().filter(|c| c.key == dst).collect();
    assert_eq!(found.len(), 1, "one change for {dst} in {delta:#?}");
    found[0]
}

fn desired_target(delta: &Delta, dst: &str) -> Option<RouteTarget> {
    route_change(delta, dst).desired.clone().map(|r| r.target)
}

fn tunnel_via(node: &str, gw: &str) -> Option<RouteTarget> {
    Some(RouteTarget::Tunnel {
        node: ArcStr::from(node),
        gateway: gw.parse().unwrap(),
    })
}

#[test]
fn design_example_two_nodes() {
    let mut m = Manager::new("node-a", Config::default());
    let config = BTreeMap::from([
        ("VXLANVNI".to_string(), "4096".to_string()),
        ("VXLANPort".to_string(), "4789".to_string()),
    ]);
    ok(
        &mut m,
        Payload::ConfigUpdate(felix::ConfigUpdate {
            config: config.into_iter().collect(),
            ..Default::default()
        }),
    );
    ok(&mut m, Payload::VtepUpdate(vtep("node-a", 1)));
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    let mut local = route(LW, IpPoolType::Vxlan, "10.244.0.0/26", "node-a");
    local.dst_node_ip = "192.168.10.1".into();
    ok(&mut m, Payload::RouteUpdate(local));
    let mut remote = route(RW, IpPoolType::Vxlan, "10.244.1.0/26", "node-b");
    remote.dst_node_ip = "192.168.10.2".into();
    ok(&mut m, Payload::RouteUpdate(remote));
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW | RT, IpPoolType::Vxlan, "10.244.1.0/32", "node-b")),
    );
    ok(&mut m, Payload::InSync(felix::InSync {}));
    assert!(m.in_sync());
    m.set_parent(Family::V4, eth0());
    let delta = m.complete_deferred_work();

    let device = delta
        .devices
        .iter()
        .find(|c| c.key == Family::V4)
        .and_then(|c| c.desired.clone())
        .expect("v4 device");
    assert_eq!(
        device.to_string(),
        "device vxlan.calico (vxlan id 4096 dstport 4789 dev eth0 local 192.168.10.1 \
         address 10.244.0.0/32 mac 66:aa:00:00:00:01 mtu 1450)"
    );
    assert_eq!(
        desired_target(&delta, "10.244.0.0/26"),
        Some(RouteTarget::Blackhole)
    );
    assert_eq!(
        desired_target(&delta, "10.244.1.0/26"),
        tunnel_via("node-b", "10.244.1.0")
    );
    assert_eq!(
        desired_target(&delta, "10.244.1.0/32"),
        Some(RouteTarget::Connected {
            node: ArcStr::from("node-b")
        })
    );
    let snap = m.family(Family::V4).snapshot();
    let shown: Vec<String> = snap
        .routes
        .iter()
        .map(described)
        .chain(snap.neighbors.iter().map(described))
        .chain(snap.fdb.iter().map(described))
        .chain(snap.ipset.iter().map(described))
        .collect();
    assert_eq!(
        shown,
        [
            "route blackhole 10.244.0.0/26",
            "route 10.244.1.0/26 via 10.244.1.0 dev vxlan.calico onlink",
            "route 10.244.1.0/32 dev vxlan.calico scope link",
            "neighbor 10.244.1.0 lladdr 66:aa:00:00:00:02 dev vxlan.calico",
            "fdb 66:aa:00:00:00:02 dev vxlan.calico dst 192.168.10.2",
            "ipset cali40all-vxlan-net member 192.168.10.2/32",
        ]
    );
    assert!(snap.routes.iter().all(|r| r.protocol == 80));
    assert_eq!(snap.routes[1].mtu, NonZeroU32::new(1450));
    assert_eq!(snap.routes[0].mtu, None);
}

#[test]
fn route_before_its_vtep_waits_then_programs() {
    let mut m = node_a();
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW, IpPoolType::Vxlan, "10.244.1.0/26", "node-b")),
    );
    let delta = m.complete_deferred_work();
    assert_eq!(desired_target(&delta, "10.244.1.0/26"), None);
    let snap = m.family(Family::V4).snapshot();
    assert_eq!(snap.waiting_routes.len(), 1);
    assert_eq!(&*snap.waiting_routes[0].node, "node-b");

    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    let delta = m.complete_deferred_work();
    assert_eq!(
        desired_target(&delta, "10.244.1.0/26"),
        tunnel_via("node-b", "10.244.1.0")
    );
    assert!(m.family(Family::V4).snapshot().waiting_routes.is_empty());
}

#[test]
fn vtep_change_moves_l2_entries_ipset_nexthop_and_routes() {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW, IpPoolType::Vxlan, "10.244.1.0/26", "node-b")),
    );
    m.complete_deferred_work();

    let mut moved = vtep("node-b", 2);
    moved.mac = "66:aa:00:00:00:22".into();
    moved.ipv4_addr = "10.244.1.128".into();
    moved.parent_device_ip = "192.168.10.22".into();
    ok(&mut m, Payload::VtepUpdate(moved));
    let delta = m.complete_deferred_work();

    let neighbors: BTreeMap<String, bool> = delta
        .neighbors
        .iter()
        .filter(|c| c.key.is_ipv4())
        .map(|c| (c.key.to_string(), c.desired.is_some()))
        .collect();
    assert_eq!(
        neighbors,
        BTreeMap::from([
            ("10.244.1.0".to_string(), false),
            ("10.244.1.128".to_string(), true)
        ])
    );
    let fdb: BTreeMap<String, Option<String>> = delta
        .fdb
        .iter()
        .filter(|c| c.key.0 == Family::V4)
        .map(|c| {
            (
                c.key.1.to_string(),
                c.desired.as_ref().map(|f| f.destination.to_string()),
            )
        })
        .collect();
    assert_eq!(
        fdb,
        BTreeMap::from([
            ("66:aa:00:00:00:02".to_string(), None),
            (
                "66:aa:00:00:00:22".to_string(),
                Some("192.168.10.22".to_string())
            )
        ])
    );
    let ipset: BTreeMap<String, bool> = delta
        .ipset
        .iter()
        .filter(|c| c.key.is_ipv4())
        .map(|c| (c.key.to_string(), c.desired.is_some()))
        .collect();
    assert_eq!(
        ipset,
        BTreeMap::from([
            ("192.168.10.2/32".to_string(), false),
            ("192.168.10.22/32".to_string(), true)
        ])
    );
    let nexthop = delta
        .nexthops
        .iter()
        .find(|c| c.key.family() == Family::V4)
        .and_then(|c| c.desired.clone())
        .unwrap();
    assert_eq!(nexthop.gateway.to_string(), "10.244.1.128");
    assert_eq!(
        desired_target(&delta, "10.244.1.0/26"),
        tunnel_via("node-b", "10.244.1.128")
    );
}

#[test]
fn same_subnet_routes_fall_back_to_the_tunnel_until_the_parent_is_known_and_follow_it() {
    let mut m = Manager::new("node-a", Config::default());
    ok(&mut m, Payload::VtepUpdate(vtep("node-a", 1)));
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    ok(&mut m, same_subnet_block());
    let delta = m.complete_deferred_work();
    assert_eq!(
        desired_target(&delta, "10.244.1.0/26"),
        tunnel_via("node-b", "10.244.1.0")
    );
    assert!(
        delta.devices.iter().all(|c| c.desired.is_none()),
        "no device without a parent interface"
    );

    m.set_parent(Family::V4, eth0());
    let delta = m.complete_deferred_work();
    let direct = |name: &str, index| {
        Some(RouteTarget::Direct {
            gateway: "192.168.10.2".parse().unwrap(),
            interface: Arc::new(ParentInterface {
                name: ArcStr::from(name),
                index,
                mtu: 1500,
            }),
        })
    };
    assert_eq!(desired_target(&delta, "10.244.1.0/26"), direct("eth0", 2));
    assert!(delta.devices.iter().any(|c| c.desired.is_some()));

    m.set_parent(
        Family::V4,
        Some(ParentInterface {
            name: ArcStr::from("eth1"),
            index: 3,
            mtu: 1500,
        }),
    );
    let delta = m.complete_deferred_work();
    assert_eq!(desired_target(&delta, "10.244.1.0/26"), direct("eth1", 3));
    let device = delta.devices[0].desired.clone().unwrap();
    assert_eq!(device.parent.index, 3);
}

#[test]
fn no_encap_pool_routes_go_direct() {
    let mut m = node_a();
    let mut r = route(RW, IpPoolType::NoEncap, "10.244.1.0/26", "node-b");
    r.dst_node_ip = "192.168.10.2".into();
    ok(&mut m, Payload::RouteUpdate(r));
    let delta = m.complete_deferred_work();
    assert!(matches!(
        desired_target(&delta, "10.244.1.0/26"),
        Some(RouteTarget::Direct { .. })
    ));
    assert_eq!(
        route_change(&delta, "10.244.1.0/26")
            .desired
            .as_ref()
            .unwrap()
            .mtu,
        None
    );
}

/// The waiting route for `dst`, if any.
fn waiting(m: &Manager, dst: &str) -> Option<WaitReason> {
    let dst = dst.parse().unwrap();
    let family = Family::of_net(&dst);
    let s = m.family(family).snapshot();
    s.waiting_routes
        .into_iter()
        .find(|w| w.dst == dst)
        .map(|w| w.reason)
}

#[test]
fn no_encap_routes_are_never_tunnelled() {
    let mut m = Manager::new("node-a", Config::default());
    ok(&mut m, Payload::VtepUpdate(vtep("node-a", 1)));
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    let mut with_address = route(RW, IpPoolType::NoEncap, "192.168.0.0/26", "node-b");
    with_address.dst_node_ip = "192.168.10.2".into();
    ok(&mut m, Payload::RouteUpdate(with_address));
    let without_address = route(RW, IpPoolType::NoEncap, "192.168.0.64/26", "node-b");
    ok(&mut m, Payload::RouteUpdate(without_address));
    let delta = m.complete_deferred_work();
    assert_eq!(
        desired_target(&delta, "192.168.0.0/26"),
        None,
        "not through the device while the parent is unknown"
    );
    assert_eq!(waiting(&m, "192.168.0.0/26"), Some(WaitReason::NoParent));
    assert_eq!(desired_target(&delta, "192.168.0.64/26"), None);
    assert_eq!(
        waiting(&m, "192.168.0.64/26"),
        Some(WaitReason::NoNodeAddress)
    );

    m.set_parent(Family::V4, eth0());
    let delta = m.complete_deferred_work();
    assert!(matches!(
        desired_target(&delta, "192.168.0.0/26"),
        Some(RouteTarget::Direct { .. })
    ));
    assert!(
        delta
            .routes
            .iter()
            .all(|c| c.key.to_string() != "192.168.0.64/26" || c.desired.is_none()),
        "without dstNodeIp it stays out: {delta:#?}"
    );
    assert_eq!(
        waiting(&m, "192.168.0.64/26"),
        Some(WaitReason::NoNodeAddress)
    );

    m.set_parent(Family::V4, None);
    let delta = m.complete_deferred_work();
    assert_eq!(
        desired_target(&delta, "192.168.0.0/26"),
        None,
        "a lost parent withdraws it; it does not fall back to the tunnel"
    );
}

#[test]
fn without_a_local_vtep_our_local_host_address_names_the_parent() {
    let mut m = Manager::new("node-a", Config::default());
    let mut r = route(RW, IpPoolType::NoEncap, "10.244.1.0/24", "node-b");
    r.dst_node_ip = "192.168.10.2".into();
    ok(&mut m, Payload::RouteUpdate(r));
    let host = |node: &str, ip: &str| {
        let mut h = route(RouteType::LocalHost as i32, IpPoolType::None, ip, node);
        h.dst_node_ip = ip.into();
        Payload::RouteUpdate(h)
    };
    assert_eq!(
        ok(&mut m, host("node-b", "192.168.10.2")),
        Outcome::Ignored,
        "another node's address"
    );
    assert_eq!(m.family(Family::V4).parent_ip(), None);
    ok(&mut m, host("node-a", "192.168.10.1"));
    assert_eq!(
        m.family(Family::V4).parent_ip(),
        Some("192.168.10.1".parse().unwrap())
    );
    assert_eq!(m.family(Family::V6).parent_ip(), None);
    m.set_parent(Family::V4, eth0());
    let delta = m.complete_deferred_work();
    assert!(
        delta.devices.iter().all(|d| d.desired.is_none()),
        "no device"
    );
    assert!(matches!(
        desired_target(&delta, "10.244.1.0/24"),
        Some(RouteTarget::Direct { .. })
    ));

    // A local VTEP's parent address wins, and is kept once the VTEP goes
    // (as Felix keeps its device and parent).
    ok(&mut m, Payload::VtepUpdate(vtep("node-a", 9)));
    assert_eq!(
        m.family(Family::V4).parent_ip(),
        Some("192.168.10.9".parse().unwrap())
    );
    ok(
        &mut m,
        Payload::VtepRemove(VxlanTunnelEndpointRemove {
            node: "node-a".into(),
        }),
    );
    ok(
        &mut m,
        Payload::RouteRemove(RouteRemove {
            dst: "192.168.10.1/32".into(),
        }),
    );
    assert_eq!(
        m.family(Family::V4).parent_ip(),
        Some("192.168.10.9".parse().unwrap())
    );
}

#[test]
fn local_blocks_are_blackholed_but_not_host_routes_or_local_workloads() {
    let mut m = node_a();
    ok(
        &mut m,
        Payload::RouteUpdate(route(LW, IpPoolType::Vxlan, "10.244.0.0/26", "node-a")),
    );
    ok(
        &mut m,
        Payload::RouteUpdate(route(LW, IpPoolType::NoEncap, "10.244.0.64/26", "node-a")),
    );
    ok(
        &mut m,
        Payload::RouteUpdate(route(LW, IpPoolType::Vxlan, "fd00:244::/122", "node-a")),
    );
    assert_eq!(
        ok(
            &mut m,
            Payload::RouteUpdate(route(LW, IpPoolType::Vxlan, "10.244.0.5/32", "node-a")),
        ),
        Outcome::Ignored
    );
    assert_eq!(
        ok(
            &mut m,
            Payload::RouteUpdate(route(LW, IpPoolType::Vxlan, "fd00:244::5/128", "node-a")),
        ),
        Outcome::Ignored
    );
    let mut workload = route(LW, IpPoolType::Vxlan, "10.244.0.128/26", "node-a");
    workload.local_workload = true;
    assert_eq!(ok(&mut m, Payload::RouteUpdate(workload)), Outcome::Ignored);
    assert_eq!(
        ok(
            &mut m,
            Payload::RouteUpdate(route(LW, IpPoolType::Ipip, "10.245.0.0/26", "node-a")),
        ),
        Outcome::Ignored
    );
    let delta = m.complete_deferred_work();
    let mut blackholes: Vec<String> = delta
        .routes
        .iter()
        .filter(|c| {
            matches!(
                c.desired,
                Some(Route {
                    target: RouteTarget::Blackhole,
                    ..
                })
            )
        })
        .map(|c| c.key.to_string())
        .collect();
    blackholes.sort();
    assert_eq!(
        blackholes,
        ["10.244.0.0/26", "10.244.0.64/26", "fd00:244::/122"]
    );
    assert_eq!(delta.routes.len(), 3);
}

#[test]
fn other_pools_and_types_are_ignored() {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    m.complete_deferred_work();
    for r in [
        route(RW, IpPoolType::Ipip, "10.1.0.0/26", "node-b"),
        route(RW, IpPoolType::None, "10.1.0.64/26", "node-b"),
        route(RT, IpPoolType::Vxlan, "10.244.1.0/32", "node-b"),
        route(
            RouteType::RemoteHost as i32,
            IpPoolType::Vxlan,
            "192.168.10.2/32",
            "node-b",
        ),
        route(
            RouteType::CidrInfo as i32,
            IpPoolType::Vxlan,
            "10.244.0.0/16",
            "",
        ),
    ] {
        let dst = r.dst.clone();
        assert_eq!(
            ok(&mut m, Payload::RouteUpdate(r)),
            Outcome::Ignored,
            "{dst}"
        );
    }
    assert!(m.complete_deferred_work().is_empty());
}

#[test]
fn remote_tunnel_addresses_are_connected_even_before_the_vtep() {
    let mut m = node_a();
    let mut borrowed = route(RT, IpPoolType::Vxlan, "10.244.1.1/32", "node-b");
    borrowed.borrowed = true;
    ok(&mut m, Payload::RouteUpdate(borrowed));
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW | RT, IpPoolType::Vxlan, "10.244.1.0/32", "node-b")),
    );
    let delta = m.complete_deferred_work();
    for dst in ["10.244.1.1/32", "10.244.1.0/32"] {
        let r = route_change(&delta, dst).desired.clone().unwrap();
        let node = ArcStr::from("node-b");
        assert_eq!(
            (r.target, r.mtu),
            (RouteTarget::Connected { node }, NonZeroU32::new(1450))
        );
    }
}

#[test]
fn route_update_forgets_the_previous_meaning_of_dst() {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW, IpPoolType::Vxlan, "10.244.1.0/26", "node-b")),
    );
    m.complete_deferred_work();
    ok(
        &mut m,
        Payload::RouteUpdate(route(LW, IpPoolType::Vxlan, "10.244.1.0/26", "node-a")),
    );
    let delta = m.complete_deferred_work();
    assert_eq!(
        desired_target(&delta, "10.244.1.0/26"),
        Some(RouteTarget::Blackhole)
    );
    assert_eq!(
        ok(
            &mut m,
            Payload::RouteUpdate(route(RW, IpPoolType::Ipip, "10.244.1.0/26", "node-b")),
        ),
        Outcome::Applied,
        "forgetting the block is an effect"
    );
    let delta = m.complete_deferred_work();
    assert_eq!(desired_target(&delta, "10.244.1.0/26"), None);
}

#[test]
fn cidrs_are_masked_and_removes_find_them() {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW, IpPoolType::Vxlan, "172.0.0.1/26", "node-b")),
    );
    let delta = m.complete_deferred_work();
    assert!(desired_target(&delta, "172.0.0.0/26").is_some());
    assert_eq!(
        ok(
            &mut m,
            Payload::RouteRemove(RouteRemove {
                dst: "172.0.0.9/26".into()
            })
        ),
        Outcome::Applied
    );
    let delta = m.complete_deferred_work();
    assert_eq!(desired_target(&delta, "172.0.0.0/26"), None);
}

#[test]
fn unknown_removes_are_ignored() {
    let mut m = node_a();
    assert_eq!(
        ok(
            &mut m,
            Payload::RouteRemove(RouteRemove {
                dst: "10.9.0.0/26".into()
            })
        ),
        Outcome::Ignored
    );
    assert_eq!(
        ok(
            &mut m,
            Payload::VtepRemove(VxlanTunnelEndpointRemove {
                node: "nobody".into()
            })
        ),
        Outcome::Ignored
    );
    assert!(m.complete_deferred_work().is_empty());
}

#[test]
fn families_are_independent() {
    let mut m = node_a();
    let mut v4_only = vtep("node-b", 2);
    v4_only.ipv6_addr.clear();
    ok(&mut m, Payload::VtepUpdate(v4_only));
    let delta = m.complete_deferred_work();
    assert!(delta.neighbors.iter().all(|c| c.key.is_ipv4()));
    assert!(delta.fdb.iter().all(|c| c.key.0 == Family::V4));

    let mut v6_only = vtep("node-c", 3);
    v6_only.ipv4_addr.clear();
    ok(&mut m, Payload::VtepUpdate(v6_only));
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW, IpPoolType::Vxlan, "fd00:244:0:2::/122", "node-c")),
    );
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW, IpPoolType::Vxlan, "10.244.2.0/26", "node-c")),
    );
    let delta = m.complete_deferred_work();
    assert_eq!(
        desired_target(&delta, "fd00:244:0:2::/122"),
        tunnel_via("node-c", "fd00:244:0:2::")
    );
    assert_eq!(
        desired_target(&delta, "10.244.2.0/26"),
        None,
        "node-c has no IPv4 VTEP"
    );
    let v6 = m.family(Family::V6).snapshot();
    assert_eq!(v6.device.unwrap().mtu, 1430, "IPv6 overhead is 70");
    assert_eq!(
        described(&v6.ipset[0]),
        "ipset cali60all-vxlan-net member fd00:10::3/128"
    );
}

#[test]
fn vtep_remove_withdraws_everything_derived_from_it() {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW, IpPoolType::Vxlan, "10.244.1.0/26", "node-b")),
    );
    m.complete_deferred_work();
    ok(
        &mut m,
        Payload::VtepRemove(VxlanTunnelEndpointRemove {
            node: "node-b".into(),
        }),
    );
    let delta = m.complete_deferred_work();
    assert_eq!(desired_target(&delta, "10.244.1.0/26"), None);
    for changes in [
        delta
            .neighbors
            .iter()
            .map(|c| c.desired.is_some())
            .collect::<Vec<_>>(),
        delta.fdb.iter().map(|c| c.desired.is_some()).collect(),
        delta.ipset.iter().map(|c| c.desired.is_some()).collect(),
        delta.nexthops.iter().map(|c| c.desired.is_some()).collect(),
    ] {
        assert_eq!(changes, [false, false]);
    }
    let snap = m.family(Family::V4).snapshot();
    assert_eq!(snap.waiting_routes.len(), 1);
}

#[test]
fn removing_the_local_vtep_leaves_the_device_the_parent_and_direct_routes_as_they_are() {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    ok(&mut m, same_subnet_block());
    let before = m.complete_deferred_work();
    let direct = desired_target(&before, "10.244.1.0/26");
    assert!(matches!(direct, Some(RouteTarget::Direct { .. })));

    let removed = ok(
        &mut m,
        Payload::VtepRemove(VxlanTunnelEndpointRemove {
            node: "node-a".into(),
        }),
    );
    assert_eq!(removed, Outcome::Applied);
    let delta = m.complete_deferred_work();
    // The device is no longer programmed, which leaves the kernel's as it is.
    assert!(delta.devices.iter().all(|c| c.desired.is_none()));
    assert!(delta.routes.is_empty(), "routes stay: {delta:#?}");
    let v4 = m.family(Family::V4);
    assert_eq!(v4.parent_ip(), Some("192.168.10.1".parse().unwrap()));
    assert_eq!(v4.parent(), eth0().as_ref());
    let snap = v4.snapshot();
    assert!(snap.local_vtep.is_none());
    assert_eq!(snap.routes[0].target, direct.unwrap());

    // A new stream that has not declared our VTEP keeps the underlay too.
    let mut next = m.fresh();
    assert_eq!(next.family(Family::V4).parent_ip(), v4.parent_ip());
    assert_eq!(next.family(Family::V4).parent(), eth0().as_ref());
    next.complete_deferred_work();
    ok(&mut next, Payload::VtepUpdate(vtep("node-b", 2)));
    ok(&mut next, same_subnet_block());
    let delta = next.complete_deferred_work();
    assert!(
        matches!(
            desired_target(&delta, "10.244.1.0/26"),
            Some(RouteTarget::Direct { .. })
        ),
        "direct from the start, not through the tunnel"
    );
    assert!(delta.devices.iter().all(|c| c.desired.is_none()));

    // Declared again, it gives the device again.
    ok(&mut next, Payload::VtepUpdate(vtep("node-a", 1)));
    let delta = next.complete_deferred_work();
    assert!(delta.devices.iter().any(|c| c.desired.is_some()));
}

#[test]
fn ipset_holds_external_cidrs_and_shared_parents_once() {
    let mut m = Manager::new(
        "node-a",
        Config::new(SettingsLayer {
            external_nodes: Some(vec!["10.99.0.0/16".parse().unwrap()]),
            ..Default::default()
        }),
    );
    ok(&mut m, Payload::VtepUpdate(vtep("node-a", 1)));
    let mut b = vtep("node-b", 2);
    b.parent_device_ip = "192.168.10.9".into();
    let mut c = vtep("node-c", 3);
    c.parent_device_ip = "192.168.10.9".into();
    ok(&mut m, Payload::VtepUpdate(b));
    ok(&mut m, Payload::VtepUpdate(c));
    m.complete_deferred_work();
    let members = |m: &Manager| -> Vec<String> {
        m.family(Family::V4)
            .snapshot()
            .ipset
            .iter()
            .map(|i| i.0.to_string())
            .collect()
    };
    assert_eq!(members(&m), ["10.99.0.0/16", "192.168.10.9/32"]);
    ok(
        &mut m,
        Payload::VtepRemove(VxlanTunnelEndpointRemove {
            node: "node-b".into(),
        }),
    );
    let delta = m.complete_deferred_work();
    assert!(
        delta.ipset.iter().all(|c| !c.key.is_ipv4()),
        "node-c still needs 192.168.10.9"
    );
    assert_eq!(members(&m), ["10.99.0.0/16", "192.168.10.9/32"]);
}

#[test]
fn config_changes_reach_the_device_and_routes() {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW, IpPoolType::Vxlan, "10.244.1.0/26", "node-b")),
    );
    m.complete_deferred_work();
    let update = |pairs: &[(&str, &str)]| {
        Payload::ConfigUpdate(felix::ConfigUpdate {
            config: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
    };
    ok(&mut m, update(&[("VXLANVNI", "7"), ("VXLANMTU", "1400")]));
    let delta = m.complete_deferred_work();
    let device = delta
        .devices
        .iter()
        .find(|c| c.key == Family::V4)
        .and_then(|c| c.desired.clone())
        .unwrap();
    assert_eq!((device.vni, device.mtu), (7, 1400));
    assert_eq!(
        route_change(&delta, "10.244.1.0/26")
            .desired
            .as_ref()
            .unwrap()
            .mtu,
        NonZeroU32::new(1400)
    );

    let err = send(
        &mut m,
        update(&[("VXLANVNI", "16777216"), ("VXLANMTU", "1400")]),
    )
    .unwrap_err();
    assert!(err.0.contains("VXLANVNI \"16777216\""), "{err}");
    assert_eq!(m.settings().vni, 7, "a bad value keeps the previous one");
    assert!(m.complete_deferred_work().is_empty());
}

/// An object as errors and logs show it, with Felix's device names.
fn described<T: Desired>(object: &T) -> String {
    object.describe(&DeviceNames::default())
}

/// Neighbours, FDB entries and ipset members of one family, printed.
fn l2_and_ipset(m: &Manager, family: Family) -> Vec<String> {
    let s = m.family(family).snapshot();
    s.neighbors
        .iter()
        .map(described)
        .chain(s.fdb.iter().map(described))
        .chain(s.ipset.iter().map(described))
        .collect()
}

fn remote_vtep(m: &Manager, family: Family, node: &str) -> Option<RemoteVtep> {
    let s = m.family(family).snapshot();
    s.remote_vteps
        .into_iter()
        .find(|(n, _)| &**n == node)
        .map(|(_, v)| v)
}

fn tunnel_only(ip: &str) -> Option<RemoteVtep> {
    Some(RemoteVtep::TunnelOnly(ip.parse().unwrap()))
}

#[test]
fn a_mac_claimed_by_another_node_leaves_the_claimant_its_tunnel_address_only() {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    m.complete_deferred_work();
    let holder = l2_and_ipset(&m, Family::V4);
    let mut thief = vtep("node-c", 3);
    thief.mac = "66:aa:00:00:00:02".into();
    let err = send(&mut m, Payload::VtepUpdate(thief)).unwrap_err();
    assert!(
        err.0.contains("already the VTEP MAC of node \"node-b\""),
        "{err}"
    );
    m.complete_deferred_work();
    assert_eq!(
        l2_and_ipset(&m, Family::V4),
        holder,
        "node-b's entries stay"
    );
    assert_eq!(
        remote_vtep(&m, Family::V4, "node-c"),
        tunnel_only("10.244.2.0")
    );
    assert!(
        matches!(
            remote_vtep(&m, Family::V6, "node-c"),
            Some(RemoteVtep::Complete(_))
        ),
        "its good IPv6 part applies"
    );
}

/// Sends VTEP updates that must each be rejected naming `what` and the
/// node holding the address.
fn assert_claims_rejected(
    m: &mut Manager,
    holder: &str,
    claims: Vec<(VxlanTunnelEndpointUpdate, &str)>,
) {
    for (claim, what) in claims {
        let err = send(m, Payload::VtepUpdate(claim)).unwrap_err();
        assert!(err.0.contains(what), "{err}");
        assert!(err.0.contains(&format!("of node \"{holder}\"")), "{err}");
    }
}

#[test]
fn a_remote_vtep_claiming_the_local_vteps_addresses_gets_nothing_of_them() {
    let mut m = node_a();
    let mut mac_thief = vtep("node-b", 2);
    mac_thief.mac = "66:aa:00:00:00:01".into();
    assert_claims_rejected(&mut m, "node-a", vec![(mac_thief, "IPv4 mac")]);
    assert_eq!(
        remote_vtep(&m, Family::V4, "node-b"),
        tunnel_only("10.244.1.0")
    );
    assert!(
        l2_and_ipset(&m, Family::V4).is_empty(),
        "no L2 entry for it"
    );

    let mut ip_thief = vtep("node-b", 2);
    ip_thief.ipv6_addr = "fd00:244:0:0::".into();
    assert_claims_rejected(
        &mut m,
        "node-a",
        vec![(ip_thief, "tunnel address fd00:244::")],
    );
    assert_eq!(remote_vtep(&m, Family::V6, "node-b"), None);
    let delta = m.complete_deferred_work();
    assert!(delta.devices.is_empty(), "our device is untouched");
    assert_eq!(
        m.family(Family::V6)
            .snapshot()
            .device
            .unwrap()
            .address
            .to_string(),
        "fd00:244::/128"
    );
}

#[test]
fn the_local_vtep_claiming_a_remotes_addresses_is_rejected_and_the_device_kept() {
    let mut m = node_a();
    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    m.complete_deferred_work();
    let mut mac_clash = vtep("node-a", 1);
    mac_clash.mac_v6 = "66:bb:00:00:00:02".into();
    let mut ip_clash = vtep("node-a", 1);
    ip_clash.ipv4_addr = "10.244.1.0".into();
    let claims = vec![
        (mac_clash, "IPv6 mac 66:bb:00:00:00:02"),
        (ip_clash, "tunnel address 10.244.1.0"),
    ];
    assert_claims_rejected(&mut m, "node-b", claims);
    assert!(
        m.complete_deferred_work().is_empty(),
        "nothing of them applied"
    );
    let v4 = m.family(Family::V4).snapshot();
    assert_eq!(v4.device.unwrap().address.to_string(), "10.244.0.0/32");
    assert_eq!(v4.remote_vteps.len(), 1, "node-b keeps its VTEP");
}

#[test]
fn local_vtep_gives_the_device_once_the_parent_is_known() {
    let mut m = Manager::new("node-a", Config::default());
    ok(&mut m, Payload::VtepUpdate(vtep("node-a", 1)));
    let delta = m.complete_deferred_work();
    assert_eq!(delta.devices.len(), 2);
    assert!(delta.devices.iter().all(|c| c.desired.is_none()));
    assert_eq!(
        m.family(Family::V4).parent_ip(),
        Some("192.168.10.1".parse().unwrap())
    );
    m.set_parent(Family::V4, eth0());
    let delta = m.complete_deferred_work();
    let device = delta.devices[0].desired.clone().unwrap();
    assert_eq!(device.mac.to_string(), "66:aa:00:00:00:01");
    assert_eq!(device.address.to_string(), "10.244.0.0/32");
    assert!(
        delta.fdb.is_empty() && delta.neighbors.is_empty(),
        "no L2 entries for ourselves"
    );
}

#[test]
fn batches_cost_follows_the_change() {
    let mut m = node_a();
    for n in 2..200u8 {
        ok(&mut m, Payload::VtepUpdate(vtep(&format!("node-{n}"), n)));
        ok(
            &mut m,
            Payload::RouteUpdate(route(
                RW,
                IpPoolType::Vxlan,
                &format!("10.244.{}.0/26", n - 1),
                &format!("node-{n}"),
            )),
        );
    }
    m.complete_deferred_work();
    assert!(m.complete_deferred_work().is_empty());
    ok(
        &mut m,
        Payload::RouteUpdate(route(RW, IpPoolType::Vxlan, "10.250.0.0/26", "node-7")),
    );
    let delta = m.complete_deferred_work();
    assert_eq!(delta.len(), 1, "{delta:#?}");
}

#[test]
fn a_bad_mac_drops_a_nodes_l2_entries_and_ipset_member_but_keeps_its_routes() {
    let mut m = node_a_with_a_block_of_node_b();
    let v6_before = l2_and_ipset(&m, Family::V6);
    let mut bad = vtep("node-b", 2);
    bad.mac = "66:aa:00:00:00".into();
    let err = send(&mut m, Payload::VtepUpdate(bad)).unwrap_err();
    assert!(err.0.contains("\"66:aa:00:00:00\""), "{err}");
    let delta = m.complete_deferred_work();
    assert_eq!(
        desired_target(&delta, "10.244.1.0/26"),
        tunnel_via("node-b", "10.244.1.0"),
        "still routed via its tunnel address"
    );
    let nexthop = delta.nexthops.iter().find(|c| c.key.family() == Family::V4);
    assert!(nexthop.is_some_and(|c| c.desired.is_some()), "{delta:#?}");
    for kind in [
        delta
            .neighbors
            .iter()
            .map(|c| c.desired.is_some())
            .collect(),
        delta.fdb.iter().map(|c| c.desired.is_some()).collect(),
        delta
            .ipset
            .iter()
            .map(|c| c.desired.is_some())
            .collect::<Vec<_>>(),
    ] {
        assert_eq!(kind, [false], "{delta:#?}");
    }
    assert!(l2_and_ipset(&m, Family::V4).is_empty());
    assert_eq!(
        remote_vtep(&m, Family::V4, "node-b"),
        tunnel_only("10.244.1.0")
    );
    assert_eq!(l2_and_ipset(&m, Family::V6), v6_before, "IPv6 is untouched");
    assert!(m.family(Family::V4).snapshot().waiting_routes.is_empty());

    ok(&mut m, Payload::VtepUpdate(vtep("node-b", 2)));
    let delta = m.complete_deferred_work();
    assert_eq!(
        delta.neighbors.len() + delta.fdb.len() + delta.ipset.len(),
        3
    );
    assert_eq!(l2_and_ipset(&m, Family::V4).len(), 3, "L2 entries are back");
}

#[test]
fn a_bad_parent_address_is_a_bad_mac_and_a_bad_tunnel_address_makes_routes_wait() {
    let mut m = node_a_with_a_block_of_node_b();
    let mut bad_parent = vtep("node-b", 2);
    bad_parent.parent_device_ip = "192.168.10.300".into();
    send(&mut m, Payload::VtepUpdate(bad_parent)).unwrap_err();
    assert_eq!(
        remote_vtep(&m, Family::V4, "node-b"),
        tunnel_only("10.244.1.0")
    );
    m.complete_deferred_work();

    let mut bad_tunnel = vtep("node-b", 2);
    bad_tunnel.ipv4_addr = "10.244.1.300".into();
    let err = send(&mut m, Payload::VtepUpdate(bad_tunnel)).unwrap_err();
    assert!(err.0.contains("\"10.244.1.300\""), "{err}");
    let delta = m.complete_deferred_work();
    assert_eq!(desired_target(&delta, "10.244.1.0/26"), None, "it waits");
    let waiting = m.family(Family::V4).snapshot().waiting_routes;
    assert_eq!(
        waiting,
        [WaitingRoute {
            dst: "10.244.1.0/26".parse().unwrap(),
            node: ArcStr::from("node-b"),
            reason: WaitReason::NoVtep,
        }]
    );
}

#[test]
fn our_own_invalid_vtep_update_keeps_the_device() {
    let mut m = node_a();
    let mut bad = vtep("node-a", 1);
    bad.parent_device_ip = "192.168.10.300".into();
    let err = send(&mut m, Payload::VtepUpdate(bad)).unwrap_err();
    assert!(err.0.contains("\"192.168.10.300\""), "{err}");
    assert!(m.complete_deferred_work().is_empty(), "nothing changes");
    assert!(m.family(Family::V4).snapshot().device.is_some());
}

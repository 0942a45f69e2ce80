//! vxmgr and the host's own objects: nothing that is not vxmgr's is
//! changed, and vxmgr's routes keep out of the way of the host's.

use std::time::Instant;

use super::*;
use crate::kernel::objects::KernelNexthop;

fn eth0(rig: &Rig) -> u32 {
    rig.kernel.lock().link_by_name("eth0").unwrap().index
}

/// A route of the host's: `dst via gateway dev eth0 proto 3`.
fn static_route(rig: &Rig, dst: &str, gateway: &str) -> KernelRoute {
    KernelRoute {
        dst: dst.parse().unwrap(),
        protocol: 3,
        via: KernelRouteVia::Gateway {
            gateway: gateway.parse().unwrap(),
            ifindex: eth0(rig),
        },
        mtu: None,
    }
}

fn failing_objects(rig: &Rig) -> Vec<String> {
    let failing = rig.reconciler.failing();
    failing
        .iter()
        .map(|f| format!("{}: {}", f.object, f.error))
        .collect()
}

#[tokio::test]
async fn a_host_route_in_the_way_is_reported_left_alone_and_ours_goes_in_once_it_is_gone() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    let host = static_route(&rig, "10.244.2.0/26", "192.168.10.254");
    rig.kernel.interfere(KernelOp::ReplaceRoute(host)).unwrap();
    let mut rx = rig.reconciler.watch().unwrap();
    rig.reconciler.resync().await.unwrap();
    rig.send(CLUSTER);
    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    assert_eq!(report.errors.len(), 1, "{report:?}");
    let error = &report.errors[0];
    assert!(
        error.object.starts_with("adding route 10.244.2.0/26"),
        "{error:?}"
    );
    assert!(
        error
            .error
            .contains("route 10.244.2.0/26 via 192.168.10.254")
            && error.error.contains("proto 3"),
        "names the host's route: {error:?}"
    );
    assert_eq!(rig.kernel.lock().routes[&host.dst], host, "left as it was");
    let failing = failing_objects(&rig);
    assert_eq!(failing.len(), 1, "{failing:?}");

    // Its retry changes nothing while the host's route is there.
    let report = rig
        .reconciler
        .retry(Instant::now() + Duration::from_secs(60))
        .await;
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert_eq!(rig.kernel.lock().routes[&host.dst], host);

    rig.kernel.interfere(KernelOp::DeleteRoute(host)).unwrap();
    assert!(notice_all(&mut rig, &mut rx), "a repair is due");
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert_eq!((report.added, report.errors.len()), (1, 0), "{report:?}");
    let ours = rig.kernel.lock().routes[&host.dst];
    assert_eq!(ours.protocol, 80);
    assert!(rig.reconciler.failing().is_empty());
}

#[tokio::test]
async fn routes_that_would_capture_the_hosts_addresses_or_gateways_are_refused() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    let eth0 = eth0(&rig);
    rig.kernel
        .interfere(KernelOp::AddAddress {
            index: eth0,
            address: "10.244.1.7/24".parse().unwrap(),
        })
        .unwrap();
    let default = static_route(&rig, "0.0.0.0/0", "10.244.2.9");
    rig.kernel
        .interfere(KernelOp::ReplaceRoute(default))
        .unwrap();
    rig.reconciler.resync().await.unwrap();
    rig.send(CLUSTER);
    rig.send(&[
        // The gateway's own /32, as a remote tunnel address.
        r#"{"routeUpdate": {"types": 17, "ipPoolType": "VXLAN", "dst": "10.244.2.9/32", "dstNodeName": "node-c"}}"#,
        IN_SYNC,
    ]);
    let report = rig.apply().await;
    let mut errors: Vec<String> = report
        .errors
        .iter()
        .map(|e| format!("{}: {}", e.object, e.error))
        .collect();
    errors.sort();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[0].starts_with("adding route 10.244.1.0/26"),
        "{errors:?}"
    );
    assert!(
        errors[0].contains("10.244.1.7, an address of interface"),
        "{errors:?}"
    );
    for (error, dst) in errors[1..].iter().zip(["10.244.2.0/26", "10.244.2.9/32"]) {
        assert!(
            error.starts_with(&format!("adding route {dst}")),
            "{errors:?}"
        );
        assert!(
            error.contains("10.244.2.9, the gateway of the host's route to 0.0.0.0/0"),
            "{errors:?}"
        );
    }
    let k = rig.kernel.lock();
    assert_eq!(k.routes[&default.dst], default);
    assert!(!k.routes.contains_key(&"10.244.2.9/32".parse().unwrap()));
    assert!(!k.routes.contains_key(&"10.244.1.0/26".parse().unwrap()));
}

#[tokio::test]
async fn a_host_route_that_takes_the_place_of_ours_is_not_overwritten() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    let mut rx = rig.reconciler.watch().unwrap();
    let host = static_route(&rig, "10.244.2.0/26", "192.168.10.254");
    rig.kernel.interfere(KernelOp::ReplaceRoute(host)).unwrap();
    notice_all(&mut rig, &mut rx);
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert_eq!(report.errors.len(), 1, "reported: {report:?}");
    assert_eq!(rig.kernel.lock().routes[&host.dst], host, "not overwritten");
    // Nor swept by a resync after InSync.
    rig.reconciler.resync().await.unwrap();
    assert_eq!(rig.kernel.lock().routes[&host.dst], host);
}

#[tokio::test]
async fn only_our_protocol_and_shapes_are_swept() {
    let mut rig = Rig::new(MemoryBackend::with_underlay("eth0", 1500), NexthopMode::On).await;
    let eth0 = eth0(&rig);
    let foreign = [
        // Our protocol, a shape vxmgr never programs: a link route on eth0.
        KernelRoute {
            dst: "198.51.100.0/24".parse().unwrap(),
            protocol: 80,
            via: KernelRouteVia::Link(eth0),
            mtu: None,
        },
        // A shape of ours, another protocol.
        KernelRoute {
            dst: "203.0.113.0/24".parse().unwrap(),
            protocol: 186,
            via: KernelRouteVia::Blackhole,
            mtu: None,
        },
        static_route(&rig, "192.0.2.0/24", "192.168.10.254"),
    ];
    // Our protocol on a nexthop of eth0's (without onlink, as hosts add
    // them), with the id vxmgr would take first.
    let nexthop = KernelNexthop {
        id: 0x7678_0000,
        gateway: "192.168.10.254".parse().unwrap(),
        ifindex: eth0,
        protocol: 80,
    };
    for route in foreign {
        rig.kernel.interfere(KernelOp::ReplaceRoute(route)).unwrap();
    }
    rig.kernel.interfere(KernelOp::AddNexthop(nexthop)).unwrap();
    rig.kernel.lock().plain_nexthops.insert(nexthop.id);
    rig.reconciler.resync().await.unwrap();
    rig.send(CLUSTER);
    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    rig.new_stream();
    rig.send(&[IN_SYNC]);
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    rig.reconciler.resync().await.unwrap();
    let k = rig.kernel.lock();
    for route in foreign {
        assert_eq!(k.routes.get(&route.dst), Some(&route), "{route} survives");
    }
    assert_eq!(k.routes.len(), foreign.len(), "ours are gone");
    assert_eq!(k.nexthops.values().collect::<Vec<_>>(), [&nexthop]);
}

//! The netlink backend against the real kernel, each test in a throwaway
//! network namespace with a veth pair as underlay. Needs root: without it
//! the tests are skipped, or fail when VXMGR_REQUIRE_NETNS=1.

mod support;

use std::collections::HashSet;
use std::fs::File;
use std::future::Future;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use arcstr::ArcStr;
use ipnetwork::IpNetwork;
use serde_json::Value;

use vxmgr::desired::{
    Change, Delta, FdbEntry, IpsetMember, Neighbor, Nexthop, NexthopVia, ParentInterface, Route,
    RouteTarget, VxlanDevice,
};
use vxmgr::kernel::netlink::NetlinkBackend;
use vxmgr::kernel::objects::{
    ForeignRoute, IpsetChange, KernelFdb, KernelNeighbor, KernelNexthop, KernelOp, KernelRoute,
    KernelRouteVia, Notification, Ownership, TableRoute, VxlanAttrs, VxlanSpec,
};
use vxmgr::kernel::{KernelBackend, KernelError};
use vxmgr::model::{Family, MacAddr};
use vxmgr::reconciler::{ApplyRequest, CONTEST_WINDOW, NexthopMode, Reconciler, ReconcilerOptions};

use support::netns::{can_run, required};
use support::say;

const PROTOCOL: u8 = 80;
const UNDERLAY_V4: &str = "192.0.2.1";
const UNDERLAY_V6: &str = "2001:db8::1";
const LOCAL_MAC: &str = "66:aa:00:00:00:01";
const REMOTE_MAC: &str = "66:aa:00:00:00:02";

// ---------------------------------------------------------------- harness

/// A network namespace that is deleted when dropped, even when the test
/// panics.
struct Netns {
    probe: Probe,
}

/// Looks at (and sets up) a namespace with iproute2 and ipset.
#[derive(Clone)]
struct Probe {
    name: String,
}

static NEXT_NETNS: AtomicU32 = AtomicU32::new(0);

/// Whether the `ipset` command is there (`apt-get install ipset`); a test
/// that needs it is skipped without it, or fails when VXMGR_REQUIRE_NETNS=1.
fn has_ipset(test: &str) -> bool {
    if Command::new("ipset").arg("version").output().is_ok() {
        return true;
    }
    if required() {
        panic!("{test}: the ipset command is not installed");
    }
    say(&format!(
        "SKIPPED {test}: the ipset command is not installed"
    ));
    false
}

impl Netns {
    /// A fresh namespace with `lo` up and an underlay veth pair (`veth0`
    /// holding 192.0.2.1/24 and 2001:db8::1/64), or `None` when the test
    /// must be skipped.
    fn for_test(test: &str) -> Option<Netns> {
        if !can_run(test) {
            return None;
        }
        let name = format!(
            "vxmgr-test-{}-{}",
            std::process::id(),
            NEXT_NETNS.fetch_add(1, Ordering::Relaxed)
        );
        run("ip", &["netns", "add", &name]);
        let netns = Netns {
            probe: Probe { name },
        };
        let probe = &netns.probe;
        probe.ip(&["link", "set", "lo", "up"]);
        probe.ip(&[
            "link", "add", "veth0", "type", "veth", "peer", "name", "veth1",
        ]);
        probe.ip(&["link", "set", "veth0", "up"]);
        probe.ip(&["link", "set", "veth1", "up"]);
        probe.ip(&["addr", "add", &format!("{UNDERLAY_V4}/24"), "dev", "veth0"]);
        probe.ip(&[
            "addr",
            "add",
            &format!("{UNDERLAY_V6}/64"),
            "dev",
            "veth0",
            "nodad",
        ]);
        Some(netns)
    }

    fn probe(&self) -> Probe {
        self.probe.clone()
    }

    /// Runs `test` on a thread of its own that has entered the namespace,
    /// with a current-thread runtime and a backend both created after it
    /// did (a tokio worker must never change namespace).
    fn run<F, Fut, R>(&self, test: F) -> R
    where
        F: FnOnce(NetlinkBackend) -> Fut + Send + 'static,
        Fut: Future<Output = R>,
        R: Send + 'static,
    {
        let path = format!("/run/netns/{}", self.probe.name);
        let thread = std::thread::spawn(move || {
            let netns = File::open(&path).expect("opening the namespace");
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("entering the namespace");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("building a runtime");
            runtime.block_on(async {
                let backend = NetlinkBackend::new().expect("opening the netlink backend");
                test(backend).await
            })
        });
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let deleted = Command::new("ip")
            .args(["netns", "del", &self.probe.name])
            .status();
        if !matches!(deleted, Ok(s) if s.success()) {
            say(&format!(
                "could not delete network namespace {}",
                self.probe.name
            ));
        }
    }
}

impl Probe {
    /// `ip -n NETNS ARGS`; panics unless it succeeds.
    fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `ip -n NETNS -j ARGS` as JSON.
    fn ip_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-j"];
        all.extend_from_slice(args);
        json(&self.ip(&all))
    }

    /// `bridge -n NETNS -j ARGS` as JSON.
    fn bridge_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-n", &self.name, "-j"];
        all.extend_from_slice(args);
        json(&run("bridge", &all))
    }

    /// `ipset ARGS` inside the namespace, however it ends.
    fn ipset(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec!["netns", "exec", &self.name, "ipset"];
        all.extend_from_slice(args);
        Command::new("ip")
            .args(&all)
            .output()
            .expect("running ip netns exec")
    }

    /// The members `ipset list NAME` shows, sorted, or `None` when the set
    /// does not exist.
    fn ipset_members(&self, name: &str) -> Option<Vec<IpNetwork>> {
        let listed = self.ipset(&["list", name]);
        if !listed.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&listed.stdout).to_string();
        let mut members: Vec<IpNetwork> = text
            .lines()
            .skip_while(|l| !l.starts_with("Members:"))
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.trim().parse().unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        members.sort();
        Some(members)
    }

    /// A line of `ipset list -t NAME`, without its label (`Header`, ...).
    fn ipset_header(&self, name: &str, label: &str) -> String {
        let listed = self.ipset(&["list", "-t", name]);
        assert!(listed.status.success(), "{name} missing");
        let prefix = format!("{label}: ");
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
            .unwrap_or_else(|| panic!("no {label} for {name}"))
    }

    fn index(&self, device: &str) -> u32 {
        let link = self.ip_json(&["link", "show", "dev", device]);
        link[0]["ifindex"].as_u64().expect("ifindex") as u32
    }

    fn underlay(&self) -> ParentInterface {
        ParentInterface {
            name: ArcStr::from("veth0"),
            index: self.index("veth0"),
            mtu: 1500,
        }
    }
}

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

fn json(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Array(Vec::new());
    }
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn net(text: &str) -> IpNetwork {
    text.parse().unwrap()
}

fn mac(text: &str) -> MacAddr {
    text.parse().unwrap()
}

/// vxmgr's objects, with `parent` the interface of its same-subnet routes.
fn ownership(parent: u32) -> Ownership {
    Ownership {
        parents: vec![parent],
        ..Ownership::of_vxmgr(PROTOCOL)
    }
}

fn spec(family: Family, parent_index: u32) -> VxlanSpec {
    let (local, mac_text, mtu) = match family {
        Family::V4 => (UNDERLAY_V4, LOCAL_MAC, 1450),
        Family::V6 => (UNDERLAY_V6, "66:aa:00:00:01:01", 1430),
    };
    VxlanSpec {
        name: family.device_name().to_string(),
        vni: 4096,
        port: 4789,
        parent_index,
        local: ip(local),
        mac: mac(mac_text),
        mtu,
    }
}

/// Every operation succeeded.
async fn apply_ok(backend: &mut NetlinkBackend, ops: &[KernelOp]) {
    let results = backend.apply(ops).await;
    assert_eq!(results.len(), ops.len());
    for (op, result) in ops.iter().zip(results) {
        if let Err(e) = result {
            panic!("{op}: {e}");
        }
    }
}

/// The one operation's error.
async fn apply_err(backend: &mut NetlinkBackend, op: KernelOp) -> KernelError {
    match backend.apply(std::slice::from_ref(&op)).await.remove(0) {
        Ok(()) => panic!("{op}: succeeded"),
        Err(e) => e,
    }
}

/// Creates both VXLAN devices, up; returns their indexes (v4, v6).
async fn vxlan_devices(backend: &mut NetlinkBackend, parent_index: u32) -> (u32, u32) {
    let specs = [
        spec(Family::V4, parent_index),
        spec(Family::V6, parent_index),
    ];
    apply_ok(
        backend,
        &specs
            .iter()
            .map(|s| KernelOp::CreateVxlan(s.clone()))
            .collect::<Vec<_>>(),
    )
    .await;
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let links = backend.links(&names).await.unwrap();
    let indexes = (links[0].index, links[1].index);
    apply_ok(
        backend,
        &[
            KernelOp::SetUp { index: indexes.0 },
            KernelOp::SetUp { index: indexes.1 },
        ],
    )
    .await;
    indexes
}

fn set<T: std::hash::Hash + Eq + Clone>(items: &[T]) -> HashSet<T> {
    items.iter().cloned().collect()
}

// ------------------------------------------------------------------ tests

#[test]
fn vxlan_devices_are_created_fixed_up_and_read_back() {
    let Some(netns) = Netns::for_test("vxlan_devices_are_created_fixed_up_and_read_back") else {
        return;
    };
    let underlay = netns.probe.underlay();
    let probe = netns.probe();
    netns.run(move |mut backend| async move {
        let found = backend.find_interface(ip(UNDERLAY_V4)).await.unwrap();
        assert_eq!(found, Some(underlay.clone()));
        let found = backend.find_interface(ip(UNDERLAY_V6)).await.unwrap();
        assert_eq!(found, Some(underlay.clone()));
        assert_eq!(
            backend.find_interface(ip("203.0.113.9")).await.unwrap(),
            None
        );

        for family in Family::ALL {
            let spec = spec(family, underlay.index);
            apply_ok(&mut backend, &[KernelOp::CreateVxlan(spec.clone())]).await;
            let again = apply_err(&mut backend, KernelOp::CreateVxlan(spec.clone())).await;
            assert_eq!(again.errno, Some(libc::EEXIST), "{again}");

            let links = backend
                .links(&[spec.name.clone(), "missing0".to_string()])
                .await
                .unwrap();
            assert_eq!(links.len(), 1, "only existing links are returned");
            let link = links[0].clone();
            assert_eq!(link.name, spec.name);
            assert_eq!(link.mtu, spec.mtu);
            assert_eq!(link.mac, Some(spec.mac));
            assert!(!link.up, "created down");
            assert_eq!(
                link.vxlan,
                Some(VxlanAttrs {
                    vni: spec.vni,
                    port: spec.port,
                    parent_index: Some(underlay.index),
                    local: Some(spec.local),
                    learning: false,
                })
            );
            assert_eq!(link.addresses, Vec::<IpNetwork>::new());
            assert_eq!(link.tx_checksum, Some(true));

            let shown = &probe.ip_json(&["-d", "link", "show", "dev", &spec.name])[0];
            assert_eq!(shown["ifindex"], link.index);
            assert_eq!(shown["mtu"], spec.mtu);
            assert_eq!(shown["address"], spec.mac.to_string());
            let info = &shown["linkinfo"]["info_data"];
            assert_eq!(shown["linkinfo"]["info_kind"], "vxlan");
            assert_eq!(info["id"], spec.vni);
            assert_eq!(info["port"], spec.port);
            assert_eq!(info["link"], "veth0");
            let local = match family {
                Family::V4 => &info["local"],
                Family::V6 => &info["local6"],
            };
            assert_eq!(*local, spec.local.to_string());
            assert_eq!(info["learning"], false);

            let address = Family::host_net(match family {
                Family::V4 => ip("10.244.0.0"),
                Family::V6 => ip("fd10:244::"),
            });
            apply_ok(
                &mut backend,
                &[
                    KernelOp::SetMtu {
                        index: link.index,
                        mtu: spec.mtu - 10,
                    },
                    KernelOp::AddAddress {
                        index: link.index,
                        address,
                    },
                    KernelOp::DisableTxChecksum {
                        name: spec.name.clone(),
                    },
                ],
            )
            .await;
            apply_ok(&mut backend, &[KernelOp::SetUp { index: link.index }]).await;
            let fixed = backend
                .links(std::slice::from_ref(&spec.name))
                .await
                .unwrap()
                .remove(0);
            assert_eq!(fixed.mtu, spec.mtu - 10);
            assert!(fixed.up);
            assert_eq!(fixed.tx_checksum, Some(false));
            assert!(fixed.addresses.contains(&address), "{:?}", fixed.addresses);
            let others: Vec<_> = fixed.addresses.iter().filter(|a| **a != address).collect();
            // Up, a device has an IPv6 link-local address too.
            assert!(
                others
                    .iter()
                    .all(|a| a.ip().to_string().starts_with("fe80:")),
                "{others:?}"
            );
            let shown = &probe.ip_json(&["addr", "show", "dev", &spec.name])[0];
            assert!(
                shown["flags"].as_array().unwrap().contains(&"UP".into()),
                "{shown}"
            );
            let listed: Vec<String> = shown["addr_info"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
                .collect();
            assert!(listed.contains(&address.to_string()), "{listed:?}");

            let readded = apply_err(
                &mut backend,
                KernelOp::AddAddress {
                    index: link.index,
                    address,
                },
            )
            .await;
            assert_eq!(readded.errno, Some(libc::EEXIST));
            let delete = KernelOp::DeleteAddress {
                index: link.index,
                address,
            };
            apply_ok(&mut backend, std::slice::from_ref(&delete)).await;
            let again = apply_err(&mut backend, delete).await;
            assert_eq!(again.errno, Some(libc::EADDRNOTAVAIL), "{again}");

            let delete = KernelOp::DeleteLink {
                index: link.index,
                name: spec.name.clone(),
            };
            apply_ok(&mut backend, std::slice::from_ref(&delete)).await;
            assert_eq!(
                backend
                    .links(std::slice::from_ref(&spec.name))
                    .await
                    .unwrap(),
                vec![]
            );
            let again = apply_err(&mut backend, delete).await;
            assert!(again.is_missing_device(), "{again}");
        }

        let missing_parent =
            apply_err(&mut backend, KernelOp::CreateVxlan(spec(Family::V4, 9999))).await;
        assert!(missing_parent.is_missing_device(), "{missing_parent}");
    });
}

#[test]
fn routes_of_every_shape_round_trip() {
    let Some(netns) = Netns::for_test("routes_of_every_shape_round_trip") else {
        return;
    };
    let underlay = netns.probe.underlay();
    let probe = netns.probe();
    netns.run(move |mut backend| async move {
        let (vx4, vx6) = vxlan_devices(&mut backend, underlay.index).await;
        let nexthops = [
            KernelNexthop {
                id: 101,
                gateway: ip("10.244.1.0"),
                ifindex: vx4,
                protocol: PROTOCOL,
            },
            KernelNexthop {
                id: 102,
                gateway: ip("fd10:244:1::"),
                ifindex: vx6,
                protocol: PROTOCOL,
            },
        ];
        apply_ok(&mut backend, &nexthops.map(KernelOp::ReplaceNexthop)).await;

        let mut routes = Vec::new();
        for (family, vx, nexthop) in [(Family::V4, vx4, 101), (Family::V6, vx6, 102)] {
            let (prefix, gateway, direct_gateway, len) = match family {
                Family::V4 => ("10.244", ip("10.244.1.0"), ip("192.0.2.2"), 26),
                Family::V6 => ("fd10:244", ip("fd10:244:1::"), ip("2001:db8::2"), 122),
            };
            let dst = |block: u32| match family {
                Family::V4 => net(&format!("{prefix}.{block}.0/{len}")),
                Family::V6 => net(&format!("{prefix}:{block}::/{len}")),
            };
            let vias = [
                KernelRouteVia::Gateway {
                    gateway,
                    ifindex: vx,
                },
                KernelRouteVia::Gateway {
                    gateway: direct_gateway,
                    ifindex: underlay.index,
                },
                KernelRouteVia::Nexthop(nexthop),
                KernelRouteVia::Link(vx),
                KernelRouteVia::Blackhole,
            ];
            let mut block = 10;
            for via in vias {
                for mtu in [None, NonZeroU32::new(1400)] {
                    routes.push(KernelRoute {
                        dst: dst(block),
                        protocol: PROTOCOL,
                        via,
                        mtu,
                    });
                    block += 1;
                }
            }
        }
        let replace: Vec<KernelOp> = routes.iter().map(|r| KernelOp::ReplaceRoute(*r)).collect();
        apply_ok(&mut backend, &replace).await;

        // Not ours: another protocol on another device, and another
        // protocol on our device.
        probe.ip(&["route", "add", "198.51.100.0/24", "dev", "veth0"]);
        probe.ip(&[
            "route",
            "add",
            "10.99.0.0/24",
            "dev",
            "vxlan.calico",
            "proto",
            "static",
        ]);
        let theirs_on_our_device = KernelRoute {
            dst: net("10.99.0.0/24"),
            protocol: libc::RTPROT_STATIC,
            via: KernelRouteVia::Link(vx4),
            mtu: None,
        };

        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert_eq!(
            set(&state.routes),
            set(&routes),
            "the dump is what was programmed"
        );
        assert!(
            state
                .foreign_routes
                .contains(&ForeignRoute::of_shape(&theirs_on_our_device)),
            "{:?}",
            state.foreign_routes
        );
        assert_eq!(state.routes.len(), routes.len(), "no route twice");
        assert_eq!(set(&state.nexthops), set(&nexthops));

        let v4 = probe.ip_json(&["route", "show", "proto", "80"]);
        let v6 = probe.ip_json(&["-6", "route", "show", "proto", "80"]);
        assert_eq!(
            v4.as_array().unwrap().len() + v6.as_array().unwrap().len(),
            routes.len()
        );
        let shown = |dst: &str| {
            v4.as_array()
                .unwrap()
                .iter()
                .chain(v6.as_array().unwrap())
                .find(|r| r["dst"] == dst)
                .unwrap_or_else(|| panic!("{dst} not in {v4} {v6}"))
                .clone()
        };
        let onlink = shown("10.244.11.0/26");
        assert_eq!(onlink["gateway"], "10.244.1.0");
        assert_eq!(onlink["dev"], "vxlan.calico");
        assert!(
            onlink["flags"]
                .as_array()
                .unwrap()
                .contains(&"onlink".into())
        );
        assert_eq!(onlink["metrics"][0]["mtu"], 1400);
        assert_eq!(shown("10.244.14.0/26")["nhid"], 101);
        assert_eq!(shown("10.244.16.0/26")["scope"], "link");
        assert_eq!(shown("10.244.18.0/26")["type"], "blackhole");
        assert_eq!(shown("fd10:244:12::/122")["dev"], "veth0");

        // A change of MTU is a replace in place.
        let mut changed = routes[0];
        changed.mtu = NonZeroU32::new(1300);
        apply_ok(&mut backend, &[KernelOp::ReplaceRoute(changed)]).await;
        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert!(state.routes.contains(&changed));
        assert!(!state.routes.contains(&routes[0]));
        routes[0] = changed;

        let delete: Vec<KernelOp> = routes.iter().map(|r| KernelOp::DeleteRoute(*r)).collect();
        apply_ok(&mut backend, &delete).await;
        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert_eq!(state.routes, vec![]);
        let again = apply_err(&mut backend, delete[0].clone()).await;
        assert_eq!(again.errno, Some(libc::ESRCH), "{again}");

        let missing_device = apply_err(
            &mut backend,
            KernelOp::ReplaceRoute(KernelRoute {
                dst: net("10.250.0.0/24"),
                protocol: PROTOCOL,
                via: KernelRouteVia::Link(9999),
                mtu: None,
            }),
        )
        .await;
        assert_eq!(missing_device.errno, Some(libc::ENODEV), "{missing_device}");
        assert!(missing_device.is_missing_device());
        let missing_nexthop = apply_err(
            &mut backend,
            KernelOp::ReplaceRoute(KernelRoute {
                dst: net("10.250.0.0/24"),
                protocol: PROTOCOL,
                via: KernelRouteVia::Nexthop(4242),
                mtu: None,
            }),
        )
        .await;
        assert_eq!(
            missing_nexthop.errno,
            Some(libc::EINVAL),
            "{missing_nexthop}"
        );
    });
}

#[test]
fn thousands_of_pipelined_routes_apply_and_dump() {
    let Some(netns) = Netns::for_test("thousands_of_pipelined_routes_apply_and_dump") else {
        return;
    };
    let underlay = netns.probe.underlay();
    netns.run(move |mut backend| async move {
        let (vx4, _) = vxlan_devices(&mut backend, underlay.index).await;
        let routes: Vec<KernelRoute> = (0..5000u32)
            .map(|i| KernelRoute {
                dst: IpNetwork::new(
                    IpAddr::from([10, 100 + (i >> 16) as u8, (i >> 8) as u8, i as u8]),
                    32,
                )
                .unwrap(),
                protocol: PROTOCOL,
                via: KernelRouteVia::Gateway {
                    gateway: ip("10.244.1.0"),
                    ifindex: vx4,
                },
                mtu: NonZeroU32::new(1400),
            })
            .collect();
        let mut ops: Vec<KernelOp> = routes.iter().map(|r| KernelOp::ReplaceRoute(*r)).collect();
        // Failures among them come back in their places.
        ops.insert(
            2500,
            KernelOp::ReplaceRoute(KernelRoute {
                dst: net("10.250.0.0/24"),
                protocol: PROTOCOL,
                via: KernelRouteVia::Link(9999),
                mtu: None,
            }),
        );
        let results = backend.apply(&ops).await;
        assert_eq!(results.len(), ops.len());
        for (i, result) in results.iter().enumerate() {
            match i {
                2500 => assert!(result.as_ref().unwrap_err().is_missing_device()),
                _ => assert!(result.is_ok(), "{}: {result:?}", ops[i]),
            }
        }
        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert_eq!(set(&state.routes), set(&routes));
    });
}

#[test]
fn nexthops_round_trip_and_take_their_routes_with_them() {
    let Some(netns) = Netns::for_test("nexthops_round_trip_and_take_their_routes_with_them") else {
        return;
    };
    let underlay = netns.probe.underlay();
    let probe = netns.probe();
    netns.run(move |mut backend| async move {
        assert!(backend.supports_nexthops().await);
        let (vx4, vx6) = vxlan_devices(&mut backend, underlay.index).await;
        let mut nexthops = vec![
            KernelNexthop {
                id: 0x7678_0000,
                gateway: ip("10.244.1.0"),
                ifindex: vx4,
                protocol: PROTOCOL,
            },
            KernelNexthop {
                id: 0x7678_0001,
                gateway: ip("fd10:244:1::"),
                ifindex: vx6,
                protocol: PROTOCOL,
            },
        ];
        let replace: Vec<KernelOp> = nexthops
            .iter()
            .map(|n| KernelOp::ReplaceNexthop(*n))
            .collect();
        apply_ok(&mut backend, &replace).await;
        // Not ours: another protocol.
        probe.ip(&[
            "nexthop",
            "add",
            "id",
            "7",
            "via",
            "192.0.2.2",
            "dev",
            "veth0",
        ]);

        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert_eq!(set(&state.nexthops), set(&nexthops));
        let shown = probe.ip_json(&["nexthop", "show", "id", &nexthops[0].id.to_string()]);
        assert_eq!(shown[0]["gateway"], "10.244.1.0");
        assert_eq!(shown[0]["dev"], "vxlan.calico");
        assert!(
            shown[0]["flags"]
                .as_array()
                .unwrap()
                .contains(&"onlink".into())
        );

        // Replacing moves the gateway in place.
        nexthops[0].gateway = ip("10.244.2.0");
        apply_ok(&mut backend, &[KernelOp::ReplaceNexthop(nexthops[0])]).await;
        let route = KernelRoute {
            dst: net("10.244.2.0/26"),
            protocol: PROTOCOL,
            via: KernelRouteVia::Nexthop(nexthops[0].id),
            mtu: NonZeroU32::new(1450),
        };
        apply_ok(&mut backend, &[KernelOp::ReplaceRoute(route)]).await;
        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert_eq!(set(&state.nexthops), set(&nexthops));
        assert_eq!(state.routes, vec![route]);

        apply_ok(&mut backend, &[KernelOp::DeleteNexthop(nexthops[0])]).await;
        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert_eq!(state.nexthops, vec![nexthops[1]]);
        assert_eq!(state.routes, vec![], "the route went with its nexthop");
        assert_eq!(probe.ip_json(&["route", "show", "proto", "80"]), json(""));
        let again = apply_err(&mut backend, KernelOp::DeleteNexthop(nexthops[0])).await;
        assert_eq!(again.errno, Some(libc::ENOENT), "{again}");
        let missing_device = apply_err(
            &mut backend,
            KernelOp::ReplaceNexthop(KernelNexthop {
                ifindex: 9999,
                ..nexthops[1]
            }),
        )
        .await;
        assert!(missing_device.is_missing_device(), "{missing_device}");
    });
}

#[test]
fn neighbours_and_fdb_entries_round_trip() {
    let Some(netns) = Netns::for_test("neighbours_and_fdb_entries_round_trip") else {
        return;
    };
    let underlay = netns.probe.underlay();
    let probe = netns.probe();
    netns.run(move |mut backend| async move {
        let (vx4, vx6) = vxlan_devices(&mut backend, underlay.index).await;
        let mut neighbors = vec![
            KernelNeighbor {
                ifindex: vx4,
                address: ip("10.244.1.0"),
                mac: mac(REMOTE_MAC),
            },
            KernelNeighbor {
                ifindex: vx6,
                address: ip("fd10:244:1::"),
                mac: mac(REMOTE_MAC),
            },
        ];
        let mut fdb = vec![
            KernelFdb {
                ifindex: vx4,
                mac: mac(REMOTE_MAC),
                destination: ip("192.0.2.2"),
            },
            KernelFdb {
                ifindex: vx6,
                mac: mac(REMOTE_MAC),
                destination: ip("2001:db8::2"),
            },
        ];
        let mut ops: Vec<KernelOp> = neighbors
            .iter()
            .map(|n| KernelOp::ReplaceNeighbor(*n))
            .collect();
        ops.extend(fdb.iter().map(|e| KernelOp::ReplaceFdb(*e)));
        apply_ok(&mut backend, &ops).await;
        // Not ours: a permanent entry on another device.
        probe.ip(&[
            "neigh",
            "replace",
            "192.0.2.9",
            "lladdr",
            REMOTE_MAC,
            "dev",
            "veth0",
            "nud",
            "permanent",
        ]);

        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert_eq!(set(&state.neighbors), set(&neighbors));
        assert_eq!(set(&state.fdb), set(&fdb));
        let shown = probe.ip_json(&["neigh", "show", "dev", "vxlan.calico"]);
        assert_eq!(shown[0]["dst"], "10.244.1.0");
        assert_eq!(shown[0]["lladdr"], REMOTE_MAC);
        assert_eq!(shown[0]["state"][0], "PERMANENT");
        let shown = probe.bridge_json(&["fdb", "show", "dev", "vxlan-v6.calico"]);
        let entry = shown
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["mac"] == REMOTE_MAC)
            .unwrap_or_else(|| panic!("{shown}"));
        assert_eq!(entry["dst"], "2001:db8::2");
        assert_eq!(entry["state"], "permanent");
        assert!(entry["flags"].as_array().unwrap().contains(&"self".into()));

        // Replaces change the entries in place.
        neighbors[0].mac = mac("66:aa:00:00:00:03");
        fdb[0].destination = ip("192.0.2.3");
        apply_ok(
            &mut backend,
            &[
                KernelOp::ReplaceNeighbor(neighbors[0]),
                KernelOp::ReplaceFdb(fdb[0]),
            ],
        )
        .await;
        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert_eq!(set(&state.neighbors), set(&neighbors));
        assert_eq!(set(&state.fdb), set(&fdb));

        let mut ops: Vec<KernelOp> = neighbors
            .iter()
            .map(|n| KernelOp::DeleteNeighbor(*n))
            .collect();
        ops.extend(fdb.iter().map(|e| KernelOp::DeleteFdb(*e)));
        apply_ok(&mut backend, &ops).await;
        let state = backend.dump(&ownership(underlay.index)).await.unwrap();
        assert_eq!(state.neighbors, vec![]);
        assert_eq!(state.fdb, vec![]);
        for op in ops {
            let again = apply_err(&mut backend, op).await;
            assert_eq!(again.errno, Some(libc::ENOENT), "{again}");
        }
    });
}

#[test]
fn ipsets_update_and_replace() {
    let Some(netns) = Netns::for_test("ipsets_update_and_replace") else {
        return;
    };
    if !has_ipset("ipsets_update_and_replace") {
        return;
    }
    let probe = netns.probe();
    netns.run(move |mut backend| async move {
        let name = Family::V4.ipset_name().to_string();
        let name6 = Family::V6.ipset_name().to_string();
        let state = backend.dump(&Ownership::of_vxmgr(PROTOCOL)).await.unwrap();
        assert_eq!(state.ipsets, vec![], "missing sets are absent");

        let update = |add: &[&str], del: &[&str]| IpsetChange::Update {
            add: add.iter().map(|m| net(m)).collect(),
            del: del.iter().map(|m| net(m)).collect(),
        };
        apply_ok(
            &mut backend,
            &[KernelOp::Ipset {
                name: name.clone(),
                family: Family::V4,
                change: update(&["192.0.2.2/32", "198.51.100.0/24"], &[]),
            }],
        )
        .await;
        let members = |state: &vxmgr::kernel::objects::KernelState, set_name: &str| {
            let mut found = state
                .ipsets
                .iter()
                .find(|(n, _)| n == set_name)
                .unwrap_or_else(|| panic!("{set_name} missing"))
                .1
                .clone();
            found.sort();
            found
        };
        let state = backend.dump(&Ownership::of_vxmgr(PROTOCOL)).await.unwrap();
        assert_eq!(
            members(&state, &name),
            vec![net("192.0.2.2/32"), net("198.51.100.0/24")]
        );
        assert_eq!(state.ipsets.len(), 1);

        apply_ok(
            &mut backend,
            &[KernelOp::Ipset {
                name: name.clone(),
                family: Family::V4,
                change: update(&["192.0.2.3/32"], &["192.0.2.2/32", "192.0.2.200/32"]),
            }],
        )
        .await;
        let state = backend.dump(&Ownership::of_vxmgr(PROTOCOL)).await.unwrap();
        assert_eq!(
            members(&state, &name),
            vec![net("192.0.2.3/32"), net("198.51.100.0/24")]
        );

        apply_ok(
            &mut backend,
            &[
                KernelOp::Ipset {
                    name: name.clone(),
                    family: Family::V4,
                    change: IpsetChange::Replace {
                        members: vec![net("192.0.2.4/32")],
                    },
                },
                KernelOp::Ipset {
                    name: name6.clone(),
                    family: Family::V6,
                    change: IpsetChange::Replace {
                        members: vec![net("2001:db8::2/128"), net("2001:db8:1::/64")],
                    },
                },
            ],
        )
        .await;
        let state = backend.dump(&Ownership::of_vxmgr(PROTOCOL)).await.unwrap();
        assert_eq!(members(&state, &name), vec![net("192.0.2.4/32")]);
        assert_eq!(
            members(&state, &name6),
            vec![net("2001:db8::2/128"), net("2001:db8:1::/64")]
        );

        let listed = probe.ipset(&["list", "-n"]);
        assert!(listed.status.success());
        let mut names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        names.sort();
        assert_eq!(names, vec![name.clone(), name6], "no temporary set is left");
        let listed = probe.ipset(&["list", &name]);
        let text = String::from_utf8_lossy(&listed.stdout);
        assert!(text.contains("Type: hash:net"), "{text}");
        assert!(text.contains("192.0.2.4"), "{text}");
    });
}

/// `IpsetChange::Update` goes over netlink: checked against `ipset list` in
/// both families, from a missing set to a replaced one.
#[test]
fn ipset_member_changes_over_netlink() {
    let Some(netns) = Netns::for_test("ipset_member_changes_over_netlink") else {
        return;
    };
    if !has_ipset("ipset_member_changes_over_netlink") {
        return;
    }
    let probe = netns.probe();
    netns.run(move |mut backend| async move {
        let cases = [
            (
                Family::V4,
                "inet",
                [
                    "10.99.0.0/16",
                    "192.0.2.2/32",
                    "192.0.2.3/32",
                    "192.0.2.200/32",
                ],
                "0.0.0.0/0",
            ),
            (
                Family::V6,
                "inet6",
                [
                    "2001:db8:99::/48",
                    "2001:db8::2/128",
                    "2001:db8::3/128",
                    "2001:db8::200/128",
                ],
                "::/0",
            ),
        ];
        for (family, family_name, [prefix, host, other_host, absent], refused) in cases {
            let name = family.ipset_name().to_string();
            let op = |add: &[&str], del: &[&str]| KernelOp::Ipset {
                name: name.clone(),
                family,
                change: IpsetChange::Update {
                    add: add.iter().map(|m| net(m)).collect(),
                    del: del.iter().map(|m| net(m)).collect(),
                },
            };
            let nets = |list: &[&str]| {
                let mut nets: Vec<IpNetwork> = list.iter().map(|m| net(m)).collect();
                nets.sort();
                nets
            };
            assert_eq!(probe.ipset_members(&name), None, "{name} exists already");

            // The first add creates the set as `ipset restore` would.
            apply_ok(&mut backend, &[op(&[prefix, host], &[])]).await;
            assert_eq!(probe.ipset_members(&name), Some(nets(&[prefix, host])));
            assert_eq!(probe.ipset_header(&name, "Type"), "hash:net");
            let header = probe.ipset_header(&name, "Header");
            assert!(
                header.starts_with(&format!("family {family_name} ")),
                "{header}"
            );
            assert!(header.contains(" maxelem 1048576 "), "{header}");
            let revision = probe.ipset_header(&name, "Revision");

            // Adding members that are there is no error.
            apply_ok(&mut backend, &[op(&[prefix, host, other_host], &[])]).await;
            assert_eq!(
                probe.ipset_members(&name),
                Some(nets(&[prefix, host, other_host]))
            );

            // Nor is deleting members that are not.
            apply_ok(&mut backend, &[op(&[], &[host, absent])]).await;
            assert_eq!(
                probe.ipset_members(&name),
                Some(nets(&[prefix, other_host]))
            );
            apply_ok(&mut backend, &[op(&[], &[host])]).await;
            apply_ok(&mut backend, &[op(&[], &[prefix])]).await;
            assert_eq!(probe.ipset_members(&name), Some(nets(&[other_host])));
            apply_ok(&mut backend, &[op(&[prefix], &[other_host])]).await;
            assert_eq!(probe.ipset_members(&name), Some(nets(&[prefix])));

            // The dump reads what `ipset list` shows.
            let state = backend.dump(&Ownership::of_vxmgr(PROTOCOL)).await.unwrap();
            let dumped = state.ipsets.iter().find(|(n, _)| *n == name);
            assert_eq!(dumped, Some(&(name.clone(), vec![net(prefix)])));

            // Members beyond what one message holds, and a dump answered in
            // several messages.
            let many: Vec<IpNetwork> = (0..1000u16)
                .map(|i| match family {
                    Family::V4 => format!("10.100.{}.{}/32", i / 250, i % 250),
                    Family::V6 => format!("2001:db8:100::{i:x}/128"),
                })
                .map(|m| net(&m))
                .collect();
            let bulk = |add: &[IpNetwork], del: &[IpNetwork]| KernelOp::Ipset {
                name: name.clone(),
                family,
                change: IpsetChange::Update {
                    add: add.to_vec(),
                    del: del.to_vec(),
                },
            };
            apply_ok(&mut backend, &[bulk(&many, &[])]).await;
            let mut all = many.clone();
            all.push(net(prefix));
            all.sort();
            assert_eq!(probe.ipset_members(&name).as_ref(), Some(&all));
            let mut state = backend.dump(&Ownership::of_vxmgr(PROTOCOL)).await.unwrap();
            let dumped = state.ipsets.iter_mut().find(|(n, _)| *n == name).unwrap();
            dumped.1.sort();
            assert_eq!(dumped.1, all);
            apply_ok(&mut backend, &[bulk(&[], &many)]).await;
            assert_eq!(probe.ipset_members(&name), Some(nets(&[prefix])));

            // The kernel's ipset error codes are worded; the good members of
            // a refused update still go in.
            let error = apply_err(&mut backend, op(&[refused, host], &[])).await;
            assert_eq!(
                error.message,
                format!("adding {refused}: the prefix length is out of range for the set")
            );
            assert_eq!(probe.ipset_members(&name), Some(nets(&[prefix, host])));

            // A replace after netlink updates swaps in a set of the same
            // revision, which netlink updates go on changing.
            apply_ok(
                &mut backend,
                &[KernelOp::Ipset {
                    name: name.clone(),
                    family,
                    change: IpsetChange::Replace {
                        members: vec![net(other_host)],
                    },
                }],
            )
            .await;
            assert_eq!(probe.ipset_members(&name), Some(nets(&[other_host])));
            assert_eq!(probe.ipset_header(&name, "Revision"), revision);
            apply_ok(&mut backend, &[op(&[host], &[other_host])]).await;
            assert_eq!(probe.ipset_members(&name), Some(nets(&[host])));

            // A set destroyed behind vxmgr's back is created again, even by
            // a delete.
            assert!(probe.ipset(&["destroy", &name]).status.success());
            apply_ok(&mut backend, &[op(&[], &[host])]).await;
            assert_eq!(probe.ipset_members(&name), Some(vec![]));
        }
        let listed = probe.ipset(&["list", "-n"]);
        let mut names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![Family::V4.ipset_name(), Family::V6.ipset_name()],
            "no temporary set is left"
        );
    });
}

// ------------------------------------------------------------- reconciler

fn change<T: vxmgr::desired::Desired>(desired: T) -> Change<T> {
    Change {
        key: desired.key(),
        desired: Some(desired),
    }
}

/// Everything a node with one remote node (node-b) and one same-subnet
/// node (node-c) wants, in both families.
fn cluster(underlay: &ParentInterface, with_nexthops: bool) -> Delta {
    let mut delta = Delta::default();
    let node_b = ArcStr::from("node-b");
    for family in Family::ALL {
        let v4 = family == Family::V4;
        let pick = |a: &str, b: &str| if v4 { a.to_string() } else { b.to_string() };
        let mtu = if v4 { 1450 } else { 1430 };
        let tunnel_gateway = ip(&pick("10.244.1.0", "fd10:244:1::"));
        delta.devices.push(change(VxlanDevice {
            name: Arc::from(family.device_name()),
            family,
            vni: 4096,
            port: 4789,
            parent: underlay.clone(),
            local_ip: ip(&pick(UNDERLAY_V4, UNDERLAY_V6)),
            mac: mac(&pick(LOCAL_MAC, "66:aa:00:00:01:01")),
            mtu,
            address: Family::host_net(ip(&pick("10.244.0.0", "fd10:244::"))),
        }));
        let direct_gateway = ip(&pick("192.0.2.3", "2001:db8::3"));
        if with_nexthops {
            delta.nexthops.push(change(Nexthop {
                gateway: tunnel_gateway,
                via: NexthopVia::Tunnel {
                    family,
                    node: node_b.clone(),
                },
                protocol: PROTOCOL,
            }));
            delta.nexthops.push(change(Nexthop {
                gateway: direct_gateway,
                via: NexthopVia::Direct {
                    interface: Arc::new(underlay.clone()),
                },
                protocol: PROTOCOL,
            }));
        }
        let route = |dst: String, target: RouteTarget, mtu: Option<u32>| Route {
            dst: net(&dst),
            target,
            protocol: PROTOCOL,
            mtu: mtu.and_then(NonZeroU32::new),
        };
        delta.routes.extend(
            [
                route(
                    pick("10.244.1.0/26", "fd10:244:1::/122"),
                    RouteTarget::Tunnel {
                        node: node_b.clone(),
                        gateway: tunnel_gateway,
                    },
                    Some(mtu),
                ),
                route(
                    pick("10.244.1.0/32", "fd10:244:1::/128"),
                    RouteTarget::Connected {
                        node: node_b.clone(),
                    },
                    Some(mtu),
                ),
                route(
                    pick("10.244.2.0/26", "fd10:244:2::/122"),
                    RouteTarget::Direct {
                        gateway: direct_gateway,
                        interface: Arc::new(underlay.clone()),
                    },
                    None,
                ),
                route(
                    pick("10.244.0.0/26", "fd10:244::/122"),
                    RouteTarget::Blackhole,
                    None,
                ),
            ]
            .into_iter()
            .map(change),
        );
        delta.neighbors.push(change(Neighbor {
            address: tunnel_gateway,
            mac: mac(REMOTE_MAC),
        }));
        delta.fdb.push(change(FdbEntry {
            family,
            mac: mac(REMOTE_MAC),
            destination: ip(&pick("192.0.2.2", "2001:db8::2")),
        }));
        delta
            .ipset
            .push(change(IpsetMember(Family::host_net(ip(&pick(
                "192.0.2.2",
                "2001:db8::2",
            ))))));
    }
    delta
}

async fn new_reconciler(
    backend: NetlinkBackend,
    nexthops: NexthopMode,
) -> Reconciler<NetlinkBackend> {
    Reconciler::new(
        backend,
        ReconcilerOptions {
            nexthops,
            disable_tx_checksum: true,
            route_protocol: PROTOCOL,
            contest_window: CONTEST_WINDOW,
        },
    )
    .await
}

fn request(delta: Delta) -> ApplyRequest {
    ApplyRequest {
        delta,
        in_sync: true,
        route_protocol: PROTOCOL,
        device_names: Default::default(),
    }
}

fn reconciler_converges(test: &str, mode: NexthopMode) {
    let Some(netns) = Netns::for_test(test) else {
        return;
    };
    if !has_ipset(test) {
        return;
    }
    let underlay = netns.probe.underlay();
    let probe = netns.probe();
    let with_nexthops = mode == NexthopMode::On;
    netns.run(move |backend| async move {
        let mut reconciler = new_reconciler(backend, mode).await;
        let first = reconciler
            .apply(request(cluster(&underlay, with_nexthops)))
            .await;
        assert_eq!(first.errors, vec![], "{first:?}");
        assert!(first.operations > 0);

        let second = reconciler
            .apply(request(cluster(&underlay, with_nexthops)))
            .await;
        assert_eq!(second.errors, vec![]);
        assert_eq!(second.operations, 0, "nothing left to do: {second:?}");
        let resync = reconciler.resync().await.unwrap();
        assert_eq!(resync.errors, vec![]);
        assert_eq!(resync.operations, 0, "the kernel matches: {resync:?}");

        // The kernel holds what was asked for.
        let device = &probe.ip_json(&["-d", "addr", "show", "dev", "vxlan.calico"])[0];
        assert!(device["flags"].as_array().unwrap().contains(&"UP".into()));
        assert_eq!(device["addr_info"][0]["local"], "10.244.0.0");
        let routes = probe.ip_json(&["-6", "route", "show", "proto", "80"]);
        assert_eq!(routes.as_array().unwrap().len(), 4, "{routes}");
        let tunnel = probe.ip_json(&["route", "show", "10.244.1.0/26"]);
        let direct = probe.ip_json(&["route", "show", "10.244.2.0/26"]);
        match with_nexthops {
            true => {
                assert!(tunnel[0]["nhid"].is_number(), "{tunnel}");
                assert!(direct[0]["nhid"].is_number(), "{direct}");
            }
            false => {
                assert_eq!(tunnel[0]["gateway"], "10.244.1.0");
                assert_eq!(direct[0]["gateway"], "192.0.2.3");
            }
        }

        // A restarted daemon adopts the kernel's state: its first batch
        // after the start-up resync changes nothing.
        let backend = NetlinkBackend::new().unwrap();
        let mut restarted = new_reconciler(backend, mode).await;
        let adopted = restarted.resync().await.unwrap();
        assert_eq!(adopted.errors, vec![]);
        restarted.begin_stream();
        let replayed = restarted
            .apply(request(cluster(&underlay, with_nexthops)))
            .await;
        assert_eq!(replayed.errors, vec![]);
        assert_eq!(
            replayed.operations, 0,
            "no drift after a restart: {replayed:?}"
        );
    });
}

#[test]
fn reconciler_converges_with_nexthop_objects() {
    reconciler_converges("reconciler_converges_with_nexthop_objects", NexthopMode::On);
}

#[test]
fn reconciler_converges_with_inline_gateways() {
    reconciler_converges(
        "reconciler_converges_with_inline_gateways",
        NexthopMode::Off,
    );
}

/// The kernel's notifications of changes made while nothing read them
/// (`ip -batch` runs while the runtime is blocked) are all taken in, in
/// order, once the watch has caught up: a route added, deleted and added
/// again is seen so, and no older notice comes after a newer one.
#[test]
fn a_watch_that_has_caught_up_has_every_change_made_before() {
    let Some(netns) = Netns::for_test("a_watch_that_has_caught_up_has_every_change_made_before")
    else {
        return;
    };
    let probe = netns.probe();
    netns.run(move |mut backend| async move {
        let mut watch = backend.watch().expect("subscribing");
        let dsts: Vec<String> = (0..1000u32)
            .map(|i| format!("10.100.{}.{}/32", i >> 8, i & 0xff))
            .collect();
        let commands: String = ["add", "del", "add"]
            .iter()
            .flat_map(|verb| {
                dsts.iter()
                    .map(move |dst| format!("route {verb} {dst} dev veth0 proto {PROTOCOL}\n"))
            })
            .collect();
        let batch = std::env::temp_dir().join(format!("{}.batch", probe.name));
        std::fs::write(&batch, commands).unwrap();
        probe.ip(&["-batch", batch.to_str().unwrap()]);
        std::fs::remove_file(&batch).unwrap();
        watch.caught_up().await;
        let mut seen: std::collections::HashMap<IpNetwork, Vec<&str>> = Default::default();
        while let Some(notification) = watch.try_recv() {
            let (route, kind) = match notification {
                Notification::Route(route) => (route, "added"),
                Notification::RouteGone(route) => (route, "deleted"),
                _ => continue,
            };
            let dst = match route {
                TableRoute::Shaped(route) => route.dst,
                TableRoute::Other(route) => route.dst,
            };
            seen.entry(dst).or_default().push(kind);
        }
        for dst in &dsts {
            assert_eq!(
                seen.get(&net(dst)).map(Vec::as_slice),
                Some(&["added", "deleted", "added"][..]),
                "{dst}"
            );
        }
    });
}

/// The watch does not hear the echoes of the routes and neighbours the
/// backend itself adds (a socket filter keeps the kernel from queueing
/// them), and still hears another program's changes, and the deletion of
/// the backend's objects.
#[test]
fn a_watch_hears_other_programs_changes_and_not_the_echoes_of_its_own() {
    let test = "a_watch_hears_other_programs_changes_and_not_the_echoes_of_its_own";
    let Some(netns) = Netns::for_test(test) else {
        return;
    };
    let underlay = netns.probe.underlay();
    let probe = netns.probe();
    netns.run(move |mut backend| async move {
        let mut watch = backend.watch().expect("subscribing");
        let ours = KernelRoute {
            dst: net("10.101.0.0/24"),
            protocol: PROTOCOL,
            via: KernelRouteVia::Link(underlay.index),
            mtu: None,
        };
        let our_neighbour = KernelNeighbor {
            ifindex: underlay.index,
            address: ip("192.0.2.50"),
            mac: mac(REMOTE_MAC),
        };
        apply_ok(
            &mut backend,
            &[
                KernelOp::ReplaceRoute(ours),
                KernelOp::ReplaceNeighbor(our_neighbour),
            ],
        )
        .await;
        probe.ip(&[
            "route",
            "add",
            "10.102.0.0/24",
            "dev",
            "veth0",
            "proto",
            "80",
        ]);
        probe.ip(&[
            "neigh",
            "replace",
            "192.0.2.51",
            "lladdr",
            REMOTE_MAC,
            "dev",
            "veth0",
            "nud",
            "permanent",
        ]);
        probe.ip(&["route", "del", "10.101.0.0/24", "dev", "veth0"]);
        watch.caught_up().await;
        let mut seen = Vec::new();
        while let Some(notification) = watch.try_recv() {
            match notification {
                Notification::Route(TableRoute::Shaped(route)) => {
                    seen.push(format!("route {}", route.dst));
                }
                Notification::RouteGone(TableRoute::Shaped(route)) => {
                    seen.push(format!("route gone {}", route.dst));
                }
                Notification::Neighbor(n) if n.ifindex == underlay.index => {
                    seen.push(format!("neighbour {}", n.address));
                }
                _ => {}
            }
        }
        assert_eq!(
            seen,
            [
                "route 10.102.0.0/24",
                "neighbour 192.0.2.51",
                "route gone 10.101.0.0/24"
            ]
        );
    });
}

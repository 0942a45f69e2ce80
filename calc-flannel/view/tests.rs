//! The view against golden message streams (`calc-flannel/testdata/`,
//! rewritten by `VXMGR_REGENERATE=1`), and against vxmgr's own manager:
//! the snapshot after any changes must mean what the changes did.

use std::collections::BTreeSet;
use std::path::PathBuf;

use vxmgr::config::Config;
use vxmgr::manager::Manager;
use vxmgr::model::Update;
use vxmgr::server::state::dataplane_state;
use vxmgr::wire::json;

use super::*;
use crate::lease::{LeaseAttrs, VxlanData};

const DUAL_STACK_VXLAN: &str = r#"{"Network": "10.244.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:244::/48",
    "Backend": {"Type": "vxlan", "DirectRouting": true}}"#;
const HOST_GW: &str = r#"{"Network": "10.244.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:244::/48",
    "Backend": {"Type": "host-gw"}}"#;

fn key(text: &str) -> SubnetKey {
    text.parse().unwrap()
}

fn mac(n: u8, v6: bool) -> VxlanData {
    VxlanData {
        vni: 1,
        vtep_mac: format!("0e:00:00:00:{:02x}:{n:02x}", u8::from(v6))
            .parse()
            .unwrap(),
    }
}

/// Node `n`'s vxlan lease: 10.244.<n>.0/24 (and fd00:244:0:<n>::/64),
/// public 192.168.10.<n> (and fd00:10::<n>).
fn vxlan_lease(n: u8, v6: bool) -> Lease {
    let key = if v6 {
        key(&format!("10.244.{n}.0-24&fd00:244:0:{n}::-64"))
    } else {
        key(&format!("10.244.{n}.0-24"))
    };
    let public_v6 = format!("fd00:10::{n}").parse().unwrap();
    Lease {
        key,
        attrs: LeaseAttrs::vxlan(
            format!("192.168.10.{n}").parse().unwrap(),
            mac(n, false),
            v6.then_some((public_v6, mac(n, true))),
        ),
    }
}

fn underlay() -> Underlay {
    Underlay {
        interface: "eth0".into(),
        mtu: 1500,
        address_v4: "192.168.10.1".parse().unwrap(),
        address_v6: Some("fd00:10::1".parse().unwrap()),
        public_v4: "192.168.10.1".parse().unwrap(),
        public_v6: Some("fd00:10::1".parse().unwrap()),
        networks: vec![
            "192.168.10.0/24".parse().unwrap(),
            "fd00:10::/64".parse().unwrap(),
        ],
    }
}

fn view(config: &str, own: Lease) -> View {
    View::new(
        NetworkConfig::parse(config).unwrap(),
        Local {
            hostname: "node-1".into(),
            lease: own,
            underlay: underlay(),
            ip_masq: false,
        },
    )
}

/// The messages of a scenario, one step after another, as JSON lines.
struct Golden {
    lines: Vec<String>,
}

impl Golden {
    fn new() -> Golden {
        Golden { lines: Vec::new() }
    }

    fn step(&mut self, what: &str, messages: Vec<ToDataplane>) {
        self.lines.push(format!("# {what}"));
        self.lines
            .extend(messages.iter().map(|m| json::to_value(m).to_string()));
    }

    fn check(self, name: &str) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("calc-flannel/testdata")
            .join(format!("{name}.jsonl"));
        let text = self.lines.join("\n") + "\n";
        if std::env::var_os("VXMGR_REGENERATE").is_some_and(|v| v == "1") {
            std::fs::write(&path, &text).unwrap();
            return;
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (VXMGR_REGENERATE=1 writes it)", path.display()));
        if golden != text {
            let diff = similar::TextDiff::from_lines(&golden, &text);
            panic!(
                "{} differs (VXMGR_REGENERATE=1 rewrites it):\n{}",
                path.display(),
                diff.unified_diff().header("golden", "now")
            );
        }
    }
}

/// The vxlan scenario's steps, each with the view's messages.
fn vxlan_steps(v: &mut View, mut step: impl FnMut(&str, Vec<ToDataplane>, &View)) {
    let same_segment = vxlan_lease(2, true);
    let mut elsewhere = vxlan_lease(3, false);
    elsewhere.attrs.public_ip = "172.31.0.3".parse().unwrap();
    let mut bad_v6_mac = vxlan_lease(4, true);
    bad_v6_mac.attrs.backend_v6_data =
        Some(serde_json::json!({"VNI": 1, "VtepMAC": "01:00:5e:00:00:01"}));
    let host_gw = Lease {
        key: key("10.244.5.0-24"),
        attrs: LeaseAttrs::host_gw("192.168.10.5".parse().unwrap(), None),
    };
    let mut out = Vec::new();
    for lease in [&same_segment, &elsewhere, &bad_v6_mac, &host_gw] {
        out.extend(v.put(lease));
    }
    step(
        "four leases: on this segment (direct), elsewhere (tunnel), a bad IPv6 MAC, host-gw",
        out,
        v,
    );
    step(
        "the snapshot a new stream gets",
        v.snapshot().collect::<Vec<_>>(),
        v,
    );

    let mut moved = same_segment.clone();
    moved.attrs.backend_data = Some(serde_json::json!({"VNI": 1, "VtepMAC": "0e:00:00:00:00:22"}));
    step("node 2's VTEP MAC changes", v.put(&moved), v);
    let mut v4_only = moved.clone();
    v4_only.attrs.public_ipv6 = None;
    v4_only.attrs.backend_v6_data = None;
    step("node 2 drops IPv6", v.put(&v4_only), v);
    step("node 2 put again unchanged: nothing", v.put(&v4_only), v);
    step("node 3 deleted", v.delete(&elsewhere.key), v);
    let unreadable: BTreeSet<SubnetKey> = [bad_v6_mac.key].into();
    step(
        "relisted: node 2 gone, node 6 new, node 4 unreadable now (kept)",
        v.resync(&[vxlan_lease(6, true)], &unreadable),
        v,
    );
    step(
        "this node's lease is another one now",
        v.set_local_lease(vxlan_lease(7, true)),
        v,
    );
}

#[test]
fn vxlan_golden() {
    let mut v = view(DUAL_STACK_VXLAN, vxlan_lease(1, true));
    let mut golden = Golden::new();
    vxlan_steps(&mut v, |what, messages, _| golden.step(what, messages));
    golden.check("view-vxlan");
}

#[test]
fn host_gw_golden() {
    let own = Lease {
        key: key("10.244.1.0-24&fd00:244:0:1::-64"),
        attrs: LeaseAttrs::host_gw(
            "192.168.10.1".parse().unwrap(),
            Some("fd00:10::1".parse().unwrap()),
        ),
    };
    let mut v = view(HOST_GW, own);
    let mut golden = Golden::new();
    let near = Lease {
        key: key("10.244.2.0-24&fd00:244:0:2::-64"),
        attrs: LeaseAttrs::host_gw(
            "192.168.10.2".parse().unwrap(),
            Some("fd00:10::2".parse().unwrap()),
        ),
    };
    let far = Lease {
        key: key("10.244.3.0-24"),
        attrs: LeaseAttrs::host_gw("172.31.0.3".parse().unwrap(), None),
    };
    let mut out = v.put(&near);
    out.extend(v.put(&far));
    out.extend(v.put(&vxlan_lease(4, false)));
    golden.step(
        "a node on this segment, one not (without its address: not routed), a vxlan lease (ignored)",
        out,
    );
    let state = manager_state(&v.snapshot().collect::<Vec<_>>());
    let waiting = &state.ipv4.unwrap().waiting_routes;
    let far_route = waiting.iter().find(|w| w.dst == "10.244.3.0/24");
    assert!(
        far_route.is_some_and(|w| w.node == "10.244.3.0-24" && w.reason.contains("dstNodeIp")),
        "vxmgrd reports the far node's route as waiting: {waiting:?}"
    );
    golden.step(
        "the snapshot a new stream gets",
        v.snapshot().collect::<Vec<_>>(),
    );
    golden.step("the near node leaves", v.delete(&near.key));
    golden.check("view-host-gw");
}

/// What vxmgrd's manager makes of `messages`, as GetState shows it.
fn manager_state(messages: &[ToDataplane]) -> vxmgr::wire::vxmgr::v1::DataplaneState {
    let mut manager = Manager::new("node-1", Config::default());
    for message in messages {
        if let Some(update) = Update::from_message(message.clone()).expect("valid messages") {
            manager.on_update(update).expect("accepted");
        }
    }
    manager.complete_deferred_work();
    dataplane_state(&manager, None, &[])
}

#[test]
fn every_change_means_what_a_new_snapshot_says() {
    let mut v = view(DUAL_STACK_VXLAN, vxlan_lease(1, true));
    let mut stream = v.snapshot().collect::<Vec<_>>();
    vxlan_steps(&mut v, |what, messages, v| {
        stream.extend(messages);
        assert_eq!(
            manager_state(&stream),
            manager_state(&v.snapshot().collect::<Vec<_>>()),
            "after: {what}"
        );
    });
}

#[test]
fn ip_masq_declares_the_networks_as_masquerading_pools() {
    let own = vxlan_lease(1, true);
    let plain = view(DUAL_STACK_VXLAN, own.clone())
        .snapshot()
        .collect::<Vec<_>>();
    let mut v = view(DUAL_STACK_VXLAN, own);
    v.local.ip_masq = true;
    let pools = manager_state(&v.snapshot().collect::<Vec<_>>()).ip_pools;
    let pools: Vec<(&str, bool)> = pools
        .iter()
        .map(|p| (p.cidr.as_str(), p.masquerade))
        .collect();
    assert_eq!(pools, [("10.244.0.0/16", true), ("fd00:244::/48", true)]);
    assert!(
        manager_state(&plain).ip_pools.is_empty(),
        "none without --ip-masq"
    );
}

#[test]
fn a_listing_loaded_at_start_up_is_what_the_snapshot_sends() {
    let leases = [
        vxlan_lease(2, true),
        vxlan_lease(3, false),
        vxlan_lease(1, true),
    ];
    let mut loaded = view(DUAL_STACK_VXLAN, vxlan_lease(1, true));
    loaded.load(&leases, &BTreeSet::new());
    let mut resynced = view(DUAL_STACK_VXLAN, vxlan_lease(1, true));
    let messages = resynced.resync(&leases, &BTreeSet::new());
    assert_eq!(
        loaded.remote_count(),
        2,
        "this node's own lease is not a remote"
    );
    let snapshot: Vec<ToDataplane> = loaded.snapshot().collect();
    assert_eq!(snapshot, resynced.snapshot().collect::<Vec<_>>());
    for message in &messages {
        assert!(snapshot.contains(message), "{message:?} in the snapshot");
    }
    assert_eq!(
        loaded.resync(&leases, &BTreeSet::new()),
        Vec::new(),
        "nothing left to send"
    );
}

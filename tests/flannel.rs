//! flannel mode end to end: a real etcd on the underlay and, on each node
//! of a namespace cluster, the real calc-flannel and vxmgrd binaries.
//! Needs root and the etcd binary; skips without them unless
//! VXMGR_REQUIRE_NETNS=1 / VXMGR_REQUIRE_ETCD=1. The kube-mode tests need
//! a kube-apiserver too (VXMGR_REQUIRE_KUBE); the one mixing in flannel's
//! own flanneld runs only when FLANNELD names it.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use support::cni;
use support::flannel::{block_on, can_run, cluster, flanneld};
use support::kube::kube_available;
use support::testbed::etcd_cluster::EtcdCluster;
use support::testbed::flannel::{ETCD_ADDRESS, PREFIX, Subnets};
use support::testbed::{self, FlannelCluster, Monitor, Pod, census};
use vxmgr::model::Family;

const WAIT: Duration = Duration::from_secs(30);
const ENDPOINT: &str = "http://192.168.10.254:2379";

fn put(c: &FlannelCluster, key: &str, value: &str) {
    block_on(async { c.etcd.client().await?.put(key, value).await }).unwrap();
}

fn delete(c: &FlannelCluster, key: &str) {
    block_on(async { c.etcd.client().await?.delete(key).await }).unwrap();
}

fn leases(c: &FlannelCluster) -> Vec<(String, serde_json::Value)> {
    let prefix = format!("{PREFIX}/subnets/");
    block_on(async { c.etcd.client().await?.list(&prefix).await })
        .unwrap()
        .into_iter()
        .map(|(k, v)| {
            let key = k.strip_prefix(&prefix).unwrap().to_string();
            (
                key,
                serde_json::from_str(&v).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect()
}

/// Node `i`'s vxmgrd's GetState.
fn dataplane_state(c: &FlannelCluster, i: u8) -> vxmgr::wire::vxmgr::v1::DataplaneState {
    block_on(async {
        let mut client = vxmgr::client::dataplane(&c.cluster.node(i).socket).await?;
        let request = vxmgr::wire::vxmgr::v1::GetStateRequest {};
        anyhow::Ok(client.get_state(request).await?.into_inner())
    })
    .expect("GetState")
}

/// The lease key of a node's subnets, as flannel writes it.
fn key_of(s: &Subnets) -> String {
    let part = |n: ipnetwork::IpNetwork| format!("{}-{}", n.network(), n.prefix());
    match s.v6 {
        Some(v6) => format!("{}/subnets/{}&{}", PREFIX, part(s.v4), part(v6)),
        None => format!("{}/subnets/{}", PREFIX, part(s.v4)),
    }
}

/// Starts vxmgrd on every node, then calc-flannel: node 1 told by flags,
/// node 2 by flanneld's variables, node 3 by ours (an interface regex).
fn start(c: &mut FlannelCluster, extra: &[&[&str]]) {
    for node in &mut c.cluster.nodes {
        node.start_daemon(&[]).unwrap();
    }
    let args = |i: usize| extra.get(i).copied().unwrap_or(&[]);
    let mut one = vec!["--etcd-endpoints", ENDPOINT, "--iface", "eth0"];
    one.extend_from_slice(args(0));
    c.start_agent(1, &one, &[]).unwrap();
    if c.cluster.nodes.len() >= 2 {
        let env = [
            ("FLANNELD_ETCD_ENDPOINTS", ENDPOINT),
            ("FLANNELD_IFACE", "eth0"),
        ];
        c.start_agent(2, args(1), &env).unwrap();
    }
    if c.cluster.nodes.len() >= 3 {
        let env = [
            ("CALC_FLANNEL_ETCD_ENDPOINTS", ENDPOINT),
            ("CALC_FLANNEL_IFACE_REGEX", r"^192\.168\.10\."),
        ];
        c.start_agent(3, args(2), &env).unwrap();
    }
}

/// Every node's subnets, once its agent has written them.
fn subnets(c: &FlannelCluster) -> Vec<Subnets> {
    (1..=c.cluster.nodes.len() as u8)
        .map(|i| c.subnets(i, WAIT).unwrap())
        .collect()
}

/// Every node's subnets, and a pod on each node made through the CNI
/// plugins with flannel's conflist, addressed in its node's subnet.
fn subnets_and_pods(c: &FlannelCluster) -> (Vec<Subnets>, Vec<Pod>) {
    let subnets = subnets(c);
    let pods = (1u8..)
        .zip(&subnets)
        .map(|(i, s)| {
            let pod = c.pod_network(i, cni::plugin_dir()).add().unwrap();
            let address = pod.address(false).expect("an IPv4 address");
            assert!(s.v4.contains(address), "{address} in {}", s.v4);
            if let (Some(v6), Some(address)) = (s.v6, pod.address(true)) {
                assert!(v6.contains(address), "{address} in {v6}");
            }
            pod
        })
        .collect();
    (subnets, pods)
}

fn routes(ns: &str, family: Family) -> BTreeSet<String> {
    census::routes(ns, family).unwrap()
}

fn all_routes(ns: &str) -> BTreeSet<String> {
    let mut all = routes(ns, Family::V4);
    all.extend(routes(ns, Family::V6));
    all
}

/// Waits until `ns` has (or, with `present` false, no longer has) a route
/// to `dst` of vxmgr's; the route's description.
fn wait_route(ns: &str, dst: &str, present: bool) -> Option<String> {
    wait_listed_route(ns, dst, present, routes)
}

/// [`wait_route`] for a route of anyone's in the main table (flanneld's).
fn wait_any_route(ns: &str, dst: &str, present: bool) -> Option<String> {
    wait_listed_route(ns, dst, present, |ns, family| {
        census::routes_selected(ns, family, &[]).unwrap()
    })
}

/// Waits until `list` shows (or no longer shows) a route to `dst` in `ns`.
fn wait_listed_route(
    ns: &str,
    dst: &str,
    present: bool,
    list: impl Fn(&str, Family) -> BTreeSet<String>,
) -> Option<String> {
    let family = if dst.contains(':') {
        Family::V6
    } else {
        Family::V4
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let found = list(ns, family)
            .into_iter()
            .find(|r| r.starts_with(&format!("{dst} ")));
        if found.is_some() == present {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{ns}: route to {dst} {} within {WAIT:?}; routes: {:#?}",
            if present { "not there" } else { "still there" },
            list(ns, family)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `monitor` has seen deleted so far.
fn routes_deleted(monitor: &mut Monitor) -> Vec<String> {
    monitor.sync().unwrap();
    monitor
        .seen
        .iter()
        .filter(|l| l.starts_with("Deleted"))
        .cloned()
        .collect()
}

fn tx_packets(ns: &str, dev: &str) -> u64 {
    testbed::ip_json(ns, &["-s", "link", "show", dev]).unwrap()[0]["stats64"]["tx"]["packets"]
        .as_u64()
        .expect("tx packets")
}

/// Pings `to`'s address of the family from pod `from`, from its own.
fn ping(from: &Pod, to: &Pod, v6: bool) -> bool {
    let (source, target) = (from.address(v6).unwrap(), to.address(v6).unwrap());
    let (source, target) = (source.to_string(), target.to_string());
    let family = if v6 { "-6" } else { "-4" };
    let args = [
        "ping", family, "-c", "3", "-i", "0.2", "-W", "2", "-I", &source, &target,
    ];
    testbed::try_in(&from.ns, &args).unwrap().status.success()
}

/// For each `(from, to)`, node `from`'s pod pings node `to`'s, over IPv4
/// and IPv6.
fn pods_ping(pods: &[Pod], pairs: &[(u8, u8)]) {
    for &(from, to) in pairs {
        let (a, b) = (&pods[usize::from(from) - 1], &pods[usize::from(to) - 1]);
        for v6 in [false, true] {
            assert!(
                ping(a, b, v6),
                "ping {:?} from node-{from}'s pod",
                b.address(v6)
            );
        }
    }
}

const VXLAN_DUAL_STACK: &str = r#"{"Network": "10.50.0.0/16", "SubnetMin": "10.50.1.0", "SubnetMax": "10.50.3.0",
    "EnableIPv6": true, "IPv6Network": "fd00:50::/48", "Backend": {"Type": "vxlan"}}"#;

#[test]
fn vxlan_nodes_lease_subnets_and_pods_ping_over_ipv4_and_ipv6() {
    if !can_run("vxlan_nodes_lease_subnets_and_pods_ping_over_ipv4_and_ipv6") {
        return;
    }
    let mut c = cluster(3);
    start(&mut c, &[]);
    // No config yet: every agent waits for it, saying so.
    for i in 1..=3 {
        c.wait_for_log(i, "does not exist yet", 1, WAIT).unwrap();
    }
    // Room for exactly three subnets: the three agents contend for them.
    block_on(c.set_config(VXLAN_DUAL_STACK)).unwrap();
    let (subnets, pods) = subnets_and_pods(&c);
    let v4: BTreeSet<String> = subnets.iter().map(|s| s.v4.to_string()).collect();
    assert_eq!(
        v4,
        ["10.50.1.0/24", "10.50.2.0/24", "10.50.3.0/24"]
            .map(String::from)
            .into(),
        "every node a subnet of its own"
    );

    // Leases as flannel writes them.
    let leases = leases(&c);
    assert_eq!(leases.len(), 3);
    for (i, s) in subnets.iter().enumerate() {
        let node = c.cluster.node(i as u8 + 1);
        let key = key_of(s);
        let (_, value) = leases
            .iter()
            .find(|(k, _)| key.ends_with(k.as_str()))
            .unwrap_or_else(|| panic!("{key} in {leases:?}"));
        assert_eq!(value["PublicIP"], node.underlay_v4());
        assert_eq!(value["PublicIPv6"], node.underlay_v6());
        assert_eq!(value["BackendType"], "vxlan");
        assert_eq!(value["BackendData"]["VNI"], 1);
        assert_eq!(value["BackendV6Data"]["VNI"], 1);
        assert!(value["BackendData"]["VtepMAC"].is_string(), "{value}");
    }

    // Every node routes to the others' subnets through flannel's devices.
    for (i, node) in c.cluster.nodes.iter().enumerate() {
        for (j, s) in subnets.iter().enumerate() {
            if i == j {
                continue;
            }
            let route = wait_route(&node.ns, &s.v4.to_string(), true).unwrap();
            let gateway = s.v4.network();
            assert!(
                route.contains(&format!("via {gateway} dev flannel.1 onlink")),
                "{route}"
            );
            let route = wait_route(&node.ns, &s.v6.unwrap().to_string(), true).unwrap();
            assert!(route.contains("dev flannel-v6.1 onlink"), "{route}");
        }
        let link = testbed::ip_json(&node.ns, &["-d", "link", "show", "flannel.1"]).unwrap();
        let vxlan = &link[0]["linkinfo"]["info_data"];
        assert_eq!(
            (vxlan["id"].as_u64(), vxlan["port"].as_u64()),
            (Some(1), Some(8472))
        );
        assert!(testbed::ip_json(&node.ns, &["link", "show", "flannel-v6.1"]).is_ok());
    }

    // Pod to pod, both ways, IPv4 and IPv6, through the tunnel.
    for (from, to) in [(1u8, 2u8), (2, 3), (3, 1)] {
        let (a, b) = (&pods[usize::from(from) - 1], &pods[usize::from(to) - 1]);
        for (v6, dev) in [(false, "flannel.1"), (true, "flannel-v6.1")] {
            let ns = &c.cluster.node(from).ns;
            let sent = tx_packets(ns, dev);
            assert!(
                ping(a, b, v6),
                "ping {:?} from node-{from}'s pod",
                b.address(v6)
            );
            assert!(
                tx_packets(ns, dev) >= sent + 3,
                "{dev} on node-{from} carried the pings"
            );
        }
    }

    // Nothing the agents sent is refused: no local block over the pods'
    // gateway address, say.
    for i in 1..=3 {
        let failing = dataplane_state(&c, i).failing_objects;
        assert!(failing.is_empty(), "node-{i}: {failing:?}");
    }

    // A node leaves: its agent stops (its lease stays until its TTL), then
    // its lease is deleted: every other node drops its routes.
    let status = c.stop_agent(3, libc::SIGTERM).unwrap();
    assert!(
        status.success(),
        "SIGTERM stops calc-flannel cleanly: {status}"
    );
    assert_eq!(
        self::leases(&c).len(),
        3,
        "the lease stays after a clean stop"
    );
    delete(&c, &key_of(&subnets[2]));
    for i in [1, 2] {
        let ns = &c.cluster.node(i).ns;
        wait_route(ns, &subnets[2].v4.to_string(), false);
        wait_route(ns, &subnets[2].v6.unwrap().to_string(), false);
    }
}

/// A cluster of `n` nodes on a kube-apiserver, each node with its Node
/// (podCIDRs 10.50.<i>.0/24 and fd00:50:0:<i>::/64), and the dual-stack
/// vxlan net-conf written: the flags every node's agent (calc-flannel or
/// flanneld) runs with.
fn kube_cluster(n: u8) -> (FlannelCluster, Vec<String>) {
    let mut c = cluster(n);
    let kube = c.start_kube_api().unwrap();
    for i in 1..=n {
        let node = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": format!("node-{i}")},
            "spec": {"podCIDRs": [format!("10.50.{i}.0/24"), format!("fd00:50:0:{i}::/64")]},
        });
        kube.kubectl_stdin(&["apply", "-f", "-"], &node.to_string())
            .unwrap();
    }
    let net_conf = c.cluster.dir.join("net-conf.json");
    std::fs::write(&net_conf, VXLAN_DUAL_STACK).unwrap();
    let args = [
        "--kube-subnet-mgr",
        "--kubeconfig-file",
        c.kubeconfig().to_str().unwrap(),
        "--net-config-path",
        net_conf.to_str().unwrap(),
        "--iface",
        "eth0",
    ]
    .map(String::from)
    .into();
    (c, args)
}

/// Node `i`'s Node's flannel annotation `name`.
fn annotation(c: &FlannelCluster, i: u8, name: &str) -> String {
    let path = format!("jsonpath={{.metadata.annotations.flannel\\.alpha\\.coreos\\.com/{name}}}");
    c.kube
        .as_ref()
        .expect("kube mode")
        .kubectl(&["get", "node", &format!("node-{i}"), "-o", &path])
        .unwrap()
}

/// Starts vxmgrd and calc-flannel (with `args`, as Node `node-<i>`) on
/// each of `nodes`.
fn start_kube_agents(c: &mut FlannelCluster, nodes: &[u8], args: &[String]) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for &i in nodes {
        c.cluster.node_mut(i).start_daemon(&[]).unwrap();
        c.start_agent(i, &args, &[("NODE_NAME", &format!("node-{i}"))])
            .unwrap();
    }
}

/// Asserts that node `i`'s subnets are its Node's podCIDRs.
fn assert_pod_cidrs(i: u8, s: &Subnets) {
    assert_eq!(
        s.v4.to_string(),
        format!("10.50.{i}.0/24"),
        "the Node's podCIDR"
    );
    assert_eq!(s.v6.unwrap().to_string(), format!("fd00:50:0:{i}::/64"));
}

#[test]
fn nodes_on_the_kube_api_route_pods_over_ipv4_and_ipv6() {
    let test = "nodes_on_the_kube_api_route_pods_over_ipv4_and_ipv6";
    if !can_run(test) || !kube_available(test) {
        return;
    }
    let (mut c, args) = kube_cluster(3);
    start_kube_agents(&mut c, &[1, 2, 3], &args);
    let (subnets, pods) = subnets_and_pods(&c);
    for (i, s) in (1..).zip(&subnets) {
        assert_pod_cidrs(i, s);
    }
    for i in 1..=3u8 {
        let node = c.cluster.node(i);
        assert_eq!(annotation(&c, i, "public-ip"), node.underlay_v4());
        assert_eq!(annotation(&c, i, "public-ipv6"), node.underlay_v6());
        assert_eq!(annotation(&c, i, "backend-type"), "vxlan");
    }

    // Pod to pod, IPv4 and IPv6, through the tunnels.
    pods_ping(&pods, &[(1, 2), (2, 3), (3, 1)]);

    // A Node deleted: the others drop its routes.
    let kube = c.kube.as_ref().unwrap();
    kube.kubectl(&["delete", "node", "node-3"]).unwrap();
    for i in [1, 2] {
        let ns = &c.cluster.node(i).ns;
        wait_route(ns, &subnets[2].v4.to_string(), false);
        wait_route(ns, &subnets[2].v6.unwrap().to_string(), false);
    }
}

/// The MAC address of link `dev` in `ns`.
fn link_mac(ns: &str, dev: &str) -> String {
    testbed::ip_json(ns, &["link", "show", dev]).unwrap()[0]["address"]
        .as_str()
        .expect("a MAC address")
        .to_string()
}

/// The `VtepMAC` in a backend-data annotation.
fn vtep_mac(backend_data: &str) -> String {
    let data: serde_json::Value = serde_json::from_str(backend_data)
        .unwrap_or_else(|e| panic!("backend data {backend_data:?}: {e}"));
    assert_eq!(data["VNI"], 1, "{backend_data}");
    data["VtepMAC"]
        .as_str()
        .unwrap_or_else(|| panic!("no VtepMAC in {backend_data}"))
        .to_string()
}

/// Whether `ns` has a permanent neighbour `address` → `mac` on `dev`.
fn has_neighbour(ns: &str, dev: &str, address: &str, mac: &str) -> bool {
    testbed::ip_json(ns, &["neigh", "show", "dev", dev])
        .unwrap()
        .as_array()
        .is_some_and(|all| {
            all.iter()
                .any(|n| n["dst"] == address && n["lladdr"] == mac)
        })
}

#[test]
fn flanneld_and_calc_flannel_nodes_share_one_kube_api_and_route_pods() {
    let test = "flanneld_and_calc_flannel_nodes_share_one_kube_api_and_route_pods";
    let Some(flanneld) = flanneld(test) else {
        return;
    };
    if !can_run(test) || !kube_available(test) {
        return;
    }
    // Node 1 runs flannel's own flanneld, which programs its kernel
    // itself; nodes 2 and 3 run calc-flannel and vxmgrd.
    let (mut c, args) = kube_cluster(3);
    let flanneld_args: Vec<&str> = args.iter().map(String::as_str).collect();
    c.start_flanneld(1, &flanneld, &flanneld_args, &[("NODE_NAME", "node-1")])
        .unwrap();
    start_kube_agents(&mut c, &[2, 3], &args);
    let (subnets, pods) = subnets_and_pods(&c);
    for (i, s) in (1..).zip(&subnets) {
        assert_pod_cidrs(i, s);
    }

    // Each side publishes its VTEPs the same way.
    let flannel_ns = c.cluster.node(1).ns.clone();
    for i in 1..=3u8 {
        let node = c.cluster.node(i);
        assert_eq!(annotation(&c, i, "public-ip"), node.underlay_v4());
        assert_eq!(annotation(&c, i, "public-ipv6"), node.underlay_v6());
        assert_eq!(annotation(&c, i, "backend-type"), "vxlan");
        assert_eq!(annotation(&c, i, "kube-subnet-manager"), "true");
        for (data, dev) in [
            ("backend-data", "flannel.1"),
            ("backend-v6-data", "flannel-v6.1"),
        ] {
            let mac = vtep_mac(&annotation(&c, i, data));
            assert_eq!(mac, link_mac(&node.ns, dev), "node-{i}'s {dev}");
        }
    }
    for dev in ["flannel.1", "flannel-v6.1"] {
        let link = testbed::ip_json(&flannel_ns, &["-d", "link", "show", dev]).unwrap();
        let vxlan = &link[0]["linkinfo"]["info_data"];
        assert_eq!(
            (vxlan["id"].as_u64(), vxlan["port"].as_u64()),
            (Some(1), Some(8472)),
            "flanneld's {dev}: the VNI and port of ours"
        );
    }

    // Our nodes read flanneld's Node: routes to its podCIDRs through its
    // VTEPs.
    let theirs = &subnets[0];
    for (v6, dev, data) in [
        (false, "flannel.1", "backend-data"),
        (true, "flannel-v6.1", "backend-v6-data"),
    ] {
        let net = if v6 { theirs.v6.unwrap() } else { theirs.v4 };
        let mac = vtep_mac(&annotation(&c, 1, data));
        for i in [2, 3] {
            let ns = &c.cluster.node(i).ns;
            let route = wait_route(ns, &net.to_string(), true).unwrap();
            let gateway = net.network();
            assert!(
                route.contains(&format!("via {gateway} dev {dev} onlink")),
                "node-{i}: {route}"
            );
            assert!(
                has_neighbour(ns, dev, &gateway.to_string(), &mac),
                "node-{i}: neighbour {gateway} → {mac} on {dev}"
            );
        }
    }
    // flanneld reads ours: its routes to our podCIDRs through flannel.1
    // (and flannel-v6.1), to our VTEPs' MACs.
    for i in [2u8, 3] {
        let ours = &subnets[usize::from(i) - 1];
        for (v6, dev, data) in [
            (false, "flannel.1", "backend-data"),
            (true, "flannel-v6.1", "backend-v6-data"),
        ] {
            let net = if v6 { ours.v6.unwrap() } else { ours.v4 };
            let gateway = net.network();
            let route = wait_any_route(&flannel_ns, &net.to_string(), true).unwrap();
            assert!(
                route.contains(&format!("via {gateway} dev {dev} onlink")),
                "flanneld's node: {route}"
            );
            let mac = vtep_mac(&annotation(&c, i, data));
            assert!(
                has_neighbour(&flannel_ns, dev, &gateway.to_string(), &mac),
                "flanneld's node: neighbour {gateway} → {mac} (node-{i}) on {dev}"
            );
        }
    }

    // Pods on flanneld's node and on ours ping each other, both ways, over
    // IPv4 and IPv6, through flanneld's tunnels.
    let sent = ["flannel.1", "flannel-v6.1"].map(|dev| tx_packets(&flannel_ns, dev));
    pods_ping(&pods, &[(1, 2), (2, 1), (1, 3), (3, 1)]);
    for (dev, before) in ["flannel.1", "flannel-v6.1"].into_iter().zip(sent) {
        assert!(
            tx_packets(&flannel_ns, dev) >= before + 12,
            "flanneld's {dev} carried the pings"
        );
    }
    for i in [2, 3] {
        let failing = dataplane_state(&c, i).failing_objects;
        assert!(failing.is_empty(), "node-{i}: {failing:?}");
    }

    // One of our Nodes deleted: flanneld drops its routes, and so does our
    // other node.
    c.kube
        .as_ref()
        .unwrap()
        .kubectl(&["delete", "node", "node-3"])
        .unwrap();
    for net in [subnets[2].v4, subnets[2].v6.unwrap()] {
        wait_any_route(&flannel_ns, &net.to_string(), false);
        wait_route(&c.cluster.node(2).ns, &net.to_string(), false);
    }
}

const VXLAN_V4: &str = r#"{"Network": "10.50.0.0/16", "Backend": {"Type": "vxlan"}}"#;

#[test]
fn an_expired_lease_goes_and_a_restarted_agent_keeps_its_subnet_and_every_route() {
    if !can_run("an_expired_lease_goes_and_a_restarted_agent_keeps_its_subnet_and_every_route") {
        return;
    }
    let mut c = cluster(3);
    block_on(c.set_config(VXLAN_V4)).unwrap();
    // Node 3's lease lives 4 s and is renewed 2 s before it would expire.
    start(
        &mut c,
        &[
            &[],
            &[],
            &[
                "--subnet-lease-ttl",
                "4s",
                "--subnet-lease-renew-margin",
                "2s",
            ],
        ],
    );
    let subnets = subnets(&c);
    for ns in [&c.cluster.node(1).ns, &c.cluster.node(2).ns] {
        wait_route(ns, &subnets[2].v4.to_string(), true);
    }
    // Renewed twice: the lease outlived its TTL because of that.
    c.wait_for_log(3, "lease renewed", 2, WAIT).unwrap();
    assert!(
        leases(&c)
            .iter()
            .any(|(k, _)| key_of(&subnets[2]).ends_with(k))
    );

    // Killed, it renews no more: the lease expires and its routes go.
    c.stop_agent(3, libc::SIGKILL).unwrap();
    for ns in [&c.cluster.node(1).ns, &c.cluster.node(2).ns] {
        wait_route(ns, &subnets[2].v4.to_string(), false);
    }

    // Node 1's agent restarts: the same subnet, and no route deleted anywhere.
    let (ns1, ns2) = (c.cluster.node(1).ns.clone(), c.cluster.node(2).ns.clone());
    let before = [all_routes(&ns1), all_routes(&ns2)];
    let mut monitors = [&ns1, &ns2].map(|ns| Monitor::start(ns, &["nexthop"]).unwrap());
    let status = c.stop_agent(1, libc::SIGTERM).unwrap();
    assert!(status.success(), "{status}");
    std::fs::remove_file(c.subnet_file(1)).unwrap();
    c.start_agent(1, &["--etcd-endpoints", ENDPOINT, "--iface", "eth0"], &[])
        .unwrap();
    assert_eq!(c.subnets(1, WAIT).unwrap(), subnets[0], "the same subnet");
    c.wait_for_log(1, "reusing this node's lease", 1, WAIT)
        .unwrap();
    // Its new stream is in sync (vxmgrd has swept what it did not declare).
    c.wait_for_log(1, "vxmgrd in sync", 2, WAIT).unwrap();
    for (monitor, ns) in monitors.iter_mut().zip([&ns1, &ns2]) {
        let deleted = routes_deleted(monitor);
        assert!(deleted.is_empty(), "{ns}: the restart deleted {deleted:#?}");
    }
    assert_eq!([all_routes(&ns1), all_routes(&ns2)], before);

    // Node 3 comes back after its lease expired: its subnet file names its
    // subnet, which is free, so it has it again (its pods keep their
    // addresses) and the others route to it again.
    c.start_agent(3, &["--etcd-endpoints", ENDPOINT, "--iface", "eth0"], &[])
        .unwrap();
    c.wait_for_log(3, "asking for the subnet this node had before", 1, WAIT)
        .unwrap();
    for ns in [&ns1, &ns2] {
        wait_route(ns, &subnets[2].v4.to_string(), true);
    }
    let own = key_of(&subnets[2]);
    let leases = leases(&c);
    let (_, value) = leases
        .iter()
        .find(|(k, _)| own.ends_with(k.as_str()))
        .unwrap_or_else(|| panic!("{own} in {leases:?}"));
    assert_eq!(value["PublicIP"], c.cluster.node(3).underlay_v4());
}

#[test]
fn an_etcd_outage_loses_nothing() {
    if !can_run("an_etcd_outage_loses_nothing") {
        return;
    }
    let mut c = cluster(2);
    block_on(c.set_config(VXLAN_V4)).unwrap();
    start(&mut c, &[]);
    let (subnets, pods) = subnets_and_pods(&c);
    let (ns1, ns2) = (c.cluster.node(1).ns.clone(), c.cluster.node(2).ns.clone());
    wait_route(&ns1, &subnets[1].v4.to_string(), true);
    wait_route(&ns2, &subnets[0].v4.to_string(), true);
    let before = [all_routes(&ns1), all_routes(&ns2)];

    c.etcd.stop().unwrap();
    for i in [1, 2] {
        c.wait_for_log(i, "etcd: etcd unreachable", 1, WAIT)
            .unwrap();
    }
    assert_eq!(
        [all_routes(&ns1), all_routes(&ns2)],
        before,
        "etcd down: the dataplane stays"
    );
    assert!(
        ping(&pods[0], &pods[1], false),
        "pods still reach each other"
    );

    c.etcd.start_again().unwrap();
    for i in [1, 2] {
        c.wait_for_log(i, "etcd: working again", 1, WAIT).unwrap();
    }
    // A node joining now is seen by both: the watches are back.
    put(
        &c,
        &format!("{PREFIX}/subnets/10.50.200.0-24"),
        r#"{"PublicIP":"192.168.10.200","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:c8"}}"#,
    );
    for ns in [&ns1, &ns2] {
        wait_route(ns, "10.50.200.0/24", true);
    }
    let after = [all_routes(&ns1), all_routes(&ns2)];
    for (b, a) in before.iter().zip(&after) {
        assert!(b.is_subset(a), "nothing lost: {b:#?} against {a:#?}");
    }
}

const HOST_GW_DUAL_STACK: &str = r#"{"Network": "10.50.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:50::/48",
    "Backend": {"Type": "host-gw"}}"#;

#[test]
fn host_gw_routes_pods_over_the_underlay_without_a_device() {
    if !can_run("host_gw_routes_pods_over_the_underlay_without_a_device") {
        return;
    }
    let mut c = cluster(3);
    block_on(c.set_config(HOST_GW_DUAL_STACK)).unwrap();
    start(&mut c, &[]);
    let (subnets, pods) = subnets_and_pods(&c);
    for (i, node) in c.cluster.nodes.iter().enumerate() {
        for (j, s) in subnets.iter().enumerate() {
            if i == j {
                continue;
            }
            let other = c.cluster.node(j as u8 + 1);
            let route = wait_route(&node.ns, &s.v4.to_string(), true).unwrap();
            assert!(
                route.contains(&format!("via {} dev eth0", other.underlay_v4())),
                "{route}"
            );
            let route = wait_route(&node.ns, &s.v6.unwrap().to_string(), true).unwrap();
            assert!(
                route.contains(&format!("via {} dev eth0", other.underlay_v6())),
                "{route}"
            );
        }
        for dev in ["flannel.1", "flannel-v6.1", "vxlan.calico"] {
            assert!(
                !testbed::try_in(&node.ns, &["ip", "link", "show", dev])
                    .unwrap()
                    .status
                    .success(),
                "{}: no {dev} in host-gw mode",
                node.name
            );
        }
    }
    pods_ping(&pods, &[(1, 2), (2, 3), (3, 1)]);

    // A node off this segment is reported, not routed; bad leases are
    // skipped with a warning naming them; every good route stays.
    let before = all_routes(&c.cluster.node(1).ns);
    let far = format!("{PREFIX}/subnets/10.50.201.0-24");
    put(
        &c,
        &far,
        r#"{"PublicIP":"172.31.0.9","PublicIPv6":null,"BackendType":"host-gw"}"#,
    );
    let garbage = format!("{PREFIX}/subnets/10.50.202.0-24");
    put(&c, &garbage, "{not json");
    put(&c, &key_of(&subnets[1]), r#"{"PublicIP":"not an address"}"#);
    let near = format!("{PREFIX}/subnets/10.50.203.0-24");
    put(
        &c,
        &near,
        &format!(r#"{{"PublicIP":"{ETCD_ADDRESS}","PublicIPv6":null,"BackendType":"host-gw"}}"#),
    );
    for i in 1..=3u8 {
        wait_route(&c.cluster.node(i).ns, "10.50.203.0/24", true);
        let log = c.agent_log(i);
        for (key, why) in [
            (
                "10.50.201.0-24",
                "host-gw needs every node on one L2 segment",
            ),
            ("10.50.202.0-24", "lease skipped"),
        ] {
            assert!(
                log.lines().any(|l| l.contains(key) && l.contains(why)),
                "node-{i}: no warning naming {key}:\n{log}"
            );
        }
    }
    let after = all_routes(&c.cluster.node(1).ns);
    assert!(
        before.is_subset(&after),
        "good routes kept: {before:#?} against {after:#?}"
    );
    assert!(!after.iter().any(|r| r.starts_with("10.50.201.0/24")));
    // vxmgrd reports the far node's route, unprogrammed, as waiting.
    let state = dataplane_state(&c, 1);
    let waiting = state.ipv4.expect("IPv4 state").waiting_routes;
    assert!(
        waiting
            .iter()
            .any(|w| w.dst == "10.50.201.0/24" && w.node == "10.50.201.0-24"),
        "GetState's waiting routes: {waiting:?}"
    );
    assert!(
        state.failing_objects.is_empty(),
        "{:?}",
        state.failing_objects
    );
}

/// A three-member etcd cluster's addresses on the underlay.
const ETCD_MEMBERS: [&str; 3] = ["192.168.10.241", "192.168.10.242", "192.168.10.243"];
/// How long each fault lasts: longer than the watch's keepalive (10 s
/// between pings, 5 s for the answer), so a cut-off watch is found dead.
const FAULT_HOLD: Duration = Duration::from_secs(20);
/// The agents' lease TTL and renewal margin in the fault tests: a renewal
/// every 5 s, so every fault sees some.
const SHORT_LEASE: [&str; 4] = [
    "--subnet-lease-ttl",
    "30s",
    "--subnet-lease-renew-margin",
    "25s",
];

#[derive(Clone, Copy, Debug)]
enum EtcdFault {
    /// SIGKILL the member most of the agents' watches are on.
    KillWatched,
    KillLeader,
    /// Cut the member most watches are on off the network.
    PartitionWatched,
    /// Cut node 1's agent off every member, write and compact past its
    /// watch's revision meanwhile.
    CompactWhileCutOff,
    /// SIGKILL two members of three (the watched one and one more): no
    /// quorum; the new lease is written as soon as the cluster takes
    /// writes again.
    QuorumLost,
}

/// One fault's figures, as docs/flannel.md tabulates them.
struct FaultFigures {
    fault: EtcdFault,
    /// From the new lease's write (or the end of node 1's cut-off, or the
    /// quorum back: a leader elected) to its route on every node.
    programmed: Duration,
    deleted: usize,
    /// Renewals each node's agent logged while the fault lasted.
    renewals: Vec<usize>,
}

fn renewals(c: &FlannelCluster, i: u8) -> usize {
    c.agent_log(i).matches("lease renewed").count()
}

/// The member most of the agents' watches are on, once all three watch.
fn watched_member(c: &FlannelCluster) -> usize {
    let etcd = c.etcd_cluster.as_ref().expect("the etcd cluster");
    let deadline = Instant::now() + WAIT;
    loop {
        let counts: Vec<u64> = (0..ETCD_MEMBERS.len())
            .map(|i| etcd.watchers(i).unwrap_or(0))
            .collect();
        if counts.iter().sum::<u64>() >= 3 {
            let most = counts.iter().max().expect("members");
            return counts.iter().position(|n| n == most).expect("a maximum");
        }
        assert!(
            Instant::now() < deadline,
            "three watches within {WAIT:?}: {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each node's pod pings the next one's over IPv4.
fn pods_ping_v4(pods: &[Pod]) {
    for (from, to) in [(0, 1), (1, 2), (2, 0)] {
        assert!(
            ping(&pods[from], &pods[to], false),
            "node-{}'s pod pings node-{}'s",
            from + 1,
            to + 1
        );
    }
}

/// VXLAN_V4 with the agents' subnets kept below 10.50.100.0/24, for tests
/// that write absent nodes' leases from there up: an absent node's lease
/// written over an agent's would take its subnet away.
const VXLAN_V4_AGENTS_BELOW_100: &str =
    r#"{"Network": "10.50.0.0/16", "SubnetMax": "10.50.99.0", "Backend": {"Type": "vxlan"}}"#;

/// A lease of a node that is not there (its route is all that counts), at
/// 10.50.`n`.0/24: `n` from 100 up, with [`VXLAN_V4_AGENTS_BELOW_100`].
fn absent_node_lease(n: u8) -> (String, String) {
    assert!(n >= 100, "absent nodes lease from 10.50.100.0/24 up");
    (
        format!("{PREFIX}/subnets/10.50.{n}.0-24"),
        format!(
            r#"{{"PublicIP":"192.168.10.{n}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"0e:00:00:00:00:{n:02x}"}}}}"#
        ),
    )
}

/// Writes `key` through member `i`, again while the cluster elects a
/// leader (etcd says "request timed out" meanwhile).
fn put_through(etcd: &EtcdCluster, i: usize, key: &str, value: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        match block_on(async { etcd.client(i).await?.put(key, value).await }) {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "writing {key}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `fault` on `c`'s etcd cluster for [`FAULT_HOLD`], writing a new
/// lease meanwhile; asserts the pods ping throughout, no route goes
/// anywhere, the lease is programmed and every agent renews its own.
fn etcd_fault(c: &mut FlannelCluster, pods: &[Pod], fault: EtcdFault, new: u8) -> FaultFigures {
    let nss: Vec<String> = c.cluster.nodes.iter().map(|n| n.ns.clone()).collect();
    let mut monitors: Vec<Monitor> = nss
        .iter()
        .map(|ns| Monitor::start(ns, &[]).unwrap())
        .collect();
    let before: Vec<usize> = (1..=3).map(|i| renewals(c, i)).collect();
    let watched = watched_member(c);
    let etcd = c.etcd_cluster.as_mut().expect("the etcd cluster");
    let leader = etcd.leader(watched).unwrap();
    let target = match fault {
        EtcdFault::KillWatched | EtcdFault::PartitionWatched => watched,
        EtcdFault::KillLeader => leader,
        EtcdFault::CompactWhileCutOff | EtcdFault::QuorumLost => watched,
    };
    // The second member a quorum loss kills.
    let also = (target + 1) % ETCD_MEMBERS.len();
    let started = Instant::now();
    match fault {
        EtcdFault::KillWatched | EtcdFault::KillLeader => {
            etcd.member(target).stop_with(libc::SIGKILL).unwrap()
        }
        EtcdFault::PartitionWatched => etcd.partition(target).unwrap(),
        EtcdFault::CompactWhileCutOff => {
            testbed::etcd_cluster::cut_off(&nss[0], "tcp sport 2379 drop", "tcp dport 2379 drop")
                .unwrap()
        }
        EtcdFault::QuorumLost => {
            etcd.member(target).stop_with(libc::SIGKILL).unwrap();
            etcd.member(also).stop_with(libc::SIGKILL).unwrap();
        }
    }
    // Written through a member that still has the quorum (after a quorum
    // loss: through the survivor, once the others are back).
    let writer = (also + 1) % ETCD_MEMBERS.len();
    let (key, value) = absent_node_lease(new);
    let mut written = Instant::now();
    if let EtcdFault::QuorumLost = fault {
        if let Some(rest) = FAULT_HOLD.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
        pods_ping_v4(pods);
        etcd.member(target).start_again().unwrap();
        etcd.member(also).start_again().unwrap();
        etcd.leader(writer).unwrap();
        written = Instant::now();
    }
    put_through(etcd, writer, &key, &value);
    if !matches!(fault, EtcdFault::QuorumLost) {
        written = Instant::now();
    }
    pods_ping_v4(pods);
    let dst = format!("10.50.{new}.0/24");
    let reachable: &[String] = match fault {
        EtcdFault::CompactWhileCutOff => &nss[1..],
        _ => &nss,
    };
    for ns in reachable {
        wait_route(ns, &dst, true);
    }
    let mut programmed = written.elapsed();
    if let EtcdFault::CompactWhileCutOff = fault {
        // History node 1's watch has not seen, compacted away.
        for n in 0..20 {
            put_through(etcd, writer, "/vxmgr-test/filler", &n.to_string());
        }
        let revision = etcd.status(writer).unwrap().revision;
        etcd.compact(writer, revision).unwrap();
    }
    if let Some(rest) = FAULT_HOLD.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    pods_ping_v4(pods);
    let during: Vec<usize> = (1..=3u8)
        .map(|i| renewals(c, i) - before[usize::from(i) - 1])
        .collect();
    let etcd = c.etcd_cluster.as_mut().expect("the etcd cluster");
    match fault {
        EtcdFault::KillWatched | EtcdFault::KillLeader => {
            etcd.member(target).start_again().unwrap()
        }
        EtcdFault::PartitionWatched => etcd.heal(target).unwrap(),
        EtcdFault::QuorumLost => {}
        EtcdFault::CompactWhileCutOff => {
            testbed::etcd_cluster::heal(&nss[0]).unwrap();
            let healed = Instant::now();
            wait_route(&nss[0], &dst, true);
            programmed = healed.elapsed();
        }
    }
    for (i, n) in (1u8..).zip(&during) {
        if matches!(
            (fault, i),
            (EtcdFault::CompactWhileCutOff, 1) | (EtcdFault::QuorumLost, _)
        ) {
            // Cut off, or without a quorum, it could not; it does once
            // back, before the lease (30 s) expires.
            c.wait_for_log(1, "lease renewed", renewals(c, 1) + 1, WAIT)
                .unwrap();
            continue;
        }
        assert!(
            *n >= 1,
            "{fault:?}: node-{i}'s agent renewed its lease during the fault:\n{}",
            c.agent_log(i)
        );
    }
    let mut deleted = 0;
    for (monitor, ns) in monitors.iter_mut().zip(&nss) {
        let gone = routes_deleted(monitor);
        assert!(gone.is_empty(), "{fault:?}: {ns} lost {gone:#?}");
        deleted += gone.len();
    }
    FaultFigures {
        fault,
        programmed,
        deleted,
        renewals: during,
    }
}

#[test]
fn etcd_cluster_faults_delete_no_route_and_changes_made_meanwhile_are_programmed() {
    let test = "etcd_cluster_faults_delete_no_route_and_changes_made_meanwhile_are_programmed";
    if !can_run(test) || !support::flannel::tool_available(test, "etcdctl") {
        return;
    }
    let mut c = cluster(3);
    let endpoints = block_on(c.start_etcd_cluster(&ETCD_MEMBERS, VXLAN_V4_AGENTS_BELOW_100))
        .unwrap()
        .endpoints();
    for node in &mut c.cluster.nodes {
        node.start_daemon(&[]).unwrap();
    }
    for i in 1..=3 {
        let mut args = vec!["--etcd-endpoints", &endpoints, "--iface", "eth0"];
        args.extend(SHORT_LEASE);
        c.start_agent(i, &args, &[]).unwrap();
    }
    let (subnets, pods) = subnets_and_pods(&c);
    for (i, node) in c.cluster.nodes.iter().enumerate() {
        for (j, s) in subnets.iter().enumerate() {
            if i != j {
                wait_route(&node.ns, &s.v4.to_string(), true);
            }
        }
    }
    pods_ping_v4(&pods);

    let faults = [
        EtcdFault::KillWatched,
        EtcdFault::KillLeader,
        EtcdFault::PartitionWatched,
        EtcdFault::CompactWhileCutOff,
        EtcdFault::QuorumLost,
    ];
    let mut table = vec![
        "| fault | new lease programmed after | routes deleted | renewals seen (node 1, 2, 3) |"
            .to_string(),
        "|---|---|---|---|".to_string(),
    ];
    for (fault, new) in faults.into_iter().zip(201u8..) {
        let f = etcd_fault(&mut c, &pods, fault, new);
        table.push(format!(
            "| {:?} | {:.1} s | {} | {:?} |",
            f.fault,
            f.programmed.as_secs_f64(),
            f.deleted,
            f.renewals
        ));
    }
    support::say(&table.join("\n"));
    // Every lease written during the faults, on every node, and nothing
    // fatal said.
    for node in &c.cluster.nodes {
        for new in 201..206 {
            wait_route(&node.ns, &format!("10.50.{new}.0/24"), true);
        }
    }
    for i in 1..=3 {
        let log = c.agent_log(i);
        let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
        assert!(errors.is_empty(), "node-{i}: {errors:#?}");
    }
}

/// Kills in the crash loop under `cargo test`; VXMGR_CRASH_KILLS asks for
/// more, VXMGR_CRASH_SEED replays a run.
const CRASH_KILLS: usize = 50;
/// Absent nodes whose leases the crash loop rewrites in bursts.
const BURST_NODES: std::ops::Range<u8> = 100..116;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KillMoment {
    /// Right after start: reading the config, acquiring the lease.
    Acquiring,
    /// Between renewals (every 2 s) or in one.
    Renewing,
    /// While a burst of lease changes streams through the watch.
    WatchBurst,
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|e| panic!("{name}={value:?}: {e}")),
    )
}

/// The burst leases, their MACs shifted by `round`: changes the watch
/// carries (neighbour and FDB entries), no route changes.
fn burst(round: u8) -> Vec<(String, String)> {
    BURST_NODES
        .map(|n| {
            let (key, value) = absent_node_lease(n);
            let mac = format!("0e:00:00:00:{round:02x}:{n:02x}");
            (key, value.replace(&format!("0e:00:00:00:00:{n:02x}"), &mac))
        })
        .collect()
}

/// Every lease is one node's and every subnet one lease's; node 1's is
/// `own`.
fn assert_leases_unique(c: &FlannelCluster, own: &Subnets) {
    let leases = leases(c);
    let mut ips = BTreeSet::new();
    let mut v4 = BTreeSet::new();
    for (key, value) in &leases {
        let ip = value["PublicIP"].as_str().unwrap_or_default().to_string();
        assert!(ips.insert(ip.clone()), "two leases of {ip}: {leases:#?}");
        let subnet = key.split('&').next().unwrap_or(key).to_string();
        assert!(
            v4.insert(subnet.clone()),
            "{subnet} leased twice: {leases:#?}"
        );
    }
    let own_key = key_of(own);
    let (_, value) = leases
        .iter()
        .find(|(k, _)| own_key.ends_with(k.as_str()))
        .unwrap_or_else(|| panic!("node-1 holds {own_key}: {leases:#?}"));
    assert_eq!(value["PublicIP"], c.cluster.node(1).underlay_v4());
}

#[test]
fn calc_flannel_killed_at_random_moments_keeps_its_subnet_and_every_route() {
    let test = "calc_flannel_killed_at_random_moments_keeps_its_subnet_and_every_route";
    if !can_run(test) {
        return;
    }
    let seed = env_number("VXMGR_CRASH_SEED").unwrap_or_else(|| fastrand::u64(..));
    let kills = env_number("VXMGR_CRASH_KILLS").map_or(CRASH_KILLS, |n| n as usize);
    support::say(&format!(
        "{test}: {kills} kills, seed {seed} (VXMGR_CRASH_SEED={seed} replays it)"
    ));
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut c = cluster(3);
    block_on(c.set_config(VXLAN_V4_AGENTS_BELOW_100)).unwrap();
    // Renewed every 2 s: kills land in renewals too.
    let agent = [
        "--etcd-endpoints",
        ENDPOINT,
        "--iface",
        "eth0",
        "--subnet-lease-ttl",
        "10s",
        "--subnet-lease-renew-margin",
        "8s",
    ];
    start(&mut c, &[&agent[2..], &agent[2..], &agent[2..]]);
    let subnets = subnets(&c);
    block_on(async { c.etcd.client().await?.put_all(&burst(0)).await }).unwrap();
    let mut expected: Vec<String> = subnets.iter().map(|s| s.v4.to_string()).collect();
    expected.extend(BURST_NODES.map(|n| format!("10.50.{n}.0/24")));
    for (i, node) in c.cluster.nodes.iter().enumerate() {
        for dst in expected.iter().filter(|d| **d != subnets[i].v4.to_string()) {
            wait_route(&node.ns, dst, true);
        }
    }
    let nss: Vec<String> = c.cluster.nodes.iter().map(|n| n.ns.clone()).collect();
    let mut monitors: Vec<Monitor> = nss
        .iter()
        .map(|ns| Monitor::start(ns, &[]).unwrap())
        .collect();

    let started = Instant::now();
    let mut moments = Vec::new();
    for kill in 0..kills {
        let moment = [
            KillMoment::Acquiring,
            KillMoment::Renewing,
            KillMoment::WatchBurst,
        ][rng.usize(..3)];
        let with_vxmgrd = rng.bool();
        moments.push((moment, with_vxmgrd));
        match moment {
            KillMoment::Acquiring => {
                std::thread::sleep(Duration::from_millis(rng.u64(0..300)));
                c.stop_agent(1, libc::SIGKILL).unwrap();
            }
            KillMoment::Renewing => {
                std::thread::sleep(Duration::from_millis(rng.u64(1000..5000)));
                c.stop_agent(1, libc::SIGKILL).unwrap();
            }
            KillMoment::WatchBurst => {
                let delay = Duration::from_millis(rng.u64(0..150));
                let round = (kill % 200) as u8 + 1;
                block_on(async {
                    let mut client = c.etcd.client().await.unwrap();
                    let writes = async {
                        for r in 0..5 {
                            client.put_all(&burst(round.wrapping_add(r))).await.unwrap();
                        }
                    };
                    let killing = async {
                        tokio::time::sleep(delay).await;
                        c.stop_agent(1, libc::SIGKILL).unwrap();
                    };
                    tokio::join!(writes, killing);
                });
            }
        }
        if with_vxmgrd {
            let node = c.cluster.node_mut(1);
            node.stop_daemon(libc::SIGKILL).unwrap();
            node.start_daemon(&[]).unwrap();
        }
        let in_sync = c.agent_log(1).matches("vxmgrd in sync").count();
        c.start_agent(1, &agent, &[]).unwrap();
        c.wait_for_log(1, "vxmgrd in sync", in_sync + 1, WAIT)
            .unwrap_or_else(|e| panic!("kill {kill} ({moment:?}, seed {seed}): {e}"));
        let held = c.subnets(1, WAIT).unwrap();
        assert_eq!(held, subnets[0], "kill {kill} ({moment:?}, seed {seed})");
        assert_leases_unique(&c, &subnets[0]);
    }
    let elapsed = started.elapsed();
    for (monitor, ns) in monitors.iter_mut().zip(&nss) {
        let gone = routes_deleted(monitor);
        assert!(gone.is_empty(), "seed {seed}: {ns} lost {gone:#?}");
    }
    for (i, node) in c.cluster.nodes.iter().enumerate() {
        for dst in expected.iter().filter(|d| **d != subnets[i].v4.to_string()) {
            wait_route(&node.ns, dst, true);
        }
    }
    let count = |m: KillMoment| moments.iter().filter(|(k, _)| *k == m).count();
    support::say(&format!(
        "{test}: {kills} kills in {:.1} s (seed {seed}): {} acquiring, {} renewing, {} in a watch burst; vxmgrd killed too {} times; 0 routes deleted",
        elapsed.as_secs_f64(),
        count(KillMoment::Acquiring),
        count(KillMoment::Renewing),
        count(KillMoment::WatchBurst),
        moments.iter().filter(|(_, v)| *v).count()
    ));
}

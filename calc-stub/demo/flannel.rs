//! `calc-stub demo --flannel`: the demo's two nodes driven by etcd and
//! calc-flannel instead of replayed views: each node leases a subnet, the
//! leases become routes on the other node, a pod made on each node through
//! the CNI plugins (as a container runtime would) pings the other.

use std::path::Path;
use std::time::Duration;

use crate::testbed::{self, FlannelCluster, Pod};

use super::{DemoArgs, binaries, ping_pod, show, step};
use crate::StubError;

const VXLAN: &str = r#"{"Network": "10.50.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:50::/48", "Backend": {"Type": "vxlan"}}"#;
const HOST_GW: &str = r#"{"Network": "10.50.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:50::/48", "Backend": {"Type": "host-gw"}}"#;
const WAIT: Duration = Duration::from_secs(30);

fn address(pod: &Pod, v6: bool) -> String {
    pod.address(v6).map(|a| a.to_string()).unwrap_or_default()
}

/// Runs `future` to its end from this synchronous code on calc-stub's runtime.
fn block_on<T>(future: impl Future<Output = T>) -> T {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| runtime.block_on(future))
}

pub fn run(args: &DemoArgs) -> Result<bool, StubError> {
    if !testbed::etcd::available() {
        return Err(StubError::Other(
            "the flannel demo needs etcd: apt-get install etcd-server".into(),
        ));
    }
    let binaries = binaries()?;
    let calc_flannel = binaries.calc_stub.with_file_name("calc-flannel");
    for binary in [&calc_flannel, &binaries.calc_stub.with_file_name("flannel")] {
        if !binary.exists() {
            return Err(StubError::Other(format!(
                "{} not found: build every binary (cargo build --release)",
                binary.display()
            )));
        }
    }
    if !testbed::cni::system_plugins_installed() {
        return Err(StubError::Other(format!(
            "the flannel demo makes its pods with the CNI plugins in {}: apt-get install containernetworking-plugins",
            testbed::cni::SYSTEM_PLUGINS
        )));
    }
    let config = if args.host_gw { HOST_GW } else { VXLAN };
    step("building two nodes in network namespaces, etcd on the underlay at 192.168.10.254");
    let mut c = FlannelCluster::new("vxdemo", 2, &binaries, &calc_flannel)?;
    println!("  network config: {config}");
    block_on(c.set_config(config))?;

    step("starting vxmgrd and calc-flannel on each node");
    for node in &mut c.cluster.nodes {
        node.start_daemon(&[])?;
    }
    for index in [1, 2] {
        c.start_agent(
            index,
            &[
                "--etcd-endpoints",
                "http://192.168.10.254:2379",
                "--iface",
                "eth0",
            ],
            &[],
        )?;
    }
    step(
        "a pod on each node through the CNI plugins (flannel's conflist: flannel -> bridge + host-local, portmap)",
    );
    let plugin_dir = binaries.calc_stub.parent().unwrap_or(Path::new("."));
    let mut pods = Vec::new();
    for (index, node) in (1u8..).zip(&c.cluster.nodes) {
        let s = c.subnets(index, WAIT)?;
        let network = c.pod_network(index, plugin_dir);
        let pod = network.add()?;
        println!(
            "  {}: leased {} and {}; pod {} got {} and {}",
            node.name,
            s.v4,
            s.v6.map(|n| n.to_string()).unwrap_or_default(),
            pod.ns,
            address(&pod, false),
            address(&pod, true)
        );
        pods.push((network, pod, s));
    }
    for command in ["ip addr show dev eth0", "ip route", "ip -6 route"] {
        show(&pods[0].1.ns, command)?;
    }
    let leases = block_on(async {
        c.etcd
            .client()
            .await?
            .list("/coreos.com/network/subnets/")
            .await
    })?;
    step("the leases in etcd, as flannel writes them");
    for (key, value) in leases {
        println!("  {key}\n    {value}");
    }
    let other = pods[1].2.v4.to_string();
    let a = c.cluster.node(1);
    let deadline = std::time::Instant::now() + WAIT;
    while !testbed::census::routes(&a.ns, vxmgr::model::Family::V4)?
        .iter()
        .any(|r| r.starts_with(&other))
    {
        if std::time::Instant::now() > deadline {
            return Err(StubError::Other(format!(
                "{}: no route to {other} within {WAIT:?}:\n{}",
                a.name,
                c.agent_log(1)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    step(&format!("kernel state vxmgr programmed on {}", a.name));
    let mut commands = vec![
        "ip route show proto 80",
        "ip -6 route show proto 80",
        "ip addr show dev cni0",
        "bridge link",
    ];
    if !args.host_gw {
        commands.splice(
            0..0,
            ["ip -d link show flannel.1", "ip addr show dev flannel.1"],
        );
        commands.extend([
            "ip nexthop show proto 80",
            "ip neigh show dev flannel.1",
            "bridge fdb show dev flannel.1",
        ]);
    }
    for command in commands {
        show(&a.ns, command)?;
    }

    step(&format!(
        "ping from {}'s pod to {}'s pod",
        a.name,
        c.cluster.node(2).name
    ));
    let mut all_ok = true;
    for v6 in [false, true] {
        let device = if v6 { "flannel-v6.1" } else { "flannel.1" };
        // host-gw has no device: the pings go over the underlay.
        let tunnel = (!args.host_gw).then_some((device, true));
        let (from, to) = (&pods[0].1, &pods[1].1);
        let Some(target) = to.address(v6) else {
            println!("  {}: no address of this family: UNREACHABLE", to.ns);
            all_ok = false;
            continue;
        };
        let target = target.to_string();
        all_ok &= ping_pod(&a.ns, &from.ns, from.address(v6), &target, tunnel)?;
    }
    if !all_ok {
        eprintln!(
            "calc-stub demo --flannel: FAILED: a pod was unreachable or its packets took the wrong path"
        );
    }

    if args.keep {
        let ns = a.ns.clone();
        c.keep();
        // Their namespaces stay too.
        std::mem::forget(pods);
        step("kept running; look around, then clean up");
        println!("  sudo ip netns exec {ns} ip route");
        println!(
            "  logs: {}/node-*.log, {}/etcd/etcd.log",
            c.cluster.dir.display(),
            c.cluster.dir.display()
        );
        println!(
            "  clean up: stop the vxmgrd, calc-flannel and etcd processes started for {}, then: for ns in $(ip netns list | grep -o '^{}[^ ]*'); do sudo ip netns del $ns; done",
            c.cluster.dir.display(),
            c.cluster.prefix
        );
    } else {
        step("deleting the pods through the CNI plugins, tearing down");
        for (network, pod, _) in pods {
            network.del(pod)?;
        }
    }
    Ok(all_ok)
}

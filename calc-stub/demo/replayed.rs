//! The demo on replayed views: calc-stub feeds each node's vxmgrd its view
//! of a two-node cluster, and pods ping over VXLAN (IPv4 and IPv6), or over
//! the underlay with --same-subnet.

use super::{DemoArgs, binaries, ping_pod, show, step};
use crate::StubError;
use crate::testbed::{self, Cluster};

pub fn run(args: &DemoArgs) -> Result<bool, StubError> {
    step("building two nodes in network namespaces (underlay 192.168.10.0/24, fd00:10::/64)");
    let mut cluster = Cluster::new("vxdemo", 2, &binaries()?)?;
    for node in &cluster.nodes {
        println!(
            "  {}: namespace {}, eth0 {} {}, pod {} {} in {}",
            node.name,
            node.ns,
            node.underlay_v4(),
            node.underlay_v6(),
            node.pod_v4(),
            node.pod_v6(),
            node.pod_ns()
        );
    }
    step(
        "starting vxmgrd on each node and replaying its view of the cluster (with masquerading IP pools) with calc-stub",
    );
    let pools = [
        testbed::pool("default-ipv4-ippool", "10.244.0.0/16", true),
        testbed::pool("default-ipv6-ippool", "fd00:244::/48", true),
    ];
    // These namespaces hold no iptables rules, on which Felix's detection
    // (and vxmgrd's auto) picks legacy: ask for the nft backend, which
    // `iptables-nft` shows.
    let flags = ["--iptables-backend", "nft"];
    cluster.start_all_with_pools(&flags, args.same_subnet, &pools)?;
    for node in &cluster.nodes {
        println!("  {}: every batch OK", node.name);
    }

    let (a, b) = (cluster.node(1), cluster.node(2));
    step(&format!("kernel state vxmgr programmed on {}", a.name));
    for command in [
        "ip -d link show vxlan.calico",
        "ip addr show dev vxlan.calico",
        "ip route show proto 80",
        "ip -6 route show proto 80",
        "ip nexthop show proto 80",
        "ip neigh show dev vxlan.calico",
        "bridge fdb show dev vxlan.calico",
        "ipset list cali40all-vxlan-net",
        "nft list table inet vxmgr",
        "iptables-nft -S VXMGR-FORWARD",
        "iptables-nft -S FORWARD",
    ] {
        show(&a.ns, command)?;
    }

    step(&format!("ping from {}'s pod to {}'s pod", a.name, b.name));
    // A ping answered over the wrong path proves nothing about vxmgr: each
    // echo request goes through the tunnel, or (same subnet) none.
    let through = !args.same_subnet;
    let mut all_ok = true;
    for (dev, target) in [
        ("vxlan.calico", b.pod_v4()),
        ("vxlan-v6.calico", b.pod_v6()),
    ] {
        all_ok &= ping_pod(&a.ns, &a.pod_ns(), None, &target, Some((dev, through)))?;
    }

    if args.keep {
        cluster.keep();
        step("kept running; look around, then clean up (as root)");
        let n = &cluster.nodes;
        println!("  ip netns exec {} ip route", n[0].ns);
        println!(
            "  grpcurl -plaintext -unix {} vxmgr.v1.Dataplane/GetState",
            n[0].socket.display()
        );
        println!("  logs: {}/node-*.log", cluster.dir.display());
        println!(
            "  clean up: pkill -f 'vxmgrd --socket {}'; for ns in $(ip netns list | grep -o '^{}[^ ]*'); do ip netns del $ns; done",
            cluster.dir.display(),
            cluster.prefix
        );
    } else {
        step("tearing down");
    }
    if !all_ok {
        eprintln!(
            "calc-stub demo: FAILED: a pod was unreachable or its packets took the wrong path"
        );
    }
    Ok(all_ok)
}

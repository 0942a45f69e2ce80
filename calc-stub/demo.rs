//! `calc-stub demo`: two nodes in network namespaces, vxmgrd on each fed
//! its view of the cluster, pod-to-pod ping over VXLAN (IPv4 and IPv6), the
//! kernel state vxmgr programmed, and a clean teardown.

use std::net::IpAddr;
use std::path::PathBuf;

use crate::StubError;
use crate::testbed::{self, Binaries, Cluster, TestbedError};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Leave the cluster running and print how to look at it.
    #[arg(long)]
    pub keep: bool,
    /// Route remote blocks directly over the underlay (no encapsulation).
    #[arg(long, conflicts_with = "flannel")]
    same_subnet: bool,
    /// Drive the nodes with etcd and calc-flannel (flannel mode, vxlan)
    /// instead of replayed views.
    #[arg(long)]
    flannel: bool,
    /// With --flannel: the host-gw backend (routes over the underlay, no
    /// VXLAN device).
    #[arg(long, requires = "flannel")]
    pub host_gw: bool,
}

impl From<TestbedError> for StubError {
    fn from(e: TestbedError) -> Self {
        StubError::Other(e.to_string())
    }
}

pub fn binaries() -> Result<Binaries, StubError> {
    let calc_stub = std::env::current_exe()
        .map_err(|e| StubError::Other(format!("finding calc-stub's own path: {e}")))?;
    let vxmgrd: PathBuf = calc_stub.with_file_name("vxmgrd");
    if !vxmgrd.exists() {
        return Err(StubError::Other(format!(
            "{} not found: build both binaries (cargo build --release)",
            vxmgrd.display()
        )));
    }
    Ok(Binaries { vxmgrd, calc_stub })
}

/// Echo requests per address family.
const PINGS: u64 = 3;

pub fn step(text: &str) {
    println!("\n==> {text}");
}

/// Runs a command in a namespace and prints it with its output.
pub fn show(ns: &str, command: &str) -> Result<(), StubError> {
    println!("$ {command}");
    print!("{}", testbed::sh(ns, command)?);
    Ok(())
}

/// Pings `target` from the pod in namespace `pod_ns` on the node in
/// `node_ns` (from `source`, if given); with `tunnel`, counts the packets
/// through that device of the node, which should be every echo request
/// (`true`) or none. Prints the verdict; true when it holds.
pub fn ping_pod(
    node_ns: &str,
    pod_ns: &str,
    source: Option<IpAddr>,
    target: &str,
    tunnel: Option<(&str, bool)>,
) -> Result<bool, StubError> {
    let before = tunnel
        .map(|(dev, _)| tunnel_packets(node_ns, dev))
        .transpose()?;
    let family = if target.contains(':') { "-6" } else { "-4" };
    let source = source.map(|s| s.to_string());
    let count = PINGS.to_string();
    let mut args = vec!["ping", family, "-c", &count, "-i", "0.2", "-W", "2"];
    if let Some(source) = &source {
        args.extend(["-I", source]);
    }
    args.push(target);
    let reachable = testbed::try_in(pod_ns, &args)?.status.success();
    let mut path = String::new();
    let mut path_ok = true;
    if let (Some((dev, through)), Some(before)) = (tunnel, before) {
        let sent = tunnel_packets(node_ns, dev)?.saturating_sub(before);
        path_ok = if through { sent >= PINGS } else { sent < PINGS };
        path = format!(" ({sent} packets through {dev})");
        if !path_ok {
            path += if through {
                "; expected every echo request to go through the tunnel"
            } else {
                "; expected them to go over the underlay"
            };
        }
    }
    println!(
        "  {target}: {}{path}",
        if reachable {
            "reachable"
        } else {
            "UNREACHABLE"
        }
    );
    Ok(reachable && path_ok)
}

fn tunnel_packets(ns: &str, dev: &str) -> Result<u64, StubError> {
    let link = testbed::ip_json(ns, &["-s", "link", "show", dev])?;
    Ok(link[0]["stats64"]["tx"]["packets"].as_u64().unwrap_or(0))
}

pub fn run(args: DemoArgs) -> Result<bool, StubError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(StubError::Other(
            "the demo needs root for network namespaces: run it as root (sudo scripts/demo, or scripts/demo in a root shell)".into(),
        ));
    }
    if args.flannel {
        return crate::flannel_demo::run(&args);
    }
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

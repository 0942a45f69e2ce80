//! `calc-stub demo`: two nodes in network namespaces, vxmgrd on each fed
//! its view of the cluster, pod-to-pod ping over VXLAN (IPv4 and IPv6), the
//! kernel state vxmgr programmed, and a clean teardown.

use std::path::PathBuf;

use crate::StubError;
use crate::testbed::{self, Binaries, Cluster, TestbedError};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Leave the cluster running and print how to look at it.
    #[arg(long)]
    keep: bool,
    /// Route remote blocks directly over the underlay (no encapsulation).
    #[arg(long)]
    same_subnet: bool,
}

impl From<TestbedError> for StubError {
    fn from(e: TestbedError) -> Self {
        StubError::Other(e.to_string())
    }
}

fn binaries() -> Result<Binaries, StubError> {
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

fn step(text: &str) {
    println!("\n==> {text}");
}

/// Runs a command in a namespace and prints it with its output.
fn show(ns: &str, command: &str) -> Result<(), StubError> {
    println!("$ {command}");
    print!("{}", testbed::sh(ns, command)?);
    Ok(())
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
    step("starting vxmgrd on each node and replaying its view of the cluster with calc-stub");
    cluster.start_all(&[], args.same_subnet)?;
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
    ] {
        show(&a.ns, command)?;
    }

    step(&format!("ping from {}'s pod to {}'s pod", a.name, b.name));
    let mut all_ok = true;
    for (dev, target, flag) in [
        ("vxlan.calico", b.pod_v4(), "-4"),
        ("vxlan-v6.calico", b.pod_v6(), "-6"),
    ] {
        let before = tunnel_packets(&a.ns, dev)?;
        let ping = testbed::try_in(
            &a.pod_ns(),
            &[
                "ping",
                flag,
                "-c",
                &PINGS.to_string(),
                "-i",
                "0.2",
                "-W",
                "2",
                &target,
            ],
        )?;
        let sent = tunnel_packets(&a.ns, dev)?.saturating_sub(before);
        let reachable = ping.status.success();
        // A ping answered over the wrong path proves nothing about vxmgr:
        // each echo request goes through the tunnel, or (same subnet) none.
        let path_ok = if args.same_subnet {
            sent < PINGS
        } else {
            sent >= PINGS
        };
        all_ok &= reachable && path_ok;
        println!(
            "  {target}: {} ({sent} packets through {dev}{})",
            if reachable {
                "reachable"
            } else {
                "UNREACHABLE"
            },
            match (path_ok, args.same_subnet) {
                (true, _) => "",
                (false, false) => "; expected every echo request to go through the tunnel",
                (false, true) => "; expected them to go over the underlay",
            }
        );
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

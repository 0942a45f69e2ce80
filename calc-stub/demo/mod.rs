//! `calc-stub demo`: two or more nodes in network namespaces with vxmgrd on
//! each, pods pinging each other, the kernel state vxmgr programmed, and a
//! clean teardown. The nodes get their views replayed by calc-stub
//! (`replayed.rs`) or from calc-flannel on etcd (`flannel.rs`); what both
//! show and check is here.

mod flannel;
mod replayed;

use std::net::IpAddr;
use std::path::PathBuf;

use crate::StubError;
use crate::testbed::{self, Binaries, TestbedError};

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
        flannel::run(&args)
    } else {
        replayed::run(&args)
    }
}

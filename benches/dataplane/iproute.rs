//! The baseline: node-0's state built with iproute2 batch files and `ipset
//! restore`, the fastest way a shell-driven agent could do it.

use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::cluster::View;
use crate::netns::{Netns, PARENT_IP, UNDERLAY, run};

/// How remote blocks reach their node's VTEP.
#[derive(Clone, Copy, Debug)]
pub enum Routing {
    /// `nexthop add id K via <tunnel ip>` per node, routes `nhid K`.
    Nexthops,
    /// Routes `via <tunnel ip> dev vxlan.calico onlink`.
    Inline,
}

const DEVICE: &str = "vxlan.calico";
/// The underlay veth's MTU (1500) minus VXLAN's 50 bytes, as vxmgrd sets it.
const DEVICE_MTU: u32 = 1450;
const PROTOCOL: u8 = 80;
const IPSET_V4: &str = "cali40all-vxlan-net";
const IPSET_V6: &str = "cali60all-vxlan-net";

/// The batch files of one build.
pub struct Scripts {
    ip: PathBuf,
    fdb: PathBuf,
    ipset: PathBuf,
}

impl Scripts {
    /// Writes the files for `view` into `dir` (not timed).
    pub fn write(dir: &Path, view: &View, routing: Routing) -> Result<Scripts> {
        let scripts = Scripts {
            ip: dir.join(format!("ip-{routing:?}.batch")),
            fdb: dir.join("bridge.batch"),
            ipset: dir.join("ipset.restore"),
        };
        std::fs::write(&scripts.ip, ip_batch(view, routing))?;
        std::fs::write(&scripts.fdb, bridge_batch(view))?;
        std::fs::write(&scripts.ipset, ipset_restore(view))?;
        Ok(scripts)
    }

    /// Runs every file in `netns`; the wall time of the whole build.
    pub fn run(&self, netns: &Netns) -> Result<Duration> {
        let started = Instant::now();
        run(Command::new("ip")
            .args(["-n", netns.name(), "-batch"])
            .arg(&self.ip))?;
        run(Command::new("bridge")
            .args(["-n", netns.name(), "-batch"])
            .arg(&self.fdb))?;
        run(netns
            .command("ipset")
            .arg("restore")
            .stdin(File::open(&self.ipset)?))?;
        Ok(started.elapsed())
    }
}

/// The device, its address, neighbours, nexthops and routes.
fn ip_batch(view: &View, routing: Routing) -> String {
    let mut s = String::new();
    let local = &view.local;
    let _ = writeln!(
        s,
        "link add {DEVICE} address {} mtu {DEVICE_MTU} type vxlan id 4096 dstport 4789 \
         local {PARENT_IP} dev {UNDERLAY} nolearning udpcsum",
        local.mac
    );
    let _ = writeln!(s, "addr add {}/32 dev {DEVICE}", local.tunnel);
    let _ = writeln!(s, "link set {DEVICE} up");
    let remotes = view
        .remotes
        .iter()
        .filter_map(|r| Some((r.vtep.as_ref()?, r)));
    for (id, (vtep, remote)) in (1..).zip(remotes) {
        let tunnel = &vtep.tunnel;
        let _ = writeln!(
            s,
            "neigh add {tunnel} lladdr {} dev {DEVICE} nud permanent",
            vtep.mac
        );
        let via = match routing {
            Routing::Nexthops => {
                let _ = writeln!(
                    s,
                    "nexthop add id {id} via {tunnel} dev {DEVICE} onlink proto {PROTOCOL}"
                );
                format!("nhid {id}")
            }
            Routing::Inline => format!("via {tunnel} dev {DEVICE} onlink"),
        };
        for block in &remote.blocks {
            let _ = writeln!(
                s,
                "route add {block} {via} proto {PROTOCOL} mtu {DEVICE_MTU}"
            );
        }
        for dst in &remote.tunnel_routes {
            let _ = writeln!(
                s,
                "route add {dst} dev {DEVICE} scope link proto {PROTOCOL} mtu {DEVICE_MTU}"
            );
        }
    }
    for block in &view.local_blocks {
        let _ = writeln!(s, "route add blackhole {block} proto {PROTOCOL}");
    }
    s
}

fn bridge_batch(view: &View) -> String {
    let mut s = String::new();
    for vtep in view.remotes.iter().filter_map(|r| r.vtep.as_ref()) {
        let _ = writeln!(
            s,
            "fdb add {} dev {DEVICE} dst {} self permanent",
            vtep.mac, vtep.parent
        );
    }
    s
}

/// Both families' sets, as vxmgrd keeps them (the IPv6 one empty here).
fn ipset_restore(view: &View) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "create {IPSET_V4} hash:net family inet maxelem 1048576");
    for vtep in view.remotes.iter().filter_map(|r| r.vtep.as_ref()) {
        let _ = writeln!(s, "add {IPSET_V4} {}", vtep.parent);
    }
    let _ = writeln!(s, "create {IPSET_V6} hash:net family inet6 maxelem 1048576");
    s
}

//! cold: node-0 programs a whole cluster into a fresh namespace, vxmgrd
//! (with and without nexthop objects) against iproute2 batch files.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use vxmgr::wire::felix::ToDataplane;

use crate::Bench;
use crate::cluster::View;
use crate::daemon::Vxmgrd;
use crate::iproute::{Routing, Scripts};
use crate::netns::Netns;
use crate::report::{Table, missing, ratio, secs};
use crate::stream::replay;

/// One way of building the state.
struct Build {
    time: Duration,
    /// Routes of protocol 80 in the kernel afterwards.
    routes: usize,
    /// vxmgrd's verdict: whether every batch status was OK.
    all_ok: Option<bool>,
}

/// One size's builds; the inline ones unless skipped.
struct Row {
    nodes: u32,
    vxmgr: Build,
    vxmgr_inline: Option<Build>,
    ip_nexthop: Build,
    ip_inline: Option<Build>,
}

pub fn run(bench: &Bench) -> Result<()> {
    let mut table = Table::new(
        "cold: from nothing to node-0's view of N nodes × 4 blocks (seconds)",
        &[
            "nodes",
            "routes",
            "vxmgr",
            "vxmgr inline",
            "ip nexthop",
            "ip inline",
            "vxmgr/ip nexthop",
            "ip inline/vxmgr",
            "vxmgr inline/ip inline",
            "vxmgr statuses",
        ],
    );
    let scripts = tempfile::tempdir()?;
    for &nodes in &bench.settings.sizes {
        let row = measure(bench, nodes, scripts.path())?;
        row.warn_if_different();
        table.row(row.cells());
    }
    table.print();
    println!(
        "  vxmgr: first message sent → status covering InSync (default flags); \
         vxmgr inline: --nexthop-objects off.\n  ip: ip -batch + bridge -batch + ipset restore, \
         with nexthop objects or inline gateways."
    );
    Ok(())
}

/// The figures the growth scenario plots for one size.
pub struct Figures {
    pub jsonl: Duration,
    pub framed: Duration,
    pub ip: Duration,
}

pub fn figures(bench: &Bench, nodes: u32, scripts: &Path) -> Result<Figures> {
    let messages = bench.clusters.messages(nodes)?;
    let view = View::of(&messages)?;
    let vxmgr = vxmgrd_build(bench, messages, &[])?;
    let ip = iproute_build(scripts, &view, Routing::Nexthops)?;
    Ok(Figures {
        jsonl: vxmgr.time,
        framed: vxmgr.time,
        ip: ip.time,
    })
}

/// Every build of one size, each in a fresh namespace.
fn measure(bench: &Bench, nodes: u32, scripts: &Path) -> Result<Row> {
    let messages = bench.clusters.messages(nodes)?;
    let view = View::of(&messages)?;
    let inline = bench.settings.inline;
    let build = |what: &str, result: Result<Build>| {
        if let Ok(b) = &result {
            eprintln!("cold: {nodes} nodes: {what} {}", secs(b.time));
        }
        result
    };
    Ok(Row {
        nodes,
        vxmgr: build("vxmgr", vxmgrd_build(bench, messages.clone(), &[]))?,
        vxmgr_inline: inline
            .then(|| {
                let off = ["--nexthop-objects", "off"];
                build("vxmgr inline", vxmgrd_build(bench, messages, &off))
            })
            .transpose()?,
        ip_nexthop: build(
            "ip nexthop",
            iproute_build(scripts, &view, Routing::Nexthops),
        )?,
        ip_inline: inline
            .then(|| build("ip inline", iproute_build(scripts, &view, Routing::Inline)))
            .transpose()?,
    })
}

impl Row {
    fn cells(&self) -> Vec<String> {
        let time = |b: &Option<Build>| b.as_ref().map_or_else(skipped, |b| secs(b.time));
        let all_ok = [Some(&self.vxmgr), self.vxmgr_inline.as_ref()]
            .into_iter()
            .flatten()
            .all(|b| b.all_ok == Some(true));
        let inline = self.vxmgr_inline.as_ref().zip(self.ip_inline.as_ref());
        vec![
            self.nodes.to_string(),
            self.ip_nexthop.routes.to_string(),
            secs(self.vxmgr.time),
            time(&self.vxmgr_inline),
            secs(self.ip_nexthop.time),
            time(&self.ip_inline),
            ratio(self.vxmgr.time, self.ip_nexthop.time),
            self.ip_inline
                .as_ref()
                .map_or_else(skipped, |b| ratio(b.time, self.vxmgr.time)),
            inline.map_or_else(skipped, |(v, ip)| ratio(v.time, ip.time)),
            if all_ok { "all OK" } else { "NOT all OK" }.into(),
        ]
    }

    /// The comparison is only fair when every build made the same routes.
    fn warn_if_different(&self) {
        let builds = [
            ("vxmgr", Some(&self.vxmgr)),
            ("vxmgr inline", self.vxmgr_inline.as_ref()),
            ("ip inline", self.ip_inline.as_ref()),
        ];
        for (what, build) in builds {
            if let Some(b) = build.filter(|b| b.routes != self.ip_nexthop.routes) {
                eprintln!(
                    "cold: {} nodes: WARNING {what} made {} routes, ip nexthop {}",
                    self.nodes, b.routes, self.ip_nexthop.routes
                );
            }
        }
    }
}

fn skipped() -> String {
    missing("skipped")
}

/// vxmgrd in a fresh namespace: the time from the first message sent to
/// the status covering InSync.
fn vxmgrd_build(bench: &Bench, messages: Vec<ToDataplane>, extra: &[&str]) -> Result<Build> {
    let netns = Netns::with_underlay()?;
    let daemon = Vxmgrd::netlink(&netns, extra)?;
    let delivery = bench.runtime.block_on(replay(&daemon.socket(), messages))?;
    Ok(Build {
        time: delivery.covered,
        routes: kernel_routes(&netns)?,
        all_ok: Some(delivery.all_ok()),
    })
}

/// The same end state with iproute2 in a fresh namespace.
fn iproute_build(scripts: &Path, view: &View, routing: Routing) -> Result<Build> {
    let scripts = Scripts::write(scripts, view, routing)?;
    let netns = Netns::with_underlay()?;
    let time = scripts.run(&netns)?;
    Ok(Build {
        time,
        routes: kernel_routes(&netns)?,
        all_ok: None,
    })
}

fn kernel_routes(netns: &Netns) -> Result<usize> {
    let output = netns.ip(&["route", "show", "proto", "80"])?;
    Ok(output
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count())
}

//! growth: cold start, lone-update latency, resync and memory from 1,000 to
//! 100,000 nodes, vxmgr beside the kernel's own cost, printed and drawn
//! into a PNG.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use crate::Bench;
use crate::plot::{Panel, Series};
use crate::report::{Table, mib, millis, secs};
use crate::{churn, cold, resync, rss};

/// Every figure of one size.
struct Point {
    nodes: u32,
    cold: cold::Figures,
    /// Round-trip p99 of a lone join, VTEP change and leave.
    p99: [Duration; 3],
    /// The slowest round trip of each: a p99 of 200 is the third slowest,
    /// so this tells one stall from a slow spell.
    slowest: [Duration; 3],
    resync: Duration,
    dumps: Duration,
    rss: rss::Figures,
}

pub fn run(bench: &Bench) -> Result<()> {
    let scripts = tempfile::tempdir()?;
    let mut points = Vec::new();
    // A size that fails ends the growth, and the sizes before it are
    // still printed and drawn: the largest size that works is a figure.
    let mut failed = None;
    for &nodes in &bench.settings.growth_sizes {
        match measure(bench, nodes, scripts.path()) {
            Ok(point) => points.push(point),
            Err(e) => {
                failed = Some(e.context(format!("{nodes} nodes")));
                break;
            }
        }
        eprintln!("growth: {nodes} nodes done");
    }
    if !points.is_empty() {
        print(&points);
        let path = &bench.settings.growth_plot;
        crate::plot::write(path, &caption(), &panels(&points))?;
        println!("  plot: {}", path.display());
    }
    match failed {
        Some(e) => Err(e.context("larger sizes not measured")),
        None => Ok(()),
    }
}

fn measure(bench: &Bench, nodes: u32, scripts: &Path) -> Result<Point> {
    let cold = cold::figures(bench, nodes, scripts)?;
    let churn = churn::churn(bench, nodes)?;
    let resync = resync::measure_nodes(bench, nodes)?;
    let rss = rss::netlink_figures(bench, nodes)?;
    Ok(Point {
        nodes,
        cold,
        p99: churn::Op::ALL.map(|op| churn.round_trip_p99(op)),
        slowest: churn::Op::ALL.map(|op| churn.round_trip_slowest(op)),
        resync: resync.resync_median(),
        dumps: resync.dump_median(),
        rss,
    })
}

fn print(points: &[Point]) {
    let mut table = Table::new(
        "growth: node-0's view of N nodes × 4 blocks (default flags)",
        &[
            "nodes",
            "cold JSONL (s)",
            "cold framed (s)",
            "cold ip (s)",
            "join p99 (ms)",
            "move p99 (ms)",
            "leave p99 (ms)",
            "slowest join · move · leave (ms)",
            "resync (ms)",
            "dumps (ms)",
            "RSS (MiB)",
            "RSS resynced (MiB)",
        ],
    );
    for p in points {
        let [join, mv, leave] = p.p99;
        table.row(vec![
            p.nodes.to_string(),
            secs(p.cold.jsonl),
            secs(p.cold.framed),
            secs(p.cold.ip),
            millis(join),
            millis(mv),
            millis(leave),
            p.slowest.map(millis).join(" · "),
            millis(p.resync),
            millis(p.dumps),
            mib(p.rss.converged),
            mib(p.rss.resynced),
        ]);
    }
    table.print();
    println!(
        "  cold: calc-stub replay of a JSON lines / Felix-framed file → the status covering InSync; ip: ip -batch + bridge -batch + ipset restore.\n  \
         p99: round trip of a lone operation on the converged daemon (slowest: the longest of each kind); resync: in-process, no drift, median; dumps: the same kernel dumps alone."
    );
}

fn caption() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("vxmgr against the kernel's own cost, N nodes × 4 blocks, {cpus} CPUs")
}

fn panels(points: &[Point]) -> Vec<Panel> {
    let series = |name: &str, floor: bool, value: &dyn Fn(&Point) -> f64| Series {
        name: name.into(),
        points: points.iter().map(|p| (p.nodes, value(p))).collect(),
        floor,
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    vec![
        Panel {
            title: "Cold start".into(),
            unit: "seconds".into(),
            series: vec![
                series("vxmgr, calc-stub replay of JSON lines", false, &|p| {
                    p.cold.jsonl.as_secs_f64()
                }),
                series("vxmgr, calc-stub replay of Felix framing", false, &|p| {
                    p.cold.framed.as_secs_f64()
                }),
                series("iproute2: ip/bridge -batch, ipset restore", true, &|p| {
                    p.cold.ip.as_secs_f64()
                }),
            ],
        },
        Panel {
            title: "Lone update, round trip p99".into(),
            unit: "milliseconds".into(),
            series: ["join", "VTEP move", "leave"]
                .into_iter()
                .enumerate()
                .map(|(i, name)| series(name, false, &|p| ms(p.p99[i])))
                .collect(),
        },
        Panel {
            title: "Full resync, no drift".into(),
            unit: "milliseconds".into(),
            series: vec![
                series("vxmgr resync", false, &|p| ms(p.resync)),
                series("the kernel dumps alone", true, &|p| ms(p.dumps)),
            ],
        },
        Panel {
            title: "vxmgrd VmRSS".into(),
            unit: "MiB".into(),
            series: vec![
                series("converged", false, &|p| mib(p.rss.converged)),
                series("after a full resync", false, &|p| mib(p.rss.resynced)),
            ],
        },
    ]
}

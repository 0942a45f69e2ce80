//! rss: the daemon's resident memory once converged, and the heap the
//! manager and reconciler hold per route, counted in-process.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};

use vxmgr::kernel::memory::MemoryBackend;

use crate::Bench;
use crate::alloc;
use crate::daemon::Vxmgrd;
use crate::inprocess::converge;
use crate::netns::{self, Netns, kernel_unavailable};
use crate::report::{Table, mib, missing};
use crate::stream::replay;

pub fn run(bench: &Bench) -> Result<()> {
    daemons(bench)?;
    in_process(bench)
}

/// The netlink daemon's full resyncs: soon after convergence, counted on
/// its metrics endpoint, but not before the converged reading is taken (a
/// resync holds a dump of every object while it runs: a 100,000-node cold
/// start takes 7 s, and a 10 s interval put its first resync's peak into
/// the converged reading).
const REFRESH_INTERVAL: &str = "30s";
const METRICS_ADDRESS: &str = "127.0.0.1:9099";
/// The longest wait for a resync after convergence.
const RESYNC_TIMEOUT: Duration = Duration::from_secs(120);

/// VmRSS of vxmgrd at each size, on both kernels; on netlink also split
/// into anonymous and file pages, and again after a full resync.
fn daemons(bench: &Bench) -> Result<()> {
    let mut table = Table::new(
        format!(
            "rss: vxmgrd VmRSS after convergence, once it holds still (MiB; default flags, netlink: --route-refresh-interval {REFRESH_INTERVAL})"
        ),
        &[
            "nodes",
            "memory kernel",
            "netlink",
            "anon",
            "file",
            "after a resync",
            "anon",
        ],
    );
    for &nodes in &bench.settings.sizes {
        let memory = Vxmgrd::memory(&[])?;
        let mut row = vec![
            nodes.to_string(),
            mib(converged_rss(bench, nodes, &memory)?),
        ];
        drop(memory);
        match kernel_unavailable() {
            None => {
                let f = netlink_figures(bench, nodes)?;
                row.extend([f.converged, f.anon, f.file, f.resynced, f.resynced_anon].map(mib));
            }
            Some(why) => row.extend((0..5).map(|_| missing(why))),
        }
        eprintln!("rss: {nodes} nodes done");
        table.row(row);
    }
    table.print();
    println!("  the memory kernel's maps live in the daemon, so its RSS includes them.");
    println!(
        "  anon: heap and stacks (RssAnon); file: the binary's and libraries' pages (RssFile)."
    );
    Ok(())
}

/// vxmgrd's VmRSS at one size, netlink kernel (bytes): converged, split
/// into anonymous and file pages, and after the first periodic resync that
/// follows.
pub struct Figures {
    pub converged: u64,
    pub anon: u64,
    pub file: u64,
    pub resynced: u64,
    pub resynced_anon: u64,
}

pub fn netlink_figures(bench: &Bench, nodes: u32) -> Result<Figures> {
    let netns = Netns::with_underlay()?;
    let args = [
        "--route-refresh-interval",
        REFRESH_INTERVAL,
        "--http-listen",
        METRICS_ADDRESS,
    ];
    let daemon = Vxmgrd::netlink(&netns, &args)?;
    let converged = converged_rss(bench, nodes, &daemon)?;
    let split = daemon.resident()?;
    let before = periodic_resyncs(&netns)?;
    ensure!(
        before == 0,
        "a periodic resync ran before the converged reading at {nodes} nodes: raise REFRESH_INTERVAL"
    );
    let deadline = Instant::now() + RESYNC_TIMEOUT;
    while periodic_resyncs(&netns)? == before {
        ensure!(
            Instant::now() < deadline,
            "no resync within {RESYNC_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let resynced = daemon.settled_rss_bytes()?;
    let resynced_split = daemon.resident()?;
    Ok(Figures {
        converged,
        anon: split.anon,
        file: split.file,
        resynced,
        resynced_anon: resynced_split.anon,
    })
}

/// Periodic resyncs the daemon in `netns` has completed.
fn periodic_resyncs(netns: &Netns) -> Result<u64> {
    let url = format!("http://{METRICS_ADDRESS}/metrics");
    let output = netns::run(netns.command("curl").args(["-sf", &url]))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let periodic = text.lines().filter(|l| {
        l.starts_with("vxmgr_resyncs_total{")
            && l.contains("trigger=\"periodic\"")
            && l.contains("result=\"ok\"")
    });
    Ok(periodic
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
}

/// Streams the cluster into `daemon` and reads its VmRSS.
fn converged_rss(bench: &Bench, nodes: u32, daemon: &Vxmgrd) -> Result<u64> {
    let messages = bench.clusters.messages(nodes)?;
    let delivery = bench.runtime.block_on(replay(&daemon.socket(), messages))?;
    delivery.ensure_ok(&format!("{nodes} nodes"))?;
    daemon.settled_rss_bytes()
}

/// Heap per route at the smallest and the largest size.
fn in_process(bench: &Bench) -> Result<()> {
    let mut table = Table::new(
        "rss: heap held in-process after programming, per kernel route",
        &[
            "nodes",
            "routes",
            "manager+reconciler MiB",
            "bytes/route",
            "manager",
            "reconciler",
            "memory kernel bytes/route",
        ],
    );
    let sizes = &bench.settings.sizes;
    let ends: BTreeSet<u32> = sizes
        .iter()
        .min()
        .into_iter()
        .chain(sizes.iter().max())
        .copied()
        .collect();
    for nodes in ends {
        let heap = heap(bench, nodes)?;
        let per_route = |bytes: u64| format!("{:.0}", bytes as f64 / heap.routes as f64);
        table.row(vec![
            nodes.to_string(),
            heap.routes.to_string(),
            mib(heap.manager + heap.reconciler),
            per_route(heap.manager + heap.reconciler),
            per_route(heap.manager),
            per_route(heap.reconciler),
            per_route(heap.kernel),
        ]);
    }
    table.print();
    println!(
        "  manager, reconciler: heap freed by dropping each (bytes/route); memory kernel: the simulated kernel's maps."
    );
    Ok(())
}

struct Heap {
    routes: usize,
    /// Bytes held by the manager.
    manager: u64,
    /// Bytes held by the reconciler.
    reconciler: u64,
    /// Bytes held by the memory kernel's maps.
    kernel: u64,
}

/// Programs `nodes` into a memory kernel in-process, then drops the
/// manager, the reconciler and the kernel, counting what each frees: the
/// heap each holds, whatever else came and went before.
fn heap(bench: &Bench, nodes: u32) -> Result<Heap> {
    let messages = bench.clusters.messages(nodes)?;
    let kernel = MemoryBackend::with_underlay("eth0", 1500);
    let (manager, reconciler) = bench.runtime.block_on(converge(kernel.clone(), messages))?;
    let routes = kernel.lock().routes.len();
    let converged = alloc::snapshot();
    drop(manager);
    let without_manager = alloc::snapshot();
    drop(reconciler);
    let without_vxmgr = alloc::snapshot();
    drop(kernel);
    let without_kernel = alloc::snapshot();
    Ok(Heap {
        routes,
        manager: converged.in_use_bytes - without_manager.in_use_bytes,
        reconciler: without_manager.in_use_bytes - without_vxmgr.in_use_bytes,
        kernel: without_vxmgr.in_use_bytes - without_kernel.in_use_bytes,
    })
}

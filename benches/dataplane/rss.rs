//! rss: the daemon's resident memory once converged, and the heap the
//! manager and reconciler hold per route, counted in-process.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};

use vxmgr::kernel::memory::MemoryBackend;

use crate::Bench;
use crate::alloc;
use crate::daemon::Vxmgrd;
use crate::inprocess::converge;
use crate::netns::{Netns, kernel_unavailable};
use crate::report::{Table, mib, missing};
use crate::stream::replay;

pub fn run(bench: &Bench) -> Result<()> {
    daemons(bench)?;
    in_process(bench)
}

/// VmRSS of vxmgrd at each size, on both kernels.
fn daemons(bench: &Bench) -> Result<()> {
    let mut table = Table::new(
        "rss: vxmgrd VmRSS after convergence, once it holds still (MiB; default flags)",
        &["nodes", "memory kernel", "netlink kernel"],
    );
    for &nodes in &bench.settings.sizes {
        let memory = Vxmgrd::memory(&[])?;
        let memory = mib(converged_rss(bench, nodes, memory)?);
        let netlink = match kernel_unavailable() {
            None => {
                let netns = Netns::with_underlay()?;
                let daemon = Vxmgrd::netlink(&netns, &[])?;
                mib(converged_rss(bench, nodes, daemon)?)
            }
            Some(why) => missing(why),
        };
        eprintln!("rss: {nodes} nodes done");
        table.row(vec![nodes.to_string(), memory, netlink]);
    }
    table.print();
    println!("  the memory kernel's maps live in the daemon, so its RSS includes them.");
    Ok(())
}

/// vxmgrd's VmRSS at one size, netlink kernel: the figures growth plots.
pub struct Figures {
    pub converged: u64,
    pub resynced: Option<u64>,
}

pub fn daemon_figures(bench: &Bench, nodes: u32) -> Result<Figures> {
    let netns = Netns::with_underlay()?;
    let daemon = Vxmgrd::netlink(&netns, &[])?;
    Ok(Figures {
        converged: converged_rss(bench, nodes, daemon)?,
        resynced: None,
    })
}

/// Streams the cluster into `daemon` and reads its VmRSS.
fn converged_rss(bench: &Bench, nodes: u32, daemon: Vxmgrd) -> Result<u64> {
    let messages = bench.clusters.messages(nodes)?;
    let delivery = bench.runtime.block_on(replay(&daemon.socket(), messages))?;
    ensure!(delivery.all_ok(), "{nodes} nodes did not apply cleanly");
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

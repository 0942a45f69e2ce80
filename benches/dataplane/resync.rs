//! resync: a full resync with no drift over a large cluster, in this
//! process, against the kernel of a namespace. Also its dump alone.

use std::time::{Duration, Instant};

use anyhow::Result;

use vxmgr::config::Config;
use vxmgr::kernel::KernelBackend;
use vxmgr::kernel::netlink::NetlinkBackend;
use vxmgr::kernel::objects::{KernelState, Ownership};

use crate::Bench;
use crate::alloc;
use crate::inprocess::converge;
use crate::netns::Netns;
use crate::report::{Table, median, mib, millis, min};

/// Timings and the allocations of one more, untimed, run.
struct Measured {
    times: Vec<Duration>,
    /// CPU time of this process (every thread, user and system) in each run.
    cpu: Vec<Duration>,
    /// Operations each resync attempted (0 without drift).
    operations: Vec<u32>,
    allocations: u64,
    allocated_bytes: u64,
}

pub struct Figures {
    resync: Measured,
    dump: Measured,
    state: KernelState,
}

impl Figures {
    pub fn resync_median(&self) -> Duration {
        median(&self.resync.times)
    }

    pub fn dump_median(&self) -> Duration {
        median(&self.dump.times)
    }
}

pub fn run(bench: &Bench) -> Result<()> {
    let nodes = bench.settings.resync_nodes;
    let figures = measure_nodes(bench, nodes)?;
    let state = &figures.state;
    let mut table = Table::new(
        format!(
            "resync: no drift, {nodes} nodes: {} routes, {} nexthops, {} neighbours, {} FDB entries, {} ipset members (ms)",
            state.routes.len(),
            state.nexthops.len(),
            state.neighbors.len(),
            state.fdb.len(),
            state.ipsets.iter().map(|(_, m)| m.len()).sum::<usize>(),
        ),
        &[
            "what",
            "runs",
            "min",
            "median",
            "CPU median",
            "operations",
            "allocations",
            "MiB allocated",
        ],
    );
    for (what, m) in [
        ("Reconciler::resync", &figures.resync),
        ("dump alone", &figures.dump),
    ] {
        table.row(vec![
            what.into(),
            m.times.len().to_string(),
            millis(min(&m.times)),
            millis(median(&m.times)),
            millis(median(&m.cpu)),
            if m.operations.is_empty() {
                "-".into()
            } else {
                format!("{:?}", m.operations.iter().max().unwrap_or(&0))
            },
            m.allocations.to_string(),
            mib(m.allocated_bytes),
        ]);
    }
    table.print();
    println!(
        "  CPU: this process's, every thread, user and system (the kernel writes a dump in the reading thread);\n  \
         operations: the most any timed resync attempted; allocations: one further run."
    );
    Ok(())
}

/// Programs `nodes` into a fresh namespace in-process, then times resyncs
/// and dumps.
pub fn measure_nodes(bench: &Bench, nodes: u32) -> Result<Figures> {
    let runs = bench.settings.resync_runs;
    let messages = bench.clusters.messages(nodes)?;
    let netns = Netns::with_underlay()?;
    eprintln!("resync: programming {nodes} nodes in-process");
    netns.run_inside(move || measure(messages, runs))
}

/// Inside the namespace: programs the cluster, then times resyncs and
/// dumps.
async fn measure(messages: Vec<vxmgr::wire::felix::ToDataplane>, runs: u32) -> Result<Figures> {
    let (_manager, mut reconciler) = converge(NetlinkBackend::new()?, messages).await?;
    let resync = time(runs, async || {
        let report = reconciler.resync().await?;
        Ok(Some(report.operations))
    })
    .await?;
    // A second backend in the same namespace, reading the same objects.
    let mut probe = NetlinkBackend::new()?;
    // What vxmgrd owns with its default settings.
    let ownership = Ownership::of_vxmgr(Config::default().settings().route_protocol);
    let dump = time(runs, async || {
        probe.dump(&ownership).await?;
        Ok(None)
    })
    .await?;
    let state = probe.dump(&ownership).await?;
    Ok(Figures {
        resync,
        dump,
        state,
    })
}

/// Runs `step` `runs` times timed, then once more counting allocations.
async fn time(runs: u32, mut step: impl AsyncFnMut() -> Result<Option<u32>>) -> Result<Measured> {
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    let mut operations = Vec::new();
    for _ in 0..runs {
        let (started, cpu_before) = (Instant::now(), process_cpu());
        let ops = step().await?;
        times.push(started.elapsed());
        cpu.push(process_cpu().saturating_sub(cpu_before));
        operations.extend(ops);
    }
    let before = alloc::snapshot();
    step().await?;
    let (allocations, allocated_bytes) = alloc::snapshot().since(&before);
    Ok(Measured {
        times,
        cpu,
        operations,
        allocations,
        allocated_bytes,
    })
}

/// CPU time this process has used so far, all threads, user and system.
fn process_cpu() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

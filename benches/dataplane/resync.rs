//! resync: a full resync with no drift over a large cluster, in this
//! process, against the kernel of a namespace. Also its dump alone.

use std::time::{Duration, Instant};

use anyhow::Result;

use vxmgr::config::Config;
use vxmgr::kernel::netlink::NetlinkBackend;
use vxmgr::kernel::objects::{KernelState, Ownership};
use vxmgr::kernel::{KernelBackend, KernelError};

use crate::Bench;
use crate::alloc;
use crate::inprocess::converge;
use crate::netns::Netns;
use crate::report::{Table, median, mib, millis, min};

/// Timings and the allocations of one more, untimed, run.
#[derive(Default)]
struct Measured {
    times: Vec<Duration>,
    /// CPU time of this process (every thread, user and system) in each run.
    cpu: Vec<Duration>,
    /// Operations each run attempted (0 without drift; none in a dump).
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

    /// Each resync's time over that of the dump run right after it,
    /// ascending: pairs taken close together share the machine's speed of
    /// the moment, which wanders by more than the target's margin.
    pub fn paired_ratios(&self) -> Vec<f64> {
        let pairs = self.resync.times.iter().zip(&self.dump.times);
        let mut ratios: Vec<f64> = pairs
            .map(|(resync, dump)| resync.as_secs_f64() / dump.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios
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
    let ratios = figures.paired_ratios();
    if let (Some(lowest), Some(highest)) = (ratios.first(), ratios.last()) {
        let middle = (ratios[(ratios.len() - 1) / 2] + ratios[ratios.len() / 2]) / 2.0;
        println!(
            "  resync / dump alone, run by run: median {middle:.2}x (from {lowest:.2}x to {highest:.2}x)"
        );
    }
    println!(
        "  runs: a resync and a dump in turn;\n  \
         CPU: this process's, every thread, user and system (the kernel writes a dump in the reading thread);\n  \
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
/// dumps, one of each in turn, so that a change in the machine's speed
/// during the runs weighs on both alike.
async fn measure(messages: Vec<vxmgr::wire::felix::ToDataplane>, runs: u32) -> Result<Figures> {
    let (_manager, mut reconciler) = converge(NetlinkBackend::new()?, messages).await?;
    // A second backend in the same namespace, reading the same objects.
    let mut probe = NetlinkBackend::new()?;
    // What vxmgrd owns with its default settings.
    let ownership = Ownership::of_vxmgr(Config::default().settings().route_protocol);
    let (mut resync, mut dump) = (Measured::default(), Measured::default());
    for _ in 0..runs {
        resync
            .time(async { Ok(Some(reconciler.resync().await?.operations)) })
            .await?;
        dump.time(async { probe.dump(&ownership).await.map(|_| None) })
            .await?;
    }
    resync.count_allocations(reconciler.resync()).await?;
    dump.count_allocations(probe.dump(&ownership)).await?;
    let state = probe.dump(&ownership).await?;
    Ok(Figures {
        resync,
        dump,
        state,
    })
}

impl Measured {
    /// Runs `step` once, timed; it returns the operations it attempted,
    /// if it is a resync.
    async fn time(
        &mut self,
        step: impl Future<Output = Result<Option<u32>, KernelError>>,
    ) -> Result<()> {
        let (started, cpu_before) = (Instant::now(), process_cpu());
        let operations = step.await?;
        self.times.push(started.elapsed());
        self.cpu.push(process_cpu().saturating_sub(cpu_before));
        self.operations.extend(operations);
        Ok(())
    }

    /// Runs `step` once more, counting its allocations.
    async fn count_allocations<T>(
        &mut self,
        step: impl Future<Output = Result<T, KernelError>>,
    ) -> Result<()> {
        let before = alloc::snapshot();
        step.await?;
        (self.allocations, self.allocated_bytes) = alloc::snapshot().since(&before);
        Ok(())
    }
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

//! crashloop: vxmgrd SIGKILLed again and again at random moments of a
//! world's cold start, churn, periodic resyncs, pool and VNI changes, beside
//! the host's own objects (the testbed's crash loop, which tests/crashloop.rs
//! runs for fewer kills). After each kill a new vxmgrd gets the current view;
//! the kernel must match an uninterrupted run's, the host's objects must be
//! untouched, and no route or nexthop right at the kill may change. Prints
//! the seed (VXMGR_CRASH_SEED replays it), where the kills landed, and the
//! convergence after DataplaneInSync.

use std::path::Path;

use anyhow::Result;

use crate::Bench;
use crate::cluster::CALC_STUB;
use crate::daemon::VXMGRD;
use crate::testbed::crashloop::{self, SEED_VARIABLE, Settings};
use crate::testbed::{Binaries, Cluster, churn};

/// Nodes that join, and VTEPs that move, at once.
const JOINERS: u32 = 200;

pub fn run(bench: &Bench) -> Result<()> {
    let settings = Settings {
        nodes: bench.settings.crash_nodes,
        joiners: JOINERS,
        kills: bench.settings.kills,
        seed: crashloop::seed()?,
    };
    println!(
        "\ncrashloop: {} SIGKILLs of vxmgrd on a {}-node world, seed {} ({SEED_VARIABLE}={} replays it)",
        settings.kills, settings.nodes, settings.seed, settings.seed
    );
    let binaries = Binaries {
        vxmgrd: VXMGRD.into(),
        calc_stub: CALC_STUB.into(),
    };
    let mut cluster = Cluster::new("vxbcl", 1, &binaries)?;
    churn::add_generated_underlay(&cluster.node(1).ns)?;
    let outcome = crashloop::run(&mut cluster, Path::new(CALC_STUB), settings, |line| {
        eprintln!("{line}")
    })?;
    for line in outcome.summary().iter().chain(&outcome.table()) {
        println!("  {line}");
    }
    Ok(())
}

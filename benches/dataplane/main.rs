//! vxmgr's benchmark suite: `cargo bench --bench dataplane -- --help`.
//!
//! Each scenario runs its variants side by side in this one process, so
//! their ratios are comparable; figures are printed, never asserted.
//! Kernel scenarios run in throwaway network namespaces (root needed) and
//! clean up after themselves, also when they fail.

mod alloc;
mod churn;
mod cli;
mod cluster;
mod cni;
mod cold;
mod crashloop;
mod daemon;
mod firewall;
mod flannel;
mod growth;
mod ingest;
mod inprocess;
mod iproute;
mod kube;
mod netns;
mod plot;
mod report;
mod resync;
mod route_watch;
mod rss;
mod soak;
mod stalls;
// The namespace testbed, from calc-stub's sources (its demo runs on it); the
// benches use its churn, census, stream and crash loop.
#[path = "../../calc-stub/testbed/mod.rs"]
#[allow(dead_code, unused_imports)]
mod testbed;

use testbed::stream;

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use cli::{Cli, Scenario, Settings};
use cluster::Clusters;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// What every scenario shares.
pub struct Bench {
    pub settings: Settings,
    pub clusters: Clusters,
    /// The calc side's runtime: one thread, like a calc process would
    /// spare, on a machine shared with the daemon.
    pub runtime: tokio::runtime::Runtime,
}

fn main() -> ExitCode {
    let settings = Cli::parse().settings();
    let bench = match setup(settings) {
        Ok(bench) => bench,
        Err(e) => {
            eprintln!("dataplane bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    print_machine();
    let kernel_unavailable = netns::kernel_unavailable();
    if kernel_unavailable.is_none() {
        netns::remove_leftovers();
    }
    let mut failed = false;
    for &scenario in &bench.settings.scenarios {
        if let Some(why) = kernel_unavailable.filter(|_| scenario.needs_kernel()) {
            println!("\n{scenario}: SKIPPED ({why})");
            continue;
        }
        stalls::print(&format!("before {scenario}"), bench.settings.stall_duration);
        let started = Instant::now();
        let result = match scenario {
            Scenario::Cold => cold::run(&bench),
            Scenario::Churn => churn::run(&bench),
            Scenario::Resync => resync::run(&bench),
            Scenario::Ingest => ingest::run(&bench),
            Scenario::Rss => rss::run(&bench),
            Scenario::Soak => soak::run(&bench),
            Scenario::Flannel => flannel::run(&bench),
            Scenario::Cni => cni::run(&bench),
            Scenario::Kube => kube::run(&bench),
            Scenario::Firewall => firewall::run(&bench),
            Scenario::Crashloop => crashloop::run(&bench),
            Scenario::Growth => growth::run(&bench),
        };
        match result {
            Ok(()) => eprintln!(
                "{scenario}: done in {:.1} s",
                started.elapsed().as_secs_f64()
            ),
            Err(e) => {
                println!("\n{scenario}: FAILED: {e:#}");
                failed = true;
            }
        }
    }
    stalls::print("after the last scenario", bench.settings.stall_duration);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn setup(settings: Settings) -> anyhow::Result<Bench> {
    Ok(Bench {
        settings,
        clusters: Clusters::new()?,
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    })
}

/// The machine the figures come from.
fn print_machine() {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    println!("vxmgr dataplane bench: {cpus} CPUs, kernel {kernel}");
}

//! cni: pods made and removed on one node through the CNI plugins, as a
//! container runtime would (flannel's conflist: our `flannel` plugin
//! delegating to `bridge` + `host-local`, then `portmap`; `loopback` for
//! `lo`). Each ADD and DEL is timed whole, pod namespace included; the pods
//! pile up on the node's bridge before they are all deleted.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::Bench;
use crate::cluster::CALC_STUB;
use crate::daemon::VXMGRD;
use crate::report::{Table, median, millis, quantile};
use crate::testbed::cni::{SYSTEM_PLUGINS, subnet_env, system_plugins_installed};
use crate::testbed::{Binaries, Cluster, PodNetwork};

const FLANNEL_PLUGIN: &str = env!("CARGO_BIN_EXE_flannel");

pub fn run(bench: &Bench) -> Result<()> {
    if !system_plugins_installed() {
        println!(
            "\ncni: SKIPPED (needs the CNI plugins in {SYSTEM_PLUGINS}: apt-get install containernetworking-plugins)"
        );
        return Ok(());
    }
    let pods = bench.settings.cni_pods;
    let binaries = Binaries {
        vxmgrd: VXMGRD.into(),
        calc_stub: CALC_STUB.into(),
    };
    let cluster = Cluster::new("vxbcni", 1, &binaries)?;
    let plugin_dir = Path::new(FLANNEL_PLUGIN)
        .parent()
        .context("the plugin's directory")?;
    // Dual-stack, flannel not masquerading: `bridge` does, with iptables
    // rules for every pod.
    let network = PodNetwork::with_subnet_env(&cluster, 1, &subnet_env(1, false), plugin_dir)?;
    // The first pod also makes the bridge: not what every later one costs.
    network.del(network.add()?)?;
    let mut added = Vec::new();
    let mut add_times = Vec::new();
    for i in 0..pods {
        let started = Instant::now();
        added.push(network.add().with_context(|| format!("ADD of pod {i}"))?);
        add_times.push(started.elapsed());
    }
    let mut del_times = Vec::new();
    for pod in added {
        let started = Instant::now();
        network.del(pod)?;
        del_times.push(started.elapsed());
    }
    let mut table = Table::new(
        format!(
            "cni: {pods} pods added, then deleted, on one node through flannel's conflist (ms per pod, its namespace, loopback and the chain)"
        ),
        &["command", "pods", "median", "p99", "max"],
    );
    for (command, times) in [("ADD", &add_times), ("DEL", &del_times)] {
        table.row(row(command, times));
    }
    table.print();
    Ok(())
}

fn row(command: &str, times: &[Duration]) -> Vec<String> {
    vec![
        command.into(),
        times.len().to_string(),
        millis(median(times)),
        millis(quantile(times, 0.99)),
        millis(quantile(times, 1.0)),
    ]
}

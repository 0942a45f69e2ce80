//! soak: minutes of churn against the netlink backend. Resident memory
//! must stay flat and the kernel must end up holding exactly what it held
//! after convergence: nothing leaked, nothing lost.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use vxmgr::wire::felix::{ToDataplane, to_dataplane::Payload};

use crate::Bench;
use crate::churn::{leave, split, vtep_changes};
use crate::daemon::Vxmgrd;
use crate::netns::Netns;
use crate::report::Table;
use crate::stream::Session;

/// Nodes that join and leave again and again.
const JOINERS: u32 = 50;
/// How often memory and kernel objects are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

pub fn run(bench: &Bench) -> Result<()> {
    let nodes = bench.settings.soak_nodes;
    let duration = bench.settings.soak_duration;
    let (snapshot, joiners) = split(bench.clusters.messages(nodes + JOINERS)?, nodes);
    let changes = vtep_changes(&snapshot, JOINERS as usize)?;
    let reverts = originals(&snapshot, &changes)?;
    let netns = Netns::with_underlay()?;
    let daemon = Vxmgrd::netlink(&netns, &["--batch-interval", "1ms"])?;
    let mut table = Table::new(
        format!(
            "soak: {nodes} nodes, {JOINERS} nodes joining, moving their VTEP back and forth and leaving, for {} s (netlink)",
            duration.as_secs()
        ),
        &[
            "elapsed s",
            "operations",
            "not OK",
            "RSS MiB",
            "routes",
            "nexthops",
            "neighbours",
            "fdb",
            "ipset",
        ],
    );
    bench.runtime.block_on(async {
        let mut session = Session::open(&daemon.socket()).await?;
        ensure!(
            session.send(snapshot).await?.all_ok(),
            "the snapshot did not apply cleanly"
        );
        let converged = census(&netns)?;
        table.row(row(0, 0, 0, &daemon, &converged)?);
        let started = Instant::now();
        let (mut operations, mut not_ok) = (0u64, 0u64);
        let mut next_sample = SAMPLE_EVERY;
        let mut round = 0usize;
        while started.elapsed() < duration {
            let k = round % joiners.len();
            round += 1;
            for batch in [
                joiners[k].clone(),
                vec![changes[k].clone()],
                vec![reverts[k].clone()],
                leave(&joiners[k])?,
            ] {
                not_ok += u64::from(!session.send(batch).await?.all_ok());
                operations += 1;
            }
            if started.elapsed() >= next_sample {
                next_sample += SAMPLE_EVERY;
                let counts = census(&netns)?;
                table.row(row(
                    started.elapsed().as_secs(),
                    operations,
                    not_ok,
                    &daemon,
                    &counts,
                )?);
            }
        }
        let end = census(&netns)?;
        table.row(row(
            started.elapsed().as_secs(),
            operations,
            not_ok,
            &daemon,
            &end,
        )?);
        table.print();
        let leaked: Vec<String> = NAMES
            .iter()
            .zip(converged.iter().zip(&end))
            .filter(|(_, (a, b))| a != b)
            .map(|(name, (a, b))| format!("{name} {a} → {b}"))
            .collect();
        if leaked.is_empty() {
            println!("  kernel objects at the end equal those after convergence: nothing leaked");
        } else {
            println!(
                "  KERNEL OBJECTS DIFFER FROM CONVERGENCE: {}",
                leaked.join(", ")
            );
        }
        Ok(())
    })
}

const NAMES: [&str; 5] = ["routes", "nexthops", "neighbours", "fdb", "ipset"];

fn row(
    elapsed: u64,
    operations: u64,
    not_ok: u64,
    daemon: &Vxmgrd,
    counts: &[usize; 5],
) -> Result<Vec<String>> {
    let mut cells = vec![
        elapsed.to_string(),
        operations.to_string(),
        not_ok.to_string(),
        format!("{:.1}", daemon.rss_bytes()? as f64 / f64::from(1 << 20)),
    ];
    cells.extend(counts.iter().map(ToString::to_string));
    Ok(cells)
}

/// The snapshot's VTEP of each node a change moves: sending it moves the
/// VTEP back.
fn originals(snapshot: &[ToDataplane], changes: &[ToDataplane]) -> Result<Vec<ToDataplane>> {
    changes
        .iter()
        .map(|change| {
            let Some(Payload::VtepUpdate(moved)) = &change.payload else {
                anyhow::bail!("a VTEP change that is not a VTEP update");
            };
            snapshot
                .iter()
                .find(
                    |m| matches!(&m.payload, Some(Payload::VtepUpdate(v)) if v.node == moved.node),
                )
                .cloned()
                .with_context(|| format!("no VTEP for {}", moved.node))
        })
        .collect()
}

/// Our objects in the namespace: routes (both families), nexthops, ARP/NDP
/// entries, FDB entries and ipset members of the IPv4 device and set.
fn census(netns: &Netns) -> Result<[usize; 5]> {
    let json = |args: &[&str]| -> Result<Value> {
        let out = netns.ip(args)?;
        let text = String::from_utf8(out.stdout)?;
        Ok(if text.trim().is_empty() {
            Value::Array(Vec::new())
        } else {
            serde_json::from_str(&text)?
        })
    };
    let count = |v: Value| v.as_array().map_or(0, Vec::len);
    let routes = count(json(&["-j", "-4", "route", "show", "proto", "80"])?)
        + count(json(&["-j", "-6", "route", "show", "proto", "80"])?);
    let nexthops = count(json(&["-j", "nexthop", "show", "proto", "80"])?);
    let neighbours = count(json(&[
        "-j",
        "neigh",
        "show",
        "dev",
        "vxlan.calico",
        "nud",
        "permanent",
    ])?);
    let fdb_out = crate::netns::run(netns.command("bridge").args([
        "-j",
        "fdb",
        "show",
        "dev",
        "vxlan.calico",
    ]))?;
    let fdb: Value = serde_json::from_slice(&fdb_out.stdout)?;
    let fdb = fdb.as_array().map_or(0, |entries| {
        entries
            .iter()
            .filter(|e| e["state"] == "permanent" && !e["dst"].is_null())
            .count()
    });
    let ipset_out =
        crate::netns::run(netns.command("ipset").args(["list", "cali40all-vxlan-net"]))?;
    let ipset = String::from_utf8(ipset_out.stdout)?
        .lines()
        .skip_while(|l| !l.starts_with("Members:"))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count();
    Ok([routes, nexthops, neighbours, fdb, ipset])
}

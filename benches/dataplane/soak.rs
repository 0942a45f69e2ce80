//! soak: minutes of churn against the netlink backend. Resident memory
//! must stay flat and the kernel must end up holding exactly what it held
//! after convergence: nothing leaked, nothing lost.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};

use crate::testbed::{Census, Churn};

use crate::Bench;
use crate::cluster::LOCAL_NODE;
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
    let (snapshot, churn) =
        Churn::new(bench.clusters.messages(nodes + JOINERS)?, nodes, LOCAL_NODE)?;
    let netns = Netns::with_underlay()?;
    let daemon = Vxmgrd::netlink(&netns, &["--batch-interval", "1ms"])?;
    let mut columns = vec!["elapsed s", "operations", "not OK", "RSS MiB"];
    columns.extend(crate::testbed::census::KINDS);
    let mut table = Table::new(
        format!(
            "soak: {nodes} nodes, {JOINERS} nodes joining, moving their VTEP back and forth and leaving, for {} s (netlink)",
            duration.as_secs()
        ),
        &columns,
    );
    bench.runtime.block_on(async {
        let mut session = Session::open(&daemon.socket()).await?;
        session.send(snapshot).await?.ensure_ok("the snapshot")?;
        let converged = Census::of(netns.name())?;
        table.row(row(0, 0, 0, &daemon, &converged)?);
        let started = Instant::now();
        let (mut operations, mut not_ok) = (0u64, 0u64);
        let mut next_sample = SAMPLE_EVERY;
        let mut round = 0usize;
        while started.elapsed() < duration {
            for batch in churn.round(round)? {
                not_ok += u64::from(!session.send(batch).await?.all_ok());
                operations += 1;
            }
            round += 1;
            if started.elapsed() >= next_sample {
                next_sample += SAMPLE_EVERY;
                let census = Census::of(netns.name())?;
                table.row(row(
                    started.elapsed().as_secs(),
                    operations,
                    not_ok,
                    &daemon,
                    &census,
                )?);
            }
        }
        let end = Census::of(netns.name())?;
        table.row(row(
            started.elapsed().as_secs(),
            operations,
            not_ok,
            &daemon,
            &end,
        )?);
        table.print();
        let differences = converged.differences(&end);
        ensure!(
            differences.is_empty(),
            "kernel objects at the end differ from those after convergence (first: converged, second: end):\n  {}",
            differences.join("\n  ")
        );
        ensure!(not_ok == 0, "{not_ok} operations were not OK");
        println!("  kernel objects at the end equal those after convergence: nothing leaked");
        Ok(())
    })
}

fn row(
    elapsed: u64,
    operations: u64,
    not_ok: u64,
    daemon: &Vxmgrd,
    census: &Census,
) -> Result<Vec<String>> {
    let mut cells = vec![
        elapsed.to_string(),
        operations.to_string(),
        not_ok.to_string(),
        format!("{:.1}", daemon.rss_bytes()? as f64 / f64::from(1 << 20)),
    ];
    cells.extend(census.counts().iter().map(ToString::to_string));
    Ok(cells)
}

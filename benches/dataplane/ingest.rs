//! ingest: how fast messages go through the socket, the server and the
//! manager, on the memory kernel (no root needed).

use std::time::Duration;

use anyhow::Result;

use crate::Bench;
use crate::daemon::Vxmgrd;
use crate::report::{Table, median, min, secs};
use crate::stream::{Delivery, replay};

pub fn run(bench: &Bench) -> Result<()> {
    let nodes = bench.settings.ingest_nodes;
    let messages = bench.clusters.messages(nodes)?;
    let count = messages.len();
    let mut deliveries = Vec::new();
    for run in 1..=bench.settings.ingest_runs {
        // A fresh daemon each time: a second stream would be a resync
        // against state already there, which is other work.
        let daemon = Vxmgrd::memory(&[])?;
        let delivery = bench
            .runtime
            .block_on(replay(&daemon.socket(), messages.clone()))?;
        eprintln!("ingest: run {run}: {}", secs(delivery.covered));
        deliveries.push(delivery);
    }
    print(nodes, count, &deliveries);
    Ok(())
}

fn print(nodes: u32, count: usize, deliveries: &[Delivery]) {
    let mut table = Table::new(
        format!("ingest: {nodes} nodes, {count} messages, memory kernel, default flags"),
        &[
            "run",
            "sent (s)",
            "covered (s)",
            "messages/s",
            "batches",
            "statuses",
        ],
    );
    let row = |what: String, sent: Duration, covered: Duration, batches: String, verdict: &str| {
        let rate = count as f64 / covered.as_secs_f64();
        vec![
            what,
            secs(sent),
            secs(covered),
            format!("{rate:.0}"),
            batches,
            verdict.into(),
        ]
    };
    for (run, d) in (1..).zip(deliveries) {
        let verdict = if d.all_ok() { "all OK" } else { "NOT all OK" };
        let batches = d.statuses.len().to_string();
        table.row(row(run.to_string(), d.sent, d.covered, batches, verdict));
    }
    let sent: Vec<Duration> = deliveries.iter().map(|d| d.sent).collect();
    let covered: Vec<Duration> = deliveries.iter().map(|d| d.covered).collect();
    table.row(row(
        "best".into(),
        min(&sent),
        min(&covered),
        String::new(),
        "",
    ));
    table.row(row(
        "median".into(),
        median(&sent),
        median(&covered),
        String::new(),
        "",
    ));
    table.print();
    println!(
        "  sent: first message → last handed to the stream; covered: → status covering the last."
    );
}

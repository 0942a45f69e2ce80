//! churn: on a daemon converged on N nodes, nodes join, change their VTEP
//! and leave, one operation at a time on the open stream.

use std::time::Duration;

use anyhow::Result;

use crate::testbed::churn::{leave, split, vtep_changes};

use crate::Bench;
use crate::cluster::LOCAL_NODE;
use crate::daemon::Vxmgrd;
use crate::netns::Netns;
use crate::report::{Table, median, millis, quantile, ratio};
use crate::stream::{Delivery, Session};

/// The operations, in the order each round sends them.
#[derive(Clone, Copy)]
pub enum Op {
    Join,
    VtepChange,
    Leave,
}

impl Op {
    pub const ALL: [Op; 3] = [Op::Join, Op::VtepChange, Op::Leave];

    fn name(self) -> &'static str {
        match self {
            Op::Join => "join",
            Op::VtepChange => "vtep change",
            Op::Leave => "leave",
        }
    }
}

/// One kind of operation's figures: the daemon's apply time, the client's
/// round trip, and how many statuses were not OK.
#[derive(Default)]
struct OpSamples {
    apply: Vec<Duration>,
    round_trip: Vec<Duration>,
    not_ok: usize,
}

#[derive(Default)]
pub struct Samples([OpSamples; 3]);

impl Samples {
    fn record(&mut self, op: Op, delivery: &Delivery) {
        let samples = &mut self.0[op as usize];
        samples.apply.push(delivery.apply_time());
        samples.round_trip.push(delivery.covered);
        samples.not_ok += usize::from(!delivery.all_ok());
    }

    fn of(&self, op: Op) -> &OpSamples {
        &self.0[op as usize]
    }

    pub fn round_trip_p99(&self, op: Op) -> Duration {
        quantile(&self.of(op).round_trip, 0.99)
    }

    pub fn round_trip_slowest(&self, op: Op) -> Duration {
        quantile(&self.of(op).round_trip, 1.0)
    }
}

pub fn run(bench: &Bench) -> Result<()> {
    let mut by_size = Vec::new();
    for &nodes in &bench.settings.sizes {
        by_size.push((nodes, churn(bench, nodes)?));
    }
    print_samples(&by_size);
    print_growth(&by_size);
    Ok(())
}

fn print_samples(by_size: &[(u32, Samples)]) {
    let mut table = Table::new(
        "churn: one operation at a time on a converged daemon (ms; default flags)",
        &[
            "nodes",
            "operation",
            "count",
            "apply median",
            "apply p99",
            "round trip median",
            "round trip p99",
            "not OK",
        ],
    );
    for (nodes, samples) in by_size {
        for op in Op::ALL {
            let s = samples.of(op);
            table.row(vec![
                nodes.to_string(),
                op.name().into(),
                s.apply.len().to_string(),
                millis(median(&s.apply)),
                millis(quantile(&s.apply, 0.99)),
                millis(median(&s.round_trip)),
                millis(quantile(&s.round_trip, 0.99)),
                s.not_ok.to_string(),
            ]);
        }
    }
    table.print();
    println!(
        "  apply: the statuses' apply_micros; round trip: first message sent → status covering the last."
    );
}

/// How the medians grow from the smallest to the largest cluster: a cost
/// that grows with the size of the change stays near 1.
fn print_growth(by_size: &[(u32, Samples)]) {
    let (Some((small, first)), Some((large, last))) = (by_size.first(), by_size.last()) else {
        return;
    };
    if small == large {
        return;
    }
    let mut table = Table::new(
        format!("churn: median({large} nodes) / median({small} nodes)"),
        &["operation", "apply", "round trip"],
    );
    for op in Op::ALL {
        let (first, last) = (first.of(op), last.of(op));
        table.row(vec![
            op.name().into(),
            ratio(median(&last.apply), median(&first.apply)),
            ratio(median(&last.round_trip), median(&first.round_trip)),
        ]);
    }
    table.print();
}

pub fn churn(bench: &Bench, nodes: u32) -> Result<Samples> {
    let ops = bench.settings.churn_ops.min(nodes - 1);
    // The joining nodes come from a larger generated cluster, so they are
    // addressed exactly as the others.
    let (snapshot, joiners) = split(bench.clusters.messages(nodes + ops)?, nodes);
    let changes = vtep_changes(&snapshot, LOCAL_NODE, ops as usize)?;
    let netns = Netns::with_underlay()?;
    // Default flags, as a user runs it: the periodic resync (90 s) lands
    // after the operations are done.
    let daemon = Vxmgrd::netlink(&netns, &[])?;
    eprintln!("churn: {nodes} nodes: converging");
    let samples = bench.runtime.block_on(async {
        let mut session = Session::open(&daemon.socket()).await?;
        let converged = session.send(snapshot).await?;
        converged.ensure_ok("the snapshot")?;
        let mut samples = Samples::default();
        for (joiner, change) in joiners.into_iter().zip(changes) {
            let leave = leave(&joiner)?;
            samples.record(Op::Join, &session.send(joiner).await?);
            samples.record(Op::VtepChange, &session.send(vec![change]).await?);
            samples.record(Op::Leave, &session.send(leave).await?);
        }
        anyhow::Ok(samples)
    })?;
    eprintln!("churn: {nodes} nodes: {ops} operations of each kind done");
    Ok(samples)
}

//! churn: on a daemon converged on N nodes, nodes join, change their VTEP
//! and leave, one operation at a time on the open stream.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use vxmgr::wire::felix::{
    RouteRemove, ToDataplane, VxlanTunnelEndpointRemove, VxlanTunnelEndpointUpdate,
    to_dataplane::Payload,
};

use crate::Bench;
use crate::cluster::{node_index, node_of};
use crate::daemon::Vxmgrd;
use crate::netns::Netns;
use crate::report::{Table, median, millis, quantile, ratio};
use crate::stream::{Delivery, Session};

/// The operations, in the order each round sends them.
#[derive(Clone, Copy)]
enum Op {
    Join,
    VtepChange,
    Leave,
}

impl Op {
    const ALL: [Op; 3] = [Op::Join, Op::VtepChange, Op::Leave];

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
struct Samples([OpSamples; 3]);

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
        "churn: one operation at a time on a converged daemon (ms; --batch-interval 1ms)",
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

fn churn(bench: &Bench, nodes: u32) -> Result<Samples> {
    let ops = bench.settings.churn_ops.min(nodes - 1);
    // The joining nodes come from a larger generated cluster, so they are
    // addressed exactly as the others.
    let (snapshot, joiners) = split(bench.clusters.messages(nodes + ops)?, nodes);
    let changes = vtep_changes(&snapshot, ops as usize)?;
    let netns = Netns::with_underlay()?;
    // No periodic resync: one landing among the operations would be
    // measured as their cost.
    let daemon = Vxmgrd::netlink(
        &netns,
        &["--batch-interval", "1ms", "--route-refresh-interval", "0"],
    )?;
    eprintln!("churn: {nodes} nodes: converging");
    let samples = bench.runtime.block_on(async {
        let mut session = Session::open(&daemon.socket()).await?;
        let converged = session.send(snapshot).await?;
        ensure!(converged.all_ok(), "the snapshot did not apply cleanly");
        let mut samples = Samples::default();
        for (joiner, change) in joiners.into_iter().zip(changes) {
            let leave = leave(&joiner)?;
            samples.record(Op::Join, &session.send(joiner).await?);
            samples.record(Op::VtepChange, &session.send(vec![change]).await?);
            samples.record(Op::Leave, &session.send(leave).await?);
        }
        Ok(samples)
    })?;
    eprintln!("churn: {nodes} nodes: {ops} operations of each kind done");
    Ok(samples)
}

/// The view of the first `nodes` nodes (ending with InSync), and each
/// further node's messages: its VTEP, then its routes.
pub(crate) fn split(
    world: Vec<ToDataplane>,
    nodes: u32,
) -> (Vec<ToDataplane>, Vec<Vec<ToDataplane>>) {
    let mut snapshot = Vec::new();
    let mut joiners: BTreeMap<u32, Vec<ToDataplane>> = BTreeMap::new();
    for msg in world {
        match node_of(&msg).and_then(node_index) {
            Some(i) if i >= nodes => joiners.entry(i).or_default().push(msg),
            _ => snapshot.push(msg),
        }
    }
    (snapshot, joiners.into_values().collect())
}

/// A node leaving: its routes removed, then its VTEP.
pub(crate) fn leave(joiner: &[ToDataplane]) -> Result<Vec<ToDataplane>> {
    let mut node = None;
    let mut messages = Vec::new();
    for msg in joiner {
        match &msg.payload {
            Some(Payload::VtepUpdate(v)) => node = Some(v.node.clone()),
            Some(Payload::RouteUpdate(r)) => {
                messages.push(message(Payload::RouteRemove(RouteRemove {
                    dst: r.dst.clone(),
                })))
            }
            _ => {}
        }
    }
    let node = node.context("a joining node without a VTEP")?;
    messages.push(message(Payload::VtepRemove(VxlanTunnelEndpointRemove {
        node,
    })));
    Ok(messages)
}

/// `count` remote nodes spread over the cluster, each moving its VTEP to
/// the next tunnel address and another MAC.
pub(crate) fn vtep_changes(snapshot: &[ToDataplane], count: usize) -> Result<Vec<ToDataplane>> {
    let remotes: Vec<&VxlanTunnelEndpointUpdate> = snapshot
        .iter()
        .filter_map(|m| match &m.payload {
            Some(Payload::VtepUpdate(v)) if node_index(&v.node) != Some(0) => Some(v),
            _ => None,
        })
        .collect();
    ensure!(
        remotes.len() >= count,
        "too few remote nodes for {count} VTEP changes"
    );
    (0..count)
        .map(|j| {
            let v = remotes[j * remotes.len() / count];
            let tunnel: Ipv4Addr = v.ipv4_addr.parse()?;
            Ok(message(Payload::VtepUpdate(VxlanTunnelEndpointUpdate {
                ipv4_addr: Ipv4Addr::from(u32::from(tunnel) + 1).to_string(),
                mac: other_mac(&v.mac)?,
                ..v.clone()
            })))
        })
        .collect()
}

/// The MAC with one bit of its second byte flipped: still unicast and
/// locally administered, and unlike every generated MAC.
fn other_mac(mac: &str) -> Result<String> {
    let mut bytes = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<Vec<u8>, _>>()
        .with_context(|| format!("MAC {mac}"))?;
    ensure!(bytes.len() == 6, "MAC {mac}");
    bytes[1] ^= 1;
    Ok(bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":"))
}

fn message(payload: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(payload),
    }
}

//! Churn on a cluster from `calc-stub generate`: nodes joining, moving
//! their VTEP and leaving on a converged daemon, as the churn and soak
//! benchmarks and the soak test send them.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use super::{Result, TestbedError, run, sh};
use vxmgr::model::MacAddr;
use vxmgr::wire::felix::{
    ConfigUpdate, RouteRemove, ToDataplane, VxlanTunnelEndpointRemove, VxlanTunnelEndpointUpdate,
    to_dataplane::Payload,
};
use vxmgr::wire::replay::read_file;

/// The node whose view generated worlds are in the namespace tests, and
/// the underlay addresses `calc-stub generate` gives it (node i has
/// 172.16.0.0 + i + 1 and fd00:172:: + i + 1), with prefixes that hold
/// every generated node's.
pub const GENERATED_LOCAL: &str = "node-1";
const GENERATED_UNDERLAY: [&str; 2] = [
    "ip addr add 172.16.0.2/12 dev eth0",
    "ip -6 addr add fd00:172::2/64 dev eth0 nodad",
];

/// Gives the node in namespace `ns` (a cluster's node-1) its generated
/// underlay addresses, so that generated worlds apply to it.
pub fn add_generated_underlay(ns: &str) -> Result<()> {
    for command in GENERATED_UNDERLAY {
        sh(ns, command)?;
    }
    Ok(())
}

/// `calc-stub generate --nodes N --blocks-per-node B --local-node L`
/// (with `--ipv6`, both families) written to `out`, and read back.
pub fn generate(
    calc_stub: &Path,
    out: &Path,
    nodes: u32,
    blocks_per_node: u32,
    local: &str,
    ipv6: bool,
) -> Result<Vec<ToDataplane>> {
    generate_file(calc_stub, out, nodes, blocks_per_node, local, ipv6)?;
    read_file(out).map_err(|e| TestbedError::Churn(e.to_string()))
}

/// `calc-stub generate` written to `out` (JSON lines for `.jsonl`, Felix
/// framing otherwise), as `generate` but not read back.
pub fn generate_file(
    calc_stub: &Path,
    out: &Path,
    nodes: u32,
    blocks_per_node: u32,
    local: &str,
    ipv6: bool,
) -> Result<()> {
    let (nodes, blocks) = (nodes.to_string(), blocks_per_node.to_string());
    let mut args = vec![
        "generate",
        "--nodes",
        &nodes,
        "--blocks-per-node",
        &blocks,
        "--local-node",
        local,
    ];
    if ipv6 {
        args.push("--ipv6");
    }
    let out_arg = out.to_string_lossy();
    args.extend(["-o", &out_arg]);
    let calc_stub = calc_stub.to_string_lossy();
    run(&[&[calc_stub.as_ref()], args.as_slice()].concat())?;
    Ok(())
}

/// The node a VTEP or route message is about.
pub fn node_of(msg: &ToDataplane) -> Option<&str> {
    match msg.payload.as_ref()? {
        Payload::VtepUpdate(v) => Some(&v.node),
        Payload::RouteUpdate(r) => Some(&r.dst_node_name),
        _ => None,
    }
}

/// A node's index in a generated cluster (`node-<i>`).
pub fn node_index(name: &str) -> Option<u32> {
    name.strip_prefix("node-")?.parse().ok()
}

/// The view of the first `nodes` nodes (ending with InSync), and each
/// further node's messages: its VTEP, then its routes.
pub fn split(world: Vec<ToDataplane>, nodes: u32) -> (Vec<ToDataplane>, Vec<Vec<ToDataplane>>) {
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
pub fn leave(joiner: &[ToDataplane]) -> Result<Vec<ToDataplane>> {
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
    let node = node.ok_or_else(|| TestbedError::Churn("a joining node without a VTEP".into()))?;
    messages.push(message(Payload::VtepRemove(VxlanTunnelEndpointRemove {
        node,
    })));
    Ok(messages)
}

/// `count` nodes other than `local` spread over the snapshot, each moving
/// its IPv4 VTEP to the next tunnel address and another MAC.
pub fn vtep_changes(
    snapshot: &[ToDataplane],
    local: &str,
    count: usize,
) -> Result<Vec<ToDataplane>> {
    let remotes: Vec<&VxlanTunnelEndpointUpdate> = snapshot
        .iter()
        .filter_map(|m| match &m.payload {
            Some(Payload::VtepUpdate(v)) if v.node != local => Some(v),
            _ => None,
        })
        .collect();
    if remotes.len() < count {
        return Err(TestbedError::Churn(format!(
            "{} remote nodes, too few for {count} VTEP changes",
            remotes.len()
        )));
    }
    (0..count)
        .map(|j| {
            let v = remotes[j * remotes.len() / count];
            let tunnel: Ipv4Addr = v.ipv4_addr.parse().map_err(|e| {
                TestbedError::Churn(format!("{}: tunnel address {}: {e}", v.node, v.ipv4_addr))
            })?;
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
    let parsed: MacAddr = mac
        .parse()
        .map_err(|e| TestbedError::Churn(format!("MAC {mac}: {e}")))?;
    let mut bytes = parsed.octets();
    bytes[1] ^= 1;
    Ok(MacAddr(bytes).to_string())
}

/// The snapshot's VTEP of each node a change moves: sending it moves the
/// VTEP back.
pub fn originals(snapshot: &[ToDataplane], changes: &[ToDataplane]) -> Result<Vec<ToDataplane>> {
    changes
        .iter()
        .map(|change| {
            let Some(Payload::VtepUpdate(moved)) = &change.payload else {
                return Err(TestbedError::Churn(
                    "a VTEP change that is not a VTEP update".into(),
                ));
            };
            snapshot
                .iter()
                .find(
                    |m| matches!(&m.payload, Some(Payload::VtepUpdate(v)) if v.node == moved.node),
                )
                .cloned()
                .ok_or_else(|| TestbedError::Churn(format!("no VTEP for {}", moved.node)))
        })
        .collect()
}

/// Rounds of churn on a converged snapshot: in round k a node joins,
/// another moves its VTEP and back, and the joined node leaves, so after
/// every round the kernel should hold what it held after convergence.
pub struct Churn {
    joiners: Vec<Vec<ToDataplane>>,
    changes: Vec<ToDataplane>,
    reverts: Vec<ToDataplane>,
}

impl Churn {
    /// Splits a generated world into the snapshot of its first `nodes`
    /// nodes and the churn of the others, `local` being the node whose
    /// view it is.
    pub fn new(
        world: Vec<ToDataplane>,
        nodes: u32,
        local: &str,
    ) -> Result<(Vec<ToDataplane>, Churn)> {
        let (snapshot, joiners) = split(world, nodes);
        if joiners.is_empty() {
            return Err(TestbedError::Churn(format!(
                "the world has no nodes beyond the first {nodes} to join"
            )));
        }
        let changes = vtep_changes(&snapshot, local, joiners.len())?;
        let reverts = originals(&snapshot, &changes)?;
        Ok((
            snapshot,
            Churn {
                joiners,
                changes,
                reverts,
            },
        ))
    }

    /// Round `k`'s four operations, each one batch: join, VTEP change,
    /// VTEP change back, leave.
    pub fn round(&self, k: usize) -> Result<[Vec<ToDataplane>; 4]> {
        let k = k % self.joiners.len();
        Ok([
            self.joiners[k].clone(),
            vec![self.changes[k].clone()],
            vec![self.reverts[k].clone()],
            leave(&self.joiners[k])?,
        ])
    }
}

/// A message to be numbered as it is sent.
pub fn message(payload: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(payload),
    }
}

/// The VTEPs and routes of `messages`, without a config or InSync: what
/// views of a generated world are made of.
pub fn topology(messages: Vec<ToDataplane>) -> Vec<ToDataplane> {
    messages
        .into_iter()
        .filter(|m| {
            matches!(
                m.payload,
                Some(Payload::VtepUpdate(_) | Payload::RouteUpdate(_))
            )
        })
        .collect()
}

/// The config of a generated world on VXLAN network `vni`.
pub fn config(vni: u32) -> ToDataplane {
    message(Payload::ConfigUpdate(ConfigUpdate {
        config: [("VXLANVNI", vni.to_string()), ("VXLANPort", "4789".into())]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ..Default::default()
    }))
}

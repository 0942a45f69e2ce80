//! `calc-stub generate`: a synthetic cluster as one node's calc graph would
//! stream it: config, the IP pools (with `--pools`), every VTEP, every IPAM
//! block, InSync.
//!
//! Addressing: block j of node i is the j-th /26 (or /122) after
//! 10.0.0.0 (fd00:244::) counting i*K+j, within 10.0.0.0/8 while the blocks
//! fit there and 10.0.0.0/7 beyond (100,000 nodes of 4 blocks); a node's tunnel address is the
//! first address of its first block; its underlay address is
//! 172.16.0.0 (fd00:172::) + i + 1.

use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use vxmgr::wire::Received;
use vxmgr::wire::felix::{
    ConfigUpdate, InSync, IpPoolType, IpamPool, IpamPoolUpdate, RouteType, RouteUpdate,
    ToDataplane, VxlanTunnelEndpointUpdate, to_dataplane::Payload,
};
use vxmgr::wire::replay::{ReplayFormat, ReplayWriter};

use crate::StubError;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Nodes in the cluster, the local one included.
    #[arg(long)]
    nodes: u32,
    /// IPAM blocks per node.
    #[arg(long, default_value_t = 4)]
    blocks_per_node: u32,
    /// The node whose view this is; its blocks become blackholes.
    #[arg(long, default_value = "node-0")]
    local_node: String,
    /// Give every node IPv6 addresses and blocks too.
    #[arg(long)]
    ipv6: bool,
    /// Declare the blocks' IP pools, masquerading (Felix's natOutgoing):
    /// 10.0.0.0/8 (10.0.0.0/7 for more blocks than it holds), and
    /// fd00:244::/48 with --ipv6.
    #[arg(long)]
    pools: bool,
    /// Write here instead of standard output (.jsonl: JSON lines; otherwise Felix framing).
    #[arg(long, short)]
    output: Option<PathBuf>,
}

const MAX_NODES: u32 = 1 << 20;
/// /26 blocks in 10.0.0.0/7.
const MAX_BLOCKS: u64 = 1 << 19;
/// /26 blocks in 10.0.0.0/8, the IPv4 pool of clusters that fit in it.
const BLOCKS_IN_SLASH_8: u64 = 1 << 18;

pub fn run(args: GenerateArgs) -> Result<bool, StubError> {
    if args.nodes == 0 || args.nodes > MAX_NODES {
        return Err(StubError::Other(format!(
            "--nodes must be from 1 to {MAX_NODES}"
        )));
    }
    let blocks = u64::from(args.nodes) * u64::from(args.blocks_per_node);
    if args.blocks_per_node == 0 || blocks > MAX_BLOCKS {
        return Err(StubError::Other(format!(
            "--nodes × --blocks-per-node must be from 1 to {MAX_BLOCKS} (/26 blocks of 10.0.0.0/7)"
        )));
    }
    let local_exists = args
        .local_node
        .strip_prefix("node-")
        .and_then(|i| i.parse::<u32>().ok())
        .is_some_and(|i| i < args.nodes && node_name(i) == args.local_node);
    if !local_exists {
        return Err(StubError::Other(format!(
            "--local-node {:?} is not one of the generated nodes (node-0 to node-{})",
            args.local_node,
            args.nodes - 1
        )));
    }
    let write = |out: &mut dyn Write, format| -> io::Result<()> {
        let mut w = ReplayWriter::new(out, format);
        for msg in cluster(&args) {
            w.write(&Received::encode(&msg))?;
        }
        w.flush()
    };
    let result = match &args.output {
        Some(path) => std::fs::File::create(path)
            .and_then(|f| write(&mut BufWriter::new(f), ReplayFormat::for_path(path))),
        None => write(&mut io::stdout().lock(), ReplayFormat::Jsonl),
    };
    result.map_err(|e| StubError::Other(format!("writing the cluster: {e}")))?;
    Ok(true)
}

fn node_name(i: u32) -> String {
    format!("node-{i}")
}

fn block_v4(index: u64) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (index as u32) * 64)
}

fn block_v6(index: u64) -> Ipv6Addr {
    Ipv6Addr::from(u128::from("fd00:244::".parse::<Ipv6Addr>().unwrap()) + u128::from(index) * 64)
}

fn underlay_v4(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + i + 1)
}

fn underlay_v6(i: u32) -> Ipv6Addr {
    Ipv6Addr::from(u128::from("fd00:172::".parse::<Ipv6Addr>().unwrap()) + u128::from(i) + 1)
}

fn mac(i: u32, family: u8) -> String {
    let b = i.to_be_bytes();
    format!(
        "66:{family:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[0], b[1], b[2], b[3]
    )
}

fn message(payload: Payload) -> ToDataplane {
    ToDataplane {
        sequence_number: 0,
        payload: Some(payload),
    }
}

/// Every message of the cluster, in the order the calc graph sends them.
fn cluster(args: &GenerateArgs) -> impl Iterator<Item = ToDataplane> + '_ {
    let config = ConfigUpdate {
        config: [("VXLANVNI", "4096"), ("VXLANPort", "4789")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let blocks = u64::from(args.nodes) * u64::from(args.blocks_per_node);
    let pool_v4 = if blocks > BLOCKS_IN_SLASH_8 {
        "10.0.0.0/7"
    } else {
        "10.0.0.0/8"
    };
    let pools = [
        ("pool-ipv4", pool_v4, true),
        ("pool-ipv6", "fd00:244::/48", args.ipv6),
    ]
    .into_iter()
    .filter(move |(_, _, wanted)| args.pools && *wanted)
    .map(|(id, cidr, _)| {
        message(Payload::IpamPoolUpdate(IpamPoolUpdate {
            id: id.to_string(),
            pool: Some(IpamPool {
                cidr: cidr.to_string(),
                masquerade: true,
                vxlan_mode: "Always".to_string(),
                ..Default::default()
            }),
        }))
    });
    let k = u64::from(args.blocks_per_node);
    let vteps = (0..args.nodes).map(move |i| {
        let first = u64::from(i) * k;
        let mut v = VxlanTunnelEndpointUpdate {
            node: node_name(i),
            mac: mac(i, 0xaa),
            ipv4_addr: block_v4(first).to_string(),
            parent_device_ip: underlay_v4(i).to_string(),
            ..Default::default()
        };
        if args.ipv6 {
            v.mac_v6 = mac(i, 0xbb);
            v.ipv6_addr = block_v6(first).to_string();
            v.parent_device_ipv6 = underlay_v6(i).to_string();
        }
        message(Payload::VtepUpdate(v))
    });
    let routes = (0..args.nodes).flat_map(move |i| {
        let node = node_name(i);
        let local = node == args.local_node;
        let first = u64::from(i) * k;
        let families: Vec<(IpAddr, u8, IpAddr)> = (first..first + k)
            .flat_map(|b| {
                let mut v = vec![(IpAddr::V4(block_v4(b)), 26, IpAddr::V4(underlay_v4(i)))];
                if args.ipv6 {
                    v.push((IpAddr::V6(block_v6(b)), 122, IpAddr::V6(underlay_v6(i))));
                }
                v
            })
            .collect();
        let mut out = Vec::new();
        for (net, prefix, node_ip) in families {
            let types = if local {
                RouteType::LocalWorkload
            } else {
                RouteType::RemoteWorkload
            };
            out.push(route(
                &node,
                format!("{net}/{prefix}"),
                types as i32,
                node_ip,
            ));
        }
        if !local {
            let tunnel = (RouteType::RemoteWorkload as i32) | (RouteType::RemoteTunnel as i32);
            out.push(route(
                &node,
                format!("{}/32", block_v4(first)),
                tunnel,
                IpAddr::V4(underlay_v4(i)),
            ));
            if args.ipv6 {
                out.push(route(
                    &node,
                    format!("{}/128", block_v6(first)),
                    tunnel,
                    IpAddr::V6(underlay_v6(i)),
                ));
            }
        }
        out
    });
    std::iter::once(message(Payload::ConfigUpdate(config)))
        .chain(pools)
        .chain(vteps)
        .chain(routes)
        .chain(std::iter::once(message(Payload::InSync(InSync {}))))
}

fn route(node: &str, dst: String, types: i32, node_ip: IpAddr) -> ToDataplane {
    message(Payload::RouteUpdate(RouteUpdate {
        ip_pool_type: IpPoolType::Vxlan as i32,
        dst,
        dst_node_name: node.to_string(),
        dst_node_ip: node_ip.to_string(),
        types,
        ..Default::default()
    }))
}

//! Synthetic clusters from `calc-stub generate` (node-0's view of N nodes ×
//! 4 blocks), and the plain facts of a view that the iproute2 baseline
//! needs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::testbed::churn::generate_file;
use vxmgr::wire::felix::{
    RouteType, ToDataplane, VxlanTunnelEndpointUpdate, to_dataplane::Payload,
};
use vxmgr::wire::replay::{ReplayFormat, read_file};

pub const CALC_STUB: &str = env!("CARGO_BIN_EXE_calc-stub");
pub const BLOCKS_PER_NODE: u32 = 4;
pub const LOCAL_NODE: &str = "node-0";

/// Generated cluster files, made once per size and removed at the end.
pub struct Clusters {
    dir: TempDir,
}

impl Clusters {
    pub fn new() -> Result<Clusters> {
        Ok(Clusters {
            dir: tempfile::tempdir()?,
        })
    }

    /// node-0's view of `nodes` nodes, in the order the calc graph sends it:
    /// config, every VTEP, every block and tunnel address, InSync.
    pub fn messages(&self, nodes: u32) -> Result<Vec<ToDataplane>> {
        let path = self.file(nodes, ReplayFormat::Framed)?;
        read_file(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// The file of node-0's view of `nodes` nodes in `format`, generated
    /// on first use.
    pub fn file(&self, nodes: u32, format: ReplayFormat) -> Result<PathBuf> {
        let extension = match format {
            ReplayFormat::Jsonl => "jsonl",
            ReplayFormat::Framed => "bin",
        };
        let path = self.dir.path().join(format!("cluster-{nodes}.{extension}"));
        if !path.exists() {
            generate_file(
                Path::new(CALC_STUB),
                &path,
                nodes,
                BLOCKS_PER_NODE,
                LOCAL_NODE,
                false,
            )?;
        }
        Ok(path)
    }
}

/// One node's VXLAN tunnel endpoint (IPv4).
#[derive(Clone, Debug)]
pub struct Vtep {
    pub tunnel: String,
    pub mac: String,
    pub parent: String,
}

impl From<&VxlanTunnelEndpointUpdate> for Vtep {
    fn from(v: &VxlanTunnelEndpointUpdate) -> Vtep {
        Vtep {
            tunnel: v.ipv4_addr.clone(),
            mac: v.mac.clone(),
            parent: v.parent_device_ip.clone(),
        }
    }
}

#[derive(Debug, Default)]
pub struct Remote {
    pub vtep: Option<Vtep>,
    /// Pod blocks, routed through the node's VTEP.
    pub blocks: Vec<String>,
    /// Tunnel addresses, connected routes on the VXLAN device.
    pub tunnel_routes: Vec<String>,
}

/// What node-0 should program for a view.
#[derive(Debug)]
pub struct View {
    pub local: Vtep,
    /// Blackholed.
    pub local_blocks: Vec<String>,
    /// In the order their VTEPs arrive.
    pub remotes: Vec<Remote>,
}

impl View {
    pub fn of(messages: &[ToDataplane]) -> Result<View> {
        let mut local = None;
        let mut local_blocks = Vec::new();
        let mut remotes: Vec<Remote> = Vec::new();
        let mut by_node: HashMap<&str, usize> = HashMap::new();
        let tunnel = RouteType::RemoteTunnel as i32;
        for msg in messages {
            match &msg.payload {
                Some(Payload::VtepUpdate(v)) if v.node == LOCAL_NODE => local = Some(Vtep::from(v)),
                Some(Payload::VtepUpdate(v)) => {
                    let i = slot(&mut by_node, &mut remotes, &v.node);
                    remotes[i].vtep = Some(Vtep::from(v));
                }
                Some(Payload::RouteUpdate(r)) if r.dst_node_name == LOCAL_NODE => {
                    local_blocks.push(r.dst.clone())
                }
                Some(Payload::RouteUpdate(r)) => {
                    let i = slot(&mut by_node, &mut remotes, &r.dst_node_name);
                    if r.types & tunnel != 0 {
                        remotes[i].tunnel_routes.push(r.dst.clone());
                    } else {
                        remotes[i].blocks.push(r.dst.clone());
                    }
                }
                _ => {}
            }
        }
        Ok(View {
            local: local.with_context(|| format!("no VTEP for {LOCAL_NODE}"))?,
            local_blocks,
            remotes,
        })
    }
}

/// The index of `node`'s entry in `remotes`, added when new.
fn slot<'m>(
    by_node: &mut HashMap<&'m str, usize>,
    remotes: &mut Vec<Remote>,
    node: &'m str,
) -> usize {
    *by_node.entry(node).or_insert_with(|| {
        remotes.push(Remote::default());
        remotes.len() - 1
    })
}

//! The properties the fuzz targets in `fuzz/` check, one function each, so
//! the targets stay one-line calls and a test can replay their seed corpora
//! in every build. Each function panics when its property does not hold.

mod authority;

use std::collections::HashMap;
use std::path::Path;

use prost::Message;

use crate::config::Config;
use crate::desired::{
    Change, Delta, Desired, FdbEntry, IpsetMember, Neighbor, Nexthop, ParentInterface, Route,
    VxlanDevice,
};
use crate::manager::Manager;
use crate::model::{Family, IpPool, Update};
use crate::wire::felix::ToDataplane;
use crate::wire::replay::{ReplayFormat, read};

pub use authority::{authority_header_blocks, authority_requests, authority_stream};

/// The JSONL replay decoder: any bytes give messages or an error naming the
/// file and line, never a panic.
pub fn replay_jsonl(data: &[u8]) {
    if let Err(e) = read(Path::new("fuzz.jsonl"), ReplayFormat::Jsonl, data) {
        assert!(e.to_string().starts_with("fuzz.jsonl"), "{e}");
    }
}

/// The Felix-framed replay decoder: any bytes give messages or an error,
/// never a panic or an allocation that a length prefix alone asks for.
pub fn replay_framed(data: &[u8]) {
    let _ = read(Path::new("fuzz.bin"), ReplayFormat::Framed, data);
}

/// The manager's update path: `data` is a series of frames (a 1-byte
/// length, then that many bytes). A frame decoding as a `ToDataplane` is
/// validated and applied; an empty frame is a CompleteDeferredWork; a frame
/// starting with 0xff finds the parent interface (with an MTU from its
/// second byte) or, alone, loses it. Nothing may panic, and the desired
/// state assembled from the incremental deltas must equal the full one.
pub fn manager_updates(data: &[u8]) {
    let mut manager = Manager::new("node-a", Config::default());
    let mut incremental = Assembled::default();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len).min(tail.len());
        let (frame, tail) = tail.split_at(len);
        rest = tail;
        if len == 0 {
            incremental.merge(manager.complete_deferred_work());
            continue;
        }
        if frame[0] == 0xff {
            let parent = (frame.len() > 1).then(|| ParentInterface {
                name: "eth0".into(),
                index: 2,
                mtu: 1300 + u32::from(frame[1]),
            });
            manager.set_parent(Family::V4, parent.clone());
            manager.set_parent(Family::V6, parent);
            continue;
        }
        let Ok(msg) = ToDataplane::decode(frame) else {
            continue;
        };
        if let Ok(Some(update)) = Update::from_message(msg) {
            let _ = manager.on_update(update);
        }
    }
    incremental.merge(manager.complete_deferred_work());
    let mut full = Assembled::default();
    full.merge(manager.full_delta());
    assert_eq!(incremental.shown(), full.shown());
}

type Map<T> = HashMap<<T as Desired>::Key, T>;

/// Desired state assembled from deltas, one map per kind.
#[derive(Default)]
struct Assembled {
    devices: Map<VxlanDevice>,
    nexthops: Map<Nexthop>,
    routes: Map<Route>,
    neighbors: Map<Neighbor>,
    fdb: Map<FdbEntry>,
    ipset: Map<IpsetMember>,
    pools: Map<IpPool>,
}

impl Assembled {
    fn merge(&mut self, delta: Delta) {
        merge(&mut self.devices, delta.devices);
        merge(&mut self.nexthops, delta.nexthops);
        merge(&mut self.routes, delta.routes);
        merge(&mut self.neighbors, delta.neighbors);
        merge(&mut self.fdb, delta.fdb);
        merge(&mut self.ipset, delta.ipset);
        merge(&mut self.pools, delta.pools);
    }

    /// Every kind's objects, printed and sorted, for a comparison that
    /// shows what differs.
    fn shown(&self) -> [Vec<String>; 7] {
        [
            shown(&self.devices),
            shown(&self.nexthops),
            shown(&self.routes),
            shown(&self.neighbors),
            shown(&self.fdb),
            shown(&self.ipset),
            shown(&self.pools),
        ]
    }
}

fn merge<T: Desired>(map: &mut Map<T>, changes: Vec<Change<T>>) {
    for change in changes {
        match change.desired {
            Some(d) => map.insert(change.key, d),
            None => map.remove(&change.key),
        };
    }
}

fn shown<T: Desired>(map: &Map<T>) -> Vec<String> {
    let mut v: Vec<String> = map.values().map(|d| format!("{d:?}")).collect();
    v.sort();
    v
}

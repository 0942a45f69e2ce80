//! The manager's update path: a stream of arbitrary protobuf messages is
//! validated and applied, with CompleteDeferredWork now and then, and
//! parent interfaces coming and going. Nothing may panic, and the desired
//! state built from the incremental deltas must equal the full one.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use vxmgr::config::Config;
use vxmgr::desired::{Change, Delta, Desired, ParentInterface};
use vxmgr::manager::Manager;
use vxmgr::model::{Family, Update};
use vxmgr::wire::felix::ToDataplane;

/// Desired state assembled from deltas, one map per kind.
#[derive(Default, PartialEq, Debug)]
struct Assembled {
    devices: Vec<String>,
    nexthops: Vec<String>,
    routes: Vec<String>,
    neighbors: Vec<String>,
    fdb: Vec<String>,
    ipset: Vec<String>,
}

fn merge<T: Desired>(map: &mut HashMap<T::Key, T>, changes: Vec<Change<T>>) {
    for change in changes {
        match change.desired {
            Some(d) => map.insert(change.key, d),
            None => map.remove(&change.key),
        };
    }
}

fn shown<T: Desired>(map: &HashMap<T::Key, T>) -> Vec<String> {
    let mut v: Vec<String> = map.values().map(|d| format!("{d:?}")).collect();
    v.sort();
    v
}

#[derive(Default)]
struct Maps {
    devices: HashMap<Family, vxmgr::desired::VxlanDevice>,
    nexthops: HashMap<vxmgr::desired::NexthopKey, vxmgr::desired::TunnelNexthop>,
    routes: HashMap<ipnetwork::IpNetwork, vxmgr::desired::Route>,
    neighbors: HashMap<std::net::IpAddr, vxmgr::desired::Neighbor>,
    fdb: HashMap<vxmgr::desired::FdbKey, vxmgr::desired::FdbEntry>,
    ipset: HashMap<ipnetwork::IpNetwork, vxmgr::desired::IpsetMember>,
}

impl Maps {
    fn merge(&mut self, delta: Delta) {
        merge(&mut self.devices, delta.devices);
        merge(&mut self.nexthops, delta.nexthops);
        merge(&mut self.routes, delta.routes);
        merge(&mut self.neighbors, delta.neighbors);
        merge(&mut self.fdb, delta.fdb);
        merge(&mut self.ipset, delta.ipset);
    }

    fn assembled(&self) -> Assembled {
        Assembled {
            devices: shown(&self.devices),
            nexthops: shown(&self.nexthops),
            routes: shown(&self.routes),
            neighbors: shown(&self.neighbors),
            fdb: shown(&self.fdb),
            ipset: shown(&self.ipset),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut manager = Manager::new("node-a", Config::default());
    let mut incremental = Maps::default();
    // Frames of (1-byte length, bytes); length 0 closes a batch, a frame
    // starting with 0xff finds or loses the parent interface.
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
    let mut full = Maps::default();
    full.merge(manager.full_delta());
    assert_eq!(incremental.assembled(), full.assembled());
});

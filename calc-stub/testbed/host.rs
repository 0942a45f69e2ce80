//! What real hosts hold besides vxmgr's objects, on node-1 of a cluster: a
//! default route, static, boot, DHCP and BGP-daemon routes, routes through
//! the same gateways as vxmgr's, another agent's nexthop group and VXLAN
//! device, permanent neighbours and FDB entries on other devices, ipsets
//! named like vxmgr's. Tests put them in place, then check that nothing
//! vxmgrd does changes any of them.

use std::collections::BTreeSet;

use super::{Result, sh};

/// The host's own objects on node-1 (underlay 192.168.10.1/24 on eth0,
/// its gateway 192.168.10.254; node-2 is 192.168.10.2).
const HOST_OBJECTS: &[&str] = &[
    "ip route add default via 192.168.10.254 dev eth0",
    "ip route add 192.0.2.0/24 via 192.168.10.254 proto static",
    "ip route add 198.51.100.0/24 via 192.168.10.254 proto boot",
    "ip route add 203.0.113.0/24 via 192.168.10.254 proto dhcp metric 100",
    // A BGP daemon's routes, one through node-2's address as vxmgr's
    // same-subnet routes go, and one with vxmgr's default protocol.
    "ip route add 10.96.0.0/16 via 192.168.10.2 proto 186",
    "ip route add 10.97.0.0/16 via 192.168.10.254 proto 80",
    "ip route add blackhole 10.98.0.0/16 proto 186 metric 20",
    "ip -6 route add default via fd00:10::fe dev eth0",
    "ip -6 route add 2001:db8::/32 via fd00:10::fe proto 186",
    // Another agent's nexthops and group, one with vxmgr's protocol and
    // the first id vxmgr would pick.
    "ip nexthop add id 2020081664 via 192.168.10.254 dev eth0 proto 80",
    "ip nexthop add id 10 via 192.168.10.2 dev eth0 proto 186",
    "ip nexthop add id 11 group 10/2020081664 proto 186",
    "ip route add 10.99.0.0/16 nhid 11 proto 186",
    // Another agent's VXLAN device with its neighbours and FDB entries.
    "ip link add vxlan.other type vxlan id 9 dstport 4790 dev eth0 local 192.168.10.1",
    "ip link set vxlan.other up",
    "ip addr add 10.250.0.1/32 dev vxlan.other",
    "ip neigh add 10.250.0.2 lladdr 02:00:00:00:00:02 dev vxlan.other nud permanent",
    "bridge fdb append 02:00:00:00:00:02 dev vxlan.other dst 192.168.10.2 self permanent",
    "ip route add 10.250.1.0/24 via 10.250.0.2 dev vxlan.other onlink proto 186",
    "ip neigh add 192.168.10.200 lladdr 02:00:00:00:00:c8 dev eth0 nud permanent",
    "bridge fdb add 02:00:00:00:00:c9 dev eth0 self permanent",
    // ipsets whose names start like vxmgr's.
    "ipset create cali40all-vxlan-net-x hash:net",
    "ipset add cali40all-vxlan-net-x 10.1.0.0/16",
    "ipset create cali40all-vxlan-ne hash:ip",
    "ipset add cali40all-vxlan-ne 10.1.2.3",
    "ipset create cali60all-vxlan-net6 hash:net family inet6",
];

/// Puts the host's objects in namespace `ns` (node-1 of a cluster); their
/// listing, to compare with later ones.
pub fn install(ns: &str) -> Result<BTreeSet<String>> {
    sh(ns, "ip link set lo up")?;
    for command in HOST_OBJECTS {
        sh(ns, command)?;
    }
    listing(ns)
}

/// Everything the host holds that the tests compare, a line an object.
pub fn listing(ns: &str) -> Result<BTreeSet<String>> {
    let mut lines = BTreeSet::new();
    for command in [
        "ip -d route show table all",
        "ip -d -6 route show table all",
        "ip -d nexthop show",
        "ip -d neigh show nud permanent",
        "bridge -d fdb show",
        "ip -d link show vxlan.other",
        "ip addr show",
        "ipset list cali40all-vxlan-net-x",
        "ipset list cali40all-vxlan-ne",
        "ipset list cali60all-vxlan-net6",
    ] {
        let out = sh(ns, command)?;
        for line in out.lines() {
            let line = line.trim();
            // Counters that move by themselves.
            if line.starts_with("RX:") || line.starts_with("TX:") || line.contains("valid_lft") {
                continue;
            }
            lines.insert(format!("{command}: {line}"));
        }
    }
    Ok(lines)
}

/// The lines of `before` (a listing) that namespace `ns` no longer shows:
/// the host's objects lost or changed; empty when all are there as they
/// were.
pub fn lost(ns: &str, before: &BTreeSet<String>) -> Result<Vec<String>> {
    let now = listing(ns)?;
    Ok(before.difference(&now).cloned().collect())
}

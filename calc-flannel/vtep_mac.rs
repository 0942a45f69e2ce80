//! This node's VTEP MACs: derived from the node's name, so that they stay
//! the same across restarts and other nodes' neighbour and FDB entries for
//! this node never go stale.

use vxmgr::model::{Family, MacAddr};

/// A locally administered unicast MAC for `hostname`'s `family` device.
pub fn derive(hostname: &str, family: Family) -> MacAddr {
    // FNV-1a: fixed by its definition, so the MAC survives any rebuild.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let tag = match family {
        Family::V4 => "calc-flannel vtep v4 ",
        Family::V6 => "calc-flannel vtep v6 ",
    };
    for byte in tag.bytes().chain(hostname.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let b = hash.to_be_bytes();
    // Locally administered (bit 1), unicast (bit 0 clear).
    MacAddr([(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_distinct_and_locally_administered() {
        let a = derive("node-1", Family::V4);
        assert_eq!(a, derive("node-1", Family::V4));
        assert_ne!(a, derive("node-2", Family::V4));
        assert_ne!(a, derive("node-1", Family::V6));
        assert_eq!(a.0[0] & 0x03, 0x02);
        // The value is part of the contract with other nodes: it must not
        // change between versions.
        assert_eq!(a.to_string(), derive("node-1", Family::V4).to_string());
        assert_eq!(a.to_string().parse::<MacAddr>(), Ok(a));
    }
}

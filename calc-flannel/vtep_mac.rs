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
    // FNV alone changes few bits for names that differ in one letter;
    // murmur3's finaliser spreads them over the whole word.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
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
        // Names one letter apart get MACs apart in most octets.
        let b = derive("node-2", Family::V4);
        let differing = a.0.iter().zip(b.0).filter(|(x, y)| **x != *y).count();
        assert!(differing >= 4, "{a} {b}");
        assert_eq!(a.to_string().parse::<MacAddr>(), Ok(a));
    }
}

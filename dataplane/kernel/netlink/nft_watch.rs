//! nftables' change notifications (what `nft monitor` shows), reduced to
//! what vxmgr's firewall rules care about: a change in its own table
//! (`inet vxmgr`) or in iptables-nft's `filter` tables (`ip filter`, `ip6
//! filter`), where the forward chain lives and where Docker sets its drop
//! policy. No crate parses these messages; only the table's name is read.

use super::raw;
use crate::kernel::firewall::TABLE;
use crate::kernel::objects::Notification;

/// From linux/netfilter/nfnetlink.h and nf_tables.h.
pub(super) const NFNLGRP_NFTABLES: u32 = 7;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// Ends each transaction; it names no table.
const NFT_MSG_NEWGEN: u16 = 15;
/// Every object message (table, chain, rule, set, element, object,
/// flowtable) carries its table's name as attribute 1.
const NFTA_TABLE: u16 = 1;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// Length of struct nfgenmsg (family, version, resource id).
const NFGENMSG_LEN: usize = 4;

/// At most one `Notification::Firewall` per datagram (a transaction's
/// messages come together); a datagram whose framing is broken counts as
/// one too, as its messages may have said so.
pub(super) fn notifications_in(datagram: &[u8]) -> Box<dyn Iterator<Item = Notification> + '_> {
    let relevant = raw::messages(datagram).any(|message| match message {
        Ok(message) => concerns_vxmgr(message.kind, message.payload),
        Err(_) => true,
    });
    Box::new(relevant.then_some(Notification::Firewall).into_iter())
}

fn concerns_vxmgr(kind: u16, payload: &[u8]) -> bool {
    if kind >> 8 != NFNL_SUBSYS_NFTABLES || kind & 0xff == NFT_MSG_NEWGEN {
        return false;
    }
    let (Some(&family), Some(attributes)) = (payload.first(), payload.get(NFGENMSG_LEN..)) else {
        return false;
    };
    let table = raw::attributes(attributes)
        .map_while(Result::ok)
        .find(|(kind, _)| *kind == NFTA_TABLE)
        .map(|(_, name)| name.strip_suffix(&[0]).unwrap_or(name));
    match (family, table) {
        (NFPROTO_INET, Some(name)) => name == TABLE.as_bytes(),
        (NFPROTO_IPV4 | NFPROTO_IPV6, Some(name)) => name == b"filter",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::raw::build::{attribute, message};
    use super::*;

    const NFT_MSG_NEWTABLE: u16 = 0;
    const NFT_MSG_DELRULE: u16 = 8;
    const NFT_MSG_NEWSETELEM: u16 = 12;

    /// An nftables message about `table` of `family`.
    fn nft(msg: u16, family: u8, table: &str) -> Vec<u8> {
        let mut payload = vec![family, 0, 0, 0];
        payload.extend(attribute(NFTA_TABLE, format!("{table}\0").as_bytes()));
        message(NFNL_SUBSYS_NFTABLES << 8 | msg, 0, 0, &payload)
    }

    fn count(datagram: &[u8]) -> usize {
        notifications_in(datagram).count()
    }

    #[test]
    fn changes_of_our_table_and_of_iptables_filter_tables_count_once() {
        let ours: Vec<u8> = [
            nft(NFT_MSG_NEWTABLE, NFPROTO_INET, "vxmgr"),
            nft(NFT_MSG_NEWSETELEM, NFPROTO_INET, "vxmgr"),
        ]
        .concat();
        assert_eq!(count(&ours), 1);
        assert_eq!(count(&nft(NFT_MSG_DELRULE, NFPROTO_IPV6, "filter")), 1);
    }

    #[test]
    fn other_tables_families_and_generations_do_not_count() {
        let others: Vec<u8> = [
            nft(NFT_MSG_NEWTABLE, NFPROTO_INET, "vxmgr2"),
            nft(NFT_MSG_NEWTABLE, NFPROTO_IPV4, "vxmgr"),
            nft(NFT_MSG_NEWTABLE, NFPROTO_INET, "filter"),
            nft(NFT_MSG_NEWTABLE, NFPROTO_IPV4, "nat"),
            // A generation message's attribute 1 is its id, not a name.
            nft(NFT_MSG_NEWGEN, NFPROTO_INET, "vxmgr"),
            message(16, 0, 0, &[0; 16]),
        ]
        .concat();
        assert_eq!(count(&others), 0);
    }
}

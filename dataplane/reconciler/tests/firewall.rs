//! The pools' firewall rules over the in-memory firewall: programmed,
//! adopted, swept, repaired, moved to the iptables backend in use, and a
//! missing `nft` that stops nothing else.

use super::*;
use crate::kernel::firewall::memory::FirewallModel;
use crate::kernel::firewall::{ForwardChain, IptablesMode, NatTable, PoolSet, TableOp};

const NFT: IptablesMode = IptablesMode::Nft;
const LEGACY: IptablesMode = IptablesMode::Legacy;

const POOLS: &[&str] = &[
    r#"{"ipamPoolUpdate": {"id": "pods-v4", "pool": {"cidr": "10.244.0.0/16", "masquerade": true}}}"#,
    r#"{"ipamPoolUpdate": {"id": "pods-v6", "pool": {"cidr": "fd00:244::/48"}}}"#,
    r#"{"ipamPoolUpdate": {"id": "extra", "pool": {"cidr": "10.99.0.0/16", "masquerade": true}}}"#,
];

async fn pool_rig(kernel: MemoryBackend, pools: &[&str], in_sync: bool) -> Rig {
    let mut rig = Rig::new(kernel, NexthopMode::On).await;
    rig.reconciler
        .set_forward_rules(Some(IptablesBackend::Auto));
    rig.send(CLUSTER);
    rig.send(pools);
    if in_sync {
        rig.send(&[IN_SYNC]);
    }
    rig
}

fn table(rig: &Rig) -> NatTable {
    rig.kernel
        .lock()
        .firewall
        .table
        .clone()
        .expect("table inet vxmgr")
}

fn members(table: &NatTable, family: Family, masquerading: bool) -> Vec<String> {
    let set = table.sets.get(PoolSet::new(family, masquerading));
    set.iter().map(|n| n.to_string()).collect()
}

fn firewall_applies(rig: &Rig) -> u32 {
    rig.kernel.lock().firewall.applies
}

#[tokio::test]
async fn pools_make_the_sets_rules_and_forward_chains_and_a_restart_changes_nothing() {
    let kernel = MemoryBackend::with_underlay("eth0", 1500);
    let mut rig = pool_rig(kernel.clone(), POOLS, true).await;
    let report = rig.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    let t = table(&rig);
    assert!(t.intact);
    assert_eq!(
        members(&t, Family::V4, false),
        ["10.99.0.0/16", "10.244.0.0/16"]
    );
    assert_eq!(
        members(&t, Family::V4, true),
        ["10.99.0.0/16", "10.244.0.0/16"]
    );
    assert_eq!(members(&t, Family::V6, false), ["fd00:244::/48"]);
    assert!(members(&t, Family::V6, true).is_empty());
    // A masquerade rule only for the family with a masquerading pool.
    assert!(t.masquerade_rules[0].is_some() && t.masquerade_rules[1].is_none());
    // Nothing in either backend: Felix's tie rule, legacy.
    let forward = rig.kernel.lock().firewall.forward(LEGACY).clone();
    assert!(forward.iter().all(|c| c.jump_in_place()), "{forward:?}");
    assert_eq!(
        forward[1].rules.as_deref().unwrap(),
        [
            "-A VXMGR-FORWARD -s fd00:244::/48 -j ACCEPT",
            "-A VXMGR-FORWARD -d fd00:244::/48 -j ACCEPT"
        ]
    );
    let status = rig.reconciler.firewall_status();
    assert!(status.programmed && status.error.is_none(), "{status:?}");

    let applies = firewall_applies(&rig);
    let mut restarted = pool_rig(kernel, POOLS, true).await;
    let report = restarted.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(
        firewall_applies(&restarted),
        applies,
        "a restart changed the firewall"
    );
}

#[tokio::test]
async fn undeclared_pools_go_after_in_sync_element_by_element() {
    let kernel = MemoryBackend::with_underlay("eth0", 1500);
    let mut rig = pool_rig(kernel.clone(), POOLS, true).await;
    rig.apply().await;
    let rule = table(&rig).masquerade_rules[0];

    // A new daemon whose stream no longer has "extra": kept until InSync.
    let mut restarted = pool_rig(kernel, &POOLS[..2], false).await;
    restarted.apply().await;
    assert_eq!(
        members(&table(&restarted), Family::V4, false),
        ["10.99.0.0/16", "10.244.0.0/16"]
    );
    restarted.send(&[IN_SYNC]);
    let report = restarted.apply().await;
    assert!(report.errors.is_empty(), "{report:?}");
    let t = table(&restarted);
    assert_eq!(members(&t, Family::V4, false), ["10.244.0.0/16"]);
    assert_eq!(members(&t, Family::V4, true), ["10.244.0.0/16"]);
    assert_eq!(t.masquerade_rules[0], rule, "the rule stays as it was");
    let last = restarted.kernel.lock().firewall.last_apply.clone().unwrap();
    assert!(
        last.table
            .iter()
            .all(|op| matches!(op, TableOp::DeleteElements(..))),
        "{last:?}"
    );

    // The last masquerading pool of a family takes its rule with it.
    restarted.send(&[r#"{"ipamPoolRemove": {"id": "pods-v4"}}"#]);
    restarted.apply().await;
    let t = table(&restarted);
    assert!(members(&t, Family::V4, false).is_empty());
    assert_eq!(t.masquerade_rules, [None, None]);
}

#[tokio::test]
async fn drift_is_repaired_at_the_resync() {
    let mut rig = pool_rig(MemoryBackend::with_underlay("eth0", 1500), POOLS, true).await;
    rig.apply().await;
    let programmed = table(&rig);
    rig.kernel.lock().firewall.table = None;
    rig.reconciler.resync().await.unwrap();
    assert_eq!(table(&rig).sets, programmed.sets);

    rig.kernel.lock().firewall.table.as_mut().unwrap().intact = false;
    rig.kernel.lock().firewall.iptables[LEGACY as usize].chains[0].jump_first = false;
    rig.reconciler.resync().await.unwrap();
    let t = table(&rig);
    assert!(t.intact);
    assert_eq!(t.sets, programmed.sets);
    assert!(rig.kernel.lock().firewall.forward(LEGACY)[0].jump_in_place());
}

/// Whether `mode` holds vxmgr's chains, jumped to from the top, and the
/// other backend nothing of vxmgr's.
fn chains_in(firewall: &FirewallModel, mode: IptablesMode) -> bool {
    let other = firewall.forward(mode.other());
    firewall
        .forward(mode)
        .iter()
        .all(ForwardChain::jump_in_place)
        && other.iter().all(|c| *c == ForwardChain::default())
}

#[tokio::test]
async fn a_drop_policy_set_through_nftables_moves_the_forward_chains_at_once() {
    let mut rig = pool_rig(MemoryBackend::with_underlay("eth0", 1500), POOLS, true).await;
    rig.apply().await;
    assert!(chains_in(&rig.kernel.lock().firewall, LEGACY));
    let mut rx = rig.reconciler.watch().unwrap();
    // Docker through iptables-nft: FORWARD drops, a rule of its own.
    rig.kernel.change_firewall(true, |f| {
        let nft = &mut f.iptables[NFT as usize];
        nft.forward_drop = true;
        nft.foreign_rules = 1;
    });
    assert!(notice_all(&mut rig, &mut rx));
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    let firewall = rig.kernel.lock().firewall.clone();
    assert!(chains_in(&firewall, NFT), "{firewall:?}");
    let nft = &firewall.iptables[NFT as usize];
    assert!(
        nft.forward_drop && nft.foreign_rules == 1,
        "foreign rules kept"
    );
    assert_eq!(rig.reconciler.firewall_status().mode, Some(NFT));

    // Our own writes come back as notifications: a read, no change.
    let applies = firewall_applies(&rig);
    rig.kernel.change_firewall(true, |_| {});
    assert!(notice_all(&mut rig, &mut rx));
    rig.reconciler.repair(Instant::now()).await.unwrap();
    assert_eq!(firewall_applies(&rig), applies);
}

#[tokio::test]
async fn the_legacy_poll_moves_the_forward_chains_when_legacy_gains_a_drop_policy() {
    let kernel = MemoryBackend::with_underlay("eth0", 1500);
    kernel.lock().firewall.iptables[NFT as usize].foreign_rules = 3;
    let mut rig = pool_rig(kernel, POOLS, true).await;
    rig.apply().await;
    assert!(chains_in(&rig.kernel.lock().firewall, NFT));
    // The first poll takes the digest in; an unchanged one is no news.
    rig.reconciler.poll_legacy_iptables().await;
    rig.reconciler.repair(Instant::now()).await.unwrap();
    let applies = firewall_applies(&rig);
    assert!(!rig.reconciler.poll_legacy_iptables().await);

    rig.kernel.change_firewall(false, |f| {
        f.iptables[LEGACY as usize].forward_drop = true;
    });
    assert!(rig.reconciler.poll_legacy_iptables().await);
    let report = rig.reconciler.repair(Instant::now()).await.unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    assert!(chains_in(&rig.kernel.lock().firewall, LEGACY));
    assert_eq!(firewall_applies(&rig), applies + 1, "one move");
}

#[tokio::test]
async fn a_fixed_backend_stays_whatever_the_host_does() {
    let kernel = MemoryBackend::with_underlay("eth0", 1500);
    kernel.lock().firewall.iptables[LEGACY as usize].forward_drop = true;
    let mut rig = pool_rig(kernel, POOLS, true).await;
    rig.reconciler.set_forward_rules(Some(IptablesBackend::Nft));
    rig.apply().await;
    assert!(chains_in(&rig.kernel.lock().firewall, NFT));
}

#[tokio::test]
async fn a_missing_nft_fails_the_rules_only_and_they_follow_once_it_is_there() {
    let mut rig = pool_rig(MemoryBackend::with_underlay("eth0", 1500), POOLS, true).await;
    rig.kernel.lock().firewall.nft_missing = true;
    let report = rig.apply().await;
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert!(
        report.errors[0].error.contains("nft binary is missing"),
        "{report:?}"
    );
    assert!(
        rig.routes().len() > 2,
        "the routes were programmed all the same"
    );
    assert_eq!(rig.reconciler.failing().len(), 1);
    assert!(rig.reconciler.firewall_status().error.is_some());

    rig.kernel.lock().firewall.nft_missing = false;
    let due = rig.reconciler.next_retry().expect("a retry is due");
    let report = rig.reconciler.retry(due).await;
    assert!(report.errors.is_empty(), "{report:?}");
    assert!(rig.reconciler.failing().is_empty());
    assert!(table(&rig).intact);
}

#[tokio::test]
async fn without_pools_nothing_is_made_and_a_missing_nft_is_no_failure() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    rig.reconciler
        .set_forward_rules(Some(IptablesBackend::Auto));
    rig.kernel.lock().firewall.nft_missing = true;
    rig.reconciler.resync().await.unwrap();
    assert!(rig.reconciler.failing().is_empty());
    let firewall = rig.kernel.lock().firewall.clone();
    assert!(firewall.table.is_none() && firewall.applies == 0);
}

#[tokio::test]
async fn without_pools_a_table_found_absent_is_not_read_again_until_pools_come() {
    let mut rig = cluster_rig(NexthopMode::On).await;
    rig.reconciler
        .set_forward_rules(Some(IptablesBackend::Auto));
    rig.reconciler.resync().await.unwrap();
    let reads = rig.kernel.lock().firewall.reads;
    assert!(reads > 0, "read at the first resync");
    rig.reconciler.resync().await.unwrap();
    assert_eq!(rig.kernel.lock().firewall.reads, reads, "read again");
    rig.send(&POOLS[..1]);
    rig.apply().await;
    assert!(table(&rig).intact);
    // The last pool removed: its elements go, the table is read again.
    rig.send(&[r#"{"ipamPoolRemove": {"id": "pods-v4"}}"#]);
    rig.apply().await;
    assert!(members(&table(&rig), Family::V4, false).is_empty());
}

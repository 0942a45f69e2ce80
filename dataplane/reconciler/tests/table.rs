//! One table's bookkeeping: an object's desired and actual state share an
//! entry, which goes once neither is left.

use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;

use crate::desired::{Change, IpsetMember, NexthopKey};
use crate::model::Family;
use crate::reconciler::table::{Effect, RenderContext, Table};

/// Ipset members render without any of this.
struct NoContext;

impl RenderContext for NoContext {
    fn device_index(&self, _: Family) -> Option<u32> {
        None
    }
    fn interface_up(&self, _: u32) -> bool {
        true
    }
    fn nexthop_id(&self, _: &NexthopKey) -> Option<u32> {
        None
    }
    fn programmed_nexthop(&self, _: &NexthopKey) -> Option<u32> {
        None
    }
    fn use_nexthops(&self) -> bool {
        false
    }
}

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

fn want(table: &mut Table<IpsetMember>, member: &str, wanted: bool) {
    let key = net(member);
    table.set_desired(Change {
        key,
        desired: wanted.then_some(IpsetMember(key)),
    });
}

/// Programs what is pending, every operation succeeding.
fn program(table: &mut Table<IpsetMember>, sweep: bool) -> Vec<(IpNetwork, Effect)> {
    let now = Instant::now();
    let mut done = Vec::new();
    for plan in [table.plan_upserts(&NoContext), table.plan_deletes(sweep)] {
        for planned in plan.entries {
            done.push((planned.key, planned.effect));
            table.record(planned, Ok(()), now);
        }
    }
    done
}

#[test]
fn an_entry_lives_while_it_is_wanted_or_in_the_kernel() {
    let mut table = Table::<IpsetMember>::new(Duration::from_secs(10));
    let a = net("172.16.0.2/32");

    want(&mut table, "172.16.0.2/32", true);
    assert!(!table.is_gone(&a));
    assert_eq!(table.actual(&a), None);
    // Unwanted before it was programmed: nothing is left of it.
    want(&mut table, "172.16.0.2/32", false);
    assert!(table.is_gone(&a));
    assert_eq!(program(&mut table, true), vec![]);

    want(&mut table, "172.16.0.2/32", true);
    assert_eq!(program(&mut table, true), vec![(a, Effect::Added)]);
    assert_eq!(table.actual(&a), Some(a));
    // Unwanted once programmed: kept, as the kernel's, until deleted.
    want(&mut table, "172.16.0.2/32", false);
    assert!(!table.is_gone(&a));
    assert_eq!(table.desired(&a), None);
    assert_eq!(program(&mut table, true), vec![(a, Effect::Removed)]);
    assert!(table.is_gone(&a));
    assert_eq!(table.all_actual().count(), 0);
}

#[test]
fn a_new_stream_keeps_what_the_kernel_holds_and_the_sweep_removes_what_it_leaves_out() {
    let mut table = Table::<IpsetMember>::new(Duration::from_secs(10));
    let (a, b) = (net("172.16.0.2/32"), net("172.16.0.3/32"));
    want(&mut table, "172.16.0.2/32", true);
    want(&mut table, "172.16.0.3/32", true);
    program(&mut table, true);

    table.clear_desired();
    assert_eq!(table.all_desired().count(), 0);
    assert_eq!(table.all_actual().count(), 2);
    want(&mut table, "172.16.0.2/32", true);
    // Before InSync nothing is deleted, and what is right is left alone.
    assert_eq!(program(&mut table, false), vec![]);
    table.mark_stale();
    assert_eq!(program(&mut table, true), vec![(b, Effect::Removed)]);
    assert!(table.is_gone(&b));
    assert_eq!(table.actual(&a), Some(a));
}

#[test]
fn a_resync_takes_the_dump_as_the_actual_state() {
    let mut table = Table::<IpsetMember>::new(Duration::from_secs(10));
    let (a, b, c) = (
        net("172.16.0.2/32"),
        net("172.16.0.3/32"),
        net("172.16.0.4/32"),
    );
    want(&mut table, "172.16.0.2/32", true);
    want(&mut table, "172.16.0.3/32", true);
    program(&mut table, true);

    // The kernel lost b and holds c, which nothing wants.
    table.reset_actual([(a, a), (c, c)], &NoContext);
    assert_eq!(table.actual(&b), None);
    let mut done = program(&mut table, true);
    done.sort_by_key(|(key, _)| *key);
    assert_eq!(done, vec![(b, Effect::Added), (c, Effect::Removed)]);
    assert!(table.is_gone(&c));
    assert_eq!(table.all_actual().count(), 2);
}

/// A table this large settles on several threads where the machine has
/// them: what each run finds wrong or stale is the whole table's.
#[test]
fn a_resync_of_a_large_table_finds_every_difference() {
    let mut table = Table::<IpsetMember>::new(Duration::from_secs(10));
    let member = |i: u32| IpNetwork::from(std::net::IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
    const WANTED: u32 = (1 << 16) + 3;
    for i in 0..WANTED {
        let key = member(i);
        table.set_desired(Change {
            key,
            desired: Some(IpsetMember(key)),
        });
    }
    program(&mut table, true);

    // The kernel lost every seventh member and holds 1,000 nobody wants.
    let held = (0..WANTED)
        .filter(|i| i % 7 != 0)
        .chain(WANTED..WANTED + 1000);
    table.reset_actual(held.map(|i| (member(i), member(i))), &NoContext);
    let done = program(&mut table, true);
    let added: Vec<_> = (done.iter())
        .filter(|(_, e)| *e == Effect::Added)
        .map(|(k, _)| *k)
        .collect();
    let removed = done.iter().filter(|(_, e)| *e == Effect::Removed).count();
    assert_eq!(added.len(), WANTED.div_ceil(7) as usize);
    assert!(added.iter().all(|k| table.actual(k) == Some(*k)));
    assert_eq!(removed, 1000);
    assert_eq!(table.all_actual().count(), WANTED as usize);
}

/// A resync leaves the slots in the order the dump gave them, so that the
/// next one finds them one after another; a dump in another order, with
/// members gone and new ones among them, is still taken in whole.
#[test]
fn a_resync_keeps_the_dumps_order_and_takes_any_order_in() {
    let mut table = Table::<IpsetMember>::new(Duration::from_secs(10));
    let member = |i: u32| IpNetwork::from(std::net::IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
    const WANTED: u32 = 1000;
    for i in 0..WANTED {
        table.set_desired(Change {
            key: member(i),
            desired: Some(IpsetMember(member(i))),
        });
    }
    program(&mut table, true);
    let held_in = |table: &Table<IpsetMember>| -> Vec<IpNetwork> { table.all_actual().collect() };

    // The kernel gives them back in reverse.
    let reversed: Vec<u32> = (0..WANTED).rev().collect();
    table.reset_actual(reversed.iter().map(|&i| (member(i), member(i))), &NoContext);
    assert_eq!(program(&mut table, true), vec![]);
    let in_reverse: Vec<IpNetwork> = reversed.iter().map(|&i| member(i)).collect();
    assert!(held_in(&table) == in_reverse, "not in the dump's order");

    // Then shuffled, without every third and with 100 nobody wants.
    let mut shuffled: Vec<u32> = (0..WANTED).filter(|i| i % 3 != 0).collect();
    shuffled.extend(WANTED..WANTED + 100);
    let mut seed = 0x9e37_79b9u32;
    for at in (1..shuffled.len()).rev() {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        shuffled.swap(at, seed as usize % (at + 1));
    }
    table.reset_actual(shuffled.iter().map(|&i| (member(i), member(i))), &NoContext);
    let in_dump_order: Vec<IpNetwork> = shuffled.iter().map(|&i| member(i)).collect();
    assert!(held_in(&table) == in_dump_order, "not in the dump's order");
    let done = program(&mut table, true);
    let added = done.iter().filter(|(_, e)| *e == Effect::Added).count();
    let removed = done.iter().filter(|(_, e)| *e == Effect::Removed).count();
    assert_eq!((added, removed), (WANTED.div_ceil(3) as usize, 100));
    assert_eq!(held_in(&table).len(), WANTED as usize);
}

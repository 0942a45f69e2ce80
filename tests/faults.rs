//! SIGKILL in the middle of heavy work: while a large snapshot is being
//! programmed, and while a reconnect with a smaller world sweeps what it no
//! longer declares. After each kill, a restarted vxmgrd fed the same
//! stream again must leave the kernel holding exactly what a clean
//! convergence on that stream leaves: no stale, missing or half-made
//! objects, and no temporary ipset. Each kill must land mid-way: the
//! kernel neither as it was before the stream nor as it ends up. Needs root; skips without it unless
//! VXMGR_REQUIRE_NETNS=1.

mod support;

use std::path::Path;
use std::time::Duration;

use support::BackgroundReplay;
use support::netns::{assert_census, can_run, generated_cluster, generated_world};
use support::testbed::{Census, Cluster, Monitor};

const WAIT: Duration = Duration::from_secs(60);

/// A world large enough that programming it takes many batches.
const LARGE: u32 = 2000;
/// A converged world, and the smaller one a reconnect declares.
const BEFORE_RECONNECT: u32 = 1500;
const AFTER_RECONNECT: u32 = 100;

/// A fresh generated cluster with vxmgrd running on its node.
fn running() -> Cluster {
    let mut cluster = generated_cluster();
    cluster.node_mut(1).start_daemon(&[]).unwrap();
    cluster
}

fn replay_ok(cluster: &Cluster, file: &Path) {
    cluster.node(1).replay_file_ok(file).unwrap();
}

/// The kernel's objects after a clean convergence on node-1's view of a
/// generated world of `nodes` nodes, in a cluster of its own.
fn clean_convergence(nodes: u32) -> Census {
    let cluster = running();
    let (file, _) = generated_world(&cluster, "clean", nodes);
    replay_ok(&cluster, &file);
    Census::of(&cluster.node(1).ns).unwrap()
}

/// Replays `file` in the background and SIGKILLs vxmgrd as soon as the
/// kernel reports a change of vxmgr's routes or nexthops that `first`
/// picks; asserts that the kill landed mid-way (the kernel neither as it
/// was before the replay nor as `expected`, what the replay leads to);
/// then restarts vxmgrd and replays `file` again.
fn kill_at_first(
    cluster: &mut Cluster,
    file: &Path,
    expected: &Census,
    what: &str,
    first: impl Fn(&str) -> bool,
) {
    let ns = cluster.node(1).ns.clone();
    let before = Census::of(&ns).unwrap();
    let mut monitor = Monitor::start(&ns, &["nexthop"]).unwrap();
    let replay = BackgroundReplay::start(&cluster.node(1).socket, [file]);
    monitor
        .wait_for(what, WAIT, |l| l.contains("proto 80") && first(l))
        .unwrap();
    cluster.node_mut(1).stop_daemon(libc::SIGKILL).unwrap();
    replay.wait();
    let at_kill = Census::of(&ns).unwrap();
    assert!(
        at_kill != before,
        "killed at {what}: nothing had changed ({at_kill})"
    );
    assert!(
        at_kill != *expected,
        "killed at {what}: everything was done already ({at_kill})"
    );
    eprintln!("killed at {what}; the kernel then held {at_kill}");
    cluster.node_mut(1).start_daemon(&[]).unwrap();
    replay_ok(cluster, file);
}

/// Picks an `ip monitor` line.
type LineTest = fn(&str) -> bool;

/// `ip monitor` lines of an added nexthop (`id N via ...`) and route.
fn added_nexthop(line: &str) -> bool {
    line.starts_with("id ")
}

fn added_route(line: &str) -> bool {
    !line.starts_with("Deleted") && !line.starts_with("id ")
}

#[test]
fn a_daemon_killed_while_programming_a_large_snapshot_converges_after_a_restart() {
    if !can_run("a_daemon_killed_while_programming_a_large_snapshot_converges_after_a_restart") {
        return;
    }
    let expected = clean_convergence(LARGE);
    // Nexthops go in before the routes that use them: the first kill comes
    // before any route, the second once the routes have begun.
    let kill_points: [(&str, LineTest); 2] = [
        ("the first nexthop", added_nexthop),
        ("the first route", added_route),
    ];
    for (what, first) in kill_points {
        let mut cluster = running();
        let (file, _) = generated_world(&cluster, "large", LARGE);
        kill_at_first(&mut cluster, &file, &expected, what, first);
        assert_census(
            &cluster.node(1).ns,
            &expected,
            &format!("killed at {what} of a large snapshot"),
        );
    }
}

#[test]
fn a_daemon_killed_during_the_sweep_after_a_reconnect_converges_after_a_restart() {
    if !can_run("a_daemon_killed_during_the_sweep_after_a_reconnect_converges_after_a_restart") {
        return;
    }
    let expected = clean_convergence(AFTER_RECONNECT);
    let mut cluster = running();
    let (before, _) = generated_world(&cluster, "before", BEFORE_RECONNECT);
    let (after, _) = generated_world(&cluster, "after", AFTER_RECONNECT);
    replay_ok(&cluster, &before);
    kill_at_first(
        &mut cluster,
        &after,
        &expected,
        "the sweep's first deletion",
        |l| l.starts_with("Deleted"),
    );
    assert_census(
        &cluster.node(1).ns,
        &expected,
        "killed during the sweep after a reconnect",
    );
}

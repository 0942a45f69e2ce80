//! A short soak against the netlink backend in a namespace: on a converged
//! daemon, nodes join, move their VTEP back and forth and leave, a fixed
//! number of times. Every batch must be OK, and the kernel must end up
//! holding exactly what it held after convergence. Needs root; skips
//! without it unless VXMGR_REQUIRE_NETNS=1. The soak benchmark runs the
//! same churn for minutes and samples memory.

mod support;

use support::Stream;
use support::netns::{GENERATED_LOCAL, can_run, generated_cluster, generated_world};
use support::testbed::{Census, Churn};
use vxmgr::wire::vxmgr::v1::{BatchResult, BatchStatus};

/// Nodes of the converged world, nodes that join and leave, and rounds of
/// four operations each.
const NODES: u32 = 300;
const JOINERS: u32 = 20;
const ROUNDS: usize = 100;

fn not_ok(statuses: &[BatchStatus]) -> Vec<&BatchStatus> {
    statuses
        .iter()
        .filter(|s| s.result != BatchResult::Ok as i32)
        .collect()
}

#[tokio::test]
async fn churn_leaves_the_kernel_as_it_was_after_convergence() {
    if !can_run("churn_leaves_the_kernel_as_it_was_after_convergence") {
        return;
    }
    let mut cluster = generated_cluster();
    let (_, world) = generated_world(&cluster, "world", NODES + JOINERS);
    let (snapshot, churn) = Churn::new(world, NODES, GENERATED_LOCAL).unwrap();
    let node = cluster.node_mut(1);
    node.start_daemon(&[]).unwrap();
    let ns = node.ns.clone();
    let mut stream = Stream::connect(&node.socket).await;

    let statuses = stream.apply(snapshot).await;
    assert!(not_ok(&statuses).is_empty(), "{statuses:#?}");
    let converged = Census::of(&ns).unwrap();
    // The local blocks are blackholes; every remote node has its blocks and
    // tunnel address routed, a nexthop, a neighbour, an FDB entry and an
    // ipset member, in both families.
    let remotes = (NODES - 1) as usize;
    assert_eq!(
        converged.counts(),
        [
            2 * (4 + remotes * 5),
            2 * remotes,
            2 * remotes,
            2 * remotes,
            2 * remotes
        ],
        "{converged}"
    );

    for round in 0..ROUNDS {
        for operation in churn.round(round).unwrap() {
            let statuses = stream.apply(operation).await;
            let failed = not_ok(&statuses);
            assert!(failed.is_empty(), "round {round}: {failed:#?}");
        }
    }

    let end = Census::of(&ns).unwrap();
    let differences = converged.differences(&end);
    assert!(
        differences.is_empty(),
        "after {ROUNDS} rounds of churn (first: converged, second: end):\n{}",
        differences.join("\n")
    );
    assert_eq!(end, converged);
}

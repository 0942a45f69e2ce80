//! Namespace tests' policy: skip without root, unless required; and the
//! testbed with this build's binaries.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vxmgr::model::Family;
use vxmgr::wire::felix::ToDataplane;

use super::testbed::{self, Binaries, Census, Cluster, churn};
use super::{CALC_STUB, VXMGRD, say};

/// `VXMGR_REQUIRE_NETNS=1`: what a namespace test needs is required, and
/// its absence a failure rather than a skip.
pub fn required() -> bool {
    super::require::required("NETNS")
}

/// Whether namespace tests can run. Without root they skip (saying why);
/// with `VXMGR_REQUIRE_NETNS=1` they fail instead.
pub fn can_run(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    super::require::skip(test, "NETNS", "needs root for network namespaces");
    false
}

/// This build's binaries, for the testbed.
pub fn binaries() -> Binaries {
    Binaries {
        vxmgrd: VXMGRD.into(),
        calc_stub: CALC_STUB.into(),
    }
}

/// A cluster of `n` nodes; `VXMGR_KEEP_NETNS=1` leaves it in place.
pub fn cluster(n: u8) -> Cluster {
    let mut cluster = Cluster::new("vxt", n, &binaries()).expect("build the cluster");
    if std::env::var_os("VXMGR_KEEP_NETNS").is_some_and(|v| v == "1") {
        say(&format!(
            "VXMGR_KEEP_NETNS=1: keeping namespaces {}* and {}",
            cluster.prefix,
            cluster.dir.display()
        ));
        cluster.keep();
    }
    cluster
}

pub use testbed::churn::GENERATED_LOCAL;

/// A one-node cluster whose node also holds its generated underlay
/// addresses, so generated worlds apply to it.
pub fn generated_cluster() -> Cluster {
    let cluster = cluster(1);
    churn::add_generated_underlay(&cluster.node(1).ns).unwrap();
    cluster
}

/// node-1's view of a generated world of `nodes` nodes × 4 blocks in both
/// families, written to `<cluster dir>/<name>.bin` (a file calc-stub can
/// replay).
pub fn generated_world(cluster: &Cluster, name: &str, nodes: u32) -> (PathBuf, Vec<ToDataplane>) {
    let path = cluster.dir.join(format!("{name}.bin"));
    let world =
        churn::generate(Path::new(CALC_STUB), &path, nodes, 4, GENERATED_LOCAL, true).unwrap();
    (path, world)
}

/// Asserts that namespace `ns` holds exactly the objects `expected` counts,
/// and no ipsets but vxmgr's own (none left from an interrupted replace).
pub fn assert_census(ns: &str, expected: &Census, what: &str) {
    let census = Census::of(ns).unwrap();
    let differences = expected.differences(&census);
    assert!(
        differences.is_empty(),
        "{what} (first: expected, second: the kernel's):\n{}",
        differences.join("\n")
    );
    let ours: BTreeSet<String> = Family::ALL
        .iter()
        .map(|f| f.ipset_name().to_string())
        .collect();
    assert_eq!(census.ipsets, ours, "{what}: ipsets");
}

/// Waits until `done` holds, checking every 50 ms, for at most 30 s: for
/// what the kernel shows after vxmgrd's timers (resyncs) act.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

//! Namespace tests' policy: skip without root, unless required; and the
//! testbed with this build's binaries.

use vxmgr::testbed::{Binaries, Cluster};

use super::{CALC_STUB, VXMGRD, say};

/// `VXMGR_REQUIRE_NETNS=1`: what a namespace test needs is required, and
/// its absence a failure rather than a skip.
pub fn required() -> bool {
    std::env::var_os("VXMGR_REQUIRE_NETNS").is_some_and(|v| v == "1")
}

/// Whether namespace tests can run. Without root they skip (saying why);
/// with `VXMGR_REQUIRE_NETNS=1` they fail instead.
pub fn can_run(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if required() {
        panic!("{test}: needs root for network namespaces (VXMGR_REQUIRE_NETNS=1)");
    }
    say(&format!(
        "SKIPPED {test}: needs root for network namespaces \
         (set VXMGR_REQUIRE_NETNS=1 to make this a failure)"
    ));
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

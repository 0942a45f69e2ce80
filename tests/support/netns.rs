//! Namespace tests' policy: skip without root, unless required; and the
//! testbed with this build's binaries.

use vxmgr::testbed::{Binaries, Cluster};

use super::{CALC_STUB, VXMGRD};

/// Whether namespace tests can run. Without root they skip (printing why);
/// with `VXMGR_REQUIRE_NETNS=1` they fail instead.
pub fn can_run(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("VXMGR_REQUIRE_NETNS").is_some_and(|v| v == "1") {
        panic!("{test}: needs root for network namespaces (VXMGR_REQUIRE_NETNS=1)");
    }
    eprintln!("SKIPPED {test}: needs root for network namespaces");
    false
}

/// A cluster of `n` nodes; `VXMGR_KEEP_NETNS=1` leaves it in place.
pub fn cluster(n: u8) -> Cluster {
    let binaries = Binaries {
        vxmgrd: VXMGRD.into(),
        calc_stub: CALC_STUB.into(),
    };
    let mut cluster = Cluster::new("vxt", n, &binaries).expect("build the cluster");
    if std::env::var_os("VXMGR_KEEP_NETNS").is_some_and(|v| v == "1") {
        eprintln!(
            "VXMGR_KEEP_NETNS=1: keeping namespaces {}* and {}",
            cluster.prefix,
            cluster.dir.display()
        );
        cluster.keep();
    }
    cluster
}

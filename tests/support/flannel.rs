//! flannel-mode tests' policy: they need root, the etcd binary and the CNI
//! plugins; they skip without them, unless required
//! (`VXMGR_REQUIRE_NETNS=1`, `VXMGR_REQUIRE_ETCD=1`, `VXMGR_REQUIRE_CNI=1`),
//! and the cluster with this build's binaries.

use super::testbed::{FlannelCluster, etcd};

use super::cni;
use super::netns::{binaries, can_run as netns_can_run};
use super::say;

pub const CALC_FLANNEL: &str = env!("CARGO_BIN_EXE_calc-flannel");

/// `VXMGR_REQUIRE_ETCD=1`: a missing etcd binary fails the test.
pub fn etcd_required() -> bool {
    std::env::var_os("VXMGR_REQUIRE_ETCD").is_some_and(|v| v == "1")
}

/// Whether a test needing etcd can run; says why not when it cannot.
pub fn etcd_available(test: &str) -> bool {
    if etcd::available() {
        return true;
    }
    if etcd_required() {
        panic!("{test}: needs the etcd binary (apt-get install etcd-server; VXMGR_REQUIRE_ETCD=1)");
    }
    say(&format!(
        "SKIPPED {test}: needs the etcd binary (apt-get install etcd-server; \
         set VXMGR_REQUIRE_ETCD=1 to make this a failure)"
    ));
    false
}

/// Whether a flannel namespace test can run (root, etcd, and the CNI
/// plugins that make its pods).
pub fn can_run(test: &str) -> bool {
    netns_can_run(test) && etcd_available(test) && cni::plugins_available(test)
}

/// Runs `future` on a runtime of its own, from a synchronous test.
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// `n` nodes with etcd on the underlay; `VXMGR_KEEP_NETNS=1` leaves it.
pub fn cluster(n: u8) -> FlannelCluster {
    let mut cluster = FlannelCluster::new("vxf", n, &binaries(), CALC_FLANNEL.as_ref())
        .expect("build the cluster");
    if std::env::var_os("VXMGR_KEEP_NETNS").is_some_and(|v| v == "1") {
        say(&format!(
            "VXMGR_KEEP_NETNS=1: keeping namespaces {}*, etcd and {}",
            cluster.cluster.prefix,
            cluster.cluster.dir.display()
        ));
        cluster.keep();
    }
    cluster
}

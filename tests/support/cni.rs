//! CNI tests' policy: namespace tests with the real plugins need the
//! system's CNI plugins (Debian's containernetworking-plugins); they skip
//! without them unless `VXMGR_REQUIRE_CNI` is `1` or `true`. And our
//! plugin binary's directory, for CNI_PATH.

use std::path::Path;

use super::testbed::cni::{SYSTEM_PLUGINS, system_plugins_installed};

/// Our `flannel` plugin, as this build made it.
pub const FLANNEL_PLUGIN: &str = env!("CARGO_BIN_EXE_flannel");

/// The directory holding our plugin: the first entry of CNI_PATH.
pub fn plugin_dir() -> &'static Path {
    Path::new(FLANNEL_PLUGIN)
        .parent()
        .expect("a binary lives in a directory")
}

/// `VXMGR_REQUIRE_CNI=1|true`: missing CNI plugins fail the test.
pub fn required() -> bool {
    super::require::required("CNI")
}

/// Whether the system's CNI plugins are there; says why not when not.
pub fn plugins_available(test: &str) -> bool {
    if system_plugins_installed() {
        return true;
    }
    let why = format!(
        "needs the CNI plugins in {SYSTEM_PLUGINS} (apt-get install containernetworking-plugins)"
    );
    super::require::skip(test, "CNI", &why);
    false
}

//! Kubernetes tests' policy: they need a real kube-apiserver and kubectl,
//! named by `VXMGR_KUBE_APISERVER` and `VXMGR_KUBECTL`; they skip without
//! them, unless `VXMGR_REQUIRE_KUBE` is set (`1` or `true`).

use super::say;
use super::testbed::kube;

/// Whether `VXMGR_REQUIRE_KUBE` makes a missing API server a failure.
pub fn required() -> bool {
    std::env::var("VXMGR_REQUIRE_KUBE").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Whether a test needing the API server can run; says why not when it
/// cannot.
pub fn kube_available(test: &str) -> bool {
    if kube::apiserver_binary().is_some() && kube::kubectl_binary().is_some() {
        return true;
    }
    let why = "needs a kube-apiserver and kubectl: set VXMGR_KUBE_APISERVER and VXMGR_KUBECTL \
               to their paths (scripts/build-kube-apiserver builds both)";
    if required() {
        panic!("{test}: {why} (VXMGR_REQUIRE_KUBE is set)");
    }
    say(&format!(
        "SKIPPED {test}: {why}; set VXMGR_REQUIRE_KUBE=1 to make this a failure"
    ));
    false
}

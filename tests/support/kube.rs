//! Kubernetes tests' policy: they need a real kube-apiserver and kubectl,
//! named by `VXMGR_KUBE_APISERVER` and `VXMGR_KUBECTL`; they skip without
//! them, unless `VXMGR_REQUIRE_KUBE` is set (`1` or `true`).

use super::testbed::kube;

/// Whether `VXMGR_REQUIRE_KUBE` makes a missing API server a failure.
pub fn required() -> bool {
    super::require::required("KUBE")
}

/// Whether a test needing the API server can run; says why not when it
/// cannot.
pub fn kube_available(test: &str) -> bool {
    if kube::apiserver_binary().is_some() && kube::kubectl_binary().is_some() {
        return true;
    }
    let why = "needs a kube-apiserver and kubectl: set VXMGR_KUBE_APISERVER and VXMGR_KUBECTL \
               to their paths (scripts/build-kube-apiserver builds both)";
    super::require::skip(test, "KUBE", why);
    false
}

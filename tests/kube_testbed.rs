//! The Kubernetes testbed itself: a real kube-apiserver with RBAC, an
//! admin, Nodes the tests create, and ServiceAccount tokens that RBAC
//! judges. Every Kubernetes test stands on it.

mod support;

use support::kube::kube_available;
use support::testbed::kube::{Authorization, KubeApiServer};

#[test]
fn the_api_server_takes_nodes_and_judges_service_account_tokens_by_rbac() {
    if !kube_available("the_api_server_takes_nodes_and_judges_service_account_tokens_by_rbac") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = KubeApiServer::start(None, "127.0.0.1", dir.path(), Authorization::Rbac)
        .expect("kube-apiserver starts");
    server
        .kubectl_stdin(
            &["apply", "-f", "-"],
            r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1"},"spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24"]}}"#,
        )
        .expect("the admin creates a Node");
    let cidr = server
        .kubectl(&["get", "node", "node-1", "-o", "jsonpath={.spec.podCIDR}"])
        .unwrap();
    assert_eq!(cidr, "10.244.1.0/24");

    server
        .kubectl(&["create", "serviceaccount", "reader"])
        .unwrap();
    let token = server
        .service_account_token("default", "reader")
        .expect("a token from the TokenRequest API");
    let kubeconfig = dir.path().join("reader.kubeconfig");
    server.write_kubeconfig(&kubeconfig, &token).unwrap();
    let can_i = |verb: &str| {
        let kubectl = support::testbed::kube::kubectl_binary().unwrap();
        let output = std::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["auth", "can-i", verb, "nodes"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    assert_eq!(can_i("list"), "no", "RBAC grants nothing yet");
    server
        .kubectl(&[
            "create",
            "clusterrole",
            "node-reader",
            "--verb=list",
            "--resource=nodes",
        ])
        .unwrap();
    server
        .kubectl(&[
            "create",
            "clusterrolebinding",
            "reader",
            "--clusterrole=node-reader",
            "--serviceaccount=default:reader",
        ])
        .unwrap();
    // The authorizer reads bindings from a cache that follows the store.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while can_i("list") != "yes" {
        assert!(
            std::time::Instant::now() < deadline,
            "the binding did not grant list within 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(can_i("delete"), "no", "and only list");
}

//! calc-flannel `--kube-subnet-mgr` against a real kube-apiserver: the real
//! binaries, a vxmgrd on its memory kernel, no namespaces (no root
//! needed). Needs a kube-apiserver and kubectl (VXMGR_KUBE_APISERVER,
//! VXMGR_KUBECTL); skips without them unless VXMGR_REQUIRE_KUBE=1.

mod support;

use std::time::{Duration, Instant};

use support::flannel::{Agent, block_on};
use support::kube::kube_available;
use support::testbed::kube::{Authorization, KubeApiServer};
use support::{Daemon, http_get};
use vxmgr::wire::vxmgr::v1::DataplaneState;

const NET_CONF: &str = r#"{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}"#;
const PREFIX: &str = "flannel.alpha.coreos.com";
const WAIT: Duration = Duration::from_secs(30);

/// A Node with `pod_cidr` and, when `public_ip` is given, flannel's
/// annotations of `backend` (a vxlan VTEP MAC derived from the address).
fn node(name: &str, pod_cidr: &str, public_ip: Option<&str>, backend: &str) -> String {
    let annotations = match public_ip {
        Some(ip) => {
            let last: u8 = ip.rsplit('.').next().unwrap().parse().unwrap();
            let data = format!(r#"{{"VNI":1,"VtepMAC":"0e:00:00:00:00:{last:02x}"}}"#);
            serde_json::json!({
                format!("{PREFIX}/backend-type"): backend,
                format!("{PREFIX}/backend-data"): data,
                format!("{PREFIX}/public-ip"): ip,
                format!("{PREFIX}/kube-subnet-manager"): "true",
            })
        }
        None => serde_json::json!({}),
    };
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
    })
    .to_string()
}

/// Polls `check` until it gives a value, for at most WAIT.
fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn state(daemon: &Daemon) -> DataplaneState {
    block_on(daemon.state())
}

fn routes(state: &DataplaneState) -> Vec<String> {
    let mut routes: Vec<String> = state
        .ipv4
        .iter()
        .flat_map(|v| v.tunnel_routes.iter().map(|r| r.dst.clone()))
        .collect();
    routes.sort();
    routes
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn kube_mode_annotates_its_node_programs_the_others_and_says_the_network_is_up() {
    let test = "kube_mode_annotates_its_node_programs_the_others_and_says_the_network_is_up";
    if !kube_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = KubeApiServer::start(None, "127.0.0.1", dir.path(), Authorization::AlwaysAllow)
        .expect("kube-apiserver starts");
    let kubeconfig = dir.path().join("kubeconfig");
    server
        .write_kubeconfig(&kubeconfig, &server.admin_token)
        .unwrap();
    let apply = |json: String| {
        server
            .kubectl_stdin(&["apply", "-f", "-"], &json)
            .expect("kubectl apply");
    };
    apply(node("node-1", "10.244.1.0/24", None, "vxlan"));
    apply(node(
        "node-2",
        "10.244.2.0/24",
        Some("192.168.10.2"),
        "vxlan",
    ));
    apply(node(
        "node-3",
        "10.99.0.0/24",
        Some("192.168.10.3"),
        "vxlan",
    ));
    apply(node(
        "node-4",
        "10.244.4.0/24",
        Some("192.168.10.4"),
        "host-gw",
    ));
    let net_conf = dir.path().join("net-conf.json");
    std::fs::write(&net_conf, NET_CONF).unwrap();

    let daemon = Daemon::memory(&[]);
    let port = free_port().to_string();
    let agent = Agent::start_with_env(
        &daemon,
        "calc-flannel",
        &[
            "--kube-subnet-mgr",
            "--kubeconfig-file",
            kubeconfig.to_str().unwrap(),
            "--net-config-path",
            net_conf.to_str().unwrap(),
            "--healthz-ip",
            "127.0.0.1",
            "--healthz-port",
            &port,
        ],
        &[("NODE_NAME", "node-1")],
    );

    // node-2 is a VTEP and a route; node-3 (outside the network) and
    // node-4 (host-gw) are not.
    let programmed = until("node-2's route", || {
        Some(state(&daemon)).filter(|s| routes(s) == ["10.244.2.0/24"])
    });
    let v4 = programmed.ipv4.as_ref().unwrap();
    let vtep = v4
        .remote_vteps
        .iter()
        .find(|v| v.tunnel_address == "10.244.2.0")
        .expect("node-2's VTEP");
    assert_eq!(
        (vtep.mac.as_str(), vtep.parent_address.as_str()),
        ("0e:00:00:00:00:02", "192.168.10.2")
    );
    let env = std::fs::read_to_string(daemon.dir.path().join("subnet.env")).unwrap();
    assert!(env.contains("FLANNEL_SUBNET=10.244.1.1/24\n"), "{env}");
    agent.wait_for_log("podCIDR 10.99.0.0/24 is outside the network 10.244.0.0/16");
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("node-3") && l.contains("outside the network")),
        "the refused Node is named:\n{}",
        agent.log()
    );

    // Its own Node carries flannel's annotations.
    let own: serde_json::Value = serde_json::from_str(
        &server
            .kubectl(&["get", "node", "node-1", "-o", "json"])
            .unwrap(),
    )
    .unwrap();
    let annotations = &own["metadata"]["annotations"];
    assert_eq!(annotations[format!("{PREFIX}/backend-type")], "vxlan");
    assert_eq!(annotations[format!("{PREFIX}/kube-subnet-manager")], "true");
    assert_eq!(annotations[format!("{PREFIX}/public-ip")], "127.0.0.1");
    let data: serde_json::Value = serde_json::from_str(
        annotations[format!("{PREFIX}/backend-data")]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(data["VNI"], 1);
    let mac = data["VtepMAC"].as_str().unwrap();
    assert!(mac.parse::<vxmgr::model::MacAddr>().is_ok(), "{mac}");

    // Once vxmgrd programmed the node: NetworkUnavailable false, ready.
    let condition = until("NetworkUnavailable", || {
        let json = server
            .kubectl(&[
                "get",
                "node",
                "node-1",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"NetworkUnavailable\")]}",
            ])
            .unwrap();
        serde_json::from_str::<serde_json::Value>(&json).ok()
    });
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "FlannelIsUp");
    let address = format!("127.0.0.1:{port}");
    assert_eq!(http_get(&address, "/healthz").0, 200);
    assert_eq!(http_get(&address, "/readyz").0, 200);
    let (_, _, metrics) = http_get(&address, "/metrics");
    assert!(metrics.contains("calc_flannel_leases 2"), "{metrics}");

    // A Node that joins is programmed, one deleted loses its route.
    apply(node(
        "node-5",
        "10.244.5.0/24",
        Some("192.168.10.5"),
        "vxlan",
    ));
    until("node-5's route", || {
        Some(()).filter(|_| routes(&state(&daemon)) == ["10.244.2.0/24", "10.244.5.0/24"])
    });
    server.kubectl(&["delete", "node", "node-2"]).unwrap();
    until("node-2's route gone", || {
        Some(()).filter(|_| routes(&state(&daemon)) == ["10.244.5.0/24"])
    });
    assert!(
        state(&daemon)
            .ipv4
            .unwrap()
            .remote_vteps
            .iter()
            .all(|v| v.tunnel_address != "10.244.2.0")
    );
}

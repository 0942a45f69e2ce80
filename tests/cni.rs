//! The `flannel` CNI plugin. Without root: the binary run as a runtime runs
//! it, its delegate a script that records what it is handed. As root with
//! the system's CNI plugins (skipped without them unless
//! VXMGR_REQUIRE_NETNS / VXMGR_REQUIRE_CNI say otherwise): pods made on a
//! namespace node through flannel's conflist with the real `bridge`,
//! `host-local`, `portmap` and `loopback`.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use support::cni::{FLANNEL_PLUGIN, plugin_dir, plugins_available};
use support::netns::{can_run, cluster};
use support::testbed::cni::{PodNetwork, leftovers, subnet_env};
use support::testbed::{self, ip_json};

/// A node's files and a fake `bridge` delegate that saves its input as
/// `<command>.json` and answers ADD with a result.
struct Fake {
    dir: tempfile::TempDir,
}

const RESULT: &str = r#"{"cniVersion":"0.3.1","interfaces":[{"name":"cni0"}],"ips":[{"version":"4","address":"10.244.58.2/24","gateway":"10.244.58.1"}]}"#;

impl Fake {
    fn new(bridge: &str) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("bridge");
        std::fs::write(&script, format!("#!/bin/sh\n{bridge}")).unwrap();
        let mut permissions = std::fs::metadata(&script).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&script, permissions).unwrap();
        Fake { dir }
    }

    /// Records its input, answers ADD with RESULT.
    fn recording() -> Fake {
        Fake::new(&format!(
            "cat > \"$(dirname \"$0\")/$CNI_COMMAND.json\"\n\
             [ \"$CNI_COMMAND\" = ADD ] && printf '%s' '{RESULT}'\nexit 0\n"
        ))
    }

    fn subnet_file(&self) -> PathBuf {
        self.dir.path().join("subnet.env")
    }

    fn write_subnet_env(&self, text: &str) {
        std::fs::write(self.subnet_file(), text).unwrap();
    }

    /// flannel's conflist entry as a runtime hands it, pointed at our files.
    fn config(&self) -> String {
        json!({
            "cniVersion": "0.3.1",
            "name": "cbr0",
            "type": "flannel",
            "subnetFile": self.subnet_file(),
            "dataDir": self.dir.path().join("data"),
            "delegate": {"hairpinMode": true, "isDefaultGateway": true}
        })
        .to_string()
    }

    fn run(&self, command: &str, config: &str) -> Output {
        run_plugin(
            &[
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", "pod-1"),
                ("CNI_NETNS", "/var/run/netns/pod-1"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", &self.dir.path().display().to_string()),
            ],
            config,
        )
    }

    /// What the delegate was handed for `command`.
    fn delegated(&self, command: &str) -> Option<Value> {
        let text = std::fs::read(self.dir.path().join(format!("{command}.json"))).ok()?;
        Some(serde_json::from_slice(&text).unwrap())
    }

    fn saved(&self) -> PathBuf {
        self.dir.path().join("data/pod-1")
    }
}

fn run_plugin(env: &[(&str, &str)], stdin: &str) -> Output {
    let mut child = Command::new(FLANNEL_PLUGIN)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), stdin.as_bytes()).unwrap();
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

/// The CNI error a failed run printed; asserts it failed with that code.
fn error_of(output: &Output) -> Value {
    let error: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    assert_eq!(
        output.status.code(),
        error["code"].as_i64().map(|c| c as i32),
        "exit status is the error code: {error}"
    );
    assert_ne!(output.status.code(), Some(0));
    assert!(
        error["msg"].is_string() && error["details"].is_string(),
        "{error}"
    );
    error
}

const V4_MASQUERADING: &str = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.58.1/24\n\
                               FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";

#[test]
fn add_hands_bridge_flannels_config_and_passes_its_result_on() {
    let fake = Fake::recording();
    fake.write_subnet_env(V4_MASQUERADING);
    let output = fake.run("ADD", &fake.config());
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        RESULT,
        "as bridge gave it"
    );
    // The same config as the plugin's own golden test.
    let expected: Value =
        serde_json::from_str(include_str!("../cni/testdata/kube-flannel-ipv4.json")).unwrap();
    assert_eq!(fake.delegated("ADD").unwrap(), expected);
    let saved: Value = serde_json::from_slice(&std::fs::read(fake.saved()).unwrap()).unwrap();
    assert_eq!(saved, expected, "kept for DEL");
}

#[test]
fn del_uses_the_saved_config_and_is_idempotent() {
    let fake = Fake::recording();
    // Never added, no subnet.env: nothing to do, success, nothing printed.
    let output = fake.run("DEL", &fake.config());
    assert!(
        output.status.success() && output.stdout.is_empty(),
        "{output:?}"
    );
    assert!(fake.delegated("DEL").is_none());

    fake.write_subnet_env(V4_MASQUERADING);
    assert!(fake.run("ADD", &fake.config()).status.success());
    let added = fake.delegated("ADD").unwrap();
    // flannel went away with its file: DEL needs neither.
    std::fs::remove_file(fake.subnet_file()).unwrap();
    let output = fake.run("DEL", &fake.config());
    assert!(
        output.status.success() && output.stdout.is_empty(),
        "{output:?}"
    );
    assert_eq!(fake.delegated("DEL").unwrap(), added);
    assert!(!fake.saved().exists());
    std::fs::remove_file(fake.dir.path().join("DEL.json")).unwrap();
    let output = fake.run("DEL", &fake.config());
    assert!(output.status.success(), "{output:?}");
    assert!(fake.delegated("DEL").is_none(), "nothing left to delete");
}

/// ADD's error: code `code`, details naming the subnet file and `names`.
fn add_fails_naming_the_subnet_file(fake: &Fake, code: i64, names: &[&str]) {
    let error = error_of(&fake.run("ADD", &fake.config()));
    assert_eq!(error["code"], code, "{error}");
    assert_eq!(error["cniVersion"], "0.3.1");
    let details = error["details"].as_str().unwrap();
    let file = fake.subnet_file().display().to_string();
    for name in names.iter().copied().chain([file.as_str()]) {
        assert!(details.contains(name), "{name} in {details}");
    }
}

#[test]
fn a_missing_or_malformed_subnet_env_is_a_cni_error_naming_it() {
    let fake = Fake::recording();
    // 11: try again later (flannel not up yet).
    add_fails_naming_the_subnet_file(&fake, 11, &[]);
    for (text, names) in [
        (
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.58.1\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
            ["line 2", "FLANNEL_SUBNET"],
        ),
        (
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.58.1/24\nFLANNEL_MTU=1450\n",
            ["missing", "FLANNEL_IPMASQ"],
        ),
    ] {
        fake.write_subnet_env(text);
        add_fails_naming_the_subnet_file(&fake, 7, &names);
    }
    assert!(fake.delegated("ADD").is_none(), "no delegate run");
    assert!(!fake.saved().exists(), "nothing saved");
}

#[test]
fn a_delegates_error_comes_back_with_its_code() {
    let fake = Fake::new(
        "cat >/dev/null\nprintf '%s' '{\"cniVersion\":\"0.3.1\",\"code\":11,\"msg\":\"busy\",\"details\":\"try later\"}'\nexit 1\n",
    );
    fake.write_subnet_env(V4_MASQUERADING);
    let error = error_of(&fake.run("ADD", &fake.config()));
    assert_eq!(error["code"], 11);
    let details = error["details"].as_str().unwrap();
    assert!(details.contains("bridge: busy: try later"), "{details}");
    assert!(fake.saved().exists(), "kept for the DEL that follows");
}

#[test]
fn a_delegate_failing_without_an_error_result_is_still_a_failure() {
    let fake = Fake::new(
        "cat >/dev/null
echo 'panic: runtime error'
exit 2
",
    );
    fake.write_subnet_env(V4_MASQUERADING);
    let error = error_of(&fake.run("ADD", &fake.config()));
    assert_eq!(error["code"], 100);
    let details = error["details"].as_str().unwrap();
    assert!(details.contains("panic: runtime error"), "{details}");

    // A code that is no exit status still exits non-zero.
    let fake = Fake::new("cat >/dev/null\necho '{\"code\":256,\"msg\":\"odd\"}'\nexit 1\n");
    fake.write_subnet_env(V4_MASQUERADING);
    let output = fake.run("ADD", &fake.config());
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let error: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(error["code"], 256);
}

#[test]
fn bad_requests_are_cni_errors() {
    let fake = Fake::recording();
    fake.write_subnet_env(V4_MASQUERADING);
    let config = fake.config();
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, i64);
    let cases: [Case; 5] = [
        (&[("CNI_COMMAND", "ADD")], &config, 4),
        (
            &[("CNI_COMMAND", "PUT"), ("CNI_CONTAINERID", "a")],
            &config,
            4,
        ),
        (
            &[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "../etc")],
            &config,
            4,
        ),
        (
            &[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "a")],
            "{not json",
            6,
        ),
        (
            &[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "a")],
            r#"{"cniVersion":"0.2.0","name":"n","type":"flannel"}"#,
            1,
        ),
    ];
    for (env, stdin, code) in cases {
        let error = error_of(&run_plugin(env, stdin));
        assert_eq!(error["code"], code, "{env:?} {stdin}: {error}");
    }
}

#[test]
fn version_lists_the_supported_spec_versions() {
    let output = run_plugin(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.3.1"}"#);
    assert!(output.status.success(), "{output:?}");
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        reply,
        json!({"cniVersion": "0.3.1", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]})
    );
}

/// Whether a namespace test with the real plugins can run.
fn can_run_with_plugins(test: &str) -> bool {
    can_run(test) && plugins_available(test)
}

fn addresses(ns: &str, dev: &str) -> Vec<String> {
    ip_json(ns, &["addr", "show", "dev", dev]).unwrap()[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["scope"] == "global")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect()
}

#[test]
fn a_pod_gets_its_address_routes_and_the_bridge_check_checks_del_removes_it() {
    if !can_run_with_plugins(
        "a_pod_gets_its_address_routes_and_the_bridge_check_checks_del_removes_it",
    ) {
        return;
    }
    let c = cluster(1);
    let mut network =
        PodNetwork::with_subnet_env(&c, 1, &subnet_env(1, false), plugin_dir()).unwrap();
    // CHECK is for 0.4.0 on.
    network.conflist["cniVersion"] = json!("1.0.0");
    let node = &c.node(1).ns;
    let pod = network.add().unwrap();

    let v4 = pod.address(false).expect("an IPv4 address");
    let v6 = pod.address(true).expect("an IPv6 address");
    assert!(
        "10.50.1.0/24"
            .parse::<ipnetwork::IpNetwork>()
            .unwrap()
            .contains(v4),
        "{v4}"
    );
    assert!(
        "fd00:50:0:1::/64"
            .parse::<ipnetwork::IpNetwork>()
            .unwrap()
            .contains(v6),
        "{v6}"
    );
    let in_pod = addresses(&pod.ns, "eth0");
    assert!(
        in_pod.contains(&format!("{v4}/24")) && in_pod.contains(&format!("{v6}/64")),
        "{in_pod:?}"
    );
    assert_eq!(
        addresses(node, "cni0"),
        ["10.50.1.1/24", "fd00:50:0:1::1/64"]
    );
    let mtu = ip_json(&pod.ns, &["link", "show", "eth0"]).unwrap()[0]["mtu"].clone();
    assert_eq!(mtu, 1450);
    let routes = testbed::sh(&pod.ns, "ip route").unwrap();
    assert!(
        routes.contains("10.50.0.0/16 via 10.50.1.1 dev eth0"),
        "{routes}"
    );
    assert!(
        routes.contains("default via 10.50.1.1 dev eth0"),
        "{routes}"
    );
    let routes = testbed::sh(&pod.ns, "ip -6 route").unwrap();
    assert!(
        routes.contains("fd00:50::/48 via fd00:50:0:1::1 dev eth0"),
        "{routes}"
    );
    let lo = ip_json(&pod.ns, &["link", "show", "lo"]).unwrap()[0]["operstate"].clone();
    assert_eq!(lo, "UNKNOWN", "lo is up");
    let ports = testbed::sh(node, "bridge link").unwrap();
    assert_eq!(
        ports.lines().filter(|l| l.contains("master cni0")).count(),
        1,
        "{ports}"
    );

    // bridge before v1.3.0 (Debian 12's is 1.1.1) looks for a route given
    // without a gateway, as flannel gives its network's, without one, and
    // fails; only after the interfaces and addresses passed.
    if let Err(e) = network.check(&pod) {
        let e = e.to_string();
        assert!(
            e.contains("Expected Route {Dst:{IP:10.50.0.0 Mask:ffff0000} GW:<nil>}"),
            "{e}"
        );
    }
    // A pod that lost its address fails CHECK on that.
    testbed::sh(&pod.ns, &format!("ip addr del {v4}/24 dev eth0")).unwrap();
    let e = network.check(&pod).unwrap_err().to_string();
    assert!(
        e.contains(&format!("{v4}/24")) && !e.contains("Expected Route"),
        "{e}"
    );

    let reservations = network.data_dirs()[1].join("cbr0");
    assert!(reservations.join(v4.to_string()).exists());
    network.del(pod).unwrap();
    let ports = testbed::sh(node, "bridge link").unwrap();
    assert!(
        !ports.contains("master cni0"),
        "the pod's veth is gone: {ports}"
    );
    assert!(
        !reservations.join(v4.to_string()).exists(),
        "its IPv4 address is free"
    );
    assert!(
        !reservations.join(v6.to_string()).exists(),
        "its IPv6 address is free"
    );
    let saved: Vec<_> = std::fs::read_dir(&network.data_dirs()[0])
        .unwrap()
        .collect();
    assert!(saved.is_empty(), "no delegate config left: {saved:?}");
}

#[test]
fn a_hundred_pods_added_and_deleted_leave_nothing_behind() {
    if !can_run_with_plugins("a_hundred_pods_added_and_deleted_leave_nothing_behind") {
        return;
    }
    let c = cluster(1);
    // flannel's conflist as it is (0.3.1, portmap chained); flannel not
    // masquerading, so bridge writes iptables rules for each pod.
    let network = PodNetwork::with_subnet_env(&c, 1, &subnet_env(1, false), plugin_dir()).unwrap();
    let node = &c.node(1).ns;
    // The first pod makes the bridge, which stays, as with flannel.
    network.del(network.add().unwrap()).unwrap();
    let before = leftovers(node, &network.data_dirs()).unwrap();
    let mut during = Vec::new();
    for i in 0..100 {
        let pod = network.add().unwrap_or_else(|e| panic!("ADD {i}: {e}"));
        if i == 0 {
            during = leftovers(node, &network.data_dirs()).unwrap();
        }
        network.del(pod).unwrap_or_else(|e| panic!("DEL {i}: {e}"));
    }
    let after = leftovers(node, &network.data_dirs()).unwrap();
    assert_ne!(before, during, "a pod shows in what is compared");
    let gone: Vec<_> = before.iter().filter(|l| !after.contains(l)).collect();
    let left: Vec<_> = after.iter().filter(|l| !before.contains(l)).collect();
    assert!(
        gone.is_empty() && left.is_empty(),
        "lost: {gone:#?}\nleft: {left:#?}"
    );
}

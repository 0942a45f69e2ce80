//! A small cluster in network namespaces: an underlay bridge, node
//! namespaces with a veth `eth0` on it, workload namespaces attached to their
//! node, and a real vxmgrd in each node namespace. Everything is removed when
//! the cluster is dropped, also when a test fails.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

/// Runs a command, panicking with its output when it fails.
pub fn run(args: &[&str]) -> String {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        output.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// Runs a command inside namespace `ns`.
pub fn run_in(ns: &str, args: &[&str]) -> String {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(args);
    run(&full)
}

/// Runs a whitespace-separated command inside namespace `ns`.
pub fn sh(ns: &str, command: &str) -> String {
    run_in(ns, &command.split_whitespace().collect::<Vec<_>>())
}

/// Like `run_in` but returns the output whatever the exit status.
pub fn try_in(ns: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .expect("ip netns exec runs")
}

/// `ip -j ...` in a namespace, parsed.
pub fn ip_json(ns: &str, args: &[&str]) -> serde_json::Value {
    let mut full = vec!["ip", "-n", ns, "-j"];
    full.extend_from_slice(args);
    let text = run(&full);
    if text.trim().is_empty() {
        return serde_json::Value::Array(Vec::new());
    }
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{full:?}: {e}: {text}"))
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A unique, short prefix for this test's namespaces and links.
fn prefix() -> String {
    format!(
        "vx{}x{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A node of the test cluster.
pub struct Node {
    pub name: String,
    pub ns: String,
    /// Index in the cluster, from 1.
    pub index: u8,
    pub socket: PathBuf,
    daemon: Option<Child>,
    log: PathBuf,
}

impl Node {
    pub fn underlay_v4(&self) -> String {
        format!("192.168.10.{}", self.index)
    }

    pub fn underlay_v6(&self) -> String {
        format!("fd00:10::{}", self.index)
    }

    pub fn tunnel_v4(&self) -> String {
        format!("10.244.{}.0", self.index)
    }

    pub fn tunnel_v6(&self) -> String {
        format!("fd00:244:0:{}::", self.index)
    }

    pub fn block_v4(&self) -> String {
        format!("10.244.{}.0/26", self.index)
    }

    pub fn block_v6(&self) -> String {
        format!("fd00:244:0:{}::/122", self.index)
    }

    pub fn pod_v4(&self) -> String {
        format!("10.244.{}.10", self.index)
    }

    pub fn pod_v6(&self) -> String {
        format!("fd00:244:0:{}::10", self.index)
    }

    /// The node's workload namespace.
    pub fn pod_ns(&self) -> String {
        format!("{}p", self.ns)
    }

    pub fn mac(&self, v6: bool) -> String {
        format!(
            "66:{}:00:00:00:{:02x}",
            if v6 { "bb" } else { "aa" },
            self.index
        )
    }

    /// Starts vxmgrd in this node's namespace and waits until it serves.
    pub fn start_daemon(&mut self, extra: &[&str]) {
        assert!(
            self.daemon.is_none(),
            "{}: daemon already running",
            self.name
        );
        let log = std::fs::File::create(&self.log).expect("daemon log file");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns, VXMGRD])
            .arg("--socket")
            .arg(&self.socket)
            .args(["--hostname", &self.name, "--batch-interval", "10ms"])
            .args(extra)
            .env("VXMGR_LOG", "info,vxmgr=debug")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("vxmgrd starts");
        let stderr = child.stderr.take().expect("piped");
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut log = log;
            let mut ready = Some(ready_tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                if line.contains("serving gRPC")
                    && let Some(tx) = ready.take()
                {
                    let _ = tx.send(());
                }
            }
        });
        if ready_rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = child.kill();
            panic!("{}: vxmgrd did not start:\n{}", self.name, self.log_text());
        }
        self.daemon = Some(child);
    }

    /// Stops vxmgrd with SIGTERM (or SIGKILL) and waits for it.
    pub fn stop_daemon(&mut self, sig: i32) -> std::process::ExitStatus {
        let mut child = self.daemon.take().expect("daemon running");
        // `ip netns exec` execs vxmgrd, so the pid is vxmgrd's.
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
        child.wait().expect("exit status")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `calc-stub replay --socket <node's> <args>`.
    pub fn replay(&self, args: &[&str]) -> Output {
        Command::new(CALC_STUB)
            .arg("replay")
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("calc-stub runs")
    }

    /// Replays `lines` and asserts every batch was OK.
    pub fn replay_ok(&self, dir: &Path, name: &str, lines: &[String]) -> Output {
        let path = dir.join(format!("{}-{name}.jsonl", self.name));
        std::fs::write(&path, lines.join("\n") + "\n").expect("write replay");
        let output = self.replay(&[path.to_str().unwrap()]);
        assert!(
            output.status.success(),
            "{}: replay {name} failed ({}):\n{}\n{}\n--- daemon log ---\n{}",
            self.name,
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.log_text()
        );
        output
    }
}

/// The cluster and everything it created.
pub struct Cluster {
    pub prefix: String,
    pub underlay: String,
    pub nodes: Vec<Node>,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// `n` nodes on one underlay bridge (192.168.10.0/24, fd00:10::/64),
    /// each with one workload namespace holding pod addresses
    /// 10.244.<i>.10 and fd00:244:0:<i>::10.
    pub fn new(n: u8) -> Cluster {
        let prefix = prefix();
        let underlay = format!("{prefix}u");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cluster = Cluster {
            underlay: underlay.clone(),
            nodes: Vec::new(),
            prefix: prefix.clone(),
            dir,
        };
        run(&["ip", "netns", "add", &underlay]);
        sh(&underlay, "ip link set lo up");
        sh(&underlay, "ip link add br0 type bridge");
        sh(&underlay, "ip link set br0 up");
        for index in 1..=n {
            let node = cluster.add_node(index);
            cluster.nodes.push(node);
        }
        cluster
    }

    fn add_node(&self, index: u8) -> Node {
        let ns = format!("{}n{index}", self.prefix);
        let node = Node {
            name: format!("node-{index}"),
            ns: ns.clone(),
            index,
            socket: self.dir.path().join(format!("node-{index}.sock")),
            daemon: None,
            log: self.dir.path().join(format!("node-{index}.log")),
        };
        run(&["ip", "netns", "add", &ns]);
        sh(&ns, "ip link set lo up");
        sh(
            &ns,
            "sysctl -q -w net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1",
        );
        sh(
            &ns,
            "sysctl -q -w net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0",
        );
        // Underlay: eth0 in the node, its peer on the bridge.
        let peer = format!("{}e{index}", self.prefix);
        sh(
            &ns,
            &format!(
                "ip link add eth0 type veth peer name {peer} netns {}",
                self.underlay
            ),
        );
        sh(&self.underlay, &format!("ip link set {peer} master br0 up"));
        sh(
            &ns,
            &format!("ip addr add {}/24 dev eth0", node.underlay_v4()),
        );
        sh(
            &ns,
            &format!("ip -6 addr add {}/64 dev eth0 nodad", node.underlay_v6()),
        );
        sh(&ns, "ip link set eth0 up");

        // One workload, routed like a Calico pod: a /32 (/128) to it on the
        // node; its IPv4 default route is on-link, answered by the node's
        // proxy ARP, its IPv6 one goes to the node's link-local address.
        let pod = node.pod_ns();
        run(&["ip", "netns", "add", &pod]);
        sh(&pod, "ip link set lo up");
        sh(&pod, "sysctl -q -w net.ipv6.conf.all.accept_dad=0");
        sh(
            &ns,
            &format!("ip link add cali0 type veth peer name eth0 netns {pod}"),
        );
        sh(&ns, "sysctl -q -w net.ipv4.conf.cali0.proxy_arp=1");
        sh(&ns, "ip link set cali0 up");
        sh(&ns, "ip -6 addr add fe80::1/64 dev cali0 nodad");
        sh(&pod, &format!("ip addr add {}/32 dev eth0", node.pod_v4()));
        sh(
            &pod,
            &format!("ip -6 addr add {}/128 dev eth0 nodad", node.pod_v6()),
        );
        sh(&pod, "ip link set eth0 up");
        sh(&pod, "ip route add default dev eth0 scope link");
        sh(&pod, "ip -6 route add default via fe80::1 dev eth0");
        sh(&ns, &format!("ip route add {}/32 dev cali0", node.pod_v4()));
        sh(
            &ns,
            &format!("ip -6 route add {}/128 dev cali0", node.pod_v6()),
        );
        node
    }

    pub fn node(&self, index: u8) -> &Node {
        &self.nodes[usize::from(index) - 1]
    }

    pub fn node_mut(&mut self, index: u8) -> &mut Node {
        &mut self.nodes[usize::from(index) - 1]
    }

    /// Node `me`'s view of the cluster as its calc graph streams it: config,
    /// every VTEP (IPv4 and IPv6), its own blocks, the other nodes' blocks
    /// and tunnel addresses, InSync. `same_subnet` marks remote blocks as
    /// reachable without encapsulation.
    pub fn view(&self, me: u8, same_subnet: bool) -> Vec<String> {
        self.view_of(
            me,
            &self.nodes.iter().map(|n| n.index).collect::<Vec<_>>(),
            same_subnet,
        )
    }

    /// Like `view`, for a world of only the nodes in `members`.
    pub fn view_of(&self, me: u8, members: &[u8], same_subnet: bool) -> Vec<String> {
        let mut lines = vec![
            r#"{"configUpdate": {"config": {"VXLANVNI": "4096", "VXLANPort": "4789"}}}"#
                .to_string(),
        ];
        let nodes: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| members.contains(&n.index))
            .collect();
        for n in &nodes {
            lines.push(format!(
                r#"{{"vtepUpdate": {{"node": "{}", "mac": "{}", "ipv4Addr": "{}", "parentDeviceIp": "{}", "macV6": "{}", "ipv6Addr": "{}", "parentDeviceIpv6": "{}"}}}}"#,
                n.name,
                n.mac(false),
                n.tunnel_v4(),
                n.underlay_v4(),
                n.mac(true),
                n.tunnel_v6(),
                n.underlay_v6()
            ));
        }
        for n in &nodes {
            let local = n.index == me;
            for (block, node_ip, tunnel) in [
                (
                    n.block_v4(),
                    n.underlay_v4(),
                    format!("{}/32", n.tunnel_v4()),
                ),
                (
                    n.block_v6(),
                    n.underlay_v6(),
                    format!("{}/128", n.tunnel_v6()),
                ),
            ] {
                let types = if local {
                    "LOCAL_WORKLOAD"
                } else {
                    "REMOTE_WORKLOAD"
                };
                lines.push(format!(
                    r#"{{"routeUpdate": {{"types": "{types}", "ipPoolType": "VXLAN", "dst": "{block}", "dstNodeName": "{}", "dstNodeIp": "{node_ip}", "sameSubnet": {}}}}}"#,
                    n.name,
                    same_subnet && !local
                ));
                if !local {
                    lines.push(format!(
                        r#"{{"routeUpdate": {{"types": 17, "ipPoolType": "VXLAN", "dst": "{tunnel}", "dstNodeName": "{}", "dstNodeIp": "{node_ip}"}}}}"#,
                        n.name
                    ));
                }
            }
        }
        lines.push(r#"{"inSync": {}}"#.to_string());
        lines
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::env::var_os("VXMGR_KEEP_NETNS").is_some_and(|v| v == "1") {
            eprintln!(
                "VXMGR_KEEP_NETNS=1: keeping namespaces {}* and {}",
                self.prefix,
                std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"))
                    .keep()
                    .display()
            );
            return;
        }
        for node in &mut self.nodes {
            if let Some(mut child) = node.daemon.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            for ns in [node.pod_ns(), node.ns.clone()] {
                let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.underlay])
            .output();
    }
}

/// `ip monitor` in a namespace, read line by line on a thread, so a test can
/// wait for the kernel to report a change.
pub struct Monitor {
    ns: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

/// A route only the monitor uses, to know it has seen everything before it.
const MARKER: &str = "198.51.100.77";

impl Monitor {
    /// Starts `ip -n <ns> monitor route <objects>` and waits until it listens.
    pub fn start(ns: &str, objects: &[&str]) -> Monitor {
        let mut child = Command::new("ip")
            .args(["-n", ns, "monitor", "route"])
            .args(objects)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ip monitor starts");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut monitor = Monitor {
            ns: ns.to_string(),
            child,
            lines,
            seen: Vec::new(),
        };
        monitor.sync();
        monitor.seen.clear();
        monitor
    }

    /// Makes a change of its own and waits for it: every change the kernel
    /// made before is then in `seen`.
    pub fn sync(&mut self) {
        let marker = format!("{MARKER}/32");
        run(&["ip", "-n", &self.ns, "route", "add", &marker, "dev", "lo"]);
        run(&["ip", "-n", &self.ns, "route", "del", &marker, "dev", "lo"]);
        self.wait_for("the monitor's marker", Duration::from_secs(30), |l| {
            l.starts_with("Deleted") && l.contains(MARKER)
        });
        self.seen.retain(|l| !l.contains(MARKER));
    }

    /// Waits for a line matching `want`; panics after `timeout`.
    pub fn wait_for(&mut self, what: &str, timeout: Duration, want: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = want(&line);
                    self.seen.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!(
                    "no {what} reported within {timeout:?}; saw:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! The cluster: namespaces, links, addresses, daemons, and each node's
//! view of the cluster as a calc graph would stream it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Result, TestbedError, run, sh};

/// How long a daemon may take to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The programs the testbed runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub vxmgrd: PathBuf,
    pub calc_stub: PathBuf,
}

/// A node of the cluster.
pub struct Node {
    pub name: String,
    pub ns: String,
    /// Index in the cluster, from 1.
    pub index: u8,
    pub socket: PathBuf,
    daemon: Option<Child>,
    /// Copies the running vxmgrd's stderr to `log`.
    log_copier: Option<JoinHandle<()>>,
    log: PathBuf,
    binaries: Binaries,
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
        let family = if v6 { "bb" } else { "aa" };
        format!("66:{family}:00:00:00:{:02x}", self.index)
    }

    /// Starts vxmgrd in this node's namespace (10 ms batches unless `extra`
    /// sets them, debug log in the cluster directory) and waits until it
    /// serves.
    pub fn start_daemon(&mut self, extra: &[&str]) -> Result<()> {
        if self.daemon.is_some() {
            self.stop_daemon(libc::SIGTERM)?;
        }
        let mut log = std::fs::File::create(&self.log)?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(&self.binaries.vxmgrd)
            .arg("--socket")
            .arg(&self.socket)
            .args(["--hostname", &self.name])
            .args(extra)
            .env("VXMGR_LOG", "info,vxmgr=debug")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| TestbedError::Spawn {
                command: format!("vxmgrd in {}", self.ns),
                source,
            })?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let (ready_tx, ready_rx) = mpsc::channel();
        let copier = std::thread::spawn(move || {
            let mut ready = Some(ready_tx);
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                let _ = writeln!(log, "{line}");
                if line.contains("serving gRPC")
                    && let Some(tx) = ready.take()
                {
                    let _ = tx.send(());
                }
            }
        });
        if ready_rx.recv_timeout(START_TIMEOUT).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TestbedError::DaemonStart {
                node: self.name.clone(),
                log: self.log_text(),
            });
        }
        self.daemon = Some(child);
        self.log_copier = Some(copier);
        Ok(())
    }

    /// Whether vxmgrd was started and not stopped since.
    pub fn running(&self) -> bool {
        self.daemon.is_some()
    }

    /// The running vxmgrd's process id (`ip netns exec` execs it).
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(Child::id)
    }

    /// Stops vxmgrd with `signal` and waits for it.
    pub fn stop_daemon(&mut self, signal: i32) -> Result<ExitStatus> {
        let Some(mut child) = self.daemon.take() else {
            return Err(TestbedError::Io(std::io::Error::other(format!(
                "{}: no daemon running",
                self.name
            ))));
        };
        // `ip netns exec` execs vxmgrd, so the child's pid is vxmgrd's.
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let status = child.wait()?;
        if let Some(copier) = self.log_copier.take() {
            let _ = copier.join();
        }
        Ok(status)
    }

    /// What the node's vxmgrd logged so far, for messages and for checks
    /// that something was logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops vxmgrd (SIGTERM) and reads all it logged, once its stderr is
    /// copied to the end: for checks that something was never logged.
    pub fn stop_and_read_log(&mut self) -> Result<String> {
        self.stop_daemon(libc::SIGTERM)?;
        Ok(std::fs::read_to_string(&self.log)?)
    }

    /// `calc-stub replay --socket <node's socket> <args>`.
    pub fn replay(&self, args: &[&str]) -> Result<Output> {
        Command::new(&self.binaries.calc_stub)
            .arg("replay")
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .map_err(|source| TestbedError::Spawn {
                command: "calc-stub replay".into(),
                source,
            })
    }

    /// Writes `lines` to a replay file in `dir` and replays it; an error
    /// unless every batch was OK.
    pub fn replay_ok(&self, dir: &Path, name: &str, lines: &[String]) -> Result<Output> {
        let path = dir.join(format!("{}-{name}.jsonl", self.name));
        std::fs::write(&path, lines.join("\n") + "\n")?;
        self.replay_file_ok(&path)
    }

    /// Replays the file at `path`; an error unless every batch was OK.
    pub fn replay_file_ok(&self, path: &Path) -> Result<Output> {
        let output = self.replay(&[&path.to_string_lossy()])?;
        if !output.status.success() {
            return Err(TestbedError::Failed {
                command: format!("{}: calc-stub replay {}", self.name, path.display()),
                status: output.status,
                output: format!(
                    "{}{}\n--- vxmgrd log ---\n{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr),
                    self.log_text()
                ),
            });
        }
        Ok(output)
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The cluster and everything it created; dropping it removes all of it.
pub struct Cluster {
    /// Prefix of every namespace and host-side link name.
    pub prefix: String,
    /// The namespace holding the underlay bridge `br0`.
    pub underlay: String,
    pub nodes: Vec<Node>,
    /// Sockets, logs and replay files.
    pub dir: PathBuf,
    keep: bool,
}

impl Cluster {
    /// `n` nodes on one underlay bridge (192.168.10.0/24, fd00:10::/64),
    /// each with one workload namespace holding the pod addresses
    /// 10.244.<i>.10 and fd00:244:0:<i>::10. `tag` makes the names unique
    /// and recognisable ("vxdemo", "vxtest", ...).
    pub fn new(tag: &str, n: u8, binaries: &Binaries) -> Result<Cluster> {
        let prefix = format!(
            "{tag}{}x{}",
            std::process::id() % 100_000,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir)?;
        let mut cluster = Cluster {
            underlay: format!("{prefix}u"),
            nodes: Vec::new(),
            prefix,
            dir,
            keep: false,
        };
        run(&["ip", "netns", "add", &cluster.underlay])?;
        sh(&cluster.underlay, "ip link set lo up")?;
        sh(&cluster.underlay, "ip link add br0 type bridge")?;
        sh(&cluster.underlay, "ip link set br0 up")?;
        for index in 1..=n {
            // Held before it is built, so that a failure half-way through
            // still has its namespaces removed on drop.
            cluster.nodes.push(Node {
                name: format!("node-{index}"),
                ns: format!("{}n{index}", cluster.prefix),
                index,
                socket: cluster.dir.join(format!("node-{index}.sock")),
                daemon: None,
                log_copier: None,
                log: cluster.dir.join(format!("node-{index}.log")),
                binaries: binaries.clone(),
            });
            cluster.build_node(cluster.node(index))?;
        }
        Ok(cluster)
    }

    fn build_node(&self, node: &Node) -> Result<()> {
        let ns = &node.ns;
        let index = node.index;
        run(&["ip", "netns", "add", ns])?;
        sh(ns, "ip link set lo up")?;
        sh(
            ns,
            "sysctl -q -w net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1",
        )?;
        sh(
            ns,
            "sysctl -q -w net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0",
        )?;
        // Underlay: eth0 in the node, its peer on the bridge.
        let peer = format!("{}e{index}", self.prefix);
        self.add_underlay_link(ns, "eth0", &peer)?;
        sh(
            ns,
            &format!("ip addr add {}/24 dev eth0", node.underlay_v4()),
        )?;
        sh(
            ns,
            &format!("ip -6 addr add {}/64 dev eth0 nodad", node.underlay_v6()),
        )?;

        // One workload, routed like a Calico pod: a /32 (/128) to it on the
        // node; its IPv4 default route is on-link, answered by the node's
        // proxy ARP, its IPv6 one goes to the node's link-local address.
        let pod = node.pod_ns();
        run(&["ip", "netns", "add", &pod])?;
        sh(&pod, "ip link set lo up")?;
        sh(&pod, "sysctl -q -w net.ipv6.conf.all.accept_dad=0")?;
        sh(
            ns,
            &format!("ip link add cali0 type veth peer name eth0 netns {pod}"),
        )?;
        sh(ns, "sysctl -q -w net.ipv4.conf.cali0.proxy_arp=1")?;
        sh(ns, "ip link set cali0 up")?;
        sh(ns, "ip -6 addr add fe80::1/64 dev cali0 nodad")?;
        sh(&pod, &format!("ip addr add {}/32 dev eth0", node.pod_v4()))?;
        sh(
            &pod,
            &format!("ip -6 addr add {}/128 dev eth0 nodad", node.pod_v6()),
        )?;
        sh(&pod, "ip link set eth0 up")?;
        sh(&pod, "ip route add default dev eth0 scope link")?;
        sh(&pod, "ip -6 route add default via fe80::1 dev eth0")?;
        sh(ns, &format!("ip route add {}/32 dev cali0", node.pod_v4()))?;
        sh(
            ns,
            &format!("ip -6 route add {}/128 dev cali0", node.pod_v6()),
        )?;
        Ok(())
    }

    /// Adds interface `name` in namespace `ns`, plugged into the underlay
    /// bridge through `peer`, and brings both up.
    pub fn add_underlay_link(&self, ns: &str, name: &str, peer: &str) -> Result<()> {
        sh(
            ns,
            &format!(
                "ip link add {name} type veth peer name {peer} netns {}",
                self.underlay
            ),
        )?;
        sh(&self.underlay, &format!("ip link set {peer} master br0 up"))?;
        sh(ns, &format!("ip link set {name} up"))?;
        Ok(())
    }

    pub fn node(&self, index: u8) -> &Node {
        &self.nodes[usize::from(index) - 1]
    }

    pub fn node_mut(&mut self, index: u8) -> &mut Node {
        &mut self.nodes[usize::from(index) - 1]
    }

    /// Leaves everything in place when dropped, for a person to look at.
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Node `me`'s view of the cluster as its calc graph streams it: config,
    /// every VTEP (IPv4 and IPv6), its own blocks, the other nodes' blocks
    /// and tunnel addresses, InSync. `same_subnet` marks remote blocks as
    /// reachable without encapsulation.
    pub fn view(&self, me: u8, same_subnet: bool) -> Vec<String> {
        let all: Vec<u8> = self.nodes.iter().map(|n| n.index).collect();
        self.view_of(me, &all, same_subnet)
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

    /// Node `me`'s view with `pools` (see `pool`) declared before its InSync.
    pub fn view_with_pools(&self, me: u8, same_subnet: bool, pools: &[String]) -> Vec<String> {
        let mut view = self.view(me, same_subnet);
        let in_sync = view.pop();
        view.extend(pools.iter().cloned());
        view.extend(in_sync);
        view
    }

    /// Starts vxmgrd on every node and feeds each its view.
    pub fn start_all(&mut self, flags: &[&str], same_subnet: bool) -> Result<()> {
        self.start_all_with_pools(flags, same_subnet, &[])
    }

    /// Starts vxmgrd on every node and feeds each its view with `pools`.
    pub fn start_all_with_pools(
        &mut self,
        flags: &[&str],
        same_subnet: bool,
        pools: &[String],
    ) -> Result<()> {
        for node in &mut self.nodes {
            node.start_daemon(flags)?;
        }
        for node in &self.nodes {
            let view = self.view_with_pools(node.index, same_subnet, pools);
            node.replay_ok(&self.dir, "view", &view)?;
        }
        Ok(())
    }
}

/// An IP pool as Felix's calc graph declares it; the cluster's pods are in
/// 10.244.0.0/16 and fd00:244::/48.
pub fn pool(id: &str, cidr: &str, masquerade: bool) -> String {
    format!(
        r#"{{"ipamPoolUpdate": {{"id": "{id}", "pool": {{"cidr": "{cidr}", "masquerade": {masquerade}, "vxlanMode": "Always"}}}}}}"#
    )
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for node in &mut self.nodes {
            if let Some(mut child) = node.daemon.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            // Routes before nexthops: see `delete_routes`.
            let _ = super::delete_routes(&node.ns);
            for ns in [node.pod_ns(), node.ns.clone()] {
                let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.underlay])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

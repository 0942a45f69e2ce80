//! Pods made the way a container runtime makes them: a network namespace
//! per pod, and the CNI plugins of a conflist run in the node's namespace
//! (`ip netns exec <node>`) as libcni runs them: ADD through the list in
//! order, each plugin handed the previous one's result (`prevResult`); CHECK
//! in order and DEL in reverse, both with the ADD's result; `loopback` for
//! the pod's `lo`. With flannel's conflist, our `flannel` plugin delegates
//! to `bridge` and `host-local` from the system's plugins.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};
use vxmgr::subnet_env::SubnetEnv;

use super::{Cluster, Node, Result, TestbedError, run, sh};

/// Where Debian's containernetworking-plugins installs the plugins.
pub const SYSTEM_PLUGINS: &str = "/usr/lib/cni";

/// flannel's own conflist (kube-flannel's `cni-conf.json`).
pub const KUBE_FLANNEL_CONFLIST: &str = r#"{"cniVersion":"0.3.1","name":"cbr0","plugins":[{"type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}},{"type":"portmap","capabilities":{"portMappings":true}}]}"#;

/// How long one plugin may take.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What flannel would tell node `index` of a dual-stack 10.50.0.0/16,
/// fd00:50::/48 network: subnets 10.50.<index>.0/24, fd00:50:0:<index>::/64.
pub fn subnet_env(index: u8, ip_masq: bool) -> SubnetEnv {
    let net = |s: String| s.parse().expect("a CIDR");
    SubnetEnv {
        networks: vec![net("10.50.0.0/16".into())],
        subnet: Some(net(format!("10.50.{index}.1/24"))),
        ipv6_networks: vec![net("fd00:50::/48".into())],
        ipv6_subnet: Some(net(format!("fd00:50:0:{index}::1/64"))),
        mtu: 1450,
        ip_masq,
    }
}

/// Whether the system's plugins are installed.
pub fn system_plugins_installed() -> bool {
    Path::new(SYSTEM_PLUGINS).join("bridge").is_file()
}

/// A node's pod network: a conflist and where its plugins are.
pub struct PodNetwork {
    /// The node's namespace, where the plugins run.
    pub node_ns: String,
    /// The conflist, as given.
    pub conflist: Value,
    /// CNI_PATH.
    pub cni_path: String,
    /// Names the pods' namespaces: `<node ns>k<n>`.
    next: std::cell::Cell<u32>,
}

/// A pod with its namespace; dropping it removes the namespace (and with
/// it the pod's end of its links), not what the plugins made on the node:
/// `PodNetwork::del` does that.
pub struct Pod {
    /// CNI_CONTAINERID.
    pub id: String,
    /// The pod's namespace (CNI_NETNS is /var/run/netns/<ns>).
    pub ns: String,
    /// The conflist's result: the last plugin's.
    pub result: Value,
}

impl Pod {
    /// The pod's address of one family (from the CNI result), e.g. to
    /// ping it or from it.
    pub fn address(&self, v6: bool) -> Option<std::net::IpAddr> {
        self.result["ips"].as_array()?.iter().find_map(|ip| {
            let cidr: ipnetwork::IpNetwork = ip["address"].as_str()?.parse().ok()?;
            (cidr.is_ipv6() == v6).then_some(cidr.ip())
        })
    }

    fn netns_path(&self) -> String {
        format!("/var/run/netns/{}", self.ns)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

impl PodNetwork {
    /// `conflist` on `node`, with `plugin_dir` (holding our `flannel`)
    /// before the system's plugins in CNI_PATH.
    pub fn new(node: &Node, conflist: Value, plugin_dir: &Path) -> PodNetwork {
        PodNetwork {
            node_ns: node.ns.clone(),
            conflist,
            cni_path: format!("{}:{SYSTEM_PLUGINS}", plugin_dir.display()),
            next: std::cell::Cell::new(0),
        }
    }

    /// flannel's own conflist for `node`, its flannel entry pointed at the
    /// node's own files, as a node of its own would have them at the
    /// default paths: `subnet_file`, and the plugin's and host-local's
    /// data under `data_dir` (`flannel/`, `ipam/`).
    pub fn kube_flannel(
        node: &Node,
        subnet_file: &Path,
        data_dir: &Path,
        plugin_dir: &Path,
    ) -> PodNetwork {
        let mut conflist: Value =
            serde_json::from_str(KUBE_FLANNEL_CONFLIST).expect("flannel's conflist is JSON");
        let flannel = &mut conflist["plugins"][0];
        flannel["subnetFile"] = json!(subnet_file);
        flannel["dataDir"] = json!(data_dir.join("flannel"));
        flannel["ipam"] = json!({ "dataDir": data_dir.join("ipam") });
        PodNetwork::new(node, conflist, plugin_dir)
    }

    /// flannel's conflist on node `index` of `cluster` with no flannel
    /// running: `env` written as the node's subnet.env.
    pub fn with_subnet_env(
        cluster: &Cluster,
        index: u8,
        env: &SubnetEnv,
        plugin_dir: &Path,
    ) -> Result<PodNetwork> {
        let dir = cluster.dir.join(format!("node-{index}.cni"));
        std::fs::create_dir_all(&dir)?;
        let subnet_file = dir.join("subnet.env");
        std::fs::write(&subnet_file, env.to_string())?;
        Ok(PodNetwork::kube_flannel(
            cluster.node(index),
            &subnet_file,
            &dir,
            plugin_dir,
        ))
    }

    /// The directories the flannel entry keeps state in (its own and
    /// host-local's), to look at.
    pub fn data_dirs(&self) -> Vec<PathBuf> {
        let flannel = &self.conflist["plugins"][0];
        [&flannel["dataDir"], &flannel["ipam"]["dataDir"]]
            .into_iter()
            .filter_map(|v| v.as_str().map(PathBuf::from))
            .collect()
    }

    /// A new pod: its namespace, `lo` up through `loopback`, and `eth0`
    /// through the conflist's ADD.
    pub fn add(&self) -> Result<Pod> {
        let n = self.next.get();
        self.next.set(n + 1);
        let ns = format!("{}k{n}", self.node_ns);
        run(&["ip", "netns", "add", &ns])?;
        let mut pod = Pod {
            id: format!("{ns}-id"),
            ns,
            result: Value::Null,
        };
        self.loopback(&pod, "ADD")?;
        let mut prev = None;
        for plugin in self.plugins() {
            let config = self.plugin_config(plugin, prev.take());
            let output = self.exec(&pod, "ADD", "eth0", &config)?;
            prev = Some(parse(&config, &output)?);
        }
        pod.result = prev.unwrap_or(Value::Null);
        Ok(pod)
    }

    /// The conflist's CHECK, as libcni runs it (only for 0.4.0 and later).
    pub fn check(&self, pod: &Pod) -> Result<()> {
        for plugin in self.plugins() {
            let config = self.plugin_config(plugin, Some(pod.result.clone()));
            self.exec(pod, "CHECK", "eth0", &config)?;
        }
        Ok(())
    }

    /// The conflist's DEL, in reverse, then `loopback`'s; then the pod's
    /// namespace goes.
    pub fn del(&self, pod: Pod) -> Result<()> {
        for plugin in self.plugins().iter().rev() {
            let config = self.plugin_config(plugin, Some(pod.result.clone()));
            self.exec(&pod, "DEL", "eth0", &config)?;
        }
        self.loopback(&pod, "DEL")?;
        drop(pod);
        Ok(())
    }

    fn plugins(&self) -> Vec<&Value> {
        self.conflist["plugins"]
            .as_array()
            .map(|p| p.iter().collect())
            .unwrap_or_default()
    }

    /// One plugin's config as libcni hands it: the entry, the list's name
    /// and version, the previous result; `capabilities` is the
    /// administrator's and stays out (no runtime config is asked for).
    fn plugin_config(&self, plugin: &Value, prev: Option<Value>) -> Value {
        let mut config = plugin.clone();
        let map = config
            .as_object_mut()
            .expect("a conflist entry is an object");
        map.remove("capabilities");
        map.insert("name".into(), self.conflist["name"].clone());
        map.insert("cniVersion".into(), self.conflist["cniVersion"].clone());
        if let Some(prev) = prev {
            map.insert("prevResult".into(), prev);
        }
        config
    }

    fn loopback(&self, pod: &Pod, command: &str) -> Result<()> {
        let config = json!({
            "cniVersion": self.conflist["cniVersion"],
            "name": "cni-loopback",
            "type": "loopback",
        });
        self.exec(pod, command, "lo", &config).map(drop)
    }

    /// Runs the plugin `config` names, in the node's namespace; its
    /// standard output, or an error with what it printed.
    fn exec(&self, pod: &Pod, command: &str, ifname: &str, config: &Value) -> Result<Vec<u8>> {
        let plugin = config["type"].as_str().unwrap_or_default();
        let binary = std::env::split_paths(&self.cni_path)
            .map(|dir| dir.join(plugin))
            .find(|p| p.is_file())
            .ok_or_else(|| TestbedError::Output {
                command: format!("CNI {command} {plugin}"),
                reason: format!("not found in CNI_PATH {}", self.cni_path),
            })?;
        let describe = format!("CNI {command} {plugin} for {} on {}", pod.id, self.node_ns);
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.node_ns])
            .arg(&binary)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &pod.id)
            .env("CNI_NETNS", pod.netns_path())
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", &self.cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| TestbedError::Spawn {
                command: describe.clone(),
                source,
            })?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        stdin.write_all(config.to_string().as_bytes())?;
        drop(stdin);
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let output = match rx.recv_timeout(PLUGIN_TIMEOUT) {
            Ok(output) => output?,
            Err(_) => {
                // `ip netns exec` execs the plugin: the pid is the plugin's.
                // SAFETY: kill(2) on our own child, still unreaped.
                unsafe {
                    libc::kill(pid as i32, libc::SIGKILL);
                }
                return Err(TestbedError::Timeout {
                    what: describe,
                    timeout: PLUGIN_TIMEOUT,
                    seen: String::new(),
                });
            }
        };
        Ok(super::succeeded(describe, output)?.stdout)
    }
}

fn parse(config: &Value, output: &[u8]) -> Result<Value> {
    serde_json::from_slice(output).map_err(|e| TestbedError::Output {
        command: format!("CNI ADD {}", config["type"]),
        reason: format!("{e}: {}", String::from_utf8_lossy(output)),
    })
}

/// What a node's pods may leave behind, to compare before and after:
/// interfaces and their addresses, routes, iptables and nftables rules
/// (counters and dates left out), and the files in the CNI data dirs.
pub fn leftovers(node_ns: &str, data_dirs: &[PathBuf]) -> Result<Vec<String>> {
    let mut seen = Vec::new();
    for line in sh(node_ns, "ip -o addr")?.lines() {
        // An address's lifetimes tick; the rest of the line is its identity.
        seen.push(format!(
            "addr {}",
            line.split("valid_lft").next().unwrap_or(line).trim()
        ));
    }
    for link in super::ip_json(node_ns, &["link"])?
        .as_array()
        .into_iter()
        .flatten()
    {
        seen.push(format!(
            "link {}",
            link["ifname"].as_str().unwrap_or_default()
        ));
    }
    for family in ["-4", "-6"] {
        for line in sh(node_ns, &format!("ip {family} route show table all"))?.lines() {
            // The bridge's carrier comes and goes with its ports.
            seen.push(format!("route {}", line.replace(" linkdown", "")));
        }
    }
    for save in ["iptables-save", "ip6tables-save"] {
        for line in sh(node_ns, save)?.lines() {
            if line.starts_with('#') {
                continue;
            }
            // Chains' packet counters: `:CHAIN POLICY [p:b]`.
            let line = line.split(" [").next().unwrap_or(line);
            seen.push(format!("{save} {line}"));
        }
    }
    for line in sh(node_ns, "nft list ruleset")?.lines() {
        seen.push(format!("nft {}", without_counts(line.trim())));
    }
    for dir in data_dirs {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let listing = std::fs::read_dir(&path)
                .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
                .unwrap_or_else(|_| vec![path]);
            seen.extend(listing.iter().map(|p| format!("file {}", p.display())));
        }
    }
    seen.sort();
    Ok(seen)
}

/// An nftables rule without its counter's figures (`packets N bytes N`).
fn without_counts(rule: &str) -> String {
    let mut words = Vec::new();
    let mut skip = 0;
    for word in rule.split_whitespace() {
        if skip > 0 {
            skip -= 1;
        } else if word == "packets" || word == "bytes" {
            skip = 1;
        } else {
            words.push(word);
        }
    }
    words.join(" ")
}

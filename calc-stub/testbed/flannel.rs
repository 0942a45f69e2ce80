//! flannel mode in the testbed: an etcd on the underlay (at 192.168.10.254
//! on the bridge), and on each node calc-flannel next to vxmgrd. In kube
//! mode, a kube-apiserver on the underlay too (192.168.10.253).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use vxmgr::subnet_env::SubnetEnv;

use super::etcd::EtcdServer;
use super::etcd_cluster::EtcdCluster;
use super::kube::{Authorization, KubeApiServer};
use super::{Binaries, Cluster, PodNetwork, Result, TestbedError, sh};

/// Where etcd listens, on the underlay bridge.
pub const ETCD_ADDRESS: &str = "192.168.10.254";
/// Where the kube-apiserver listens in kube mode, on the underlay bridge.
pub const KUBE_API_ADDRESS: &str = "192.168.10.253";
/// flannel's default etcd prefix.
pub const PREFIX: &str = "/coreos.com/network";

/// The cluster, its etcd and the agents. Dropping it stops them all and
/// removes everything.
pub struct FlannelCluster {
    agents: Vec<Option<Child>>,
    calc_flannel: PathBuf,
    /// In kube mode ([`FlannelCluster::start_kube_api`]). Dropped before
    /// the cluster, whose directory holds its data.
    pub kube: Option<KubeApiServer>,
    /// Dropped before the cluster, whose directory holds its data.
    pub etcd: EtcdServer,
    /// A cluster of several members ([`FlannelCluster::start_etcd_cluster`]),
    /// beside the single etcd.
    pub etcd_cluster: Option<EtcdCluster>,
    pub cluster: Cluster,
    keep: bool,
}

/// A node's subnets, from its subnet file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subnets {
    pub v4: IpNetwork,
    pub v6: Option<IpNetwork>,
}

/// The version the flanneld binary at `path` reports, which must be
/// v0.20.x: the release whose behaviour the interop follows.
pub fn flanneld_version(path: &Path) -> Result<String> {
    let command = format!("{} --version", path.display());
    let output = Command::new(path)
        .arg("--version")
        .output()
        .map_err(|source| TestbedError::Spawn {
            command: command.clone(),
            source,
        })?;
    // flanneld prints its version on stderr.
    let version = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if !version.starts_with("v0.20.") {
        return Err(TestbedError::Output {
            command,
            reason: format!("flanneld {version:?}, not v0.20.x"),
        });
    }
    Ok(version)
}

impl FlannelCluster {
    /// `n` nodes (see `Cluster::new`), no daemon or agent running yet, and
    /// etcd serving on the underlay.
    pub fn new(
        tag: &str,
        n: u8,
        binaries: &Binaries,
        calc_flannel: &Path,
    ) -> Result<FlannelCluster> {
        let cluster = Cluster::new(tag, n, binaries)?;
        sh(
            &cluster.underlay,
            &format!("ip addr add {ETCD_ADDRESS}/24 dev br0"),
        )?;
        let etcd = EtcdServer::start(
            Some(&cluster.underlay),
            ETCD_ADDRESS,
            &cluster.dir.join("etcd"),
        )?;
        Ok(FlannelCluster {
            agents: (0..n).map(|_| None).collect(),
            calc_flannel: calc_flannel.to_path_buf(),
            kube: None,
            etcd,
            etcd_cluster: None,
            cluster,
            keep: false,
        })
    }

    /// Writes the network config.
    pub async fn set_config(&self, config: &str) -> Result<()> {
        self.etcd
            .client()
            .await?
            .put(&format!("{PREFIX}/config"), config)
            .await
    }

    /// Starts a kube-apiserver (AlwaysAllow) on the underlay, for agents
    /// run with `--kube-subnet-mgr --kubeconfig-file` [`Self::kubeconfig`].
    pub fn start_kube_api(&mut self) -> Result<&KubeApiServer> {
        sh(
            &self.cluster.underlay,
            &format!("ip addr add {KUBE_API_ADDRESS}/24 dev br0"),
        )?;
        let server = KubeApiServer::start(
            Some(&self.cluster.underlay),
            KUBE_API_ADDRESS,
            &self.cluster.dir.join("kube"),
            Authorization::AlwaysAllow,
        )?;
        server.write_kubeconfig(&self.kubeconfig(), &server.admin_token)?;
        let keep = self.keep;
        let server = self.kube.insert(server);
        if keep {
            server.keep();
        }
        Ok(server)
    }

    /// Starts an etcd cluster of one member per address (on the
    /// underlay's 192.168.10.0/24, each in a namespace of its own) and
    /// writes the network `config` into it.
    pub async fn start_etcd_cluster(
        &mut self,
        addresses: &[&str],
        config: &str,
    ) -> Result<&mut EtcdCluster> {
        let mut etcd = EtcdCluster::start(&self.cluster, addresses)?;
        if self.keep {
            etcd.keep();
        }
        etcd.client(0)
            .await?
            .put(&format!("{PREFIX}/config"), config)
            .await?;
        Ok(self.etcd_cluster.insert(etcd))
    }

    /// The admin's kubeconfig for the kube-apiserver.
    pub fn kubeconfig(&self) -> PathBuf {
        self.cluster.dir.join("kubeconfig")
    }

    pub fn subnet_file(&self, index: u8) -> PathBuf {
        self.cluster.dir.join(format!("node-{index}.subnet.env"))
    }

    /// Node `index`'s pod network: flannel's conflist reading the node's
    /// subnet file, our `flannel` plugin from `plugin_dir`.
    pub fn pod_network(&self, index: u8, plugin_dir: &Path) -> PodNetwork {
        let node = self.cluster.node(index);
        let data = self.cluster.dir.join(format!("node-{index}.cni"));
        PodNetwork::kube_flannel(node, &self.subnet_file(index), &data, plugin_dir)
    }

    pub fn agent_log_path(&self, index: u8) -> PathBuf {
        self.cluster
            .dir
            .join(format!("node-{index}.calc-flannel.log"))
    }

    pub fn agent_log(&self, index: u8) -> String {
        std::fs::read_to_string(self.agent_log_path(index)).unwrap_or_default()
    }

    /// Starts calc-flannel on node `index` with `args` and `env`, next to
    /// the node's vxmgrd, its log appended to the node's agent log. It
    /// reaches etcd only from flags or variables given here.
    pub fn start_agent(&mut self, index: u8, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
        let socket = self.cluster.node(index).socket.clone();
        let mut full: Vec<&OsStr> = vec!["--socket".as_ref(), socket.as_ref()];
        full.extend(args.iter().map(OsStr::new));
        let calc_flannel = self.calc_flannel.clone();
        let log_spec = [
            ("CALC_FLANNEL_LOG", "info,calc_flannel=debug"),
            ("NO_COLOR", "1"),
        ];
        let env: Vec<(&str, &str)> = log_spec.iter().chain(env).copied().collect();
        self.spawn_agent(index, &calc_flannel, &full, &env)
    }

    /// Starts flannel's own `flanneld` (the binary at `flanneld`) on node
    /// `index` in place of calc-flannel and vxmgrd, with `args` and `env`:
    /// it programs the node's kernel itself. Its log goes to the node's
    /// agent log; it is stopped like an agent.
    pub fn start_flanneld(
        &mut self,
        index: u8,
        flanneld: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<()> {
        let full: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        self.spawn_agent(index, flanneld, &full, env)
    }

    /// Runs `program --subnet-file <node's subnet file> <args>` in node
    /// `index`'s namespace as the node's agent (replacing one running).
    fn spawn_agent(
        &mut self,
        index: u8,
        program: &Path,
        args: &[&OsStr],
        env: &[(&str, &str)],
    ) -> Result<()> {
        if self.agents[usize::from(index) - 1].is_some() {
            self.stop_agent(index, libc::SIGTERM)?;
        }
        let node = self.cluster.node(index);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.agent_log_path(index))?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &node.ns])
            .arg(program)
            .arg("--subnet-file")
            .arg(self.subnet_file(index))
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| TestbedError::Spawn {
                command: format!("{} in {}", program.display(), node.ns),
                source,
            })?;
        let stderr = child.stderr.take().expect("stderr is piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                let _ = writeln!(log, "{line}");
            }
        });
        self.agents[usize::from(index) - 1] = Some(child);
        Ok(())
    }

    /// Node `index`'s running agent's process id (`ip netns exec` execs
    /// it).
    pub fn agent_pid(&self, index: u8) -> Option<u32> {
        self.agents[usize::from(index) - 1].as_ref().map(Child::id)
    }

    /// Stops node `index`'s agent with `signal` and waits for it.
    pub fn stop_agent(&mut self, index: u8, signal: i32) -> Result<ExitStatus> {
        let Some(mut child) = self.agents[usize::from(index) - 1].take() else {
            return Err(TestbedError::Io(std::io::Error::other(format!(
                "node-{index}: no agent running"
            ))));
        };
        // `ip netns exec` execs the agent: the child's pid is its own.
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        Ok(child.wait()?)
    }

    /// Waits for node `index`'s subnet file and reads its subnets.
    pub fn subnets(&self, index: u8, timeout: Duration) -> Result<Subnets> {
        let path = self.subnet_file(index);
        let text = self.wait(
            &format!("{}", path.display()),
            timeout,
            || std::fs::read_to_string(&path).ok(),
            index,
        )?;
        let env: SubnetEnv = text.parse().map_err(|e| TestbedError::Output {
            command: path.display().to_string(),
            reason: format!("{e} in {text:?}"),
        })?;
        let masked = |n: IpNetwork| IpNetwork::new(n.network(), n.prefix()).expect("same prefix");
        let v4 = env.subnet.map(masked).ok_or_else(|| TestbedError::Output {
            command: path.display().to_string(),
            reason: format!("no FLANNEL_SUBNET in {text:?}"),
        })?;
        Ok(Subnets {
            v4,
            v6: env.ipv6_subnet.map(masked),
        })
    }

    /// Waits until node `index`'s agent has logged `needle` `count` times.
    pub fn wait_for_log(
        &self,
        index: u8,
        needle: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<()> {
        self.wait(
            &format!("{count} × {needle:?}"),
            timeout,
            || (self.agent_log(index).matches(needle).count() >= count).then_some(()),
            index,
        )
    }

    /// Polls `check` until it gives a value; the timeout error shows the
    /// agent's log.
    fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn() -> Option<T>,
        index: u8,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = check() {
                return Ok(value);
            }
            if Instant::now() > deadline {
                return Err(TestbedError::Timeout {
                    what: format!("node-{index}: {what}"),
                    timeout,
                    seen: self.agent_log(index),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Leaves everything running when dropped, for a person to look at.
    pub fn keep(&mut self) {
        self.keep = true;
        if let Some(kube) = &mut self.kube {
            kube.keep();
        }
        self.etcd.keep();
        if let Some(etcd) = &mut self.etcd_cluster {
            etcd.keep();
        }
        self.cluster.keep();
    }
}

impl Drop for FlannelCluster {
    fn drop(&mut self) {
        if self.keep {
            std::mem::forget(std::mem::take(&mut self.agents));
            return;
        }
        for child in self.agents.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

//! Command-line options: `cargo bench --bench dataplane -- [OPTIONS] [SCENARIO]...`.

use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Scenario {
    /// Programming a whole cluster from scratch: vxmgrd against ip -batch (root).
    Cold,
    /// Nodes joining, leaving and changing VTEP on a converged daemon (root).
    Churn,
    /// A resync with no drift over 25,000 nodes, in-process (root).
    Resync,
    /// Message throughput through the socket on the memory kernel.
    Ingest,
    /// Daemon resident memory, and heap per route in-process.
    Rss,
    /// Minutes of churn against the netlink backend: flat memory, no leaked
    /// kernel objects (root; not part of the default set).
    Soak,
    /// calc-flannel + vxmgrd on three nodes and a real etcd: N leases to
    /// every kernel, cold, in bursts and one at a time (root, etcd).
    Flannel,
    /// Pods added and deleted on a node through the CNI plugins (our
    /// flannel plugin, bridge, host-local, portmap): time per ADD and DEL
    /// (root, the system's CNI plugins).
    Cni,
    /// calc-flannel --kube-subnet-mgr + vxmgrd on one node and a real
    /// kube-apiserver: N Nodes to the kernel, cold, one at a time and a
    /// burst of updates (root, etcd, VXMGR_KUBE_APISERVER/VXMGR_KUBECTL).
    Kube,
    /// vxmgrd following the host's firewall: its forward chain moved after
    /// Docker's drop in iptables-nft and in iptables-legacy, its nftables
    /// table repaired after a delete; 20 trials each (root, iptables, nft).
    Firewall,
    /// vxmgrd SIGKILLed at random moments of cold start, churn, resyncs,
    /// pool and VNI changes, restarted each time: convergence after
    /// DataplaneInSync, nothing right at a kill touched (root; not part of
    /// the default set).
    Crashloop,
    /// Cold start, lone-update p99, resync and RSS from 1,000 to 100,000
    /// nodes, vxmgr beside the kernel's own cost, drawn into a PNG (root).
    Growth,
}

impl Scenario {
    /// Whether it programs a real kernel in network namespaces.
    pub fn needs_kernel(self) -> bool {
        matches!(
            self,
            Scenario::Cold
                | Scenario::Churn
                | Scenario::Resync
                | Scenario::Soak
                | Scenario::Flannel
                | Scenario::Cni
                | Scenario::Kube
                | Scenario::Firewall
                | Scenario::Crashloop
                | Scenario::Growth
        )
    }
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_possible_value() {
            Some(value) => f.write_str(value.get_name()),
            None => write!(f, "{self:?}"),
        }
    }
}

/// Cluster sizes calc-stub can generate with 4 blocks per node (2^19 /26
/// blocks in 10.0.0.0/7), with at least one remote node.
fn nodes() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(2..=131_072)
}

/// vxmgr's benchmark suite. Figures are printed, never asserted.
#[derive(Parser, Debug)]
#[command(name = "dataplane")]
pub struct Cli {
    /// Scenarios to run, in the order given (default: all, in the order
    /// listed here). Kernel scenarios need root and are skipped without
    /// it; `rss` then measures the memory backend only.
    #[arg(value_enum)]
    pub scenarios: Vec<Scenario>,
    /// Cluster sizes in nodes (× 4 blocks each) for cold, churn and rss
    /// [default: 1000,5000,20000; --quick: 1000,5000].
    #[arg(long, value_delimiter = ',', value_parser = nodes())]
    pub sizes: Option<Vec<u32>>,
    /// A fast smoke run: small sizes, few repetitions.
    #[arg(long)]
    pub quick: bool,
    /// Operations of each kind in churn [default: 200; --quick: 30].
    #[arg(long)]
    pub churn_ops: Option<u32>,
    /// Nodes for resync [default: 25000; --quick: 5000].
    #[arg(long, value_parser = nodes())]
    pub resync_nodes: Option<u32>,
    /// Timed resyncs [default: 5; --quick: 3].
    #[arg(long)]
    pub resync_runs: Option<u32>,
    /// Nodes for ingest [default: 20000].
    #[arg(long, value_parser = nodes())]
    pub ingest_nodes: Option<u32>,
    /// Ingest repetitions [default: 3; --quick: 1].
    #[arg(long)]
    pub ingest_runs: Option<u32>,
    /// Runs of each cold start (cold, growth; flannel's of one node), taken
    /// in turns; the median is reported [default: 5; --quick: 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub cold_runs: Option<u32>,
    /// Skip the inline-gateway builds in cold (their kernel cost grows with
    /// the square of the number of gateways).
    #[arg(long)]
    pub no_inline: bool,
    /// Nodes for soak [default: 2000].
    #[arg(long, value_parser = nodes())]
    pub soak_nodes: Option<u32>,
    /// How long soak churns, in seconds [default: 180; --quick: 20].
    #[arg(long)]
    pub soak_seconds: Option<u32>,
    /// Leases for flannel [default: 10000,50000; --quick: 1000].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=60_000))]
    pub flannel_sizes: Option<Vec<u32>>,
    /// Leases added one at a time in flannel [default: 50; --quick: 10].
    #[arg(long)]
    pub flannel_single: Option<u32>,
    /// Pods added and deleted in cni [default: 100; --quick: 20].
    #[arg(long)]
    pub cni_pods: Option<u32>,
    /// Other Nodes for kube [default: 1000,10000; --quick: 1000].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=60_000))]
    pub kube_sizes: Option<Vec<u32>>,
    /// Nodes created one at a time in kube [default: 200; --quick: 20].
    #[arg(long)]
    pub kube_single: Option<u32>,
    /// Nodes changing their VTEP MAC at once in kube [default: 600; --quick: 100].
    #[arg(long)]
    pub kube_burst: Option<u32>,
    /// SIGKILLs in crashloop [default: 200; --quick: 20]; VXMGR_CRASH_SEED
    /// sets the seed of their moments.
    #[arg(long)]
    pub kills: Option<u32>,
    /// Nodes of crashloop's world [default: 5000].
    #[arg(long, value_parser = nodes())]
    pub crash_nodes: Option<u32>,
    /// Cluster sizes for growth [default: 1000,2000,5000,10000,20000,50000,100000;
    /// --quick: 1000,5000].
    #[arg(long, value_delimiter = ',', value_parser = nodes())]
    pub growth_sizes: Option<Vec<u32>>,
    /// How long the machine's own stalls are measured, before each
    /// scenario and after the last, in seconds; 0 skips [default: 5; --quick: 1].
    #[arg(long)]
    pub stall_seconds: Option<u32>,
    /// Where growth writes its plot.
    #[arg(long, default_value = "target/growth.png")]
    pub growth_plot: std::path::PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    pub bench: bool,
}

/// Every setting, defaults resolved.
#[derive(Debug)]
pub struct Settings {
    pub scenarios: Vec<Scenario>,
    pub sizes: Vec<u32>,
    pub churn_ops: u32,
    pub resync_nodes: u32,
    pub resync_runs: u32,
    pub ingest_nodes: u32,
    pub ingest_runs: u32,
    pub cold_runs: u32,
    pub inline: bool,
    pub soak_nodes: u32,
    pub soak_duration: std::time::Duration,
    pub flannel_sizes: Vec<u32>,
    pub flannel_single: u32,
    pub cni_pods: u32,
    pub kube_sizes: Vec<u32>,
    pub kube_single: u32,
    pub kube_burst: u32,
    pub kills: u32,
    pub crash_nodes: u32,
    pub growth_sizes: Vec<u32>,
    pub growth_plot: std::path::PathBuf,
    pub stall_duration: std::time::Duration,
}

impl Cli {
    pub fn settings(self) -> Settings {
        let pick = |value: Option<u32>, full: u32, quick: u32| {
            value.unwrap_or(if self.quick { quick } else { full })
        };
        let scenarios = if self.scenarios.is_empty() {
            Scenario::value_variants()
                .iter()
                .copied()
                .filter(|s| !matches!(s, Scenario::Soak | Scenario::Crashloop))
                .collect()
        } else {
            // In the order given: a scenario can be placed away from the
            // after-effects of another (docs/performance.md, "The flannel
            // cold start after 100,000 nodes"). A repeat runs once.
            let mut seen = std::collections::BTreeSet::new();
            self.scenarios
                .iter()
                .copied()
                .filter(|s| seen.insert(*s))
                .collect()
        };
        let default_sizes = if self.quick {
            vec![1000, 5000]
        } else {
            vec![1000, 5000, 20000]
        };
        Settings {
            scenarios,
            sizes: self.sizes.clone().unwrap_or(default_sizes),
            churn_ops: pick(self.churn_ops, 200, 30),
            resync_nodes: pick(self.resync_nodes, 25_000, 5_000),
            resync_runs: pick(self.resync_runs, 5, 3),
            ingest_nodes: pick(self.ingest_nodes, 20_000, 20_000),
            ingest_runs: pick(self.ingest_runs, 3, 1),
            cold_runs: pick(self.cold_runs, 5, 1),
            inline: !self.no_inline,
            soak_nodes: self.soak_nodes.unwrap_or(2000),
            soak_duration: std::time::Duration::from_secs(u64::from(pick(
                self.soak_seconds,
                180,
                20,
            ))),
            flannel_sizes: self.flannel_sizes.clone().unwrap_or(if self.quick {
                vec![1000]
            } else {
                vec![10_000, 50_000]
            }),
            flannel_single: pick(self.flannel_single, 50, 10),
            cni_pods: pick(self.cni_pods, 100, 20),
            kube_sizes: self.kube_sizes.clone().unwrap_or(if self.quick {
                vec![1000]
            } else {
                vec![1000, 10_000]
            }),
            kube_single: pick(self.kube_single, 200, 20),
            kube_burst: pick(self.kube_burst, 600, 100),
            kills: pick(self.kills, 200, 20),
            crash_nodes: self.crash_nodes.unwrap_or(5000),
            growth_sizes: self.growth_sizes.clone().unwrap_or(if self.quick {
                vec![1000, 5000]
            } else {
                vec![1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000]
            }),
            growth_plot: self.growth_plot.clone(),
            stall_duration: std::time::Duration::from_secs(u64::from(pick(
                self.stall_seconds,
                5,
                1,
            ))),
        }
    }
}

//! kube: calc-flannel with `--kube-subnet-mgr` + vxmgrd (netlink, its
//! defaults) on one namespace node, against a real kube-apiserver on the
//! underlay, vxlan backend, and N other Nodes carrying flannel's
//! annotations (as their flanneld would have written them): how long until
//! the node's kernel has them when they are there at start-up (cold), when
//! one Node is created on the converged node, and when a burst of Nodes
//! change their VTEP MAC. Time is read from the node's `ip monitor route
//! neigh`, so "programmed" means in the kernel. Needs a kube-apiserver and
//! kubectl (VXMGR_KUBE_APISERVER, VXMGR_KUBECTL) and etcd.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::Bench;
use crate::flannel::{CALC_FLANNEL, binaries, dst, public_ip, vtep_mac};
use crate::netns;
use crate::report::{Table, median, millis, quantile, secs};
use crate::testbed::{FlannelCluster, Monitor, etcd, ip_json, kube as testbed_kube, run_in};

/// flannel's annotation prefix (its default).
const PREFIX: &str = "flannel.alpha.coreos.com";
/// The node under test, as the Kubernetes API names it.
const OWN_NODE: &str = "node-1";
const OWN_POD_CIDR: &str = "10.0.0.0/24";
const NET_CONF: &str = r#"{"Network": "10.0.0.0/8", "Backend": {"Type": "vxlan"}}"#;
/// flannel's VXLAN device for VNI 1.
const DEVICE: &str = "flannel.1";
/// API requests in flight at once (kube-apiserver's default limit on
/// mutating requests in flight is 200).
const IN_FLIGHT: usize = 64;
const WAIT: Duration = Duration::from_secs(600);

/// Another node, `i`, with its VTEP MAC in its `generation`th version.
fn other_node(i: u32, generation: u8) -> Result<Node> {
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": format!("other-{i}"),
            "annotations": annotations(i, generation),
        },
        "spec": {"podCIDR": dst(i), "podCIDRs": [dst(i)]},
    });
    Ok(serde_json::from_value(node)?)
}

fn annotations(i: u32, generation: u8) -> serde_json::Value {
    let backend_data = serde_json::json!({"VNI": 1, "VtepMAC": vtep_mac(i, generation)});
    serde_json::json!({
        format!("{PREFIX}/backend-type"): "vxlan",
        format!("{PREFIX}/backend-data"): backend_data.to_string(),
        format!("{PREFIX}/public-ip"): public_ip(i),
        format!("{PREFIX}/kube-subnet-manager"): "true",
    })
}

fn own_node() -> Result<Node> {
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": OWN_NODE},
        "spec": {"podCIDR": OWN_POD_CIDR, "podCIDRs": [OWN_POD_CIDR]},
    });
    Ok(serde_json::from_value(node)?)
}

/// What one size measured.
struct Figures {
    create: Duration,
    cold: Duration,
    /// One Node created at a time on the converged node: from the API's
    /// answer to the create until its route is in the kernel.
    one: Vec<Duration>,
    burst: Duration,
    burst_size: u32,
}

pub fn run(bench: &Bench) -> Result<()> {
    if testbed_kube::apiserver_binary().is_none() || testbed_kube::kubectl_binary().is_none() {
        println!(
            "\nkube: SKIPPED (needs a kube-apiserver and kubectl: set VXMGR_KUBE_APISERVER and VXMGR_KUBECTL to their paths)"
        );
        return Ok(());
    }
    if !etcd::available() {
        println!("\nkube: SKIPPED (needs the etcd binary: apt-get install etcd-server)");
        return Ok(());
    }
    let settings = &bench.settings;
    let mut table = Table::new(
        "kube: calc-flannel --kube-subnet-mgr + vxmgrd on one node, N other Nodes on a real kube-apiserver (vxlan)",
        &[
            "Nodes",
            "creating them (s)",
            "cold start (s)",
            "one Node, median (ms)",
            "p99 (ms)",
            "burst of VTEP MAC changes",
            "burst (s)",
        ],
    );
    for &n in &settings.kube_sizes {
        let f = measure(n, settings.kube_single, settings.kube_burst)
            .with_context(|| format!("{n} Nodes"))?;
        table.row(vec![
            n.to_string(),
            secs(f.create),
            secs(f.cold),
            millis(median(&f.one)),
            millis(quantile(&f.one, 0.99)),
            f.burst_size.to_string(),
            secs(f.burst),
        ]);
    }
    table.print();
    println!(
        "  creating them: the N Nodes with flannel's annotations, {IN_FLIGHT} creates in flight (not part of any figure)."
    );
    println!(
        "  cold start: calc-flannel started with the Nodes in the API → the last route in the kernel."
    );
    println!(
        "  one Node: {} created one at a time on the converged node; the API's answer to the create → its route in the kernel.",
        settings.kube_single
    );
    println!(
        "  burst: that many Nodes' backend-data patched to a new VtepMAC, {IN_FLIGHT} in flight; the first request → the last neighbour/FDB change in the kernel. Every Node's route, neighbour and FDB entry was then checked against the API (100%)."
    );
    Ok(())
}

/// The Kubernetes API as the admin, from the underlay namespace where the
/// API server listens: a runtime whose worker threads were started in
/// that namespace, and every request spawned onto them.
struct NodesApi {
    runtime: tokio::runtime::Runtime,
    nodes: Api<Node>,
}

impl NodesApi {
    fn new(underlay: &str, kubeconfig: &Path) -> Result<NodesApi> {
        let underlay = underlay.to_string();
        let runtime = std::thread::spawn(move || -> Result<tokio::runtime::Runtime> {
            netns::enter(&underlay)?;
            Ok(tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("building the API runtime panicked"))??;
        let kubeconfig: PathBuf = kubeconfig.to_path_buf();
        let nodes = runtime.block_on(runtime.spawn(async move {
            let config = kube::Config::from_custom_kubeconfig(
                Kubeconfig::read_from(&kubeconfig)?,
                &KubeConfigOptions::default(),
            )
            .await?;
            anyhow::Ok(Api::all(kube::Client::try_from(config)?))
        }))??;
        Ok(NodesApi { runtime, nodes })
    }

    /// Runs `work` on the namespace's threads.
    fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.runtime.block_on(self.runtime.spawn(work))?
    }

    /// Runs `request` for each of `items`, `IN_FLIGHT` at a time.
    fn each<T, F>(
        &self,
        items: Vec<T>,
        request: impl Fn(Api<Node>, T) -> F + Send + Sync + 'static,
    ) -> Result<()>
    where
        T: Send + 'static,
        F: Future<Output = Result<()>> + Send + 'static,
    {
        let api = self.nodes.clone();
        self.run(async move {
            let results: Vec<Result<()>> = futures::stream::iter(items)
                .map(|item| request(api.clone(), item))
                .buffer_unordered(IN_FLIGHT)
                .collect()
                .await;
            results.into_iter().collect()
        })
    }

    fn create_all(&self, nodes: Vec<Node>) -> Result<()> {
        self.each(nodes, |api, node| async move {
            let name = node.metadata.name.clone().unwrap_or_default();
            api.create(&PostParams::default(), &node)
                .await
                .with_context(|| format!("creating Node {name}"))?;
            Ok(())
        })
    }

    /// Patches other Nodes `range` to their VTEP MAC of `generation`.
    fn change_macs(&self, range: std::ops::Range<u32>, generation: u8) -> Result<()> {
        self.each(range.collect(), move |api, i| async move {
            let patch = serde_json::json!({
                "metadata": {"annotations": annotations(i, generation)}
            });
            let name = format!("other-{i}");
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("patching Node {name}"))?;
            Ok(())
        })
    }
}

fn measure(n: u32, singles: u32, burst: u32) -> Result<Figures> {
    let mut c = FlannelCluster::new("vxbku", 1, &binaries(), Path::new(CALC_FLANNEL))?;
    c.start_kube_api()?;
    let net_conf = c.cluster.dir.join("net-conf.json");
    std::fs::write(&net_conf, NET_CONF)?;
    c.cluster.nodes[0].start_daemon(&[])?;
    let api = NodesApi::new(&c.cluster.underlay, &c.kubeconfig())?;

    // Cold: the Nodes are there before the agent starts.
    let started = Instant::now();
    api.create_all(vec![own_node()?])?;
    api.create_all((0..n).map(|i| other_node(i, 0)).collect::<Result<_>>()?)?;
    let create = started.elapsed();
    let ns = c.cluster.nodes[0].ns.clone();
    let mut monitor = Monitor::start(&ns, &["neigh"])?;
    let started = Instant::now();
    start_agent(&mut c, &net_conf)?;
    let cold = await_changes(&mut monitor, (0..n).map(dst).collect())? - started;

    // One at a time, on the converged node.
    let mut one = Vec::new();
    for i in n..n + singles {
        api.create_all(vec![other_node(i, 0)?])?;
        let answered = Instant::now();
        await_changes(&mut monitor, HashSet::from([dst(i)]))?;
        one.push(answered.elapsed());
    }
    let total = n + singles;

    // A burst of VTEP MAC changes: each one's neighbour and FDB entry
    // replaced, the old FDB entry removed.
    let burst_size = burst.min(total);
    let expected = (0..burst_size)
        .flat_map(|i| {
            let tunnel = dst(i).replace(".0/24", ".0");
            [
                format!("{tunnel} dev {DEVICE} lladdr {}", vtep_mac(i, 1)),
                format!("{} dev {DEVICE} lladdr {}", public_ip(i), vtep_mac(i, 1)),
                format!(
                    "Deleted {} dev {DEVICE} lladdr {}",
                    public_ip(i),
                    vtep_mac(i, 0)
                ),
            ]
        })
        .collect();
    let started = Instant::now();
    api.change_macs(0..burst_size, 1)?;
    let burst = await_changes(&mut monitor, expected)? - started;
    check_all(&ns, total, burst_size)?;
    Ok(Figures {
        create,
        cold,
        one,
        burst,
        burst_size,
    })
}

fn start_agent(c: &mut FlannelCluster, net_conf: &Path) -> Result<()> {
    let kubeconfig = c.kubeconfig();
    let args = [
        "--kube-subnet-mgr",
        "--kubeconfig-file",
        kubeconfig.to_str().context("kubeconfig path")?,
        "--net-config-path",
        net_conf.to_str().context("net-conf path")?,
        "--iface",
        "eth0",
        "--log",
        "info",
    ];
    c.start_agent(1, &args, &[("NODE_NAME", OWN_NODE)])?;
    Ok(())
}

/// The change a monitor line reports, as the bench names it: a route of
/// ours added by its destination; a neighbour or FDB entry by everything
/// up to its link-layer address.
fn change(line: &str) -> Option<String> {
    if !line.starts_with("Deleted") && line.contains(" proto 80") {
        return line.split_whitespace().next().map(str::to_string);
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let lladdr = words.iter().position(|w| *w == "lladdr")?;
    Some(words.get(..=lladdr + 1)?.join(" "))
}

/// Waits until the monitor has reported every change in `expected`; the
/// instant it did.
fn await_changes(monitor: &mut Monitor, expected: HashSet<String>) -> Result<Instant> {
    let total = expected.len();
    let left = RefCell::new(expected);
    monitor.wait_for(&format!("{total} changes"), WAIT, |line| {
        let mut left = left.borrow_mut();
        if let Some(change) = change(line) {
            left.remove(&change);
        }
        left.is_empty()
    })?;
    monitor.seen.clear();
    Ok(Instant::now())
}

/// The kernel holds exactly the other Nodes `0..total`, the first
/// `changed` of them with their new VTEP MAC: a route, a neighbour and an
/// FDB entry each.
fn check_all(ns: &str, total: u32, changed: u32) -> Result<()> {
    let mac = |i: u32| vtep_mac(i, u8::from(i < changed));
    let routes: BTreeSet<String> = crate::testbed::census::routes(ns, vxmgr::model::Family::V4)?
        .iter()
        .filter_map(|r| r.split_whitespace().next().map(str::to_string))
        .collect();
    let want: BTreeSet<String> = (0..total).map(dst).collect();
    ensure!(
        routes == want,
        "routes: {} of {total} Nodes missing, {} extra",
        want.difference(&routes).count(),
        routes.difference(&want).count()
    );

    let neighbours: BTreeMap<String, String> = list(&ip_json(
        ns,
        &["neigh", "show", "dev", DEVICE, "nud", "permanent"],
    )?)
    .map(|n| (field(n, "dst"), field(n, "lladdr")))
    .collect();
    let want: BTreeMap<String, String> = (0..total)
        .map(|i| (dst(i).replace(".0/24", ".0"), mac(i)))
        .collect();
    let wrong = want
        .iter()
        .filter(|(k, v)| neighbours.get(*k) != Some(v))
        .count();
    ensure!(
        neighbours.len() == want.len() && wrong == 0,
        "neighbours: {} entries for {total} Nodes, {wrong} wrong or missing",
        neighbours.len(),
    );

    let fdb: serde_json::Value = serde_json::from_str(&run_in(
        ns,
        &["bridge", "-j", "fdb", "show", "dev", DEVICE],
    )?)?;
    let fdb: BTreeSet<(String, String)> = list(&fdb)
        .filter(|e| !e["dst"].is_null())
        .map(|e| (field(e, "mac"), field(e, "dst")))
        .collect();
    let want: BTreeSet<(String, String)> = (0..total).map(|i| (mac(i), public_ip(i))).collect();
    ensure!(
        fdb == want,
        "FDB: {} of {total} Nodes missing, {} stale or extra",
        want.difference(&fdb).count(),
        fdb.difference(&want).count()
    );
    Ok(())
}

fn list(value: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    value.as_array().into_iter().flatten()
}

fn field(value: &serde_json::Value, name: &str) -> String {
    value[name].as_str().unwrap_or_default().to_string()
}

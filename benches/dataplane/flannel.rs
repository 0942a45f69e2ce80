//! flannel: a three-node namespace cluster of calc-flannel + vxmgrd on a
//! real etcd, and N leases of other nodes (as flanneld would write them):
//! how long until every node's kernel has a route for each of them, when
//! they are there at start-up (cold), when they arrive in a burst on a
//! running cluster (one put each, concurrently, and 100 per transaction),
//! and when one arrives on a converged cluster; and what calc-flannel and
//! vxmgrd hold resident once one node has converged. With FLANNELD naming
//! a flanneld v0.20.x binary, flanneld's cold start and VmRSS on the same
//! node (vxlan) are measured beside them. Time is read from each node's
//! kernel's route notifications (`route_watch`), so "programmed" means in
//! the kernel.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;

use crate::testbed::etcd::{self, EtcdClient};
use crate::testbed::flannel::{self as testbed_flannel, PREFIX};
use crate::testbed::{Binaries, FlannelCluster, sh};

use crate::Bench;
use crate::cluster::CALC_STUB;
use crate::daemon::{VXMGRD, settled_rss_bytes};
use crate::report::{Table, median, mib, millis, missing, quantile, secs};
use crate::route_watch::{RouteChange, RouteWatch, Waited};

pub const CALC_FLANNEL: &str = env!("CARGO_BIN_EXE_calc-flannel");
const NODES: u8 = 3;
/// Puts in flight at once in a burst of single puts.
const IN_FLIGHT: usize = 64;
const PER_TXN: usize = 100;
/// Transactions in flight at once when the leases are written before a
/// cold start (not part of any figure).
const TXNS_IN_FLIGHT: usize = 16;
/// How long a wait for routes may take: flanneld needs about 5 minutes
/// for 50,000 leases on a busy 2-CPU machine.
const WAIT: Duration = Duration::from_secs(900);

#[derive(Clone, Copy)]
enum Backend {
    Vxlan,
    HostGw,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Vxlan => "vxlan",
            Backend::HostGw => "host-gw",
        }
    }

    fn config(self) -> String {
        format!(
            r#"{{"Network": "10.0.0.0/8", "Backend": {{"Type": "{}"}}}}"#,
            self.name()
        )
    }
}

/// Lease `i` of another node: [`dst`], its node at [`public_ip`].
fn lease(backend: Backend, i: u32) -> (String, String) {
    let key = format!("{PREFIX}/subnets/10.{}.{}.0-24", 1 + i / 256, i % 256);
    let public = public_ip(i);
    let value = match backend {
        Backend::Vxlan => format!(
            r#"{{"PublicIP":"{public}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{}"}}}}"#,
            vtep_mac(i, 0)
        ),
        Backend::HostGw => {
            format!(r#"{{"PublicIP":"{public}","PublicIPv6":null,"BackendType":"host-gw"}}"#)
        }
    };
    (key, value)
}

/// The subnet of lease `i`: 10.(1 + i/256).(i%256).0/24 (the cluster's
/// own nodes lease from 10.0.x).
pub fn dst(i: u32) -> String {
    format!("10.{}.{}.0/24", 1 + i / 256, i % 256)
}

/// The address of lease `i`'s node: 172.16.(i/250).(i%250+1).
pub fn public_ip(i: u32) -> String {
    format!("172.16.{}.{}", i / 250, i % 250 + 1)
}

/// The VTEP MAC of lease `i`'s node, in its `generation`th version.
pub fn vtep_mac(i: u32, generation: u8) -> String {
    format!(
        "0e:{generation:02x}:00:{:02x}:{:02x}:{:02x}",
        i >> 16,
        (i >> 8) & 0xff,
        i & 0xff
    )
}

/// What one size measured, for one backend.
struct Figures {
    /// A one-node cluster, and all the nodes (whose kernel work the one
    /// kernel of this machine serialises: its RTNL lock is global).
    cold_one: Duration,
    cold_all: Duration,
    /// VmRSS of the one node's processes once it has converged.
    rss: Resident,
    burst_single: Duration,
    burst_txn: Duration,
    /// One lease at a time on the converged cluster, until every node has
    /// it: from the put, and from etcd's answer to it (its commit, with
    /// the disk write, is etcd's time).
    one: Vec<Duration>,
    one_after_put: Vec<Duration>,
}

/// VmRSS of a node's processes once converged, in bytes.
struct Resident {
    calc_flannel: u64,
    vxmgrd: u64,
}

/// flanneld's figures on the same one-node cold start.
struct FlanneldFigures {
    cold_one: Duration,
    rss: u64,
}

/// Who programs a node's kernel.
#[derive(Clone, Copy)]
enum Agent<'a> {
    /// calc-flannel, next to the node's vxmgrd.
    CalcFlannel,
    /// flannel's own flanneld (the binary at this path), alone.
    Flanneld(&'a Path),
}

impl Agent<'_> {
    /// A route to a lease's subnet added.
    fn added(self, change: &RouteChange) -> bool {
        match self {
            Agent::CalcFlannel => added(change),
            Agent::Flanneld(_) => change.added && change.device.as_deref() == Some("flannel.1"),
        }
    }

    /// `ip route show` selecting the routes to leases' subnets.
    fn routes(self) -> Routes {
        match self {
            Agent::CalcFlannel => OURS,
            Agent::Flanneld(_) => Routes(&["dev", "flannel.1"]),
        }
    }
}

/// An `ip route show` selector for the routes a wait counts.
#[derive(Clone, Copy)]
struct Routes(&'static [&'static str]);

const OURS: Routes = Routes(&["proto", "80"]);

pub fn run(bench: &Bench) -> Result<()> {
    if !etcd::available() {
        println!("\nflannel: SKIPPED (needs the etcd binary: apt-get install etcd-server)");
        return Ok(());
    }
    let flanneld = flanneld()?;
    let mut table = Table::new(
        format!(
            "flannel: N leases of other nodes → every one of {NODES} nodes' kernels has their routes (s; vxmgrd with its defaults)"
        ),
        &[
            "backend",
            "leases",
            "cold, 1 node",
            "cold, all nodes",
            "burst, one put each",
            "burst, 100 per txn",
            "one lease median (ms)",
            "p99 (ms)",
            "after etcd's answer, median (ms)",
        ],
    );
    let mut resident = Table::new(
        "flannel: one node's cold start (s) and VmRSS once converged (MiB), calc-flannel + vxmgrd and flanneld",
        &[
            "backend",
            "leases",
            "cold",
            "calc-flannel",
            "vxmgrd",
            "both",
            "flanneld cold",
            "flanneld",
        ],
    );
    for backend in [Backend::Vxlan, Backend::HostGw] {
        for &n in &bench.settings.flannel_sizes {
            let f = measure(bench, backend, n, bench.settings.flannel_single)
                .with_context(|| format!("{} with {n} leases", backend.name()))?;
            table.row(vec![
                backend.name().into(),
                n.to_string(),
                secs(f.cold_one),
                secs(f.cold_all),
                secs(f.burst_single),
                secs(f.burst_txn),
                millis(median(&f.one)),
                millis(quantile(&f.one, 0.99)),
                millis(median(&f.one_after_put)),
            ]);
            let theirs = match (&flanneld, backend) {
                (Some((path, _)), Backend::Vxlan) => {
                    let f = measure_flanneld(bench, path, n)
                        .with_context(|| format!("flanneld with {n} leases"))?;
                    [secs(f.cold_one), mib(f.rss)]
                }
                (Some(_), Backend::HostGw) => [missing("vxlan only"), missing("vxlan only")],
                (None, _) => [missing("no FLANNELD"), missing("no FLANNELD")],
            };
            let [theirs_cold, theirs_rss] = theirs;
            resident.row(vec![
                backend.name().into(),
                n.to_string(),
                secs(f.cold_one),
                mib(f.rss.calc_flannel),
                mib(f.rss.vxmgrd),
                mib(f.rss.calc_flannel + f.rss.vxmgrd),
                theirs_cold,
                theirs_rss,
            ]);
        }
    }
    table.print();
    println!(
        "  cold start: calc-flannel started on every node with the leases in etcd → the last route in the last kernel"
    );
    println!(
        "    (1 node: the median of {} runs).",
        bench.settings.cold_runs
    );
    println!(
        "  bursts: the first write → the last route in the last kernel; every lease was installed on every node (checked)."
    );
    println!(
        "  one lease: the put → its route in the last kernel, on the cluster holding the N leases."
    );
    resident.print();
    println!(
        "  cold: the agent started (calc-flannel, vxmgrd already serving; or flanneld) with the leases in etcd → the last route in the kernel;"
    );
    println!(
        "    calc-flannel's: the median of {} runs (the same as \"cold, 1 node\" above); flanneld's: one run.",
        bench.settings.cold_runs
    );
    println!(
        "  VmRSS: once the node has every route, when readings 100 ms apart have agreed for 2 s."
    );
    match &flanneld {
        Some((path, version)) => {
            println!("  flanneld: {} ({version}), etcd, vxlan.", path.display())
        }
        None => println!("  flanneld: set FLANNELD to a flanneld v0.20.x binary to measure it."),
    }
    Ok(())
}

/// The flanneld binary FLANNELD names, with its version.
fn flanneld() -> Result<Option<(PathBuf, String)>> {
    let Some(path) = std::env::var_os("FLANNELD").map(PathBuf::from) else {
        return Ok(None);
    };
    let version = testbed_flannel::flanneld_version(&path)?;
    Ok(Some((path, version)))
}

pub fn binaries() -> Binaries {
    Binaries {
        vxmgrd: VXMGRD.into(),
        calc_stub: CALC_STUB.into(),
    }
}

/// A cluster of `nodes` for `agent`: with calc-flannel, vxmgrd runs on
/// every node, at its defaults as in production (the node also holding
/// an address on the leases' 172.16.0.0/12, where host-gw needs their
/// nodes).
fn cluster(bench: &Bench, backend: Backend, nodes: u8, agent: Agent) -> Result<FlannelCluster> {
    let mut c = FlannelCluster::new("vxbfl", nodes, &binaries(), Path::new(CALC_FLANNEL))?;
    bench.runtime.block_on(c.set_config(&backend.config()))?;
    for node in &mut c.cluster.nodes {
        sh(
            &node.ns,
            &format!("ip addr add 172.31.255.{}/12 dev eth0", node.index),
        )?;
        if let Agent::CalcFlannel = agent {
            node.start_daemon(&["--log", "info"])?;
        }
    }
    Ok(c)
}

fn start_agents(c: &mut FlannelCluster, agent: Agent) -> Result<()> {
    let endpoint = "http://192.168.10.254:2379";
    for index in 1..=c.cluster.nodes.len() as u8 {
        let args = ["--etcd-endpoints", endpoint, "--iface", "eth0"];
        match agent {
            Agent::CalcFlannel => {
                let args: Vec<&str> = args.into_iter().chain(["--log", "info"]).collect();
                c.start_agent(index, &args, &[])?;
            }
            Agent::Flanneld(path) => c.start_flanneld(index, path, &args, &[])?,
        }
    }
    Ok(())
}

fn watches(c: &FlannelCluster) -> Result<Vec<RouteWatch>> {
    c.cluster
        .nodes
        .iter()
        .map(|n| RouteWatch::start(&n.ns))
        .collect()
}

/// The vxmgr route protocol (`proto 80`).
const PROTOCOL: u8 = 80;

/// A route of ours added.
fn added(change: &RouteChange) -> bool {
    change.added && change.protocol == PROTOCOL
}

/// A route of ours deleted.
fn deleted(change: &RouteChange) -> bool {
    !change.added && change.protocol == PROTOCOL
}

/// Waits until every node's kernel has announced `count` more route
/// changes that are `wanted`; the instant the last one was received. A
/// watch that lost notifications (its socket overran) cannot count them:
/// that node's kernel is then polled until it holds `total` of the
/// `routes`, and the node is watched afresh for the next wait.
fn await_routes(
    watches: &mut [RouteWatch],
    count: usize,
    wanted: impl Fn(&RouteChange) -> bool,
    (routes, total): (Routes, usize),
) -> Result<Instant> {
    let mut last = Instant::now();
    for watch in watches.iter_mut() {
        match watch.wait_for(count, WAIT, &wanted)? {
            Waited::Seen(at) => last = last.max(at),
            Waited::Overrun => {
                eprintln!(
                    "flannel: the route notifications of {} overran while waiting for {count} routes: polling the kernel instead",
                    watch.ns()
                );
                poll_routes(watch.ns(), routes, total)?;
                *watch = RouteWatch::start(watch.ns())?;
                last = Instant::now();
            }
        }
    }
    Ok(last)
}

/// Reads `ns`'s routes every 20 ms until `total` of `routes` are there.
fn poll_routes(ns: &str, routes: Routes, total: usize) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let held = crate::testbed::census::routes_selected(ns, vxmgr::model::Family::V4, routes.0)?;
        if held.len() == total {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{ns}: {} routes ({}) after {WAIT:?}, not {total}",
            held.len(),
            routes.0.join(" ")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `write` for each pair, `IN_FLIGHT` at a time: each its own revision,
/// several of them in one watch response.
async fn each<F>(
    client: &EtcdClient,
    pairs: &[(String, String)],
    write: impl Fn(EtcdClient, String, String) -> F,
) -> Result<()>
where
    F: Future<Output = crate::testbed::Result<()>>,
{
    let results: Vec<crate::testbed::Result<()>> = futures::stream::iter(pairs)
        .map(|(k, v)| write(client.clone(), k.clone(), v.clone()))
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    results
        .into_iter()
        .collect::<crate::testbed::Result<()>>()?;
    Ok(())
}

/// Writes the pairs `PER_TXN` to a transaction, `in_flight` transactions
/// at a time.
async fn put_txns(client: &EtcdClient, pairs: &[(String, String)], in_flight: usize) -> Result<()> {
    let results: Vec<crate::testbed::Result<()>> = futures::stream::iter(pairs.chunks(PER_TXN))
        .map(|chunk| {
            let mut client = client.clone();
            async move { client.put_all(chunk).await }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    results
        .into_iter()
        .collect::<crate::testbed::Result<()>>()?;
    Ok(())
}

/// A one-node cluster of `agent`, `leases` in etcd before the agent
/// starts: the time until the last lease's route is in the kernel, and
/// the cluster, converged.
fn cold(
    bench: &Bench,
    backend: Backend,
    nodes: u8,
    agent: Agent,
    leases: &[(String, String)],
) -> Result<(Duration, FlannelCluster)> {
    let mut c = cluster(bench, backend, nodes, agent)?;
    bench.runtime.block_on(async {
        let client = c.etcd.client().await?;
        put_txns(&client, leases, TXNS_IN_FLIGHT).await
    })?;
    let mut watches = watches(&c)?;
    let started = Instant::now();
    start_agents(&mut c, agent)?;
    let routes = leases.len() + usize::from(nodes) - 1;
    let converged = await_routes(
        &mut watches,
        routes,
        |l| agent.added(l),
        (agent.routes(), routes),
    )?;
    Ok((converged - started, c))
}

fn measure(bench: &Bench, backend: Backend, n: u32, singles: u32) -> Result<Figures> {
    let leases: Vec<(String, String)> = (0..n).map(|i| lease(backend, i)).collect();
    let others = usize::from(NODES) - 1;

    // Cold: the leases are there before any agent starts. One node's, a
    // few times over: a single run wanders by a tenth either way.
    let mut cold_ones = Vec::new();
    let mut c = None;
    for _ in 0..bench.settings.cold_runs {
        // The last run's cluster torn down before the next starts.
        drop(c.take());
        let (time, cluster) = cold(bench, backend, 1, Agent::CalcFlannel, &leases)?;
        cold_ones.push(time);
        c = Some(cluster);
    }
    let c = c.expect("at least one cold run");
    let cold_one = median(&cold_ones);
    let node = c.cluster.node(1);
    let pid = |p: Option<u32>, what: &str| p.with_context(|| format!("{what} is not running"));
    let rss = Resident {
        calc_flannel: settled_rss_bytes(pid(c.agent_pid(1), "calc-flannel")?)?,
        vxmgrd: settled_rss_bytes(pid(node.daemon_pid(), "vxmgrd")?)?,
    };
    drop(c);
    let (cold_all, c) = cold(bench, backend, NODES, Agent::CalcFlannel, &leases)?;
    drop(c);

    // Bursts on a running cluster.
    let mut c = cluster(bench, backend, NODES, Agent::CalcFlannel)?;
    let mut watches = watches(&c)?;
    start_agents(&mut c, Agent::CalcFlannel)?;
    await_routes(&mut watches, others, added, (OURS, others))?;
    let client = bench.runtime.block_on(c.etcd.client())?;
    let started = Instant::now();
    let put = async |mut c: EtcdClient, k: String, v: String| c.put(&k, &v).await;
    bench.runtime.block_on(each(&client, &leases, put))?;
    let all = (OURS, others + leases.len());
    let burst_single = await_routes(&mut watches, leases.len(), added, all)? - started;
    check_all(&c, n)?;

    let delete = async |mut c: EtcdClient, k: String, _| c.delete(&k).await;
    bench.runtime.block_on(each(&client, &leases, delete))?;
    await_routes(&mut watches, leases.len(), deleted, (OURS, others))?;

    let started = Instant::now();
    bench.runtime.block_on(put_txns(&client, &leases, 1))?;
    let burst_txn = await_routes(&mut watches, leases.len(), added, all)? - started;
    check_all(&c, n)?;

    // One at a time, on the converged cluster.
    let mut client = client;
    let (mut one, mut one_after_put) = (Vec::new(), Vec::new());
    for i in n..n + singles {
        let (key, value) = lease(backend, i);
        let want = dst(i);
        let started = Instant::now();
        bench.runtime.block_on(client.put(&key, &value))?;
        let answered = Instant::now();
        let this_one = |c: &RouteChange| added(c) && c.dst == want;
        let held = others + leases.len() + (i - n) as usize + 1;
        let installed = await_routes(&mut watches, 1, this_one, (OURS, held))?;
        one.push(installed - started);
        one_after_put.push(installed - answered);
    }
    Ok(Figures {
        cold_one,
        cold_all,
        rss,
        burst_single,
        burst_txn,
        one,
        one_after_put,
    })
}

/// flanneld (vxlan) alone on one node with `n` leases in etcd at start.
fn measure_flanneld(bench: &Bench, flanneld: &Path, n: u32) -> Result<FlanneldFigures> {
    let leases: Vec<(String, String)> = (0..n).map(|i| lease(Backend::Vxlan, i)).collect();
    let agent = Agent::Flanneld(flanneld);
    let (cold_one, c) = cold(bench, Backend::Vxlan, 1, agent, &leases)?;
    let pid = c.agent_pid(1).context("flanneld is not running")?;
    Ok(FlanneldFigures {
        cold_one,
        rss: settled_rss_bytes(pid)?,
    })
}

/// Every node's kernel has a route to each of the `n` leases.
fn check_all(c: &FlannelCluster, n: u32) -> Result<()> {
    for node in &c.cluster.nodes {
        let routes = crate::testbed::census::routes(&node.ns, vxmgr::model::Family::V4)?;
        let dsts: HashSet<&str> = routes
            .iter()
            .filter_map(|r| r.split_whitespace().next())
            .collect();
        let missing = (0..n).filter(|i| !dsts.contains(dst(*i).as_str())).count();
        ensure!(
            missing == 0,
            "{}: {missing} of {n} leases have no route",
            node.name
        );
    }
    Ok(())
}

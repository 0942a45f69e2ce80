//! flannel: a three-node namespace cluster of calc-flannel + vxmgrd on a
//! real etcd, and N leases of other nodes (as flanneld would write them):
//! how long until every node's kernel has a route for each of them, when
//! they are there at start-up (cold), when they arrive in a burst on a
//! running cluster (one put each, concurrently, and 100 per transaction),
//! and when one arrives on a converged cluster. Time is read from each
//! node's `ip monitor route`, so "programmed" means in the kernel.

use std::cell::Cell;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;

use crate::testbed::etcd::{self, EtcdClient};
use crate::testbed::flannel::PREFIX;
use crate::testbed::{Binaries, FlannelCluster, Monitor, sh};

use crate::Bench;
use crate::cluster::CALC_STUB;
use crate::daemon::VXMGRD;
use crate::report::{Table, median, millis, quantile, secs};

pub const CALC_FLANNEL: &str = env!("CARGO_BIN_EXE_calc-flannel");
const NODES: u8 = 3;
/// Puts in flight at once in a burst of single puts.
const IN_FLIGHT: usize = 64;
const PER_TXN: usize = 100;
const WAIT: Duration = Duration::from_secs(300);

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
    burst_single: Duration,
    burst_txn: Duration,
    /// One lease at a time on the converged cluster, until every node has
    /// it: from the put, and from etcd's answer to it (its commit, with
    /// the disk write, is etcd's time).
    one: Vec<Duration>,
    one_after_put: Vec<Duration>,
}

pub fn run(bench: &Bench) -> Result<()> {
    if !etcd::available() {
        println!("\nflannel: SKIPPED (needs the etcd binary: apt-get install etcd-server)");
        return Ok(());
    }
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
        }
    }
    table.print();
    println!(
        "  cold start: calc-flannel started on every node with the leases in etcd → the last route in the last kernel."
    );
    println!(
        "  bursts: the first write → the last route in the last kernel; every lease was installed on every node (checked)."
    );
    println!(
        "  one lease: the put → its route in the last kernel, on the cluster holding the N leases."
    );
    Ok(())
}

pub fn binaries() -> Binaries {
    Binaries {
        vxmgrd: VXMGRD.into(),
        calc_stub: CALC_STUB.into(),
    }
}

/// A cluster of `nodes` with vxmgrd on every node, at its defaults as in
/// production (the node also holding an address on the leases'
/// 172.16.0.0/12, where host-gw needs their nodes).
fn cluster(bench: &Bench, backend: Backend, nodes: u8) -> Result<FlannelCluster> {
    let mut c = FlannelCluster::new("vxbfl", nodes, &binaries(), Path::new(CALC_FLANNEL))?;
    bench.runtime.block_on(c.set_config(&backend.config()))?;
    for node in &mut c.cluster.nodes {
        sh(
            &node.ns,
            &format!("ip addr add 172.31.255.{}/12 dev eth0", node.index),
        )?;
        node.start_daemon(&["--log", "info"])?;
    }
    Ok(c)
}

fn start_agents(c: &mut FlannelCluster) -> Result<()> {
    let endpoint = "http://192.168.10.254:2379";
    for index in 1..=c.cluster.nodes.len() as u8 {
        let args = [
            "--etcd-endpoints",
            endpoint,
            "--iface",
            "eth0",
            "--log",
            "info",
        ];
        c.start_agent(index, &args, &[])?;
    }
    Ok(())
}

fn monitors(c: &FlannelCluster) -> Result<Vec<Monitor>> {
    Ok(c.cluster
        .nodes
        .iter()
        .map(|n| Monitor::start(&n.ns, &[]))
        .collect::<crate::testbed::Result<_>>()?)
}

/// A route of ours added, as `ip monitor` reports it.
pub fn added(line: &str) -> bool {
    !line.starts_with("Deleted") && line.contains(" proto 80")
}

/// Waits until every monitor has reported `count` more routes of ours
/// (added, or deleted with `deleted`); the instant the last one did.
fn await_routes(monitors: &mut [Monitor], count: usize, deleted: bool) -> Result<Instant> {
    for monitor in monitors.iter_mut() {
        let seen = Cell::new(0);
        monitor.wait_for(&format!("{count} routes"), WAIT, |line| {
            let ours = if deleted {
                line.starts_with("Deleted") && line.contains(" proto 80")
            } else {
                added(line)
            };
            if ours {
                seen.set(seen.get() + 1);
            }
            seen.get() >= count
        })?;
        monitor.seen.clear();
    }
    Ok(Instant::now())
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

async fn put_txns(client: &mut EtcdClient, pairs: &[(String, String)]) -> Result<()> {
    for chunk in pairs.chunks(PER_TXN) {
        client.put_all(chunk).await?;
    }
    Ok(())
}

fn measure(bench: &Bench, backend: Backend, n: u32, singles: u32) -> Result<Figures> {
    let leases: Vec<(String, String)> = (0..n).map(|i| lease(backend, i)).collect();
    let others = usize::from(NODES) - 1;

    // Cold: the leases are there before any agent starts.
    let cold = |nodes: u8| -> Result<Duration> {
        let mut c = cluster(bench, backend, nodes)?;
        bench.runtime.block_on(async {
            let mut client = c.etcd.client().await?;
            put_txns(&mut client, &leases).await
        })?;
        let mut monitors = monitors(&c)?;
        let started = Instant::now();
        start_agents(&mut c)?;
        let routes = leases.len() + usize::from(nodes) - 1;
        Ok(await_routes(&mut monitors, routes, false)? - started)
    };
    let cold_one = cold(1)?;
    let cold_all = cold(NODES)?;

    // Bursts on a running cluster.
    let mut c = cluster(bench, backend, NODES)?;
    let mut monitors = monitors(&c)?;
    start_agents(&mut c)?;
    await_routes(&mut monitors, others, false)?;
    let mut client = bench.runtime.block_on(c.etcd.client())?;
    let started = Instant::now();
    let put = async |mut c: EtcdClient, k: String, v: String| c.put(&k, &v).await;
    bench.runtime.block_on(each(&client, &leases, put))?;
    let burst_single = await_routes(&mut monitors, leases.len(), false)? - started;
    check_all(&c, n)?;

    let delete = async |mut c: EtcdClient, k: String, _| c.delete(&k).await;
    bench.runtime.block_on(each(&client, &leases, delete))?;
    await_routes(&mut monitors, leases.len(), true)?;

    let started = Instant::now();
    bench.runtime.block_on(put_txns(&mut client, &leases))?;
    let burst_txn = await_routes(&mut monitors, leases.len(), false)? - started;
    check_all(&c, n)?;

    // One at a time, on the converged cluster.
    let (mut one, mut one_after_put) = (Vec::new(), Vec::new());
    for i in n..n + singles {
        let (key, value) = lease(backend, i);
        let want = format!("{} ", dst(i));
        let started = Instant::now();
        bench.runtime.block_on(client.put(&key, &value))?;
        let answered = Instant::now();
        for monitor in monitors.iter_mut() {
            monitor.wait_for(&want, WAIT, |l| added(l) && l.starts_with(&want))?;
            monitor.seen.clear();
        }
        one.push(started.elapsed());
        one_after_put.push(answered.elapsed());
    }
    Ok(Figures {
        cold_one,
        cold_all,
        burst_single,
        burst_txn,
        one,
        one_after_put,
    })
}

/// Every node's kernel has a route to each of the `n` leases.
fn check_all(c: &FlannelCluster, n: u32) -> Result<()> {
    for node in &c.cluster.nodes {
        let routes = crate::testbed::census::routes(&node.ns, vxmgr::model::Family::V4)?;
        let missing = (0..n)
            .filter(|i| {
                !routes
                    .iter()
                    .any(|r| r.starts_with(&format!("{} ", dst(*i))))
            })
            .count();
        ensure!(
            missing == 0,
            "{}: {missing} of {n} leases have no route",
            node.name
        );
    }
    Ok(())
}

//! firewall: how long vxmgrd at its default flags takes to follow the
//! host's firewall. A node with a masquerading pool; Docker sets up
//! iptables-nft (FORWARD drop, a chain and a jump of its own), then undoes
//! it and does the same through iptables-legacy, each time timed until
//! vxmgr's forward chain is in that backend and gone from the other (nft:
//! nftables notifies the change; legacy: the poll finds it); then vxmgr's
//! nftables table is deleted, timed until it is back. Before each change
//! the daemon is left alone for 1.5 to 2.5 s, so that no repair triggered
//! by the previous change catches it, and so that changes fall at every
//! phase of the legacy poll.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::Bench;
use crate::cluster::CALC_STUB;
use crate::daemon::VXMGRD;
use crate::report::{Table, median, millis, quantile};
use crate::testbed::{self, Binaries, Cluster, pool};

/// Trials of each measure.
const TRIALS: usize = 20;
/// A repair taking longer than this is a failure of the run.
const DEADLINE: Duration = Duration::from_secs(30);

pub fn run(_bench: &Bench) -> Result<()> {
    for tool in ["iptables-nft", "iptables-legacy", "nft"] {
        if testbed::try_run(&["sh", "-c", &format!("command -v {tool}")])
            .is_ok_and(|o| !o.status.success())
        {
            println!("\nfirewall: SKIPPED (needs {tool}: apt-get install iptables nftables)");
            return Ok(());
        }
    }
    let binaries = Binaries {
        vxmgrd: VXMGRD.into(),
        calc_stub: CALC_STUB.into(),
    };
    let mut cluster = Cluster::new("vxbfw", 1, &binaries)?;
    cluster.node_mut(1).start_daemon(&[])?;
    let pools = [
        pool("pods-v4", "10.244.0.0/16", true),
        pool("pods-v6", "fd00:244::/48", true),
    ];
    let node = cluster.node(1);
    node.replay_ok(
        &cluster.dir,
        "pools",
        &cluster.view_with_pools(1, false, &pools),
    )?;
    let ns = node.ns.as_str();
    // An empty host: Felix's tie rule puts the chain in legacy first.
    wait(|| holds_ours(ns, "legacy"))?;

    let (mut to_nft, mut to_legacy, mut table) = (Vec::new(), Vec::new(), Vec::new());
    let mut settles = (0..).map(|i: u64| Duration::from_millis(1500 + i * 337 % 1000));
    let mut settle = || std::thread::sleep(settles.next().unwrap_or_default());
    for _ in 0..TRIALS {
        for (into, times) in [("nft", &mut to_nft), ("legacy", &mut to_legacy)] {
            let from = if into == "nft" { "legacy" } else { "nft" };
            settle();
            let started = Instant::now();
            docker(ns, into, true)?;
            wait(|| holds_ours(ns, into) && !holds_ours(ns, from))?;
            times.push(started.elapsed());
            // Docker gone, a tie: the chain stays where it is.
            docker(ns, into, false)?;
        }
        settle();
        let started = Instant::now();
        testbed::sh(ns, "nft delete table inet vxmgr")?;
        wait(|| {
            testbed::try_in(ns, &["nft", "list", "table", "inet", "vxmgr"])
                .is_ok_and(|o| o.status.success())
        })?;
        table.push(started.elapsed());
    }
    let mut report = Table::new(
        format!(
            "firewall: vxmgrd at default flags following the host's firewall, {TRIALS} trials each (ms from the first change to the repair seen complete; polled every 10 ms)"
        ),
        &["change", "median", "max"],
    );
    for (change, times) in [
        (
            "Docker's drop in iptables-nft: chain moved from legacy",
            &to_nft,
        ),
        (
            "Docker's drop in iptables-legacy: chain moved from nft",
            &to_legacy,
        ),
        ("nft delete table inet vxmgr: table back", &table),
    ] {
        report.row(vec![
            change.into(),
            millis(median(times)),
            millis(quantile(times, 1.0)),
        ]);
    }
    report.print();
    Ok(())
}

/// Docker's FORWARD drop and chain, set up (or undone) in one backend.
fn docker(ns: &str, mode: &str, set_up: bool) -> Result<()> {
    let script: String = ["iptables", "ip6tables"]
        .map(|t| {
            let t = format!("{t}-{mode}");
            if set_up {
                format!("{t} -P FORWARD DROP; {t} -N DOCKER-USER; {t} -A FORWARD -j DOCKER-USER;")
            } else {
                format!("{t} -D FORWARD -j DOCKER-USER; {t} -X DOCKER-USER; {t} -P FORWARD ACCEPT;")
            }
        })
        .concat();
    testbed::run_in(ns, &["sh", "-ec", &script])?;
    Ok(())
}

/// Both families of backend `mode` hold vxmgr's chain.
fn holds_ours(ns: &str, mode: &str) -> bool {
    ["iptables", "ip6tables"].iter().all(|t| {
        testbed::sh(ns, &format!("{t}-{mode}-save -t filter"))
            .is_ok_and(|save| save.contains("-A FORWARD -j VXMGR-FORWARD"))
    })
}

fn wait(mut done: impl FnMut() -> bool) -> Result<()> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > DEADLINE {
            bail!("not repaired within {} s", DEADLINE.as_secs());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

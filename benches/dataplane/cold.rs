//! cold: node-0 programs a whole cluster into a fresh namespace, vxmgrd
//! (with and without nexthop objects; fed in-process, or by the calc-stub
//! binary replaying a file as a user would) against iproute2 batch files.

use std::io::{BufRead, BufReader, Read, Seek};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use vxmgr::wire::felix::ToDataplane;
use vxmgr::wire::replay::ReplayFormat;

use crate::Bench;
use crate::cluster::{CALC_STUB, View};
use crate::daemon::Vxmgrd;
use crate::iproute::{Routing, Scripts};
use crate::netns::Netns;
use crate::report::{Table, median, missing, ratio, secs};
use crate::stream::replay;

/// One way of building the state: the median of its runs.
struct Build {
    time: Duration,
    /// Routes of protocol 80 in the kernel afterwards (the fewest of any run).
    routes: usize,
    /// vxmgrd's verdict: whether every batch status of every run was OK.
    all_ok: Option<bool>,
}

impl Build {
    /// The median run's time; the fewest routes and the worst verdict.
    fn of_runs(runs: &[Build]) -> Build {
        let times: Vec<Duration> = runs.iter().map(|b| b.time).collect();
        Build {
            time: median(&times),
            routes: runs.iter().map(|b| b.routes).min().unwrap_or(0),
            all_ok: (runs.iter())
                .map(|b| b.all_ok)
                .reduce(|a, b| a.zip(b).map(|(a, b)| a && b))
                .flatten(),
        }
    }
}

/// Runs each of `builds` `runs` times, taking turns (so that a slow spell of
/// the machine falls on all of them alike), and gives each one's median.
fn medians<const N: usize>(
    runs: u32,
    builds: [&mut dyn FnMut() -> Result<Build>; N],
) -> Result<[Build; N]> {
    let mut builds = builds;
    let mut taken: [Vec<Build>; N] = std::array::from_fn(|_| Vec::new());
    for _ in 0..runs.max(1) {
        for (build, taken) in builds.iter_mut().zip(&mut taken) {
            taken.push(build()?);
        }
    }
    Ok(taken.map(|runs| Build::of_runs(&runs)))
}

/// One size's builds; the inline ones unless skipped.
struct Row {
    nodes: u32,
    vxmgr: Build,
    /// `calc-stub replay` of the JSON lines file, and of the Felix-framed one.
    jsonl: Build,
    framed: Build,
    vxmgr_inline: Option<Build>,
    ip_nexthop: Build,
    ip_inline: Option<Build>,
}

pub fn run(bench: &Bench) -> Result<()> {
    let mut table = Table::new(
        format!(
            "cold: from nothing to node-0's view of N nodes × 4 blocks (seconds, median of {} runs)",
            bench.settings.cold_runs
        ),
        &[
            "nodes",
            "routes",
            "vxmgr",
            "jsonl",
            "framed",
            "ip nexthop",
            "vxmgr/ip",
            "jsonl/ip",
            "framed/ip",
            "vxmgr inline",
            "ip inline",
            "inline/ip inline",
            "statuses",
        ],
    );
    let scripts = tempfile::tempdir()?;
    for &nodes in &bench.settings.sizes {
        let row = measure(bench, nodes, scripts.path())?;
        row.warn_if_different();
        table.row(row.cells());
    }
    table.print();
    println!(
        "  vxmgr: first message sent in-process → status covering InSync (default flags); \
         vxmgr inline: the same with --nexthop-objects off.\n  \
         jsonl, framed: `calc-stub replay` of a .jsonl / Felix-framed file started → \
         it prints the status covering InSync (default flags).\n  \
         ip (nexthop): ip -batch + bridge -batch + ipset restore, with nexthop objects \
         (ip inline: inline gateways); ratios against ip nexthop."
    );
    Ok(())
}

/// The figures the growth scenario plots for one size.
pub struct Figures {
    pub jsonl: Duration,
    pub framed: Duration,
    pub ip: Duration,
}

/// The builds growth plots, each the median of `--cold-runs`: the calc-stub
/// binary replaying each file, and ip with nexthop objects.
pub fn figures(bench: &Bench, nodes: u32, scripts: &Path) -> Result<Figures> {
    let messages = bench.clusters.messages(nodes)?;
    let view = View::of(&messages)?;
    let total = messages.len() as u64;
    drop(messages);
    let replay = |format| -> Result<Build> {
        let build = calc_stub_build(&bench.clusters.file(nodes, format)?, total)?;
        ensure!(
            build.all_ok == Some(true),
            "{nodes} nodes, {format:?}: not every status was OK"
        );
        Ok(build)
    };
    let [jsonl, framed, ip] = medians(
        bench.settings.cold_runs,
        [
            &mut || replay(ReplayFormat::Jsonl),
            &mut || replay(ReplayFormat::Framed),
            &mut || iproute_build(scripts, &view, Routing::Nexthops),
        ],
    )?;
    Ok(Figures {
        jsonl: jsonl.time,
        framed: framed.time,
        ip: ip.time,
    })
}

/// Every build of one size, each run in a fresh namespace.
fn measure(bench: &Bench, nodes: u32, scripts: &Path) -> Result<Row> {
    let messages = bench.clusters.messages(nodes)?;
    let view = View::of(&messages)?;
    let build = |what: &str, result: Result<Build>| {
        if let Ok(b) = &result {
            eprintln!("cold: {nodes} nodes: {what} {}", secs(b.time));
        }
        result
    };
    let total = messages.len() as u64;
    let replay =
        |format| -> Result<Build> { calc_stub_build(&bench.clusters.file(nodes, format)?, total) };
    let runs = bench.settings.cold_runs;
    let [vxmgr, jsonl, framed, ip_nexthop] = medians(
        runs,
        [
            &mut || build("vxmgr", vxmgrd_build(bench, messages.clone(), &[])),
            &mut || build("calc-stub jsonl", replay(ReplayFormat::Jsonl)),
            &mut || build("calc-stub framed", replay(ReplayFormat::Framed)),
            &mut || {
                let ip = iproute_build(scripts, &view, Routing::Nexthops);
                build("ip nexthop", ip)
            },
        ],
    )?;
    let (vxmgr_inline, ip_inline) = if bench.settings.inline {
        let off = ["--nexthop-objects", "off"];
        let [vxmgr, ip] = medians(
            runs,
            [
                &mut || build("vxmgr inline", vxmgrd_build(bench, messages.clone(), &off)),
                &mut || build("ip inline", iproute_build(scripts, &view, Routing::Inline)),
            ],
        )?;
        (Some(vxmgr), Some(ip))
    } else {
        (None, None)
    };
    Ok(Row {
        nodes,
        vxmgr,
        jsonl,
        framed,
        vxmgr_inline,
        ip_nexthop,
        ip_inline,
    })
}

impl Row {
    fn cells(&self) -> Vec<String> {
        let time = |b: &Option<Build>| b.as_ref().map_or_else(skipped, |b| secs(b.time));
        let all_ok = [
            Some(&self.vxmgr),
            Some(&self.jsonl),
            Some(&self.framed),
            self.vxmgr_inline.as_ref(),
        ]
        .into_iter()
        .flatten()
        .all(|b| b.all_ok == Some(true));
        let inline = self.vxmgr_inline.as_ref().zip(self.ip_inline.as_ref());
        let against_ip = |b: &Build| ratio(b.time, self.ip_nexthop.time);
        vec![
            self.nodes.to_string(),
            self.ip_nexthop.routes.to_string(),
            secs(self.vxmgr.time),
            secs(self.jsonl.time),
            secs(self.framed.time),
            secs(self.ip_nexthop.time),
            against_ip(&self.vxmgr),
            against_ip(&self.jsonl),
            against_ip(&self.framed),
            time(&self.vxmgr_inline),
            time(&self.ip_inline),
            inline.map_or_else(skipped, |(v, ip)| ratio(v.time, ip.time)),
            if all_ok { "all OK" } else { "NOT all OK" }.into(),
        ]
    }

    /// The comparison is only fair when every build made the same routes.
    fn warn_if_different(&self) {
        let builds = [
            ("vxmgr", Some(&self.vxmgr)),
            ("calc-stub jsonl", Some(&self.jsonl)),
            ("calc-stub framed", Some(&self.framed)),
            ("vxmgr inline", self.vxmgr_inline.as_ref()),
            ("ip inline", self.ip_inline.as_ref()),
        ];
        for (what, build) in builds {
            if let Some(b) = build.filter(|b| b.routes != self.ip_nexthop.routes) {
                eprintln!(
                    "cold: {} nodes: WARNING {what} made {} routes, ip nexthop {}",
                    self.nodes, b.routes, self.ip_nexthop.routes
                );
            }
        }
    }
}

fn skipped() -> String {
    missing("skipped")
}

/// vxmgrd in a fresh namespace: the time from the first message sent to
/// the status covering InSync.
fn vxmgrd_build(bench: &Bench, messages: Vec<ToDataplane>, extra: &[&str]) -> Result<Build> {
    let netns = Netns::with_underlay()?;
    let daemon = Vxmgrd::netlink(&netns, extra)?;
    let delivery = bench.runtime.block_on(replay(&daemon.socket(), messages))?;
    Ok(Build {
        time: delivery.covered,
        routes: kernel_routes(&netns)?,
        all_ok: Some(delivery.all_ok()),
    })
}

/// vxmgrd's log lines shown when a replay fails.
const LOG_TAIL: usize = 20;
/// How long vxmgrd is watched after a replay fails, before it is stopped.
const DAEMON_GRACE: Duration = Duration::from_secs(3);

/// vxmgrd in a fresh namespace fed by `calc-stub replay FILE`: the time
/// from spawning calc-stub to its printing the status whose cumulative
/// message count covers all `total` messages.
fn calc_stub_build(file: &Path, total: u64) -> Result<Build> {
    let netns = Netns::with_underlay()?;
    let mut daemon = Vxmgrd::netlink(&netns, &[])?;
    let mut stderr = tempfile::tempfile()?;
    let started = Instant::now();
    let mut child = Command::new(CALC_STUB)
        .arg("replay")
        .arg("--socket")
        .arg(daemon.socket())
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr.try_clone()?)
        .spawn()
        .with_context(|| format!("starting {CALC_STUB}"))?;
    let stdout = child.stdout.take().context("calc-stub's stdout")?;
    let covered = covering_status(stdout, total, started);
    if covered.is_err() {
        let _ = child.kill();
    }
    let exit = child.wait()?;
    let (time, all_ok) = match covered {
        Ok(covered) => covered,
        Err(e) => {
            let mut said = String::new();
            let _ = stderr.rewind();
            let _ = stderr.read_to_string(&mut said);
            // What vxmgrd logs, or whether it exits, just after the client
            // failed is read before it is stopped.
            let state = daemon.state_after(DAEMON_GRACE);
            let log = daemon.log();
            let tail: Vec<&str> = log.lines().rev().take(LOG_TAIL).collect();
            return Err(e.context(format!(
                "calc-stub replay {} ({exit}): {}\n{state}; its last log lines:\n{}",
                file.display(),
                said.trim(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )));
        }
    };
    Ok(Build {
        time,
        routes: kernel_routes(&netns)?,
        all_ok: Some(all_ok && exit.success()),
    })
}

/// Reads calc-stub's statuses (one JSON BatchStatus a line) until they
/// cover `total` messages: the time since `started`, and whether every
/// status was OK.
fn covering_status(stdout: impl Read, total: u64, started: Instant) -> Result<(Duration, bool)> {
    let mut covered = 0;
    let mut all_ok = true;
    for line in BufReader::new(stdout).lines() {
        let status: serde_json::Value = serde_json::from_str(&line?)?;
        covered += status["messageCount"].as_u64().unwrap_or(0);
        all_ok &= status["result"] == "BATCH_RESULT_OK";
        if covered >= total {
            return Ok((started.elapsed(), all_ok));
        }
    }
    bail!("its statuses covered {covered} of {total} messages")
}

/// The same end state with iproute2 in a fresh namespace.
fn iproute_build(scripts: &Path, view: &View, routing: Routing) -> Result<Build> {
    let scripts = Scripts::write(scripts, view, routing)?;
    let netns = Netns::with_underlay()?;
    let time = scripts.run(&netns)?;
    Ok(Build {
        time,
        routes: kernel_routes(&netns)?,
        all_ok: None,
    })
}

fn kernel_routes(netns: &Netns) -> Result<usize> {
    let output = netns.ip(&["route", "show", "proto", "80"])?;
    Ok(output
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count())
}

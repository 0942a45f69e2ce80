//! The crash loop: vxmgrd on node-1 of a cluster, beside the host's own
//! objects (see `host`), SIGKILLed at random moments while it programs a
//! generated world and changes it: a cold start, nodes joining, moving
//! their VTEP and leaving, a periodic resync, IP pools with and without
//! NAT, a VNI change, a reconnect that declares nothing. After each kill a
//! new vxmgrd is given the view the calc side holds then, and must report
//! DataplaneInSync. The kernel must then come to hold what an uninterrupted
//! run holds for that view (the time that takes after DataplaneInSync is
//! measured), the host's objects must be as they were, and no route or
//! nexthop that was already right at the kill may be deleted or replaced
//! on the way. The kill points come from a seed, printed and settable
//! (`VXMGR_CRASH_SEED`), so that a failure replays.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::churn::{self, GENERATED_LOCAL, config, generate, message};
use super::stream::Session;
use super::{Census, Cluster, Monitor, host, try_in};
use vxmgr::model::Family;
use vxmgr::wire::felix::{
    InSync, IpamPool, IpamPoolRemove, IpamPoolUpdate, ToDataplane, to_dataplane::Payload,
};

/// The variable that sets the seed of the kill points.
pub const SEED_VARIABLE: &str = "VXMGR_CRASH_SEED";

/// vxmgrd's periodic resync, short so that kills land in it.
const REFRESH_SECONDS: &str = "2";
const REFRESH: Duration = Duration::from_secs(2);

/// How long the kernel may take to match after DataplaneInSync before the
/// loop fails (the time it took is measured, not judged, below this).
const CONVERGENCE_DEADLINE: Duration = Duration::from_secs(60);

/// The VNI of the world, and the one a VNI change moves it to.
const VNI: u32 = 4096;
const OTHER_VNI: u32 = 4097;

/// The generated world's pools (`calc-stub generate` puts every block in
/// them).
const POOLS: [(&str, &str); 2] = [("pool-ipv4", "10.0.0.0/8"), ("pool-ipv6", "fd00:244::/48")];

/// What a crash loop does.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Nodes of the world (× 4 blocks, both families).
    pub nodes: u32,
    /// Nodes that join, and VTEPs that move, at once.
    pub joiners: u32,
    pub kills: u32,
    pub seed: u64,
}

/// The seed from `VXMGR_CRASH_SEED`, or a fresh one.
pub fn seed() -> Result<u64> {
    match std::env::var(SEED_VARIABLE) {
        Ok(text) => text
            .trim()
            .parse()
            .with_context(|| format!("{SEED_VARIABLE}={text:?} is not a number")),
        Err(_) => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64),
    }
}

/// The calc side's view, one of a few.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum View {
    /// Config and InSync only.
    Empty,
    Base,
    Joined,
    Moved,
    PoolsNat,
    PoolsPlain,
    OtherVni,
}

/// What the loop does between kills, in a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// A fresh vxmgrd, no device, the whole world.
    ColdStart,
    Join,
    Move,
    /// Nothing sent: vxmgrd's periodic resync.
    Resync,
    MoveBack,
    Leave,
    PoolsNat,
    PoolsPlain,
    PoolsRemoved,
    /// A reconnect whose config has another VNI: the device is recreated.
    VniChange,
    VniBack,
    /// A reconnect that declares nothing: everything is swept.
    DeclareNothing,
}

const CYCLE: [Step; 12] = [
    Step::ColdStart,
    Step::Join,
    Step::Move,
    Step::Resync,
    Step::MoveBack,
    Step::Leave,
    Step::PoolsNat,
    Step::PoolsPlain,
    Step::PoolsRemoved,
    Step::VniChange,
    Step::VniBack,
    Step::DeclareNothing,
];

impl Step {
    /// The calc side's view after it.
    fn view(self) -> View {
        match self {
            Step::ColdStart | Step::Leave | Step::PoolsRemoved | Step::VniBack => View::Base,
            Step::Join | Step::MoveBack => View::Joined,
            Step::Move | Step::Resync => View::Moved,
            Step::PoolsNat => View::PoolsNat,
            Step::PoolsPlain => View::PoolsPlain,
            Step::VniChange => View::OtherVni,
            Step::DeclareNothing => View::Empty,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// How a step reaches vxmgrd.
enum Action {
    /// More messages on the open stream.
    Send(Vec<ToDataplane>),
    /// A new stream carrying a whole view.
    Reconnect(Vec<ToDataplane>),
    /// A fresh vxmgrd on a kernel without its devices, then a stream
    /// carrying a whole view.
    Cold(Vec<ToDataplane>),
    /// Nothing: vxmgrd works on its own.
    Wait,
}

/// Where the kernel was when vxmgrd died.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Progress {
    /// As the step found it.
    Untouched,
    MidWay,
    /// As the step leaves it.
    Complete,
}

/// One kill and the restart after it.
#[derive(Clone, Debug)]
pub struct Kill {
    pub step: Step,
    /// From the step's start to the SIGKILL.
    pub delay: Duration,
    pub progress: Progress,
    /// Routes and nexthops already right at the kill (none of them may
    /// change).
    pub right: usize,
    /// From DataplaneInSync until the last change `ip monitor` reported to
    /// vxmgr's routes, nexthops and neighbours before the kernel was seen
    /// to match (zero when there was none).
    pub convergence: Duration,
    /// What that change was.
    pub last_change: Option<String>,
    /// Whether `ip monitor` lost notifications after the kill: a change to
    /// what was right may have gone unseen.
    pub monitor_overran: bool,
}

/// What a crash loop saw.
pub struct Outcome {
    pub seed: u64,
    pub kills: Vec<Kill>,
    /// The longest census of the kernel objects an uninterrupted run left.
    pub census_time: Duration,
}

impl Outcome {
    /// The slowest and the median convergence after DataplaneInSync.
    pub fn convergence(&self) -> (Duration, Duration) {
        let mut times: Vec<Duration> = self.kills.iter().map(|k| k.convergence).collect();
        times.sort();
        (
            times.last().copied().unwrap_or_default(),
            times.get(times.len() / 2).copied().unwrap_or_default(),
        )
    }

    /// Kills per step and where each left the kernel, a line a step.
    pub fn table(&self) -> Vec<String> {
        let mut rows: BTreeMap<Step, [usize; 3]> = BTreeMap::new();
        for kill in &self.kills {
            rows.entry(kill.step).or_default()[kill.progress as usize] += 1;
        }
        let mut lines = vec![format!(
            "{:<16}{:>10}{:>10}{:>10}",
            "step", "untouched", "mid-way", "complete"
        )];
        lines.extend(
            rows.iter()
                .map(|(step, [u, m, c])| format!("{:<16}{u:>10}{m:>10}{c:>10}", step.to_string())),
        );
        lines
    }

    /// The figures, a line each.
    pub fn summary(&self) -> Vec<String> {
        let (slowest, median) = self.convergence();
        let right: usize = self.kills.iter().map(|k| k.right).sum();
        vec![
            format!("kills: {}, seed: {}", self.kills.len(), self.seed),
            format!(
                "convergence after DataplaneInSync: slowest {:.0} ms, median {:.0} ms (a census of the kernel takes up to {:.0} ms)",
                ms(slowest),
                ms(median),
                ms(self.census_time)
            ),
            format!(
                "routes and nexthops right at a kill, then deleted or replaced: 0 (of {right} watched over all restarts)"
            ),
        ]
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// splitmix64: enough randomness for kill points, and the same sequence
/// for the same seed everywhere.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A duration from zero to `max`.
    fn up_to(&mut self, max: Duration) -> Duration {
        max.mul_f64((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// The world's messages, cut into what the views and steps are made of.
struct World {
    /// The first `nodes` nodes' VTEPs and routes.
    base: Vec<ToDataplane>,
    /// The other nodes' VTEPs and routes.
    joiners: Vec<ToDataplane>,
    leaves: Vec<ToDataplane>,
    moves: Vec<ToDataplane>,
    moves_back: Vec<ToDataplane>,
}

impl World {
    fn generate(calc_stub: &Path, dir: &Path, settings: &Settings) -> Result<World> {
        let world = generate(
            calc_stub,
            &dir.join("crashloop-world.bin"),
            settings.nodes + settings.joiners,
            4,
            GENERATED_LOCAL,
            true,
        )?;
        let (snapshot, joining) = churn::split(world, settings.nodes);
        let moves = churn::vtep_changes(&snapshot, GENERATED_LOCAL, joining.len())?;
        let moves_back = churn::originals(&snapshot, &moves)?;
        let mut leaves = Vec::new();
        for joiner in &joining {
            leaves.extend(churn::leave(joiner)?);
        }
        Ok(World {
            base: churn::topology(snapshot),
            joiners: churn::topology(joining.concat()),
            leaves,
            moves,
            moves_back,
        })
    }

    /// The whole view, as a new stream carries it.
    fn view(&self, view: View) -> Vec<ToDataplane> {
        let vni = if view == View::OtherVni {
            OTHER_VNI
        } else {
            VNI
        };
        let mut messages = vec![config(vni)];
        if view != View::Empty {
            // Each node's VTEP as the view has it, once: a calc side sends
            // what holds, not its history.
            let moved = |m: &ToDataplane| match &m.payload {
                Some(Payload::VtepUpdate(v)) if view == View::Moved => self.moves.iter().find(
                    |c| matches!(&c.payload, Some(Payload::VtepUpdate(w)) if w.node == v.node),
                ),
                _ => None,
            };
            messages.extend(self.base.iter().map(|m| moved(m).unwrap_or(m).clone()));
        }
        match view {
            View::Joined | View::Moved => messages.extend(self.joiners.iter().cloned()),
            View::PoolsNat => messages.extend(pools(true)),
            View::PoolsPlain => messages.extend(pools(false)),
            View::Empty | View::Base | View::OtherVni => {}
        }
        messages.push(message(Payload::InSync(InSync {})));
        messages
    }

    fn action(&self, step: Step) -> Action {
        let to = step.view();
        match step {
            Step::ColdStart => Action::Cold(self.view(to)),
            Step::Join => Action::Send(self.joiners.clone()),
            Step::Move => Action::Send(self.moves.clone()),
            Step::Resync => Action::Wait,
            Step::MoveBack => Action::Send(self.moves_back.clone()),
            Step::Leave => Action::Send(self.leaves.clone()),
            Step::PoolsNat => Action::Send(pools(true)),
            Step::PoolsPlain => Action::Send(pools(false)),
            Step::PoolsRemoved => Action::Send(
                POOLS
                    .iter()
                    .map(|(id, _)| {
                        message(Payload::IpamPoolRemove(IpamPoolRemove {
                            id: id.to_string(),
                        }))
                    })
                    .collect(),
            ),
            Step::VniChange | Step::VniBack | Step::DeclareNothing => {
                Action::Reconnect(self.view(to))
            }
        }
    }
}

fn pools(masquerade: bool) -> Vec<ToDataplane> {
    POOLS
        .iter()
        .map(|(id, cidr)| {
            message(Payload::IpamPoolUpdate(IpamPoolUpdate {
                id: id.to_string(),
                pool: Some(IpamPool {
                    cidr: cidr.to_string(),
                    masquerade,
                    vxlan_mode: "Always".into(),
                    ..Default::default()
                }),
            }))
        })
        .collect()
}

/// The routes and nexthops right at a kill: those the target state holds
/// as the kernel held them, keyed as `ip monitor` names them (a route by
/// its destination, a nexthop by `gateway dev device`). Objects on a
/// device the target state has otherwise are left out: recreating the
/// device takes them with it.
struct Right {
    routes: BTreeSet<String>,
    nexthops: BTreeSet<String>,
}

impl Right {
    fn of(at_kill: &Census, target: &Census) -> Right {
        let mut right = Right {
            routes: BTreeSet::new(),
            nexthops: BTreeSet::new(),
        };
        for family in Family::ALL {
            let (now, want) = (at_kill.family(family), target.family(family));
            let recreated = now.device != want.device;
            let on_recreated = |d: &String| {
                recreated
                    && d.split_whitespace()
                        .collect::<Vec<_>>()
                        .windows(2)
                        .any(|w| w == ["dev", family.device_name()])
            };
            let kept = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> Vec<String> {
                a.intersection(b)
                    .filter(|d| !on_recreated(d))
                    .cloned()
                    .collect()
            };
            right
                .routes
                .extend(kept(&now.routes, &want.routes).iter().map(|d| route_key(d)));
            right.nexthops.extend(kept(&now.nexthops, &want.nexthops));
        }
        right
    }

    fn len(&self) -> usize {
        self.routes.len() + self.nexthops.len()
    }

    /// Whether an `ip monitor` line reports a change to one of them.
    fn touched_by(&self, line: &str) -> bool {
        let line = line.strip_prefix("Deleted ").unwrap_or(line);
        if !line.contains(" proto 80") {
            return false;
        }
        if line.starts_with("id ") {
            return nexthop_key(line).is_some_and(|k| self.nexthops.contains(&k));
        }
        self.routes.contains(&route_key(line))
    }
}

/// Waits until namespace `ns` holds `target`, reading it again and again
/// for at most `CONVERGENCE_DEADLINE` from `in_sync`.
fn converged(ns: &str, target: &Census, in_sync: Instant) -> Result<()> {
    loop {
        let census = Census::of(ns)?;
        if census == *target {
            return Ok(());
        }
        if in_sync.elapsed() > CONVERGENCE_DEADLINE {
            bail!(
                "{CONVERGENCE_DEADLINE:?} after DataplaneInSync the kernel still differs from an uninterrupted run's (first: uninterrupted, second: now):\n{}",
                target.differences(&census).join("\n")
            );
        }
    }
}

/// Whether an `ip monitor` line is about vxmgr's objects: its routes and
/// nexthops, and the permanent entries on its devices (not the kernel's
/// own multicast ones).
fn ours(line: &str) -> bool {
    line.contains(" proto 80")
        || line.contains(" PERMANENT")
            && Family::ALL
                .iter()
                .any(|f| line.contains(&format!("dev {} ", f.device_name())))
}

/// A route's destination, from its census description or an `ip monitor`
/// line.
fn route_key(description: &str) -> String {
    let mut words = description.split_whitespace();
    let first = words.next().unwrap_or_default();
    match first {
        "blackhole" | "unreachable" | "prohibit" | "local" | "broadcast" | "anycast"
        | "multicast" => words.next().unwrap_or_default().to_string(),
        _ => first.to_string(),
    }
}

/// `gateway dev device` of an `ip monitor` nexthop line, as the census
/// describes nexthops.
fn nexthop_key(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| {
        let at = words.iter().position(|w| *w == key)?;
        words.get(at + 1).copied()
    };
    Some(format!("{} dev {}", after("via")?, after("dev")?))
}

/// The loop's state: the cluster's node-1, its stream, what it compares
/// against.
struct Loop<'a> {
    cluster: &'a mut Cluster,
    ns: String,
    world: World,
    /// The kernel after each step of an uninterrupted run.
    reference: BTreeMap<Step, Census>,
    /// How long each step takes uninterrupted: kills land within it.
    durations: BTreeMap<Step, Duration>,
    host: BTreeSet<String>,
    /// The longest census of the reference states.
    census_time: Duration,
    session: Option<Session>,
    runtime: &'a tokio::runtime::Runtime,
}

const FLAGS: [&str; 2] = ["--route-refresh-interval", REFRESH_SECONDS];

/// Runs the loop on node-1 of `cluster` (one node whose eth0 also holds
/// its generated underlay addresses, see `churn::GENERATED_UNDERLAY`):
/// the host's objects, an uninterrupted run through every step for the
/// reference states, then `settings.kills` kills. `say` hears how it goes.
pub fn run(
    cluster: &mut Cluster,
    calc_stub: &Path,
    settings: Settings,
    mut say: impl FnMut(&str),
) -> Result<Outcome> {
    let ns = cluster.node(1).ns.clone();
    let world = World::generate(calc_stub, &cluster.dir, &settings)?;
    let host = host::install(&ns)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut run = Loop {
        cluster,
        ns,
        world,
        reference: BTreeMap::new(),
        durations: BTreeMap::new(),
        host,
        census_time: Duration::ZERO,
        session: None,
        runtime: &runtime,
    };
    run.uninterrupted()?;
    let census_time = run.census_time;
    say(&format!(
        "crash loop: references taken ({} after a cold start); one census takes up to {:.0} ms",
        run.reference[&Step::ColdStart],
        ms(census_time)
    ));
    let mut monitor = Monitor::start(&run.ns, &["nexthop", "neigh"])?;
    let mut random = Random(settings.seed);
    let mut kills = Vec::new();
    let steps = CYCLE.iter().cycle();
    let befores = CYCLE.iter().cycle().skip(CYCLE.len() - 1);
    for (k, (before, step)) in befores.zip(steps).take(settings.kills as usize).enumerate() {
        let kill = run
            .kill_and_restart(*before, *step, &mut random, &mut monitor)
            .with_context(|| {
                format!(
                    "kill {} of {} (a {step}); replay with {SEED_VARIABLE}={}",
                    k + 1,
                    settings.kills,
                    settings.seed
                )
            })?;
        say(&format!(
            "kill {}: {step} after {:.0} ms, {:?}; {} right at the kill; last change {:.0} ms after DataplaneInSync{}{}",
            k + 1,
            ms(kill.delay),
            kill.progress,
            kill.right,
            ms(kill.convergence),
            kill.last_change
                .as_deref()
                .map(|l| format!(" ({})", l.trim()))
                .unwrap_or_default(),
            if kill.monitor_overran {
                "; ip monitor lost notifications after the kill (changes may be unseen)"
            } else {
                ""
            }
        ));
        kills.push(kill);
    }
    Ok(Outcome {
        seed: settings.seed,
        kills,
        census_time,
    })
}

impl Loop<'_> {
    /// The cycle twice, uninterrupted: the state each step leaves, and
    /// how long each step takes, from the second time round. (What a step
    /// leaves can depend on what came before it: once pools were declared,
    /// vxmgr's nftables table stays, with empty sets.)
    fn uninterrupted(&mut self) -> Result<()> {
        for round in 0..2 {
            for step in CYCLE {
                let started = Instant::now();
                let action = self.world.action(step);
                let runtime = self.runtime;
                runtime.block_on(self.act(action, None))?;
                if step == Step::Resync {
                    runtime.block_on(async { tokio::time::sleep(REFRESH).await });
                }
                if round == 1 {
                    self.durations.insert(step, started.elapsed());
                    let read = Instant::now();
                    self.reference.insert(step, Census::of(&self.ns)?);
                    self.census_time = self.census_time.max(read.elapsed());
                }
            }
        }
        Ok(())
    }

    /// Does what `action` says; with a `deadline`, gives up waiting for the
    /// daemon's answers then.
    async fn act(&mut self, action: Action, deadline: Option<Instant>) -> Result<()> {
        let work = async {
            match action {
                Action::Send(messages) => {
                    let session = self.session.as_mut().context("no stream open")?;
                    session
                        .send(messages)
                        .await?
                        .ensure_ok("the step's messages")?;
                }
                Action::Reconnect(view) => {
                    self.session = None;
                    self.sync(view).await?;
                }
                Action::Cold(view) => {
                    self.session = None;
                    if self.cluster.node(1).running() {
                        self.cluster.node_mut(1).stop_daemon(libc::SIGTERM)?;
                    }
                    // Gone already before the first cold start.
                    for family in Family::ALL {
                        try_in(&self.ns, &["ip", "link", "del", family.device_name()])?;
                    }
                    self.cluster.node_mut(1).start_daemon(&FLAGS)?;
                    self.sync(view).await?;
                }
                Action::Wait => {}
            }
            Ok(())
        };
        match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), work)
                .await
                .unwrap_or(Ok(())),
            None => work.await,
        }
    }

    /// A new stream carrying `view`; waits for DataplaneInSync.
    async fn sync(&mut self, view: Vec<ToDataplane>) -> Result<()> {
        let mut session = Session::open_after_another(&self.cluster.node(1).socket).await?;
        let delivery = session.send(view).await?;
        delivery.ensure_ok("the view")?;
        self.session = Some(session);
        self.session
            .as_mut()
            .context("the stream just opened")?
            .in_sync()
            .await
    }

    /// Kills vxmgrd at a random moment of `step`, which follows `before`,
    /// and restarts it.
    fn kill_and_restart(
        &mut self,
        before: Step,
        step: Step,
        random: &mut Random,
        monitor: &mut Monitor,
    ) -> Result<Kill> {
        let to = step.view();
        let delay = random.up_to(self.durations[&step]);
        let action = self.world.action(step);
        let deadline = Instant::now() + delay;
        let runtime = self.runtime;
        runtime.block_on(async {
            self.act(action, Some(deadline)).await?;
            tokio::time::sleep_until(deadline.into()).await;
            Ok::<_, anyhow::Error>(())
        })?;
        self.session = None;
        self.cluster.node_mut(1).stop_daemon(libc::SIGKILL)?;

        let at_kill = Census::of(&self.ns)?;
        let target = self.reference[&step].clone();
        let progress = if at_kill == target {
            Progress::Complete
        } else if at_kill == self.reference[&before] {
            Progress::Untouched
        } else {
            Progress::MidWay
        };
        let right = Right::of(&at_kill, &target);
        monitor.sync()?;
        monitor.clear();
        let overruns_before = monitor.overruns;

        self.cluster.node_mut(1).start_daemon(&FLAGS)?;
        let view = self.world.view(to);
        runtime.block_on(self.sync(view))?;
        let in_sync = Instant::now();
        // The host's objects are read beside the census: both after
        // DataplaneInSync.
        let (converged, lost) = std::thread::scope(|scope| {
            let lost = scope.spawn(|| host::lost(&self.ns, &self.host));
            (
                converged(&self.ns, &target, in_sync),
                lost.join().expect("the host's listing does not panic"),
            )
        });
        converged?;
        let lost = lost?;
        ensure!(
            lost.is_empty(),
            "the host lost or saw changed:\n{}",
            lost.join("\n")
        );

        monitor.sync()?;
        // The last change to vxmgr's routes, nexthops or neighbours; the
        // census above saw the rest done by its end.
        let last_change = monitor
            .seen
            .iter()
            .zip(&monitor.seen_at)
            .filter(|(line, _)| ours(line))
            .max_by_key(|(_, at)| **at);
        let convergence = last_change
            .map(|(_, at)| at.saturating_duration_since(in_sync))
            .unwrap_or_default();
        let last_change = last_change.map(|(line, _)| line.clone());
        let touched: Vec<&String> = monitor
            .seen
            .iter()
            .filter(|l| right.touched_by(l))
            .collect();
        ensure!(
            touched.is_empty(),
            "{} changes to routes and nexthops that were right at the kill ({} were):\n{}",
            touched.len(),
            right.len(),
            touched
                .iter()
                .take(20)
                .map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
        Ok(Kill {
            step,
            delay,
            progress,
            right: right.len(),
            convergence,
            last_change,
            monitor_overran: monitor.overruns > overruns_before,
        })
    }
}

//! Desired and actual state of one kind of kernel object, and the plan that
//! takes one to the other. Routes, nexthops, neighbours, FDB entries and
//! ipset members all go through this one piece of code.

use std::fmt;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashSet};

use super::slots::Slots;

use crate::config::DeviceNames;
use crate::desired::{Change, Desired, NexthopKey};
use crate::kernel::KernelError;
use crate::kernel::objects::KernelOp;
use crate::model::Family;
use tracing::{debug, info, warn};

/// Interface indexes and nexthop ids a desired object needs to be rendered
/// into its kernel form.
pub trait RenderContext: Sync {
    /// The family's device, while it exists and is up.
    fn device_index(&self, family: Family) -> Option<u32>;
    /// Whether nothing says the interface is down.
    fn interface_up(&self, index: u32) -> bool;
    /// The id assigned to a nexthop.
    fn nexthop_id(&self, key: &NexthopKey) -> Option<u32>;
    /// The id of a nexthop once it is in the kernel.
    fn programmed_nexthop(&self, key: &NexthopKey) -> Option<u32>;
    fn use_nexthops(&self) -> bool;
}

/// What a resync found of a kind, until it settles.
pub type Found<D> = <<D as Programmable>::Slots as Slots<D>>::Found;

/// How a kind of desired object maps onto the kernel.
pub trait Programmable: Desired {
    type Kernel: Copy + PartialEq + fmt::Debug;
    /// How a table keeps objects of this kind.
    type Slots: Slots<Self>;
    /// The kernel form, or `None` while something it needs is missing.
    fn render(&self, ctx: &dyn RenderContext) -> Option<Self::Kernel>;
    fn replace_op(kernel: &Self::Kernel) -> KernelOp;
    /// Creates the object where vxmgr has none; kinds whose kernel keys
    /// others share (routes, nexthop ids) create so that the kernel refuses
    /// to overwrite another's.
    fn add_op(kernel: &Self::Kernel) -> KernelOp {
        Self::replace_op(kernel)
    }
    fn delete_op(kernel: &Self::Kernel) -> KernelOp;
    /// Objects are programmed in this order; the kernel may be much faster
    /// with some orders than others.
    fn order(_kernel: &Self::Kernel) -> u128 {
        0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Added,
    Changed,
    Removed,
}

/// One planned operation and what it means for the table.
pub struct Planned<D: Programmable> {
    pub key: D::Key,
    pub effect: Effect,
    /// The object added or changed, or the one deleted.
    pub kernel: D::Kernel,
}

impl<D: Programmable> Planned<D> {
    /// The actual state once the operation succeeds.
    pub fn after(&self) -> Option<&D::Kernel> {
        (self.effect != Effect::Removed).then_some(&self.kernel)
    }

    pub fn op(&self) -> KernelOp {
        match self.effect {
            Effect::Added => D::add_op(&self.kernel),
            Effect::Changed => D::replace_op(&self.kernel),
            Effect::Removed => D::delete_op(&self.kernel),
        }
    }
}

/// Planned operations, in the order they are to be applied. The kernel
/// operations are made from them only when they are sent, so that a plan
/// of a hundred thousand routes is held once.
pub struct Plan<D: Programmable> {
    pub entries: Vec<Planned<D>>,
}

impl<D: Programmable> Default for Plan<D> {
    fn default() -> Self {
        Plan {
            entries: Vec::new(),
        }
    }
}

impl<D: Programmable> Plan<D> {
    pub fn push(&mut self, planned: Planned<D>) {
        self.entries.push(planned);
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn ops(&self) -> impl Iterator<Item = KernelOp> + '_ {
        self.entries.iter().map(Planned::op)
    }

    /// Puts the operations in `Programmable::order`.
    fn sort(&mut self) {
        self.entries.sort_by_key(|p| D::order(&p.kernel));
    }
}

/// A failed object waiting for its retry.
#[derive(Clone, Debug)]
pub struct Failure {
    pub what: String,
    pub error: KernelError,
    pub attempts: u32,
    pub retry_at: Instant,
}

const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// How long to wait before attempt `attempts + 1` of something that failed
/// `attempts` times in a row.
pub(super) fn retry_backoff(attempts: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1 << attempts.saturating_sub(1).min(16))
        .min(MAX_RETRY)
}

/// Repairs of one object, prompted by kernel notifications, that make it
/// contested when they come within the contest window.
const CONTEST_REPAIRS: u32 = 5;
/// The back-off of a contested object, in contest windows: from half of
/// one, doubling, up to this many (5 s to 5 min with a 10 s window).
const MAX_CONTEST_BACKOFF_WINDOWS: u32 = 30;

/// Someone else changing one of our objects again and again.
#[derive(Clone, Debug)]
struct Contest {
    repairs: u32,
    since: Instant,
    backoff: Duration,
    /// Not repaired on notifications until then.
    until: Option<Instant>,
}

/// An object vxmgr stopped repairing for a while.
#[derive(Clone, Debug)]
pub struct Contested {
    pub what: String,
    pub repairs: u32,
    pub until: Instant,
}

pub struct Table<D: Programmable> {
    /// What is wanted and what the kernel holds, by key.
    slots: D::Slots,
    /// Keys that may need an add or a change.
    pending: HashSet<D::Key>,
    /// Keys nothing wants that may still be in the kernel.
    stale: HashSet<D::Key>,
    failed: HashMap<D::Key, Failure>,
    /// Keys the kernel refused because their interface is missing or
    /// down: not retried with backoff, but when the links are checked.
    waiting: HashSet<D::Key>,
    contests: HashMap<D::Key, Contest>,
    contest_window: Duration,
    /// The VXLAN devices' names in effect, for descriptions.
    devices: DeviceNames,
}

impl<D: Programmable> Table<D> {
    /// An empty table; more than `CONTEST_REPAIRS` repairs of one object
    /// within `contest_window` make it contested, and it is then left alone
    /// for a time in proportion to the window.
    pub fn new(contest_window: Duration) -> Self {
        Table {
            slots: D::Slots::default(),
            pending: HashSet::default(),
            stale: HashSet::default(),
            failed: HashMap::default(),
            waiting: HashSet::default(),
            contests: HashMap::default(),
            contest_window,
            devices: DeviceNames::default(),
        }
    }

    /// What vxmgr wants for `key`.
    pub fn desired(&self, key: &D::Key) -> Option<D> {
        self.slots.desired(key)
    }

    /// Whether vxmgr wants anything for `key`.
    pub fn is_desired(&self, key: &D::Key) -> bool {
        self.slots.is_desired(key)
    }

    /// What the kernel holds for `key`, as far as vxmgr knows.
    pub fn actual(&self, key: &D::Key) -> Option<D::Kernel> {
        self.slots.actual(key)
    }

    /// Every wanted object.
    pub fn all_desired(&self) -> impl Iterator<Item = (D::Key, D)> {
        self.slots.each_desired().map(|(key, d, _)| (key, d))
    }

    /// Every object of ours the kernel holds.
    pub fn all_actual(&self) -> impl Iterator<Item = D::Kernel> {
        self.slots.each().filter_map(|(_, _, actual)| actual)
    }

    /// Records what the kernel holds for `key` (`None`: nothing) and
    /// returns what it held before.
    pub fn set_actual(&mut self, key: D::Key, kernel: Option<D::Kernel>) -> Option<D::Kernel> {
        self.slots.set_actual(&key, kernel)
    }

    pub fn set_desired(&mut self, change: Change<D>) {
        match change.desired {
            Some(d) => {
                debug_assert_eq!(d.key(), change.key, "a change's key is its object's");
                self.slots.set_desired(&change.key, Some(d));
                self.stale.remove(&change.key);
                self.pending.insert(change.key);
            }
            None => {
                self.slots.set_desired(&change.key, None);
                self.pending.remove(&change.key);
                self.waiting.remove(&change.key);
                self.stale.insert(change.key);
            }
        }
    }

    /// A new stream declares everything again.
    pub fn clear_desired(&mut self) {
        self.slots.clear_desired();
        self.failed.clear();
        self.waiting.clear();
        self.pending.clear();
        self.stale.clear();
    }

    /// Takes what a dump found as the actual state: what differs from the
    /// desired state (or cannot be rendered yet) becomes pending, and is
    /// returned; what nothing wants becomes stale. Comparing here, rather than marking every key
    /// pending, keeps a resync without drift from touching the pending set.
    pub fn reset_actual(
        &mut self,
        actual: impl IntoIterator<Item = (D::Key, D::Kernel)>,
        ctx: &dyn RenderContext,
    ) -> Vec<D::Key> {
        let found = self.find_actual(actual);
        self.settle_actual(found, ctx)
    }

    /// The first half of [`Table::reset_actual`], which needs no context:
    /// it can run while what renders this kind is still being taken in.
    pub fn find_actual(
        &mut self,
        actual: impl IntoIterator<Item = (D::Key, D::Kernel)>,
    ) -> Found<D> {
        self.slots.find_actual(actual)
    }

    /// The second half of [`Table::reset_actual`]. Returns the keys that
    /// became pending.
    pub fn settle_actual(&mut self, found: Found<D>, ctx: &dyn RenderContext) -> Vec<D::Key> {
        let wrong = self.slots.settle(found, |desired| desired.render(ctx));
        self.pending.extend(wrong.iter().cloned());
        self.mark_stale();
        wrong
    }

    /// Marks for deletion everything in the kernel that nothing wants.
    pub fn mark_stale(&mut self) {
        let unwanted = self.slots.each().filter(|(_, desired, _)| !desired);
        self.stale.extend(unwanted.map(|(key, _, _)| key));
    }

    /// Marks every wanted object for a re-check (its device came back).
    pub fn mark_all_pending(&mut self) {
        let wanted = self.slots.each().filter(|(_, desired, _)| *desired);
        self.pending.extend(wanted.map(|(key, _, _)| key));
    }

    /// The kernel removed these objects by itself (their device or nexthop went).
    pub fn forget_actual(&mut self, gone: impl Fn(&D::Kernel) -> bool) {
        let keys: Vec<D::Key> = (self.slots.each())
            .filter(|(_, _, actual)| actual.as_ref().is_some_and(&gone))
            .map(|(key, _, _)| key)
            .collect();
        for key in keys {
            self.forget_one(key);
        }
    }

    /// [`Table::forget_actual`] among `keys` only.
    pub fn forget_actual_among(&mut self, keys: &[D::Key], gone: impl Fn(&D::Kernel) -> bool) {
        for key in keys {
            if self.actual(key).is_some_and(|kernel| gone(&kernel)) {
                self.forget_one(key.clone());
            }
        }
    }

    fn forget_one(&mut self, key: D::Key) {
        self.set_actual(key.clone(), None);
        if self.is_desired(&key) {
            self.pending.insert(key);
        }
    }

    /// The kernel reports `key` as `kernel` (`None`: gone). Returns whether
    /// that differs from what vxmgr believed, i.e. someone else changed it;
    /// the object is then repaired (or, unwanted, deleted after InSync),
    /// unless it is contested and vxmgr is backing off.
    pub fn observe(&mut self, key: D::Key, kernel: Option<D::Kernel>, now: Instant) -> bool {
        if self.actual(&key) == kernel {
            return false;
        }
        self.set_actual(key.clone(), kernel);
        if !self.is_desired(&key) {
            self.stale.insert(key);
        } else if self.may_repair(&key, now) {
            self.pending.insert(key);
        }
        true
    }

    /// Counts a repair of `key`; false while it is contested.
    fn may_repair(&mut self, key: &D::Key, now: Instant) -> bool {
        let contest = self.contests.entry(key.clone()).or_insert(Contest {
            repairs: 0,
            since: now,
            backoff: Duration::ZERO,
            until: None,
        });
        if contest.until.is_some_and(|until| now < until) {
            return false;
        }
        if now.duration_since(contest.since) > self.contest_window {
            contest.repairs = 0;
            contest.since = now;
            contest.until = None;
        }
        contest.repairs += 1;
        if contest.repairs <= CONTEST_REPAIRS {
            return true;
        }
        let window = self.contest_window;
        contest.backoff = (contest.backoff.saturating_mul(2)).clamp(
            window / 2,
            window.saturating_mul(MAX_CONTEST_BACKOFF_WINDOWS),
        );
        contest.until = Some(now + contest.backoff);
        let (repairs, backoff) = (contest.repairs, contest.backoff);
        let what = self.describe_key(key);
        warn!(
            object = %what,
            repairs,
            backoff_s = backoff.as_secs(),
            "another agent keeps changing an object vxmgr owns; not repairing it for a while"
        );
        false
    }

    /// Objects vxmgr is not repairing because someone keeps changing them.
    pub fn contested(&self, now: Instant) -> Vec<Contested> {
        self.contests
            .iter()
            .filter_map(|(key, c)| {
                let until = c.until.filter(|until| now < *until)?;
                Some(Contested {
                    what: self.describe_key(key),
                    repairs: c.repairs,
                    until,
                })
            })
            .collect()
    }

    /// Forgets repairs counted before the window: uncontested objects.
    pub fn expire_contests(&mut self, now: Instant) {
        let window = self.contest_window;
        self.contests.retain(|_, c| {
            c.until.is_some_and(|until| now < until) || now.duration_since(c.since) <= window
        });
    }

    fn describe_key(&self, key: &D::Key) -> String {
        match self.desired(key) {
            Some(d) => d.describe(&self.devices),
            None => D::describe_key(key, &self.devices),
        }
    }

    /// Objects whose retry time has come, and contested objects whose
    /// back-off has ended, are made right again (the plan leaves alone
    /// those the kernel already has right).
    pub fn retry_due(&mut self, now: Instant) {
        let failed = self
            .failed
            .iter()
            .filter(|(_, f)| f.retry_at <= now)
            .map(|(key, _)| key);
        let backed_off = self
            .contests
            .iter_mut()
            .filter_map(|(key, c)| c.until.take_if(|until| *until <= now).map(|_| key));
        let slots = &self.slots;
        for key in failed.chain(backed_off) {
            if slots.is_desired(key) {
                self.pending.insert(key.clone());
            } else {
                self.stale.insert(key.clone());
            }
        }
    }

    /// When `retry_due` next has something to do.
    pub fn next_retry(&self) -> Option<Instant> {
        let failed = self.failed.values().map(|f| f.retry_at);
        let backed_off = self.contests.values().filter_map(|c| c.until);
        failed.chain(backed_off).min()
    }

    /// `key` is to be made right again now (what stood in its way is gone).
    pub fn recheck(&mut self, key: &D::Key) {
        if self.is_desired(key) {
            self.pending.insert(key.clone());
        }
    }

    /// Objects waiting for their interface are tried again.
    pub fn release_waiting(&mut self) {
        self.pending.extend(self.waiting.iter().cloned());
    }

    pub fn failures(&self) -> impl Iterator<Item = &Failure> {
        self.failed.values()
    }

    /// Whether `key` has nothing desired and nothing in the kernel.
    pub fn is_gone(&self, key: &D::Key) -> bool {
        !self.slots.contains(key)
    }

    /// Adds and changes for pending keys. Keys that cannot be rendered yet
    /// (their device or nexthop is missing) stay pending.
    pub fn plan_upserts(&mut self, ctx: &dyn RenderContext) -> Plan<D> {
        let mut plan = Plan::default();
        let mut waiting = Vec::new();
        for key in std::mem::take(&mut self.pending) {
            let Some(desired) = self.slots.desired(&key) else {
                continue;
            };
            let Some(kernel) = desired.render(ctx) else {
                waiting.push(key);
                continue;
            };
            let effect = match self.slots.actual(&key) {
                Some(a) if a == kernel => {
                    self.settled(&key);
                    continue;
                }
                Some(_) => Effect::Changed,
                None => Effect::Added,
            };
            plan.push(Planned {
                key,
                effect,
                kernel,
            });
        }
        self.pending.extend(waiting);
        plan.sort();
        plan
    }

    /// Deletes for what nothing wants any more. Without `sweep` (before the
    /// stream's InSync) nothing is deleted and the candidates are let go:
    /// the InSync sweep finds them again.
    pub fn plan_deletes(&mut self, sweep: bool) -> Plan<D> {
        let mut plan = Plan::default();
        for key in std::mem::take(&mut self.stale) {
            let unwanted = (sweep && !self.slots.is_desired(&key))
                .then(|| self.slots.actual(&key))
                .flatten();
            match unwanted {
                Some(kernel) => plan.push(Planned {
                    kernel,
                    key,
                    effect: Effect::Removed,
                }),
                None => self.settled(&key),
            }
        }
        plan
    }

    fn settled(&mut self, key: &D::Key) {
        if !self.failed.is_empty() {
            self.failed.remove(key);
        }
        if !self.waiting.is_empty() {
            self.waiting.remove(key);
        }
    }

    /// "adding route 10.0.1.0/26 via ...", for errors and logs.
    pub fn describe(&self, planned: &Planned<D>) -> String {
        match (planned.effect, self.desired(&planned.key)) {
            (Effect::Added, Some(d)) => format!("adding {}", d.describe(&self.devices)),
            (Effect::Changed, Some(d)) => format!("replacing {}", d.describe(&self.devices)),
            _ => format!("deleting {}", D::describe_key(&planned.key, &self.devices)),
        }
    }

    /// Records the outcome of a planned operation.
    pub fn record(&mut self, planned: Planned<D>, result: Result<(), KernelError>, now: Instant) {
        match result {
            Ok(()) => {
                self.settled(&planned.key);
                let after = (planned.effect != Effect::Removed).then_some(planned.kernel);
                self.set_actual(planned.key, after);
            }
            Err(error) if error.is_missing_device() && planned.after().is_some() => {
                let what = self.describe(&planned);
                self.failed.remove(&planned.key);
                if self.waiting.insert(planned.key) {
                    info!(object = %what, %error, "waiting for its interface");
                } else {
                    debug!(object = %what, %error, "still waiting for its interface");
                }
            }
            Err(error) => {
                let attempts = self.failed.get(&planned.key).map_or(0, |f| f.attempts) + 1;
                let backoff = retry_backoff(attempts);
                let what = self.describe(&planned);
                self.failed.insert(
                    planned.key,
                    Failure {
                        what,
                        error,
                        attempts,
                        retry_at: now + backoff,
                    },
                );
            }
        }
    }
}

/// What the reconciler does to every table alike, whatever its kind.
pub trait AnyTable {
    /// The VXLAN devices' names in effect, for descriptions.
    fn set_device_names(&mut self, names: &DeviceNames);
    fn clear_desired(&mut self);
    fn mark_stale(&mut self);
    fn mark_all_pending(&mut self);
    fn retry_due(&mut self, now: Instant);
    fn next_retry(&self) -> Option<Instant>;
    fn release_waiting(&mut self);
    fn failures(&self) -> Vec<&Failure>;
    fn contested(&self, now: Instant) -> Vec<Contested>;
    fn expire_contests(&mut self, now: Instant);
}

impl<D: Programmable> AnyTable for Table<D> {
    fn set_device_names(&mut self, names: &DeviceNames) {
        self.devices = names.clone();
    }

    fn clear_desired(&mut self) {
        Table::clear_desired(self)
    }

    fn mark_stale(&mut self) {
        Table::mark_stale(self)
    }

    fn mark_all_pending(&mut self) {
        Table::mark_all_pending(self)
    }

    fn retry_due(&mut self, now: Instant) {
        Table::retry_due(self, now)
    }

    fn next_retry(&self) -> Option<Instant> {
        Table::next_retry(self)
    }

    fn release_waiting(&mut self) {
        Table::release_waiting(self)
    }

    fn failures(&self) -> Vec<&Failure> {
        Table::failures(self).collect()
    }

    fn contested(&self, now: Instant) -> Vec<Contested> {
        Table::contested(self, now)
    }

    fn expire_contests(&mut self, now: Instant) {
        Table::expire_contests(self, now)
    }
}

//! Desired and actual state of one kind of kernel object, and the plan that
//! takes one to the other. Routes, nexthops, neighbours, FDB entries and
//! ipset members all go through this one piece of code.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::{Duration, Instant};

use crate::desired::{Change, Desired};
use crate::kernel::KernelError;
use crate::kernel::objects::KernelOp;

/// Interface indexes and nexthop ids a desired object needs to be rendered
/// into its kernel form.
pub trait RenderContext {
    fn device_index(&self, family: crate::model::Family) -> Option<u32>;
    /// The id assigned to a node's nexthop.
    fn nexthop_id(&self, key: &crate::desired::NexthopKey) -> Option<u32>;
    /// The id of a node's nexthop once it is in the kernel.
    fn programmed_nexthop(&self, key: &crate::desired::NexthopKey) -> Option<u32>;
    fn use_nexthops(&self) -> bool;
}

/// How a kind of desired object maps onto the kernel.
pub trait Programmable: Desired {
    type Kernel: Clone + PartialEq + fmt::Debug;
    /// The kernel form, or `None` while something it needs is missing.
    fn render(&self, ctx: &dyn RenderContext) -> Option<Self::Kernel>;
    fn replace_op(kernel: &Self::Kernel) -> KernelOp;
    fn delete_op(kernel: &Self::Kernel) -> KernelOp;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Added,
    Changed,
    Removed,
}

/// One kernel operation the table wants, and what it means for the table.
pub struct Planned<D: Programmable> {
    pub key: D::Key,
    pub op: KernelOp,
    pub effect: Effect,
    /// The actual state once the operation succeeds.
    pub after: Option<D::Kernel>,
    /// "adding route 10.0.1.0/26 via ...", for errors and logs.
    pub what: String,
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

pub struct Table<D: Programmable> {
    pub desired: HashMap<D::Key, D>,
    pub actual: HashMap<D::Key, D::Kernel>,
    /// Keys that may need an operation.
    pending: HashSet<D::Key>,
    failed: HashMap<D::Key, Failure>,
}

impl<D: Programmable> Default for Table<D> {
    fn default() -> Self {
        Table {
            desired: HashMap::new(),
            actual: HashMap::new(),
            pending: HashSet::new(),
            failed: HashMap::new(),
        }
    }
}

impl<D: Programmable> Table<D> {
    pub fn set_desired(&mut self, change: Change<D>) {
        match change.desired {
            Some(d) => self.desired.insert(change.key.clone(), d),
            None => self.desired.remove(&change.key),
        };
        self.pending.insert(change.key);
    }

    /// A new stream declares everything again.
    pub fn clear_desired(&mut self) {
        self.desired.clear();
        self.failed.clear();
        self.pending.clear();
    }

    /// Takes what a dump found as the actual state, and re-checks everything.
    pub fn reset_actual(&mut self, actual: impl IntoIterator<Item = (D::Key, D::Kernel)>) {
        self.actual = actual.into_iter().collect();
        self.mark_all_pending();
    }

    pub fn mark_all_pending(&mut self) {
        self.pending.extend(self.desired.keys().cloned());
        self.pending.extend(self.actual.keys().cloned());
    }

    /// The kernel removed these objects by itself (their device or nexthop went).
    pub fn forget_actual(&mut self, gone: impl Fn(&D::Kernel) -> bool) {
        let keys: Vec<D::Key> = self
            .actual
            .iter()
            .filter(|(_, k)| gone(k))
            .map(|(key, _)| key.clone())
            .collect();
        for key in keys {
            self.actual.remove(&key);
            self.pending.insert(key);
        }
    }

    /// Objects whose retry time has come go back to pending.
    pub fn retry_due(&mut self, now: Instant) {
        let due: Vec<D::Key> = self
            .failed
            .iter()
            .filter(|(_, f)| f.retry_at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        self.pending.extend(due);
    }

    pub fn next_retry(&self) -> Option<Instant> {
        self.failed.values().map(|f| f.retry_at).min()
    }

    pub fn failures(&self) -> impl Iterator<Item = &Failure> {
        self.failed.values()
    }

    /// Whether `key` has nothing desired and nothing in the kernel.
    pub fn is_gone(&self, key: &D::Key) -> bool {
        !self.desired.contains_key(key) && !self.actual.contains_key(key)
    }

    /// Adds and changes for pending keys. Keys that cannot be rendered yet
    /// stay pending.
    pub fn plan_upserts(&mut self, ctx: &dyn RenderContext) -> Vec<Planned<D>> {
        let mut planned = Vec::new();
        let mut settled = Vec::new();
        for key in &self.pending {
            let Some(desired) = self.desired.get(key) else {
                continue;
            };
            let Some(kernel) = desired.render(ctx) else {
                continue;
            };
            let (effect, verb) = match self.actual.get(key) {
                Some(a) if *a == kernel => {
                    settled.push(key.clone());
                    continue;
                }
                Some(_) => (Effect::Changed, "replacing"),
                None => (Effect::Added, "adding"),
            };
            planned.push(Planned {
                key: key.clone(),
                op: D::replace_op(&kernel),
                effect,
                after: Some(kernel),
                what: format!("{verb} {desired}"),
            });
        }
        for key in settled {
            self.settled(&key);
        }
        planned
    }

    /// Deletes for pending keys nothing wants any more. Without `sweep`
    /// (before the stream's InSync) nothing is deleted.
    pub fn plan_deletes(&mut self, sweep: bool) -> Vec<Planned<D>> {
        let mut planned = Vec::new();
        let mut settled = Vec::new();
        for key in &self.pending {
            if self.desired.contains_key(key) {
                continue;
            }
            match self.actual.get(key) {
                Some(kernel) if sweep => planned.push(Planned {
                    key: key.clone(),
                    op: D::delete_op(kernel),
                    effect: Effect::Removed,
                    after: None,
                    what: format!("deleting {} {key}", D::KIND),
                }),
                _ => settled.push(key.clone()),
            }
        }
        for key in settled {
            self.settled(&key);
        }
        planned
    }

    fn settled(&mut self, key: &D::Key) {
        self.pending.remove(key);
        self.failed.remove(key);
    }

    /// Records the outcome of a planned operation.
    pub fn record(&mut self, planned: Planned<D>, result: Result<(), KernelError>, now: Instant) {
        match result {
            Ok(()) => {
                match planned.after {
                    Some(k) => self.actual.insert(planned.key.clone(), k),
                    None => self.actual.remove(&planned.key),
                };
                self.settled(&planned.key);
            }
            Err(error) => {
                self.pending.remove(&planned.key);
                let attempts = self.failed.get(&planned.key).map_or(0, |f| f.attempts) + 1;
                let backoff = FIRST_RETRY
                    .saturating_mul(1 << (attempts - 1).min(16))
                    .min(MAX_RETRY);
                self.failed.insert(
                    planned.key,
                    Failure {
                        what: planned.what,
                        error,
                        attempts,
                        retry_at: now + backoff,
                    },
                );
            }
        }
    }
}

//! How a table keeps, for each key, what vxmgr wants and what the kernel
//! holds: one entry for both, in a dense map, each object held without what
//! its key already says. A hundred thousand nodes make half a million
//! routes, so the bytes of one entry are the daemon's memory.

use std::hash::Hash;

use super::table::Programmable;
use crate::dense_map::DenseMap;

/// The storage of one kind's objects, by key. A slot goes once neither a
/// desired object nor a kernel one is left in it.
pub trait Slots<D: Programmable>: Default {
    fn desired(&self, key: &D::Key) -> Option<D>;
    fn is_desired(&self, key: &D::Key) -> bool;
    fn actual(&self, key: &D::Key) -> Option<D::Kernel>;
    /// Whether anything is held for `key`.
    fn contains(&self, key: &D::Key) -> bool;
    fn set_desired(&mut self, key: &D::Key, desired: Option<D>);
    /// Returns what the kernel held before.
    fn set_actual(&mut self, key: &D::Key, actual: Option<D::Kernel>) -> Option<D::Kernel>;
    /// Forgets every desired object.
    fn clear_desired(&mut self);
    /// Which slots a resync found in the kernel, until it settles.
    type Found: Send;
    /// Takes `dumped` as all the kernel holds of this kind, in a resync that
    /// `settle` ends. Slots are updated in place, not emptied and filled
    /// again: a resync without drift writes nothing but what it read.
    fn find_actual(&mut self, dumped: impl IntoIterator<Item = (D::Key, D::Kernel)>)
    -> Self::Found;
    /// Ends a resync: what it did not find is not in the kernel. Returns the
    /// keys of the wanted objects it does not hold as `render` makes them.
    fn settle(
        &mut self,
        found: Self::Found,
        render: impl Fn(&D) -> Option<D::Kernel> + Sync,
    ) -> Vec<D::Key>;
    /// Every slot: its key, whether something is wanted, what the kernel holds.
    fn each(&self) -> impl Iterator<Item = (D::Key, bool, Option<D::Kernel>)>;
    /// Every wanted object, with what the kernel holds for it.
    fn each_desired(&self) -> impl Iterator<Item = (D::Key, D, Option<D::Kernel>)>;
}

/// How objects of one kind are held beside their keys: the parts the key
/// says are left out, and the key itself may be stored in a smaller form.
pub trait Holding {
    type Object: Programmable;
    /// The key as stored.
    type Stored: Hash + Eq + Send + Sync;
    type Held: Send + Sync;
    type HeldKernel: Copy + Send;
    fn store_key(key: &<Self::Object as crate::desired::Desired>::Key) -> Self::Stored;
    fn key(stored: &Self::Stored) -> <Self::Object as crate::desired::Desired>::Key;
    fn hold(object: Self::Object) -> Self::Held;
    /// `hold` then `unhold` gives the object back as it was.
    fn unhold(key: &Self::Stored, held: &Self::Held) -> Self::Object;
    fn hold_kernel(kernel: <Self::Object as Programmable>::Kernel) -> Self::HeldKernel;
    fn unhold_kernel(
        key: &Self::Stored,
        held: Self::HeldKernel,
    ) -> <Self::Object as Programmable>::Kernel;
}

/// What is wanted of one key and what the kernel holds of it.
struct Slot<H, K> {
    desired: Option<H>,
    actual: Option<K>,
}

impl<H, K> Default for Slot<H, K> {
    fn default() -> Self {
        Slot {
            desired: None,
            actual: None,
        }
    }
}

/// Tables from this many slots settle on several threads.
const PARALLEL_FROM: usize = 1 << 15;

/// Threads one table settles on at most.
const MAX_THREADS: usize = 4;

/// What a resync found of one table in the kernel.
#[derive(Default)]
pub struct Found {
    /// By slot position.
    seen: Vec<bool>,
    /// The slots in the order the dump gave them.
    order: Vec<u32>,
    /// Slots that were not where the one before left off.
    out_of_order: usize,
}

impl Found {
    /// The kernel dumps a table in the same order every time while it is
    /// unchanged; slots kept in that order are found one after another,
    /// without hashing a key (half a million routes: a hash lookup costs a
    /// resync more than the kernel's dump of the route).
    fn next_guess(&self) -> usize {
        self.order.last().map_or(0, |&at| at as usize + 1)
    }

    fn mark(&mut self, at: usize, guessed: bool) {
        if self.seen.len() <= at {
            self.seen.resize(at + 1, false);
        }
        // A key the dump gave twice (two routes to one destination) keeps
        // its first place.
        if !std::mem::replace(&mut self.seen[at], true) {
            self.order.push(at as u32);
            self.out_of_order += usize::from(!guessed);
        }
    }

    fn has(&self, at: usize) -> bool {
        self.seen.get(at).copied().unwrap_or(false)
    }

    /// Whether the slots should be put in the dump's order: enough of them
    /// were out of it to be worth a reordering, which costs about as much
    /// as a resync of out-of-order slots.
    fn worth_reordering(&self) -> bool {
        self.out_of_order * 8 > self.order.len()
    }
}

/// Slots of one holding in one dense map.
pub struct HeldSlots<H: Holding> {
    map: DenseMap<H::Stored, Slot<H::Held, H::HeldKernel>>,
}

impl<H: Holding> Default for HeldSlots<H> {
    fn default() -> Self {
        HeldSlots {
            map: DenseMap::default(),
        }
    }
}

type Key<H> = <<H as Holding>::Object as crate::desired::Desired>::Key;
type Kernel<H> = <<H as Holding>::Object as Programmable>::Kernel;

impl<H: Holding> HeldSlots<H> {
    pub fn desired(&self, key: &Key<H>) -> Option<H::Object> {
        let stored = H::store_key(key);
        let held = self.map.get(&stored)?.desired.as_ref()?;
        Some(H::unhold(&stored, held))
    }

    pub fn is_desired(&self, key: &Key<H>) -> bool {
        (self.map.get(&H::store_key(key))).is_some_and(|slot| slot.desired.is_some())
    }

    pub fn actual(&self, key: &Key<H>) -> Option<Kernel<H>> {
        let stored = H::store_key(key);
        let held = self.map.get(&stored)?.actual?;
        Some(H::unhold_kernel(&stored, held))
    }

    pub fn contains(&self, key: &Key<H>) -> bool {
        self.map.contains_key(&H::store_key(key))
    }

    pub fn set_desired(&mut self, key: &Key<H>, desired: Option<H::Object>) {
        let stored = H::store_key(key);
        match desired {
            Some(d) => {
                self.map.get_or_insert_with(stored, Slot::default).desired = Some(H::hold(d));
            }
            None => {
                if let Some(slot) = self.map.get_mut(&stored) {
                    slot.desired = None;
                    if slot.actual.is_none() {
                        self.map.remove(&stored);
                    }
                }
            }
        }
    }

    pub fn set_actual(&mut self, key: &Key<H>, actual: Option<Kernel<H>>) -> Option<Kernel<H>> {
        let stored = H::store_key(key);
        let old = match actual {
            Some(kernel) => {
                let slot = self
                    .map
                    .get_or_insert_with(H::store_key(key), Slot::default);
                slot.actual.replace(H::hold_kernel(kernel))
            }
            None => {
                let slot = self.map.get_mut(&stored)?;
                let old = slot.actual.take();
                if slot.desired.is_none() {
                    self.map.remove(&stored);
                }
                old
            }
        };
        old.map(|held| H::unhold_kernel(&stored, held))
    }

    pub fn clear_desired(&mut self) {
        self.map.retain(|_, slot| {
            slot.desired = None;
            slot.actual.is_some()
        });
    }

    /// Records that the kernel holds `kernel` for `key`, in a resync that
    /// `settle` ends.
    pub fn found(&mut self, found: &mut Found, key: &Key<H>, kernel: Kernel<H>) {
        let guess = found.next_guess();
        let at = (self.map).position_near_or_insert_with(guess, H::store_key(key), Slot::default);
        self.map.at_mut(at).1.actual = Some(H::hold_kernel(kernel));
        found.mark(at, at == guess);
    }

    /// Ends a resync: what it did not find is not in the kernel. Pushes
    /// onto `wrong` the keys of wanted objects not as `render` makes them.
    /// A large table is walked in runs on several threads: a resync of
    /// half a million routes is otherwise one CPU's work while the others
    /// wait.
    pub fn settle(
        &mut self,
        found: Found,
        render: impl Fn(&H::Object) -> Option<Kernel<H>> + Sync,
        wrong: &mut Vec<Key<H>>,
    ) {
        let threads = if self.map.len() < PARALLEL_FROM {
            1
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS))
        };
        let (found, render) = (&found, &render);
        let settled = std::thread::scope(|scope| {
            let mut runs = self.map.runs_mut(threads);
            let here = runs.next();
            let elsewhere: Vec<_> = runs
                .map(|(start, run)| scope.spawn(move || settle_run::<H>(start, run, found, render)))
                .collect();
            let mut settled: Vec<_> = (here.into_iter())
                .map(|(start, run)| settle_run::<H>(start, run, found, render))
                .collect();
            settled.extend(elsewhere.into_iter().map(|thread| {
                (thread.join()).unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            }));
            settled
        });
        let mut emptied = false;
        for (keys, any_emptied) in settled {
            wrong.extend(keys);
            emptied |= any_emptied;
        }
        if found.worth_reordering() {
            self.map.put_first(&found.order);
        }
        if emptied {
            self.map
                .retain(|_, slot| slot.desired.is_some() || slot.actual.is_some());
        }
    }

    pub fn each(&self) -> impl Iterator<Item = (Key<H>, bool, Option<Kernel<H>>)> {
        self.map.iter().map(|(stored, slot)| {
            let actual = slot.actual.map(|held| H::unhold_kernel(stored, held));
            (H::key(stored), slot.desired.is_some(), actual)
        })
    }

    pub fn each_desired(&self) -> impl Iterator<Item = (Key<H>, H::Object, Option<Kernel<H>>)> {
        self.map.iter().filter_map(|(stored, slot)| {
            let desired = H::unhold(stored, slot.desired.as_ref()?);
            let actual = slot.actual.map(|held| H::unhold_kernel(stored, held));
            Some((H::key(stored), desired, actual))
        })
    }
}

/// Settles the run of slots from position `start`: the keys of wanted
/// objects not as `render` makes them, and whether a slot was emptied.
fn settle_run<'a, H: Holding + 'a>(
    start: usize,
    run: impl Iterator<Item = (&'a H::Stored, &'a mut Slot<H::Held, H::HeldKernel>)>,
    found: &Found,
    render: impl Fn(&H::Object) -> Option<Kernel<H>>,
) -> (Vec<Key<H>>, bool) {
    let mut wrong = Vec::new();
    let mut emptied = false;
    for (at, (stored, slot)) in (start..).zip(run) {
        if !found.has(at) {
            slot.actual = None;
        }
        let Some(held) = &slot.desired else {
            emptied |= slot.actual.is_none();
            continue;
        };
        let actual = slot.actual.map(|held| H::unhold_kernel(stored, held));
        if render(&H::unhold(stored, held)).is_none_or(|kernel| actual != Some(kernel)) {
            wrong.push(H::key(stored));
        }
    }
    (wrong, emptied)
}

//! A hash map whose entries sit side by side in one vector, found through a
//! table of their positions.
//!
//! A hash table holds its entries in a power of two of buckets, so a map of
//! half a million routes lives in 2^20 buckets, half of them empty, every
//! one the size of an entry. Here the buckets hold a 4-byte position, and
//! the entries fill a vector with no gaps: at that size it is half the
//! memory, and a walk over every entry (a resync, a sweep) reads only
//! entries. Removing an entry moves the last one into its place.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use foldhash::fast::RandomState;
use hashbrown::HashTable;

pub struct DenseMap<K, V> {
    /// Positions in `entries`.
    index: HashTable<u32>,
    entries: Vec<(K, V)>,
    hasher: RandomState,
}

impl<K, V> Default for DenseMap<K, V> {
    fn default() -> Self {
        DenseMap {
            index: HashTable::new(),
            entries: Vec::new(),
            hasher: RandomState::default(),
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for DenseMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

impl<K: Clone, V: Clone> Clone for DenseMap<K, V> {
    fn clone(&self) -> Self {
        DenseMap {
            index: self.index.clone(),
            entries: self.entries.clone(),
            hasher: self.hasher.clone(),
        }
    }
}

impl<K, V> DenseMap<K, V> {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in no particular order (the order of insertion until
    /// something is removed).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&K, &V)> + Clone {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn iter_mut(&mut self) -> impl ExactSizeIterator<Item = (&K, &mut V)> {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }

    /// The entries cut into at most `runs` runs of about equal length, each
    /// with the position of its first entry: one walk split over threads.
    pub fn runs_mut(
        &mut self,
        runs: usize,
    ) -> impl Iterator<Item = (usize, impl ExactSizeIterator<Item = (&K, &mut V)>)> {
        let length = self.entries.len().div_ceil(runs.max(1)).max(1);
        (self.entries.chunks_mut(length).enumerate())
            .map(move |(i, run)| (i * length, run.iter_mut().map(|(k, v)| (&*k, v))))
    }

    pub fn keys(&self) -> impl ExactSizeIterator<Item = &K> + Clone {
        self.entries.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl ExactSizeIterator<Item = &V> + Clone {
        self.entries.iter().map(|(_, v)| v)
    }

    pub fn clear(&mut self) {
        self.index.clear();
        self.entries.clear();
    }
}

impl<K: Hash + Eq, V> DenseMap<K, V> {
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    fn position<Q>(&self, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entries = &self.entries;
        let found = self
            .index
            .find(self.hash(key), |&at| entries[at as usize].0.borrow() == key)?;
        Some(*found as usize)
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.position(key).map(|at| &self.entries[at].1)
    }

    /// The stored key equal to `key`, and its value.
    pub fn get_key_value<Q>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.position(key).map(|at| {
            let (k, v) = &self.entries[at];
            (k, v)
        })
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.position(key).map(|at| &mut self.entries[at].1)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.position(key).is_some()
    }

    /// The value of `key`, made by `make` if there is none.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let at = self.position_or_insert_with(key, make);
        &mut self.entries[at].1
    }

    /// The position of `key`'s entry, made with `make` if there is none.
    /// Positions stay as they are until something is removed; a new entry
    /// takes the next one.
    pub fn position_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> usize {
        match self.position(&key) {
            Some(at) => at,
            None => self.push(key, make()),
        }
    }

    /// [`DenseMap::position_or_insert_with`], trying `guess` first: a walk
    /// in the order the entries stand finds each at the position after the
    /// last without hashing it or reading the index.
    pub fn position_near_or_insert_with(
        &mut self,
        guess: usize,
        key: K,
        make: impl FnOnce() -> V,
    ) -> usize {
        match self.entries.get(guess) {
            Some((k, _)) if *k == key => guess,
            _ => self.position_or_insert_with(key, make),
        }
    }

    /// Moves the entries at `first` (positions, none twice) to the front,
    /// in that order; the others follow in the order they stood.
    pub fn put_first(&mut self, first: &[u32]) {
        const UNPLACED: u32 = u32::MAX;
        // Where each entry goes.
        let mut to = vec![UNPLACED; self.entries.len()];
        for (new, &old) in first.iter().enumerate() {
            to[old as usize] = new as u32;
        }
        let unplaced = to.iter_mut().filter(|p| **p == UNPLACED);
        for (place, next) in unplaced.zip(first.len() as u32..) {
            *place = next;
        }
        // Each entry is swapped straight into its place: a cycle at a time.
        for at in 0..to.len() {
            while to[at] as usize != at {
                let there = to[at] as usize;
                self.entries.swap(at, there);
                to.swap(at, there);
            }
        }
        self.reindex();
    }

    /// The entry at a position: one `position_or_insert_with` gave, or
    /// one of `iter`'s order.
    pub fn at(&self, at: usize) -> (&K, &V) {
        let (k, v) = &self.entries[at];
        (k, v)
    }

    /// The entry at a position `position_or_insert_with` gave.
    pub fn at_mut(&mut self, at: usize) -> (&K, &mut V) {
        let (k, v) = &mut self.entries[at];
        (&*k, v)
    }

    /// Sets the value of `key`; returns the one it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.position(&key) {
            Some(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            None => {
                self.push(key, value);
                None
            }
        }
    }

    fn push(&mut self, key: K, value: V) -> usize {
        let at = self.entries.len();
        let position = u32::try_from(at).expect("a dense map holds fewer than 2^32 entries");
        let hash = self.hash(&key);
        self.entries.push((key, value));
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.index
            .insert_unique(hash, position, |&p| hasher.hash_one(&entries[p as usize].0));
        at
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remove_entry(key).map(|(_, v)| v)
    }

    /// Removes `key` and gives back the stored key with its value; the
    /// last entry moves into its place.
    pub fn remove_entry<Q>(&mut self, key: &Q) -> Option<(K, V)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let entries = &self.entries;
        let found = self
            .index
            .find_entry(hash, |&at| entries[at as usize].0.borrow() == key)
            .ok()?;
        let (at, _) = found.remove();
        let at = at as usize;
        let last = self.entries.len() - 1;
        if at != last {
            let moved_hash = self.hash(&self.entries[last].0);
            let slot = self
                .index
                .find_mut(moved_hash, |&p| p as usize == last)
                .expect("every entry has its position in the index");
            *slot = at as u32;
        }
        Some(self.entries.swap_remove(at))
    }

    /// Keeps the entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let before = self.entries.len();
        self.entries.retain_mut(|(k, v)| keep(k, v));
        if self.entries.len() != before {
            self.reindex();
        }
    }

    /// Builds the index again from the entries, as they now stand.
    fn reindex(&mut self) {
        self.index.clear();
        let (entries, hasher) = (&self.entries, &self.hasher);
        for (at, (key, _)) in entries.iter().enumerate() {
            self.index
                .insert_unique(hasher.hash_one(key), at as u32, |&p| {
                    hasher.hash_one(&entries[p as usize].0)
                });
        }
    }
}

impl<K: Hash + Eq, V> FromIterator<(K, V)> for DenseMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(items: I) -> Self {
        let mut map = DenseMap::default();
        map.extend(items);
        map
    }
}

impl<K: Hash + Eq, V> Extend<(K, V)> for DenseMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, items: I) {
        for (k, v) in items {
            self.insert(k, v);
        }
    }
}

impl<K, V> IntoIterator for DenseMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::DenseMap;
    use std::collections::HashMap;

    #[test]
    fn inserts_finds_replaces_and_removes() {
        let mut map = DenseMap::default();
        assert_eq!(map.insert("a", 1), None);
        assert_eq!(map.insert("b", 2), None);
        assert_eq!(map.insert("a", 3), Some(1));
        assert_eq!(map.len(), 2);
        assert_eq!(map.get("a"), Some(&3));
        assert_eq!(map.remove("a"), Some(3));
        assert_eq!(map.remove("a"), None);
        assert_eq!(map.get("b"), Some(&2));
        assert_eq!(map.len(), 1);
        *map.get_or_insert_with("c", || 0) += 5;
        *map.get_or_insert_with("c", || 0) += 5;
        assert_eq!(map.get("c"), Some(&10));
    }

    /// Removes move the last entry into the gap; retain rebuilds the
    /// index: whatever the sequence, the map agrees with a HashMap.
    #[test]
    fn agrees_with_a_hash_map_over_a_long_mixed_sequence() {
        let mut dense = DenseMap::default();
        let mut reference = HashMap::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let key = (seed % 512) as u16;
            match seed % 7 {
                0..=2 => assert_eq!(dense.insert(key, step), reference.insert(key, step)),
                3..=4 => assert_eq!(dense.remove(&key), reference.remove(&key)),
                5 => assert_eq!(dense.get(&key), reference.get(&key)),
                _ if step % 500 == 0 => {
                    dense.retain(|k, _| k % 3 != 0);
                    reference.retain(|k, _| k % 3 != 0);
                }
                _ => {}
            }
            assert_eq!(dense.len(), reference.len());
        }
        for (k, v) in &reference {
            assert_eq!(dense.get(k), Some(v));
        }
        let mut all: Vec<_> = dense.iter().map(|(k, v)| (*k, *v)).collect();
        all.sort();
        let mut expected: Vec<_> = reference.into_iter().collect();
        expected.sort();
        assert_eq!(all, expected);
    }

    #[test]
    fn a_guess_is_taken_only_when_it_holds_the_key() {
        let mut map: DenseMap<u32, u32> = (0..8).map(|k| (k * 10, k)).collect();
        assert_eq!(map.position_near_or_insert_with(3, 30, || 99), 3);
        assert_eq!(map.position_near_or_insert_with(4, 30, || 99), 3);
        assert_eq!(map.position_near_or_insert_with(100, 70, || 99), 7);
        assert_eq!(map.position_near_or_insert_with(8, 80, || 99), 8);
        assert_eq!(map.get(&80), Some(&99));
        assert_eq!(map.len(), 9);
    }

    #[test]
    fn put_first_orders_the_front_and_keeps_the_rest_in_order() {
        let mut map: DenseMap<u32, u32> = (0..10).map(|k| (k, k * 2)).collect();
        map.put_first(&[7, 2, 9, 0]);
        let keys: Vec<u32> = map.keys().copied().collect();
        assert_eq!(keys, [7, 2, 9, 0, 1, 3, 4, 5, 6, 8]);
        for k in 0..10 {
            assert_eq!(map.get(&k), Some(&(k * 2)), "{k} after reordering");
        }
        map.put_first(&[]);
        assert_eq!(map.keys().copied().collect::<Vec<_>>(), keys);
        let reversed: Vec<u32> = (0..10).rev().collect();
        map.put_first(&reversed);
        assert_eq!(
            map.keys().copied().collect::<Vec<_>>(),
            [8, 6, 5, 4, 3, 1, 0, 9, 2, 7]
        );
        assert_eq!(map.remove(&4), Some(8));
        assert_eq!(map.get(&1), Some(&2));
    }

    #[test]
    fn runs_cover_every_entry_once_at_their_positions() {
        for (entries, runs) in [(0, 2), (1, 2), (7, 2), (7, 3), (8, 8), (5, 9)] {
            let mut map: DenseMap<u32, u32> = (0..entries).map(|k| (k, 0)).collect();
            let mut seen = 0;
            let mut cut = 0;
            for (start, run) in map.runs_mut(runs) {
                assert_eq!(start, seen);
                for (position, (key, value)) in (start..).zip(run) {
                    // Keys went in in order: each sits at its own value.
                    assert_eq!(*key as usize, position);
                    *value += 1;
                    seen += 1;
                }
                cut += 1;
            }
            assert_eq!(seen, entries as usize);
            assert!(cut <= runs);
            assert!(map.values().all(|v| *v == 1));
        }
    }
}

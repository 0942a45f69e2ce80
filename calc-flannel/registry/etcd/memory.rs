//! An in-memory etcd for fast tests: revisions, prefix watches with history
//! and compaction, create-if-absent, leases that expire when a test says
//! so, and an outage switch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::kv::{EtcdError, Event, KeyValue, Kv, Listing, Watch, WatchMessage};

#[derive(Default)]
struct Store {
    revision: i64,
    keys: BTreeMap<String, Vec<u8>>,
    /// Every change, by revision, from `compacted` on.
    history: Vec<(i64, Event)>,
    compacted: i64,
    watchers: Vec<(String, mpsc::Sender<Result<WatchMessage, EtcdError>>)>,
    down: bool,
    /// Writes per TTL: tests check that leases are bound to one.
    ttls: Vec<Duration>,
    /// Reads per key.
    gets: BTreeMap<String, usize>,
}

#[derive(Clone, Default)]
pub struct MemoryEtcd {
    store: Arc<Mutex<Store>>,
}

impl Store {
    fn check(&self) -> Result<(), EtcdError> {
        if self.down {
            Err(EtcdError::Unavailable("the test took it down".into()))
        } else {
            Ok(())
        }
    }

    /// Applies changes as one revision and tells the watchers in one
    /// response each.
    fn commit(&mut self, events: Vec<Event>) {
        self.revision += 1;
        for event in &events {
            match event {
                Event::Put(kv) => {
                    self.keys.insert(kv.key.clone(), kv.value.clone());
                }
                Event::Delete { key } => {
                    self.keys.remove(key);
                }
            }
            self.history.push((self.revision, event.clone()));
        }
        let revision = self.revision;
        self.watchers.retain(|(prefix, tx)| {
            let mine: Vec<Event> = events
                .iter()
                .filter(|e| key_of(e).starts_with(prefix.as_str()))
                .cloned()
                .collect();
            mine.is_empty()
                || tx
                    .try_send(Ok(WatchMessage::Events {
                        revision,
                        events: mine,
                    }))
                    .is_ok()
        });
    }
}

fn key_of(event: &Event) -> &str {
    match event {
        Event::Put(kv) => &kv.key,
        Event::Delete { key } => key,
    }
}

impl MemoryEtcd {
    fn with<T>(&self, f: impl FnOnce(&mut Store) -> Result<T, EtcdError>) -> Result<T, EtcdError> {
        let mut store = self.store.lock().unwrap();
        store.check()?;
        f(&mut store)
    }

    /// Several writes in one revision (one etcd transaction).
    pub fn transaction(&self, events: Vec<Event>) {
        self.store.lock().unwrap().commit(events);
    }

    pub fn set(&self, key: &str, value: &str) {
        self.transaction(vec![Event::Put(KeyValue {
            key: key.into(),
            value: value.into(),
        })]);
    }

    /// A lease expiring, or someone deleting a key.
    pub fn remove(&self, key: &str) {
        self.transaction(vec![Event::Delete { key: key.into() }]);
    }

    pub fn value(&self, key: &str) -> Option<String> {
        let store = self.store.lock().unwrap();
        store
            .keys
            .get(key)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    pub fn keys(&self) -> Vec<String> {
        self.store.lock().unwrap().keys.keys().cloned().collect()
    }

    pub fn ttls(&self) -> Vec<Duration> {
        self.store.lock().unwrap().ttls.clone()
    }

    /// Forgets history before the current revision.
    pub fn compact(&self) {
        let mut store = self.store.lock().unwrap();
        store.compacted = store.revision;
        let keep = store.revision;
        store.history.retain(|(r, _)| *r >= keep);
    }

    /// Takes the store down (every call fails, watches break) or back up.
    pub fn set_down(&self, down: bool) {
        let mut store = self.store.lock().unwrap();
        store.down = down;
        if down {
            for (_, tx) in store.watchers.drain(..) {
                let _ = tx.try_send(Err(EtcdError::Unavailable("went down".into())));
            }
        }
    }

    /// How often `key` was read.
    pub fn gets_of(&self, key: &str) -> usize {
        self.store
            .lock()
            .unwrap()
            .gets
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Ends every watch as etcd does when its revision is compacted away.
    pub fn break_watches_with_compaction(&self) {
        let mut store = self.store.lock().unwrap();
        let compact_revision = store.compacted;
        for (_, tx) in store.watchers.drain(..) {
            let _ = tx.try_send(Ok(WatchMessage::Compacted { compact_revision }));
        }
    }

    pub fn watchers(&self) -> usize {
        let mut store = self.store.lock().unwrap();
        store.watchers.retain(|(_, tx)| !tx.is_closed());
        store.watchers.len()
    }
}

impl Kv for MemoryEtcd {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        self.with(|s| {
            *s.gets.entry(key.to_string()).or_default() += 1;
            Ok(s.keys.get(key).map(|value| KeyValue {
                key: key.into(),
                value: value.clone(),
            }))
        })
    }

    async fn list(&self, prefix: &str) -> Result<Listing, EtcdError> {
        self.with(|s| {
            Ok(Listing {
                kvs: s
                    .keys
                    .range(prefix.to_string()..)
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .map(|(key, value)| KeyValue {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                revision: s.revision,
            })
        })
    }

    async fn create(
        &self,
        key: &str,
        guard: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<bool, EtcdError> {
        self.with(|s| {
            if s.keys.keys().any(|k| k.starts_with(guard)) {
                return Ok(false);
            }
            s.ttls.push(ttl);
            s.commit(vec![Event::Put(KeyValue {
                key: key.into(),
                value: value.into(),
            })]);
            Ok(true)
        })
    }

    async fn put(&self, key: &str, value: &str, ttl: Duration) -> Result<(), EtcdError> {
        self.with(|s| {
            s.ttls.push(ttl);
            s.commit(vec![Event::Put(KeyValue {
                key: key.into(),
                value: value.into(),
            })]);
            Ok(())
        })
    }

    async fn delete(&self, key: &str) -> Result<(), EtcdError> {
        self.with(|s| {
            if s.keys.contains_key(key) {
                s.commit(vec![Event::Delete { key: key.into() }]);
            }
            Ok(())
        })
    }

    async fn watch(&self, prefix: &str, revision: i64) -> Result<Watch, EtcdError> {
        self.with(|s| {
            let (tx, rx) = mpsc::channel(1024);
            if revision < s.compacted {
                let _ = tx.try_send(Ok(WatchMessage::Compacted {
                    compact_revision: s.compacted,
                }));
                return Ok(rx);
            }
            let mut by_revision: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
            for (r, event) in &s.history {
                if *r >= revision && key_of(event).starts_with(prefix) {
                    by_revision.entry(*r).or_default().push(event.clone());
                }
            }
            for (revision, events) in by_revision {
                let _ = tx.try_send(Ok(WatchMessage::Events { revision, events }));
            }
            s.watchers.push((prefix.to_string(), tx));
            Ok(rx)
        })
    }
}

//! etcd as calc-flannel needs it, behind one small trait: the real client
//! (`client.rs`) and an in-memory one for tests (`memory.rs`).

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
}

/// Every key under a prefix, as of one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub kvs: Vec<KeyValue>,
    /// The store's revision the listing is as of: a watch from the next
    /// one misses nothing.
    pub revision: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Put(KeyValue),
    /// Deleted, or its etcd lease expired.
    Delete {
        key: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchMessage {
    /// Every event of one watch response, in order.
    Events { revision: i64, events: Vec<Event> },
    /// The revision asked for is compacted away: list again.
    Compacted { compact_revision: i64 },
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum EtcdError {
    #[error("etcd unreachable: {0}")]
    Unavailable(String),
    #[error("etcd refused: {0}")]
    Refused(String),
    #[error("the revision asked for is compacted (oldest left: {0})")]
    Compacted(i64),
}

/// A watch: its messages, until an error or the end of the channel says
/// it broke.
pub type Watch = mpsc::Receiver<Result<WatchMessage, EtcdError>>;

pub trait Kv: Send + Sync + 'static {
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<KeyValue>, EtcdError>> + Send;

    /// Every key under `prefix`.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Listing, EtcdError>> + Send;

    /// Creates `key`, bound to a new etcd lease of `ttl`, unless a key
    /// starting with `guard` (`key` itself, or a prefix of it) exists: one
    /// transaction on every such key's version being 0. False: one exists.
    fn create(
        &self,
        key: &str,
        guard: &str,
        value: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, EtcdError>> + Send;

    /// Writes `key` bound to a new etcd lease of `ttl`, as flannel renews
    /// its lease.
    fn put(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), EtcdError>> + Send;

    fn delete(&self, key: &str) -> impl Future<Output = Result<(), EtcdError>> + Send;

    /// Every change under `prefix` from `revision` on.
    fn watch(
        &self,
        prefix: &str,
        revision: i64,
    ) -> impl Future<Output = Result<Watch, EtcdError>> + Send;
}

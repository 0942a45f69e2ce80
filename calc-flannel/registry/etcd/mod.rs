//! flannel's etcd subnet manager: the network config at `<prefix>/config`,
//! one key per lease under `<prefix>/subnets/`. This node's lease is
//! reused after a restart, created with a transaction when new, renewed
//! before it expires and taken again if someone deletes it; the others are
//! watched, and listed again after a compaction or an outage.

pub mod client;
pub mod kv;
#[cfg(test)]
pub mod memory;

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};
use tracing::{debug, info, warn};

use self::kv::{EtcdError, Event, KeyValue, Kv, Watch, WatchMessage};
use super::{LeaseChange, SubnetManager};
use crate::allocate::{self, Previous};
use crate::backoff::{Backoff, Condition, retry};
use crate::lease::{Lease, LeaseAttrs};
use crate::network::NetworkConfig;
use crate::subnet::SubnetKey;

#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// Everything flannel keeps in etcd is under it.
    pub prefix: String,
    pub lease_ttl: Duration,
    /// A lease is renewed this long before it expires.
    pub renew_margin: Duration,
}

/// A failed renewal is tried again at least this often.
const RENEW_RETRY: Duration = Duration::from_secs(60);

/// An index below `n`, different on every call and every node: flannel
/// picks a subnet at random too, so that nodes starting together seldom
/// want the same one (the create transaction settles it when they do).
fn random_index(n: usize) -> usize {
    // Every RandomState has keys of its own, seeded by the system.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_usize(n);
    (hasher.finish() % n.max(1) as u64) as usize
}

/// Where the manager is with etcd.
enum Watching {
    /// Watch from the listing of this revision on.
    Start(i64),
    Watch(Watch),
    /// List again at this instant, then watch from the listing.
    Relist(Instant),
}

/// What is due.
pub enum EtcdDue {
    /// The watch can start.
    Start(i64),
    /// From the watch; `None`: it ended.
    Message(Option<Result<WatchMessage, EtcdError>>),
    Relist,
    Renew,
}

/// This node's lease, once held.
struct Held {
    config: NetworkConfig,
    attrs: LeaseAttrs,
    key: SubnetKey,
}

pub struct EtcdSubnetManager<K> {
    kv: K,
    options: LeaseOptions,
    held: Option<Held>,
    watching: Watching,
    renew_at: Instant,
    etcd: (Backoff, Condition),
    renewal: (Backoff, Condition),
    /// The revision the leases are known as of.
    revision: i64,
}

impl<K: Kv> EtcdSubnetManager<K> {
    pub fn new(kv: K, options: LeaseOptions) -> EtcdSubnetManager<K> {
        EtcdSubnetManager {
            kv,
            options,
            held: None,
            watching: Watching::Relist(Instant::now()),
            renew_at: Instant::now(),
            etcd: (Backoff::retries(), Condition::new("etcd")),
            renewal: (Backoff::retries(), Condition::new("renewing the lease")),
            revision: 0,
        }
    }

    fn config_key(&self) -> String {
        format!("{}/config", self.options.prefix)
    }

    fn subnets_prefix(&self) -> String {
        format!("{}/subnets/", self.options.prefix)
    }

    fn lease_key(&self, key: &SubnetKey) -> String {
        format!("{}{key}", self.subnets_prefix())
    }

    fn renew_interval(&self) -> Duration {
        self.options
            .lease_ttl
            .saturating_sub(self.options.renew_margin)
    }

    fn held(&self) -> &Held {
        self.held
            .as_ref()
            .expect("the agent acquires a lease before it follows them")
    }

    /// Every lease under the subnets prefix, and the keys whose values
    /// cannot be read (still taken, and never a reason to drop a route).
    async fn list(&self) -> Result<Listed, EtcdError> {
        let listing = self.kv.list(&self.subnets_prefix()).await?;
        let mut listed = Listed {
            revision: listing.revision,
            ..Default::default()
        };
        for kv in listing.kvs {
            match self.parse(&kv) {
                Some((key, Some(attrs))) => listed.leases.push(Lease { key, attrs }),
                Some((key, None)) => {
                    listed.unreadable.insert(key);
                }
                None => {}
            }
        }
        Ok(listed)
    }

    /// A lease's key and value, warning about what cannot be read.
    fn parse(&self, kv: &KeyValue) -> Option<(SubnetKey, Option<LeaseAttrs>)> {
        let name = kv
            .key
            .strip_prefix(&self.subnets_prefix())
            .unwrap_or(&kv.key);
        let key: SubnetKey = match name.parse() {
            Ok(key) => key,
            Err(e) => {
                warn!(key = %kv.key, "skipped: {e}");
                return None;
            }
        };
        match LeaseAttrs::parse(&kv.value) {
            Ok(attrs) => Some((key, Some(attrs))),
            Err(e) => {
                warn!(key = %kv.key, "lease skipped: {e}");
                Some((key, None))
            }
        }
    }

    /// Holds a lease: this node's own (same PublicIP) if there is one that
    /// fits the config, else the `previous` subnets when they fit and are
    /// free, else a free subnet at random, created only if nobody has it.
    /// Returns it with the listing it was chosen on, which is older than
    /// the lease's write.
    async fn acquire_lease(
        &self,
        config: &NetworkConfig,
        attrs: &LeaseAttrs,
        previous: Previous,
    ) -> (Lease, Listed) {
        let mut backoff = Backoff::retries();
        let mut condition = Condition::new("acquiring a lease");
        let ttl = self.options.lease_ttl;
        let value = attrs.to_json();
        loop {
            let attempt = async {
                let listed = self.list().await?;
                let fits = |key: &SubnetKey| fits(config, key);
                if let Some(mine) = listed
                    .leases
                    .iter()
                    .find(|l| l.attrs.public_ip == attrs.public_ip)
                {
                    let key = self.lease_key(&mine.key);
                    if fits(&mine.key) {
                        self.kv.put(&key, &value, ttl).await?;
                        info!(lease = %mine.key, "reusing this node's lease");
                        return Ok(Some((mine.key, listed)));
                    }
                    info!(lease = %mine.key, "this node's lease does not fit the network config: deleting it");
                    self.kv.delete(&key).await?;
                }
                let taken: Vec<SubnetKey> = listed
                    .leases
                    .iter()
                    .map(|l| l.key)
                    .chain(listed.unreadable.iter().copied())
                    .collect();
                let reused = match allocate::reuse(config, previous, &taken) {
                    _ if previous.is_empty() => None,
                    Ok(key) => {
                        info!(lease = %key, "asking for the subnet this node had before");
                        Some(key)
                    }
                    Err(reason) => {
                        warn!(subnet = %previous, %reason, "not asking for the subnet this node had before: allocating another");
                        None
                    }
                };
                let key = match reused {
                    Some(key) => key,
                    None => allocate::choose(config, &taken, &mut random_index)
                        .map_err(|e| EtcdError::Refused(e.to_string()))?,
                };
                // No other lease of this IPv4 subnet either, whatever its
                // IPv6 part (a flanneld picks that at random).
                let guard = self.lease_key(&SubnetKey {
                    v4: key.v4,
                    v6: None,
                });
                if self
                    .kv
                    .create(&self.lease_key(&key), &guard, &value, ttl)
                    .await?
                {
                    info!(lease = %key, "acquired a new lease");
                    return Ok(Some((key, listed)));
                }
                debug!(lease = %key, "another node took this subnet first: choosing again");
                Ok::<_, EtcdError>(None)
            };
            match attempt.await {
                Ok(Some((key, listed))) => {
                    condition.ok();
                    let lease = Lease {
                        key,
                        attrs: attrs.clone(),
                    };
                    return (lease, listed);
                }
                Ok(None) => backoff.reset(),
                Err(e) => {
                    let wait = backoff.next();
                    condition.failed(&e, wait);
                    sleep(wait).await;
                }
            }
        }
    }

    /// Takes a lease again, the same subnet when it is free.
    async fn reacquire(&mut self, changes: &mut Vec<LeaseChange>) {
        let held = self.held();
        let before = held.key;
        let (lease, _) = self
            .acquire_lease(&held.config, &held.attrs, before.into())
            .await;
        if lease.key != before {
            warn!(before = %before, now = %lease.key, "this node has another subnet now: pods of the old one lose their routes");
        }
        if let Some(held) = &mut self.held {
            held.key = lease.key;
        }
        self.renew_at = Instant::now() + self.renew_interval();
        changes.push(LeaseChange::Local(lease));
    }

    /// Lists every lease (taking this node's lease again if it is gone)
    /// and watches from the listing on.
    async fn relist(&mut self, changes: &mut Vec<LeaseChange>) -> Result<(), EtcdError> {
        let mut listed = self.list().await?;
        let own = self.held().key;
        if !listed.leases.iter().any(|l| l.key == own) && !listed.unreadable.contains(&own) {
            warn!(lease = %own, "this node's lease is gone: acquiring one again");
            self.reacquire(changes).await;
            // The listing is older than the new lease: list again.
            listed = self.list().await?;
        }
        let revision = listed.revision;
        changes.push(listed.into_change());
        self.watch_from(revision).await
    }

    async fn watch_from(&mut self, revision: i64) -> Result<(), EtcdError> {
        let watch = self.kv.watch(&self.subnets_prefix(), revision + 1).await?;
        info!(revision, "watching leases");
        self.revision = revision;
        self.watching = Watching::Watch(watch);
        self.etcd.0.reset();
        self.etcd.1.ok();
        Ok(())
    }

    fn retry_relist(&mut self, error: &EtcdError) {
        let wait = self.etcd.0.next();
        self.etcd.1.failed(error, wait);
        self.watching = Watching::Relist(Instant::now() + wait);
    }

    async fn on_event(&mut self, event: Event, changes: &mut Vec<LeaseChange>) {
        let own = self.held().key;
        match event {
            Event::Put(kv) => match self.parse(&kv) {
                Some((key, _)) if key == own => {
                    if kv.value.as_slice() != self.held().attrs.to_json().as_bytes() {
                        warn!(lease = %key, "this node's lease was overwritten by someone else");
                    }
                }
                Some((_, None)) | None => {}
                Some((key, Some(attrs))) => changes.push(LeaseChange::Put(Lease { key, attrs })),
            },
            Event::Delete { key } => {
                let name = key.strip_prefix(&self.subnets_prefix()).unwrap_or(&key);
                let Ok(key) = name.parse::<SubnetKey>() else {
                    return;
                };
                if key == own {
                    warn!(lease = %key, "this node's lease was deleted: acquiring one again");
                    self.reacquire(changes).await;
                } else {
                    changes.push(LeaseChange::Delete(key));
                }
            }
        }
    }

    async fn renew(&mut self) {
        let held = self.held();
        let (key, value) = (held.key, held.attrs.to_json());
        match self
            .kv
            .put(&self.lease_key(&key), &value, self.options.lease_ttl)
            .await
        {
            Ok(()) => {
                self.renewal.0.reset();
                self.renewal.1.ok();
                info!(lease = %key, "lease renewed");
                self.renew_at = Instant::now() + self.renew_interval();
            }
            Err(e) => {
                let wait = self.renewal.0.next().min(RENEW_RETRY);
                self.renewal.1.failed(&e, wait);
                self.renew_at = Instant::now() + wait;
            }
        }
    }
}

impl<K: Kv> SubnetManager for EtcdSubnetManager<K> {
    type Due = EtcdDue;

    /// Waits until one is there and valid (as flannel waits).
    async fn network_config(&mut self) -> NetworkConfig {
        let key = self.config_key();
        let kv = &self.kv;
        let key = &key;
        let config = retry("network config", || async move {
            match kv.get(key).await {
                Ok(Some(kv)) => NetworkConfig::parse(&String::from_utf8_lossy(&kv.value))
                    .map_err(|e| format!("{key} is not usable: {e}")),
                Ok(None) => Err(format!("{key} does not exist yet")),
                Err(e) => Err(format!("reading {key}: {e}")),
            }
        })
        .await;
        config.log(key);
        config
    }

    /// The listing the lease was acquired on is the start: the watch from
    /// it brings this node's own write, and everything else since.
    async fn acquire(
        &mut self,
        config: &NetworkConfig,
        attrs: LeaseAttrs,
        previous: Previous,
    ) -> (Lease, LeaseChange) {
        let (lease, listed) = self.acquire_lease(config, &attrs, previous).await;
        self.held = Some(Held {
            config: config.clone(),
            attrs,
            key: lease.key,
        });
        self.renew_at = Instant::now() + self.renew_interval();
        self.watching = Watching::Start(listed.revision);
        (lease, listed.into_change())
    }

    async fn due(&mut self) -> EtcdDue {
        let renew_at = self.renew_at;
        let watched = async {
            match &mut self.watching {
                Watching::Start(revision) => EtcdDue::Start(*revision),
                Watching::Watch(watch) => EtcdDue::Message(watch.recv().await),
                Watching::Relist(at) => {
                    sleep_until(*at).await;
                    EtcdDue::Relist
                }
            }
        };
        tokio::select! {
            due = watched => due,
            () = sleep_until(renew_at) => EtcdDue::Renew,
        }
    }

    async fn handle(&mut self, due: EtcdDue) -> Vec<LeaseChange> {
        let mut changes = Vec::new();
        match due {
            EtcdDue::Start(revision) => {
                if let Err(e) = self.watch_from(revision).await {
                    self.retry_relist(&e);
                }
            }
            EtcdDue::Relist => {
                if let Err(e) = self.relist(&mut changes).await {
                    self.retry_relist(&e);
                }
            }
            EtcdDue::Message(Some(Ok(WatchMessage::Events { revision, events }))) => {
                self.revision = revision;
                for event in events {
                    self.on_event(event, &mut changes).await;
                }
            }
            EtcdDue::Message(other) => {
                match other {
                    Some(Ok(WatchMessage::Compacted { compact_revision })) => {
                        warn!(
                            revision = self.revision,
                            compact_revision,
                            "the watch fell behind etcd's compaction: listing every lease again"
                        );
                    }
                    Some(Err(e)) => warn!(error = %e, "the watch broke: listing every lease again"),
                    _ => warn!("the watch ended: listing every lease again"),
                }
                self.watching = Watching::Relist(Instant::now());
            }
            EtcdDue::Renew => self.renew().await,
        }
        changes
    }

    async fn programmed(&mut self) {}
}

/// A listing, parsed.
#[derive(Default)]
struct Listed {
    leases: Vec<Lease>,
    unreadable: BTreeSet<SubnetKey>,
    revision: i64,
}

impl Listed {
    fn into_change(self) -> LeaseChange {
        LeaseChange::Resync {
            leases: self.leases,
            unreadable: self.unreadable,
        }
    }
}

/// Whether a lease's subnets are ones the config hands out now.
fn fits(config: &NetworkConfig, key: &SubnetKey) -> bool {
    let v4 = config.v4.holds(&ipnetwork::IpNetwork::V4(key.v4));
    let v6 = match (&config.v6, key.v6) {
        (Some(range), Some(v6)) => range.holds(&ipnetwork::IpNetwork::V6(v6)),
        (None, None) => true,
        _ => false,
    };
    v4 && v6
}

//! The agent: learns this node's name from vxmgrd, waits for the network
//! config, picks the interface, holds a lease (reused after a restart,
//! renewed before it expires, taken again if someone deletes it), watches
//! every lease and streams the view of them to vxmgrd, relisting after a
//! compaction or an outage and reopening the stream when vxmgrd comes back.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};
use tracing::{debug, info, warn};
use vxmgr::model::Family;
use vxmgr::wire::felix::ToDataplane;

use crate::allocate;
use crate::backoff::{Backoff, Condition};
use crate::dataplane::{Dataplane, Stream};
use crate::host::HostNetwork;
use crate::iface::{self, IfaceSpec, Underlay};
use crate::lease::{Lease, LeaseAttrs, VxlanData};
use crate::network::{Backend, NetworkConfig};
use crate::registry::{Event, KeyValue, Registry, RegistryError, Watch, WatchMessage};
use crate::subnet::SubnetKey;
use crate::subnet_env;
use crate::view::{Local, View};
use crate::vtep_mac;

#[cfg(test)]
mod tests;

#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Everything flannel keeps in etcd is under it.
    pub prefix: String,
    pub subnet_file: PathBuf,
    pub lease_ttl: Duration,
    /// A lease is renewed this long before it expires.
    pub renew_margin: Duration,
    pub iface: IfaceSpec,
    /// flannel's --ip-masq.
    pub ip_masq: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    NoInterface(#[from] iface::NoInterface),
    #[error("writing {}: {source}", path.display())]
    SubnetFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub struct Agent<R> {
    registry: R,
    dataplane: Dataplane,
    host: HostNetwork,
    options: AgentOptions,
}

/// Retries of anything: from 100 ms, doubling, at most 5 s apart.
fn backoff() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
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

/// Where the agent is with etcd.
enum Watching {
    Watch(Watch),
    /// List again at this instant, then watch from the listing.
    Relist(Instant),
}

/// Where the agent is with vxmgrd.
enum Streaming {
    Open(Stream),
    /// Open again at this instant and send everything.
    Reopen(Instant),
}

impl<R: Registry> Agent<R> {
    /// An agent on this `host` (its interfaces as read at start-up, as
    /// flannel reads them once).
    pub fn new(
        registry: R,
        dataplane: Dataplane,
        host: HostNetwork,
        options: AgentOptions,
    ) -> Agent<R> {
        Agent {
            registry,
            dataplane,
            host,
            options,
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

    /// Runs until an error it cannot get past; stopping is done by
    /// dropping the future (the lease stays until its TTL, the kernel
    /// stays with vxmgrd).
    pub async fn run(self) -> Result<(), AgentError> {
        let hostname = self.hostname().await;
        let config = self.network_config().await;
        let underlay = iface::select(&self.options.iface, &self.host, config.v6.is_some())?;
        info!(
            interface = %underlay.interface,
            address = %underlay.address_v4,
            public_ip = %underlay.public_v4,
            public_ipv6 = ?underlay.public_v6,
            "using this interface"
        );
        let attrs = own_attrs(&config, &underlay, &hostname);
        let (lease, listed) = self.acquire(&config, &attrs, None).await;
        self.write_subnet_file(&config, &underlay, &lease.key)?;
        let mut view = View::new(
            config,
            Local {
                hostname,
                lease,
                underlay,
                ip_masq: self.options.ip_masq,
            },
        );
        // Every lease is known before vxmgrd hears of any: its resync
        // after InSync removes what a stream did not declare. The listing
        // the lease was acquired on is the start (the watch from it brings
        // this node's own write, and everything else since); listing again
        // only when that watch cannot start.
        let mut started = self.adopt(&mut view, listed, &mut Vec::new()).await;
        let mut backoff = backoff();
        let mut condition = Condition::new("listing leases");
        let watch = loop {
            match started {
                Ok((_, watch)) => break watch,
                Err(e) => {
                    let wait = backoff.next();
                    condition.failed(&e, wait);
                    sleep(wait).await;
                }
            }
            started = self.relist(&mut view, &attrs, &mut Vec::new()).await;
        };
        condition.ok();
        self.follow(view, attrs, watch).await;
        Ok(())
    }

    /// vxmgrd's name for this node, waiting for vxmgrd if it is not up.
    async fn hostname(&self) -> String {
        let mut backoff = backoff();
        let mut condition = Condition::new("waiting for vxmgrd");
        loop {
            match self.dataplane.hostname().await {
                Ok(hostname) => {
                    condition.ok();
                    info!(%hostname, socket = %self.dataplane.socket().display(), "vxmgrd's name for this node");
                    return hostname;
                }
                Err(e) => {
                    let wait = backoff.next();
                    condition.failed(&e, wait);
                    sleep(wait).await;
                }
            }
        }
    }

    /// The network config, waiting until one is there and valid (as
    /// flannel waits).
    async fn network_config(&self) -> NetworkConfig {
        let key = self.config_key();
        let mut backoff = backoff();
        let mut condition = Condition::new("network config");
        loop {
            let problem = match self.registry.get(&key).await {
                Ok(Some(kv)) => match NetworkConfig::parse(&String::from_utf8_lossy(&kv.value)) {
                    Ok(config) => {
                        condition.ok();
                        info!(
                            key,
                            network = %config.v4.network,
                            subnet_len = config.v4.subnet_len,
                            ipv6_network = ?config.v6.as_ref().map(|r| r.network),
                            backend = config.backend.lease_type(),
                            "network config"
                        );
                        return config;
                    }
                    Err(e) => format!("{key} is not usable: {e}"),
                },
                Ok(None) => format!("{key} does not exist yet"),
                Err(e) => format!("reading {key}: {e}"),
            };
            let wait = backoff.next();
            condition.failed(&problem, wait);
            sleep(wait).await;
        }
    }

    /// Every lease under the subnets prefix, and the keys whose values
    /// cannot be read (still taken, and never a reason to drop a route).
    async fn list(&self) -> Result<Listed, RegistryError> {
        let listing = self.registry.list(&self.subnets_prefix()).await?;
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
    /// fits the config, else `prefer` when it is free, else a free subnet
    /// at random, created only if nobody has it. Returns it with the
    /// listing it was chosen on, which is older than the lease's write.
    async fn acquire(
        &self,
        config: &NetworkConfig,
        attrs: &LeaseAttrs,
        prefer: Option<SubnetKey>,
    ) -> (Lease, Listed) {
        let mut backoff = backoff();
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
                        self.registry.put(&key, &value, ttl).await?;
                        info!(lease = %mine.key, "reusing this node's lease");
                        return Ok(Some((mine.key, listed)));
                    }
                    info!(lease = %mine.key, "this node's lease does not fit the network config: deleting it");
                    self.registry.delete(&key).await?;
                }
                let taken: Vec<SubnetKey> = listed
                    .leases
                    .iter()
                    .map(|l| l.key)
                    .chain(listed.unreadable.iter().copied())
                    .collect();
                let key = match prefer.filter(|k| fits(k) && !taken.contains(k)) {
                    Some(key) => key,
                    None => allocate::choose(config, &taken, &mut random_index)
                        .map_err(|e| RegistryError::Refused(e.to_string()))?,
                };
                // No other lease of this IPv4 subnet either, whatever its
                // IPv6 part (a flanneld picks that at random).
                let guard = self.lease_key(&SubnetKey {
                    v4: key.v4,
                    v6: None,
                });
                if self
                    .registry
                    .create(&self.lease_key(&key), &guard, &value, ttl)
                    .await?
                {
                    info!(lease = %key, "acquired a new lease");
                    return Ok(Some((key, listed)));
                }
                debug!(lease = %key, "another node took this subnet first: choosing again");
                Ok::<_, RegistryError>(None)
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

    fn write_subnet_file(
        &self,
        config: &NetworkConfig,
        underlay: &Underlay,
        key: &SubnetKey,
    ) -> Result<(), AgentError> {
        let mtu = match &config.backend {
            Backend::Vxlan(vxlan) => vxlan
                .mtu
                .unwrap_or(underlay.mtu.saturating_sub(Family::V4.encap_overhead())),
            Backend::HostGw => underlay.mtu,
        };
        let path = &self.options.subnet_file;
        let text = subnet_env::render(config, key, mtu, self.options.ip_masq);
        subnet_env::write(path, &text).map_err(|source| AgentError::SubnetFile {
            path: path.clone(),
            source,
        })?;
        info!(path = %path.display(), "wrote the subnet file");
        Ok(())
    }

    /// Watches the leases and keeps vxmgrd's view of them, for ever.
    async fn follow(&self, mut view: View, attrs: LeaseAttrs, watch: Watch) {
        let mut watching = Watching::Watch(watch);
        let mut streaming = Streaming::Reopen(Instant::now());
        let mut renew_at = Instant::now() + self.renew_interval();
        let mut etcd = (backoff(), Condition::new("etcd"));
        let mut vxmgrd = (backoff(), Condition::new("vxmgrd"));
        let mut renewal = (backoff(), Condition::new("renewing the lease"));
        // The revision the view is as of.
        let mut revision = 0;
        loop {
            let mut out = Vec::new();
            tokio::select! {
                event = watch_event(&mut watching) => match event {
                    EtcdEvent::RelistDue => {
                        match self.relist(&mut view, &attrs, &mut out).await {
                            Ok((r, watch)) => {
                                revision = r;
                                etcd.0.reset();
                                etcd.1.ok();
                                watching = Watching::Watch(watch);
                            }
                            Err(e) => {
                                let wait = etcd.0.next();
                                etcd.1.failed(&e, wait);
                                watching = Watching::Relist(Instant::now() + wait);
                            }
                        }
                    }
                    EtcdEvent::Message(Some(Ok(WatchMessage::Events { revision: r, events }))) => {
                        revision = r;
                        for event in events {
                            self.on_event(&mut view, &attrs, event, &mut out).await;
                        }
                    }
                    EtcdEvent::Message(other) => {
                        match other {
                            Some(Ok(WatchMessage::Compacted { compact_revision })) => {
                                warn!(revision, compact_revision, "the watch fell behind etcd's compaction: listing every lease again");
                            }
                            Some(Err(e)) => warn!(error = %e, "the watch broke: listing every lease again"),
                            _ => warn!("the watch ended: listing every lease again"),
                        }
                        watching = Watching::Relist(Instant::now());
                    }
                },
                () = sleep_until(renew_at) => {
                    let key = self.lease_key(&view.local().lease.key);
                    match self.registry.put(&key, &attrs.to_json(), self.options.lease_ttl).await {
                        Ok(()) => {
                            renewal.0.reset();
                            renewal.1.ok();
                            info!(lease = %view.local().lease.key, "lease renewed");
                            renew_at = Instant::now() + self.renew_interval();
                        }
                        Err(e) => {
                            let wait = renewal.0.next().min(RENEW_RETRY);
                            renewal.1.failed(&e, wait);
                            renew_at = Instant::now() + wait;
                        }
                    }
                }
                () = stream_event(&mut streaming) => {
                    streaming = match streaming {
                        Streaming::Open(_) => Streaming::Reopen(Instant::now()),
                        Streaming::Reopen(_) => match self.dataplane.open().await {
                            Ok(mut stream) => match stream.send(view.snapshot()).await {
                                Ok(()) => {
                                    vxmgrd.0.reset();
                                    vxmgrd.1.ok();
                                    info!(leases = view.remote_count(), "sent vxmgrd the whole view");
                                    Streaming::Open(stream)
                                }
                                Err(e) => {
                                    let wait = vxmgrd.0.next();
                                    vxmgrd.1.failed(&e, wait);
                                    Streaming::Reopen(Instant::now() + wait)
                                }
                            },
                            Err(e) => {
                                let wait = vxmgrd.0.next();
                                vxmgrd.1.failed(&e, wait);
                                Streaming::Reopen(Instant::now() + wait)
                            }
                        },
                    };
                }
            }
            if out.is_empty() {
                continue;
            }
            if let Streaming::Open(stream) = &mut streaming
                && stream.send(out).await.is_err()
            {
                // The whole view goes again when the stream is back.
                streaming = Streaming::Reopen(Instant::now());
            }
        }
    }

    fn renew_interval(&self) -> Duration {
        self.options
            .lease_ttl
            .saturating_sub(self.options.renew_margin)
    }

    /// Lists every lease, brings the view up to it (and takes this node's
    /// lease again if it is gone), and watches from the listing on.
    async fn relist(
        &self,
        view: &mut View,
        attrs: &LeaseAttrs,
        out: &mut Vec<ToDataplane>,
    ) -> Result<(i64, Watch), RegistryError> {
        let listed = self.list().await?;
        let own = view.local().lease.key;
        if !listed.leases.iter().any(|l| l.key == own) && !listed.unreadable.contains(&own) {
            warn!(lease = %own, "this node's lease is gone: acquiring one again");
            self.reacquire(view, attrs, out).await;
            // The listing is older than the new lease: list again.
            return Box::pin(self.relist(view, attrs, out)).await;
        }
        self.adopt(view, listed, out).await
    }

    /// Brings the view up to a listing and watches from it on.
    async fn adopt(
        &self,
        view: &mut View,
        listed: Listed,
        out: &mut Vec<ToDataplane>,
    ) -> Result<(i64, Watch), RegistryError> {
        out.extend(view.resync(&listed.leases, &listed.unreadable));
        let watch = self
            .registry
            .watch(&self.subnets_prefix(), listed.revision + 1)
            .await?;
        info!(
            revision = listed.revision,
            leases = listed.leases.len(),
            "watching leases"
        );
        Ok((listed.revision, watch))
    }

    async fn on_event(
        &self,
        view: &mut View,
        attrs: &LeaseAttrs,
        event: Event,
        out: &mut Vec<ToDataplane>,
    ) {
        let own = view.local().lease.key;
        match event {
            Event::Put(kv) => match self.parse(&kv) {
                Some((key, _)) if key == own => {
                    if kv.value.as_slice() != attrs.to_json().as_bytes() {
                        warn!(lease = %key, "this node's lease was overwritten by someone else");
                    }
                }
                Some((_, None)) | None => {}
                Some((key, Some(attrs))) => out.extend(view.put(&Lease { key, attrs })),
            },
            Event::Delete { key } => {
                let name = key.strip_prefix(&self.subnets_prefix()).unwrap_or(&key);
                let Ok(key) = name.parse::<SubnetKey>() else {
                    return;
                };
                if key == own {
                    warn!(lease = %key, "this node's lease was deleted: acquiring one again");
                    self.reacquire(view, attrs, out).await;
                } else {
                    out.extend(view.delete(&key));
                }
            }
        }
    }

    /// Takes a lease again, the same subnet when it is free.
    async fn reacquire(&self, view: &mut View, attrs: &LeaseAttrs, out: &mut Vec<ToDataplane>) {
        let before = view.local().lease.key;
        let (lease, _) = self.acquire(view.config(), attrs, Some(before)).await;
        if lease.key != before {
            warn!(before = %before, now = %lease.key, "this node has another subnet now: pods of the old one lose their routes");
            if let Err(e) =
                self.write_subnet_file(view.config(), &view.local().underlay, &lease.key)
            {
                warn!(error = %e, "the subnet file still names the old subnet");
            }
        }
        out.extend(view.set_local_lease(lease));
    }
}

/// A listing, parsed.
#[derive(Default)]
struct Listed {
    leases: Vec<Lease>,
    unreadable: BTreeSet<SubnetKey>,
    revision: i64,
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

/// This node's lease value: its public addresses and, for vxlan, its VNI
/// and VTEP MACs (derived from its name: the same after every restart).
pub fn own_attrs(config: &NetworkConfig, underlay: &Underlay, hostname: &str) -> LeaseAttrs {
    let public_v6 = config.v6.as_ref().and(underlay.public_v6);
    match &config.backend {
        Backend::HostGw => LeaseAttrs::host_gw(underlay.public_v4, public_v6),
        Backend::Vxlan(vxlan) => {
            let data = |family| VxlanData {
                vni: vxlan.vni,
                vtep_mac: vtep_mac::derive(hostname, family),
            };
            LeaseAttrs::vxlan(
                underlay.public_v4,
                data(Family::V4),
                public_v6.map(|ip| (ip, data(Family::V6))),
            )
        }
    }
}

enum EtcdEvent {
    /// From the watch; `None`: it ended.
    Message(Option<Result<WatchMessage, RegistryError>>),
    RelistDue,
}

async fn watch_event(watching: &mut Watching) -> EtcdEvent {
    match watching {
        Watching::Watch(watch) => EtcdEvent::Message(watch.recv().await),
        Watching::Relist(at) => {
            sleep_until(*at).await;
            EtcdEvent::RelistDue
        }
    }
}

/// The stream ended, or its reopening is due.
async fn stream_event(streaming: &mut Streaming) {
    match streaming {
        Streaming::Open(stream) => stream.ended().await,
        Streaming::Reopen(at) => sleep_until(*at).await,
    }
}

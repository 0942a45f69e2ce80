//! The agent: learns this node's name from vxmgrd, gets the network
//! config and this node's lease from the subnet manager (etcd or the
//! Kubernetes API), picks the interface, writes the subnet file, and
//! streams the view of every lease to vxmgrd, following the manager's
//! changes and reopening the stream when vxmgrd comes back.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::time::{Instant, sleep_until};
use tracing::{info, warn};
use vxmgr::model::Family;
use vxmgr::wire::felix::ToDataplane;

use crate::allocate::Previous;
use crate::backoff::{Backoff, Condition, retry};
use crate::dataplane::{Dataplane, Progress, Stream};
use crate::health::Health;
use crate::host::HostNetwork;
use crate::iface::{self, IfaceSpec, Underlay};
use crate::lease::{LeaseAttrs, VxlanData};
use crate::network::{Backend, NetworkConfig};
use crate::registry::{LeaseChange, SubnetManager};
use crate::subnet::SubnetKey;
use crate::subnet_env;
use crate::view::{Local, View};
use crate::vtep_mac;

#[cfg(test)]
mod tests;

#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub subnet_file: PathBuf,
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

pub struct Agent<M> {
    manager: M,
    dataplane: Dataplane,
    host: HostNetwork,
    options: AgentOptions,
    health: Arc<Health>,
}

/// Messages in one change (a relisting, a burst of leases) after which
/// the memory they took is handed back to the system.
const LARGE_CHANGE: usize = 1_000;

/// Where the agent is with vxmgrd.
enum Streaming {
    Open(Stream, Progress),
    /// Open again at this instant and send everything.
    Reopen(Instant),
}

impl<M: SubnetManager> Agent<M> {
    /// An agent on this `host` (its interfaces as read at start-up, as
    /// flannel reads them once).
    pub fn new(
        manager: M,
        dataplane: Dataplane,
        host: HostNetwork,
        options: AgentOptions,
        health: Arc<Health>,
    ) -> Agent<M> {
        Agent {
            manager,
            dataplane,
            host,
            options,
            health,
        }
    }

    /// Runs until an error it cannot get past; stopping is done by
    /// dropping the future (the lease stays, the kernel stays with
    /// vxmgrd).
    pub async fn run(mut self) -> Result<(), AgentError> {
        let hostname = self.hostname().await;
        let config = self.manager.network_config().await;
        let underlay = iface::select(&self.options.iface, &self.host, config.v6.is_some())?;
        info!(
            interface = %underlay.interface,
            address = %underlay.address_v4,
            public_ip = %underlay.public_v4,
            public_ipv6 = ?underlay.public_v6,
            "using this interface"
        );
        let attrs = own_attrs(&config, &underlay, &hostname);
        let previous = self.previous_subnets();
        let (lease, listed) = self.manager.acquire(&config, attrs, previous).await;
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
        // after InSync removes what a stream did not declare. The stream's
        // snapshot carries them, so the listing makes no messages.
        match listed {
            LeaseChange::Resync { leases, unreadable } => {
                view.load(&leases, &unreadable);
                self.noted(&view, "resync");
            }
            other => self.apply(&mut view, other, &mut Vec::new()),
        }
        self.follow(view).await;
        Ok(())
    }

    /// vxmgrd's name for this node, waiting for vxmgrd if it is not up.
    async fn hostname(&mut self) -> String {
        let dataplane = &self.dataplane;
        let hostname = retry("waiting for vxmgrd", || dataplane.hostname()).await;
        info!(%hostname, socket = %dataplane.socket().display(), "vxmgrd's name for this node");
        hostname
    }

    /// The subnets the subnet file names: this node's before a restart,
    /// which flanneld asks for again.
    fn previous_subnets(&self) -> Previous {
        match subnet_env::read_subnets(&self.options.subnet_file) {
            Ok(subnets) => {
                let previous = Previous::from(subnets);
                if !previous.is_empty() {
                    info!(subnet = %previous, path = %self.options.subnet_file.display(), "the subnet file names this node's previous subnet");
                }
                previous
            }
            Err(e) => {
                warn!(error = %e, "the subnet file cannot be read: no previous subnet to ask for");
                Previous::default()
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

    /// Takes a change into the view, and its messages into `out`.
    fn apply(&self, view: &mut View, change: LeaseChange, out: &mut Vec<ToDataplane>) {
        let kind = match change {
            LeaseChange::Resync { leases, unreadable } => {
                out.extend(view.resync(&leases, &unreadable));
                "resync"
            }
            LeaseChange::Put(lease) => {
                out.extend(view.put(&lease));
                "put"
            }
            LeaseChange::Delete(key) => {
                out.extend(view.delete(&key));
                "delete"
            }
            LeaseChange::Local(lease) => {
                let before = view.local().lease.key;
                if lease.key != before
                    && let Err(e) =
                        self.write_subnet_file(view.config(), &view.local().underlay, &lease.key)
                {
                    warn!(error = %e, "the subnet file still names the old subnet");
                }
                out.extend(view.set_local_lease(lease));
                "local"
            }
        };
        self.noted(view, kind);
    }

    /// Health's account of a change of `kind` taken into the view.
    fn noted(&self, view: &View, kind: &'static str) {
        self.health.lease_change(kind);
        self.health.set_leases(view.remote_count());
    }

    /// Follows the manager's changes and keeps vxmgrd's view of them, for
    /// ever.
    async fn follow(&mut self, mut view: View) {
        let mut streaming = Streaming::Reopen(Instant::now());
        let mut vxmgrd = (Backoff::retries(), Condition::new("vxmgrd"));
        let mut programmed = false;
        loop {
            let mut out = Vec::new();
            // vxmgrd first: at start-up the whole view goes before the
            // watch is opened (from the listing's revision, it misses
            // nothing by waiting).
            tokio::select! {
                biased;
                event = stream_event(&mut streaming) => {
                    streaming = match (streaming, event) {
                        (Streaming::Open(stream, _), Some(Progress::InSync)) => {
                            self.health.set_ready(true);
                            if !programmed {
                                programmed = true;
                                self.manager.programmed().await;
                            }
                            Streaming::Open(stream, Progress::InSync)
                        }
                        (Streaming::Open(..), _) => {
                            self.health.set_ready(false);
                            Streaming::Reopen(Instant::now())
                        }
                        (Streaming::Reopen(_), _) => match self.reopen(&view).await {
                            Ok(stream) => {
                                // What making and sending the whole view
                                // freed (its messages, the listing) goes
                                // back to the system, not kept at the peak.
                                vxmgr::daemon::release_free_memory();
                                vxmgrd.0.reset();
                                vxmgrd.1.ok();
                                info!(leases = view.remote_count(), "sent vxmgrd the whole view");
                                Streaming::Open(stream, Progress::Open)
                            }
                            Err(e) => {
                                let wait = vxmgrd.0.next();
                                vxmgrd.1.failed(&e, wait);
                                Streaming::Reopen(Instant::now() + wait)
                            }
                        },
                    };
                }
                due = self.manager.due() => {
                    for change in self.manager.handle(due).await {
                        self.apply(&mut view, change, &mut out);
                    }
                }
            }
            if out.is_empty() {
                continue;
            }
            let large = out.len() >= LARGE_CHANGE;
            if let Streaming::Open(stream, _) = &mut streaming {
                if let Ok(n) = stream.send(out).await {
                    self.health.sent(n);
                    if large {
                        vxmgr::daemon::release_free_memory();
                    }
                } else {
                    // The whole view goes again when the stream is back.
                    self.health.set_ready(false);
                    streaming = Streaming::Reopen(Instant::now());
                }
            }
        }
    }

    /// A new stream, carrying the whole view.
    async fn reopen(&mut self, view: &View) -> Result<Stream, String> {
        let mut stream = self.dataplane.open().await.map_err(|e| e.to_string())?;
        let n = stream
            .send(view.snapshot())
            .await
            .map_err(|e| e.to_string())?;
        self.health.stream_opened();
        self.health.sent(n);
        Ok(stream)
    }
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

/// What happened to the stream (`None`: its reopening is due).
async fn stream_event(streaming: &mut Streaming) -> Option<Progress> {
    match streaming {
        Streaming::Open(stream, seen) => Some(stream.progressed(*seen).await),
        Streaming::Reopen(at) => {
            // Due now: at once, not at the timer's next tick.
            if *at > Instant::now() {
                sleep_until(*at).await;
            }
            None
        }
    }
}

//! What calc-flannel counts for Prometheus and whether it is ready, served
//! over HTTP by vxmgr's probe listener (`--healthz-port`). Ready: vxmgrd
//! has programmed this node's view of the network from the current stream.

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use vxmgr::metrics::http::Probes;

type Labels = [(&'static str, &'static str); 1];

pub struct Health {
    registry: Registry,
    lease_changes: Family<Labels, Counter>,
    leases: Gauge,
    messages: Counter,
    streams: Counter,
    ready: Gauge,
}

impl Default for Health {
    fn default() -> Health {
        let mut health = Health {
            registry: Registry::with_prefix("calc_flannel"),
            lease_changes: Family::default(),
            leases: Gauge::default(),
            messages: Counter::default(),
            streams: Counter::default(),
            ready: Gauge::default(),
        };
        let registry = &mut health.registry;
        registry.register(
            "lease_changes",
            "Lease changes taken from the subnet manager, by kind (put, delete, resync, local)",
            health.lease_changes.clone(),
        );
        registry.register(
            "leases",
            "Other nodes' leases known, usable or not",
            health.leases.clone(),
        );
        registry.register(
            "messages_sent",
            "Messages sent to vxmgrd",
            health.messages.clone(),
        );
        registry.register(
            "streams_opened",
            "Sync streams opened to vxmgrd (each starts with the whole view)",
            health.streams.clone(),
        );
        registry.register(
            "ready",
            "1 while vxmgrd has programmed this node's view from the current stream",
            health.ready.clone(),
        );
        health
    }
}

impl Health {
    pub fn lease_change(&self, kind: &'static str) {
        self.lease_changes.get_or_create(&[("kind", kind)]).inc();
    }

    pub fn set_leases(&self, n: usize) {
        self.leases.set(n as i64);
    }

    pub fn sent(&self, messages: usize) {
        self.messages.inc_by(messages as u64);
    }

    pub fn stream_opened(&self) {
        self.streams.inc();
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(ready.into());
    }
}

/// The probe listener's view of [`Health`].
#[derive(Clone)]
pub struct HealthProbes(pub Arc<Health>);

impl Probes for HealthProbes {
    async fn metrics(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.0.registry).expect("writing to a String cannot fail");
        out
    }

    fn not_ready(&self) -> Option<&'static str> {
        (self.0.ready.get() != 1)
            .then_some("vxmgrd has not programmed this node's view of the network yet")
    }
}

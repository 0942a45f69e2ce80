//! What vxmgrd counts for Prometheus, and the opt-in HTTP listener that
//! serves it with liveness and readiness. The daemon's tasks record into
//! one shared [`Metrics`]; the manager stays free of it.

pub mod backend;
pub mod http;

use std::time::{Duration, SystemTime};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

use crate::model::Family;
use crate::reconciler::census::ObjectCount;
use crate::wire::felix::ToDataplane;
use crate::wire::felix::to_dataplane::Payload;
use crate::wire::vxmgr::v1::{BatchResult, BatchStatus};

type Labels<const N: usize> = [(&'static str, &'static str); N];

/// Apply times range from tens of microseconds (one route) to tens of
/// seconds (a cold start of a large cluster).
const APPLY_BUCKETS: [f64; 13] = [
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0,
];
/// A resync dumps and compares every object: milliseconds to seconds.
const RESYNC_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

pub struct Metrics {
    registry: Registry,
    batches: MetricFamily<Labels<1>, Counter>,
    messages: MetricFamily<Labels<2>, Counter>,
    apply_duration: Histogram,
    last_batch: Gauge<f64, AtomicU64>,
    kernel_operations: MetricFamily<Labels<3>, Counter>,
    programmed: MetricFamily<Labels<2>, Gauge>,
    failing: Gauge,
    contested: Gauge,
    repairs: MetricFamily<Labels<1>, Counter>,
    resyncs: MetricFamily<Labels<2>, Counter>,
    resync_duration: Histogram,
    stream_connected: Gauge,
    stream_in_sync: Gauge,
    ready: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("vxmgr"),
            batches: MetricFamily::default(),
            messages: MetricFamily::default(),
            apply_duration: Histogram::new(APPLY_BUCKETS),
            last_batch: Gauge::default(),
            kernel_operations: MetricFamily::default(),
            programmed: MetricFamily::default(),
            failing: Gauge::default(),
            contested: Gauge::default(),
            repairs: MetricFamily::default(),
            resyncs: MetricFamily::default(),
            resync_duration: Histogram::new(RESYNC_BUCKETS),
            stream_connected: Gauge::default(),
            stream_in_sync: Gauge::default(),
            ready: Gauge::default(),
        };
        let registry = &mut m.registry;
        registry.register(
            "build",
            "vxmgrd's version",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        registry.register(
            "batches",
            "Batches applied, by result (ok, partial, failed)",
            m.batches.clone(),
        );
        registry.register(
            "messages",
            "Calc stream messages, by payload type and outcome (applied, ignored, rejected)",
            m.messages.clone(),
        );
        registry.register_with_unit(
            "batch_apply_duration",
            "Time the kernel took to apply a batch",
            Unit::Seconds,
            m.apply_duration.clone(),
        );
        registry.register_with_unit(
            "last_batch_timestamp",
            "When the last batch was applied (Unix time)",
            Unit::Seconds,
            m.last_batch.clone(),
        );
        registry.register(
            "kernel_operations",
            "Kernel operations, by object kind, operation and result (ok, error)",
            m.kernel_operations.clone(),
        );
        registry.register(
            "programmed_objects",
            "Objects of vxmgr's in the kernel, by kind and family, as last programmed or read",
            m.programmed.clone(),
        );
        registry.register(
            "failing_objects",
            "Objects whose last kernel operation failed (being retried)",
            m.failing.clone(),
        );
        registry.register(
            "contested_objects",
            "Objects another agent keeps changing (vxmgr backs off)",
            m.contested.clone(),
        );
        registry.register(
            "repairs",
            "Objects repaired outside batches, by cause (notification, resync, device_check, retry)",
            m.repairs.clone(),
        );
        registry.register(
            "resyncs",
            "Full resyncs with the kernel, by trigger (startup, periodic) and result (ok, error)",
            m.resyncs.clone(),
        );
        registry.register_with_unit(
            "resync_duration",
            "Time a full resync with the kernel took",
            Unit::Seconds,
            m.resync_duration.clone(),
        );
        registry.register(
            "calc_stream_connected",
            "1 while a calc process holds the Sync stream",
            m.stream_connected.clone(),
        );
        registry.register(
            "calc_stream_in_sync",
            "1 once the current calc stream has sent its InSync",
            m.stream_in_sync.clone(),
        );
        registry.register(
            "ready",
            "1 while gRPC health reports vxmgr.v1.Dataplane SERVING",
            m.ready.clone(),
        );
        m
    }

    /// The Prometheus (OpenMetrics) text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    pub fn batch_applied(&self, status: &BatchStatus, apply_time: Duration) {
        let result = match BatchResult::try_from(status.result) {
            Ok(BatchResult::Ok) => "ok",
            Ok(BatchResult::Partial) => "partial",
            _ => "failed",
        };
        self.batches.get_or_create(&[("result", result)]).inc();
        self.apply_duration.observe(apply_time.as_secs_f64());
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_batch.set(now.as_secs_f64());
    }

    pub fn messages(&self, counts: &mut MessageCounts) {
        for (kind, outcomes) in MessageCounts::KINDS.iter().zip(&mut counts.0) {
            for (outcome, count) in MessageCounts::OUTCOMES.iter().zip(outcomes.iter_mut()) {
                if *count > 0 {
                    self.messages
                        .get_or_create(&[("type", kind), ("outcome", outcome)])
                        .inc_by(*count);
                    *count = 0;
                }
            }
        }
    }

    pub fn kernel_operations(&self, kind: &'static str, op: &'static str, ok: bool, count: u64) {
        let result = if ok { "ok" } else { "error" };
        self.kernel_operations
            .get_or_create(&[("kind", kind), ("op", op), ("result", result)])
            .inc_by(count);
    }

    pub fn programmed(&self, counts: &[ObjectCount]) {
        for c in counts {
            let family = match c.family {
                Family::V4 => "ipv4",
                Family::V6 => "ipv6",
            };
            self.programmed
                .get_or_create(&[("kind", c.kind), ("family", family)])
                .set(c.count as i64);
        }
    }

    pub fn object_health(&self, failing: usize, contested: usize) {
        self.failing.set(failing as i64);
        self.contested.set(contested as i64);
    }

    pub fn repaired(&self, cause: &'static str, objects: u32) {
        if objects > 0 {
            self.repairs
                .get_or_create(&[("cause", cause)])
                .inc_by(objects.into());
        }
    }

    pub fn resync(&self, trigger: &'static str, ok: bool, took: Duration) {
        let result = if ok { "ok" } else { "error" };
        self.resyncs
            .get_or_create(&[("trigger", trigger), ("result", result)])
            .inc();
        self.resync_duration.observe(took.as_secs_f64());
    }

    pub fn stream(&self, connected: bool, in_sync: bool) {
        self.stream_connected.set(connected.into());
        self.stream_in_sync.set(in_sync.into());
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(ready.into());
    }

    pub fn is_ready(&self) -> bool {
        self.ready.get() == 1
    }
}

/// Messages counted by payload type and outcome while a batch is open,
/// added to the metrics when it closes (a map lookup per message would
/// cost more than handling most messages).
#[derive(Default)]
pub struct MessageCounts([[u64; 3]; 9]);

#[derive(Clone, Copy)]
pub enum MessageOutcome {
    Applied = 0,
    Ignored = 1,
    Rejected = 2,
}

impl MessageCounts {
    const KINDS: [&'static str; 9] = [
        "config_update",
        "in_sync",
        "route_update",
        "route_remove",
        "vtep_update",
        "vtep_remove",
        "ipam_pool_update",
        "ipam_pool_remove",
        "unknown",
    ];
    const OUTCOMES: [&'static str; 3] = ["applied", "ignored", "rejected"];

    /// The payload type's index in `KINDS`.
    pub fn kind_of(msg: &ToDataplane) -> usize {
        match msg.payload {
            Some(Payload::ConfigUpdate(_)) => 0,
            Some(Payload::InSync(_)) => 1,
            Some(Payload::RouteUpdate(_)) => 2,
            Some(Payload::RouteRemove(_)) => 3,
            Some(Payload::VtepUpdate(_)) => 4,
            Some(Payload::VtepRemove(_)) => 5,
            Some(Payload::IpamPoolUpdate(_)) => 6,
            Some(Payload::IpamPoolRemove(_)) => 7,
            // Payloads this build does not know (skipped while decoding).
            None => 8,
        }
    }

    pub fn add(&mut self, kind: usize, outcome: MessageOutcome) {
        self.0[kind][outcome as usize] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_with_prometheus_conventions() {
        let m = Metrics::new();
        let status = BatchStatus {
            result: BatchResult::Partial as i32,
            ..BatchStatus::default()
        };
        m.batch_applied(&status, Duration::from_millis(3));
        let mut counts = MessageCounts::default();
        counts.add(2, MessageOutcome::Applied);
        counts.add(2, MessageOutcome::Applied);
        counts.add(4, MessageOutcome::Rejected);
        m.messages(&mut counts);
        m.kernel_operations("route", "replace", true, 1);
        m.programmed(&[ObjectCount {
            kind: "route",
            family: Family::V6,
            count: 3,
        }]);
        m.repaired("notification", 2);
        m.resync("startup", true, Duration::from_millis(20));
        let text = m.encode();
        for line in [
            "vxmgr_build_info{version=\"0.1.0\"} 1",
            "vxmgr_batches_total{result=\"partial\"} 1",
            "vxmgr_messages_total{type=\"route_update\",outcome=\"applied\"} 2",
            "vxmgr_messages_total{type=\"vtep_update\",outcome=\"rejected\"} 1",
            "vxmgr_batch_apply_duration_seconds_bucket{le=\"0.005\"} 1",
            "vxmgr_batch_apply_duration_seconds_count 1",
            "vxmgr_kernel_operations_total{kind=\"route\",op=\"replace\",result=\"ok\"} 1",
            "vxmgr_programmed_objects{kind=\"route\",family=\"ipv6\"} 3",
            "vxmgr_repairs_total{cause=\"notification\"} 2",
            "vxmgr_resyncs_total{trigger=\"startup\",result=\"ok\"} 1",
            "vxmgr_resync_duration_seconds_count 1",
            "# TYPE vxmgr_last_batch_timestamp_seconds gauge",
            "vxmgr_ready 0",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
        assert!(
            !text.contains("outcome=\"ignored\""),
            "no zero counts added"
        );
        // The counts were drained: handing them in again adds nothing.
        m.messages(&mut counts);
        assert!(
            m.encode()
                .contains("type=\"route_update\",outcome=\"applied\"} 2\n")
        );
    }
}

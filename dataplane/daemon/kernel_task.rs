//! The task that owns the kernel backend: applies batches, retries failures,
//! re-checks the devices and runs the periodic resync.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio::time::{MissedTickBehavior, interval_at, sleep_until};
use tracing::{info, warn};

use super::batch::Batch;
use super::heap;
use crate::desired::ParentInterface;
use crate::kernel::KernelBackend;
use crate::metrics::Metrics;
use crate::metrics::http::CensusQuery;
use crate::reconciler::{ApplyRequest, FirewallStatus, ObjectError, Reconciler, Report};

pub enum KernelCommand {
    /// A batch (or, with `batch: None`, an internal change such as a parent
    /// interface found) to program.
    Apply {
        /// Boxed: a delta is several times the size of the other commands.
        request: Box<ApplyRequest>,
        batch: Option<Batch>,
        refresh_interval: Option<Duration>,
    },
    /// A new calc stream: it declares everything again.
    BeginStream,
    /// Which interfaces hold these parent addresses (per family)?
    FindParents {
        parent_ips: [Option<IpAddr>; 2],
        reply: oneshot::Sender<[Option<ParentInterface>; 2]>,
    },
}

pub enum KernelEvent {
    Applied {
        batch: Option<Batch>,
        /// The batch was applied after the stream's InSync.
        in_sync: bool,
        report: Report,
        apply_time: Duration,
        objects: ObjectHealth,
    },
    /// A retry, device check or resync.
    Background {
        report: Report,
        objects: ObjectHealth,
    },
}

pub struct KernelTaskOptions {
    pub device_check_interval: Duration,
    pub legacy_poll_interval: Option<Duration>,
    pub refresh_interval: Option<Duration>,
    pub metrics: Arc<Metrics>,
}

/// Runs until the command channel closes.
pub async fn run<B: KernelBackend>(
    mut reconciler: Reconciler<B>,
    options: KernelTaskOptions,
    mut commands: mpsc::Receiver<KernelCommand>,
    events: mpsc::Sender<KernelEvent>,
    mut census: mpsc::Receiver<CensusQuery>,
) {
    let metrics = options.metrics;
    let background = |reconciler: &Reconciler<B>, report: Report| KernelEvent::Background {
        objects: ObjectHealth::of(reconciler),
        report,
    };
    // Subscribe before the first dump, so no change falls between them.
    let mut notifications = match reconciler.watch() {
        Ok(rx) => Some(rx),
        Err(e) => {
            warn!(error = %e, "no kernel notifications: drift is repaired by the periodic resync only");
            None
        }
    };
    // A failed resync is logged and retried by the reconciler.
    if let Ok(report) = resync(&mut reconciler, &metrics, "startup").await {
        info!(
            added = report.added,
            changed = report.changed,
            "start-up resync: adopted the kernel's state"
        );
        let _ = events.send(background(&reconciler, report)).await;
    }
    let mut device_check = interval_at(
        tokio::time::Instant::now() + options.device_check_interval,
        options.device_check_interval,
    );
    device_check.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut legacy_poll = options.legacy_poll_interval.map(|every| {
        let mut poll = interval_at(tokio::time::Instant::now() + every, every);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        poll
    });
    let mut releaser = heap::Releaser::default();
    let mut refresh_interval = options.refresh_interval;
    let mut next_refresh = refresh_interval.map(|d| Instant::now() + d);
    loop {
        let retry_at = reconciler.next_retry();
        let idle_release_at = releaser.idle_release_at();
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(KernelCommand::BeginStream) => reconciler.begin_stream(),
                Some(KernelCommand::FindParents { parent_ips, reply }) => {
                    let (_, parents) = reconciler.find_parents(parent_ips).await;
                    let _ = reply.send(parents);
                }
                Some(KernelCommand::Apply { request, batch, refresh_interval: wanted }) => {
                    if wanted != refresh_interval {
                        refresh_interval = wanted;
                        next_refresh = refresh_interval.map(|d| Instant::now() + d);
                    }
                    let started = Instant::now();
                    let in_sync = request.in_sync;
                    let report = reconciler.apply(*request).await;
                    releaser.count(report.operations, Instant::now());
                    let event = KernelEvent::Applied {
                        batch,
                        in_sync,
                        report,
                        apply_time: started.elapsed(),
                        objects: ObjectHealth::of(&reconciler),
                    };
                    if events.send(event).await.is_err() {
                        return;
                    }
                }
            },
            Some(reply) = census.recv() => {
                let _ = reply.send(reconciler.census());
            }
            notification = recv(&mut notifications), if notifications.is_some() => {
                let Some(notification) = notification else {
                    warn!("kernel notifications stopped: drift is repaired by the periodic resync only");
                    notifications = None;
                    continue;
                };
                let now = Instant::now();
                let mut due = reconciler.notice(notification, now);
                let mut burst = 1;
                // Take the whole burst in before repairing once.
                while let Some(more) = notifications.as_mut().and_then(|rx| rx.try_recv().ok()) {
                    due |= reconciler.notice(more, now);
                    burst += 1;
                }
                // The kernel's echoes of a large batch are as large.
                releaser.count(burst, now);
                if !due {
                    continue;
                }
                if let Ok(report) = reconciler.repair(now).await {
                    metrics.repaired("notification", changes(&report));
                    if report.operations > 0 {
                        info!(added = report.added, changed = report.changed, removed = report.removed, "repaired changes made by others");
                    }
                    if events.send(background(&reconciler, report)).await.is_err() {
                        return;
                    }
                }
            }
            _ = sleep_until(retry_at.unwrap_or_else(Instant::now).into()), if retry_at.is_some() => {
                let report = reconciler.retry(Instant::now()).await;
                metrics.repaired("retry", changes(&report));
                if events.send(background(&reconciler, report)).await.is_err() {
                    return;
                }
            }
            _ = sleep_until(idle_release_at.unwrap_or_else(Instant::now).into()), if idle_release_at.is_some() => {
                releaser.release_when_idle();
            }
            _ = tick(&mut legacy_poll), if legacy_poll.is_some() => {
                if !reconciler.poll_legacy_iptables().await {
                    continue;
                }
                if let Ok(report) = reconciler.repair(Instant::now()).await {
                    metrics.repaired("legacy_iptables_poll", changes(&report));
                    if events.send(background(&reconciler, report)).await.is_err() {
                        return;
                    }
                }
            }
            _ = device_check.tick() => {
                let report = reconciler.check_devices().await;
                metrics.repaired("device_check", changes(&report));
                if events.send(background(&reconciler, report)).await.is_err() {
                    return;
                }
            }
            _ = sleep_until(next_refresh.unwrap_or_else(Instant::now).into()), if next_refresh.is_some() => {
                next_refresh = refresh_interval.map(|d| Instant::now() + d);
                if let Ok(report) = resync(&mut reconciler, &metrics, "periodic").await {
                    metrics.repaired("resync", changes(&report));
                    if report.operations > 0 {
                        info!(added = report.added, changed = report.changed, removed = report.removed, "periodic resync repaired drift");
                    }
                    if events.send(background(&reconciler, report)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// A full resync, timed and counted.
async fn resync<B: KernelBackend>(
    reconciler: &mut Reconciler<B>,
    metrics: &Metrics,
    trigger: &'static str,
) -> Result<Report, crate::kernel::KernelError> {
    let started = Instant::now();
    let result = reconciler.resync().await;
    metrics.resync(trigger, result.is_ok(), started.elapsed());
    // A resync holds a dump of every object: large whatever it changed.
    heap::release_free_memory();
    result
}

fn changes(report: &Report) -> u32 {
    report.added + report.changed + report.removed
}

async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(interval) => _ = interval.tick().await,
        None => std::future::pending().await,
    }
}

async fn recv<T>(rx: &mut Option<mpsc::UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Objects not as they should be in the kernel, for GetState and health.
#[derive(Clone, Debug, Default)]
pub struct ObjectHealth {
    /// Their last operation failed; they are being retried.
    pub failing: Vec<ObjectError>,
    /// Another agent keeps changing them; vxmgr backs off.
    pub contested: Vec<ObjectError>,
    pub firewall: FirewallStatus,
}

impl ObjectHealth {
    fn of<B: KernelBackend>(reconciler: &Reconciler<B>) -> ObjectHealth {
        ObjectHealth {
            failing: reconciler.failing(),
            contested: reconciler.contested(Instant::now()),
            firewall: reconciler.firewall_status(),
        }
    }

    pub fn is_clean(&self) -> bool {
        self.failing.is_empty() && self.contested.is_empty()
    }
}

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
use crate::kernel::objects::Notification;
use crate::kernel::watch::Watch;
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
    // Subscribe before the first dump, so no change falls between them.
    let watch = match reconciler.watch() {
        Ok(watch) => Some(watch),
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
    let mut task = Task {
        reconciler,
        watch,
        releaser: heap::Releaser::default(),
        metrics,
        events,
    };
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
    let mut refresh_interval = options.refresh_interval;
    let mut next_refresh = refresh_interval.map(|d| Instant::now() + d);
    loop {
        let retry_at = task.reconciler.next_retry();
        let idle_release_at = task.releaser.idle_release_at();
        // Every arm that reads or changes the kernel takes in what the kernel
        // has reported first (`Task::catch_up`).
        let open = tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(KernelCommand::BeginStream) => {
                    task.reconciler.begin_stream();
                    true
                }
                Some(KernelCommand::FindParents { parent_ips, reply }) => {
                    let open = task.catch_up(None).await;
                    let (_, parents) = task.reconciler.find_parents(parent_ips).await;
                    let _ = reply.send(parents);
                    open
                }
                Some(KernelCommand::Apply { request, batch, refresh_interval: wanted }) => {
                    if wanted != refresh_interval {
                        refresh_interval = wanted;
                        next_refresh = refresh_interval.map(|d| Instant::now() + d);
                    }
                    task.catch_up(None).await && task.apply(*request, batch).await
                }
            },
            Some(reply) = census.recv() => {
                let _ = reply.send(task.reconciler.census());
                true
            }
            notification = recv(&mut task.watch), if task.watch.is_some() => match notification {
                Some(notification) => task.catch_up(Some(notification)).await,
                None => {
                    warn!("kernel notifications stopped: drift is repaired by the periodic resync only");
                    task.watch = None;
                    true
                }
            },
            _ = sleep_until(retry_at.unwrap_or_else(Instant::now).into()), if retry_at.is_some() => {
                task.catch_up(None).await && {
                    let report = task.reconciler.retry(Instant::now()).await;
                    task.repaired("retry", report, None).await
                }
            }
            _ = sleep_until(idle_release_at.unwrap_or_else(Instant::now).into()), if idle_release_at.is_some() => {
                task.releaser.release_when_idle();
                true
            }
            _ = tick(&mut legacy_poll), if legacy_poll.is_some() => {
                task.catch_up(None).await && task.poll_legacy_iptables().await
            }
            _ = device_check.tick() => {
                task.catch_up(None).await && {
                    let report = task.reconciler.check_devices().await;
                    task.repaired("device_check", report, None).await
                }
            }
            _ = sleep_until(next_refresh.unwrap_or_else(Instant::now).into()), if next_refresh.is_some() => {
                next_refresh = refresh_interval.map(|d| Instant::now() + d);
                task.catch_up(None).await && task.periodic_resync().await
            }
        };
        if !open {
            return;
        }
    }
}

/// What the kernel task owns besides its timers.
struct Task<B: KernelBackend> {
    reconciler: Reconciler<B>,
    watch: Option<Watch>,
    releaser: heap::Releaser,
    metrics: Arc<Metrics>,
    events: mpsc::Sender<KernelEvent>,
}

impl<B: KernelBackend> Task<B> {
    /// Takes in every notification the kernel has sent until now, `first`
    /// first, and repairs what they report. Taken in after a later change of
    /// vxmgr's, the kernel's echo of an earlier one would pass for the
    /// kernel's state (see `Watch`). False once nothing receives the
    /// task's events.
    async fn catch_up(&mut self, first: Option<Notification>) -> bool {
        let Some(watch) = &mut self.watch else {
            return true;
        };
        watch.caught_up().await;
        let now = Instant::now();
        let (mut due, mut taken) = (false, 0);
        for notification in first
            .into_iter()
            .chain(std::iter::from_fn(|| watch.try_recv()))
        {
            due |= self.reconciler.notice(notification, now);
            taken += 1;
        }
        // The kernel's echoes of a large batch are as large.
        self.releaser.count(taken, now);
        if !due {
            return true;
        }
        match self.reconciler.repair(now).await {
            Ok(report) => {
                self.repaired(
                    "notification",
                    report,
                    Some("repaired changes made by others"),
                )
                .await
            }
            Err(_) => true,
        }
    }

    async fn apply(&mut self, request: ApplyRequest, batch: Option<Batch>) -> bool {
        let started = Instant::now();
        let in_sync = request.in_sync;
        let report = self.reconciler.apply(request).await;
        self.releaser.count(report.operations, Instant::now());
        let event = KernelEvent::Applied {
            batch,
            in_sync,
            report,
            apply_time: started.elapsed(),
            objects: ObjectHealth::of(&self.reconciler),
        };
        self.events.send(event).await.is_ok()
    }

    async fn poll_legacy_iptables(&mut self) -> bool {
        if !self.reconciler.poll_legacy_iptables().await {
            return true;
        }
        match self.reconciler.repair(Instant::now()).await {
            Ok(report) => self.repaired("legacy_iptables_poll", report, None).await,
            Err(_) => true,
        }
    }

    async fn periodic_resync(&mut self) -> bool {
        match resync(&mut self.reconciler, &self.metrics, "periodic").await {
            Ok(report) => {
                self.repaired("resync", report, Some("periodic resync repaired drift"))
                    .await
            }
            Err(_) => true,
        }
    }

    /// Counts what a repair changed under `cause`, logs it as `logged` if
    /// it changed anything, and tells the engine; false once it is gone.
    async fn repaired(&self, cause: &'static str, report: Report, logged: Option<&str>) -> bool {
        self.metrics.repaired(cause, changes(&report));
        if let Some(message) = logged.filter(|_| report.operations > 0) {
            info!(
                added = report.added,
                changed = report.changed,
                removed = report.removed,
                "{message}"
            );
        }
        self.events
            .send(background(&self.reconciler, report))
            .await
            .is_ok()
    }
}

fn background<B: KernelBackend>(reconciler: &Reconciler<B>, report: Report) -> KernelEvent {
    KernelEvent::Background {
        objects: ObjectHealth::of(reconciler),
        report,
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

async fn recv(watch: &mut Option<Watch>) -> Option<Notification> {
    match watch {
        Some(watch) => watch.recv().await,
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

//! The manager task: takes the active stream's messages into the manager,
//! closes a batch once the stream has nothing more waiting and the kernel
//! task is free (CompleteDeferredWork), hands the delta to the kernel task, and reports each batch, heartbeats and
//! DataplaneInSync back to the stream. It also answers GetState, so reads
//! never wait for the kernel.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tokio::time::{MissedTickBehavior, interval, sleep_until};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{debug, info, warn};

use super::batch::{Batch, Numbering};
use super::kernel_task::{KernelCommand, KernelEvent, ObjectHealth};
use crate::calc_source::responses::Responder;
use crate::calc_source::{EngineInput, Incoming};
use crate::manager::{Manager, Outcome};
use crate::metrics::{MessageCounts, MessageOutcome, Metrics};
use crate::model::{Family, Update};
use crate::reconciler::{ApplyRequest, ObjectError};
use crate::server::StateQuery;
use crate::server::state::{dataplane_state, firewall_rules};
use crate::wire::felix::{DataplaneInSync, ProcessStatusUpdate};
use crate::wire::vxmgr::v1::{BatchStatus, DataplaneState, sync_response};

/// The gRPC service name whose health follows the dataplane.
pub const SERVICE_NAME: &str = "vxmgr.v1.Dataplane";

pub struct EngineOptions {
    /// The longest a batch stays open while messages keep coming.
    pub batch_interval: Duration,
    pub heartbeat_interval: Duration,
    pub metrics: Arc<Metrics>,
}

/// The active stream.
struct Stream {
    id: u64,
    responder: Option<Responder>,
    numbering: Numbering,
}

struct Engine {
    manager: Manager,
    kernel: mpsc::Sender<KernelCommand>,
    health: HealthReporter,
    /// What `health` says; the daemon starts NOT_SERVING.
    serving: bool,
    stream: Option<Stream>,
    open: Option<(Batch, Instant)>,
    /// The manager has changes not caused by a message (parent interface).
    internal_dirty: bool,
    /// The parent addresses last looked up in the kernel.
    resolved_parent_ips: [Option<std::net::IpAddr>; 2],
    apply_in_flight: bool,
    last_batch: Option<BatchStatus>,
    objects: ObjectHealth,
    /// A batch of the latest stream applied after its InSync. Kept when the
    /// stream ends: a client that half-closes right after InSync still
    /// brings the dataplane in sync.
    in_sync_applied: bool,
    /// The latest stream was told DataplaneInSync (or it would have been,
    /// had it still been open).
    dataplane_in_sync_sent: bool,
    /// Messages of the open batch, by type and outcome.
    message_counts: MessageCounts,
    started: Instant,
    options: EngineOptions,
    queries: mpsc::Receiver<StateQuery>,
}

pub async fn run(
    manager: Manager,
    options: EngineOptions,
    mut inputs: mpsc::Receiver<EngineInput>,
    queries: mpsc::Receiver<StateQuery>,
    kernel: mpsc::Sender<KernelCommand>,
    mut events: mpsc::Receiver<KernelEvent>,
    health: HealthReporter,
) {
    let mut heartbeat = interval(options.heartbeat_interval);
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut engine = Engine {
        manager,
        kernel,
        health,
        serving: false,
        stream: None,
        open: None,
        internal_dirty: false,
        resolved_parent_ips: [None, None],
        apply_in_flight: false,
        last_batch: None,
        objects: ObjectHealth::default(),
        in_sync_applied: false,
        dataplane_in_sync_sent: false,
        message_counts: MessageCounts::default(),
        started: Instant::now(),
        options,
        queries,
    };
    loop {
        let deadline = engine.open.as_ref().map(|(_, d)| *d);
        let kernel_free = !engine.apply_in_flight;
        let work_waiting = engine.internal_dirty || deadline.is_some();
        tokio::select! {
            biased;
            event = events.recv() => match event {
                Some(event) => engine.on_kernel_event(event).await,
                None => return,
            },
            // A stream that never pauses still gets a status every batch
            // interval.
            _ = sleep_until(deadline.unwrap_or_else(Instant::now).into()), if kernel_free && deadline.is_some() => {
                engine.flush().await;
            }
            input = inputs.recv() => {
                let input = input.unwrap_or(EngineInput::Shutdown);
                if !engine.on_input(input, &mut events).await {
                    return;
                }
            }
            // After the inputs: a query sees every message sent before it.
            Some(reply) = engine.queries.recv() => engine.answer(reply),
            // The stream has nothing more waiting and the kernel is free:
            // CompleteDeferredWork now. While an apply is in flight, what
            // arrives gathers into the next batch.
            _ = std::future::ready(()), if kernel_free && work_waiting => engine.flush().await,
            _ = heartbeat.tick() => engine.heartbeat(),
        }
    }
}

impl Engine {
    /// Returns false once the engine should stop.
    async fn on_input(
        &mut self,
        input: EngineInput,
        events: &mut mpsc::Receiver<KernelEvent>,
    ) -> bool {
        match input {
            EngineInput::StreamStarted {
                id,
                peer,
                responder,
            } => {
                info!(stream = id, %peer, "calc stream started: resyncing");
                // The previous stream's last messages still apply first.
                if self.open.is_some() {
                    self.wait_for_kernel(events).await;
                    self.flush().await;
                }
                self.wait_for_kernel(events).await;
                self.manager = self.manager.fresh();
                self.internal_dirty = false;
                let _ = self.kernel.send(KernelCommand::BeginStream).await;
                self.stream = Some(Stream {
                    id,
                    responder: Some(responder),
                    numbering: Numbering::default(),
                });
                self.in_sync_applied = false;
                self.dataplane_in_sync_sent = false;
                self.options.metrics.stream(true, false);
            }
            EngineInput::Messages { id, messages } => {
                for msg in messages {
                    self.on_message(id, msg, events).await;
                }
            }
            EngineInput::StreamEnded { id } => {
                if self.stream.as_ref().is_some_and(|s| s.id == id) {
                    info!(
                        stream = id,
                        "calc stream ended; kernel state stays as it is"
                    );
                    self.stream = None;
                    self.options.metrics.stream(false, self.manager.in_sync());
                    self.close_batch_now();
                }
            }
            EngineInput::Shutdown => {
                // Apply what was received, then stop.
                self.close_batch_now();
                self.wait_for_kernel(events).await;
                if self.open.is_some() {
                    self.flush().await;
                    self.wait_for_kernel(events).await;
                }
                return false;
            }
        }
        true
    }

    async fn on_message(
        &mut self,
        id: u64,
        incoming: Incoming,
        events: &mut mpsc::Receiver<KernelEvent>,
    ) {
        let Some(stream) = self.stream.as_mut().filter(|s| s.id == id) else {
            return;
        };
        let sequence = stream.numbering.number(incoming.sent_sequence());
        let responder = stream.responder.clone();
        // A status covers a run of consecutive numbers: a message whose
        // number does not follow on (a client that starts counting again)
        // closes the batch before it.
        if self
            .open
            .as_ref()
            .is_some_and(|(b, _)| !b.follows(sequence))
        {
            self.wait_for_kernel(events).await;
            self.flush().await;
        }
        let (batch, _) = self.open.get_or_insert_with(|| {
            (
                Batch::new(id, responder),
                Instant::now() + self.options.batch_interval,
            )
        });
        batch.add(sequence);
        let msg = match incoming {
            Incoming::Message(msg) => msg,
            Incoming::Refused { reason, .. } => {
                warn!(sequence, %reason, "message refused");
                batch.reject(sequence, reason);
                return;
            }
        };
        let kind = MessageCounts::kind_of(&msg);
        let outcome = match Update::from_message(msg).and_then(|u| match u {
            Some(u) => self.manager.on_update(u),
            None => Ok(Outcome::Ignored),
        }) {
            Ok(Outcome::Applied) => MessageOutcome::Applied,
            Ok(Outcome::Ignored) => {
                batch.ignored += 1;
                MessageOutcome::Ignored
            }
            Err(rejection) => {
                debug!(sequence, reason = %rejection, "message rejected");
                batch.reject(sequence, rejection.0);
                MessageOutcome::Rejected
            }
        };
        self.message_counts.add(kind, outcome);
    }

    /// Closes the open batch at once (stream end, new stream).
    fn close_batch_now(&mut self) {
        if let Some((_, deadline)) = &mut self.open {
            *deadline = Instant::now();
        }
    }

    /// Waits for the apply in flight, handling its report.
    async fn wait_for_kernel(&mut self, events: &mut mpsc::Receiver<KernelEvent>) {
        while self.apply_in_flight {
            let Some(event) = self.answering_queries(events.recv()).await else {
                return;
            };
            self.on_kernel_event(event).await;
        }
    }

    /// Awaits `until` (an answer from the kernel task), answering GetState
    /// meanwhile with the state as it stands.
    async fn answering_queries<T>(&mut self, until: impl Future<Output = T>) -> T {
        let mut until = std::pin::pin!(until);
        loop {
            tokio::select! {
                out = &mut until => return out,
                Some(reply) = self.queries.recv() => self.answer(reply),
            }
        }
    }

    fn answer(&self, reply: StateQuery) {
        let _ = reply.send(self.state());
    }

    /// CompleteDeferredWork: hands the batch's delta to the kernel task.
    async fn flush(&mut self) {
        self.resolve_parents().await;
        let batch = self.open.take().map(|(b, _)| b);
        self.internal_dirty = false;
        let settings = self.manager.settings();
        let request = ApplyRequest {
            delta: self.manager.complete_deferred_work(),
            in_sync: self.manager.in_sync(),
            route_protocol: settings.route_protocol,
            device_names: settings.device_names.clone(),
        };
        let metrics = &self.options.metrics;
        metrics.messages(&mut self.message_counts);
        metrics.stream(self.stream.is_some(), request.in_sync);
        self.apply_in_flight = true;
        let command = KernelCommand::Apply {
            request: Box::new(request),
            batch,
            refresh_interval: settings.route_refresh_interval,
        };
        if self.kernel.send(command).await.is_err() {
            warn!("kernel task has stopped");
        }
    }

    /// When the local VTEP's parent address changed, asks the kernel which
    /// interface holds it before the delta is computed, so the batch that
    /// brings the VTEP also brings the device.
    async fn resolve_parents(&mut self) {
        let parent_ips = Family::ALL.map(|f| self.manager.family(f).parent_ip());
        if parent_ips == self.resolved_parent_ips {
            return;
        }
        let (reply, answer) = oneshot::channel();
        let command = KernelCommand::FindParents { parent_ips, reply };
        if self.kernel.send(command).await.is_err() {
            return;
        }
        if let Ok(parents) = self.answering_queries(answer).await {
            for (family, parent) in Family::ALL.into_iter().zip(parents) {
                self.manager.set_parent(family, parent);
            }
            self.resolved_parent_ips = parent_ips;
        }
    }

    async fn on_kernel_event(&mut self, event: KernelEvent) {
        // Where DataplaneInSync goes once the stream has ended: the last
        // batch's responder, while the client still reads.
        let mut batch_responder = None;
        let (report, objects) = match event {
            KernelEvent::Applied {
                batch,
                in_sync,
                report,
                apply_time,
                objects,
            } => {
                self.apply_in_flight = false;
                self.in_sync_applied |= in_sync;
                if let Some(batch) = batch {
                    let status = batch.status(&report, apply_time, in_sync);
                    info!(
                        first = status.first_sequence,
                        last = status.last_sequence,
                        messages = status.message_count,
                        rejected = status.rejected.len(),
                        added = report.added,
                        changed = report.changed,
                        removed = report.removed,
                        errors = report.errors.len(),
                        apply_ms = apply_time.as_secs_f64() * 1e3,
                        "batch applied"
                    );
                    self.options.metrics.batch_applied(&status, apply_time);
                    if let Some(responder) = &batch.responder {
                        responder.send(sync_response::Payload::BatchStatus(status.clone()));
                    }
                    self.last_batch = Some(status);
                    batch_responder = batch.responder;
                }
                (report, objects)
            }
            KernelEvent::Background { report, objects } => (report, objects),
        };
        for (family, parent) in report.parent_changes.clone() {
            self.manager.set_parent(family, parent);
            self.internal_dirty = true;
        }
        self.options
            .metrics
            .object_health(objects.failing.len(), objects.contested.len());
        self.objects = objects;
        self.update_health(batch_responder.as_ref()).await;
    }

    /// NOT_SERVING while an object fails or is contested; SERVING once the
    /// latest stream's InSync is applied and nothing is left to do. Before
    /// that (a snapshot coming in), health stays as it was.
    async fn update_health(&mut self, batch_responder: Option<&Responder>) {
        if !self.objects.is_clean() {
            self.set_serving(false).await;
            return;
        }
        if !self.in_sync_applied || self.internal_dirty || self.apply_in_flight {
            return;
        }
        // Health first: a client told DataplaneInSync finds it SERVING.
        self.set_serving(true).await;
        if !self.dataplane_in_sync_sent {
            self.dataplane_in_sync_sent = true;
            let stream = self.stream.as_ref();
            info!(stream = stream.map(|s| s.id), "dataplane in sync");
            if let Some(responder) = stream
                .and_then(|s| s.responder.as_ref())
                .or(batch_responder)
            {
                responder.send(sync_response::Payload::DataplaneInSync(DataplaneInSync {}));
            }
        }
    }

    /// Health watchers hear of changes only.
    async fn set_serving(&mut self, serving: bool) {
        if serving == self.serving {
            return;
        }
        self.serving = serving;
        self.options.metrics.set_ready(serving);
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        info!(?status, "dataplane health");
        self.health.set_service_status(SERVICE_NAME, status).await;
    }

    fn heartbeat(&mut self) {
        let Some(responder) = self.stream.as_ref().and_then(|s| s.responder.as_ref()) else {
            return;
        };
        let update = ProcessStatusUpdate {
            iso_timestamp: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            uptime: self.started.elapsed().as_secs_f64(),
        };
        responder.send(sync_response::Payload::Heartbeat(update));
    }

    fn state(&self) -> DataplaneState {
        let troubled: Vec<ObjectError> = self
            .objects
            .failing
            .iter()
            .chain(&self.objects.contested)
            .cloned()
            .collect();
        DataplaneState {
            firewall_rules: Some(firewall_rules(&self.objects.firewall)),
            ..dataplane_state(&self.manager, self.last_batch.clone(), &troubled)
        }
    }
}

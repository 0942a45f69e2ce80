//! The manager task and the kernel task together, in-process on a memory
//! kernel, with faults injected: health and the stream's responses.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_stream::StreamExt;
use tonic::Request;
use tonic_health::pb::health_check_response::ServingStatus as Status;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

use super::*;
use crate::calc_source::Incoming;
use crate::calc_source::responses::{self, Responses};
use crate::kernel::objects::KernelOp;
use crate::reconciler::tests::{CLUSTER, IN_SYNC};
use crate::wire::json;
use crate::wire::vxmgr::v1::{BatchStatus, DataplaneState, sync_response::Payload};

fn options() -> DaemonOptions {
    DaemonOptions {
        socket: PathBuf::new(),
        socket_group: None,
        allow_uids: Vec::new(),
        hostname: "node-a".into(),
        kernel: KernelKind::Memory,
        batch_interval: Duration::from_millis(1),
        // Only the passes a test causes, and retries.
        heartbeat_interval: Duration::from_secs(3600),
        device_check_interval: Duration::from_secs(3600),
        legacy_poll_interval: None,
        contest_window: crate::reconciler::CONTEST_WINDOW,
        response_buffer: crate::server::RESPONSE_BUFFER,
        nexthops: NexthopMode::On,
        checksum_offload_broken: ChecksumOffloadBroken::False,
        forward_rules: Some(IptablesBackend::Auto),
        flags: SettingsLayer::default(),
        record: None,
        http_listen: None,
    }
}

/// The daemon's tasks on a memory kernel, with one open stream.
struct Rig {
    kernel: MemoryBackend,
    tasks: Tasks,
    health: HealthService,
    responses: Responses,
    sent: u64,
}

const STREAM: u64 = 1;

impl Rig {
    async fn start() -> Rig {
        Rig::start_with(options()).await
    }

    async fn start_with(options: DaemonOptions) -> Rig {
        let kernel = MemoryBackend::with_underlay("eth0", 1500);
        let reporter = HealthReporter::new();
        let health = HealthService::from_health_reporter(reporter.clone());
        let backend = kernel.clone();
        let metrics = Arc::new(Metrics::new());
        // No census is asked for: its sender goes at once.
        let (_, census) = mpsc::channel(1);
        let tasks = Tasks::start(move || Ok(backend), &options, reporter, metrics, census)
            .await
            .expect("memory kernel");
        let (responder, responses) = responses::channel(STREAM, 64);
        tasks
            .engine
            .send(EngineInput::StreamStarted {
                id: STREAM,
                peer: "a test".into(),
                responder,
            })
            .await
            .unwrap();
        Rig {
            kernel,
            tasks,
            health,
            responses,
            sent: 0,
        }
    }

    /// Sends JSON messages, numbered on from the last; returns the last number.
    async fn send(&mut self, lines: &[&str]) -> u64 {
        let messages = lines
            .iter()
            .map(|line| {
                let mut msg: crate::wire::felix::ToDataplane =
                    json::from_str(line).expect("test JSON");
                self.sent += 1;
                msg.sequence_number = self.sent;
                Incoming::Message(msg)
            })
            .collect();
        let input = EngineInput::Messages {
            id: STREAM,
            messages,
        };
        self.tasks.engine.send(input).await.unwrap();
        self.sent
    }

    /// The next response `want` picks, skipping the others.
    async fn next<T>(&mut self, mut want: impl FnMut(Payload) -> Option<T>) -> T {
        let wait = async {
            loop {
                let response = self.responses.next().await.expect("stream open");
                let payload = response.expect("no error").payload.expect("a payload");
                if let Some(t) = want(payload) {
                    return t;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .expect("a response within 30 s")
    }

    async fn batch_covering(&mut self, sequence: u64) -> BatchStatus {
        self.next(|p| match p {
            Payload::BatchStatus(s) if s.last_sequence >= sequence => Some(s),
            _ => None,
        })
        .await
    }

    /// GetState; also waits for the manager task to be done with what came
    /// before, health included.
    async fn state(&self) -> DataplaneState {
        let (reply, answer) = oneshot::channel();
        self.tasks.queries.send(reply).await.unwrap();
        answer.await.unwrap()
    }

    /// GetState, failing the test if it is not answered in 30 s.
    async fn state_within_30s(&self) -> DataplaneState {
        tokio::time::timeout(Duration::from_secs(30), self.state())
            .await
            .expect("GetState answered within 30 s")
    }

    fn request() -> Request<HealthCheckRequest> {
        Request::new(HealthCheckRequest {
            service: engine::SERVICE_NAME.into(),
        })
    }

    async fn health(&self) -> Status {
        self.state().await;
        let response = self.health.check(Rig::request()).await.unwrap();
        response.into_inner().status()
    }

    /// Waits until health says `status`.
    async fn health_becomes(&self, status: Status) {
        let mut watch = self
            .health
            .watch(Rig::request())
            .await
            .unwrap()
            .into_inner();
        let wait = async {
            while let Some(update) = watch.next().await {
                let update: HealthCheckResponse = update.unwrap();
                if update.status() == status {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| panic!("health not {status:?} within 30 s"));
    }
}

const FAILING_ROUTE: &str = r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.244.1.64/26", "dstNodeName": "node-b"}}"#;
const OTHER_ROUTE: &str = r#"{"routeUpdate": {"types": "REMOTE_WORKLOAD", "ipPoolType": "VXLAN", "dst": "10.244.1.128/26", "dstNodeName": "node-b"}}"#;

#[tokio::test]
async fn health_is_not_serving_exactly_while_an_object_fails() {
    let mut rig = Rig::start().await;
    assert_eq!(rig.health().await, Status::NotServing, "before InSync");
    rig.send(CLUSTER).await;
    rig.send(&[IN_SYNC]).await;
    rig.next(|p| matches!(p, Payload::DataplaneInSync(_)).then_some(()))
        .await;
    assert_eq!(rig.health().await, Status::Serving);

    let bad = "10.244.1.64/26".parse().unwrap();
    rig.kernel.inject_fault(
        move |op| matches!(op, KernelOp::AddRoute(r) | KernelOp::ReplaceRoute(r) if r.dst == bad),
        libc::EBUSY,
    );
    let failing = rig.send(&[FAILING_ROUTE]).await;
    let status = rig.batch_covering(failing).await;
    assert_eq!(status.kernel_errors.len(), 1, "{status:?}");
    assert_eq!(rig.health().await, Status::NotServing, "the route fails");

    // A batch that goes through, and the retries of the failing route in
    // between, do not make the dataplane healthy.
    let other = rig.send(&[OTHER_ROUTE]).await;
    let status = rig.batch_covering(other).await;
    assert!(status.kernel_errors.is_empty(), "{status:?}");
    assert_eq!(
        rig.health().await,
        Status::NotServing,
        "the route still fails"
    );
    let state = rig.state().await;
    assert_eq!(state.failing_objects.len(), 1, "{state:?}");
    assert!(
        state.failing_objects[0].object.contains("10.244.1.64/26"),
        "{state:?}"
    );

    // The fault clears: the next retry programs the route.
    rig.kernel.clear_faults();
    rig.health_becomes(Status::Serving).await;
    assert!(rig.state().await.failing_objects.is_empty());
    assert!(rig.kernel.lock().routes.contains_key(&bad));
    rig.tasks.stop().await;
}

#[tokio::test]
async fn get_state_and_health_answer_while_the_kernel_is_busy_applying() {
    let mut rig = Rig::start().await;
    let mut hold = rig.kernel.hold_applies();
    rig.send(CLUSTER).await;
    let in_sync = rig.send(&[IN_SYNC]).await;
    hold.applying().await;
    // The kernel task is inside its first apply: reads answer from what
    // the calc process declared.
    let state = rig.state_within_30s().await;
    let ipv4 = state.ipv4.expect("IPv4 state");
    assert!(!ipv4.remote_vteps.is_empty(), "{ipv4:?}");
    assert!(state.last_batch.is_none(), "nothing applied yet");
    let health = rig.health.check(Rig::request()).await.unwrap();
    assert_eq!(health.into_inner().status(), Status::NotServing);
    hold.release();
    let status = rig.batch_covering(in_sync).await;
    assert!(status.in_sync, "{status:?}");
    rig.health_becomes(Status::Serving).await;
    rig.tasks.stop().await;
}

#[tokio::test]
async fn get_state_answers_while_a_new_stream_waits_for_the_apply_in_flight() {
    let mut rig = Rig::start().await;
    let mut hold = rig.kernel.hold_applies();
    rig.send(CLUSTER).await;
    hold.applying().await;
    // A reconnect: the new stream's resync starts once the apply is done.
    let (responder, _responses) = responses::channel(STREAM + 1, 64);
    let reconnect = EngineInput::StreamStarted {
        id: STREAM + 1,
        peer: "a test, again".into(),
        responder,
    };
    rig.tasks.engine.send(reconnect).await.unwrap();
    let state = rig.state_within_30s().await;
    assert!(state.last_batch.is_none(), "nothing applied yet");
    hold.release();
    rig.tasks.stop().await;
}

/// A batch closes when the stream has nothing waiting, whatever the batch
/// interval; what arrives during an apply is the next batch, whole.
#[tokio::test]
async fn batches_close_when_the_stream_pauses_and_gather_during_an_apply() {
    let mut rig = Rig::start_with(DaemonOptions {
        batch_interval: Duration::from_secs(3600),
        ..options()
    })
    .await;
    let first = rig.send(&CLUSTER[..1]).await;
    let status = rig.batch_covering(first).await;
    assert_eq!(
        (status.first_sequence, status.last_sequence),
        (first, first),
        "a lone message applies at once: {status:?}"
    );
    let mut hold = rig.kernel.hold_applies();
    let held = rig.send(&CLUSTER[1..2]).await;
    hold.applying().await;
    for line in &CLUSTER[2..] {
        rig.send(&[line]).await;
    }
    let last = rig.send(&[IN_SYNC]).await;
    hold.release();
    let status = rig.batch_covering(held).await;
    assert_eq!(
        (status.first_sequence, status.last_sequence),
        (held, held),
        "{status:?}"
    );
    let status = rig.batch_covering(last).await;
    assert_eq!(
        (status.first_sequence, status.last_sequence),
        (held + 1, last),
        "what arrived during the apply is one batch: {status:?}"
    );
    assert!(status.in_sync, "{status:?}");
    rig.tasks.stop().await;
}

#[tokio::test]
async fn a_missing_nft_shows_in_the_batch_status_health_and_get_state_and_nothing_else_waits() {
    let mut rig = Rig::start().await;
    rig.kernel.lock().firewall.nft_missing = true;
    rig.send(CLUSTER).await;
    let pool = r#"{"ipamPoolUpdate": {"id": "pods", "pool": {"cidr": "10.244.0.0/16", "masquerade": true}}}"#;
    let last = rig.send(&[pool, IN_SYNC]).await;
    let status = rig.batch_covering(last).await;
    let errors: Vec<&str> = status
        .kernel_errors
        .iter()
        .map(|e| e.error.as_str())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("the nft binary is missing")),
        "{status:?}"
    );
    assert_eq!(rig.health().await, Status::NotServing);
    let state = rig.state().await;
    let rules = state.firewall_rules.clone().unwrap();
    assert!(rules.error.contains("nft binary is missing"), "{rules:?}");
    assert!(!rules.programmed);
    assert_eq!(state.ip_pools.len(), 1);
    assert!(
        !rig.kernel.lock().routes.is_empty(),
        "routes programmed all the same"
    );

    // nft installed: the retry programs the rules, and health follows.
    rig.kernel.lock().firewall.nft_missing = false;
    rig.health_becomes(Status::Serving).await;
    let rules = rig.state().await.firewall_rules.unwrap();
    assert!(rules.programmed && rules.error.is_empty(), "{rules:?}");
    assert_eq!(rules.masquerading_pools, ["10.244.0.0/16"]);
    rig.tasks.stop().await;
}

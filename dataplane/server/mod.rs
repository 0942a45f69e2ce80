//! The gRPC server on the unix socket: the Dataplane service (Sync,
//! GetState), health and reflection (v1 and v1alpha).

pub mod authority;
pub mod socket;
pub mod state;

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use crate::calc_source::recorder::Recorder;
use crate::calc_source::responses::{self, Responses};
use crate::calc_source::{EngineInput, Incoming, MESSAGE_CHUNK};
use crate::wire::vxmgr::v1::dataplane_server::{Dataplane, DataplaneServer};
use crate::wire::vxmgr::v1::{DataplaneState, GetStateRequest};
use crate::wire::{DESCRIPTOR_SET, MAX_MESSAGE_BYTES, Received};

/// A GetState request. Queries come on a channel of their own, so that they
/// are answered even while the manager task waits for the kernel.
pub type StateQuery = oneshot::Sender<DataplaneState>;

/// Responses buffered for a stream before a client that does not read is
/// considered stuck.
pub const RESPONSE_BUFFER: usize = 4096;

/// What a client may send on one stream before the server reads it: the
/// bound on what a Sync stream holds while the manager is busy.
const STREAM_WINDOW: u32 = 1 << 20;

/// The HTTP/2 layer ends a connection (GOAWAY ENHANCE_YOUR_CALM,
/// "too_many_data_frames") once the DATA frames it holds unread cost more
/// than half the connection window, each frame costing 256 bytes less its
/// payload. Felix, grpcio and tonic send a frame per message, often under
/// 100 bytes, and a Sync stream goes unread while the manager is busy: with
/// a connection window of one stream window, a few thousand such frames
/// ended a replay of 100,000 nodes. At 256 stream windows, one stream's
/// full window in frames of 2 bytes or more stays within that budget.
const CONNECTION_WINDOW: u32 = 256 * STREAM_WINDOW;

/// Streams open at once on a connection: with [`CONNECTION_WINDOW`] this
/// bounds what one connection can make the server hold. A calc process,
/// grpcurl or a health check uses one or two.
const MAX_STREAMS: u32 = 16;

pub struct DataplaneService {
    engine: mpsc::Sender<EngineInput>,
    queries: mpsc::Sender<StateQuery>,
    /// Who holds the one Sync stream, if anyone.
    active: Arc<Mutex<Option<String>>>,
    next_stream: AtomicU64,
    response_buffer: usize,
    recorder: Recorder,
    /// Why Sync is refused, when the calc stream comes from elsewhere.
    sync_refused: Option<String>,
}

impl DataplaneService {
    pub fn new(
        engine: mpsc::Sender<EngineInput>,
        queries: mpsc::Sender<StateQuery>,
        response_buffer: usize,
        recorder: Recorder,
        sync_refused: Option<String>,
    ) -> DataplaneService {
        DataplaneService {
            engine,
            queries,
            active: Arc::new(Mutex::new(None)),
            next_stream: AtomicU64::new(1),
            response_buffer,
            recorder,
            sync_refused,
        }
    }
}

fn describe_peer<T>(request: &Request<T>) -> String {
    match request
        .extensions()
        .get::<UdsConnectInfo>()
        .and_then(|i| i.peer_cred)
    {
        Some(cred) => match cred.pid() {
            Some(pid) => format!("pid {pid} uid {}", cred.uid()),
            None => format!("uid {}", cred.uid()),
        },
        None => "an unknown peer".to_string(),
    }
}

/// Frees the Sync slot when the stream's reader ends, however it ends.
struct ActiveGuard(Arc<Mutex<Option<String>>>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[tonic::async_trait]
impl Dataplane for DataplaneService {
    type SyncStream = Responses;

    async fn sync(
        &self,
        request: Request<Streaming<Received>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        if let Some(why) = &self.sync_refused {
            return Err(Status::failed_precondition(why.clone()));
        }
        let peer = describe_peer(&request);
        {
            let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(holder) = active.as_ref() {
                return Err(Status::failed_precondition(format!(
                    "another Sync stream is active (from {holder}); only one calc process may stream at a time"
                )));
            }
            *active = Some(peer.clone());
        }
        let guard = ActiveGuard(self.active.clone());
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (responder, responses) = responses::channel(id, self.response_buffer);
        let engine = self.engine.clone();
        if engine
            .send(EngineInput::StreamStarted {
                id,
                peer: peer.clone(),
                responder: responder.clone(),
            })
            .await
            .is_err()
        {
            return Err(Status::unavailable("vxmgrd is shutting down"));
        }
        // Messages go to the manager task in the chunks the socket delivers
        // them in: one hand-over per chunk, not per message.
        let mut inbound = request.into_inner().ready_chunks(MESSAGE_CHUNK);
        let mut cut = Box::pin(responder.cut());
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            let _guard = guard;
            loop {
                // A client cut off for not reading loses its stream, and
                // the slot goes to the next calc process.
                let chunk = tokio::select! {
                    chunk = inbound.next() => chunk,
                    () = &mut cut => break,
                };
                let Some(chunk) = chunk else {
                    break;
                };
                let mut messages = Vec::with_capacity(chunk.len());
                let mut failure = None;
                for item in chunk {
                    match item {
                        Ok(received) => {
                            recorder.record(&received);
                            messages.push(Incoming::from(received));
                        }
                        Err(status) => {
                            failure = Some(refusal(status));
                            break;
                        }
                    }
                }
                recorder.flush();
                let input = EngineInput::Messages { id, messages };
                if engine.send(input).await.is_err() {
                    break;
                }
                if let Some(status) = failure {
                    warn!(stream = id, %peer, %status, "calc stream failed");
                    responder.fail(status);
                    break;
                }
            }
            let _ = engine.send(EngineInput::StreamEnded { id }).await;
        });
        Ok(Response::new(responses))
    }

    async fn get_state(
        &self,
        _request: Request<GetStateRequest>,
    ) -> Result<Response<DataplaneState>, Status> {
        let (reply, answer) = oneshot::channel();
        self.queries
            .send(reply)
            .await
            .map_err(|_| Status::unavailable("vxmgrd is shutting down"))?;
        let state = answer
            .await
            .map_err(|_| Status::unavailable("vxmgrd is shutting down"))?;
        Ok(Response::new(state))
    }
}

/// What the client is told when its stream fails. tonic says OUT_OF_RANGE
/// for a message over the size limit; gRPC's own word for it is
/// RESOURCE_EXHAUSTED.
fn refusal(status: Status) -> Status {
    if status.code() == tonic::Code::OutOfRange {
        Status::resource_exhausted(format!(
            "{}: vxmgrd takes messages of up to {} MiB",
            status.message(),
            MAX_MESSAGE_BYTES >> 20
        ))
    } else {
        status
    }
}

/// Serves every service on `listener` until `shutdown` completes.
pub async fn serve(
    listener: UnixListener,
    allow_uids: Vec<u32>,
    service: DataplaneService,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .expect("descriptor sets built from proto/ are valid");
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .expect("descriptor sets built from proto/ are valid");
    info!("serving gRPC");
    tonic::transport::Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        .add_service(DataplaneServer::new(service).max_decoding_message_size(MAX_MESSAGE_BYTES))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(
            socket::incoming(listener, allow_uids)
                .map(|conn| conn.map(authority::AuthorityFixingStream::new)),
            shutdown,
        )
        .await
}

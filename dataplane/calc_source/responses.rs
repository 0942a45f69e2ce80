//! A Sync stream's responses. They are sent without waiting, so a client
//! that stops reading cannot stall the daemon; once its buffer is full, its
//! stream is ended with RESOURCE_EXHAUSTED rather than dropping responses
//! it would never know it missed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tracing::warn;

use crate::wire::vxmgr::v1::{SyncResponse, sync_response};

const NOT_READING: &str = "client is not reading its responses";

/// Where a stream's responses go; its clones go to the same place.
#[derive(Clone, Debug)]
pub struct Responder(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    stream: u64,
    tx: mpsc::Sender<Result<SyncResponse, Status>>,
    /// Set once the stream is ended for not reading.
    cut: watch::Sender<bool>,
}

/// What the client reads: the responses, or the end of its stream.
pub struct Responses {
    rx: ReceiverStream<Result<SyncResponse, Status>>,
    cut: Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
}

/// A response channel for stream `stream` holding up to `buffer` responses.
pub fn channel(stream: u64, buffer: usize) -> (Responder, Responses) {
    let (tx, rx) = mpsc::channel(buffer);
    let responder = Responder(Arc::new(Shared {
        stream,
        tx,
        cut: watch::channel(false).0,
    }));
    let responses = Responses {
        rx: ReceiverStream::new(rx),
        cut: Box::pin(responder.cut()),
        ended: false,
    };
    (responder, responses)
}

impl Responder {
    /// Sends without waiting; a full buffer ends the stream.
    pub fn send(&self, payload: sync_response::Payload) {
        let shared = &self.0;
        if *shared.cut.borrow() {
            return;
        }
        let response = SyncResponse {
            payload: Some(payload),
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = shared.tx.try_send(Ok(response)) {
            warn!(
                stream = shared.stream,
                "calc {NOT_READING}: ending its stream"
            );
            shared.cut.send_replace(true);
        }
    }

    /// Ends the stream with `status`, after the responses before it.
    pub fn fail(&self, status: Status) {
        let _ = self.0.tx.try_send(Err(status));
    }

    /// Completes once the stream is ended for not reading.
    pub fn cut(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut cut = self.0.cut.subscribe();
        async move {
            if cut.wait_for(|cut| *cut).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Stream for Responses {
    type Item = Result<SyncResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        // The responses still buffered are dropped: the client learns that
        // it missed some.
        if self.cut.poll_unpin(cx).is_ready() {
            self.ended = true;
            return Poll::Ready(Some(Err(Status::resource_exhausted(NOT_READING))));
        }
        self.rx.poll_next_unpin(cx)
    }
}

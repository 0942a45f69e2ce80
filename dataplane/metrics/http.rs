//! The HTTP listener `--http-listen` opens: `/metrics` for Prometheus,
//! `/livez` and `/readyz` for probes, and Felix's `/liveness` and
//! `/readiness` so that probes written for Felix work unchanged.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info};

use super::Metrics;
use crate::reconciler::census::ObjectCount;

/// Asks the kernel task how many objects it holds.
pub type CensusQuery = oneshot::Sender<Vec<ObjectCount>>;

/// How long a scrape waits for the kernel task's census; a task inside a
/// long apply does not answer in time, and the scrape shows the previous
/// counts.
const CENSUS_WAIT: Duration = Duration::from_secs(1);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the handlers read.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: Arc<Metrics>,
    pub census: mpsc::Sender<CensusQuery>,
}

/// Serves HTTP/1.1 on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    endpoints: Endpoints,
    shutdown: impl Future<Output = ()>,
) {
    if let Ok(address) = listener.local_addr() {
        info!(%address, "serving metrics and health over HTTP");
    }
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    debug!(error = %e, "accepting an HTTP connection");
                    continue;
                }
            },
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let endpoints = endpoints.clone();
                async move { Ok::<_, Infallible>(endpoints.answer(request).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(error = %e, %peer, "HTTP connection ended");
            }
        });
    }
}

impl Endpoints {
    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        if !matches!(*request.method(), Method::GET | Method::HEAD) {
            return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
        }
        match request.uri().path() {
            "/metrics" => {
                self.refresh_census().await;
                respond(StatusCode::OK, OPENMETRICS, self.metrics.encode())
            }
            // The process answers: the runtime that runs the daemon's tasks
            // is alive.
            "/livez" | "/liveness" => respond(StatusCode::OK, "text/plain", "ok\n"),
            "/readyz" | "/readiness" => {
                if self.metrics.is_ready() {
                    respond(StatusCode::OK, "text/plain", "ready\n")
                } else {
                    respond(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        "not ready: the dataplane is not in sync with the calc stream, or objects are failing\n",
                    )
                }
            }
            _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
        }
    }

    async fn refresh_census(&self) {
        let (reply, answer) = oneshot::channel();
        if self.census.try_send(reply).is_err() {
            return;
        }
        if let Ok(Ok(counts)) = tokio::time::timeout(CENSUS_WAIT, answer).await {
            self.metrics.programmed(&counts);
        }
    }
}

fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()))
        .expect("a response from constant parts")
}

//! The HTTP listener of vxmgrd's `--http-listen` and calc-flannel's
//! `--healthz-port`: `/metrics` for Prometheus, `/livez` and `/readyz` for
//! probes, Felix's `/liveness` and `/readiness` and flannel's `/healthz` so
//! that probes written for those work unchanged. What it serves comes from
//! a [`Probes`].

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

/// What a process serves: its metrics and whether it is ready.
pub trait Probes: Clone + Send + Sync + 'static {
    /// The OpenMetrics text exposition, up to date.
    fn metrics(&self) -> impl Future<Output = String> + Send;
    /// Why the process is not ready, if it is not.
    fn not_ready(&self) -> Option<&'static str>;
}

/// vxmgrd's: its metrics, with the kernel task's census.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: Arc<Metrics>,
    pub census: mpsc::Sender<CensusQuery>,
}

/// Serves HTTP/1.1 on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    endpoints: impl Probes,
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
                async move { Ok::<_, Infallible>(answer(&endpoints, request).await) }
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

async fn answer(probes: &impl Probes, request: Request<Incoming>) -> Response<Full<Bytes>> {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    match request.uri().path() {
        "/metrics" => respond(StatusCode::OK, OPENMETRICS, probes.metrics().await),
        // The process answers: the runtime that runs its tasks is alive.
        "/livez" | "/liveness" | "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" | "/readiness" => match probes.not_ready() {
            None => respond(StatusCode::OK, "text/plain", "ready\n"),
            Some(why) => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

impl Probes for Endpoints {
    async fn metrics(&self) -> String {
        self.refresh_census().await;
        self.metrics.encode()
    }

    fn not_ready(&self) -> Option<&'static str> {
        (!self.metrics.is_ready())
            .then_some("the dataplane is not in sync with the calc stream, or objects are failing")
    }
}

impl Endpoints {
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

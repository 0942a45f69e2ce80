//! The registry on a real etcd (v3 API over gRPC): plain or TLS endpoints,
//! several at once, username/password authentication. As etcd's own
//! clients do, it talks to one endpoint at a time and moves to the next
//! when that one stops answering (down, cut off, or without a leader).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};
use tokio_stream::StreamExt;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};
use tracing::warn;
use vxmgr::wire::etcd::{
    AuthenticateRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchProgressRequest,
    WatchRequest, WatchResponse, auth_client::AuthClient, compare, event::EventType,
    kv_client::KvClient, lease_client::LeaseClient, request_op, watch_client::WatchClient,
    watch_request,
};

use super::kv::{EtcdError, Event, KeyValue, Kv, Listing, Watch, WatchMessage};

/// How to reach etcd.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdSetupError {
    #[error("etcd endpoint {endpoint:?}: {why}")]
    Endpoint { endpoint: String, why: String },
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Options(String),
}

/// One unary call's limit; watches are long-lived and have none.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Keys per page when listing, so a large network never needs one huge
/// response (10,000 leases are about 2 MB). Each page costs a round trip
/// and etcd's own work for a request: 10,000 leases came in 70 ms as five
/// pages of 2,000 and in 45 ms as one.
const PAGE: i64 = 10_000;
/// How long a watch may be silent before a progress request asks its
/// member whether it is still there, and how long the member has to
/// answer. A member cut off from us answers nothing, and HTTP/2 pings
/// cannot find that out sooner: etcd refuses pings closer than 5 s apart.
const WATCH_SILENCE: Duration = Duration::from_secs(2);
const PROGRESS_ANSWER: Duration = Duration::from_secs(2);
/// Largest response accepted (a page of leases, a large watch response).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

#[derive(Clone)]
pub struct Etcd {
    /// One channel per endpoint, with its URL.
    endpoints: Arc<[(String, Channel)]>,
    /// The endpoint in use.
    current: Arc<AtomicUsize>,
    credentials: Option<(String, String)>,
    /// The auth token, once authenticated; dropped when etcd refuses it.
    token: Arc<Mutex<Option<String>>>,
}

fn read(path: &PathBuf) -> Result<Vec<u8>, EtcdSetupError> {
    std::fs::read(path).map_err(|source| EtcdSetupError::Read {
        path: path.clone(),
        source,
    })
}

impl Etcd {
    /// A client on `options.endpoints`. Nothing is connected yet: etcd
    /// may be down now and come up later.
    pub fn new(options: &EtcdOptions) -> Result<Etcd, EtcdSetupError> {
        let tls = match (&options.cert_file, &options.key_file) {
            (Some(cert), Some(key)) => Some(Identity::from_pem(read(cert)?, read(key)?)),
            (None, None) => None,
            _ => {
                return Err(EtcdSetupError::Options(
                    "--etcd-certfile and --etcd-keyfile go together".into(),
                ));
            }
        };
        let ca = options.ca_file.as_ref().map(read).transpose()?;
        let mut endpoints = Vec::new();
        for url in &options.endpoints {
            let bad = |why: String| EtcdSetupError::Endpoint {
                endpoint: url.clone(),
                why,
            };
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| bad(e.to_string()))?
                .connect_timeout(Duration::from_secs(5))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true);
            match url.split_once("://").map(|(scheme, _)| scheme) {
                Some("http") => {}
                Some("https") => {
                    let ca = ca
                        .clone()
                        .ok_or_else(|| bad("an https endpoint needs --etcd-cafile".into()))?;
                    let mut config =
                        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
                    if let Some(identity) = tls.clone() {
                        config = config.identity(identity);
                    }
                    endpoint = endpoint
                        .tls_config(config)
                        .map_err(|e| bad(e.to_string()))?;
                }
                _ => return Err(bad("must start with http:// or https://".into())),
            }
            endpoints.push((url.clone(), endpoint.connect_lazy()));
        }
        if endpoints.is_empty() {
            return Err(EtcdSetupError::Options("no etcd endpoint given".into()));
        }
        let credentials = match (&options.username, &options.password) {
            (Some(user), password) => Some((user.clone(), password.clone().unwrap_or_default())),
            (None, Some(_)) => {
                return Err(EtcdSetupError::Options(
                    "--etcd-password needs --etcd-username".into(),
                ));
            }
            (None, None) => None,
        };
        Ok(Etcd {
            endpoints: endpoints.into(),
            current: Arc::new(AtomicUsize::new(0)),
            credentials,
            token: Arc::new(Mutex::new(None)),
        })
    }

    /// Runs `op` on the endpoint in use; when that endpoint does not
    /// answer, on the next ones, each once. The error is the last one.
    async fn on_endpoint<T, F: Future<Output = Result<T, EtcdError>>>(
        &self,
        op: impl Fn(Channel) -> F,
    ) -> Result<T, EtcdError> {
        let mut error = None;
        for _ in 0..self.endpoints.len() {
            let index = self.current.load(Ordering::Relaxed) % self.endpoints.len();
            let (url, channel) = &self.endpoints[index];
            match op(channel.clone()).await {
                Err(EtcdError::Unavailable(why)) => {
                    self.next_endpoint(index, &why);
                    error = Some(EtcdError::Unavailable(format!("{url}: {why}")));
                }
                Err(e) => return Err(self.failed(e).await),
                Ok(value) => return Ok(value),
            }
        }
        Err(error.expect("at least one endpoint"))
    }

    /// Moves on from endpoint `index`, unless another call already has.
    fn next_endpoint(&self, index: usize, why: &str) {
        let next = (index + 1) % self.endpoints.len();
        if next != index
            && self
                .current
                .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            warn!(
                endpoint = %self.endpoints[index].0,
                next = %self.endpoints[next].0,
                error = %why,
                "etcd endpoint not answering: moving to the next"
            );
        }
    }

    fn kv(channel: &Channel) -> KvClient<Channel> {
        KvClient::new(channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    fn lease(channel: &Channel) -> LeaseClient<Channel> {
        LeaseClient::new(channel.clone())
    }

    /// `message` as a request carrying the auth token (authenticating
    /// first on `channel` when there is none yet).
    async fn request<T>(&self, channel: &Channel, message: T) -> Result<Request<T>, EtcdError> {
        let mut request = Request::new(message);
        let Some((name, password)) = &self.credentials else {
            return Ok(request);
        };
        let mut token = self.token.lock().await;
        if token.is_none() {
            let auth = AuthenticateRequest {
                name: name.clone(),
                password: password.clone(),
            };
            let response = call(AuthClient::new(channel.clone()).authenticate(auth)).await?;
            *token = Some(response.token);
        }
        let value =
            token.as_deref().unwrap_or_default().parse().map_err(|_| {
                EtcdError::Refused("etcd gave an auth token that is not ASCII".into())
            })?;
        request.metadata_mut().insert("token", value);
        Ok(request)
    }

    /// Maps a failed call, forgetting a token etcd no longer takes.
    async fn failed(&self, error: EtcdError) -> EtcdError {
        if matches!(&error, EtcdError::Refused(why) if why.contains("auth token")) {
            *self.token.lock().await = None;
        }
        error
    }

    async fn grant(&self, channel: &Channel, ttl: Duration) -> Result<i64, EtcdError> {
        let request = self
            .request(
                channel,
                LeaseGrantRequest {
                    ttl: ttl.as_secs().max(1) as i64,
                    id: 0,
                },
            )
            .await?;
        let response = call(Etcd::lease(channel).lease_grant(request)).await?;
        if !response.error.is_empty() {
            return Err(EtcdError::Refused(response.error));
        }
        Ok(response.id)
    }

    /// Best effort: an unused etcd lease expires by itself anyway.
    async fn revoke(&self, channel: &Channel, id: i64) {
        if let Ok(request) = self.request(channel, LeaseRevokeRequest { id }).await {
            let _ = call(Etcd::lease(channel).lease_revoke(request)).await;
        }
    }

    /// `write` with a new etcd lease of `ttl`, on one endpoint; the lease
    /// is revoked unless `done` says the write used it.
    async fn with_lease<T, F: Future<Output = Result<T, EtcdError>>>(
        &self,
        ttl: Duration,
        write: impl Fn(Channel, i64) -> F,
        done: impl Fn(&T) -> bool,
    ) -> Result<T, EtcdError> {
        let (write, done) = (&write, &done);
        self.on_endpoint(|channel| async move {
            let id = self.grant(&channel, ttl).await?;
            let result = write(channel.clone(), id).await;
            if !result.as_ref().is_ok_and(done) {
                self.revoke(&channel, id).await;
            }
            result
        })
        .await
    }
}

impl Etcd {
    /// A watch of every key under `prefix` from `revision` on, on
    /// `channel`: its responses, and the request side, which must stay
    /// open while the watch lives (etcd ends a watch its client closes).
    async fn open_watch(
        &self,
        channel: &Channel,
        prefix: &str,
        revision: i64,
    ) -> Result<(tonic::Streaming<WatchResponse>, mpsc::Sender<WatchRequest>), EtcdError> {
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix),
                    start_revision: revision,
                    progress_notify: true,
                    prev_kv: false,
                },
            )),
        };
        let (requests_tx, requests_rx) = mpsc::channel(1);
        requests_tx
            .send(create)
            .await
            .expect("the receiver is right here");
        let mut request = self
            .request(
                channel,
                tokio_stream::wrappers::ReceiverStream::new(requests_rx),
            )
            .await?;
        // Fail the watch when its member loses the cluster's leader, as
        // etcd's own clients ask, instead of waiting on a partitioned one.
        request
            .metadata_mut()
            .insert("hasleader", "true".parse().expect("ASCII"));
        let client =
            WatchClient::new(channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES);
        match tokio::time::timeout(CALL_TIMEOUT, { client }.watch(request)).await {
            Ok(Ok(response)) => Ok((response.into_inner(), requests_tx)),
            Ok(Err(status)) => Err(status_error(&status)),
            Err(_) => Err(EtcdError::Unavailable("no answer to the watch".into())),
        }
    }
}

/// The watch id etcd gives its answer to a progress request.
const PROGRESS_WATCH_ID: i64 = -1;

/// Whether a watch's member still answers: after [`WATCH_SILENCE`]
/// without a response the watch asks for progress, and a member that has
/// answered such a request before but not this one within
/// [`PROGRESS_ANSWER`] is taken as gone. (Before etcd 3.4 members ignore
/// progress requests; there only the HTTP/2 keepalive finds a dead one.)
#[derive(Default)]
struct Liveness {
    asked: bool,
    answers_progress: bool,
}

impl Liveness {
    fn wait(&self) -> Duration {
        if self.asked {
            PROGRESS_ANSWER
        } else {
            WATCH_SILENCE
        }
    }

    /// Any response shows the member is there; only an answer to a
    /// progress request shows it answers them.
    fn answered(&mut self, response: &Result<WatchResponse, Status>) {
        self.answers_progress |= matches!(response, Ok(r) if r.watch_id == PROGRESS_WATCH_ID);
        self.asked = false;
    }

    /// The watch was silent for [`Liveness::wait`]: true when its member
    /// is to be given up, else a progress request is sent (if one fits).
    fn silent(&mut self, requests: &mpsc::Sender<WatchRequest>) -> bool {
        if self.asked && self.answers_progress {
            return true;
        }
        self.asked = requests
            .try_send(WatchRequest {
                request_union: Some(watch_request::RequestUnion::ProgressRequest(
                    WatchProgressRequest {},
                )),
            })
            .is_ok();
        false
    }
}

/// One unary call with its time limit, errors mapped.
async fn call<T>(
    call: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(status_error(&status)),
        Err(_) => Err(EtcdError::Unavailable(format!(
            "no answer within {}s",
            CALL_TIMEOUT.as_secs()
        ))),
    }
}

fn status_error(status: &Status) -> EtcdError {
    let mut message = status.message().to_string();
    // Why the transport failed (a TLS alert, a refused connection) is in
    // the status's sources, not in its message.
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        message = format!("{message}: {cause}");
        source = cause.source();
    }
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            EtcdError::Unavailable(message)
        }
        Code::OutOfRange if message.contains("compacted") => EtcdError::Compacted(0),
        _ => EtcdError::Refused(message),
    }
}

/// The end of the key range holding every key that starts with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key: etcd's "\0" range end.
    vec![0]
}

/// Writes `key`, bound to etcd lease `lease`.
fn put_request(key: &str, value: &str, lease: i64) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        lease,
    }
}

fn key_value(kv: vxmgr::wire::etcd::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        value: kv.value,
    }
}

impl Kv for Etcd {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        self.on_endpoint(|channel| async move {
            let request = RangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            };
            let request = self.request(&channel, request).await?;
            let response = call(Etcd::kv(&channel).range(request)).await?;
            Ok(response.kvs.into_iter().next().map(key_value))
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Listing, EtcdError> {
        let end = &prefix_end(prefix);
        self.on_endpoint(|channel| async move {
            let mut listing = Listing::default();
            let mut from = prefix.as_bytes().to_vec();
            loop {
                // Every page as of the first one's revision.
                let request = RangeRequest {
                    key: from.clone(),
                    range_end: end.clone(),
                    limit: PAGE,
                    revision: listing.revision,
                };
                let request = self.request(&channel, request).await?;
                let response = call(Etcd::kv(&channel).range(request)).await?;
                if listing.revision == 0 {
                    listing.revision = response.header.map_or(0, |h| h.revision);
                }
                let Some(last) = response.kvs.last() else {
                    return Ok(listing);
                };
                from = last.key.clone();
                from.push(0);
                listing.kvs.extend(response.kvs.into_iter().map(key_value));
                if !response.more {
                    return Ok(listing);
                }
            }
        })
        .await
    }

    async fn create(
        &self,
        key: &str,
        guard: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<bool, EtcdError> {
        self.with_lease(
            ttl,
            |channel, lease| async move {
                let put = put_request(key, value, lease);
                let txn = TxnRequest {
                    // Over a range, etcd compares every key in it, and
                    // an empty range as a key of version 0.
                    compare: vec![Compare {
                        result: compare::CompareResult::Equal as i32,
                        target: compare::CompareTarget::Version as i32,
                        key: guard.as_bytes().to_vec(),
                        target_union: Some(compare::TargetUnion::Version(0)),
                        range_end: prefix_end(guard),
                    }],
                    success: vec![RequestOp {
                        request: Some(request_op::Request::RequestPut(put)),
                    }],
                    failure: Vec::new(),
                };
                let request = self.request(&channel, txn).await?;
                Ok(call(Etcd::kv(&channel).txn(request)).await?.succeeded)
            },
            |created| *created,
        )
        .await
    }

    async fn put(&self, key: &str, value: &str, ttl: Duration) -> Result<(), EtcdError> {
        self.with_lease(
            ttl,
            |channel, lease| async move {
                let put = put_request(key, value, lease);
                let request = self.request(&channel, put).await?;
                call(Etcd::kv(&channel).put(request)).await.map(|_| ())
            },
            |_| true,
        )
        .await
    }

    async fn delete(&self, key: &str) -> Result<(), EtcdError> {
        self.on_endpoint(|channel| async move {
            let delete = DeleteRangeRequest {
                key: key.as_bytes().to_vec(),
                range_end: Vec::new(),
            };
            let request = self.request(&channel, delete).await?;
            call(Etcd::kv(&channel).delete_range(request))
                .await
                .map(|_| ())
        })
        .await
    }

    async fn watch(&self, prefix: &str, revision: i64) -> Result<Watch, EtcdError> {
        let (mut responses, keep_open) = self
            .on_endpoint(|channel| async move { self.open_watch(&channel, prefix, revision).await })
            .await?;
        // A watch that breaks for want of an answer moves the next calls
        // to another endpoint too, as they would find it as dead.
        let index = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let etcd = self.clone();
        let give_up = move |why: &str| etcd.next_endpoint(index, why);
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let mut liveness = Liveness::default();
            // Asked at once, so that the member's answer shows it answers
            // progress requests before it can be cut off.
            liveness.silent(&keep_open);
            loop {
                let response = match tokio::time::timeout(liveness.wait(), responses.next()).await {
                    Ok(Some(response)) => {
                        liveness.answered(&response);
                        response
                    }
                    Ok(None) => break,
                    Err(_) => {
                        if liveness.silent(&keep_open) {
                            let why = format!(
                                "no answer to a progress request within {}s",
                                PROGRESS_ANSWER.as_secs()
                            );
                            give_up(&why);
                            let _ = tx.send(Err(EtcdError::Unavailable(why))).await;
                            return;
                        }
                        continue;
                    }
                };
                let message = match response {
                    Err(status) => Err(status_error(&status)),
                    Ok(r) if r.compact_revision > 0 => Ok(WatchMessage::Compacted {
                        compact_revision: r.compact_revision,
                    }),
                    Ok(r) if r.canceled => Err(EtcdError::Refused(format!(
                        "watch canceled: {}",
                        r.cancel_reason
                    ))),
                    Ok(r) if r.events.is_empty() => continue,
                    Ok(r) => Ok(WatchMessage::Events {
                        revision: r.header.map_or(0, |h| h.revision),
                        events: r
                            .events
                            .into_iter()
                            .filter_map(|e| {
                                let delete = e.r#type == EventType::Delete as i32;
                                let kv = key_value(e.kv?);
                                Some(if delete {
                                    Event::Delete { key: kv.key }
                                } else {
                                    Event::Put(kv)
                                })
                            })
                            .collect(),
                    }),
                };
                let last =
                    message.is_err() || matches!(message, Ok(WatchMessage::Compacted { .. }));
                if let Err(EtcdError::Unavailable(why)) = &message {
                    give_up(why);
                }
                if tx.send(message).await.is_err() || last {
                    return;
                }
            }
            let why = "the watch stream ended";
            give_up(why);
            let _ = tx.send(Err(EtcdError::Unavailable(why.into()))).await;
        });
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_bound_exactly_the_prefix() {
        assert_eq!(
            prefix_end("/coreos.com/network/subnets/"),
            b"/coreos.com/network/subnets0"
        );
        assert_eq!(prefix_end("a"), b"b");
    }

    #[test]
    fn a_silent_watch_is_given_up_only_by_a_member_that_answers_progress_requests() {
        let (requests, mut sent) = mpsc::channel(1);
        let mut liveness = Liveness::default();
        assert_eq!(liveness.wait(), WATCH_SILENCE);
        assert!(!liveness.silent(&requests), "the first silence only asks");
        assert!(matches!(
            sent.try_recv().expect("a progress request").request_union,
            Some(watch_request::RequestUnion::ProgressRequest(_))
        ));
        assert_eq!(liveness.wait(), PROGRESS_ANSWER);
        assert!(
            !liveness.silent(&requests),
            "a member never seen answering one may predate progress requests"
        );
        sent.try_recv().expect("asked again");
        liveness.answered(&Ok(WatchResponse {
            created: true,
            ..WatchResponse::default()
        }));
        assert!(!liveness.silent(&requests));
        sent.try_recv().expect("asked again");
        assert!(
            !liveness.silent(&requests),
            "the watch's creation is no answer to a progress request"
        );
        sent.try_recv().expect("asked again");
        liveness.answered(&Ok(WatchResponse {
            watch_id: PROGRESS_WATCH_ID,
            ..WatchResponse::default()
        }));
        assert!(!liveness.silent(&requests));
        assert!(
            liveness.silent(&requests),
            "asked, answered before, silent now"
        );
    }

    #[test]
    fn bad_options_are_named() {
        let options = |endpoints: &[&str]| EtcdOptions {
            endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            username: None,
            password: None,
        };
        let err = |o: &EtcdOptions| Etcd::new(o).err().expect("refused").to_string();
        assert!(
            err(&options(&["127.0.0.1:2379"])).contains("\"127.0.0.1:2379\": must start with http")
        );
        assert!(err(&options(&["https://10.0.0.1:2379"])).contains("needs --etcd-cafile"));
        assert!(err(&options(&[])).contains("no etcd endpoint"));
        let mut o = options(&["http://127.0.0.1:2379"]);
        o.cert_file = Some("/nonexistent/cert.pem".into());
        assert!(err(&o).contains("go together"));
        o.key_file = Some("/nonexistent/key.pem".into());
        assert!(err(&o).contains("reading /nonexistent/cert.pem"));
    }
}

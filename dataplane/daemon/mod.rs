//! vxmgrd: wires the socket, the server, the manager task and the kernel
//! task together, and stops them cleanly.

pub mod batch;
pub mod capabilities;
pub mod engine;
mod heap;
pub mod kernel_task;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{error, info, warn};

use crate::calc_source::EngineInput;
use crate::calc_source::felix_pipes::{FelixPipes, PipeError};
use crate::calc_source::recorder::Recorder;
use crate::config::{Config, SettingsLayer};
use crate::kernel::KernelBackend;
use crate::kernel::firewall::IptablesBackend;
use crate::kernel::memory::MemoryBackend;
use crate::kernel::netlink::NetlinkBackend;
use crate::manager::Manager;
use crate::metrics::Metrics;
use crate::metrics::backend::MeteredBackend;
use crate::metrics::http::{self as metrics_http, CensusQuery};
use crate::reconciler::{NexthopMode, Reconciler, ReconcilerOptions};
use crate::server::StateQuery;
use crate::server::{self, DataplaneService, socket::SocketError};
use engine::EngineOptions;
pub use heap::{release_free_memory, use_one_arena};
use kernel_task::KernelTaskOptions;

/// How long open streams get to finish when the daemon stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelKind {
    /// The Linux kernel, over netlink.
    Netlink,
    /// An in-memory kernel: nothing on the host changes.
    Memory,
}

/// Whether to switch off TX checksum offload on the VXLAN devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ChecksumOffloadBroken {
    /// On kernels up to 5.7, whose VXLAN checksum offload is broken.
    Auto,
    True,
    False,
}

#[derive(Clone, Debug)]
pub struct DaemonOptions {
    pub socket: PathBuf,
    pub socket_group: Option<String>,
    pub allow_uids: Vec<u32>,
    pub hostname: String,
    pub kernel: KernelKind,
    pub batch_interval: Duration,
    pub heartbeat_interval: Duration,
    pub device_check_interval: Duration,
    /// Interval of the legacy iptables poll; `None`: off.
    pub legacy_poll_interval: Option<Duration>,
    /// More than 5 repairs of one object within it make the object contested.
    pub contest_window: Duration,
    /// Responses buffered for a stream before its client counts as not reading.
    pub response_buffer: usize,
    pub nexthops: NexthopMode,
    pub checksum_offload_broken: ChecksumOffloadBroken,
    /// Forwarding rules for the IP pools through this iptables; `None`: off.
    pub forward_rules: Option<IptablesBackend>,
    /// Settings given on the command line: they beat ConfigUpdate.
    pub flags: SettingsLayer,
    pub record: Option<PathBuf>,
    /// Where to serve metrics and health over HTTP, if anywhere.
    pub http_listen: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("serving gRPC: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("opening the record file {}: {source}", path.display())]
    Record {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    NoNetAdmin(#[from] capabilities::MissingNetAdmin),
    #[error("the {0} kernel backend is not available: {1}")]
    Backend(&'static str, String),
    #[error("starting the kernel task: {0}")]
    Runtime(std::io::Error),
    #[error("listening for HTTP on {address}: {source}")]
    HttpListen {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    FelixPipes(#[from] PipeError),
}

/// Runs the daemon until `shutdown` completes, or, when `felix` gives
/// Felix's pipes as the calc source, until Felix closes them.
pub async fn run(
    options: DaemonOptions,
    felix: Option<FelixPipes>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    match options.kernel {
        KernelKind::Memory => {
            let open = || Ok(MemoryBackend::with_underlay("eth0", 1500));
            run_with_backend(open, options, felix, shutdown).await
        }
        KernelKind::Netlink => {
            capabilities::require_net_admin()?;
            let open =
                || NetlinkBackend::new().map_err(|e| DaemonError::Backend("netlink", e.message));
            run_with_backend(open, options, felix, shutdown).await
        }
    }
}

/// Runs the daemon on the kernel backend `open` makes.
pub async fn run_with_backend<B: KernelBackend>(
    open: impl FnOnce() -> Result<B, DaemonError> + Send + 'static,
    options: DaemonOptions,
    felix: Option<FelixPipes>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let recorder = match &options.record {
        Some(path) => Recorder::create(path).map_err(|source| DaemonError::Record {
            path: path.clone(),
            source,
        })?,
        None => Recorder::default(),
    };
    let http_listener = match options.http_listen {
        Some(address) => Some(
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|source| DaemonError::HttpListen { address, source })?,
        ),
        None => None,
    };
    let (listener, _socket_lock) =
        server::socket::bind(&options.socket, options.socket_group.as_deref()).await?;
    let calc_source = if felix.is_some() {
        "felix-pipes"
    } else {
        "socket"
    };
    info!(socket = %options.socket.display(), hostname = %options.hostname, kernel = ?options.kernel, calc_source, "vxmgrd starting");
    let metrics = Arc::new(Metrics::new());
    let (census_tx, census_rx) = mpsc::channel(4);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let started = Tasks::start(open, &options, health_reporter, metrics.clone(), census_rx).await;
    let tasks = match started {
        Ok(tasks) => tasks,
        Err(e) => {
            let _ = std::fs::remove_file(&options.socket);
            return Err(e);
        }
    };
    let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(http_listener) = http_listener {
        let endpoints = metrics_http::Endpoints {
            metrics,
            census: census_tx,
        };
        tokio::spawn(metrics_http::serve(http_listener, endpoints, async {
            let _ = http_stopped.await;
        }));
    }

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = server::serve(
        listener,
        options.allow_uids.clone(),
        DataplaneService::new(
            tasks.engine.clone(),
            tasks.queries.clone(),
            options.response_buffer,
            recorder.clone(),
            felix.is_some().then(|| {
                "the calc stream comes from Felix's pipes (vxmgrd runs as Felix's dataplane \
                 driver, calc source felix-pipes): Sync on the socket is refused"
                    .to_string()
            }),
        ),
        health_service,
        async {
            let _ = stop_rx.await;
        },
    );
    let felix_stream = async {
        match felix {
            Some(pipes) => {
                pipes
                    .run(tasks.engine.clone(), recorder, options.response_buffer)
                    .await
            }
            None => std::future::pending().await,
        }
    };
    let mut served = Ok(());
    let mut felix_ended = Ok(());
    tokio::select! {
        result = server => served = result,
        () = shutdown => {
            info!("stopping: the kernel is left as it is");
            let _ = stop_tx.send(());
        }
        ended = felix_stream => {
            match &ended {
                Ok(()) => info!("Felix closed the calc stream: stopping, the kernel is left as it is"),
                Err(e) => error!(error = %e, "stopping: the kernel is left as it is"),
            }
            felix_ended = ended;
            let _ = stop_tx.send(());
        }
    }
    let _ = http_stop.send(());
    tasks.stop().await;
    if let Err(e) = std::fs::remove_file(&options.socket) {
        warn!(error = %e, socket = %options.socket.display(), "could not remove the socket");
    }
    served?;
    felix_ended?;
    Ok(())
}

/// The manager task and the kernel thread, running; the server reaches them
/// through `engine` and `queries`.
struct Tasks {
    engine: mpsc::Sender<EngineInput>,
    queries: mpsc::Sender<StateQuery>,
    engine_task: tokio::task::JoinHandle<()>,
    kernel_thread: std::thread::JoinHandle<()>,
}

impl Tasks {
    /// Starts the kernel thread on the backend `open` makes, then the
    /// manager task. The backend, its sockets' connections and the
    /// reconciler live on a thread and a single-threaded runtime of their
    /// own: a pipelined apply is a stream of small requests and answers, and
    /// hopping between worker threads for each of them costs more than the
    /// work.
    async fn start<B: KernelBackend>(
        open: impl FnOnce() -> Result<B, DaemonError> + Send + 'static,
        options: &DaemonOptions,
        health: HealthReporter,
        metrics: Arc<Metrics>,
        census: mpsc::Receiver<CensusQuery>,
    ) -> Result<Tasks, DaemonError> {
        // Known before the first Health/Check can arrive: NOT_SERVING, not NOT_FOUND.
        health
            .set_service_status(engine::SERVICE_NAME, ServingStatus::NotServing)
            .await;
        let config = Config::new(options.flags.clone());
        let settings = config.settings();
        let manager = Manager::new(&options.hostname, config);
        let reconciler_options = ReconcilerOptions {
            nexthops: options.nexthops,
            disable_tx_checksum: checksum_offload_off(options.checksum_offload_broken),
            route_protocol: settings.route_protocol,
            contest_window: options.contest_window,
        };

        // Chunks of messages (up to 1024 each), stream events.
        let (engine_tx, engine_rx) = mpsc::channel(64);
        let (queries_tx, queries_rx) = mpsc::channel(16);
        let (kernel_tx, kernel_rx) = mpsc::channel(4);
        let (events_tx, events_rx) = mpsc::channel(16);
        let task_options = KernelTaskOptions {
            device_check_interval: options.device_check_interval,
            legacy_poll_interval: options.legacy_poll_interval,
            refresh_interval: settings.route_refresh_interval,
            metrics: metrics.clone(),
        };
        let backend_metrics = metrics.clone();
        let forward_rules = options.forward_rules;
        let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
        let kernel_thread = std::thread::Builder::new()
            .name("vxmgr-kernel".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = opened_tx.send(Err(DaemonError::Runtime(e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let backend = match open() {
                        Ok(backend) => MeteredBackend::new(backend, backend_metrics),
                        Err(e) => {
                            let _ = opened_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = opened_tx.send(Ok(()));
                    let mut reconciler = Reconciler::new(backend, reconciler_options).await;
                    reconciler.set_forward_rules(forward_rules);
                    kernel_task::run(reconciler, task_options, kernel_rx, events_tx, census).await;
                });
            })
            .map_err(DaemonError::Runtime)?;
        match opened_rx.await {
            Ok(opened) => opened?,
            Err(_) => return Err(DaemonError::Backend("kernel", "its thread ended".into())),
        }
        let engine_task = tokio::spawn(engine::run(
            manager,
            EngineOptions {
                batch_interval: options.batch_interval,
                heartbeat_interval: options.heartbeat_interval,
                metrics,
            },
            engine_rx,
            queries_rx,
            kernel_tx,
            events_rx,
            health,
        ));
        Ok(Tasks {
            engine: engine_tx,
            queries: queries_tx,
            engine_task,
            kernel_thread,
        })
    }

    /// Lets the manager task apply what it received, then waits for both
    /// to end.
    async fn stop(self) {
        // Give open streams a moment to see the end, then let go of them.
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, self.engine.send(EngineInput::Shutdown)).await;
        drop(self.engine);
        if let Err(e) = self.engine_task.await {
            warn!(error = %e, "manager task failed");
        }
        let kernel = self.kernel_thread;
        if !matches!(
            tokio::task::spawn_blocking(move || kernel.join()).await,
            Ok(Ok(()))
        ) {
            warn!("kernel task failed");
        }
    }
}

fn checksum_offload_off(mode: ChecksumOffloadBroken) -> bool {
    match mode {
        ChecksumOffloadBroken::True => true,
        ChecksumOffloadBroken::False => false,
        ChecksumOffloadBroken::Auto => kernel_release()
            .map(|(major, minor)| (major, minor) <= (5, 7))
            .unwrap_or(false),
    }
}

/// The running kernel's major and minor version.
fn kernel_release() -> Option<(u32, u32)> {
    let uname = nix::sys::utsname::uname().ok()?;
    let release = uname.release().to_str()?;
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

//! vxmgrd: the VXLAN dataplane daemon.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ipnetwork::IpNetwork;
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

use vxmgr::calc_source::felix_pipes::FelixPipes;
use vxmgr::config::{self, SettingsLayer};
use vxmgr::daemon::{self, ChecksumOffloadBroken, DaemonOptions, KernelKind};
use vxmgr::kernel::firewall::IptablesBackend;
use vxmgr::reconciler::NexthopMode;

/// Programs the kernel's VXLAN dataplane (device, ARP/FDB, routes,
/// blackholes, allowed-sources ipset) from a Felix-compatible calc stream
/// received over gRPC on a unix socket, or from Felix itself as its
/// external dataplane driver.
#[derive(Parser, Debug)]
#[command(name = "vxmgrd", version)]
struct Cli {
    /// Where the calc stream comes from: Sync on the socket, or Felix's
    /// pipes (fds 3 and 4) when Felix runs vxmgrd as its dataplane driver.
    #[arg(long, env = "VXMGR_CALC_SOURCE", value_enum, default_value_t = CalcSource::Socket)]
    calc_source: CalcSource,
    /// Unix socket to serve on (its directory is created; mode 0600).
    #[arg(
        long,
        env = "VXMGR_SOCKET",
        default_value = "/run/vxmgr/dataplane.sock"
    )]
    socket: PathBuf,
    /// Group allowed to connect: the socket becomes 0660 with this group.
    #[arg(long, env = "VXMGR_SOCKET_GROUP")]
    socket_group: Option<String>,
    /// Only accept connections from these uids (checked with SO_PEERCRED);
    /// repeatable. Without it, the socket's permissions decide.
    #[arg(long = "allow-uid", env = "VXMGR_ALLOW_UID", value_delimiter = ',')]
    allow_uids: Vec<u32>,
    /// This node's name, as the calc process calls it [default: the system hostname].
    #[arg(long, env = "VXMGR_HOSTNAME")]
    hostname: Option<String>,
    /// Which kernel to program.
    #[arg(long, env = "VXMGR_KERNEL", value_enum, default_value_t = KernelKind::Netlink)]
    kernel: KernelKind,
    /// The longest a batch stays open while messages keep coming. A batch
    /// closes as soon as the stream has nothing more waiting and the kernel
    /// is free; while an apply is in flight, what arrives waits for the next.
    #[arg(long, env = "VXMGR_BATCH_INTERVAL", value_parser = humantime::parse_duration, default_value = "100ms")]
    batch_interval: Duration,
    /// Interval of heartbeats on the Sync stream.
    #[arg(long, env = "VXMGR_HEARTBEAT_INTERVAL", value_parser = humantime::parse_duration, default_value = "10s")]
    heartbeat_interval: Duration,
    /// Interval of full resyncs with the kernel: a duration ("90s", "2m") or
    /// a number of seconds; 0 turns them off [default: 90s, or the calc
    /// process's RouteRefreshInterval].
    #[arg(long, env = "VXMGR_ROUTE_REFRESH_INTERVAL", value_parser = |v: &str| config::parse_refresh_interval(v).map(Setting))]
    route_refresh_interval: Option<Setting<Duration>>,
    /// Interval of the VXLAN device check (repairs a deleted or changed device).
    #[arg(long, env = "VXMGR_DEVICE_CHECK_INTERVAL", value_parser = humantime::parse_duration, default_value = "10s")]
    device_check_interval: Duration,
    /// More than 5 repairs of one object (changed by another agent) within
    /// this window make vxmgr stop repairing it for half the window,
    /// doubling with each fight up to 30 windows.
    #[arg(long, env = "VXMGR_CONTEST_WINDOW", value_parser = parse_contest_window, default_value = "10s")]
    contest_window: Duration,
    /// VXLAN network identifier [default: 4096, or the calc's VXLANVNI].
    #[arg(long, env = "VXMGR_VXLAN_VNI", value_parser = config::parse_vni)]
    vxlan_vni: Option<u32>,
    /// VXLAN UDP port [default: 4789, or the calc's VXLANPort].
    #[arg(long, env = "VXMGR_VXLAN_PORT", value_parser = config::parse_port)]
    vxlan_port: Option<u16>,
    /// IPv4 device MTU; 0: parent interface MTU − 50 [default: 0, or the calc's VXLANMTU].
    #[arg(long, env = "VXMGR_VXLAN_MTU", value_parser = |v: &str| config::parse_mtu_v4(v).map(Setting))]
    vxlan_mtu: Option<Setting<u32>>,
    /// IPv6 device MTU; 0: parent interface MTU − 70 [default: 0, or the calc's VXLANMTUV6].
    #[arg(long, env = "VXMGR_VXLAN_MTU_V6", value_parser = |v: &str| config::parse_mtu_v6(v).map(Setting))]
    vxlan_mtu_v6: Option<Setting<u32>>,
    /// Protocol number of vxmgr's routes and nexthops, 5-255 (0-4 are the
    /// kernel's and administrators') [default: 80, or the calc's
    /// DeviceRouteProtocol, where Felix's 3 means 80].
    #[arg(long, env = "VXMGR_ROUTE_PROTOCOL", value_parser = config::parse_protocol)]
    route_protocol: Option<u8>,
    /// CIDR of hosts outside the cluster allowed to send VXLAN traffic;
    /// repeatable [default: the calc's ExternalNodesCIDRList].
    #[arg(
        long = "external-nodes-cidr",
        env = "VXMGR_EXTERNAL_NODES_CIDR",
        value_delimiter = ','
    )]
    external_nodes_cidr: Vec<IpNetwork>,
    /// Record every received message to FILE (.jsonl: JSON lines; otherwise Felix framing).
    #[arg(long, env = "VXMGR_RECORD", value_name = "FILE")]
    record: Option<PathBuf>,
    /// Route through one nexthop object per remote node.
    #[arg(long, env = "VXMGR_NEXTHOP_OBJECTS", value_enum, default_value_t = NexthopMode::Auto)]
    nexthop_objects: NexthopMode,
    /// Accept forwarded traffic from and to the IP pools in a chain of
    /// vxmgr's own in iptables' filter table, jumped to from the top of
    /// FORWARD (false: the host's firewall is managed elsewhere).
    #[arg(long, env = "VXMGR_FORWARD_RULES", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    forward_rules: bool,
    /// The iptables the forward rules go through (auto: the one the host
    /// uses, detected as Felix does).
    #[arg(long, env = "VXMGR_IPTABLES_BACKEND", value_enum, default_value_t = IptablesBackend::Auto)]
    iptables_backend: IptablesBackend,
    /// Interval of the check of the legacy iptables backend's filter
    /// tables, which send no change notification (nftables' do): a new
    /// FORWARD drop or rule there moves the forward rules within it. Runs
    /// only with forward rules through auto or legacy; 0 turns it off
    /// (then the route refresh catches such changes).
    #[arg(long, env = "VXMGR_IPTABLES_LEGACY_POLL_INTERVAL", value_parser = humantime::parse_duration, default_value = "1s")]
    iptables_legacy_poll_interval: Duration,
    /// Turn TX checksum offload off on the VXLAN devices.
    #[arg(long, env = "VXMGR_CHECKSUM_OFFLOAD_BROKEN", value_enum, default_value_t = ChecksumOffloadBroken::Auto)]
    checksum_offload_broken: ChecksumOffloadBroken,
    /// Responses buffered for a calc stream before its client counts as
    /// not reading (for tests).
    #[arg(long, hide = true, default_value_t = vxmgr::server::RESPONSE_BUFFER, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1 << 20))]
    response_buffer: usize,
    /// Serve Prometheus metrics (/metrics) and health probes (/livez,
    /// /readyz, and Felix's /liveness, /readiness) over HTTP on ADDR:PORT
    /// [default: no HTTP listener].
    #[arg(long, env = "VXMGR_HTTP_LISTEN", value_name = "ADDR:PORT")]
    http_listen: Option<SocketAddr>,
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "vxmgr=debug".
    #[arg(long, env = "VXMGR_LOG", default_value = "info")]
    log: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum CalcSource {
    /// `Sync` on the socket.
    Socket,
    /// Felix's external dataplane driver pipes: fd 3 in, fd 4 out.
    FelixPipes,
}

/// Up to a day: back-off times stay within what the clock can add.
fn parse_contest_window(v: &str) -> Result<Duration, String> {
    match humantime::parse_duration(v) {
        Ok(d) if d <= Duration::from_secs(86400) => Ok(d),
        Ok(_) => Err("the contest window is at most a day".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A setting whose value may be "automatic" or "off" (`None`). Wrapped so
/// that clap does not read `Option<Option<T>>` as a flag with an optional value.
#[derive(Clone, Debug)]
struct Setting<T>(Option<T>);

impl Cli {
    fn into_options(self) -> anyhow::Result<DaemonOptions> {
        let hostname = match self.hostname {
            Some(h) => h,
            None => nix::unistd::gethostname()
                .context("reading the system hostname")?
                .into_string()
                .map_err(|h| anyhow::anyhow!("the system hostname {h:?} is not UTF-8"))?,
        };
        let external_nodes = (!self.external_nodes_cidr.is_empty()).then(|| {
            self.external_nodes_cidr
                .iter()
                .map(|n| IpNetwork::new(n.network(), n.prefix()).expect("same prefix"))
                .collect()
        });
        Ok(DaemonOptions {
            socket: self.socket,
            socket_group: self.socket_group,
            allow_uids: self.allow_uids,
            hostname,
            kernel: self.kernel,
            batch_interval: self.batch_interval,
            heartbeat_interval: self.heartbeat_interval,
            device_check_interval: self.device_check_interval,
            legacy_poll_interval: (!self.iptables_legacy_poll_interval.is_zero())
                .then_some(self.iptables_legacy_poll_interval),
            contest_window: self.contest_window,
            response_buffer: self.response_buffer,
            nexthops: self.nexthop_objects,
            checksum_offload_broken: self.checksum_offload_broken,
            forward_rules: self.forward_rules.then_some(self.iptables_backend),
            flags: SettingsLayer {
                vni: self.vxlan_vni,
                port: self.vxlan_port,
                mtu_v4: self.vxlan_mtu.map(|s| s.0),
                mtu_v6: self.vxlan_mtu_v6.map(|s| s.0),
                route_protocol: self.route_protocol,
                external_nodes,
                route_refresh_interval: self.route_refresh_interval.map(|s| s.0),
                ..SettingsLayer::default()
            },
            record: self.record,
            http_listen: self.http_listen,
        })
    }
}

/// Errors end the daemon with one line on stderr, whatever RUST_BACKTRACE
/// says: they are about the setup, not the code.
fn main() -> ExitCode {
    match start(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vxmgrd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn start(cli: Cli) -> anyhow::Result<()> {
    // Before the runtime opens its own files, which would take fds 3 and 4
    // when Felix did not pass them.
    let felix = match cli.calc_source {
        CalcSource::FelixPipes => Some(FelixPipes::take()?),
        CalcSource::Socket => None,
    };
    daemon::use_one_arena();
    tokio::runtime::Runtime::new()
        .context("starting the runtime")?
        .block_on(run(cli, felix))
}

async fn run(cli: Cli, felix: Option<FelixPipes>) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cli.log).context("parsing --log")?)
        .with_writer(std::io::stderr)
        // Colours for a terminal only, not for journald or a log file, and
        // not when NO_COLOR asks for none.
        .with_ansi(
            std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let options = cli.into_options()?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    daemon::run(options, felix, shutdown).await?;
    Ok(())
}

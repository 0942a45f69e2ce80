//! calc-flannel: flannel's subnet manager as a calc process for vxmgrd.
//! Each node holds a lease of the network (a subnet leased in etcd, in
//! flannel's etcd v3 layout, or its Node's podCIDR with the Kubernetes
//! API, as flanneld's kube subnet manager), follows the other nodes' leases
//! and streams them to vxmgrd as Felix messages: VXLAN tunnel endpoints and
//! routes (vxlan), or direct routes (host-gw).

mod agent;
mod allocate;
mod backoff;
mod cli;
mod dataplane;
mod health;
mod host;
mod iface;
mod lease;
mod network;
mod registry;
mod subnet;
mod subnet_env;
mod view;
mod vtep_mac;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use agent::{Agent, AgentOptions};
use cli::Cli;
use dataplane::Dataplane;
use health::{Health, HealthProbes};
use host::HostNetwork;
use iface::IfaceSpec;
use registry::SubnetManager;
use registry::etcd::client::{Etcd, EtcdOptions};
use registry::etcd::{EtcdSubnetManager, LeaseOptions};
use registry::kube::api::{ApiOptions, KubeApi};
use registry::kube::node::AnnotationNames;
use registry::kube::{KubeOptions, KubeSubnetManager};

// One thread: the agent's work is one event after another, and a watch
// event crosses several tasks (etcd's connection, the watch, the agent,
// vxmgrd's connection) on its way to vxmgrd; on one thread each hand-over
// is a queue push, not a wake-up of another thread.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse_all();
    match EnvFilter::try_new(&cli.log) {
        Ok(filter) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(
                std::io::stderr().is_terminal()
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            )
            .init(),
        Err(e) => {
            eprintln!("calc-flannel: --log {:?}: {e}", cli.log);
            return ExitCode::from(2);
        }
    }
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    cli.check().map_err(anyhow::Error::msg)?;
    let health = Arc::new(Health::default());
    if let Some(address) = cli.healthz_address() {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("listening on {address} (--healthz-ip, --healthz-port)"))?;
        tokio::spawn(vxmgr::metrics::http::serve(
            listener,
            HealthProbes(health.clone()),
            std::future::pending(),
        ));
    }
    let options = AgentOptions {
        subnet_file: cli.subnet_file.clone(),
        ip_masq: cli.ip_masq,
        iface: IfaceSpec {
            ifaces: cli.iface.clone(),
            regexes: cli.iface_regex.clone(),
            public_ip: cli.public_ip,
            public_ipv6: cli.public_ipv6,
        },
    };
    let host = HostNetwork::read().await?;
    let dataplane = Dataplane::new(&cli.socket);
    if cli.kube_subnet_mgr {
        let node =
            cli::node_identity(|name| std::env::var(name).ok()).map_err(anyhow::Error::msg)?;
        let api = KubeApi::new(&ApiOptions {
            kubeconfig: cli.kubeconfig_file.clone(),
            url: cli.kube_api_url.clone(),
        })
        .await?;
        info!(?node, net_config = %cli.net_config_path.display(), socket = %cli.socket.display(), "calc-flannel starting with the Kubernetes API");
        let manager = KubeSubnetManager::new(
            api,
            KubeOptions {
                node,
                net_config_path: cli.net_config_path.clone(),
                annotations: AnnotationNames::new(&cli.kube_annotation_prefix),
                set_node_network_unavailable: cli.set_node_network_unavailable,
            },
        );
        until_stopped(Agent::new(manager, dataplane, host, options, health)).await
    } else {
        let etcd = Etcd::new(&EtcdOptions {
            endpoints: cli.etcd_endpoints.clone(),
            ca_file: cli.etcd_cafile.clone(),
            cert_file: cli.etcd_certfile.clone(),
            key_file: cli.etcd_keyfile.clone(),
            username: cli.etcd_username.clone(),
            password: cli.etcd_password.clone(),
        })
        .context("setting up the etcd client")?;
        let lease_options = LeaseOptions {
            prefix: cli.etcd_prefix.trim_end_matches('/').to_string(),
            lease_ttl: cli.subnet_lease_ttl,
            renew_margin: cli.subnet_lease_renew_margin,
        };
        info!(endpoints = ?cli.etcd_endpoints, prefix = %lease_options.prefix, socket = %cli.socket.display(), "calc-flannel starting on etcd");
        let manager = EtcdSubnetManager::new(etcd, lease_options);
        until_stopped(Agent::new(manager, dataplane, host, options, health)).await
    }
}

/// Runs the agent until it fails or a signal stops it. The lease stays (in
/// etcd until its TTL), and the kernel as vxmgrd has it.
async fn until_stopped<M: SubnetManager>(agent: Agent<M>) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let run = async { agent.run().await.map_err(anyhow::Error::from) };
    tokio::select! {
        result = run => result.context("calc-flannel stopped")?,
        _ = term.recv() => info!("SIGTERM: stopping; the lease and the kernel stay as they are"),
        _ = int.recv() => info!("SIGINT: stopping; the lease and the kernel stay as they are"),
    }
    Ok(())
}

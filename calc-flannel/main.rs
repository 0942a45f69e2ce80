//! calc-flannel: flannel's subnet manager on etcd as a calc process for
//! vxmgrd. Each node leases a subnet of the network from etcd (flannel's
//! etcd v3 layout, so real flanneld nodes can share the etcd), watches the
//! other nodes' leases and streams them to vxmgrd as Felix messages: VXLAN
//! tunnel endpoints and routes (vxlan), or direct routes (host-gw).

mod agent;
mod allocate;
mod backoff;
mod cli;
mod dataplane;
mod etcd;
mod host;
mod iface;
mod lease;
#[cfg(test)]
mod memory_registry;
mod network;
mod registry;
mod subnet;
mod subnet_env;
mod view;
mod vtep_mac;

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use agent::{Agent, AgentOptions};
use cli::Cli;
use dataplane::Dataplane;
use etcd::{Etcd, EtcdOptions};
use host::HostNetwork;
use iface::IfaceSpec;

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
    let etcd = Etcd::new(&EtcdOptions {
        endpoints: cli.etcd_endpoints.clone(),
        ca_file: cli.etcd_cafile.clone(),
        cert_file: cli.etcd_certfile.clone(),
        key_file: cli.etcd_keyfile.clone(),
        username: cli.etcd_username.clone(),
        password: cli.etcd_password.clone(),
    })
    .context("setting up the etcd client")?;
    let options = AgentOptions {
        prefix: cli.etcd_prefix.trim_end_matches('/').to_string(),
        subnet_file: cli.subnet_file.clone(),
        lease_ttl: cli.subnet_lease_ttl,
        renew_margin: cli.subnet_lease_renew_margin,
        ip_masq: cli.ip_masq,
        iface: IfaceSpec {
            ifaces: cli.iface.clone(),
            regexes: cli.iface_regex.clone(),
            public_ip: cli.public_ip,
            public_ipv6: cli.public_ipv6,
        },
    };
    info!(endpoints = ?cli.etcd_endpoints, prefix = %options.prefix, socket = %cli.socket.display(), "calc-flannel starting");
    let host = HostNetwork::read().await?;
    let agent = Agent::new(etcd, Dataplane::new(&cli.socket), host, options);
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        result = agent.run() => result.context("calc-flannel stopped")?,
        _ = term.recv() => info!("SIGTERM: stopping; the lease stays until its TTL, the kernel as vxmgrd has it"),
        _ = int.recv() => info!("SIGINT: stopping; the lease stays until its TTL, the kernel as vxmgrd has it"),
    }
    Ok(())
}

//! calc-stub: stands in for the calc process. Replays recorded message
//! streams into vxmgrd and generates synthetic clusters.

mod demo;
mod generate;
mod replay;
// The namespace testbed. The demo runs on its cluster; tests/ and benches/
// include this same directory (with #[path]) and use the rest of it.
#[allow(dead_code, unused_imports)]
mod testbed;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Stands in for a calc process (Felix's calc graph, a flannel-style subnet
/// manager): replays recorded message streams into vxmgrd, generates
/// synthetic clusters, and runs the two-node demo.
#[derive(Parser)]
#[command(name = "calc-stub", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Stream replay files to vxmgrd and print every BatchStatus as a JSON line.
    ///
    /// Messages are sent as they are, numbers included; the daemon numbers
    /// those that carry none after their predecessor. Each message is sent
    /// as soon as it is read, while the rest of the files are read. A line or
    /// frame that does not read stops the replay there: the messages before
    /// it have been sent and their statuses are printed, nothing from it on
    /// is sent, and calc-stub exits 2 naming the file and line (or byte
    /// offset). Exits 0 when every batch was OK, 1 when a message was
    /// rejected, a kernel operation failed or the state differs from
    /// --expect, 2 when a file cannot be read or the daemon cannot be
    /// reached.
    Replay(replay::ReplayArgs),
    /// Write a synthetic cluster, as one node sees it, as JSON lines.
    Generate(generate::GenerateArgs),
    /// Two nodes in network namespaces with vxmgrd on each, pod-to-pod ping
    /// over VXLAN, the kernel state shown, then torn down (needs root).
    /// With --flannel, etcd and calc-flannel drive the nodes.
    Demo(demo::DemoArgs),
}

/// Failures that stop calc-stub before it has a verdict (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    #[error(transparent)]
    Replay(#[from] vxmgr::wire::replay::ReplayError),
    #[error("connecting to {}: {source}", socket.display())]
    Connect {
        socket: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("{0}")]
    Rpc(#[from] tonic::Status),
    #[error("{0}")]
    Other(String),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => replay::run(args).await,
        Command::Generate(args) => generate::run(args),
        Command::Demo(args) => demo::run(args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("calc-stub: {e}");
            ExitCode::from(2)
        }
    }
}

//! A testbed of network namespaces: a small cluster with an underlay
//! bridge, node namespaces with a veth `eth0` on it, workload namespaces
//! attached to their node, and a real vxmgrd in each node namespace. The
//! namespace tests, the benchmarks and `calc-stub demo` all build on it:
//! it is part of calc-stub, and tests/ and benches/ include this directory
//! as a module of their own, so that the library does not carry it.
//! Needs root.

pub mod census;
pub mod churn;
mod cluster;
pub mod cni;
pub mod crashloop;
pub mod etcd;
pub mod etcd_cluster;
pub mod flannel;
pub mod host;
pub mod kube;
mod monitor;
pub mod stream;

use std::io::{self, Write};
use std::process::{Command, Output, Stdio};

pub use census::Census;
pub use churn::Churn;
pub use cluster::{Binaries, Cluster, Node, pool};
pub use cni::{Pod, PodNetwork};
pub use flannel::FlannelCluster;
pub use monitor::Monitor;

#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error("running {command}: {source}")]
    Spawn { command: String, source: io::Error },
    #[error("{command} failed ({status}):\n{output}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("{command}: unreadable output: {reason}")]
    Output { command: String, reason: String },
    #[error("{node}: vxmgrd did not start:\n{log}")]
    DaemonStart { node: String, log: String },
    #[error("no {what} within {timeout:?}; saw:\n{seen}")]
    Timeout {
        what: String,
        timeout: std::time::Duration,
        seen: String,
    },
    #[error(
        "ip monitor in {ns} lost notifications (its socket overran) while waiting for {what}: it may have happened unseen"
    )]
    MonitorOverrun { ns: String, what: String },
    #[error("churn: {0}")]
    Churn(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

pub type Result<T> = std::result::Result<T, TestbedError>;

fn describe(args: &[&str]) -> String {
    args.join(" ")
}

/// A command's output when it succeeded, or an error with everything it
/// printed.
pub fn succeeded(command: String, output: Output) -> Result<Output> {
    if output.status.success() {
        return Ok(output);
    }
    Err(TestbedError::Failed {
        command,
        status: output.status,
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}

/// Runs a command; its standard output, or an error with everything it printed.
pub fn run(args: &[&str]) -> Result<String> {
    let output = succeeded(describe(args), try_run(args)?)?;
    String::from_utf8(output.stdout).map_err(|e| TestbedError::Output {
        command: describe(args),
        reason: e.to_string(),
    })
}

/// Runs a command whatever its exit status.
pub fn try_run(args: &[&str]) -> Result<Output> {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|source| TestbedError::Spawn {
            command: describe(args),
            source,
        })
}

/// Deletes the routes of protocol 80 in namespace `ns` in one `ip -batch`.
/// Each nexthop removed while routes still use it makes the kernel walk
/// the whole FIB (25-100 s in all for 20,000 nodes × 4 blocks), and
/// removing the device or the namespace removes the nexthops; once the
/// routes are gone that is quick. (`ip route flush` cannot delete routes
/// that use a nexthop: the kernel refuses its request with EINVAL.)
pub fn delete_routes(ns: &str) -> Result<()> {
    let mut batch = String::new();
    for family in ["-4", "-6"] {
        for line in run(&["ip", "-n", ns, family, "route", "show", "proto", "80"])?.lines() {
            let mut words = line.split_whitespace();
            let Some(first) = words.next() else { continue };
            let dst = match first {
                "blackhole" | "unreachable" | "prohibit" => {
                    format!("{first} {}", words.next().unwrap_or_default())
                }
                _ => first.to_string(),
            };
            batch.push_str(&format!("route del {dst}\n"));
        }
    }
    let mut child = Command::new("ip")
        .args(["-n", ns, "-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|source| TestbedError::Spawn {
            command: format!("ip -n {ns} -batch -"),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(batch.as_bytes())?;
    }
    child.wait()?;
    Ok(())
}

/// A TCP port free on this namespace's loopback now.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn in_ns<'a>(ns: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(args);
    full
}

/// Runs a command inside namespace `ns`.
pub fn run_in(ns: &str, args: &[&str]) -> Result<String> {
    run(&in_ns(ns, args))
}

/// Runs a whitespace-separated command inside namespace `ns`.
pub fn sh(ns: &str, command: &str) -> Result<String> {
    run_in(ns, &command.split_whitespace().collect::<Vec<_>>())
}

/// Runs a command inside namespace `ns` whatever its exit status.
pub fn try_in(ns: &str, args: &[&str]) -> Result<Output> {
    try_run(&in_ns(ns, args))
}

/// `ip -j ...` in a namespace, parsed.
pub fn ip_json(ns: &str, args: &[&str]) -> Result<serde_json::Value> {
    let mut full = vec!["ip", "-n", ns, "-j"];
    full.extend_from_slice(args);
    let text = run(&full)?;
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    serde_json::from_str(&text).map_err(|e| TestbedError::Output {
        command: describe(&full),
        reason: format!("{e}: {text}"),
    })
}

//! Throwaway network namespaces with a veth underlay holding node-0's parent
//! address, removed when dropped (also when a scenario fails or panics).

use std::fs::File;
use std::future::Future;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

/// node-0's underlay address in `calc-stub generate`'s clusters (172.16.0.0 +
/// 0 + 1); the /12 holds every node's underlay address.
pub const PARENT_IP: &str = "172.16.0.1";
pub const PARENT_CIDR: &str = "172.16.0.1/12";
/// The interface holding it.
pub const UNDERLAY: &str = "veth0";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Prefix of the namespaces this bench creates, followed by `<pid>-<n>`.
const PREFIX: &str = "vxbench-";

/// Why the kernel scenarios cannot run here, if they cannot.
pub fn kernel_unavailable() -> Option<&'static str> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root for network namespaces");
    }
    if Command::new("ipset").arg("version").output().is_err() {
        return Some("needs the ipset command");
    }
    None
}

/// Removes namespaces left by runs of this bench that were interrupted
/// (Ctrl-C runs no destructors); a live run's are left alone.
pub fn remove_leftovers() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            eprintln!("removing network namespace {name}, left by an interrupted run");
            drop(Netns { name });
        }
    }
}

pub struct Netns {
    name: String,
}

/// Moves the calling thread into namespace `name` (`ip netns add`'s).
/// Sockets belong to the namespace of the thread that opens them, and
/// threads start in their parent's.
pub fn enter(name: &str) -> Result<()> {
    let path = format!("/run/netns/{name}");
    let netns = File::open(&path).with_context(|| format!("opening {path}"))?;
    nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering {path}"))
}

impl Netns {
    /// A fresh namespace: `lo` up and a veth pair whose `veth0` holds
    /// 172.16.0.1/12 (`dummy` links are not available on these kernels).
    pub fn with_underlay() -> Result<Netns> {
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let netns = Netns { name };
        netns.ip(&["link", "set", "lo", "up"])?;
        netns.ip(&[
            "link", "add", UNDERLAY, "type", "veth", "peer", "name", "veth1",
        ])?;
        netns.ip(&["addr", "add", PARENT_CIDR, "dev", UNDERLAY])?;
        netns.ip(&["link", "set", UNDERLAY, "up"])?;
        netns.ip(&["link", "set", "veth1", "up"])?;
        Ok(netns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<Output> {
        run(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`
    /// execs it, so the child's pid is the program's).
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    /// Runs `work` on a thread of its own that has entered the namespace,
    /// on a current-thread runtime built after it did: netlink sockets
    /// belong to the namespace of the thread that opens them, and a tokio
    /// worker must never change namespace.
    pub fn run_inside<F, Fut, R>(&self, work: F) -> Result<R>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<R>>,
        R: Send + 'static,
    {
        let name = self.name.clone();
        let thread = std::thread::spawn(move || -> Result<R> {
            enter(&name)?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(work())
        });
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Torn down here rather than by a kernel worker after `netns del`:
        // that worker would hold the RTNL lock, and eat CPU, during the
        // next measurement.
        if let Err(e) = crate::testbed::delete_routes(&self.name) {
            eprintln!("{}: deleting routes: {e:#}", self.name);
        }
        let _ = Command::new("ip")
            .args(["-n", &self.name, "link", "del", "vxlan.calico"])
            .output();
        if !matches!(
            Command::new("ip").args(["netns", "del", &self.name]).status(),
            Ok(s) if s.success()
        ) {
            eprintln!("could not delete network namespace {}", self.name);
        }
    }
}

/// Runs a command; an error names it and quotes its stderr.
pub fn run(command: &mut Command) -> Result<Output> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output)
}

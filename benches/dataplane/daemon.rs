//! A vxmgrd on a private socket, stopped when dropped however the scenario
//! ends.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::netns::Netns;

pub const VXMGRD: &str = env!("CARGO_BIN_EXE_vxmgrd");

const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Vxmgrd {
    child: Child,
    dir: TempDir,
}

impl Vxmgrd {
    /// `vxmgrd --kernel memory --hostname node-0 ARGS`; the memory kernel
    /// simulates an underlay holding every parent address.
    pub fn memory(args: &[&str]) -> Result<Vxmgrd> {
        let mut command = Command::new(VXMGRD);
        command.args(["--kernel", "memory"]);
        Vxmgrd::start(command, args)
    }

    /// `vxmgrd --kernel netlink --hostname node-0 ARGS` inside `netns`.
    pub fn netlink(netns: &Netns, args: &[&str]) -> Result<Vxmgrd> {
        let mut command = netns.command(VXMGRD);
        command.args(["--kernel", "netlink"]);
        Vxmgrd::start(command, args)
    }

    fn start(mut command: Command, args: &[&str]) -> Result<Vxmgrd> {
        let dir = tempfile::tempdir()?;
        let log = std::fs::File::create(dir.path().join("vxmgrd.log"))?;
        let child = command
            .args(["--hostname", "node-0", "--socket"])
            .arg(dir.path().join("vxmgr.sock"))
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {VXMGRD}"))?;
        let mut daemon = Vxmgrd { child, dir };
        daemon.wait_until_serving()?;
        Ok(daemon)
    }

    /// The socket is bound just before serving starts, and a connection
    /// made in between waits in the backlog.
    fn wait_until_serving(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        while UnixStream::connect(self.socket()).is_err() {
            if let Some(status) = self.child.try_wait()? {
                bail!("vxmgrd exited ({status}) before serving:\n{}", self.log());
            }
            if Instant::now() > deadline {
                bail!(
                    "vxmgrd not serving after {START_TIMEOUT:?}:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("vxmgr.sock")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("vxmgrd.log")).unwrap_or_default()
    }

    /// Whether vxmgrd has exited, waiting up to `wait` for it to: after a
    /// client's failure, what the daemon did next tells whose fault it was.
    pub fn state_after(&mut self, wait: Duration) -> String {
        let deadline = Instant::now() + wait;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return format!("vxmgrd exited ({status})"),
                Ok(None) if Instant::now() >= deadline => {
                    return format!("vxmgrd still running {wait:?} later");
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return format!("vxmgrd's state unknown: {e}"),
            }
        }
    }

    /// Resident memory (VmRSS), in bytes.
    pub fn rss_bytes(&self) -> Result<u64> {
        rss_bytes(self.child.id())
    }

    /// RssAnon and RssFile.
    pub fn resident(&self) -> Result<Resident> {
        let status = status_path(self.child.id());
        Ok(Resident {
            anon: status_bytes(&status, "RssAnon")?,
            file: status_bytes(&status, "RssFile")?,
        })
    }

    /// VmRSS once it holds still.
    pub fn settled_rss_bytes(&self) -> Result<u64> {
        settled_rss_bytes(self.child.id())
    }
}

/// Process `pid`'s resident memory (VmRSS), in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    status_bytes(&status_path(pid), "VmRSS")
}

fn status_path(pid: u32) -> std::path::PathBuf {
    Path::new("/proc").join(pid.to_string()).join("status")
}

/// One `kB` field of /proc/PID/status, in bytes.
fn status_bytes(status: &Path, field: &str) -> Result<u64> {
    let text = std::fs::read_to_string(status)?;
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .with_context(|| format!("no {field} in {}", status.display()))?;
    Ok(kib * 1024)
}

/// Resident memory split by what backs it.
#[derive(Clone, Copy, Debug)]
pub struct Resident {
    /// Heap, stacks: anonymous pages.
    pub anon: u64,
    /// The binary's and libraries' pages.
    pub file: u64,
}

/// Process `pid`'s VmRSS once it holds still: after the last status a
/// daemon still takes in the kernel's echoes of the last batch, and hands
/// back what was freed a second after its kernel task goes idle. Read
/// every 100 ms until the readings have agreed for 2 s (for at most 10 s,
/// then the last reading).
pub fn settled_rss_bytes(pid: u32) -> Result<u64> {
    const STILL_READINGS: u32 = 20;
    let mut last = rss_bytes(pid)?;
    let mut same = 0;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(100));
        let now = rss_bytes(pid)?;
        same = if now == last { same + 1 } else { 0 };
        last = now;
        if same == STILL_READINGS {
            break;
        }
    }
    Ok(last)
}

impl Drop for Vxmgrd {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        // SIGTERM lets it remove its socket; SIGKILL if it does not stop.
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

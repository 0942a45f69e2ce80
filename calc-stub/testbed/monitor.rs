//! `ip monitor` in a namespace, read line by line on a thread, so a caller
//! can wait for the kernel to report a change instead of sleeping.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Result, TestbedError, run};

/// Routes only the monitor uses, to know it has seen everything before
/// one: each marker its own address in 198.18.0.0/16 (part of RFC 2544's
/// benchmarking range). A marker waited for in vain (its wait timed out, or
/// the monitor lost notifications) may still be reported later, and must
/// not end a later wait before the changes that came first.
const MARKER_PREFIX: &str = "198.18.";
/// How long one marker is waited for, and how many are made.
const MARKER_WAIT: Duration = Duration::from_secs(1);
const MARKER_ATTEMPTS: u32 = 30;

/// What `ip monitor` reports: a change, or that it lost some (it says so
/// on stderr when its socket's receive buffer overran).
enum Report {
    Line(String),
    Overrun,
}

pub struct Monitor {
    ns: String,
    child: Child,
    reports: mpsc::Receiver<(Instant, Report)>,
    /// Every change reported so far.
    pub seen: Vec<String>,
    /// When each line of `seen` was read from `ip monitor`.
    pub seen_at: Vec<Instant>,
    /// How often it lost notifications: changes may be missing from `seen`.
    pub overruns: u32,
    /// Markers made so far: the next one's number.
    markers: u32,
}

impl Monitor {
    /// Starts `ip -n <ns> monitor route <objects>` and waits until it listens.
    pub fn start(ns: &str, objects: &[&str]) -> Result<Monitor> {
        let mut child = Command::new("ip")
            .args(["-n", ns, "monitor", "route"])
            .args(objects)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| TestbedError::Spawn {
                command: format!("ip -n {ns} monitor"),
                source,
            })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, reports) = mpsc::channel();
        let errors = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if tx.send((Instant::now(), Report::Line(line))).is_err() {
                    return;
                }
            }
        });
        // iproute2: "netlink receive error No buffer space available (105)",
        // and it reads on.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if line.contains("No buffer space")
                    && errors.send((Instant::now(), Report::Overrun)).is_err()
                {
                    return;
                }
            }
        });
        let mut monitor = Monitor {
            ns: ns.to_string(),
            child,
            reports,
            seen: Vec::new(),
            seen_at: Vec::new(),
            markers: 0,
            overruns: 0,
        };
        monitor.sync()?;
        monitor.clear();
        Ok(monitor)
    }

    /// Makes a change of its own and waits for it: every change the kernel
    /// reported before is then in `seen`. Right after start the monitor may
    /// not listen yet, so an unseen marker is made again.
    pub fn sync(&mut self) -> Result<()> {
        let mut attempts = 0;
        loop {
            let address = marker_address(self.markers);
            self.markers = self.markers.wrapping_add(1);
            let marker = format!("{address}/32");
            run(&["ip", "-n", &self.ns, "route", "add", &marker, "dev", "lo"])?;
            run(&["ip", "-n", &self.ns, "route", "del", &marker, "dev", "lo"])?;
            attempts += 1;
            let seen = self.wait_for("the monitor's own marker", MARKER_WAIT, |l| {
                l.starts_with("Deleted") && l.split_whitespace().nth(1) == Some(&address)
            });
            match seen {
                Ok(()) => break,
                Err(_) if attempts < MARKER_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
        let (seen, seen_at) = self
            .seen
            .drain(..)
            .zip(self.seen_at.drain(..))
            .filter(|(l, _)| !is_marker(l))
            .unzip();
        (self.seen, self.seen_at) = (seen, seen_at);
        Ok(())
    }

    /// Forgets the changes seen so far.
    pub fn clear(&mut self) {
        self.seen.clear();
        self.seen_at.clear();
    }

    /// The namespace it watches.
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// Waits for a reported line matching `want`; fails at once if the
    /// monitor lost notifications meanwhile.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        want: impl Fn(&str) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.reports.recv_timeout(left) {
                Ok((_, Report::Overrun)) => {
                    self.overruns += 1;
                    return Err(TestbedError::MonitorOverrun {
                        ns: self.ns.clone(),
                        what: what.to_string(),
                    });
                }
                Ok((at, Report::Line(line))) => {
                    let hit = want(&line);
                    self.seen.push(line);
                    self.seen_at.push(at);
                    if hit {
                        return Ok(());
                    }
                }
                Err(_) => {
                    return Err(TestbedError::Timeout {
                        what: what.to_string(),
                        timeout,
                        seen: self.seen.join("\n"),
                    });
                }
            }
        }
    }
}

/// The address of marker number `n`: 198.18.0.1 onwards, through
/// 198.18.255.254 before the numbers come round again.
fn marker_address(n: u32) -> String {
    let host = 1 + n % 0xfffe;
    format!("{MARKER_PREFIX}{}.{}", host >> 8, host & 0xff)
}

/// Whether an `ip monitor` line is about one of the monitor's markers.
fn is_marker(line: &str) -> bool {
    let mut words = line.split_whitespace().skip_while(|w| *w == "Deleted");
    words
        .next()
        .is_some_and(|dst| dst.starts_with(MARKER_PREFIX))
        && line.contains(" dev lo")
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! flannel-mode tests' policy: they need root, the etcd binary and the CNI
//! plugins; they skip without them, unless required
//! (`VXMGR_REQUIRE_NETNS=1`, `VXMGR_REQUIRE_ETCD=1`, `VXMGR_REQUIRE_CNI=1`),
//! and the cluster with this build's binaries.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::Daemon;
use super::testbed::{self, FlannelCluster, etcd};

use super::cni;
use super::netns::{binaries, can_run as netns_can_run};
use super::say;

pub const CALC_FLANNEL: &str = env!("CARGO_BIN_EXE_calc-flannel");

/// How long a calc-flannel process may take to log what a test waits for.
const AGENT_WAIT: Duration = Duration::from_secs(30);

/// `VXMGR_REQUIRE_ETCD=1`: a missing etcd binary fails the test.
pub fn etcd_required() -> bool {
    super::require::required("ETCD")
}

/// Whether a test needing etcd can run; says why not when it cannot.
pub fn etcd_available(test: &str) -> bool {
    if etcd::available() {
        return true;
    }
    super::require::skip(
        test,
        "ETCD",
        "needs the etcd binary (apt-get install etcd-server)",
    );
    false
}

/// Whether `tool` (run as `tool version`) is there for a test that needs
/// etcd; a failure without it under VXMGR_REQUIRE_ETCD=1.
pub fn tool_available(test: &str, tool: &str) -> bool {
    let found = Command::new(tool)
        .arg("version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        super::require::skip(test, "ETCD", &format!("needs {tool}"));
    }
    found
}

/// Whether a flannel namespace test can run (root, etcd, and the CNI
/// plugins that make its pods).
pub fn can_run(test: &str) -> bool {
    netns_can_run(test) && etcd_available(test) && cni::plugins_available(test)
}

/// The flanneld the interop test runs: `$FLANNELD`, a flanneld v0.20.x.
/// The test is opt-in: without the variable it skips, whatever the
/// `VXMGR_REQUIRE_*` variables say; set to anything but a flanneld v0.20.x,
/// it fails.
pub fn flanneld(test: &str) -> Option<PathBuf> {
    let Some(path) = std::env::var_os("FLANNELD").map(PathBuf::from) else {
        say(&format!(
            "SKIPPED {test}: set FLANNELD to a flanneld v0.20.x binary"
        ));
        return None;
    };
    if let Err(e) = testbed::flannel::flanneld_version(&path) {
        panic!("{test}: FLANNELD={}: {e}", path.display());
    }
    Some(path)
}

/// Runs `future` on a runtime of its own, from a synchronous test.
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// `n` nodes with etcd on the underlay; `VXMGR_KEEP_NETNS=1` leaves it.
pub fn cluster(n: u8) -> FlannelCluster {
    let mut cluster = FlannelCluster::new("vxf", n, &binaries(), CALC_FLANNEL.as_ref())
        .expect("build the cluster");
    if std::env::var_os("VXMGR_KEEP_NETNS").is_some_and(|v| v == "1") {
        say(&format!(
            "VXMGR_KEEP_NETNS=1: keeping namespaces {}*, etcd and {}",
            cluster.cluster.prefix,
            cluster.cluster.dir.display()
        ));
        cluster.keep();
    }
    cluster
}

/// calc-flannel with `args` on a vxmgrd of the memory kernel, stopped
/// when dropped.
pub struct Agent {
    child: Child,
    log: std::path::PathBuf,
}

impl Agent {
    /// Starts calc-flannel on `daemon`'s socket, logging to `<name>.log`.
    pub fn start(daemon: &Daemon, name: &str, args: &[&str]) -> Agent {
        Agent::start_with_env(daemon, name, args, &[])
    }

    /// [`Agent::start`] with these variables in its environment.
    pub fn start_with_env(
        daemon: &Daemon,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        let log = daemon.dir.path().join(format!("{name}.log"));
        let child = Command::new(CALC_FLANNEL)
            .arg("--socket")
            .arg(&daemon.socket)
            .arg("--subnet-file")
            .arg(daemon.dir.path().join("subnet.env"))
            // Any address will do: host-gw on vxmgrd's memory kernel.
            .args(["--iface", "127.0.0.1"])
            .args(args)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("calc-flannel starts");
        Agent { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn wait_for_log(&self, needle: &str) {
        let deadline = Instant::now() + AGENT_WAIT;
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

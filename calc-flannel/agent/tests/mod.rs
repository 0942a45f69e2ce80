//! The agent with a real vxmgrd in-process on its memory kernel, on each
//! subnet manager's in-memory store: what vxmgrd ends up with after leases
//! come, change and go.

mod etcd;
mod kube;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use vxmgr::config::SettingsLayer;
use vxmgr::daemon::{ChecksumOffloadBroken, DaemonOptions, KernelKind};
use vxmgr::reconciler::NexthopMode;
use vxmgr::wire::vxmgr::v1::{DataplaneState, GetStateRequest};

use super::*;
use crate::host::Interface;

/// vxmgrd (memory kernel) in this process.
struct Rig {
    dir: tempfile::TempDir,
    socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    daemon: JoinHandle<()>,
}

impl Rig {
    async fn start() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("vxmgr.sock");
        let options = DaemonOptions {
            socket: socket.clone(),
            socket_group: None,
            allow_uids: Vec::new(),
            hostname: "node-1".into(),
            kernel: KernelKind::Memory,
            batch_interval: Duration::from_millis(2),
            heartbeat_interval: Duration::from_secs(3600),
            device_check_interval: Duration::from_secs(3600),
            legacy_poll_interval: None,
            contest_window: vxmgr::reconciler::CONTEST_WINDOW,
            response_buffer: vxmgr::server::RESPONSE_BUFFER,
            nexthops: NexthopMode::On,
            checksum_offload_broken: ChecksumOffloadBroken::False,
            forward_rules: None,
            flags: SettingsLayer::default(),
            record: None,
            http_listen: None,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let daemon = tokio::spawn(async move {
            vxmgr::daemon::run(options, None, async {
                let _ = stopped.await;
            })
            .await
            .expect("vxmgrd runs");
        });
        let rig = Rig {
            dir,
            socket,
            stop: Some(stop),
            daemon,
        };
        rig.until("vxmgrd answers", |_| true).await;
        rig
    }

    fn subnet_file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// An agent of a node at `ip` on 192.168.10.0/24 on `manager`,
    /// running; `health` is what it reports.
    fn spawn<M: SubnetManager + Send + 'static>(
        &self,
        manager: M,
        ip: &str,
        health: Arc<Health>,
    ) -> JoinHandle<()> {
        let host = HostNetwork {
            interfaces: vec![Interface {
                name: "eth0".into(),
                index: 2,
                mtu: 1500,
                addresses: vec![format!("{ip}/24").parse().unwrap()],
            }],
            default_v4: Some(2),
            default_v6: None,
        };
        let options = AgentOptions {
            subnet_file: self.subnet_file(&format!("{ip}.env")),
            iface: IfaceSpec::default(),
            ip_masq: false,
        };
        let agent = Agent::new(manager, Dataplane::new(&self.socket), host, options, health);
        tokio::spawn(async move {
            agent.run().await.expect("the agent runs");
        })
    }

    async fn state(&self) -> Option<DataplaneState> {
        let mut client = vxmgr::client::dataplane(&self.socket).await.ok()?;
        Some(
            client
                .get_state(GetStateRequest {})
                .await
                .ok()?
                .into_inner(),
        )
    }

    /// Waits (up to 20 s) for vxmgrd's state to satisfy `done`.
    async fn until(&self, what: &str, done: impl Fn(&DataplaneState) -> bool) -> DataplaneState {
        let wait = async {
            loop {
                if let Some(state) = self.state().await.filter(|s| done(s)) {
                    return state;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        match tokio::time::timeout(Duration::from_secs(20), wait).await {
            Ok(state) => state,
            Err(_) => panic!(
                "{what}: not within 20 s; vxmgrd has {:#?}",
                self.state().await
            ),
        }
    }
}

/// Stops an agent's task. A panic in it (the agent failed, or broke an
/// assertion) fails the test here instead of going unseen with the task.
async fn stop(agent: JoinHandle<()>) {
    agent.abort();
    match agent.await {
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Ok(()) | Err(_) => {}
    }
}

/// Waits (up to 20 s) for `done`.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let wait = async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .is_err()
    {
        panic!("{what}: not within 20 s");
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.daemon.abort();
    }
}

/// The remote routes vxmgrd holds, of IPv4.
fn routes(state: &DataplaneState) -> BTreeSet<String> {
    let v4 = state.ipv4.as_ref().expect("IPv4 state");
    v4.tunnel_routes
        .iter()
        .map(|r| r.dst.clone())
        .chain(v4.direct_routes.iter().map(|r| r.dst.clone()))
        .collect()
}

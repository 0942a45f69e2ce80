//! A real etcd for the namespace tests, the demo and the benchmarks: the
//! `etcd` binary (Debian's etcd-server) on a data directory of its own,
//! in the namespace given, listening there over TCP and, for this process
//! in whatever namespace it is, on a unix socket in its directory. Stopped
//! and started again on the same data; killed when dropped. One may be a
//! member of a cluster of several (`etcd_cluster.rs`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tonic::transport::Channel;

use super::{Result, TestbedError, free_port};
use vxmgr::wire::etcd::{
    DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, kv_client::KvClient,
    request_op,
};

/// How long etcd may take to serve.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The socket etcd makes of `unix://etcd.sock:0`, in its working directory.
const SOCKET: &str = "etcd.sock:0";

/// Whether the `etcd` binary is on the PATH.
pub fn available() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub struct EtcdServer {
    ns: Option<String>,
    /// Its name and `--initial-cluster`.
    membership: Option<(String, String)>,
    dir: PathBuf,
    /// `http://<address>:2379` in its namespace (https with TLS).
    client_url: String,
    peer_url: String,
    tls: Option<EtcdTls>,
    child: Option<Child>,
    /// Says when the etcd started last serves.
    ready: Option<mpsc::Receiver<()>>,
}

/// PEM files for an etcd that serves TLS to clients and asks for their
/// certificates (signed by `ca`).
#[derive(Clone, Debug)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl EtcdServer {
    /// Starts etcd in namespace `ns` (`None`: this one) on `address`, ports
    /// 2379 and 2380 unless the address is a loopback one (then free ports
    /// are picked), with its data, socket and log in `dir`.
    pub fn start(ns: Option<&str>, address: &str, dir: &Path) -> Result<EtcdServer> {
        EtcdServer::start_with(ns, address, dir, None)
    }

    /// Like `start`, with `tls` on the TCP listener (the socket, for this
    /// process, stays plain).
    pub fn start_with(
        ns: Option<&str>,
        address: &str,
        dir: &Path,
        tls: Option<EtcdTls>,
    ) -> Result<EtcdServer> {
        let mut server = EtcdServer::new(ns, address, dir, tls)?;
        server.start_again()?;
        Ok(server)
    }

    /// An etcd not started yet: ports as `start` says.
    fn new(
        ns: Option<&str>,
        address: &str,
        dir: &Path,
        tls: Option<EtcdTls>,
    ) -> Result<EtcdServer> {
        std::fs::create_dir_all(dir)?;
        let (client, peer) = if ns.is_none() {
            (free_port()?, free_port()?)
        } else {
            (2379, 2380)
        };
        let host = if address.contains(':') {
            format!("[{address}]")
        } else {
            address.to_string()
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        Ok(EtcdServer {
            ns: ns.map(str::to_string),
            membership: None,
            dir: dir.to_path_buf(),
            client_url: format!("{scheme}://{host}:{client}"),
            peer_url: format!("http://{host}:{peer}"),
            tls,
            child: None,
            ready: None,
        })
    }

    /// A member named `name` of the cluster `initial_cluster` (etcd's
    /// `name=peer-url,...`), in namespace `ns` on `address`, started but
    /// not waited for: it serves once a quorum of members runs (see
    /// [`EtcdServer::wait_serving`]).
    pub fn spawn_member(
        ns: &str,
        address: &str,
        dir: &Path,
        name: &str,
        initial_cluster: &str,
    ) -> Result<EtcdServer> {
        let mut server = EtcdServer::new(Some(ns), address, dir, None)?;
        server.membership = Some((name.to_string(), initial_cluster.to_string()));
        server.spawn()?;
        Ok(server)
    }

    pub fn peer_url(&self) -> &str {
        &self.peer_url
    }

    /// The directory holding its data, socket and log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn client_url(&self) -> &str {
        &self.client_url
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// Starts etcd (again, on the same data) and waits until it serves.
    pub fn start_again(&mut self) -> Result<()> {
        self.spawn()?;
        self.wait_serving()
    }

    /// Starts etcd (again, on the same data).
    fn spawn(&mut self) -> Result<()> {
        let (name, initial_cluster) = self
            .membership
            .clone()
            .unwrap_or_else(|| ("default".into(), format!("default={}", self.peer_url)));
        // A killed etcd leaves its socket behind, and would not bind it.
        match std::fs::remove_file(self.socket_path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let mut command = match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "etcd"]);
                c
            }
            None => Command::new("etcd"),
        };
        command
            .current_dir(&self.dir)
            .args(["--name", &name, "--data-dir", "data"])
            .arg("--listen-client-urls")
            .arg(format!("{},unix://{SOCKET}", self.client_url))
            .args(["--advertise-client-urls", &self.client_url])
            .args(["--listen-peer-urls", &self.peer_url])
            .args(["--initial-advertise-peer-urls", &self.peer_url])
            .args(["--initial-cluster", &initial_cluster]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| TestbedError::Spawn {
                command: "etcd".into(),
                source,
            })?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut listeners_ready = 0;
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                let _ = writeln!(log, "{line}");
                // Once per listener: TCP and the socket.
                if line.contains("ready to serve client requests") {
                    listeners_ready += 1;
                    if listeners_ready == 2 {
                        let _ = ready_tx.send(());
                    }
                }
            }
        });
        self.child = Some(child);
        self.ready = Some(ready_rx);
        Ok(())
    }

    /// Waits until the etcd started last serves clients.
    pub fn wait_serving(&mut self) -> Result<()> {
        let ready = self.ready.take();
        if ready.is_some_and(|r| r.recv_timeout(START_TIMEOUT).is_ok()) {
            return Ok(());
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Err(TestbedError::Timeout {
            what: "etcd serving".into(),
            timeout: START_TIMEOUT,
            seen: std::fs::read_to_string(self.log_path()).unwrap_or_default(),
        })
    }

    /// Stops etcd (SIGTERM) and waits for it; its data stays.
    pub fn stop(&mut self) -> Result<()> {
        self.stop_with(libc::SIGTERM)
    }

    /// Stops etcd with `signal` and waits for it; its data stays.
    pub fn stop_with(&mut self, signal: i32) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            // `ip netns exec` execs etcd: the child's pid is etcd's.
            // SAFETY: kill(2) on our own child.
            unsafe {
                libc::kill(child.id() as i32, signal);
            }
            child.wait()?;
        }
        Ok(())
    }

    /// Its unix socket, reachable from this process's namespace.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join(SOCKET)
    }

    /// A client over the unix socket, from this process's namespace.
    pub async fn client(&self) -> Result<EtcdClient> {
        let channel = vxmgr::client::connect(&self.socket_path())
            .await
            .map_err(|e| {
                TestbedError::Io(std::io::Error::other(format!("connecting to etcd: {e}")))
            })?;
        Ok(EtcdClient {
            kv: KvClient::new(channel).max_decoding_message_size(64 << 20),
        })
    }
}

impl EtcdServer {
    /// Leaves etcd running when dropped.
    pub fn keep(&mut self) {
        std::mem::forget(self.child.take());
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Writes and reads as another node or an operator would.
#[derive(Clone)]
pub struct EtcdClient {
    kv: KvClient<Channel>,
}

fn rpc(e: tonic::Status) -> TestbedError {
    TestbedError::Io(std::io::Error::other(format!("etcd: {e}")))
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        lease: 0,
    }
}

impl EtcdClient {
    pub async fn put(&mut self, key: &str, value: &str) -> Result<()> {
        self.kv.put(put(key, value)).await.map_err(rpc)?;
        Ok(())
    }

    /// Several keys in one transaction (one revision).
    pub async fn put_all(&mut self, pairs: &[(String, String)]) -> Result<()> {
        let success = pairs
            .iter()
            .map(|(k, v)| RequestOp {
                request: Some(request_op::Request::RequestPut(put(k, v))),
            })
            .collect();
        let txn = TxnRequest {
            compare: Vec::new(),
            success,
            failure: Vec::new(),
        };
        self.kv.txn(txn).await.map_err(rpc)?;
        Ok(())
    }

    pub async fn delete(&mut self, key: &str) -> Result<()> {
        let request = DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
        };
        self.kv.delete_range(request).await.map_err(rpc)?;
        Ok(())
    }

    /// Every key under `prefix` with its value.
    pub async fn list(&mut self, prefix: &str) -> Result<Vec<(String, String)>> {
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let request = RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: end,
            ..Default::default()
        };
        let kvs = self.kv.range(request).await.map_err(rpc)?.into_inner().kvs;
        Ok(kvs
            .into_iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    String::from_utf8_lossy(&kv.value).into_owned(),
                )
            })
            .collect())
    }
}

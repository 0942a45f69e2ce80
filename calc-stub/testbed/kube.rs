//! A real Kubernetes API server for the tests, the demo and the
//! benchmarks: `kube-apiserver` (the binary named by
//! `VXMGR_KUBE_APISERVER`) on an etcd of its own, in the namespace given,
//! with a static admin token and the authorization mode asked for. No
//! controller manager, scheduler or kubelet runs: Nodes and their podCIDRs
//! are what the caller creates. Killed, with its etcd, when dropped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::etcd::EtcdServer;
use super::{Result, TestbedError, free_port};

/// How long kube-apiserver may take to answer `/readyz`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The port it serves on inside a namespace of its own.
const NS_PORT: u16 = 6443;
/// The admin's static token (the API server is private to the test).
const ADMIN_TOKEN: &str = "vxmgr-testbed-admin";

/// The binary in `variable`, when it names a file.
fn binary_from(variable: &str) -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os(variable)?);
    path.is_file().then_some(path)
}

/// `$VXMGR_KUBE_APISERVER`, when it names a file.
pub fn apiserver_binary() -> Option<PathBuf> {
    binary_from("VXMGR_KUBE_APISERVER")
}

/// `$VXMGR_KUBECTL`, when it names a file.
pub fn kubectl_binary() -> Option<PathBuf> {
    binary_from("VXMGR_KUBECTL")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Authorization {
    /// `--authorization-mode=RBAC`: what a real cluster does.
    Rbac,
    AlwaysAllow,
}

impl Authorization {
    fn mode(self) -> &'static str {
        match self {
            Authorization::Rbac => "RBAC",
            Authorization::AlwaysAllow => "AlwaysAllow",
        }
    }
}

pub struct KubeApiServer {
    ns: Option<String>,
    dir: PathBuf,
    /// `https://<address>:<port>`, in its namespace.
    pub url: String,
    /// The CA of the server's certificate (self-signed, written by it).
    pub ca_file: PathBuf,
    pub admin_token: String,
    kubectl: PathBuf,
    child: Option<Child>,
    /// Dropped after the API server.
    etcd: EtcdServer,
}

impl KubeApiServer {
    /// Starts etcd and kube-apiserver in namespace `ns` (`None`: this one)
    /// on `address` (port 6443 in a namespace, a free port on this one's
    /// loopback), with data, keys, certificates and logs in `dir`, and
    /// waits until `/readyz` answers.
    pub fn start(
        ns: Option<&str>,
        address: &str,
        dir: &Path,
        authorization: Authorization,
    ) -> Result<KubeApiServer> {
        let (apiserver, kubectl) = match (apiserver_binary(), kubectl_binary()) {
            (Some(a), Some(k)) => (a, k),
            _ => {
                return Err(TestbedError::Io(std::io::Error::other(
                    "VXMGR_KUBE_APISERVER and VXMGR_KUBECTL must name the kube-apiserver and kubectl binaries",
                )));
            }
        };
        std::fs::create_dir_all(dir)?;
        let etcd = EtcdServer::start(ns, "127.0.0.1", &dir.join("etcd"))?;
        let port = if ns.is_some() { NS_PORT } else { free_port()? };
        let host = if address.contains(':') {
            format!("[{address}]")
        } else {
            address.to_string()
        };
        let key = dir.join("sa.key");
        let public = dir.join("sa.pub");
        super::run(&["openssl", "genrsa", "-out", path(&key), "2048"])?;
        super::run(&[
            "openssl",
            "rsa",
            "-in",
            path(&key),
            "-pubout",
            "-out",
            path(&public),
        ])?;
        let tokens = dir.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n"),
        )?;
        let certs = dir.join("certs");
        let mut command = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&apiserver);
                c
            }
            None => Command::new(&apiserver),
        };
        command
            .arg(format!("--etcd-servers={}", etcd.client_url()))
            .arg(format!("--bind-address={address}"))
            .arg(format!("--advertise-address={address}"))
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", certs.display()))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", public.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                key.display()
            ))
            .arg(format!("--authorization-mode={}", authorization.mode()))
            .arg(format!("--token-auth-file={}", tokens.display()))
            .arg("--service-cluster-ip-range=10.96.0.0/16")
            .arg("--endpoint-reconciler-type=none")
            // 1.20 keeps a Node's second (IPv6) podCIDR only with the
            // dual-stack gate, alpha and off by default there.
            .arg("--feature-gates=IPv6DualStack=true")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("kube-apiserver.log"))?);
        let child = command.spawn().map_err(|source| TestbedError::Spawn {
            command: apiserver.display().to_string(),
            source,
        })?;
        let mut server = KubeApiServer {
            ns: ns.map(str::to_string),
            dir: dir.to_path_buf(),
            url: format!("https://{host}:{port}"),
            ca_file: certs.join("apiserver.crt"),
            admin_token: ADMIN_TOKEN.into(),
            kubectl,
            child: Some(child),
            etcd,
        };
        server.write_kubeconfig(&server.admin_kubeconfig(), ADMIN_TOKEN)?;
        server.wait_ready()?;
        Ok(server)
    }

    fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("kube-apiserver.log")
    }

    /// Polls `/readyz` (the server has no event to wait on) until it
    /// answers, the server exits, or the start timeout passes.
    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(TestbedError::Failed {
                    command: "kube-apiserver".into(),
                    status,
                    output: std::fs::read_to_string(self.log_path()).unwrap_or_default(),
                });
            }
            // The CA file appears first; kubectl needs it.
            if self.ca_file.is_file() && self.kubectl(&["get", "--raw", "/readyz"]).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(TestbedError::Timeout {
                    what: "kube-apiserver /readyz".into(),
                    timeout: START_TIMEOUT,
                    seen: std::fs::read_to_string(self.log_path()).unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Writes a kubeconfig at `path` that reaches this server with
    /// `token`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<()> {
        let text = format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: testbed\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\n\
             users:\n\
             - name: user\n  user:\n    token: {token}\n\
             contexts:\n\
             - name: testbed\n  context:\n    cluster: testbed\n    user: user\n\
             current-context: testbed\n",
            url = self.url,
            ca = self.ca_file.display(),
        );
        std::fs::write(path, text)?;
        Ok(())
    }

    fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut command = match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.kubectl);
                c
            }
            None => Command::new(&self.kubectl),
        };
        command
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args);
        command
    }

    /// kubectl as the admin, in the server's namespace: its output.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_stdin(args, "")
    }

    /// kubectl as the admin with `stdin` piped in (`apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Result<String> {
        let described = format!("kubectl {}", args.join(" "));
        let spawn = |source| TestbedError::Spawn {
            command: described.clone(),
            source,
        };
        let mut child = self
            .kubectl_command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn)?;
        let mut input = child.stdin.take().expect("stdin is piped");
        input.write_all(stdin.as_bytes())?;
        drop(input);
        let output = super::succeeded(described, child.wait_with_output()?)?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// A bound token of ServiceAccount `namespace/name`, from the
    /// TokenRequest API (no controller manager makes token Secrets here).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> Result<String> {
        let request = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600}}"#;
        let uri = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token");
        let answer = self.kubectl_stdin(&["create", "--raw", &uri, "-f", "-"], request)?;
        let json: serde_json::Value =
            serde_json::from_str(&answer).map_err(|e| TestbedError::Output {
                command: format!("kubectl create --raw {uri}"),
                reason: format!("{e}: {answer}"),
            })?;
        json["status"]["token"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| TestbedError::Output {
                command: format!("kubectl create --raw {uri}"),
                reason: format!("no status.token in {answer}"),
            })
    }

    /// Leaves the API server and its etcd running when dropped.
    pub fn keep(&mut self) {
        std::mem::forget(self.child.take());
        self.etcd.keep();
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("testbed paths are UTF-8")
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

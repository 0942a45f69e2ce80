//! The CNI commands as flannel's plugin answers them. ADD: subnet.env and
//! the plugin's config make the delegate's config, which is saved under
//! the container's ID, then the delegate adds. DEL: the saved config is
//! handed to the delegate and then removed (nothing saved: nothing to do,
//! subnet.env not read). CHECK: the saved config, with the runtime's
//! prevResult, goes to the delegate. Running a delegate is behind
//! [`Delegate`].

use std::io;
use std::path::{Path, PathBuf};

use cni_plugin::Command;
use cni_plugin::reply::{ErrorReply, VersionReply};
use semver::Version;
use serde_json::Value;
use vxmgr::subnet_env::{SubnetEnv, SubnetEnvError};

use crate::delegate_config::{ConfError, FlannelConf};

/// The spec versions this plugin speaks (flannel's own conflist says 0.3.1).
pub const SUPPORTED_VERSIONS: [&str; 4] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// Runs a delegate plugin (found by its type) with the runtime's
/// environment but `command`, `config` on its standard input.
pub trait Delegate {
    /// Its standard output when it succeeds.
    fn run(&self, plugin: &str, command: Command, config: &[u8]) -> Result<Vec<u8>, PluginError>;
}

/// What the runtime asked.
pub struct Request {
    pub command: Command,
    /// CNI_CONTAINERID, checked (every command but VERSION has one).
    pub container_id: String,
    /// Standard input.
    pub config: Vec<u8>,
}

/// What goes to standard output on success.
#[derive(Debug)]
pub enum Reply {
    /// ADD's result: the delegate's, byte for byte.
    Result(Vec<u8>),
    Version(VersionReply),
    /// DEL and CHECK print nothing.
    Nothing,
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(transparent)]
    Conf(#[from] ConfError),
    #[error("CNI version {0} is not one of {SUPPORTED_VERSIONS:?}")]
    Incompatible(Version),
    #[error("{}: {source}: is flannel (calc-flannel) running on this node?", path.display())]
    SubnetEnvMissing { path: PathBuf, source: io::Error },
    #[error("{}: {source}", path.display())]
    SubnetEnvBad {
        path: PathBuf,
        source: SubnetEnvError,
    },
    #[error("{}: {source}", path.display())]
    DataDir { path: PathBuf, source: io::Error },
    #[error("{}: {source}", path.display())]
    SavedConf {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("no delegate config saved for container {id} in {}: it was not added", dir.display())]
    UnknownContainer { id: String, dir: PathBuf },
    #[error("delegate type {0:?}: not a plugin name")]
    BadType(String),
    #[error("delegate plugin {plugin} not found in CNI_PATH {path:?}")]
    MissingPlugin { plugin: String, path: String },
    #[error("running delegate plugin {plugin}: {source}")]
    Spawn { plugin: String, source: io::Error },
    #[error("delegate plugin {plugin}: {msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
    Delegate {
        plugin: String,
        code: i32,
        msg: String,
        details: String,
    },
}

impl PluginError {
    /// The CNI error result: the spec's well-known codes where one fits.
    pub fn into_reply(self, cni_version: Version) -> ErrorReply<'static> {
        let (code, msg) = match &self {
            PluginError::Incompatible(_) => (1, "Incompatible CNI version"),
            PluginError::Conf(ConfError::Json(_)) => (6, "Cannot decode the network config"),
            PluginError::Conf(_) | PluginError::BadType(_) => (7, "Invalid network config"),
            PluginError::SubnetEnvMissing { .. } => (11, "No subnet.env yet; try again later"),
            PluginError::SubnetEnvBad { .. } => (7, "Malformed subnet.env"),
            PluginError::DataDir { .. } => (5, "I/O error in the data directory"),
            PluginError::SavedConf { .. } => (6, "Unreadable saved delegate config"),
            PluginError::UnknownContainer { .. } => (3, "Unknown container"),
            PluginError::MissingPlugin { .. } | PluginError::Spawn { .. } => {
                (5, "Cannot run the delegate plugin")
            }
            PluginError::Delegate { code, .. } => (*code, "Delegate plugin failed"),
        };
        ErrorReply {
            cni_version,
            code,
            msg,
            details: self.to_string(),
        }
    }
}

/// The version an error reply says: the config's, else the newest.
pub fn reply_version(config: &[u8]) -> Version {
    #[derive(serde::Deserialize)]
    struct Versioned {
        #[serde(rename = "cniVersion")]
        cni_version: String,
    }
    serde_json::from_slice::<Versioned>(config)
        .ok()
        .and_then(|v| Version::parse(&v.cni_version).ok())
        .unwrap_or_else(newest)
}

fn newest() -> Version {
    Version::new(1, 0, 0)
}

/// Answers `request`, running delegates through `delegate`.
pub fn handle(request: &Request, delegate: &impl Delegate) -> Result<Reply, PluginError> {
    if let Command::Version = request.command {
        return Ok(Reply::Version(VersionReply {
            cni_version: reply_version(&request.config),
            supported_versions: SUPPORTED_VERSIONS
                .iter()
                .map(|v| Version::parse(v).expect("a version"))
                .collect(),
        }));
    }
    let conf = FlannelConf::parse(&request.config)?;
    let version = &conf.network.cni_version;
    if !SUPPORTED_VERSIONS.contains(&version.to_string().as_str()) {
        return Err(PluginError::Incompatible(version.clone()));
    }
    let saved = Saved {
        path: conf.data_dir.join(&request.container_id),
    };
    match request.command {
        Command::Add => add(&conf, &saved, delegate),
        Command::Del => del(&saved, delegate),
        Command::Check => check(&conf, &saved, &request.container_id, delegate),
        Command::Version => unreachable!("answered above"),
    }
}

fn add(conf: &FlannelConf, saved: &Saved, delegate: &impl Delegate) -> Result<Reply, PluginError> {
    let env = read_subnet_env(&conf.subnet_file)?;
    let config = conf.delegate_config(&env);
    tracing::debug!(%config, "delegate config");
    let bytes = serde_json::to_vec(&config).expect("JSON values serialise");
    // Saved first: a failed ADD is followed by a DEL, which needs it.
    saved.write(&bytes)?;
    let plugin = plugin_type(&config)?;
    let output = delegate.run(plugin, Command::Add, &bytes)?;
    if let Err(e) = serde_json::from_slice::<serde_json::Map<String, Value>>(&output) {
        return Err(PluginError::Delegate {
            plugin: plugin.into(),
            code: 6,
            msg: "unreadable result".into(),
            details: format!("{e}: {}", String::from_utf8_lossy(&output)),
        });
    }
    Ok(Reply::Result(output))
}

fn del(saved: &Saved, delegate: &impl Delegate) -> Result<Reply, PluginError> {
    // Removed already, or never added: DEL succeeds, as the spec asks.
    let Some(config) = saved.read()? else {
        return Ok(Reply::Nothing);
    };
    delegate.run(plugin_type(&config)?, Command::Del, &saved.bytes(&config))?;
    saved.remove()?;
    Ok(Reply::Nothing)
}

fn check(
    conf: &FlannelConf,
    saved: &Saved,
    container_id: &str,
    delegate: &impl Delegate,
) -> Result<Reply, PluginError> {
    let Some(mut config) = saved.read()? else {
        return Err(PluginError::UnknownContainer {
            id: container_id.to_string(),
            dir: conf.data_dir.clone(),
        });
    };
    if let (Some(prev), Value::Object(map)) = (&conf.network.prev_result, &mut config) {
        map.insert("prevResult".into(), prev.clone());
    }
    delegate.run(plugin_type(&config)?, Command::Check, &saved.bytes(&config))?;
    Ok(Reply::Nothing)
}

fn read_subnet_env(path: &Path) -> Result<SubnetEnv, PluginError> {
    let text = std::fs::read_to_string(path).map_err(|source| PluginError::SubnetEnvMissing {
        path: path.to_path_buf(),
        source,
    })?;
    text.parse().map_err(|source| PluginError::SubnetEnvBad {
        path: path.to_path_buf(),
        source,
    })
}

/// The delegate's type: a file name in CNI_PATH.
fn plugin_type(config: &Value) -> Result<&str, PluginError> {
    match config.get("type").and_then(Value::as_str) {
        Some(name) if !name.is_empty() && !name.contains('/') && name != ".." => Ok(name),
        _ => Err(PluginError::BadType(
            config.get("type").map(Value::to_string).unwrap_or_default(),
        )),
    }
}

/// A container's saved delegate config, `<dataDir>/<container ID>`.
struct Saved {
    path: PathBuf,
}

impl Saved {
    fn io_error(&self, source: io::Error) -> PluginError {
        PluginError::DataDir {
            path: self.path.clone(),
            source,
        }
    }

    fn write(&self, bytes: &[u8]) -> Result<(), PluginError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let dir = self.path.parent().expect("a file in the data dir");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| self.io_error(e))?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(|e| self.io_error(e))?;
        io::Write::write_all(&mut file, bytes).map_err(|e| self.io_error(e))
    }

    fn read(&self) -> Result<Option<Value>, PluginError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|source| PluginError::SavedConf {
                        path: self.path.clone(),
                        source,
                    })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io_error(e)),
        }
    }

    fn bytes(&self, config: &Value) -> Vec<u8> {
        serde_json::to_vec(config).expect("JSON values serialise")
    }

    fn remove(&self) -> Result<(), PluginError> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(self.io_error(e)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// Records each call; answers ADD with a result naming the plugin, or
    /// fails every command with `fail`.
    #[derive(Default)]
    struct Recorder {
        calls: RefCell<Vec<(String, String, Value)>>,
        fail: Option<i32>,
    }

    impl Delegate for Recorder {
        fn run(
            &self,
            plugin: &str,
            command: Command,
            config: &[u8],
        ) -> Result<Vec<u8>, PluginError> {
            let config = serde_json::from_slice(config).unwrap();
            self.calls.borrow_mut().push((
                plugin.to_string(),
                command.as_ref().to_string(),
                config,
            ));
            if let Some(code) = self.fail {
                return Err(PluginError::Delegate {
                    plugin: plugin.into(),
                    code,
                    msg: "failed".into(),
                    details: String::new(),
                });
            }
            Ok(match command {
                Command::Add => {
                    format!(r#"{{"cniVersion":"0.3.1","from":"{plugin}"}}"#).into_bytes()
                }
                _ => Vec::new(),
            })
        }
    }

    struct Node {
        dir: tempfile::TempDir,
    }

    impl Node {
        fn new(subnet_env: Option<&str>) -> Node {
            let dir = tempfile::tempdir().unwrap();
            if let Some(text) = subnet_env {
                std::fs::write(dir.path().join("subnet.env"), text).unwrap();
            }
            Node { dir }
        }

        fn request(&self, command: Command, extra: &str) -> Request {
            let config = format!(
                r#"{{"cniVersion":"0.4.0","name":"cbr0","type":"flannel",
                    "subnetFile":"{0}/subnet.env","dataDir":"{0}/data"{extra}}}"#,
                self.dir.path().display()
            );
            Request {
                command,
                container_id: "pod-1".into(),
                config: config.into_bytes(),
            }
        }

        fn saved(&self) -> PathBuf {
            self.dir.path().join("data/pod-1")
        }
    }

    const ENV: &str = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.58.1/24\n\
                       FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";

    #[test]
    fn add_saves_the_delegate_config_and_del_uses_it_without_subnet_env() {
        let node = Node::new(Some(ENV));
        let bridge = Recorder::default();
        let Reply::Result(result) = handle(&node.request(Command::Add, ""), &bridge).unwrap()
        else {
            panic!("ADD replies with a result")
        };
        assert_eq!(result, br#"{"cniVersion":"0.3.1","from":"bridge"}"#);
        let saved: Value = serde_json::from_slice(&std::fs::read(node.saved()).unwrap()).unwrap();
        assert_eq!(bridge.calls.borrow()[0].2, saved);
        assert_eq!(saved["ipam"]["ranges"][0][0]["subnet"], "10.244.58.0/24");

        // flannel's subnet changed, then went: DEL still uses what ADD used.
        std::fs::remove_file(node.dir.path().join("subnet.env")).unwrap();
        handle(&node.request(Command::Del, ""), &bridge).unwrap();
        assert_eq!(
            bridge.calls.borrow()[1],
            ("bridge".into(), "DEL".into(), saved)
        );
        assert!(!node.saved().exists());

        // Again: nothing saved, nothing to do, success.
        handle(&node.request(Command::Del, ""), &bridge).unwrap();
        assert_eq!(bridge.calls.borrow().len(), 2);
    }

    #[test]
    fn check_hands_the_saved_config_and_prev_result_to_the_delegate() {
        let node = Node::new(Some(ENV));
        let bridge = Recorder::default();
        let unknown = handle(&node.request(Command::Check, ""), &bridge).unwrap_err();
        assert!(
            matches!(unknown, PluginError::UnknownContainer { .. }),
            "{unknown}"
        );
        handle(&node.request(Command::Add, ""), &bridge).unwrap();
        let prev = r#","prevResult":{"cniVersion":"0.4.0","ips":[]}"#;
        handle(&node.request(Command::Check, prev), &bridge).unwrap();
        let calls = bridge.calls.borrow();
        let (plugin, command, config) = &calls[1];
        assert_eq!((plugin.as_str(), command.as_str()), ("bridge", "CHECK"));
        assert_eq!(config["prevResult"]["cniVersion"], "0.4.0");
        assert_eq!(config["ipam"]["type"], "host-local");
    }

    #[test]
    fn a_failed_delegate_keeps_the_saved_config_for_del() {
        let node = Node::new(Some(ENV));
        let bridge = Recorder {
            fail: Some(11),
            ..Recorder::default()
        };
        let error = handle(&node.request(Command::Add, ""), &bridge).unwrap_err();
        assert_eq!(error.into_reply(newest()).code, 11);
        assert!(node.saved().exists());
        assert!(handle(&node.request(Command::Del, ""), &bridge).is_err());
        assert!(node.saved().exists(), "kept until a DEL succeeds");
    }

    #[test]
    fn subnet_env_missing_or_malformed() {
        let bridge = Recorder::default();
        let missing = Node::new(None);
        let reply = handle(&missing.request(Command::Add, ""), &bridge)
            .unwrap_err()
            .into_reply(newest());
        assert_eq!(reply.code, 11);
        assert!(
            reply.details.contains("subnet.env: No such file"),
            "{}",
            reply.details
        );

        let bad = Node::new(Some("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_MTU=x\n"));
        let reply = handle(&bad.request(Command::Add, ""), &bridge)
            .unwrap_err()
            .into_reply(newest());
        assert_eq!(reply.code, 7);
        assert!(
            reply.details.contains("subnet.env: line 2") && reply.details.contains("FLANNEL_MTU"),
            "{}",
            reply.details
        );
        assert!(bridge.calls.borrow().is_empty() && !bad.saved().exists());
    }

    #[test]
    fn versions() {
        let node = Node::new(Some(ENV));
        let mut request = node.request(Command::Add, "");
        request.config = String::from_utf8(request.config)
            .unwrap()
            .replace("0.4.0", "0.2.0")
            .into_bytes();
        let error = handle(&request, &Recorder::default()).unwrap_err();
        assert_eq!(error.into_reply(newest()).code, 1);
        let version = Request {
            command: Command::Version,
            container_id: String::new(),
            config: br#"{"cniVersion":"0.3.1"}"#.to_vec(),
        };
        let Reply::Version(reply) = handle(&version, &Recorder::default()).unwrap() else {
            panic!("VERSION replies with versions")
        };
        assert_eq!(reply.cni_version.to_string(), "0.3.1");
        assert_eq!(reply.supported_versions.len(), SUPPORTED_VERSIONS.len());
    }

    #[test]
    fn a_delegate_type_is_a_plugin_name() {
        for bad in [r#"{"type":"../bin/sh"}"#, r#"{"type":""}"#, "{}"] {
            let config: Value = serde_json::from_str(bad).unwrap();
            assert!(plugin_type(&config).is_err(), "{bad}");
        }
    }
}

//! Running a delegate plugin as a CNI runtime would: found by its type in
//! CNI_PATH, the runtime's CNI_* variables inherited but CNI_COMMAND, its
//! config on standard input, its result or error on standard output.

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

use cni_plugin::Command;

use crate::plugin::{Delegate, PluginError};

pub struct Exec {
    /// CNI_PATH, as given.
    pub cni_path: String,
}

impl Delegate for Exec {
    fn run(&self, plugin: &str, command: Command, config: &[u8]) -> Result<Vec<u8>, PluginError> {
        let binary = std::env::split_paths(&self.cni_path)
            .map(|dir| dir.join(plugin))
            .find(|path: &PathBuf| path.is_file())
            .ok_or_else(|| PluginError::MissingPlugin {
                plugin: plugin.into(),
                path: self.cni_path.clone(),
            })?;
        let spawn_error = |source| PluginError::Spawn {
            plugin: plugin.into(),
            source,
        };
        tracing::debug!(plugin, command = command.as_ref(), "delegating");
        let mut child = std::process::Command::new(&binary)
            .env("CNI_COMMAND", command.as_ref())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(spawn_error)?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // A plugin that exits without reading its input is judged by its
        // exit status and output, not by this write.
        let written = stdin.write_all(config);
        drop(stdin);
        let output = child.wait_with_output().map_err(spawn_error)?;
        if output.status.success() {
            return Ok(output.stdout);
        }
        #[derive(serde::Deserialize)]
        struct Failure {
            code: i32,
            #[serde(default)]
            msg: String,
            #[serde(default)]
            details: String,
        }
        let error = match serde_json::from_slice::<Failure>(&output.stdout) {
            Ok(f) => PluginError::Delegate {
                plugin: plugin.into(),
                code: f.code,
                msg: f.msg,
                details: f.details,
            },
            Err(_) => PluginError::Delegate {
                plugin: plugin.into(),
                // The first code the spec leaves to plugins.
                code: 100,
                msg: format!("exited with {}", output.status),
                details: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout).trim(),
                    written
                        .err()
                        .map(|e| format!(" (writing its input: {e})"))
                        .unwrap_or_default()
                ),
            },
        };
        Err(error)
    }
}

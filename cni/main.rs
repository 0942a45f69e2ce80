//! `flannel`: a CNI plugin that behaves as flannel's. It reads the node's
//! subnet.env (written by calc-flannel or flanneld) and delegates to
//! `bridge` with `host-local` IPAM in the node's subnet. Named `flannel` so
//! that flannel's own conflist (`"type": "flannel"`) runs it from CNI_PATH.

mod delegate_config;
mod exec;
mod plugin;

use std::io::Read;
use std::str::FromStr;

use cni_plugin::Command;
use cni_plugin::error::{CniError, EmptyValueError, InvalidCommandError};
use cni_plugin::reply::{ErrorReply, reply};

use exec::Exec;
use plugin::{Reply, Request, handle, reply_version};

fn main() {
    // stdout is the runtime's: logs go to stderr (into the runtime's log,
    // so no colours), quiet unless asked for.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VXMGR_CNI_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let mut config = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut config) {
        fail(CniError::Io(e).into_reply(reply_version(&config)));
    }
    let version = reply_version(&config);
    let request = match request(config) {
        Ok(request) => request,
        Err(e) => fail(e.into_reply(version)),
    };
    let delegate = Exec {
        cni_path: std::env::var("CNI_PATH").unwrap_or_default(),
    };
    match handle(&request, &delegate) {
        Ok(Reply::Result(result)) => {
            if let Err(e) = std::io::Write::write_all(&mut std::io::stdout(), &result) {
                fail(CniError::Io(e).into_reply(version))
            }
        }
        Ok(Reply::Version(versions)) => reply(versions),
        Ok(Reply::Nothing) => {}
        Err(e) => {
            tracing::warn!(command = request.command.as_ref(), error = %e, "failed");
            fail(e.into_reply(version))
        }
    }
}

/// Prints the error result and exits with its code, or 1 for a code that
/// is no exit status (a delegate's code 0 or 256 must not read as success).
fn fail(error: ErrorReply) -> ! {
    let status = u8::try_from(error.code)
        .ok()
        .filter(|s| *s != 0)
        .unwrap_or(1);
    if let Ok(text) = serde_json::to_string(&error) {
        println!("{text}");
    }
    std::process::exit(i32::from(status))
}

/// CNI_COMMAND and CNI_CONTAINERID, checked; the delegate reads the other
/// variables itself.
fn request(config: Vec<u8>) -> Result<Request, CniError> {
    let var =
        |var: &'static str| std::env::var(var).map_err(|err| CniError::MissingEnv { var, err });
    let command = Command::from_str(&var("CNI_COMMAND")?).map_err(|_| CniError::InvalidEnv {
        var: "CNI_COMMAND",
        err: Box::new(InvalidCommandError),
    })?;
    if config.is_empty() {
        return Err(CniError::MissingInput);
    }
    let container_id = match command {
        Command::Version => String::new(),
        _ => container_id(var("CNI_CONTAINERID")?)?,
    };
    Ok(Request {
        command,
        container_id,
        config,
    })
}

/// The spec's rule for a container ID; it also names a file of ours.
fn container_id(id: String) -> Result<String, CniError> {
    let invalid = |err: Box<dyn std::error::Error>| CniError::InvalidEnv {
        var: "CNI_CONTAINERID",
        err,
    };
    if id.is_empty() {
        return Err(invalid(Box::new(EmptyValueError)));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if !id.starts_with(|c: char| c.is_ascii_alphanumeric()) || !id.chars().all(allowed) {
        return Err(invalid(
            "only letters, digits, '-', '_' and '.', starting with a letter or digit".into(),
        ));
    }
    Ok(id)
}

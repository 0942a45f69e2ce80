//! ipsets through the `ipset` command: no maintained pure-Rust ipset netlink
//! crate exists, and `ipset restore` with a create-temp / swap / destroy
//! script replaces a set atomically, as Felix does it.

use std::io;
use std::process::{Output, Stdio};

use ipnetwork::IpNetwork;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tracing::warn;

use crate::kernel::KernelError;
use crate::kernel::objects::IpsetChange;
use crate::model::Family;

const IPSET: &str = "ipset";

/// ipset's longest set name.
const MAX_NAME_LEN: usize = 31;

/// Felix's set size: a set refuses members beyond its maxelem, and
/// `create -exist` only accepts an existing set created with the same one.
const MAX_ELEMENTS: u32 = 1_048_576;

/// Applies one change with one `ipset restore`.
pub(super) async fn apply(
    name: &str,
    family: Family,
    change: &IpsetChange,
) -> Result<(), KernelError> {
    let output = run(&["restore"], Some(restore_script(name, family, change)))
        .await
        .map_err(spawn_error)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(KernelError::other(format!(
            "ipset restore failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Members of each of these sets that exists. Without an `ipset` command
/// no set can exist: that is logged, and each set change then fails.
pub(super) async fn dump(
    sets: &[(String, Family)],
) -> Result<Vec<(String, Vec<IpNetwork>)>, KernelError> {
    let mut found = Vec::new();
    for (name, _) in sets {
        let output = match run(&["save", name], None).await {
            Ok(output) => output,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                warn!("no ipset command: taking every ipset as missing");
                return Ok(Vec::new());
            }
            Err(e) => return Err(spawn_error(e)),
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() {
            found.push((
                name.clone(),
                parse_members(name, &String::from_utf8_lossy(&output.stdout)),
            ));
        } else if !stderr.contains("does not exist") {
            return Err(KernelError::other(format!(
                "ipset save {name} failed: {}",
                stderr.trim()
            )));
        }
    }
    Ok(found)
}

async fn run(args: &[&str], stdin: Option<String>) -> io::Result<Output> {
    let mut child = Command::new(IPSET)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    if let (Some(script), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(script.as_bytes()).await?;
        // Closing stdin ends the script.
        drop(pipe);
    }
    child.wait_with_output().await
}

fn spawn_error(e: io::Error) -> KernelError {
    if e.kind() == io::ErrorKind::NotFound {
        KernelError::other("the ipset command is not installed")
    } else {
        KernelError::other(format!("running ipset: {e}"))
    }
}

fn create_command(name: &str, family: Family) -> String {
    let family = match family {
        Family::V4 => "inet",
        Family::V6 => "inet6",
    };
    format!("create {name} hash:net family {family} maxelem {MAX_ELEMENTS} -exist")
}

/// The set that a replace fills before swapping it in.
fn temporary_name(name: &str) -> String {
    const SUFFIX: &str = "-tmp";
    let mut stem = name;
    while stem.len() + SUFFIX.len() > MAX_NAME_LEN {
        let mut end = stem.len() - 1;
        while !stem.is_char_boundary(end) {
            end -= 1;
        }
        stem = &stem[..end];
    }
    format!("{stem}{SUFFIX}")
}

fn restore_script(name: &str, family: Family, change: &IpsetChange) -> String {
    let mut lines = Vec::new();
    match change {
        IpsetChange::Update { add, del } => {
            lines.push(create_command(name, family));
            lines.extend(add.iter().map(|m| format!("add {name} {m} -exist")));
            lines.extend(del.iter().map(|m| format!("del {name} {m} -exist")));
        }
        IpsetChange::Replace { members } => {
            let temporary = temporary_name(name);
            lines.push(create_command(&temporary, family));
            // A temporary set left by an interrupted replace is emptied.
            lines.push(format!("flush {temporary}"));
            lines.extend(
                members
                    .iter()
                    .map(|m| format!("add {temporary} {m} -exist")),
            );
            lines.push(create_command(name, family));
            lines.push(format!("swap {temporary} {name}"));
            lines.push(format!("destroy {temporary}"));
        }
    }
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Members in `ipset save` output: `add NAME MEMBER [options]` lines, host
/// members printed without their prefix length.
fn parse_members(name: &str, save: &str) -> Vec<IpNetwork> {
    save.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            if words.next() != Some("add") || words.next() != Some(name) {
                return None;
            }
            words.next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNetwork> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn update_creates_the_set_then_adds_and_deletes() {
        let change = IpsetChange::Update {
            add: nets(&["192.168.10.2/32"]),
            del: nets(&["192.168.10.3/32"]),
        };
        assert_eq!(
            restore_script("cali40all-vxlan-net", Family::V4, &change),
            "create cali40all-vxlan-net hash:net family inet maxelem 1048576 -exist\n\
             add cali40all-vxlan-net 192.168.10.2/32 -exist\n\
             del cali40all-vxlan-net 192.168.10.3/32 -exist\n"
        );
    }

    #[test]
    fn replace_fills_a_temporary_set_and_swaps_it_in() {
        let change = IpsetChange::Replace {
            members: nets(&["fd00::2/128", "fd01::/64"]),
        };
        assert_eq!(
            restore_script("cali60all-vxlan-net", Family::V6, &change),
            "create cali60all-vxlan-net-tmp hash:net family inet6 maxelem 1048576 -exist\n\
             flush cali60all-vxlan-net-tmp\n\
             add cali60all-vxlan-net-tmp fd00::2/128 -exist\n\
             add cali60all-vxlan-net-tmp fd01::/64 -exist\n\
             create cali60all-vxlan-net hash:net family inet6 maxelem 1048576 -exist\n\
             swap cali60all-vxlan-net-tmp cali60all-vxlan-net\n\
             destroy cali60all-vxlan-net-tmp\n"
        );
    }

    #[test]
    fn temporary_names_fit_ipset_limit() {
        assert_eq!(temporary_name("short"), "short-tmp");
        let long = "a".repeat(40);
        assert_eq!(temporary_name(&long).len(), MAX_NAME_LEN);
    }

    #[test]
    fn parses_save_output() {
        let save = "create s hash:net family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x1\n\
                    add s 192.168.10.2\n\
                    add s 10.0.0.0/8\n\
                    add other 1.1.1.1\n";
        assert_eq!(
            parse_members("s", save),
            nets(&["192.168.10.2/32", "10.0.0.0/8"])
        );
    }
}

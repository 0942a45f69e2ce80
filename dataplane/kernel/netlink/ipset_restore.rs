//! Full ipset replaces through `ipset restore`, as Felix does them: a
//! temporary set is filled, swapped in and destroyed, so the set never
//! holds a mix of old and new members.

use std::io;
use std::process::{Output, Stdio};

use ipnetwork::IpNetwork;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::ipset_spec::{ExistingSet, MAX_ELEMENTS, SET_TYPE};
use crate::kernel::KernelError;
use crate::model::Family;

const IPSET: &str = "ipset";

/// ipset's longest set name.
const MAX_NAME_LEN: usize = 31;

/// Makes the set hold exactly `members`, with one `ipset restore`.
pub(super) async fn replace(
    name: &str,
    family: Family,
    members: &[IpNetwork],
    existing: ExistingSet,
) -> Result<(), KernelError> {
    let output = restore(replace_script(name, family, members, existing))
        .await
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                KernelError::other("the ipset command is not installed")
            } else {
                KernelError::other(format!("running ipset: {e}"))
            }
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(KernelError::other(format!(
            "ipset restore failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

async fn restore(script: String) -> io::Result<Output> {
    let mut child = Command::new(IPSET)
        .arg("restore")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(script.as_bytes()).await?;
        // Closing stdin ends the script.
        drop(pipe);
    }
    child.wait_with_output().await
}

fn create_command(name: &str, family: Family) -> String {
    let family = match family {
        Family::V4 => "inet",
        Family::V6 => "inet6",
    };
    format!("create {name} {SET_TYPE} family {family} maxelem {MAX_ELEMENTS} -exist")
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

/// A set of another type or family cannot be swapped with the temporary
/// one: it is destroyed and the temporary set renamed in its place (the
/// kernel refuses to destroy a set that a rule still uses).
fn replace_script(
    name: &str,
    family: Family,
    members: &[IpNetwork],
    existing: ExistingSet,
) -> String {
    let temporary = temporary_name(name);
    let mut lines = vec![
        create_command(&temporary, family),
        // A temporary set left by an interrupted replace is emptied.
        format!("flush {temporary}"),
    ];
    lines.extend(
        members
            .iter()
            .map(|m| format!("add {temporary} {m} -exist")),
    );
    if existing == ExistingSet::Other {
        lines.push(format!("destroy {name}"));
        lines.push(format!("rename {temporary} {name}"));
    } else {
        lines.push(create_command(name, family));
        lines.push(format!("swap {temporary} {name}"));
        lines.push(format!("destroy {temporary}"));
    }
    lines.iter().map(|l| format!("{l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNetwork> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn replace_fills_a_temporary_set_and_swaps_it_in() {
        assert_eq!(
            replace_script(
                "cali60all-vxlan-net",
                Family::V6,
                &nets(&["fd00::2/128", "fd01::/64"]),
                ExistingSet::Ours,
            ),
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
    fn a_set_of_another_kind_is_destroyed_and_the_temporary_one_renamed() {
        assert_eq!(
            replace_script(
                "cali40all-vxlan-net",
                Family::V4,
                &nets(&["10.0.0.2/32"]),
                ExistingSet::Other,
            ),
            "create cali40all-vxlan-net-tmp hash:net family inet maxelem 1048576 -exist\n\
             flush cali40all-vxlan-net-tmp\n\
             add cali40all-vxlan-net-tmp 10.0.0.2/32 -exist\n\
             destroy cali40all-vxlan-net\n\
             rename cali40all-vxlan-net-tmp cali40all-vxlan-net\n"
        );
    }

    #[test]
    fn temporary_names_fit_ipset_limit() {
        assert_eq!(temporary_name("short"), "short-tmp");
        let long = "a".repeat(40);
        assert_eq!(temporary_name(&long).len(), MAX_NAME_LEN);
    }
}

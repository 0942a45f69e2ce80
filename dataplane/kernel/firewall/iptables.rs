//! vxmgr's forward chains in iptables' `filter` table, through each
//! backend's `iptables-save` and `iptables-restore --noflush`: both
//! backends are read (to choose one, and to take vxmgr's chain out of the
//! other), the chosen one written.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::detect::{self, BackendCensus, IptablesMode};
use super::{FORWARD_CHAIN, FirewallError, ForwardChange, ForwardOp};
use crate::model::Family;

/// Which iptables the forward rules go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IptablesBackend {
    /// The one the host uses, detected at every read of the firewall.
    Auto,
    Nft,
    Legacy,
}

/// Both backends (by `IptablesMode`), read in two steps so that a host
/// with a large ruleset (kube-proxy's nat table) is not dumped whole at
/// every read: the mangle tables first; when Kubernetes' hint chains
/// decide, only the filter tables then; otherwise every table, for the
/// rule counts.
pub(super) async fn censuses() -> [BackendCensus; 2] {
    let both = |tables: Option<&'static str>| async move {
        let (nft, legacy) = tokio::join!(
            census(IptablesMode::Nft, tables),
            census(IptablesMode::Legacy, tables)
        );
        [nft, legacy]
    };
    let mangle = both(Some("mangle")).await;
    if !detect::hints_decide(&mangle) {
        return both(None).await;
    }
    let mut filter = both(Some("filter")).await;
    for (census, hints) in filter.iter_mut().zip(mangle) {
        census.hinted = hints.hinted;
        census.error = census.error.take().or(hints.error);
    }
    filter
}

/// What one backend's saves (both families) show, of one table or of all.
/// Legacy tables are read only where they exist: naming one would create it.
async fn census(mode: IptablesMode, table: Option<&str>) -> BackendCensus {
    let mut census = BackendCensus {
        available: true,
        ..Default::default()
    };
    for family in Family::ALL {
        let Some(save) = binary(family, mode, "save") else {
            return BackendCensus::default();
        };
        let output = match table {
            None => run(&save, &[]).await,
            Some(t) if mode == IptablesMode::Legacy && !legacy_table_exists(family, t).await => {
                continue;
            }
            Some(t) => run(&save, &["-t", t]).await,
        };
        match output {
            Ok(output) => census.add_save(family as usize, &output),
            Err(error) => census.error = Some(error.0),
        }
    }
    census
}

/// Whether the legacy backend has `table` for `family` in this network
/// namespace (the kernel lists the tables in use).
async fn legacy_table_exists(family: Family, table: &str) -> bool {
    let names = match family {
        Family::V4 => "/proc/net/ip_tables_names",
        Family::V6 => "/proc/net/ip6_tables_names",
    };
    let loaded = tokio::fs::read_to_string(names).await.unwrap_or_default();
    loaded.lines().any(|t| t == table)
}

/// Applies one change in one `iptables-restore --noflush` (one commit of
/// the family's filter table: atomic).
pub(super) async fn apply(change: &ForwardChange) -> Result<(), FirewallError> {
    let restore = binary(change.family, change.mode, "restore").ok_or_else(|| {
        FirewallError(format!(
            "{}: not installed",
            name(change.family, change.mode, "restore")
        ))
    })?;
    let script = restore_script(change);
    let failed = |e: String| FirewallError(format!("{restore} (chain {FORWARD_CHAIN}): {e}"));
    let mut child = Command::new(&restore)
        .arg("--noflush")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .await
            .map_err(|e| failed(e.to_string()))?;
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !output.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// A digest of the legacy backend's filter tables (policies and rules,
/// not counters); 0 when neither family has one. Legacy iptables sends no
/// notification, so this is polled: the kernel's list of loaded tables is
/// read first, and the save runs only where a filter table exists.
pub(super) async fn legacy_filter_digest() -> u64 {
    let mut hasher = DefaultHasher::new();
    let mut any = false;
    for family in Family::ALL {
        if !legacy_table_exists(family, "filter").await {
            continue;
        }
        let Some(save) = binary(family, IptablesMode::Legacy, "save") else {
            continue;
        };
        any = true;
        let output = run(&save, &["-t", "filter"]).await.unwrap_or_default();
        for line in output.lines().filter(|l| !l.starts_with('#')) {
            // Chain lines end with the policy's packet counters.
            line.split(" [").next().hash(&mut hasher);
        }
    }
    if any { hasher.finish() | 1 } else { 0 }
}

/// What a save prints.
async fn run(binary: &str, args: &[&str]) -> Result<String, FirewallError> {
    let output = Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| FirewallError(format!("running {binary}: {e}")))?;
    if !output.status.success() {
        return Err(FirewallError(format!(
            "{binary}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Declaring the chain with `--noflush` empties it. A write fills it and,
/// when the jump is not in place, deletes every jump and inserts one at
/// the top; a removal deletes the jumps, then the chain.
fn restore_script(change: &ForwardChange) -> String {
    let mut script = format!("*filter\n:{FORWARD_CHAIN} - [0:0]\n");
    let mut line = |l: String| {
        script.push_str(&l);
        script.push('\n');
    };
    let delete_jumps = |n: u32| (0..n).map(|_| format!("-D FORWARD -j {FORWARD_CHAIN}"));
    match &change.op {
        ForwardOp::Write {
            rules,
            replace_jumps,
        } => {
            rules.iter().cloned().for_each(&mut line);
            if let Some(jumps) = *replace_jumps {
                delete_jumps(jumps).for_each(&mut line);
                line(format!("-I FORWARD 1 -j {FORWARD_CHAIN}"));
            }
        }
        ForwardOp::Remove { jumps } => {
            delete_jumps(*jumps).for_each(&mut line);
            line(format!("-X {FORWARD_CHAIN}"));
        }
    }
    script.push_str("COMMIT\n");
    script
}

fn name(family: Family, mode: IptablesMode, op: &str) -> String {
    let base = match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    };
    format!("{base}-{mode}-{op}")
}

/// The backend's own binary (`iptables-nft-save`, iptables ≥ 1.8), if
/// installed: a plain `iptables-save` could be either backend.
fn binary(family: Family, mode: IptablesMode, op: &str) -> Option<String> {
    let name = name(family, mode, op);
    std::env::var_os("PATH")
        .is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| Path::new(&dir).join(&name).is_file())
        })
        .then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_rewrites_the_chain_and_moves_the_jump() {
        let change = ForwardChange {
            mode: IptablesMode::Nft,
            family: Family::V4,
            op: ForwardOp::Write {
                rules: super::super::forward_rules(&["10.244.0.0/16".parse().unwrap()]),
                replace_jumps: Some(1),
            },
        };
        assert_eq!(
            restore_script(&change),
            "*filter\n:VXMGR-FORWARD - [0:0]\n-A VXMGR-FORWARD -s 10.244.0.0/16 -j ACCEPT\n\
             -A VXMGR-FORWARD -d 10.244.0.0/16 -j ACCEPT\n-D FORWARD -j VXMGR-FORWARD\n\
             -I FORWARD 1 -j VXMGR-FORWARD\nCOMMIT\n"
        );
    }

    #[test]
    fn a_restore_removes_the_jumps_then_the_emptied_chain() {
        let change = ForwardChange {
            mode: IptablesMode::Legacy,
            family: Family::V6,
            op: ForwardOp::Remove { jumps: 2 },
        };
        assert_eq!(
            restore_script(&change),
            "*filter\n:VXMGR-FORWARD - [0:0]\n-D FORWARD -j VXMGR-FORWARD\n\
             -D FORWARD -j VXMGR-FORWARD\n-X VXMGR-FORWARD\nCOMMIT\n"
        );
    }
}

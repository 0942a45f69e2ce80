//! vxmgr's forward chains in iptables' `filter` table, through
//! `iptables-save` and `iptables-restore --noflush` of the backend the host
//! uses (nft or legacy), detected as Felix detects it.

use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tracing::info;

use super::{FORWARD_CHAIN, FirewallError, ForwardChain, ForwardChange, forward_jump};
use crate::model::Family;

/// Which iptables the forward rules go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IptablesBackend {
    /// The one the host uses, detected as Felix does.
    Auto,
    Nft,
    Legacy,
}

#[derive(Default)]
pub(super) struct Iptables {
    /// The backend in use: "nft" or "legacy", once known.
    mode: Option<&'static str>,
}

impl Iptables {
    /// Each family's forward chain.
    pub async fn read(
        &mut self,
        backend: IptablesBackend,
    ) -> Result<[ForwardChain; 2], FirewallError> {
        let mode = match (backend, self.mode) {
            (IptablesBackend::Nft, _) => "nft",
            (IptablesBackend::Legacy, _) => "legacy",
            (IptablesBackend::Auto, Some(mode)) => mode,
            (IptablesBackend::Auto, None) => {
                let mode = detect().await;
                info!(backend = mode, "iptables backend detected");
                mode
            }
        };
        self.mode = Some(mode);
        let mut chains = [ForwardChain::default(), ForwardChain::default()];
        for family in Family::ALL {
            let save = binary(family, mode, "save");
            let output = Command::new(&save)
                .args(["-t", "filter"])
                .stdin(Stdio::null())
                .output()
                .await
                .map_err(|e| FirewallError(format!("running {save}: {e}")))?;
            if !output.status.success() {
                return Err(FirewallError(format!(
                    "{save} -t filter: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                )));
            }
            chains[family as usize] = parse_filter(&String::from_utf8_lossy(&output.stdout));
        }
        Ok(chains)
    }

    /// Rewrites one family's chain, and puts the jump back at the top of
    /// `FORWARD`, in one `iptables-restore --noflush` (one commit of the
    /// table: atomic).
    pub async fn apply(&mut self, change: &ForwardChange) -> Result<(), FirewallError> {
        let mode = self.mode.unwrap_or("nft");
        let restore = binary(change.family, mode, "restore");
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
}

/// Declaring the chain with `--noflush` empties it; the jump, when not in
/// place, is deleted wherever it is and inserted at the top.
fn restore_script(change: &ForwardChange) -> String {
    let mut script = format!("*filter\n:{FORWARD_CHAIN} - [0:0]\n");
    for rule in &change.rules {
        script.push_str(rule);
        script.push('\n');
    }
    if let Some(jumps) = change.replace_jumps {
        for _ in 0..jumps {
            script.push_str(&format!("-D FORWARD -j {FORWARD_CHAIN}\n"));
        }
        script.push_str(&format!("-I FORWARD 1 -j {FORWARD_CHAIN}\n"));
    }
    script.push_str("COMMIT\n");
    script
}

/// vxmgr's chain and the jumps to it in `iptables-save -t filter` output.
fn parse_filter(save: &str) -> ForwardChain {
    let own = format!("-A {FORWARD_CHAIN} ");
    let jump = forward_jump();
    let mut chain = ForwardChain::default();
    let mut first_forward = true;
    for line in save.lines() {
        if line.starts_with(&format!(":{FORWARD_CHAIN} ")) {
            chain.rules.get_or_insert_with(Vec::new);
        } else if line.starts_with(&own) {
            chain
                .rules
                .get_or_insert_with(Vec::new)
                .push(line.to_string());
        } else if line.starts_with("-A FORWARD ") {
            if line == jump {
                chain.jumps += 1;
                chain.jump_first |= first_forward;
            }
            first_forward = false;
        }
    }
    chain
}

/// Felix's choice of binary: `iptables-<mode>-<op>` when it exists, else
/// plain `iptables-<op>`.
fn binary(family: Family, mode: &str, op: &str) -> String {
    let base = match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    };
    let specific = format!("{base}-{mode}-{op}");
    if on_path(&specific) {
        specific
    } else {
        format!("{base}-{op}")
    }
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| Path::new(&dir).join(name).is_file())
    })
}

/// Felix's detection: Kubernetes' hint chains in the mangle table of the nft
/// backend, then of the legacy one, decide; otherwise the backend holding
/// more rules, legacy on a tie.
async fn detect() -> &'static str {
    let saves = |mode: &'static str, args: &'static [&'static str]| async move {
        let mut out = String::new();
        for family in Family::ALL {
            out.push_str(&save_output(&binary(family, mode, "save"), args).await);
        }
        out
    };
    let hinted =
        |out: &str| out.contains("KUBE-IPTABLES-HINT") || out.contains("KUBE-KUBELET-CANARY");
    if hinted(&saves("nft", &["-t", "mangle"]).await) {
        return "nft";
    }
    if hinted(&saves("legacy", &["-t", "mangle"]).await) {
        return "legacy";
    }
    let rules = |out: String| out.lines().filter(|l| l.starts_with('-')).count();
    let legacy = rules(saves("legacy", &[]).await);
    let nft = rules(saves("nft", &[]).await);
    if legacy >= nft { "legacy" } else { "nft" }
}

/// What a save prints; nothing when it cannot run (as in Felix).
async fn save_output(binary: &str, args: &[&str]) -> String {
    match Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
    {
        Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_and_the_jumps_are_read_from_a_save() {
        let save = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:VXMGR-FORWARD - [0:0]\n\
            -A FORWARD -j VXMGR-FORWARD\n-A FORWARD -j DOCKER-USER\n-A FORWARD -j VXMGR-FORWARD\n\
            -A VXMGR-FORWARD -s 10.244.0.0/16 -j ACCEPT\nCOMMIT\n";
        let chain = parse_filter(save);
        assert_eq!(
            chain.rules,
            Some(vec![
                "-A VXMGR-FORWARD -s 10.244.0.0/16 -j ACCEPT".to_string()
            ])
        );
        assert_eq!((chain.jumps, chain.jump_first), (2, true));
        assert!(!chain.jump_in_place());
        let elsewhere =
            parse_filter("*filter\n-A FORWARD -j DOCKER-USER\n-A FORWARD -j VXMGR-FORWARD\n");
        assert_eq!((elsewhere.rules, elsewhere.jump_first), (None, false));
    }

    #[test]
    fn a_restore_rewrites_the_chain_and_moves_the_jump() {
        let change = ForwardChange {
            family: Family::V4,
            rules: super::super::forward_rules(&["10.244.0.0/16".parse().unwrap()]),
            replace_jumps: Some(1),
        };
        assert_eq!(
            restore_script(&change),
            "*filter\n:VXMGR-FORWARD - [0:0]\n-A VXMGR-FORWARD -s 10.244.0.0/16 -j ACCEPT\n\
             -A VXMGR-FORWARD -d 10.244.0.0/16 -j ACCEPT\n-D FORWARD -j VXMGR-FORWARD\n\
             -I FORWARD 1 -j VXMGR-FORWARD\nCOMMIT\n"
        );
    }
}

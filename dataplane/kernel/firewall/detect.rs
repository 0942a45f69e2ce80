//! What each iptables backend holds, read from its `iptables-save`, and
//! which backend vxmgr's forward chain belongs in. Pure: the binaries are
//! run elsewhere.

use super::{FORWARD_CHAIN, ForwardChain, IptablesBackend, forward_jump};

/// The two iptables backends: their rules live in separate kernel tables,
/// and a drop in either is final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IptablesMode {
    Nft = 0,
    Legacy = 1,
}

impl IptablesMode {
    pub const ALL: [IptablesMode; 2] = [IptablesMode::Nft, IptablesMode::Legacy];

    /// As the binaries' names say it (`iptables-nft-save`).
    pub fn name(self) -> &'static str {
        match self {
            IptablesMode::Nft => "nft",
            IptablesMode::Legacy => "legacy",
        }
    }

    pub fn other(self) -> IptablesMode {
        match self {
            IptablesMode::Nft => IptablesMode::Legacy,
            IptablesMode::Legacy => IptablesMode::Nft,
        }
    }
}

impl std::fmt::Display for IptablesMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One backend as its saves (both families, all tables) show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct BackendCensus {
    /// Its binaries are installed.
    pub available: bool,
    /// Why a save failed (e.g. legacy without `CAP_NET_RAW`).
    pub error: Option<String>,
    /// Kubernetes' hint chains (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`)
    /// are in its mangle table: the kubelet says this is the one in use.
    pub hinted: bool,
    /// Its filter table's `FORWARD` policy is `DROP` (either family).
    pub forward_drop: bool,
    /// Rules that are not vxmgr's, in all its tables.
    pub foreign_rules: usize,
    /// vxmgr's chain and the jumps to it, per family.
    pub chains: [ForwardChain; 2],
}

impl BackendCensus {
    /// Adds one family's `iptables-save` output (all tables).
    pub fn add_save(&mut self, family: usize, save: &str) {
        let own = format!("-A {FORWARD_CHAIN} ");
        let jump = forward_jump();
        let chain = &mut self.chains[family];
        let mut table = "";
        let mut first_forward = true;
        for line in save.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name.trim();
                first_forward = true;
                continue;
            }
            if table == "mangle"
                && (line.starts_with(":KUBE-IPTABLES-HINT ")
                    || line.starts_with(":KUBE-KUBELET-CANARY "))
            {
                self.hinted = true;
            }
            if table != "filter" {
                self.foreign_rules += usize::from(line.starts_with("-A "));
                continue;
            }
            if line.starts_with(&format!(":{FORWARD_CHAIN} ")) {
                chain.rules.get_or_insert_with(Vec::new);
            } else if line.starts_with(":FORWARD DROP") {
                self.forward_drop = true;
            } else if line.starts_with(&own) {
                chain
                    .rules
                    .get_or_insert_with(Vec::new)
                    .push(line.to_string());
            } else if line == jump {
                chain.jumps += 1;
                chain.jump_first |= first_forward;
                first_forward = false;
            } else if line.starts_with("-A ") {
                self.foreign_rules += 1;
                first_forward &= !line.starts_with("-A FORWARD ");
            }
        }
    }

    /// Installed and read.
    pub fn usable(&self) -> bool {
        self.available && self.error.is_none()
    }

    /// Something of vxmgr's is here.
    pub fn holds_ours(&self) -> bool {
        self.chains.iter().any(|c| c.rules.is_some() || c.jumps > 0)
    }
}

/// Kubernetes' hint chains are in a backend that can be read: they decide
/// the choice, and the other rules need not be counted.
pub fn hints_decide(census: &[BackendCensus; 2]) -> bool {
    census.iter().any(|c| c.usable() && c.hinted)
}

/// The backend vxmgr's forward chain belongs in. Felix's order (the hint
/// chains of nft, then of legacy; then the backend with more rules, legacy
/// on a tie), with two changes so that it can be asked again at any time:
/// a backend whose `FORWARD` drops by policy while the other's does not
/// wins before counting (that drop is what the accepts are for), vxmgr's
/// own rules are not counted (they would keep it where it is), and a tie
/// keeps the backend in use. A backend whose binaries are missing, or
/// whose save failed, is chosen only when neither can be read.
pub fn choose(
    flag: IptablesBackend,
    census: &[BackendCensus; 2],
    in_use: Option<IptablesMode>,
) -> IptablesMode {
    match flag {
        IptablesBackend::Nft => return IptablesMode::Nft,
        IptablesBackend::Legacy => return IptablesMode::Legacy,
        IptablesBackend::Auto => {}
    }
    let [nft, legacy] = census;
    match (nft.usable(), legacy.usable()) {
        (true, false) => return IptablesMode::Nft,
        (false, true) => return IptablesMode::Legacy,
        _ => {}
    }
    if hints_decide(census) {
        return match nft.hinted && nft.usable() {
            true => IptablesMode::Nft,
            false => IptablesMode::Legacy,
        };
    }
    match (nft.forward_drop, legacy.forward_drop) {
        (true, false) => return IptablesMode::Nft,
        (false, true) => return IptablesMode::Legacy,
        _ => {}
    }
    match nft.foreign_rules.cmp(&legacy.foreign_rules) {
        std::cmp::Ordering::Greater => IptablesMode::Nft,
        std::cmp::Ordering::Less => IptablesMode::Legacy,
        std::cmp::Ordering::Equal => in_use.unwrap_or(IptablesMode::Legacy),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCKER: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j DOCKER\nCOMMIT\n\
        *filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:DOCKER-USER - [0:0]\n\
        -A FORWARD -j DOCKER-USER\n-A DOCKER-USER -j RETURN\nCOMMIT\n";

    const OURS: &str = "*filter\n:FORWARD ACCEPT [0:0]\n:VXMGR-FORWARD - [0:0]\n\
        -A FORWARD -j VXMGR-FORWARD\n-A VXMGR-FORWARD -s 10.244.0.0/16 -j ACCEPT\n\
        -A VXMGR-FORWARD -d 10.244.0.0/16 -j ACCEPT\nCOMMIT\n";

    fn census(saves: &[&str]) -> BackendCensus {
        let mut census = BackendCensus {
            available: true,
            ..Default::default()
        };
        for (family, save) in saves.iter().enumerate() {
            census.add_save(family, save);
        }
        census
    }

    #[test]
    fn a_save_gives_our_chain_the_jumps_the_policy_and_the_others_rules() {
        let save = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:VXMGR-FORWARD - [0:0]\n\
            -A FORWARD -j VXMGR-FORWARD\n-A FORWARD -j DOCKER-USER\n-A FORWARD -j VXMGR-FORWARD\n\
            -A VXMGR-FORWARD -s 10.244.0.0/16 -j ACCEPT\nCOMMIT\n";
        let c = census(&[save]);
        assert_eq!(
            c.chains[0].rules,
            Some(vec![
                "-A VXMGR-FORWARD -s 10.244.0.0/16 -j ACCEPT".to_string()
            ])
        );
        assert_eq!((c.chains[0].jumps, c.chains[0].jump_first), (2, true));
        assert!(!c.chains[0].jump_in_place());
        assert!(c.forward_drop && !c.hinted);
        assert_eq!(c.foreign_rules, 1);
        assert!(c.holds_ours());

        let elsewhere =
            census(&["*filter\n-A FORWARD -j DOCKER-USER\n-A FORWARD -j VXMGR-FORWARD\n"]);
        assert_eq!(elsewhere.chains[0].rules, None);
        assert!(!elsewhere.chains[0].jump_first);
        let hinted = census(&["", "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"]);
        assert!(hinted.hinted && !census(&[]).holds_ours());
    }

    #[test]
    fn felix_order_on_a_fresh_host_and_where_kubernetes_hints() {
        let empty = census(&[]);
        let auto = IptablesBackend::Auto;
        assert_eq!(
            choose(auto, &[empty.clone(), empty.clone()], None),
            IptablesMode::Legacy
        );
        let hinted = census(&["*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"]);
        let docker = census(&[DOCKER, DOCKER]);
        assert_eq!(
            choose(auto, &[hinted.clone(), docker.clone()], None),
            IptablesMode::Nft
        );
        assert_eq!(choose(auto, &[docker, hinted], None), IptablesMode::Legacy);
        assert_eq!(
            choose(IptablesBackend::Nft, &[empty.clone(), empty], None),
            IptablesMode::Nft
        );
    }

    #[test]
    fn a_drop_policy_or_more_rules_elsewhere_move_it_and_our_own_rules_do_not_count() {
        let auto = IptablesBackend::Auto;
        let ours = census(&[OURS, OURS]);
        let in_use = Some(IptablesMode::Legacy);
        // Docker came after vxmgrd: its drop is in nft, vxmgr's chain in legacy.
        let docker = census(&[DOCKER, DOCKER]);
        assert_eq!(
            choose(auto, &[docker.clone(), ours.clone()], in_use),
            IptablesMode::Nft
        );
        // Only a policy, no rule: still the drop decides.
        let policy = census(&["*filter\n:FORWARD DROP [0:0]\nCOMMIT\n"]);
        assert_eq!(
            choose(auto, &[ours.clone(), policy], Some(IptablesMode::Nft)),
            IptablesMode::Legacy
        );
        // A tie (our rules aside) keeps the backend in use.
        let nothing = census(&[]);
        assert_eq!(
            choose(auto, &[nothing.clone(), ours.clone()], in_use),
            IptablesMode::Legacy
        );
        assert_eq!(
            choose(auto, &[ours, nothing], Some(IptablesMode::Nft)),
            IptablesMode::Nft
        );
    }

    #[test]
    fn a_backend_without_binaries_or_unreadable_is_not_chosen() {
        let docker = census(&[DOCKER]);
        let missing = BackendCensus::default();
        assert_eq!(
            choose(IptablesBackend::Auto, &[missing, docker.clone()], None),
            IptablesMode::Legacy
        );
        // A hint read before the save failed decides nothing.
        let unreadable = BackendCensus {
            error: Some("iptables-nft-save: failed".into()),
            ..census(&["*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"])
        };
        let both = [unreadable, docker];
        assert!(!hints_decide(&both));
        assert_eq!(
            choose(IptablesBackend::Auto, &both, None),
            IptablesMode::Legacy
        );
    }
}

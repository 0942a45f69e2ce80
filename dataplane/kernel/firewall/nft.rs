//! The firewall on the real kernel: vxmgr's nftables table through the
//! `nft` binary (JSON, one transaction per apply), the forward chains
//! through `iptables-restore`.

use std::borrow::Cow;
use std::collections::HashSet;
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use nftables::batch::Batch;
use nftables::expr::{Expression, NamedExpression, Payload, PayloadField, Prefix};
use nftables::helper::{self, DEFAULT_NFT, NftablesError};
use nftables::schema::{
    Chain, Element, NfListObject, NfObject, Nftables, Rule, Set, SetFlag, SetType, SetTypeValue,
    Table,
};
use nftables::stmt::{Match, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use super::iptables;
use super::{
    FirewallChanges, FirewallError, FirewallState, NAT_CHAIN, NatTable, PoolSet, TABLE, TableOp,
};
use crate::model::Family;

/// Priority of the NAT chain: `srcnat`, where masquerading belongs.
const SRCNAT: i32 = 100;

/// The `nft` and `iptables-restore` binaries, found on the `PATH`.
#[derive(Default)]
pub struct NftFirewall;

impl NftFirewall {
    pub fn new() -> NftFirewall {
        NftFirewall
    }
}

impl super::Firewall for NftFirewall {
    async fn read(&mut self, forward: bool) -> Result<FirewallState, FirewallError> {
        let table = match nft(&["list", "table", "inet", TABLE]).await {
            Ok(ruleset) => Some(parse_table(&ruleset)),
            Err(NftablesError::NftFailed { stderr, .. })
                if stderr.contains("No such file or directory") =>
            {
                None
            }
            Err(e) => return Err(nft_error("reading table inet vxmgr", e)),
        };
        let chains = nft(&["list", "chains"])
            .await
            .map_err(|e| nft_error("listing chains", e))?;
        let forward = match forward {
            true => Some(iptables::censuses().await),
            false => None,
        };
        Ok(FirewallState {
            table,
            forward,
            forward_drops: forward_drops(&chains),
        })
    }

    async fn apply(&mut self, changes: &FirewallChanges) -> Result<(), FirewallError> {
        if !changes.table.is_empty() {
            let mut batch = Batch::new();
            changes.table.iter().for_each(|op| add_op(&mut batch, op));
            helper::apply_ruleset_async(&batch.to_nftables())
                .await
                .map_err(|e| nft_error("changing table inet vxmgr", e))?;
        }
        for change in &changes.forward {
            iptables::apply(change).await?;
        }
        Ok(())
    }

    async fn legacy_filter_digest(&mut self) -> u64 {
        iptables::legacy_filter_digest().await
    }
}

async fn nft(args: &[&str]) -> Result<Nftables<'static>, NftablesError> {
    helper::get_current_ruleset_with_args_async(DEFAULT_NFT, args).await
}

fn nft_error(what: &str, error: NftablesError) -> FirewallError {
    FirewallError(match error {
        NftablesError::NftExecution { inner, .. }
            if inner.kind() == std::io::ErrorKind::NotFound =>
        {
            format!("{what}: the nft binary is missing (install nftables): {inner}")
        }
        NftablesError::NftFailed { stderr, .. } => format!("{what}: nft: {}", stderr.trim()),
        other => format!("{what}: {other}"),
    })
}

fn add_op(batch: &mut Batch<'static>, op: &TableOp) {
    match op {
        TableOp::Create(sets) => {
            // Adding first makes the delete succeed when there is no table.
            batch.add(NfListObject::Table(table()));
            batch.delete(NfListObject::Table(table()));
            batch.add(NfListObject::Table(table()));
            for set in PoolSet::ALL {
                batch.add(NfListObject::Set(Box::new(set_of(set))));
            }
            batch.add(NfListObject::Chain(chain()));
            for family in Family::ALL.into_iter().filter(|f| sets.masquerades(*f)) {
                batch.add(NfListObject::Rule(masquerade_rule(family)));
            }
            for set in PoolSet::ALL {
                if !sets.get(set).is_empty() {
                    batch.add(NfListObject::Element(elements(set, sets.get(set))));
                }
            }
        }
        TableOp::AddElements(set, nets) => {
            batch.add(NfListObject::Element(elements(*set, nets)));
        }
        TableOp::DeleteElements(set, nets) => {
            batch.delete(NfListObject::Element(elements(*set, nets)));
        }
        TableOp::AddMasquerade(family) => batch.add(NfListObject::Rule(masquerade_rule(*family))),
        TableOp::DeleteMasquerade { family, handle } => batch.delete(NfListObject::Rule(Rule {
            handle: u32::try_from(*handle).ok(),
            ..masquerade_rule(*family)
        })),
    }
}

fn table() -> Table<'static> {
    Table {
        family: NfFamily::INet,
        name: TABLE.into(),
        handle: None,
    }
}

fn set_of(set: PoolSet) -> Set<'static> {
    let set_type = match set.family {
        Family::V4 => SetType::Ipv4Addr,
        Family::V6 => SetType::Ipv6Addr,
    };
    Set {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: set.name().into(),
        set_type: SetTypeValue::Single(set_type),
        flags: Some(HashSet::from([SetFlag::Interval])),
        ..Default::default()
    }
}

fn chain() -> Chain<'static> {
    Chain {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: NAT_CHAIN.into(),
        _type: Some(NfChainType::NAT),
        hook: Some(NfHook::Postrouting),
        prio: Some(SRCNAT),
        policy: Some(NfChainPolicy::Accept),
        ..Default::default()
    }
}

/// `ip saddr @masq-pools-v4 ip daddr != @all-pools-v4 masquerade`.
fn masquerade_rule(family: Family) -> Rule<'static> {
    let protocol = match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    };
    let field = |field: &'static str| {
        Expression::Named(NamedExpression::Payload(Payload::PayloadField(
            PayloadField {
                protocol: protocol.into(),
                field: field.into(),
            },
        )))
    };
    let set = |masquerading| {
        Expression::String(format!("@{}", PoolSet::new(family, masquerading).name()).into())
    };
    Rule {
        family: NfFamily::INet,
        table: TABLE.into(),
        chain: NAT_CHAIN.into(),
        expr: Cow::Owned(vec![
            Statement::Match(Match {
                left: field("saddr"),
                right: set(true),
                op: Operator::EQ,
            }),
            Statement::Match(Match {
                left: field("daddr"),
                right: set(false),
                op: Operator::NEQ,
            }),
            Statement::Masquerade(None),
        ]),
        comment: Some(format!("vxmgr: masquerade {family} pool traffic leaving the pools").into()),
        ..Default::default()
    }
}

fn elements<'a>(set: PoolSet, nets: impl IntoIterator<Item = &'a IpNetwork>) -> Element<'static> {
    let elem = nets
        .into_iter()
        .map(|net| {
            Expression::Named(NamedExpression::Prefix(Prefix {
                addr: Box::new(Expression::String(net.network().to_string().into())),
                len: net.prefix().into(),
            }))
        })
        .collect();
    Element {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: set.name().into(),
        elem: Cow::Owned(elem),
    }
}

/// A set element as nft prints it: a prefix, or a single address.
fn parse_element(element: &Expression) -> Option<IpNetwork> {
    match element {
        Expression::Named(NamedExpression::Prefix(p)) => {
            let Expression::String(addr) = &*p.addr else {
                return None;
            };
            IpNetwork::new(addr.parse().ok()?, u8::try_from(p.len).ok()?).ok()
        }
        Expression::String(addr) => Some(IpNetwork::from(addr.parse::<IpAddr>().ok()?)),
        _ => None,
    }
}

/// vxmgr's table as nft lists it. Anything but vxmgr's own objects, each
/// exactly as vxmgr makes it, makes it not intact.
fn parse_table(ruleset: &Nftables<'static>) -> NatTable {
    let mut table = NatTable {
        intact: true,
        ..Default::default()
    };
    let mut sets_seen = 0;
    let mut chain_seen = false;
    for object in ruleset.objects.iter() {
        let NfObject::ListObject(object) = object else {
            continue;
        };
        match object {
            NfListObject::Table(_) | NfListObject::MetainfoObject(_) => {}
            NfListObject::Set(set) => {
                let Some(kind) = PoolSet::ALL.into_iter().find(|s| s.name() == set.name) else {
                    table.intact = false;
                    continue;
                };
                let members = set.elem.as_deref().unwrap_or_default();
                let parsed: Option<Vec<IpNetwork>> = members.iter().map(parse_element).collect();
                let bare = Set {
                    handle: None,
                    elem: None,
                    ..(**set).clone()
                };
                match parsed {
                    Some(nets) if bare == set_of(kind) => {
                        sets_seen += 1;
                        table.sets.get_mut(kind).extend(nets);
                    }
                    _ => table.intact = false,
                }
            }
            NfListObject::Chain(c) => {
                chain_seen = true;
                table.intact &= Chain {
                    handle: None,
                    ..c.clone()
                } == chain();
            }
            NfListObject::Rule(r) => {
                let bare = Rule {
                    handle: None,
                    index: None,
                    ..r.clone()
                };
                let family = Family::ALL
                    .into_iter()
                    .find(|f| bare == masquerade_rule(*f));
                match family {
                    Some(f) if table.masquerade_rules[f as usize].is_none() => {
                        table.masquerade_rules[f as usize] = r.handle.map(u64::from);
                    }
                    _ => table.intact = false,
                }
            }
            _ => table.intact = false,
        }
    }
    table.intact &= chain_seen && sets_seen == PoolSet::ALL.len();
    table
}

/// Base chains of other tables on the forward hook with a drop policy.
/// iptables' own `FORWARD` chains (iptables-nft's tables) are left out:
/// the jump to vxmgr's chain is what gets pod traffic through those.
fn forward_drops(ruleset: &Nftables) -> Vec<String> {
    let family_name = |f: &NfFamily| {
        serde_json::to_value(f)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    ruleset
        .objects
        .iter()
        .filter_map(|o| match o {
            NfObject::ListObject(NfListObject::Chain(c)) => Some(c),
            _ => None,
        })
        .filter(|c| c.hook == Some(NfHook::Forward) && c.policy == Some(NfChainPolicy::Drop))
        .filter(|c| !(c.family == NfFamily::INet && c.table == TABLE))
        .filter(|c| {
            let iptables = matches!(c.family, NfFamily::IP | NfFamily::IP6);
            !(iptables && c.table == "filter" && c.name == "FORWARD")
        })
        .map(|c| format!("{} {} {}", family_name(&c.family), c.table, c.name))
        .collect()
}

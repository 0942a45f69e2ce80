//! The kernel objects vxmgr owns in a namespace, per family and as sets of
//! descriptions, so two points in time can be compared object by object:
//! nothing leaked, nothing lost, nothing left half-done.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::Value;

use super::{Result, ip_json, run_in, try_in};
use vxmgr::kernel::firewall::{TABLE, TABLE_FAMILY};
use vxmgr::model::Family;

/// The protocol vxmgr's routes and nexthops carry by default.
const PROTOCOL: &str = "80";

/// One family's objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FamilyCensus {
    /// The VXLAN device's settings and addresses, if it exists.
    pub device: Option<String>,
    pub routes: BTreeSet<String>,
    pub nexthops: BTreeSet<String>,
    pub neighbours: BTreeSet<String>,
    pub fdb: BTreeSet<String>,
    pub ipset: BTreeSet<String>,
}

/// Both families' objects, the names of every ipset in the namespace (a
/// temporary set left by an interrupted replace shows there), and vxmgr's
/// firewall: its nftables table and its chains and jump in iptables'
/// `filter` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    pub v4: FamilyCensus,
    pub v6: FamilyCensus,
    pub ipsets: BTreeSet<String>,
    pub firewall: BTreeSet<String>,
}

/// The kinds counted in `Census::counts`, in its order.
pub const KINDS: [&str; 5] = ["routes", "nexthops", "neighbours", "fdb", "ipset"];

impl Census {
    /// Reads namespace `ns`.
    pub fn of(ns: &str) -> Result<Census> {
        // The families side by side: a large world's listings take seconds.
        let (v4, v6) = std::thread::scope(|scope| {
            let v6 = scope.spawn(|| FamilyCensus::of(ns, Family::V6));
            let v4 = FamilyCensus::of(ns, Family::V4);
            (v4, v6.join().expect("the IPv6 census does not panic"))
        });
        Ok(Census {
            v4: v4?,
            v6: v6?,
            ipsets: run_in(ns, &["ipset", "list", "-n"])?
                .lines()
                .map(str::to_string)
                .collect(),
            firewall: firewall(ns)?,
        })
    }

    pub fn family(&self, family: Family) -> &FamilyCensus {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    /// How many objects of each of `KINDS`, both families together.
    pub fn counts(&self) -> [usize; 5] {
        let [a, b] = [&self.v4, &self.v6].map(FamilyCensus::counts);
        std::array::from_fn(|i| a[i] + b[i])
    }

    /// What differs from `other`, one line per family and kind, naming a
    /// few of the objects only one side has; empty when they are equal.
    pub fn differences(&self, other: &Census) -> Vec<String> {
        let mut out = Vec::new();
        for family in Family::ALL {
            let (a, b) = (self.family(family), other.family(family));
            if a.device != b.device {
                out.push(format!(
                    "{family} device: {:?} against {:?}",
                    a.device, b.device
                ));
            }
            for (kind, (a, b)) in KINDS.iter().zip(a.sets().into_iter().zip(b.sets())) {
                difference(&mut out, &format!("{family} {kind}"), a, b);
            }
        }
        difference(&mut out, "ipsets", &self.ipsets, &other.ipsets);
        difference(&mut out, "firewall", &self.firewall, &other.firewall);
        out
    }
}

impl fmt::Display for Census {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts = self.counts();
        let parts: Vec<String> = KINDS
            .iter()
            .zip(counts)
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// Objects listed when two sets differ, on each side.
const SHOWN: usize = 5;

fn difference(out: &mut Vec<String>, what: &str, a: &BTreeSet<String>, b: &BTreeSet<String>) {
    if a == b {
        return;
    }
    let only = |x: &BTreeSet<String>, y: &BTreeSet<String>| -> String {
        let diff: Vec<&String> = x.difference(y).collect();
        let shown: Vec<&str> = diff.iter().take(SHOWN).map(|s| s.as_str()).collect();
        format!("{} {:?}", diff.len(), shown)
    };
    out.push(format!(
        "{what}: only in the first {}, only in the second {}",
        only(a, b),
        only(b, a)
    ));
}

impl FamilyCensus {
    fn of(ns: &str, family: Family) -> Result<FamilyCensus> {
        let device = device(ns, family)?;
        let on_device = device.is_some();
        Ok(FamilyCensus {
            device,
            routes: routes(ns, family)?,
            nexthops: nexthops(ns, family)?,
            neighbours: if on_device {
                neighbours(ns, family)?
            } else {
                BTreeSet::new()
            },
            fdb: if on_device {
                fdb(ns, family)?
            } else {
                BTreeSet::new()
            },
            ipset: ipset_members(ns, family.ipset_name())?,
        })
    }

    fn sets(&self) -> [&BTreeSet<String>; 5] {
        [
            &self.routes,
            &self.nexthops,
            &self.neighbours,
            &self.fdb,
            &self.ipset,
        ]
    }

    fn counts(&self) -> [usize; 5] {
        self.sets().map(BTreeSet::len)
    }
}

fn family_flag(family: Family) -> &'static str {
    match family {
        Family::V4 => "-4",
        Family::V6 => "-6",
    }
}

fn items(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn text<'v>(value: &'v Value, field: &str) -> &'v str {
    value[field].as_str().unwrap_or("?")
}

/// The family's VXLAN device: its VXLAN settings, MTU, MAC, state and
/// addresses other than link-local ones.
fn device(ns: &str, family: Family) -> Result<Option<String>> {
    let name = family.device_name();
    if !try_in(ns, &["ip", "link", "show", name])?.status.success() {
        return Ok(None);
    }
    let link = &ip_json(ns, &["-d", "link", "show", name])?[0];
    let info = &link["linkinfo"]["info_data"];
    let up = items(&link["flags"]).iter().any(|f| f == "UP");
    let addresses: Vec<String> =
        items(&ip_json(ns, &["addr", "show", "dev", name])?[0]["addr_info"])
            .iter()
            .filter(|a| a["scope"] != "link")
            .map(|a| format!("{}/{}", text(a, "local"), a["prefixlen"]))
            .collect();
    Ok(Some(format!(
        "{name} vni {} port {} local {} parent {} learning {} mtu {} mac {}{} addresses {addresses:?}",
        info["id"],
        info["port"],
        info["local"]
            .as_str()
            .or(info["local6"].as_str())
            .unwrap_or("?"),
        text(info, "link"),
        info["learning"],
        link["mtu"],
        text(link, "address"),
        if up { " up" } else { " down" },
    )))
}

/// vxmgr's routes of one family, as `dst [nhid] via gw dev D [onlink] [mtu
/// M]`, `dst dev D [scope S] [mtu M]` or `blackhole dst`.
pub fn routes(ns: &str, family: Family) -> Result<BTreeSet<String>> {
    routes_selected(ns, family, &["proto", PROTOCOL])
}

/// The routes of one family that `ip route show <selector>` lists (whoever
/// made them), described as [`routes`] does.
pub fn routes_selected(ns: &str, family: Family, selector: &[&str]) -> Result<BTreeSet<String>> {
    let mut args = vec![family_flag(family), "route", "show"];
    args.extend_from_slice(selector);
    let listed = ip_json(ns, &args)?;
    Ok(items(&listed).iter().map(describe_route).collect())
}

fn describe_route(r: &Value) -> String {
    let dst = text(r, "dst");
    let mtu = items(&r["metrics"])
        .iter()
        .find_map(|x| x["mtu"].as_u64())
        .map(|m| format!(" mtu {m}"))
        .unwrap_or_default();
    let onlink = items(&r["flags"]).iter().any(|x| x == "onlink");
    let nhid = if r["nhid"].is_null() { "" } else { " nhid" };
    match (r["type"].as_str(), r["gateway"].as_str()) {
        (Some("blackhole"), _) => format!("blackhole {dst}"),
        (_, Some(gw)) => format!(
            "{dst}{nhid} via {gw} dev {}{}{mtu}",
            text(r, "dev"),
            if onlink { " onlink" } else { "" }
        ),
        // iproute2 shows the scope of IPv4 routes only.
        _ => format!(
            "{dst} dev {}{}{mtu}",
            text(r, "dev"),
            r["scope"]
                .as_str()
                .map(|s| format!(" scope {s}"))
                .unwrap_or_default()
        ),
    }
}

/// vxmgr's nexthops of one family, as `gw dev D` (their ids are the
/// kernel's business).
fn nexthops(ns: &str, family: Family) -> Result<BTreeSet<String>> {
    let listed = ip_json(
        ns,
        &[family_flag(family), "nexthop", "show", "proto", PROTOCOL],
    )?;
    Ok(items(&listed)
        .iter()
        .map(|n| format!("{} dev {}", text(n, "gateway"), text(n, "dev")))
        .collect())
}

/// Permanent ARP/NDP entries on the family's device, as `dst lladdr`.
fn neighbours(ns: &str, family: Family) -> Result<BTreeSet<String>> {
    let listed = ip_json(
        ns,
        &[
            family_flag(family),
            "neigh",
            "show",
            "dev",
            family.device_name(),
            "nud",
            "permanent",
        ],
    )?;
    Ok(items(&listed)
        .iter()
        .map(|n| format!("{} {}", text(n, "dst"), text(n, "lladdr")))
        .collect())
}

/// Permanent FDB entries with a destination on the family's device, as
/// `mac dst`.
fn fdb(ns: &str, family: Family) -> Result<BTreeSet<String>> {
    let listed = run_in(
        ns,
        &["bridge", "-j", "fdb", "show", "dev", family.device_name()],
    )?;
    let listed: Value = serde_json::from_str(&listed).map_err(|e| super::TestbedError::Output {
        command: "bridge -j fdb show".into(),
        reason: e.to_string(),
    })?;
    Ok(items(&listed)
        .iter()
        .filter(|e| e["state"] == "permanent" && !e["dst"].is_null())
        .map(|e| format!("{} {}", text(e, "mac"), text(e, "dst")))
        .collect())
}

/// vxmgr's nftables table, a line a rule, set element list or
/// declaration, and every rule of iptables' and ip6tables' `filter` table
/// in `FORWARD` or vxmgr's chain, without counters.
fn firewall(ns: &str) -> Result<BTreeSet<String>> {
    let mut lines = BTreeSet::new();
    let table = try_in(ns, &["nft", "list", "table", TABLE_FAMILY, TABLE])?;
    if table.status.success() {
        lines.extend(
            String::from_utf8_lossy(&table.stdout)
                .lines()
                .map(|l| format!("nft: {}", l.trim())),
        );
    }
    for save in ["iptables-save", "ip6tables-save"] {
        let listed = run_in(ns, &[save, "-t", "filter"])?;
        lines.extend(
            listed
                .lines()
                .filter(|l| l.contains("FORWARD"))
                .map(|l| format!("{save}: {}", l.split(" [").next().unwrap_or(l))),
        );
    }
    Ok(lines)
}

/// The members of ipset `name`; none when it does not exist.
pub fn ipset_members(ns: &str, name: &str) -> Result<BTreeSet<String>> {
    let listed = try_in(ns, &["ipset", "list", name])?;
    if !listed.status.success() {
        return Ok(BTreeSet::new());
    }
    Ok(String::from_utf8_lossy(&listed.stdout)
        .lines()
        .skip_while(|l| !l.starts_with("Members:"))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect())
}

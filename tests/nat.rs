//! The IP pools' firewall rules against the real kernel, with real traffic:
//! two nodes whose hosts drop forwarded traffic by iptables policy (as
//! Docker sets it), and an "internet" host on the underlay with no route
//! back to the pods. Needs root, `nft` and `iptables`; skips without them
//! unless VXMGR_REQUIRE_NETNS=1.

mod support;

use support::netns::{can_run, cluster, required, wait_until};
use support::say;
use support::testbed::{self, Cluster, pool};

/// The internet host's addresses on the underlay.
const INTERNET_V4: &str = "192.168.10.200";
const INTERNET_V6: &str = "fd00:10::200";

/// A resync every second: drift is repaired within a second or two.
const FLAGS: [&str; 2] = ["--route-refresh-interval", "1s"];

/// Another agent's nftables table whose forward policy is drop, accepting
/// the pods' traffic itself: vxmgr must leave it alone.
const HOST_TABLE: &str = "table inet hostfw {
  chain forward {
    type filter hook forward priority filter + 10; policy drop;
    ct state established,related accept
    ip saddr 10.244.0.0/16 accept
    ip6 saddr fd00:244::/48 accept
  }
}";

/// Counts, in a pod, what arrives from another pod's address: the source
/// a receiver sees.
const OBSERVER: &str = "table inet observe {
  chain input {
    type filter hook input priority filter; policy accept;
    ip saddr 10.244.1.10 counter
    ip6 saddr fd00:244:0:1::10 counter
  }
}";

fn sh(ns: &str, command: &str) -> String {
    testbed::sh(ns, command).unwrap()
}

/// Runs `nft -f -` with `script` in `ns`.
fn nft_file(ns: &str, script: &str) {
    let path = std::env::temp_dir().join(format!("vxmgr-nat-{}-{ns}.nft", std::process::id()));
    std::fs::write(&path, script).unwrap();
    testbed::run_in(ns, &["nft", "-f", &path.to_string_lossy()]).unwrap();
    let _ = std::fs::remove_file(path);
}

/// Whether `address` answers a ping from `ns` within 3 s (one echo request
/// a second until the first answer: the first may wait for proxy ARP).
fn pings(ns: &str, address: &str) -> bool {
    let output = testbed::try_in(ns, &["ping", "-c", "1", "-w", "3", address]).unwrap();
    output.status.success()
}

fn replay_pools(cluster: &Cluster, pools: &[String]) {
    for node in &cluster.nodes {
        node.replay_ok(
            &cluster.dir,
            "pools",
            &cluster.view_with_pools(node.index, false, pools),
        )
        .unwrap();
    }
}

/// The rules of `FORWARD` and its policy, as iptables-save lists them.
fn forward_chain(ns: &str, iptables: &str) -> Vec<String> {
    let save = sh(ns, &format!("{iptables}-save -t filter"));
    save.lines()
        .filter(|l| l.starts_with(":FORWARD") || l.starts_with("-A FORWARD"))
        .map(|l| l.split(" [").next().unwrap_or(l).to_string())
        .collect()
}

/// vxmgr's chain's rules with their packet counters.
fn own_chain_with_counters(ns: &str, iptables: &str) -> Vec<String> {
    let save = sh(ns, &format!("{iptables}-save -c -t filter"));
    save.lines()
        .filter(|l| l.contains("VXMGR-FORWARD"))
        .map(str::to_string)
        .collect()
}

fn table(ns: &str) -> Option<String> {
    let output = testbed::try_in(ns, &["nft", "-a", "list", "table", "inet", "vxmgr"]).unwrap();
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Replaces the IPv4 masquerade rule with an accept, by hand.
fn break_masquerade_rule(ns: &str) {
    let handle = table(ns)
        .unwrap()
        .lines()
        .find(|l| l.contains("ip saddr @masq-pools-v4"))
        .and_then(|l| l.rsplit("handle ").next())
        .unwrap()
        .trim()
        .to_string();
    sh(
        ns,
        &format!(
            "nft replace rule inet vxmgr postrouting handle {handle} ip saddr @masq-pools-v4 accept"
        ),
    );
}

fn set(ns: &str, name: &str) -> String {
    sh(ns, &format!("nft list set inet vxmgr {name}"))
}

fn observed(pod: &str) -> [u64; 2] {
    let listing = sh(pod, "nft list table inet observe");
    let mut counts = listing
        .lines()
        .filter_map(|l| l.split("packets ").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap().parse().unwrap());
    [counts.next().unwrap(), counts.next().unwrap()]
}

/// What the test needs besides root: the binaries it drives.
fn tools_present(test: &str) -> bool {
    let tools = [
        "nft",
        "iptables-save",
        "ip6tables-save",
        "iptables-nft",
        "iptables-legacy",
        "ping",
    ];
    let missing: Vec<&str> = tools
        .into_iter()
        .filter(|tool| {
            testbed::try_run(&["sh", "-c", &format!("command -v {tool}")])
                .is_ok_and(|o| !o.status.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        !required(),
        "{test}: needs {missing:?} (VXMGR_REQUIRE_NETNS=1)"
    );
    say(&format!("SKIPPED {test}: needs {missing:?}"));
    false
}

/// The internet host, removed with the test.
struct Internet(String);

impl Drop for Internet {
    fn drop(&mut self) {
        let _ = testbed::try_run(&["ip", "netns", "del", &self.0]);
    }
}

fn internet(cluster: &Cluster) -> Internet {
    let internet = Internet(format!("{}i", cluster.prefix));
    testbed::run(&["ip", "netns", "add", &internet.0]).unwrap();
    cluster
        .add_underlay_link(&internet.0, "eth0", &format!("{}ei", cluster.prefix))
        .unwrap();
    sh(&internet.0, "ip link set lo up");
    sh(
        &internet.0,
        &format!("ip addr add {INTERNET_V4}/24 dev eth0"),
    );
    sh(
        &internet.0,
        &format!("ip -6 addr add {INTERNET_V6}/64 dev eth0 nodad"),
    );
    internet
}

/// A host firewall as Docker leaves it: FORWARD drops, one rule of its own.
fn drop_forwarding(ns: &str) {
    for iptables in ["iptables", "ip6tables"] {
        sh(ns, &format!("{iptables} -P FORWARD DROP"));
        sh(ns, &format!("{iptables} -N DOCKER-USER"));
        sh(ns, &format!("{iptables} -A FORWARD -j DOCKER-USER"));
    }
}

#[test]
fn pools_masquerade_and_forward_through_a_dropping_host_firewall() {
    let test = "pools_masquerade_and_forward_through_a_dropping_host_firewall";
    if !can_run(test) || !tools_present(test) {
        return;
    }
    let mut cluster = cluster(2);
    let internet = internet(&cluster);
    let (n1, pod1, pod2) = (
        cluster.node(1).ns.clone(),
        cluster.node(1).pod_ns(),
        cluster.node(2).pod_ns(),
    );
    for node in &cluster.nodes {
        drop_forwarding(&node.ns);
    }
    nft_file(&n1, HOST_TABLE);
    nft_file(&pod2, OBSERVER);
    let host_table = sh(&n1, "nft list table inet hostfw");
    let forward_before: Vec<Vec<String>> = ["iptables", "ip6tables"]
        .map(|t| forward_chain(&n1, t))
        .into();
    for node in &mut cluster.nodes {
        node.start_daemon(&FLAGS).unwrap();
    }

    // Pools without masquerading: forwarded, not masqueraded.
    let plain = [
        pool("pods-v4", "10.244.0.0/16", false),
        pool("pods-v6", "fd00:244::/48", false),
    ];
    replay_pools(&cluster, &plain);
    assert!(pings(&pod1, &cluster.node(2).pod_v4()), "pod to pod, IPv4");
    assert!(pings(&pod1, &cluster.node(2).pod_v6()), "pod to pod, IPv6");
    let [v4, v6] = observed(&pod2);
    assert!(
        v4 > 0 && v6 > 0,
        "pod-to-pod traffic arrives with the pod's source: {v4} {v6}"
    );
    assert!(
        !pings(&pod1, INTERNET_V4),
        "answered without masquerading (IPv4)"
    );
    assert!(
        !pings(&pod1, INTERNET_V6),
        "answered without masquerading (IPv6)"
    );
    assert!(table(&n1).is_some_and(|t| !t.contains("masquerade")));

    // Masquerading pools: the internet answers; pods still see pods.
    let masquerading = [
        pool("pods-v4", "10.244.0.0/16", true),
        pool("pods-v6", "fd00:244::/48", true),
    ];
    replay_pools(&cluster, &masquerading);
    assert!(
        pings(&pod1, INTERNET_V4),
        "no answer through masquerading (IPv4)"
    );
    assert!(
        pings(&pod1, INTERNET_V6),
        "no answer through masquerading (IPv6)"
    );
    assert!(pings(&pod1, &cluster.node(2).pod_v4()));
    assert!(pings(&pod1, &cluster.node(2).pod_v6()));
    let [v4_after, v6_after] = observed(&pod2);
    assert!(
        v4_after > v4 && v6_after > v6,
        "pod traffic was masqueraded between pools"
    );

    // Only the jump was added to FORWARD, at its top; the other table and
    // its drop policy are as they were, and were warned about once.
    for (i, iptables) in ["iptables", "ip6tables"].into_iter().enumerate() {
        let mut expected = forward_before[i].clone();
        expected.insert(1, "-A FORWARD -j VXMGR-FORWARD".to_string());
        assert_eq!(forward_chain(&n1, iptables), expected, "{iptables}");
    }
    assert_eq!(sh(&n1, "nft list table inet hostfw"), host_table);
    let warnings = cluster
        .node(1)
        .log_text()
        .matches("drops forwarded traffic by policy")
        .count();
    assert_eq!(warnings, 1, "{}", cluster.node(1).log_text());

    // Drift: the table deleted, the rule changed, the jump moved.
    let programmed = sh(&n1, "nft list table inet vxmgr");
    let forward_programmed = forward_chain(&n1, "iptables");
    sh(&n1, "nft delete table inet vxmgr");
    wait_until("the table to be restored", || table(&n1).is_some());
    assert_eq!(sh(&n1, "nft list table inet vxmgr"), programmed);
    break_masquerade_rule(&n1);
    wait_until("the rule to be restored", || {
        table(&n1).is_some_and(|t| t.contains("@all-pools-v4 masquerade"))
    });
    assert_eq!(sh(&n1, "nft list table inet vxmgr"), programmed);
    sh(&n1, "iptables -D FORWARD -j VXMGR-FORWARD");
    sh(&n1, "iptables -A FORWARD -j VXMGR-FORWARD");
    wait_until("the jump to be back at the top, once", || {
        forward_chain(&n1, "iptables") == forward_programmed
    });
    assert!(pings(&pod1, INTERNET_V4));

    // A restart with the same stream touches nothing: the same rule
    // handles, the forward rules' counters kept.
    let rules = |ns: &str| {
        let chains = ["iptables", "ip6tables"].map(|t| own_chain_with_counters(ns, t));
        (table(ns), chains)
    };
    let before = rules(&n1);
    let node = cluster.node_mut(1);
    node.stop_daemon(libc::SIGTERM).unwrap();
    node.start_daemon(&["--route-refresh-interval", "0"])
        .unwrap();
    let view = cluster.view_with_pools(1, false, &masquerading);
    cluster
        .node(1)
        .replay_ok(&cluster.dir, "restart", &view)
        .unwrap();
    assert_eq!(rules(&n1), before);

    // A pool removed: its elements, rule and forward rules go after InSync.
    let view = cluster.view_with_pools(1, false, &masquerading[..1]);
    cluster
        .node(1)
        .replay_ok(&cluster.dir, "v4-only", &view)
        .unwrap();
    assert!(!set(&n1, "all-pools-v6").contains("fd00:244::/48"));
    assert!(!set(&n1, "masq-pools-v6").contains("fd00:244::/48"));
    let t = table(&n1).unwrap();
    assert!(!t.contains("ip6 saddr"), "{t}");
    assert!(
        own_chain_with_counters(&n1, "ip6tables")
            .iter()
            .all(|l| !l.contains("-A VXMGR-FORWARD"))
    );
    assert!(!pings(&pod1, INTERNET_V6), "IPv6 still masqueraded");
    assert!(pings(&pod1, INTERNET_V4));
    drop(internet);
}

/// Whether `iptables` (e.g. `iptables-legacy`) holds anything of vxmgr's.
fn holds_ours(ns: &str, iptables: &str) -> bool {
    sh(ns, &format!("{iptables}-save -t filter")).contains("VXMGR-FORWARD")
}

/// `FORWARD` of `iptables`, vxmgr's jump first, then what others put there.
fn forward_with_our_jump_first(ns: &str, iptables: &str, others: &[&str]) -> bool {
    let chain = forward_chain(ns, iptables);
    let mut expected: Vec<String> = others.iter().map(|r| r.to_string()).collect();
    expected.insert(1, "-A FORWARD -j VXMGR-FORWARD".to_string());
    chain == expected
}

/// A node started on a host without iptables rules (or with one rule in
/// the backend named `first`), its masquerading pools reaching the
/// internet; then Docker sets up the `docker` backend (FORWARD drops, a
/// chain and jump of its own). The pods reach the internet again once
/// vxmgrd moved its chain, with the default route refresh (90 s): the move
/// comes from nftables' notifications or the legacy poll.
fn forward_rules_follow_docker(test: &str, first: &str, docker: &str) {
    if !can_run(test) || !tools_present(test) {
        return;
    }
    let mut cluster = cluster(1);
    let internet = internet(&cluster);
    let (n1, pod1) = (cluster.node(1).ns.clone(), cluster.node(1).pod_ns());
    let family = |iptables: &str, family: &str| iptables.replace("iptables", family);
    let seed = "-A INPUT -i lo -j ACCEPT";
    if first == "iptables-nft" {
        for f in ["iptables", "ip6tables"] {
            sh(&n1, &format!("{} {seed}", family(first, f)));
        }
    }
    cluster.node_mut(1).start_daemon(&[]).unwrap();
    let masquerading = [
        pool("pods-v4", "10.244.0.0/16", true),
        pool("pods-v6", "fd00:244::/48", true),
    ];
    replay_pools(&cluster, &masquerading);
    let other = if first == "iptables-nft" {
        "iptables-legacy"
    } else {
        "iptables-nft"
    };
    assert!(holds_ours(&n1, first), "{first} chosen first");
    if first == "iptables-nft" {
        // vxmgrd's reads of the legacy backend made none of its tables
        // (this test's own read below makes its filter table).
        for names in ["ip_tables_names", "ip6_tables_names"] {
            let tables = sh(&n1, &format!("cat /proc/net/{names}"));
            assert!(tables.trim().is_empty(), "{names}: {tables}");
        }
    }
    assert!(!holds_ours(&n1, other));
    assert!(pings(&pod1, INTERNET_V4), "masqueraded (IPv4)");

    for f in ["iptables", "ip6tables"] {
        let iptables = family(docker, f);
        sh(&n1, &format!("{iptables} -P FORWARD DROP"));
        sh(&n1, &format!("{iptables} -N DOCKER-USER"));
        sh(&n1, &format!("{iptables} -A FORWARD -j DOCKER-USER"));
    }
    wait_until("pods to reach the internet through the new drop", || {
        pings(&pod1, INTERNET_V4) && pings(&pod1, INTERNET_V6)
    });
    let docker_forward = [":FORWARD DROP", "-A FORWARD -j DOCKER-USER"];
    for f in ["iptables", "ip6tables"] {
        let (into, from) = (family(docker, f), family(first, f));
        assert!(
            forward_with_our_jump_first(&n1, &into, &docker_forward),
            "{into}: {:?}",
            forward_chain(&n1, &into)
        );
        if into != from {
            assert!(!holds_ours(&n1, &from), "{from} still holds vxmgr's chain");
        }
        if first == "iptables-nft" {
            let save = sh(&n1, &format!("{from}-save -t filter"));
            assert!(save.contains(seed), "{from} lost its rule: {save}");
        }
    }
    assert!(sh(&n1, &format!("{docker} -S DOCKER-USER")).contains("-N DOCKER-USER"));
    drop(internet);
}

#[test]
fn forward_rules_follow_docker_to_iptables_nft() {
    forward_rules_follow_docker(
        "forward_rules_follow_docker_to_iptables_nft",
        "iptables-legacy",
        "iptables-nft",
    );
}

#[test]
fn forward_rules_follow_docker_to_iptables_legacy() {
    forward_rules_follow_docker(
        "forward_rules_follow_docker_to_iptables_legacy",
        "iptables-nft",
        "iptables-legacy",
    );
}

/// With the default route refresh (90 s), vxmgr's table deleted or changed
/// by hand comes back as it was: nftables notifies the change.
#[test]
fn the_table_is_repaired_when_nftables_reports_a_change() {
    let test = "the_table_is_repaired_when_nftables_reports_a_change";
    if !can_run(test) || !tools_present(test) {
        return;
    }
    let mut cluster = cluster(1);
    let n1 = cluster.node(1).ns.clone();
    cluster.node_mut(1).start_daemon(&[]).unwrap();
    replay_pools(&cluster, &[pool("pods-v4", "10.244.0.0/16", true)]);
    let programmed = sh(&n1, "nft list table inet vxmgr");
    let restored = |what: &str| {
        wait_until(what, || {
            table(&n1).is_some() && sh(&n1, "nft list table inet vxmgr") == programmed
        })
    };
    sh(&n1, "nft delete table inet vxmgr");
    restored("the deleted table to come back");
    sh(
        &n1,
        "nft delete element inet vxmgr all-pools-v4 { 10.244.0.0/16 }",
    );
    restored("the deleted element to come back");
    sh(
        &n1,
        "nft add element inet vxmgr masq-pools-v4 { 192.168.77.0/24 }",
    );
    restored("the added element to go");
    break_masquerade_rule(&n1);
    restored("the changed rule to be put back");
}

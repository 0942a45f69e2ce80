//! The agent on the in-memory etcd: leases that come, change and go in
//! bursts, across compactions, outages and restarts.

use std::ops::Deref;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{Rig, eventually, routes, stop};
use crate::health::Health;
use crate::registry::etcd::kv::{Event, KeyValue};
use crate::registry::etcd::memory::MemoryEtcd;
use crate::registry::etcd::{EtcdSubnetManager, LeaseOptions};

const CONFIG_KEY: &str = "/coreos.com/network/config";
const SUBNETS: &str = "/coreos.com/network/subnets/";
const CONFIG: &str = r#"{"Network": "10.50.0.0/16", "Backend": {"Type": "vxlan"}}"#;

/// vxmgrd in this process, and the in-memory etcd.
struct EtcdRig {
    rig: Rig,
    registry: MemoryEtcd,
}

impl Deref for EtcdRig {
    type Target = Rig;

    fn deref(&self) -> &Rig {
        &self.rig
    }
}

impl EtcdRig {
    async fn start() -> EtcdRig {
        EtcdRig {
            rig: Rig::start().await,
            registry: MemoryEtcd::default(),
        }
    }

    /// An agent of a node at `ip` on 192.168.10.0/24, running.
    fn agent(&self, ip: &str) -> JoinHandle<()> {
        let manager = EtcdSubnetManager::new(
            self.registry.clone(),
            LeaseOptions {
                prefix: "/coreos.com/network".into(),
                lease_ttl: Duration::from_secs(86_400),
                renew_margin: Duration::from_secs(3600),
            },
        );
        self.rig
            .spawn(manager, ip, std::sync::Arc::new(Health::default()))
    }

    /// Lease keys, without the prefix.
    fn leases(&self) -> Vec<String> {
        self.registry
            .keys()
            .into_iter()
            .filter_map(|k| k.strip_prefix(SUBNETS).map(str::to_string))
            .collect()
    }

    async fn until_leases(&self, n: usize) -> Vec<String> {
        eventually(&format!("{n} leases"), || self.leases().len() >= n).await;
        self.leases()
    }
}

/// Another node's vxlan lease value.
fn remote(n: u32) -> (String, String) {
    (
        format!("{SUBNETS}10.50.{}.{}-28", 100 + n / 16, (n % 16) * 16),
        format!(
            r#"{{"PublicIP":"172.16.{}.{}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"0e:00:00:00:{:02x}:{:02x}"}}}}"#,
            n / 250,
            n % 250 + 1,
            n / 256,
            n % 256
        ),
    )
}

fn puts(range: std::ops::Range<u32>) -> Vec<Event> {
    range
        .map(|n| {
            let (key, value) = remote(n);
            Event::Put(KeyValue {
                key,
                value: value.into_bytes(),
            })
        })
        .collect()
}

fn remote_dst(n: u32) -> String {
    format!("10.50.{}.{}/28", 100 + n / 16, (n % 16) * 16)
}

#[tokio::test]
async fn programs_every_event_of_every_response() {
    let rig = EtcdRig::start().await;
    rig.registry.set(CONFIG_KEY, CONFIG);
    rig.registry.transaction(puts(0..3));
    let agent = rig.agent("192.168.10.1");
    let state = rig
        .until("three remote routes and the device", |s| {
            routes(s).len() == 3 && s.ipv4.as_ref().is_some_and(|v| v.device.is_some())
        })
        .await;
    let local = state
        .ipv4
        .as_ref()
        .unwrap()
        .local_vtep
        .as_ref()
        .expect("local VTEP");
    assert_eq!(local.node, "node-1");
    assert_eq!(local.parent_address, "192.168.10.1");
    let device = state
        .ipv4
        .as_ref()
        .unwrap()
        .device
        .as_ref()
        .expect("device");
    assert_eq!(
        (device.name.as_str(), device.vni, device.port),
        ("flannel.1", 1, 8472)
    );

    let own: Vec<String> = rig
        .leases()
        .into_iter()
        .filter(|k| k.ends_with("-24"))
        .collect();
    assert_eq!(own.len(), 1, "{own:?}");
    let value = rig.registry.value(&format!("{SUBNETS}{}", own[0])).unwrap();
    assert!(value.starts_with(r#"{"PublicIP":"192.168.10.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":""#), "{value}");
    assert_eq!(rig.registry.ttls(), [Duration::from_secs(86_400)]);
    let env = std::fs::read_to_string(rig.subnet_file("192.168.10.1.env")).unwrap();
    let subnet = own[0].trim_end_matches("-24").trim_end_matches(".0");
    assert!(
        env.contains(&format!("FLANNEL_SUBNET={subnet}.1/24\n")),
        "{env}"
    );
    assert!(env.contains("FLANNEL_MTU=1450\n"), "{env}");

    // 100 leases in one revision, one watch response: every one counts.
    rig.registry.transaction(puts(3..103));
    rig.until("103 routes", |s| routes(s).len() == 103).await;
    let gone: Vec<Event> = (0..50)
        .map(|n| Event::Delete { key: remote(n).0 })
        .collect();
    rig.registry.transaction(gone);
    let state = rig.until("53 routes", |s| routes(s).len() == 53).await;
    assert_eq!(routes(&state), (50..103).map(remote_dst).collect());
    stop(agent).await;
}

#[tokio::test]
async fn waits_for_a_usable_config() {
    let rig = EtcdRig::start().await;
    rig.registry
        .set(CONFIG_KEY, r#"{"Network": "10.50.0.0/16"}"#);
    let agent = rig.agent("192.168.10.1");
    eventually("the config read twice", || {
        rig.registry.gets_of(CONFIG_KEY) >= 2
    })
    .await;
    assert!(rig.leases().is_empty(), "no lease without a config");
    rig.registry.set(CONFIG_KEY, CONFIG);
    assert_eq!(rig.until_leases(1).await.len(), 1);
    stop(agent).await;
}

#[tokio::test]
async fn a_restarted_agent_keeps_its_lease() {
    let rig = EtcdRig::start().await;
    rig.registry.set(CONFIG_KEY, CONFIG);
    let agent = rig.agent("192.168.10.1");
    let before = rig.until_leases(1).await;
    rig.until("the local VTEP", |s| {
        s.ipv4.as_ref().is_some_and(|v| v.local_vtep.is_some())
    })
    .await;
    stop(agent).await;
    let again = rig.agent("192.168.10.1");
    // Renewed on start (a second write), same key.
    eventually("the lease written again", || rig.registry.ttls().len() >= 2).await;
    assert_eq!(rig.leases(), before);
    stop(again).await;
}

#[tokio::test]
async fn changes_missed_in_an_outage_or_compaction_are_found_by_listing_again() {
    let rig = EtcdRig::start().await;
    rig.registry.set(CONFIG_KEY, CONFIG);
    rig.registry.transaction(puts(0..10));
    let agent = rig.agent("192.168.10.1");
    rig.until("ten routes", |s| routes(s).len() == 10).await;

    rig.registry.set_down(true);
    // What changes meanwhile, the agent cannot see but must not lose.
    rig.registry
        .transaction(vec![Event::Delete { key: remote(0).0 }]);
    rig.registry.transaction(puts(10..12));
    rig.registry.compact();
    rig.registry.set_down(false);
    let state = rig.until("the changes", |s| routes(s).len() == 11).await;
    assert_eq!(routes(&state), (1..12).map(remote_dst).collect());

    // A watch that falls behind a compaction lists again too.
    eventually("a watch again", || rig.registry.watchers() > 0).await;
    rig.registry.transaction(puts(12..13));
    rig.registry.compact();
    rig.registry.break_watches_with_compaction();
    rig.registry.transaction(puts(13..14));
    rig.until("13 routes", |s| routes(s).len() == 13).await;
    stop(agent).await;
}

#[tokio::test]
async fn our_deleted_lease_is_taken_again() {
    let rig = EtcdRig::start().await;
    rig.registry.set(CONFIG_KEY, CONFIG);
    let agent = rig.agent("192.168.10.1");
    let before = rig.until_leases(1).await;
    let key = format!("{SUBNETS}{}", before[0]);
    rig.registry.remove(&key);
    rig.until_leases(1).await;
    assert_eq!(rig.leases(), before, "the same subnet, free again");
    stop(agent).await;
}

/// The subnet file of the agent at `ip`, naming `subnet` as this node's.
fn write_subnet_file(rig: &EtcdRig, ip: &str, subnet: &str) {
    let text = format!(
        "FLANNEL_NETWORK=10.50.0.0/16\nFLANNEL_SUBNET={subnet}\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"
    );
    std::fs::write(rig.subnet_file(&format!("{ip}.env")), text).unwrap();
}

#[tokio::test]
async fn a_restart_after_the_lease_was_deleted_asks_for_the_subnet_file_subnet() {
    let rig = EtcdRig::start().await;
    rig.registry.set(CONFIG_KEY, CONFIG);
    // Beyond the first 100 free subnets: never a random choice.
    write_subnet_file(&rig, "192.168.10.1", "10.50.200.1/24");
    let agent = rig.agent("192.168.10.1");
    assert_eq!(rig.until_leases(1).await, ["10.50.200.0-24"]);
    agent.abort();
    let _ = agent.await;
    rig.registry.remove(&format!("{SUBNETS}10.50.200.0-24"));
    let again = rig.agent("192.168.10.1");
    assert_eq!(rig.until_leases(1).await, ["10.50.200.0-24"]);
    again.abort();
}

#[tokio::test]
async fn a_subnet_file_subnet_that_is_leased_or_outside_the_network_is_not_asked_for() {
    let rig = EtcdRig::start().await;
    rig.registry.set(CONFIG_KEY, CONFIG);
    let (other, value) = remote(0);
    rig.registry.set(&other, &value);
    let other_subnet = remote_dst(0).replace("/28", "");
    // Another node holds a /28 inside the /24 the file names.
    write_subnet_file(&rig, "192.168.10.1", &format!("{other_subnet}/24"));
    write_subnet_file(&rig, "192.168.10.2", "10.60.1.1/24");
    let agents = [rig.agent("192.168.10.1"), rig.agent("192.168.10.2")];
    let leases = rig.until_leases(3).await;
    assert!(
        leases
            .iter()
            .all(|k| k.starts_with("10.50.") && !k.starts_with("10.50.100.0-24")),
        "{leases:?}"
    );
    assert_eq!(rig.registry.value(&other).as_deref(), Some(value.as_str()));
    for agent in agents {
        agent.abort();
    }
}

#[tokio::test]
async fn bad_leases_are_skipped_and_never_cost_a_good_route() {
    let rig = EtcdRig::start().await;
    rig.registry.set(CONFIG_KEY, CONFIG);
    rig.registry.transaction(puts(0..2));
    let agent = rig.agent("192.168.10.1");
    rig.until("two routes", |s| routes(s).len() == 2).await;
    rig.registry.set(&remote(0).0, "{not json");
    rig.registry.set(
        &format!("{SUBNETS}10.50.200.0-24"),
        r#"{"PublicIP":"300.1.1.1"}"#,
    );
    rig.registry.set(&format!("{SUBNETS}not-a-subnet"), "{}");
    rig.registry.transaction(puts(2..3));
    let state = rig.until("three routes", |s| routes(s).len() == 3).await;
    assert_eq!(routes(&state), (0..3).map(remote_dst).collect());
    stop(agent).await;
}

#[tokio::test]
async fn agents_starting_together_get_different_subnets() {
    let rig = EtcdRig::start().await;
    // Room for exactly three subnets: every start contends.
    rig.registry.set(
        CONFIG_KEY,
        r#"{"Network": "10.50.0.0/16", "SubnetMin": "10.50.1.0", "SubnetMax": "10.50.3.0", "Backend": {"Type": "vxlan"}}"#,
    );
    let agents: Vec<JoinHandle<()>> = (1..=3)
        .map(|i| rig.agent(&format!("192.168.10.{i}")))
        .collect();
    let mut leases = rig.until_leases(3).await;
    leases.sort();
    assert_eq!(leases, ["10.50.1.0-24", "10.50.2.0-24", "10.50.3.0-24"]);
    for agent in agents {
        stop(agent).await;
    }
}

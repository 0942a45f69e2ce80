//! The agent on the in-memory Kubernetes API: Nodes that join, change,
//! lose their annotations and go, watches that restart, a Node waiting for
//! its podCIDR.

use std::ops::Deref;
use std::sync::Arc;

use tokio::task::JoinHandle;
use vxmgr::metrics::http::Probes;

use super::{Rig, eventually, routes, stop};
use crate::health::{Health, HealthProbes};
use crate::registry::kube::memory::{MemoryNodeApi, flannel_node, test_node};
use crate::registry::kube::node::AnnotationNames;
use crate::registry::kube::{KubeOptions, KubeSubnetManager, NodeIdentity};

const CONFIG: &str = r#"{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}"#;
const PREFIX: &str = "flannel.alpha.coreos.com";

struct KubeRig {
    rig: Rig,
    api: MemoryNodeApi,
    health: Arc<Health>,
}

impl Deref for KubeRig {
    type Target = Rig;

    fn deref(&self) -> &Rig {
        &self.rig
    }
}

impl KubeRig {
    async fn start() -> KubeRig {
        let rig = Rig::start().await;
        std::fs::write(rig.subnet_file("net-conf.json"), CONFIG).unwrap();
        KubeRig {
            rig,
            api: MemoryNodeApi::default(),
            health: Arc::new(Health::default()),
        }
    }

    /// The agent of Node `node-1` at 192.168.10.1, running.
    fn agent(&self) -> JoinHandle<()> {
        self.agent_of(NodeIdentity::Name("node-1".into()))
    }

    fn agent_of(&self, node: NodeIdentity) -> JoinHandle<()> {
        let manager = KubeSubnetManager::new(
            self.api.clone(),
            KubeOptions {
                node,
                net_config_path: self.subnet_file("net-conf.json"),
                annotations: AnnotationNames::new(PREFIX),
                set_node_network_unavailable: true,
            },
        );
        self.rig.spawn(manager, "192.168.10.1", self.health.clone())
    }

    /// node-1's agent with the `remotes` Nodes there too, once vxmgrd has
    /// programmed them.
    async fn ready_with(&self, remotes: &[u8]) -> JoinHandle<()> {
        self.api
            .put_node(test_node("node-1", &["10.244.1.0/24"], &[]));
        for n in remotes {
            self.api.put_node(remote(*n));
        }
        let agent = self.agent();
        self.until("every remote route", |s| routes(s).len() == remotes.len())
            .await;
        eventually("ready", || {
            HealthProbes(self.health.clone()).not_ready().is_none()
        })
        .await;
        agent
    }

    /// Messages sent to vxmgrd so far.
    async fn sent(&self) -> u64 {
        let text = HealthProbes(self.health.clone()).metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix("calc_flannel_messages_sent_total "))
            .expect("the counter is exposed")
            .parse()
            .unwrap()
    }
}

fn remote(n: u8) -> k8s_openapi::api::core::v1::Node {
    flannel_node(
        &format!("node-{n}"),
        &format!("10.244.{n}.0/24"),
        &format!("192.168.10.{n}"),
        &format!("0e:00:00:00:00:{n:02x}"),
    )
}

fn dst(n: u8) -> String {
    format!("10.244.{n}.0/24")
}

#[tokio::test]
async fn a_cold_start_annotates_the_node_programs_the_others_and_says_the_network_is_up() {
    let rig = KubeRig::start().await;
    rig.api
        .put_node(test_node("node-1", &["10.244.1.0/24"], &[]));
    rig.api.put_node(remote(2));
    rig.api.put_node(remote(3));
    let agent = rig.agent();
    let state = rig
        .until("two remote routes and the local VTEP", |s| {
            routes(s).len() == 2 && s.ipv4.as_ref().is_some_and(|v| v.local_vtep.is_some())
        })
        .await;
    assert_eq!(routes(&state), [dst(2), dst(3)].into());
    let local = state.ipv4.unwrap().local_vtep.unwrap();
    assert_eq!(local.tunnel_address, "10.244.1.0");

    let own = rig.api.node_named("node-1").unwrap();
    let annotations = own.metadata.annotations.unwrap();
    assert_eq!(annotations[&format!("{PREFIX}/backend-type")], "vxlan");
    assert_eq!(annotations[&format!("{PREFIX}/public-ip")], "192.168.10.1");
    assert_eq!(
        annotations[&format!("{PREFIX}/kube-subnet-manager")],
        "true"
    );
    assert!(annotations[&format!("{PREFIX}/backend-data")].starts_with(r#"{"VNI":1,"VtepMAC":""#));
    let env = std::fs::read_to_string(rig.subnet_file("192.168.10.1.env")).unwrap();
    assert!(env.contains("FLANNEL_SUBNET=10.244.1.1/24\n"), "{env}");

    eventually("NetworkUnavailable set false", || {
        !rig.api.status_patches().is_empty()
    })
    .await;
    let (node, patch) = &rig.api.status_patches()[0];
    assert_eq!(node, "node-1");
    assert_eq!(patch["status"]["conditions"][0]["reason"], "FlannelIsUp");
    assert!(HealthProbes(rig.health.clone()).not_ready().is_none());
    assert_eq!(rig.api.annotation_patches().len(), 1);
    stop(agent).await;
}

#[tokio::test]
async fn a_restart_patches_nothing_when_the_annotations_are_right() {
    let rig = KubeRig::start().await;
    rig.api
        .put_node(test_node("node-1", &["10.244.1.0/24"], &[]));
    let first = rig.agent();
    eventually("annotated", || rig.api.annotation_patches().len() == 1).await;
    stop(first).await;
    let again = rig.agent();
    eventually("a second watch", || rig.api.watchers() == 1).await;
    rig.until("the local VTEP", |s| {
        s.ipv4.as_ref().is_some_and(|v| v.local_vtep.is_some())
    })
    .await;
    assert_eq!(rig.api.annotation_patches().len(), 1);
    stop(again).await;
}

#[tokio::test]
async fn the_subnet_file_never_overrides_the_pod_cidr() {
    let rig = KubeRig::start().await;
    let subnet_file = rig.subnet_file("192.168.10.1.env");
    std::fs::write(&subnet_file, "FLANNEL_SUBNET=10.244.87.1/24\n").unwrap();
    rig.api
        .put_node(test_node("node-1", &["10.244.1.0/24"], &[]));
    let agent = rig.agent();
    let state = rig
        .until("the local VTEP", |s| {
            s.ipv4.as_ref().is_some_and(|v| v.local_vtep.is_some())
        })
        .await;
    assert_eq!(
        state.ipv4.unwrap().local_vtep.unwrap().tunnel_address,
        "10.244.1.0"
    );
    let env = std::fs::read_to_string(&subnet_file).unwrap();
    assert!(env.contains("FLANNEL_SUBNET=10.244.1.1/24\n"), "{env}");
    agent.abort();
}

#[tokio::test]
async fn the_node_waits_for_its_pod_cidr_and_refuses_one_outside_the_network() {
    let rig = KubeRig::start().await;
    rig.api.put_node(test_node("node-1", &[], &[]));
    rig.api.put_node(remote(2));
    let agent = rig.agent();
    let subnet_file = rig.subnet_file("192.168.10.1.env");
    eventually("node-1 read", || rig.api.reads_of("node-1") >= 1).await;
    rig.api
        .put_node(test_node("node-1", &["10.99.0.0/24"], &[]));
    // Read again after the change: it has seen the refused podCIDR.
    let reads = rig.api.reads_of("node-1");
    eventually("node-1 read again", || {
        rig.api.reads_of("node-1") >= reads + 2
    })
    .await;
    assert!(rig.api.annotation_patches().is_empty());
    assert!(!subnet_file.exists());
    rig.api
        .put_node(test_node("node-1", &["10.244.1.0/24"], &[]));
    let state = rig
        .until("the remote route", |s| routes(s).len() == 1)
        .await;
    assert_eq!(routes(&state), [dst(2)].into());
    assert!(subnet_file.exists());
    stop(agent).await;
}

#[tokio::test]
async fn nodes_join_change_and_go_and_an_unchanged_update_sends_nothing() {
    let rig = KubeRig::start().await;
    let agent = rig.ready_with(&[2]).await;

    // node-2 updated with nothing flannel reads changed, then node-3
    // joins: only node-3's VTEP and route are sent.
    let before = rig.sent().await;
    let mut touched = remote(2);
    touched
        .metadata
        .labels
        .get_or_insert_default()
        .insert("kubernetes.io/role".into(), "worker".into());
    rig.api.put_node(touched);
    rig.api.put_node(remote(3));
    rig.until("two routes", |s| routes(s).len() == 2).await;
    assert_eq!(rig.sent().await - before, 2);

    // A changed public IP is a change.
    let mut moved = remote(3);
    moved
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(format!("{PREFIX}/public-ip"), "192.168.10.33".into());
    rig.api.put_node(moved);
    rig.until("node-3's new address", |s| {
        s.ipv4.as_ref().is_some_and(|v| {
            v.remote_vteps
                .iter()
                .any(|r| r.parent_address == "192.168.10.33")
        })
    })
    .await;

    // Bad annotations keep what the Node had; a Node outside the network
    // is refused; other Nodes are still taken.
    let mut broken = remote(2);
    broken
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(format!("{PREFIX}/backend-data"), "{not json".into());
    rig.api.put_node(broken);
    rig.api.put_node(flannel_node(
        "node-9",
        "10.99.0.0/24",
        "192.168.10.9",
        "0e:00:00:00:00:09",
    ));
    rig.api.put_node(remote(4));
    let state = rig.until("three routes", |s| routes(s).len() == 3).await;
    assert_eq!(routes(&state), [dst(2), dst(3), dst(4)].into());

    // Losing the annotations, or the Node, loses the route.
    let mut unmanaged = remote(3);
    unmanaged
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(&format!("{PREFIX}/kube-subnet-manager"));
    rig.api.put_node(unmanaged);
    rig.api.delete_node("node-4");
    let state = rig.until("one route", |s| routes(s).len() == 1).await;
    assert_eq!(routes(&state), [dst(2)].into());
    stop(agent).await;
}

#[tokio::test]
async fn a_restarted_watch_deletes_only_what_is_gone() {
    let rig = KubeRig::start().await;
    let agent = rig.ready_with(&[2, 3]).await;

    let before = rig.sent().await;
    rig.api.fail_watches("connection reset");
    // node-3 goes while no watch sees it; the listing after the restart
    // finds it gone, and node-2 is not sent again.
    rig.api.restart_watches_after(|nodes| {
        nodes.remove("node-3");
    });
    let state = rig.until("one route", |s| routes(s).len() == 1).await;
    assert_eq!(routes(&state), [dst(2)].into());
    rig.api.put_node(remote(4));
    rig.until("two routes", |s| routes(s).len() == 2).await;
    // node-3's route and VTEP removed, node-4's VTEP and route added.
    assert_eq!(rig.sent().await - before, 4);
    stop(agent).await;
}

#[tokio::test]
async fn the_node_is_found_through_its_pod_once_scheduled() {
    let rig = KubeRig::start().await;
    rig.api
        .put_node(test_node("node-1", &["10.244.1.0/24"], &[]));
    let agent = rig.agent_of(NodeIdentity::Pod {
        namespace: "kube-flannel".into(),
        name: "kube-flannel-ds-x".into(),
    });
    rig.api
        .set_pod("kube-flannel", "kube-flannel-ds-x", "node-1");
    rig.until("the local VTEP", |s| {
        s.ipv4.as_ref().is_some_and(|v| v.local_vtep.is_some())
    })
    .await;
    assert_eq!(rig.api.annotation_patches()[0].0, "node-1");
    stop(agent).await;
}

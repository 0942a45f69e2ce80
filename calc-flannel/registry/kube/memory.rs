//! An in-memory Kubernetes API for fast tests: Nodes whose changes reach
//! every watch as kube-rs's watcher reports them, Pods' node names, and a
//! record of every patch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::Event;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::api::{ApiError, NodeApi, NodeEvents};
use super::node::node_name;

type Watcher = mpsc::UnboundedSender<Result<Event<Node>, ApiError>>;

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, Node>,
    pods: BTreeMap<(String, String), String>,
    watchers: Vec<Watcher>,
    annotations: Vec<(String, BTreeMap<String, String>)>,
    statuses: Vec<(String, serde_json::Value)>,
    reads: BTreeMap<String, usize>,
}

impl State {
    fn tell(&mut self, event: impl Fn() -> Event<Node>) {
        self.watchers.retain(|w| w.send(Ok(event())).is_ok());
    }

    /// A listing, as a watcher sends one when it (re)starts.
    fn list_to(&self, watcher: &Watcher) -> bool {
        let mut events = vec![Event::Init];
        events.extend(self.nodes.values().cloned().map(Event::InitApply));
        events.push(Event::InitDone);
        events.into_iter().all(|e| watcher.send(Ok(e)).is_ok())
    }
}

#[derive(Clone, Default)]
pub struct MemoryNodeApi {
    state: Arc<Mutex<State>>,
}

impl MemoryNodeApi {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Creates or replaces a Node.
    pub fn put_node(&self, node: Node) {
        let mut state = self.state();
        state
            .nodes
            .insert(node_name(&node).to_string(), node.clone());
        state.tell(|| Event::Apply(node.clone()));
    }

    pub fn delete_node(&self, name: &str) {
        let mut state = self.state();
        if let Some(node) = state.nodes.remove(name) {
            state.tell(|| Event::Delete(node.clone()));
        }
    }

    /// Changes Nodes without any watch hearing of it, then restarts every
    /// watch (as one whose resource version expired): each lists again.
    pub fn restart_watches_after(&self, change: impl FnOnce(&mut BTreeMap<String, Node>)) {
        let mut state = self.state();
        change(&mut state.nodes);
        let watchers = std::mem::take(&mut state.watchers);
        state.watchers = watchers.into_iter().filter(|w| state.list_to(w)).collect();
    }

    /// Breaks every watch with an error (the watcher retries and lists).
    pub fn fail_watches(&self, why: &str) {
        for w in &self.state().watchers {
            let _ = w.send(Err(ApiError::Failed(why.to_string())));
        }
    }

    pub fn set_pod(&self, namespace: &str, pod: &str, node: &str) {
        self.state()
            .pods
            .insert((namespace.into(), pod.into()), node.into());
    }

    pub fn node_named(&self, name: &str) -> Option<Node> {
        self.state().nodes.get(name).cloned()
    }

    /// Every annotation patch, in order.
    pub fn annotation_patches(&self) -> Vec<(String, BTreeMap<String, String>)> {
        self.state().annotations.clone()
    }

    /// Every status patch, in order.
    pub fn status_patches(&self) -> Vec<(String, serde_json::Value)> {
        self.state().statuses.clone()
    }

    /// How often Node `name` was read.
    pub fn reads_of(&self, name: &str) -> usize {
        self.state().reads.get(name).copied().unwrap_or(0)
    }

    pub fn watchers(&self) -> usize {
        let mut state = self.state();
        state.watchers.retain(|w| !w.is_closed());
        state.watchers.len()
    }
}

impl NodeApi for MemoryNodeApi {
    async fn node(&self, name: &str) -> Result<Node, ApiError> {
        let mut state = self.state();
        *state.reads.entry(name.to_string()).or_default() += 1;
        state
            .nodes
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::NotFound(format!("Node {name}")))
    }

    async fn pod_node(&self, namespace: &str, pod: &str) -> Result<Option<String>, ApiError> {
        Ok(self
            .state()
            .pods
            .get(&(namespace.into(), pod.into()))
            .cloned())
    }

    async fn annotate(
        &self,
        node: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        let mut state = self.state();
        state.annotations.push((node.into(), annotations.clone()));
        let stored = state
            .nodes
            .get_mut(node)
            .ok_or_else(|| ApiError::NotFound(format!("Node {node}")))?;
        stored
            .metadata
            .annotations
            .get_or_insert_default()
            .extend(annotations.clone());
        let updated = stored.clone();
        state.tell(|| Event::Apply(updated.clone()));
        Ok(())
    }

    async fn patch_status(&self, node: &str, patch: &serde_json::Value) -> Result<(), ApiError> {
        self.state().statuses.push((node.into(), patch.clone()));
        Ok(())
    }

    fn watch(&self) -> NodeEvents {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.state();
        if state.list_to(&tx) {
            state.watchers.push(tx);
        }
        UnboundedReceiverStream::new(rx).boxed()
    }
}

/// A Node as tests write them: `pod_cidrs` (the first also as
/// `spec.podCIDR`) and `annotations`.
pub fn test_node(name: &str, pod_cidrs: &[&str], annotations: &[(&str, &str)]) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some(name.into());
    if !annotations.is_empty() {
        node.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    if !pod_cidrs.is_empty() {
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            pod_cidr: Some(pod_cidrs[0].into()),
            pod_cidrs: Some(pod_cidrs.iter().map(|c| c.to_string()).collect()),
            ..Default::default()
        });
    }
    node
}

/// Node `name` as a flanneld (or calc-flannel) of vxlan annotated it.
pub fn flannel_node(name: &str, pod_cidr: &str, public_ip: &str, mac: &str) -> Node {
    let data = format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#);
    test_node(
        name,
        &[pod_cidr],
        &[
            ("flannel.alpha.coreos.com/backend-type", "vxlan"),
            ("flannel.alpha.coreos.com/backend-data", &data),
            ("flannel.alpha.coreos.com/public-ip", public_ip),
            ("flannel.alpha.coreos.com/kube-subnet-manager", "true"),
        ],
    )
}

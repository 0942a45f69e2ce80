//! flannel's kube subnet manager (flanneld `--kube-subnet-mgr`): the
//! network config is a file (`--net-config-path`, the ConfigMap kube-flannel
//! mounts), this node's lease is its Node's podCIDRs (allocated by the
//! controller manager; waited for), published with flannel's annotations
//! on the Node, and every other Node with `kube-subnet-manager: "true"`,
//! a podCIDR and those annotations is a lease. Nothing expires: a lease
//! goes with its Node or its annotations.

pub mod api;
#[cfg(test)]
pub mod memory;
pub mod node;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::Event;
use tracing::{debug, info, warn};

use self::api::{ApiError, NodeApi, NodeEvents};
use self::node::{AnnotationNames, NodeLease, PodCidrs};
use super::{LeaseChange, SubnetManager};
use crate::allocate::Previous;
use crate::backoff::{Condition, retry};
use crate::lease::{Lease, LeaseAttrs};
use crate::network::NetworkConfig;
use crate::subnet::SubnetKey;

/// Which Node is this node's, as flanneld finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeIdentity {
    /// `NODE_NAME`.
    Name(String),
    /// `POD_NAMESPACE`/`POD_NAME`: the Node that Pod runs on.
    Pod { namespace: String, name: String },
}

#[derive(Clone, Debug)]
pub struct KubeOptions {
    pub node: NodeIdentity,
    pub net_config_path: PathBuf,
    pub annotations: AnnotationNames,
    /// Set the Node's `NetworkUnavailable` condition false once vxmgrd has
    /// programmed the node.
    pub set_node_network_unavailable: bool,
}

pub struct KubeSubnetManager<A> {
    api: A,
    options: KubeOptions,
    config: Option<NetworkConfig>,
    /// This node's Node, once known.
    node: String,
    events: Option<NodeEvents>,
    /// The Nodes of a listing under way (between `Init` and `InitDone`).
    listing: Option<Vec<Node>>,
    /// Each other Node's lease key as last taken: what to delete when the
    /// Node goes or stops being a lease.
    keys: BTreeMap<String, SubnetKey>,
    /// Why a Node is not used, as last logged.
    problems: BTreeMap<String, String>,
    watching: Condition,
    status_set: bool,
}

/// The next watch event; `None`: the watch ended.
pub type KubeDue = Option<Result<Event<Node>, ApiError>>;

impl<A: NodeApi> KubeSubnetManager<A> {
    pub fn new(api: A, options: KubeOptions) -> KubeSubnetManager<A> {
        KubeSubnetManager {
            api,
            options,
            config: None,
            node: String::new(),
            events: None,
            listing: None,
            keys: BTreeMap::new(),
            problems: BTreeMap::new(),
            watching: Condition::new("watching Nodes"),
            status_set: false,
        }
    }

    fn config(&self) -> &NetworkConfig {
        self.config
            .as_ref()
            .expect("the agent reads the config before it acquires a lease")
    }

    /// This node's Node name, waiting for its Pod to be scheduled if it is
    /// found through its Pod.
    async fn node_name(&mut self) -> String {
        let (namespace, pod) = match &self.options.node {
            NodeIdentity::Name(name) => return name.clone(),
            NodeIdentity::Pod { namespace, name } => (namespace, name),
        };
        let api = &self.api;
        let node = retry("finding this node's name", || async move {
            match api.pod_node(namespace, pod).await {
                Ok(Some(node)) => Ok(node),
                Ok(None) => Err(format!("Pod {namespace}/{pod} has no spec.nodeName yet")),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        info!(%node, pod = %format!("{namespace}/{pod}"), "this node's Node, from its Pod");
        node
    }

    /// Logs why a Node is not used, when that changed.
    fn note(&mut self, node: &str, problem: Option<String>) {
        match problem {
            Some(problem) => {
                if self.problems.get(node) != Some(&problem) {
                    warn!(%node, "Node not used: {problem}");
                    self.problems.insert(node.to_string(), problem);
                }
            }
            None => {
                if self.problems.remove(node).is_some() {
                    info!(%node, "Node usable again");
                }
            }
        }
    }

    /// A Node as it is now: the changes that brings.
    fn applied(&mut self, node: &Node, changes: &mut Vec<LeaseChange>) {
        let name = node::node_name(node).to_string();
        if name == self.node {
            return;
        }
        let lease = node::node_lease(node, &self.options.annotations, self.config());
        let key = match &lease {
            NodeLease::Lease(lease) => Some(lease.key),
            NodeLease::Unreadable(key, _) => Some(*key),
            NodeLease::None(_) | NodeLease::Refused(_) => None,
        };
        let before = match key {
            Some(key) => self.keys.insert(name.clone(), key),
            None => self.keys.remove(&name),
        };
        if let Some(before) = before.filter(|b| Some(*b) != key) {
            changes.push(LeaseChange::Delete(before));
        }
        match lease {
            NodeLease::Lease(lease) => {
                self.note(&name, None);
                changes.push(LeaseChange::Put(lease));
            }
            NodeLease::Unreadable(_, why) => {
                self.note(&name, Some(format!("{why} (keeps what it had)")))
            }
            NodeLease::Refused(why) => self.note(&name, Some(format!("{why}: refused"))),
            NodeLease::None(why) => {
                debug!(node = %name, "not a lease: {why}");
                self.problems.remove(&name);
            }
        }
    }

    /// A complete listing: every lease, the others gone.
    fn listed(&mut self, nodes: Vec<Node>) -> LeaseChange {
        let mut leases = Vec::new();
        let mut unreadable = BTreeSet::new();
        self.keys.clear();
        for node in &nodes {
            let mut changes = Vec::new();
            self.applied(node, &mut changes);
            match changes.pop() {
                Some(LeaseChange::Put(lease)) => leases.push(lease),
                _ => unreadable.extend(self.keys.get(node::node_name(node))),
            }
        }
        let listed: BTreeSet<&str> = nodes.iter().map(node::node_name).collect();
        self.problems.retain(|n, _| listed.contains(n.as_str()));
        LeaseChange::Resync { leases, unreadable }
    }

    fn on_event(&mut self, event: Event<Node>, changes: &mut Vec<LeaseChange>) {
        match event {
            Event::Init => self.listing = Some(Vec::new()),
            Event::InitApply(node) => self.listing.get_or_insert_default().push(node),
            Event::InitDone => {
                let nodes = self.listing.take().unwrap_or_default();
                info!(nodes = nodes.len(), "listed every Node");
                changes.push(self.listed(nodes));
            }
            Event::Apply(node) => self.applied(&node, changes),
            Event::Delete(node) => {
                let name = node::node_name(&node);
                self.problems.remove(name);
                if let Some(key) = self.keys.remove(name) {
                    info!(node = %name, lease = %key, "Node deleted");
                    changes.push(LeaseChange::Delete(key));
                }
            }
        }
    }

    fn events(&mut self) -> &mut NodeEvents {
        let api = &self.api;
        self.events.get_or_insert_with(|| api.watch())
    }
}

impl<A: NodeApi> SubnetManager for KubeSubnetManager<A> {
    type Due = KubeDue;

    /// Reads `--net-config-path`, waiting until it is there and usable.
    async fn network_config(&mut self) -> NetworkConfig {
        let path = &self.options.net_config_path;
        let source = &path.display().to_string();
        let config = retry("network config", || async move {
            let text = tokio::fs::read_to_string(path)
                .await
                .map_err(|e| format!("reading {source}: {e}"))?;
            NetworkConfig::parse(&text).map_err(|e| format!("{source} is not usable: {e}"))
        })
        .await;
        config.log(source);
        self.config = Some(config.clone());
        config
    }

    /// Waits for the Node's podCIDR, annotates the Node, then lists every
    /// Node (the watch's first listing). The subnet is the podCIDR, never
    /// one this node had before.
    async fn acquire(
        &mut self,
        config: &NetworkConfig,
        attrs: LeaseAttrs,
        _previous: Previous,
    ) -> (Lease, LeaseChange) {
        self.config = Some(config.clone());
        self.node = self.node_name().await;
        let (api, names, node, attrs) = (&self.api, &self.options.annotations, &self.node, &attrs);
        let lease = retry("this node's lease", || {
            own_lease(api, names, node, config, attrs)
        })
        .await;
        info!(node = %self.node, lease = %lease.key, "this node's lease is its Node's podCIDR");
        loop {
            let due = self.due().await;
            for change in self.handle(due).await {
                if let LeaseChange::Resync { .. } = change {
                    return (lease, change);
                }
            }
        }
    }

    async fn due(&mut self) -> KubeDue {
        self.events().next().await
    }

    async fn handle(&mut self, due: KubeDue) -> Vec<LeaseChange> {
        let mut changes = Vec::new();
        match due {
            Some(Ok(event)) => {
                self.watching.ok();
                self.on_event(event, &mut changes);
            }
            // kube-rs's watcher retries by itself, backing off.
            Some(Err(e)) => self.watching.failed(&e, Duration::ZERO),
            None => {
                warn!("the Node watch ended: watching again");
                self.events = None;
            }
        }
        changes
    }

    async fn programmed(&mut self) {
        if !self.options.set_node_network_unavailable || self.status_set {
            return;
        }
        self.status_set = true;
        let api = self.api.clone();
        let node = self.node.clone();
        // Retried on its own, so that the agent follows meanwhile.
        tokio::spawn(async move {
            let (api, node) = (&api, &node);
            retry("setting NetworkUnavailable false", || async move {
                let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
                api.patch_status(node, &node::network_available_patch(&now))
                    .await
            })
            .await;
            info!(%node, "set the Node's NetworkUnavailable condition false");
        });
    }
}

/// This node's lease from its Node `name`: its podCIDRs, once set, and
/// `attrs` with the operator's overwrites; annotated on the Node.
async fn own_lease(
    api: &impl NodeApi,
    names: &AnnotationNames,
    name: &str,
    config: &NetworkConfig,
    attrs: &LeaseAttrs,
) -> Result<Lease, String> {
    let node = api.node(name).await.map_err(|e| e.to_string())?;
    let key = match node::pod_cidrs(&node, config) {
        PodCidrs::Key(key) if config.v6.is_some() && key.v6.is_none() => {
            return Err(format!(
                "waiting for Node {name}'s IPv6 podCIDR (the network has IPv6)"
            ));
        }
        PodCidrs::Key(key) => key,
        PodCidrs::Missing(why) => {
            return Err(format!(
                "waiting for Node {name}'s podCIDR ({why}; the controller manager allocates it)"
            ));
        }
        PodCidrs::Refused(why) => {
            return Err(format!("Node {name}: {why}: refused, not programmed"));
        }
    };
    let (attrs, problems) = node::overwritten(&node, names, attrs.clone());
    for problem in problems {
        warn!(node = %name, "{problem}");
    }
    let patch = node::annotations_to_patch(&node, &node::wanted_annotations(names, &attrs));
    if !patch.is_empty() {
        api.annotate(name, &patch)
            .await
            .map_err(|e| e.to_string())?;
        info!(node = %name, annotations = ?patch.keys().collect::<Vec<_>>(), "annotated this node's Node");
    }
    Ok(Lease { key, attrs })
}

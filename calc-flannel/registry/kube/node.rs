//! Nodes as flannel's kube subnet manager reads and writes them, without
//! I/O: a Node's lease (its podCIDRs and flannel's annotations), the
//! annotations this node wants on its own Node, and the status condition
//! that says its network is up.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use crate::lease::{Lease, LeaseAttrs};
use crate::network::NetworkConfig;
use crate::subnet::SubnetKey;

/// flannel's annotation names under one prefix (`--kube-annotation-prefix`).
#[derive(Clone, Debug)]
pub struct AnnotationNames {
    prefix: String,
}

impl AnnotationNames {
    pub fn new(prefix: &str) -> AnnotationNames {
        AnnotationNames {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    fn name(&self, suffix: &str) -> String {
        format!("{}/{suffix}", self.prefix)
    }

    pub fn backend_type(&self) -> String {
        self.name("backend-type")
    }

    pub fn backend_data(&self) -> String {
        self.name("backend-data")
    }

    pub fn backend_v6_data(&self) -> String {
        self.name("backend-v6-data")
    }

    pub fn public_ip(&self) -> String {
        self.name("public-ip")
    }

    pub fn public_ipv6(&self) -> String {
        self.name("public-ipv6")
    }

    pub fn public_ip_overwrite(&self) -> String {
        self.name("public-ip-overwrite")
    }

    pub fn public_ipv6_overwrite(&self) -> String {
        self.name("public-ipv6-overwrite")
    }

    pub fn kube_subnet_manager(&self) -> String {
        self.name("kube-subnet-manager")
    }
}

fn annotation<'a>(node: &'a Node, name: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(name)
        .map(String::as_str)
}

/// What a Node's podCIDRs give, for the network `config` describes.
#[derive(Debug, PartialEq, Eq)]
pub enum PodCidrs {
    /// No podCIDR of this family yet (the controller manager allocates it).
    Missing(&'static str),
    /// A podCIDR that cannot be this network's: never programmed.
    Refused(String),
    Key(SubnetKey),
}

/// The Node's subnets: its first IPv4 podCIDR and, when the network has
/// IPv6, its first IPv6 one (a Node without one is used over IPv4 only).
/// Each must lie in the network of its family.
pub fn pod_cidrs(node: &Node, config: &NetworkConfig) -> PodCidrs {
    let spec = node.spec.as_ref();
    let mut texts: Vec<&str> = spec
        .and_then(|s| s.pod_cidrs.as_ref())
        .map(|c| c.iter().map(String::as_str).collect())
        .unwrap_or_default();
    if texts.is_empty()
        && let Some(cidr) = spec.and_then(|s| s.pod_cidr.as_deref())
    {
        texts.push(cidr);
    }
    let mut v4 = None;
    let mut v6 = None;
    for text in texts {
        let cidr: IpNetwork = match text.parse() {
            Ok(cidr) => cidr,
            Err(_) => return PodCidrs::Refused(format!("podCIDR {text:?} is not a CIDR")),
        };
        let (network, slot) = match cidr {
            IpNetwork::V4(_) => (Some(config.v4.network), &mut v4),
            IpNetwork::V6(_) => (config.v6.as_ref().map(|r| r.network), &mut v6),
        };
        let Some(network) = network else {
            continue;
        };
        if slot.is_some() {
            continue;
        }
        if cidr.network() != cidr.ip() {
            return PodCidrs::Refused(format!("podCIDR {text} is not a subnet's first address"));
        }
        if cidr.prefix() < network.prefix() || !network.contains(cidr.ip()) {
            return PodCidrs::Refused(format!("podCIDR {text} is outside the network {network}"));
        }
        *slot = Some(cidr);
    }
    match (v4, v6) {
        (Some(IpNetwork::V4(v4)), v6) => PodCidrs::Key(SubnetKey {
            v4,
            v6: match v6 {
                Some(IpNetwork::V6(v6)) => Some(v6),
                _ => None,
            },
        }),
        _ => PodCidrs::Missing("no IPv4 spec.podCIDR"),
    }
}

/// What a Node is to this node's view.
#[derive(Debug, PartialEq, Eq)]
pub enum NodeLease {
    /// Not one of flannel's kube subnet manager (yet), or no podCIDR: no
    /// lease.
    None(String),
    /// Its podCIDRs cannot be this network's: no lease, and a warning.
    Refused(String),
    /// A lease whose annotations cannot be read: it keeps what it had.
    Unreadable(SubnetKey, String),
    Lease(Lease),
}

/// A Node as a lease: `kube-subnet-manager: "true"`, a podCIDR in the
/// network, and flannel's annotations.
pub fn node_lease(node: &Node, names: &AnnotationNames, config: &NetworkConfig) -> NodeLease {
    if annotation(node, &names.kube_subnet_manager()) != Some("true") {
        return NodeLease::None(format!(
            "no {}: \"true\" annotation",
            names.kube_subnet_manager()
        ));
    }
    let key = match pod_cidrs(node, config) {
        PodCidrs::Key(key) => key,
        PodCidrs::Missing(why) => return NodeLease::None(why.to_string()),
        PodCidrs::Refused(why) => return NodeLease::Refused(why),
    };
    match lease_attrs(node, names) {
        Ok(attrs) => NodeLease::Lease(Lease { key, attrs }),
        Err(why) => NodeLease::Unreadable(key, why),
    }
}

fn lease_attrs(node: &Node, names: &AnnotationNames) -> Result<LeaseAttrs, String> {
    let required = |name: String| {
        annotation(node, &name)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .ok_or_else(|| format!("no {name} annotation"))
    };
    let optional = |name: String| annotation(node, &name).filter(|v| !v.is_empty());
    let public_ip_name = names.public_ip();
    let public_ip: Ipv4Addr = required(public_ip_name.clone())?
        .parse()
        .map_err(|_| format!("{public_ip_name} is not an IPv4 address"))?;
    let public_ipv6 = optional(names.public_ipv6())
        .map(|v| {
            v.parse::<Ipv6Addr>()
                .map_err(|_| format!("{} {v:?} is not an IPv6 address", names.public_ipv6()))
        })
        .transpose()?;
    let json = |name: String| {
        optional(name.clone())
            .map(|v| {
                serde_json::from_str::<serde_json::Value>(v)
                    .map_err(|e| format!("{name} is not JSON: {e}"))
            })
            .transpose()
            .map(|v| v.filter(|v| !v.is_null()))
    };
    Ok(LeaseAttrs {
        public_ip,
        public_ipv6,
        backend_type: required(names.backend_type())?,
        backend_data: json(names.backend_data())?,
        backend_v6_data: json(names.backend_v6_data())?,
    })
}

/// This node's lease value with the operator's `public-ip-overwrite` /
/// `public-ipv6-overwrite` from its Node; an overwrite that is not an
/// address of its family is named in the error and not used.
pub fn overwritten(
    node: &Node,
    names: &AnnotationNames,
    mut attrs: LeaseAttrs,
) -> (LeaseAttrs, Vec<String>) {
    let mut problems = Vec::new();
    if let Some(v) = annotation(node, &names.public_ip_overwrite()).filter(|v| !v.is_empty()) {
        match v.parse() {
            Ok(ip) => attrs.public_ip = ip,
            Err(_) => problems.push(format!(
                "{} {v:?} is not an IPv4 address: not used",
                names.public_ip_overwrite()
            )),
        }
    }
    if attrs.public_ipv6.is_some()
        && let Some(v) = annotation(node, &names.public_ipv6_overwrite()).filter(|v| !v.is_empty())
    {
        match v.parse() {
            Ok(ip) => attrs.public_ipv6 = Some(ip),
            Err(_) => problems.push(format!(
                "{} {v:?} is not an IPv6 address: not used",
                names.public_ipv6_overwrite()
            )),
        }
    }
    (attrs, problems)
}

/// The annotations flannel writes on its own Node for `attrs` (the IPv6
/// ones on dual-stack networks only).
pub fn wanted_annotations(names: &AnnotationNames, attrs: &LeaseAttrs) -> BTreeMap<String, String> {
    let json =
        |v: &Option<serde_json::Value>| serde_json::to_string(v).expect("JSON values serialize");
    let mut wanted = BTreeMap::from([
        (names.backend_type(), attrs.backend_type.clone()),
        (names.backend_data(), json(&attrs.backend_data)),
        (names.public_ip(), attrs.public_ip.to_string()),
        (names.kube_subnet_manager(), "true".to_string()),
    ]);
    if let Some(ip) = attrs.public_ipv6 {
        wanted.insert(names.backend_v6_data(), json(&attrs.backend_v6_data));
        wanted.insert(names.public_ipv6(), ip.to_string());
    }
    wanted
}

/// The wanted annotations the Node does not have as wanted: nothing to
/// patch when empty.
pub fn annotations_to_patch(
    node: &Node,
    wanted: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    wanted
        .iter()
        .filter(|(k, v)| annotation(node, k) != Some(v.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The strategic merge patch on `nodes/status` that sets the Node's
/// `NetworkUnavailable` condition false, as flanneld does, at `now`
/// (RFC 3339).
pub fn network_available_patch(now: &str) -> serde_json::Value {
    json!({
        "status": {
            "conditions": [{
                "type": "NetworkUnavailable",
                "status": "False",
                "reason": "FlannelIsUp",
                "message": "Flannel is running on this node",
                "lastTransitionTime": now,
                "lastHeartbeatTime": now,
            }]
        }
    })
}

/// A Node's name.
pub fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests;

//! The pure core of the plugin, as flannel's: the plugin's own network
//! config, and the config it hands its delegate (`bridge` with `host-local`
//! by default), made from that and the node's subnet.env.

use std::path::PathBuf;

use cni_plugin::config::NetworkConfig;
use serde_json::{Map, Value, json};
use vxmgr::subnet_env::SubnetEnv;

pub const DEFAULT_SUBNET_FILE: &str = "/run/flannel/subnet.env";
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/flannel";

/// The plugin's own config (one entry of a conflist, as the runtime gives
/// it, or a single .conf).
#[derive(Clone, Debug)]
pub struct FlannelConf {
    /// The CNI config, less `ipam`.
    pub network: NetworkConfig,
    /// `ipam`: a partial IPAM section merged into the delegate's (its
    /// `type` and extra `routes`, host-local's `dataDir`, ...).
    pub ipam: Map<String, Value>,
    /// `delegate`: the delegate's config; what it sets, flannel leaves.
    pub delegate: Map<String, Value>,
    /// `subnetFile`.
    pub subnet_file: PathBuf,
    /// `dataDir`: where each container's delegate config is kept for its DEL.
    pub data_dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    #[error("network config: {0}")]
    Json(#[from] serde_json::Error),
    #[error("network config: {field}: expected {expected}")]
    Field {
        field: &'static str,
        expected: &'static str,
    },
}

impl FlannelConf {
    pub fn parse(bytes: &[u8]) -> Result<FlannelConf, ConfError> {
        let mut value: Value = serde_json::from_slice(bytes)?;
        let object = value.as_object_mut().ok_or(ConfError::Field {
            field: "(top level)",
            expected: "an object",
        })?;
        // cni-plugin's IPAM section must name its type; flannel's need not.
        let ipam = take_object(object, "ipam")?;
        let delegate = take_object(object, "delegate")?;
        let mut path = |field: &'static str, default: &str| match object.remove(field) {
            None => Ok(PathBuf::from(default)),
            Some(Value::String(s)) => Ok(PathBuf::from(s)),
            Some(_) => Err(ConfError::Field {
                field,
                expected: "a path",
            }),
        };
        let subnet_file = path("subnetFile", DEFAULT_SUBNET_FILE)?;
        let data_dir = path("dataDir", DEFAULT_DATA_DIR)?;
        Ok(FlannelConf {
            network: serde_json::from_value(value)?,
            ipam,
            delegate,
            subnet_file,
            data_dir,
        })
    }

    /// The delegate's config, as flannel makes it: the `delegate` section,
    /// with what it does not set taken from here and from `env`.
    pub fn delegate_config(&self, env: &SubnetEnv) -> Value {
        let mut delegate = self.delegate.clone();
        delegate.insert("name".into(), json!(self.network.name));
        delegate.entry("type").or_insert_with(|| json!("bridge"));
        // flannel masquerades, or the bridge does.
        delegate
            .entry("ipMasq")
            .or_insert_with(|| json!(!env.ip_masq));
        delegate.entry("mtu").or_insert_with(|| json!(env.mtu));
        if delegate["type"] == "bridge" {
            delegate.entry("bridge").or_insert_with(|| json!("cni0"));
            delegate.entry("isGateway").or_insert_with(|| json!(true));
        }
        delegate.insert(
            "cniVersion".into(),
            json!(self.network.cni_version.to_string()),
        );
        if let Some(runtime) = &self.network.runtime {
            delegate.insert("runtimeConfig".into(), json!(runtime));
        }
        delegate.insert("ipam".into(), Value::Object(self.delegate_ipam(env)));
        Value::Object(delegate)
    }

    /// host-local (unless `ipam` names another): one range per family, the
    /// node's subnet; routes to the networks after those `ipam` lists.
    fn delegate_ipam(&self, env: &SubnetEnv) -> Map<String, Value> {
        let mut ipam = self.ipam.clone();
        ipam.entry("type").or_insert_with(|| json!("host-local"));
        let ranges: Vec<Value> = [env.subnet, env.ipv6_subnet]
            .into_iter()
            .flatten()
            .map(|subnet| {
                let network = format!("{}/{}", subnet.network(), subnet.prefix());
                json!([{ "subnet": network }])
            })
            .collect();
        ipam.insert("ranges".into(), json!(ranges));
        let mut routes = match ipam.remove("routes") {
            Some(Value::Array(routes)) => routes,
            _ => Vec::new(),
        };
        routes.extend(
            env.networks
                .iter()
                .chain(&env.ipv6_networks)
                .map(|network| json!({ "dst": network.to_string() })),
        );
        ipam.insert("routes".into(), json!(routes));
        ipam
    }
}

fn take_object(
    object: &mut Map<String, Value>,
    field: &'static str,
) -> Result<Map<String, Value>, ConfError> {
    match object.remove(field) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(ConfError::Field {
            field,
            expected: "an object",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flannel entry of flannel's own conflist, as a runtime hands it
    /// to the plugin (the list's name and version copied in).
    const KUBE_FLANNEL: &str = r#"{"cniVersion":"0.3.1","name":"cbr0","type":"flannel",
        "delegate":{"hairpinMode":true,"isDefaultGateway":true}}"#;

    const V4: &str = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.58.1/24\n\
                      FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
    const DUAL_STACK: &str = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.58.1/24\n\
         FLANNEL_IPV6_NETWORK=fd00:244::/48\nFLANNEL_IPV6_SUBNET=fd00:244:0:3::1/64\n\
         FLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n";

    fn delegate(conf: &str, env: &str) -> Value {
        let conf = FlannelConf::parse(conf.as_bytes()).unwrap();
        conf.delegate_config(&env.parse().unwrap())
    }

    /// flannel's conflist, an IPv4 node whose flannel masquerades.
    #[test]
    fn kube_flannel_on_an_ipv4_node() {
        let golden: Value =
            serde_json::from_str(include_str!("testdata/kube-flannel-ipv4.json")).unwrap();
        assert_eq!(delegate(KUBE_FLANNEL, V4), golden);
    }

    #[test]
    fn dual_stack_without_flannel_masquerading() {
        let conf = r#"{"cniVersion":"1.0.0","name":"pods","type":"flannel"}"#;
        assert_eq!(
            delegate(conf, DUAL_STACK),
            json!({
                "cniVersion": "1.0.0",
                "name": "pods",
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "mtu": 1450,
                "ipam": {
                    "type": "host-local",
                    "ranges": [
                        [{"subnet": "10.244.58.0/24"}],
                        [{"subnet": "fd00:244:0:3::/64"}]
                    ],
                    "routes": [{"dst": "10.244.0.0/16"}, {"dst": "fd00:244::/48"}]
                }
            })
        );
    }

    #[test]
    fn what_the_delegate_and_ipam_sections_set_stays() {
        let conf = r#"{"cniVersion":"0.4.0","name":"pods","type":"flannel",
            "subnetFile":"/etc/flannel.env","dataDir":"/tmp/flannel",
            "ipam":{"dataDir":"/tmp/ipam","routes":[{"dst":"192.0.2.0/24"}]},
            "delegate":{"bridge":"pods0","ipMasq":true,"mtu":1400,"isGateway":false,"name":"ignored"}}"#;
        let parsed = FlannelConf::parse(conf.as_bytes()).unwrap();
        assert_eq!(parsed.subnet_file, PathBuf::from("/etc/flannel.env"));
        assert_eq!(parsed.data_dir, PathBuf::from("/tmp/flannel"));
        assert_eq!(
            delegate(conf, V4),
            json!({
                "cniVersion": "0.4.0",
                "name": "pods",
                "type": "bridge",
                "bridge": "pods0",
                "isGateway": false,
                "ipMasq": true,
                "mtu": 1400,
                "ipam": {
                    "type": "host-local",
                    "dataDir": "/tmp/ipam",
                    "ranges": [[{"subnet": "10.244.58.0/24"}]],
                    "routes": [{"dst": "192.0.2.0/24"}, {"dst": "10.244.0.0/16"}]
                }
            })
        );
    }

    #[test]
    fn another_delegate_type_gets_no_bridge_settings() {
        let conf = r#"{"cniVersion":"1.0.0","name":"pods","type":"flannel",
            "delegate":{"type":"ipvlan","master":"eth0"}}"#;
        let config = delegate(conf, V4);
        assert_eq!(config["type"], "ipvlan");
        assert_eq!(config["master"], "eth0");
        assert!(config.get("bridge").is_none() && config.get("isGateway").is_none());
        assert_eq!(config["ipam"]["type"], "host-local");
    }

    #[test]
    fn defaults_and_bad_fields() {
        let conf =
            FlannelConf::parse(br#"{"cniVersion":"1.0.0","name":"n","type":"flannel"}"#).unwrap();
        assert_eq!(conf.subnet_file, PathBuf::from(DEFAULT_SUBNET_FILE));
        assert_eq!(conf.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        for (conf, error) in [
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"flannel","delegate":[]}"#,
                "delegate: expected an object",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"flannel","dataDir":1}"#,
                "dataDir: expected a path",
            ),
            (r#"{"name":"n","type":"flannel"}"#, "cniVersion"),
            ("[]", "(top level): expected an object"),
        ] {
            let e = FlannelConf::parse(conf.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(error), "{conf}: {e}");
        }
    }
}

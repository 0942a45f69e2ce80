//! flannel's network config (the JSON at `<prefix>/config`), with flannel's
//! defaults and checks, and errors that name the bad field.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::{Map, Value};

use crate::subnet::{SubnetRange, from_bits, to_bits};

/// The network as the config describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkConfig {
    pub v4: SubnetRange,
    /// With `EnableIPv6`.
    pub v6: Option<SubnetRange>,
    pub backend: Backend,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    Vxlan(Vxlan),
    /// Routes to each node's public address, no encapsulation.
    HostGw,
}

impl Backend {
    /// The `BackendType` of leases: only leases of our own type are used.
    pub fn lease_type(&self) -> &'static str {
        match self {
            Backend::Vxlan(_) => "vxlan",
            Backend::HostGw => "host-gw",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vxlan {
    pub vni: u16,
    /// UDP port; 0: the kernel's default, 8472.
    pub port: u16,
    /// Nodes on this node's subnet are reached without encapsulation.
    pub direct_routing: bool,
    /// `None`: the underlay MTU minus the encapsulation.
    pub mtu: Option<u32>,
}

/// The kernel's VXLAN port when none is set, which flannel relies on.
pub const KERNEL_VXLAN_PORT: u16 = 8472;

impl Vxlan {
    pub fn port(&self) -> u16 {
        if self.port == 0 {
            KERNEL_VXLAN_PORT
        } else {
            self.port
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("not JSON: {0}")]
    Json(String),
    #[error("not a JSON object")]
    NotAnObject,
    #[error("{field} {value}: {why}")]
    Field {
        field: &'static str,
        value: String,
        why: String,
    },
    #[error("{field} is missing: {why}")]
    Missing { field: &'static str, why: String },
}

fn bad(field: &'static str, value: &Value, why: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field,
        value: value.to_string(),
        why: why.into(),
    }
}

/// The JSON field `name`, unless missing or null.
fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).filter(|v| !v.is_null())
}

fn string<'a>(
    object: &'a Map<String, Value>,
    name: &'static str,
) -> Result<Option<&'a str>, ConfigError> {
    field(object, name)
        .map(|v| v.as_str().ok_or_else(|| bad(name, v, "must be a string")))
        .transpose()
}

fn boolean(object: &Map<String, Value>, name: &'static str) -> Result<Option<bool>, ConfigError> {
    field(object, name)
        .map(|v| {
            v.as_bool()
                .ok_or_else(|| bad(name, v, "must be true or false"))
        })
        .transpose()
}

fn integer(
    object: &Map<String, Value>,
    name: &'static str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Option<u64>, ConfigError> {
    field(object, name)
        .map(|v| {
            v.as_u64().filter(|n| range.contains(n)).ok_or_else(|| {
                bad(
                    name,
                    v,
                    format!(
                        "must be an integer from {} to {}",
                        range.start(),
                        range.end()
                    ),
                )
            })
        })
        .transpose()
}

/// The names of one family's fields, and flannel's limits for it.
struct FamilyFields {
    network: &'static str,
    subnet_len: &'static str,
    subnet_min: &'static str,
    subnet_max: &'static str,
    v4: bool,
    /// The subnet length given to networks that can spare it.
    default_len: u8,
    /// The longest subnet length (a tunnel and a bridge address must fit).
    max_len: u8,
}

const V4_FIELDS: FamilyFields = FamilyFields {
    network: "Network",
    subnet_len: "SubnetLen",
    subnet_min: "SubnetMin",
    subnet_max: "SubnetMax",
    v4: true,
    default_len: 24,
    max_len: 30,
};

const V6_FIELDS: FamilyFields = FamilyFields {
    network: "IPv6Network",
    subnet_len: "IPv6SubnetLen",
    subnet_min: "IPv6SubnetMin",
    subnet_max: "IPv6SubnetMax",
    v4: false,
    default_len: 64,
    max_len: 126,
};

impl FamilyFields {
    fn family(&self) -> &'static str {
        if self.v4 { "an IPv4" } else { "an IPv6" }
    }

    fn address(
        &self,
        object: &Map<String, Value>,
        name: &'static str,
    ) -> Result<Option<IpAddr>, ConfigError> {
        let Some(text) = string(object, name)? else {
            return Ok(None);
        };
        let raw = &object[name];
        let ip: IpAddr = text
            .parse()
            .map_err(|_| bad(name, raw, format!("must be {} address", self.family())))?;
        if ip.is_ipv4() != self.v4 {
            return Err(bad(name, raw, format!("must be {} address", self.family())));
        }
        Ok(Some(ip))
    }

    /// The range, with flannel's defaults: subnets of /24 (/64) when the
    /// network can hold them, else a quarter of it; from the second subnet
    /// (the network's own address would clash with the first's) to the last.
    fn range(&self, object: &Map<String, Value>) -> Result<SubnetRange, ConfigError> {
        let text = string(object, self.network)?.ok_or_else(|| ConfigError::Missing {
            field: self.network,
            why: format!("{} network in CIDR form is needed", self.family()),
        })?;
        let raw = &object[self.network];
        let network: IpNetwork = text
            .parse()
            .ok()
            .filter(|n: &IpNetwork| n.is_ipv4() == self.v4)
            .ok_or_else(|| bad(self.network, raw, format!("must be {} CIDR", self.family())))?;
        let network = IpNetwork::new(network.network(), network.prefix()).expect("masked");
        let subnet_len = match integer(object, self.subnet_len, 0..=u64::from(self.max_len))? {
            Some(len) if len > 0 => {
                let len = len as u8;
                if len < network.prefix() + 2 {
                    return Err(bad(
                        self.subnet_len,
                        &object[self.subnet_len],
                        format!(
                            "the network ({network}) must hold at least four subnets: at least /{}",
                            network.prefix() + 2
                        ),
                    ));
                }
                len
            }
            _ if network.prefix() > self.max_len - 2 => {
                return Err(bad(
                    self.network,
                    raw,
                    format!("too small: at most /{}", self.max_len - 2),
                ));
            }
            _ if network.prefix() <= self.default_len - 2 => self.default_len,
            _ => network.prefix() + 2,
        };
        let size = 1u128 << (if self.v4 { 32 } else { 128 } - subnet_len);
        let first = to_bits(network.network());
        let last = to_bits(network.broadcast()) - (size - 1);
        let bound = |name: &'static str, default: u128| -> Result<IpAddr, ConfigError> {
            let Some(ip) = self.address(object, name)? else {
                return Ok(from_bits(&network, default));
            };
            let raw = &object[name];
            if !network.contains(ip) {
                return Err(bad(
                    name,
                    raw,
                    format!("not in {} ({network})", self.network),
                ));
            }
            if !to_bits(ip).is_multiple_of(size) {
                return Err(bad(
                    name,
                    raw,
                    format!("not the start of a /{subnet_len} subnet"),
                ));
            }
            Ok(ip)
        };
        let min = bound(self.subnet_min, first + size)?;
        let max = bound(self.subnet_max, last)?;
        if to_bits(min) > to_bits(max) {
            return Err(bad(
                self.subnet_min,
                &Value::String(min.to_string()),
                format!("after {} ({max})", self.subnet_max),
            ));
        }
        Ok(SubnetRange {
            network,
            subnet_len,
            min,
            max,
        })
    }
}

impl NetworkConfig {
    pub fn parse(text: &str) -> Result<NetworkConfig, ConfigError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
        let object = value.as_object().ok_or(ConfigError::NotAnObject)?;
        if let Some(false) = boolean(object, "EnableIPv4")? {
            return Err(bad(
                "EnableIPv4",
                &Value::Bool(false),
                "calc-flannel needs IPv4: flannel's etcd layout keys every lease by its IPv4 subnet",
            ));
        }
        let v4 = V4_FIELDS.range(object)?;
        let v6 = if boolean(object, "EnableIPv6")?.unwrap_or(false) {
            Some(V6_FIELDS.range(object)?)
        } else {
            None
        };
        let backend = parse_backend(object, v6.is_some())?;
        Ok(NetworkConfig { v4, v6, backend })
    }

    /// Logs the config, read from `source`.
    pub fn log(&self, source: &str) {
        tracing::info!(
            source,
            network = %self.v4.network,
            subnet_len = self.v4.subnet_len,
            ipv6_network = ?self.v6.as_ref().map(|r| r.network),
            backend = self.backend.lease_type(),
            "network config"
        );
    }
}

fn parse_backend(object: &Map<String, Value>, ipv6: bool) -> Result<Backend, ConfigError> {
    let Some(raw) = field(object, "Backend") else {
        return Err(ConfigError::Missing {
            field: "Backend",
            why: "flannel's default backend is udp, which calc-flannel does not offer: set {\"Type\": \"vxlan\"} or {\"Type\": \"host-gw\"}".into(),
        });
    };
    let backend = raw
        .as_object()
        .ok_or_else(|| bad("Backend", raw, "must be an object"))?;
    let kind = string(backend, "Type")?.ok_or_else(|| ConfigError::Missing {
        field: "Backend.Type",
        why: "vxlan or host-gw".into(),
    })?;
    match kind {
        "host-gw" => Ok(Backend::HostGw),
        "vxlan" => {
            for unsupported in ["GBP", "Learning"] {
                if let Some(true) = boolean(backend, unsupported)? {
                    return Err(bad(
                        unsupported,
                        &Value::Bool(true),
                        "not supported by calc-flannel",
                    ));
                }
            }
            // flannel's leases carry the VNI as 16 bits.
            let vni = integer(backend, "VNI", 1..=65535)?.unwrap_or(1) as u16;
            let port = integer(backend, "Port", 0..=65535)?.unwrap_or(0) as u16;
            let min_mtu = if ipv6 { 1280 } else { 68 };
            let mtu = match integer(backend, "MTU", 0..=65535)? {
                None | Some(0) => None,
                Some(mtu) if mtu >= min_mtu => Some(mtu as u32),
                Some(_) => {
                    return Err(bad(
                        "MTU",
                        &backend["MTU"],
                        format!("must be 0 (automatic) or from {min_mtu} to 65535"),
                    ));
                }
            };
            Ok(Backend::Vxlan(Vxlan {
                vni,
                port,
                direct_routing: boolean(backend, "DirectRouting")?.unwrap_or(false),
                mtu,
            }))
        }
        other => Err(bad(
            "Backend.Type",
            &Value::String(other.into()),
            "calc-flannel offers vxlan and host-gw",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(network: &str, len: u8, min: &str, max: &str) -> SubnetRange {
        SubnetRange {
            network: network.parse().unwrap(),
            subnet_len: len,
            min: min.parse().unwrap(),
            max: max.parse().unwrap(),
        }
    }

    #[test]
    fn flannels_defaults() {
        let c =
            NetworkConfig::parse(r#"{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}"#)
                .unwrap();
        assert_eq!(
            c.v4,
            range("10.244.0.0/16", 24, "10.244.1.0", "10.244.255.0")
        );
        assert_eq!(c.v6, None);
        assert_eq!(
            c.backend,
            Backend::Vxlan(Vxlan {
                vni: 1,
                port: 0,
                direct_routing: false,
                mtu: None
            })
        );

        // Too small for /24s: a quarter each.
        let c =
            NetworkConfig::parse(r#"{"Network": "10.5.0.0/25", "Backend": {"Type": "host-gw"}}"#)
                .unwrap();
        assert_eq!(c.v4, range("10.5.0.0/25", 27, "10.5.0.32", "10.5.0.96"));
        assert_eq!(c.backend, Backend::HostGw);

        let c = NetworkConfig::parse(
            r#"{"Network": "10.244.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:244::/48",
                "SubnetLen": 26, "SubnetMin": "10.244.8.0", "SubnetMax": "10.244.9.192",
                "Backend": {"Type": "vxlan", "VNI": 4097, "Port": 4789, "DirectRouting": true, "MTU": 1400}}"#,
        )
        .unwrap();
        assert_eq!(
            c.v4,
            range("10.244.0.0/16", 26, "10.244.8.0", "10.244.9.192")
        );
        assert_eq!(
            c.v6,
            Some(range(
                "fd00:244::/48",
                64,
                "fd00:244:0:1::",
                "fd00:244:0:ffff::"
            ))
        );
        let Backend::Vxlan(vxlan) = c.backend else {
            panic!()
        };
        assert_eq!(
            (vxlan.vni, vxlan.port(), vxlan.direct_routing, vxlan.mtu),
            (4097, 4789, true, Some(1400))
        );
    }

    #[test]
    fn errors_name_the_field_and_value() {
        let cases = [
            ("[1]", "not a JSON object"),
            ("{", "not JSON"),
            (r#"{"Backend": {"Type": "vxlan"}}"#, "Network is missing"),
            (
                r#"{"Network": "10.244.0.0/33", "Backend": {"Type": "vxlan"}}"#,
                "Network \"10.244.0.0/33\": must be an IPv4 CIDR",
            ),
            (
                r#"{"Network": "fd00::/48", "Backend": {"Type": "vxlan"}}"#,
                "Network \"fd00::/48\"",
            ),
            (
                r#"{"Network": "10.0.0.0/29", "Backend": {"Type": "vxlan"}}"#,
                "too small: at most /28",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "SubnetLen": 31, "Backend": {"Type": "vxlan"}}"#,
                "SubnetLen 31: must be an integer from 0 to 30",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "SubnetLen": 17, "Backend": {"Type": "vxlan"}}"#,
                "at least /18",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "SubnetMin": "10.1.0.0", "Backend": {"Type": "vxlan"}}"#,
                "SubnetMin \"10.1.0.0\": not in Network",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "SubnetMax": "10.0.3.7", "Backend": {"Type": "vxlan"}}"#,
                "SubnetMax \"10.0.3.7\": not the start of a /24",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "SubnetMin": "10.0.9.0", "SubnetMax": "10.0.3.0", "Backend": {"Type": "vxlan"}}"#,
                "after SubnetMax",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "EnableIPv6": true, "Backend": {"Type": "vxlan"}}"#,
                "IPv6Network is missing",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "EnableIPv6": "yes", "Backend": {"Type": "vxlan"}}"#,
                "EnableIPv6 \"yes\": must be true or false",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "EnableIPv4": false, "Backend": {"Type": "vxlan"}}"#,
                "EnableIPv4 false",
            ),
            (r#"{"Network": "10.0.0.0/16"}"#, "Backend is missing"),
            (
                r#"{"Network": "10.0.0.0/16", "Backend": {"Type": "udp"}}"#,
                "Backend.Type \"udp\"",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "Backend": {"Type": "vxlan", "VNI": 70000}}"#,
                "VNI 70000: must be an integer from 1 to 65535",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "Backend": {"Type": "vxlan", "Port": -1}}"#,
                "Port -1",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "Backend": {"Type": "vxlan", "MTU": 50}}"#,
                "MTU 50",
            ),
            (
                r#"{"Network": "10.0.0.0/16", "Backend": {"Type": "vxlan", "GBP": true}}"#,
                "GBP true: not supported",
            ),
        ];
        for (text, want) in cases {
            let err = NetworkConfig::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}

//! A node's lease as flannel stores it in etcd: the key names its subnets,
//! the value is JSON,
//! `{"PublicIP":"172.31.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"f2:8d:b3:ff:17:44"}}`
//! (`BackendV6Data` alike for IPv6; host-gw leases carry no backend data).

use std::net::{Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};
use vxmgr::model::{Family, MacAddr};

use crate::subnet::SubnetKey;

/// One lease, as read from etcd or as this node writes its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub key: SubnetKey,
    pub attrs: LeaseAttrs,
}

/// A lease's value. Field names and layout are flannel's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAttrs {
    #[serde(rename = "PublicIP")]
    pub public_ip: Ipv4Addr,
    #[serde(rename = "PublicIPv6")]
    pub public_ipv6: Option<Ipv6Addr>,
    #[serde(
        rename = "BackendType",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub backend_type: String,
    #[serde(
        rename = "BackendData",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub backend_data: Option<serde_json::Value>,
    #[serde(
        rename = "BackendV6Data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub backend_v6_data: Option<serde_json::Value>,
}

/// The vxlan backend's data, per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VxlanData {
    pub vni: u16,
    pub vtep_mac: MacAddr,
}

/// VxlanData as JSON (flannel: VNI as 16 bits, the MAC as a string).
#[derive(Serialize, Deserialize)]
struct VxlanJson {
    #[serde(rename = "VNI")]
    vni: u16,
    #[serde(rename = "VtepMAC")]
    vtep_mac: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LeaseError {
    #[error("lease value is not flannel's lease JSON: {0}")]
    Json(String),
    #[error("{field} has no vxlan data")]
    NoBackendData { field: &'static str },
    #[error("{field} is not the vxlan backend's data: {why}")]
    BackendData { field: &'static str, why: String },
}

impl LeaseAttrs {
    pub fn parse(value: &[u8]) -> Result<LeaseAttrs, LeaseError> {
        serde_json::from_slice(value).map_err(|e| LeaseError::Json(e.to_string()))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("lease attributes serialize")
    }

    /// A vxlan lease's attributes. The IPv6 part exists when both its
    /// address and MAC do.
    pub fn vxlan(
        public_ip: Ipv4Addr,
        v4: VxlanData,
        v6: Option<(Ipv6Addr, VxlanData)>,
    ) -> LeaseAttrs {
        let json = |d: VxlanData| {
            serde_json::to_value(VxlanJson {
                vni: d.vni,
                vtep_mac: d.vtep_mac.to_string(),
            })
            .expect("vxlan data serializes")
        };
        LeaseAttrs {
            public_ip,
            public_ipv6: v6.map(|(ip, _)| ip),
            backend_type: "vxlan".into(),
            backend_data: Some(json(v4)),
            backend_v6_data: v6.map(|(_, d)| json(d)),
        }
    }

    pub fn host_gw(public_ip: Ipv4Addr, public_ipv6: Option<Ipv6Addr>) -> LeaseAttrs {
        LeaseAttrs {
            public_ip,
            public_ipv6,
            backend_type: "host-gw".into(),
            backend_data: None,
            backend_v6_data: None,
        }
    }

    /// The vxlan data of `family`.
    pub fn vxlan_data(&self, family: Family) -> Result<VxlanData, LeaseError> {
        let (field, data) = match family {
            Family::V4 => ("BackendData", &self.backend_data),
            Family::V6 => ("BackendV6Data", &self.backend_v6_data),
        };
        let data = data.as_ref().ok_or(LeaseError::NoBackendData { field })?;
        let why = |why: String| LeaseError::BackendData { field, why };
        let json = VxlanJson::deserialize(data).map_err(|e| why(e.to_string()))?;
        let vtep_mac = json
            .vtep_mac
            .parse()
            .map_err(|e| why(format!("VtepMAC {:?}: {e}", json.vtep_mac)))?;
        Ok(VxlanData {
            vni: json.vni,
            vtep_mac,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_flannels_json() {
        let mac = "f2:8d:b3:ff:17:44".parse().unwrap();
        let attrs = LeaseAttrs::vxlan(
            "172.31.0.1".parse().unwrap(),
            VxlanData {
                vni: 1,
                vtep_mac: mac,
            },
            None,
        );
        assert_eq!(
            attrs.to_json(),
            r#"{"PublicIP":"172.31.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"f2:8d:b3:ff:17:44"}}"#
        );
        assert_eq!(
            LeaseAttrs::parse(attrs.to_json().as_bytes()),
            Ok(attrs.clone())
        );
        assert_eq!(attrs.vxlan_data(Family::V4).unwrap().vtep_mac, mac);
        assert_eq!(
            attrs.vxlan_data(Family::V6),
            Err(LeaseError::NoBackendData {
                field: "BackendV6Data"
            })
        );
        assert_eq!(
            LeaseAttrs::host_gw(
                "172.31.0.2".parse().unwrap(),
                Some("fd00::2".parse().unwrap())
            )
            .to_json(),
            r#"{"PublicIP":"172.31.0.2","PublicIPv6":"fd00::2","BackendType":"host-gw"}"#
        );
    }

    #[test]
    fn flannels_dual_stack_value_parses() {
        let value = br#"{"PublicIP":"192.168.10.2","PublicIPv6":"fd00:10::2","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:1f:2a:3b:4c:5d"},"BackendV6Data":{"VNI":1,"VtepMAC":"0e:1f:2a:3b:4c:5e"}}"#;
        let attrs = LeaseAttrs::parse(value).unwrap();
        assert_eq!(attrs.public_ipv6, Some("fd00:10::2".parse().unwrap()));
        assert_eq!(
            attrs.vxlan_data(Family::V6).unwrap().vtep_mac.to_string(),
            "0e:1f:2a:3b:4c:5e"
        );
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        for (value, want) in [
            (
                &br#"{"PublicIP":"300.1.1.1"}"#[..],
                "not flannel's lease JSON",
            ),
            (br#"not json"#, "not flannel's lease JSON"),
            (br#"{"PublicIPv6":null}"#, "missing field `PublicIP`"),
        ] {
            let err = LeaseAttrs::parse(value).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
        let attrs = LeaseAttrs::parse(
            br#"{"PublicIP":"10.0.0.1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"01:00:5e:00:00:01"}}"#,
        )
        .unwrap();
        let err = attrs.vxlan_data(Family::V4).unwrap_err().to_string();
        assert!(
            err.contains("VtepMAC \"01:00:5e:00:00:01\": multicast"),
            "{err}"
        );
        let attrs = LeaseAttrs::parse(
            br#"{"PublicIP":"10.0.0.1","BackendType":"vxlan","BackendData":{"VNI":70000,"VtepMAC":"0e:00:00:00:00:01"}}"#,
        )
        .unwrap();
        assert!(attrs.vxlan_data(Family::V4).is_err());
    }
}

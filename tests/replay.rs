//! Replay regression tests: every `tests/replays/*.jsonl` is streamed by the
//! real calc-stub into a real vxmgrd (memory kernel) one message per batch;
//! the batch statuses and the final GetState must equal the goldens beside
//! it (`NAME.batches.jsonl`, `NAME.state.json`).
//!
//! `VXMGR_REGENERATE=1 cargo test --test replay` rewrites the goldens.
//! Also calc-stub's own failures (exit 2) and `calc-stub generate`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{CALC_STUB, Daemon, calc_stub_replay, replay_file, statuses, stderr};
use vxmgr::wire::felix::{RouteType, ToDataplane, to_dataplane::Payload};
use vxmgr::wire::json;

fn replays() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/replays exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "jsonl")
                && !p.to_string_lossy().ends_with(".batches.jsonl")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty());
    files
}

/// The statuses without what varies from run to run (apply time).
fn comparable(statuses: Vec<serde_json::Value>) -> String {
    statuses
        .into_iter()
        .map(|mut s| {
            s.as_object_mut()
                .expect("status object")
                .remove("applyMicros");
            s.to_string() + "\n"
        })
        .collect()
}

#[test]
fn replays_match_their_goldens() {
    let regenerate = std::env::var_os("VXMGR_REGENERATE").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for replay in replays() {
        let name = replay.file_stem().unwrap().to_string_lossy().into_owned();
        let batches_golden = replay.with_file_name(format!("{name}.batches.jsonl"));
        let state_golden = replay.with_file_name(format!("{name}.state.json"));
        let daemon = Daemon::memory(&[]);
        let state = daemon.dir.path().join("state.json");
        let output = daemon.replay(&[
            "--step",
            "--save-state",
            state.to_str().unwrap(),
            replay.to_str().unwrap(),
        ]);
        assert!(
            matches!(output.status.code(), Some(0 | 1)),
            "{name}: calc-stub failed: {}\n{}",
            output.status,
            stderr(&output)
        );
        let batches = comparable(statuses(&output));
        let state = std::fs::read_to_string(&state).expect("calc-stub saved the state");
        if regenerate {
            std::fs::write(&batches_golden, &batches).unwrap();
            std::fs::write(&state_golden, &state).unwrap();
            continue;
        }
        let golden = |path: &Path| {
            std::fs::read_to_string(path).unwrap_or_else(|e| {
                panic!("{}: {e} (VXMGR_REGENERATE=1 creates it)", path.display())
            })
        };
        for (what, actual, path) in [
            ("batch statuses", &batches, &batches_golden),
            ("state", &state, &state_golden),
        ] {
            let expected = golden(path);
            if *actual != expected {
                failures.push(format!(
                    "{name}: {what} differ from {}:\n{}",
                    path.display(),
                    similar::TextDiff::from_lines(&expected, actual).unified_diff()
                ));
            }
        }
        let exit_ok = output.status.success();
        let all_ok =
            !batches.contains("BATCH_RESULT_PARTIAL") && !batches.contains("BATCH_RESULT_FAILED");
        assert_eq!(
            exit_ok, all_ok,
            "{name}: exit status follows the batch results"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn expect_reports_a_diff_and_fails() {
    let daemon = Daemon::memory(&[]);
    let replay = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays/two-nodes.jsonl");
    let wrong = support::replay_file(
        daemon.dir.path(),
        "wrong.json",
        &[r#"{"hostname": "node-z"}"#],
    );
    let output = daemon.replay(&[
        "--expect",
        wrong.to_str().unwrap(),
        replay.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("state differs from"), "{err}");
    assert!(err.contains("-  \"hostname\": \"node-z\""), "{err}");
    assert!(err.contains("+  \"hostname\": \"node-a\""), "{err}");
}

/// Asserts calc-stub stopped before a verdict (exit 2) saying `message`.
fn assert_exit_2(output: &Output, message: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains(message), "{message:?} missing from {err:?}");
}

#[test]
fn an_unreadable_file_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jsonl");
    let output = calc_stub_replay(&dir.path().join("no.sock"), &[missing.to_str().unwrap()]);
    assert_exit_2(&output, &format!("{}: No such file", missing.display()));
}

#[test]
fn a_bad_json_line_exits_2_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = replay_file(
        dir.path(),
        "bad.jsonl",
        &[r#"{"inSync": {}}"#, r#"{"inSync": "#],
    );
    let output = calc_stub_replay(&dir.path().join("no.sock"), &[bad.to_str().unwrap()]);
    assert_exit_2(&output, &format!("{}:2: ", bad.display()));
}

/// Messages are sent while the file is read: a bad line mid-file stops the
/// replay there, after the statuses of the messages before it, and nothing
/// after it reaches the daemon.
#[tokio::test]
async fn a_bad_line_mid_file_sends_what_came_before_and_nothing_after() {
    let daemon = Daemon::memory(&[]);
    let vtep = |node: &str, i: u8| {
        format!(
            r#"{{"vtepUpdate": {{"node": "{node}", "mac": "66:aa:00:00:00:0{i}", "ipv4Addr": "10.244.{i}.0", "parentDeviceIp": "192.168.10.{i}"}}}}"#
        )
    };
    let (a, b, c) = (vtep("node-a", 1), vtep("node-b", 2), vtep("node-c", 3));
    let bad = replay_file(
        daemon.dir.path(),
        "bad.jsonl",
        &[
            &a,
            &b,
            r#"{"vtepUpdate": {"node": "#,
            &c,
            r#"{"inSync": {}}"#,
        ],
    );
    let output = daemon.replay(&[bad.to_str().unwrap()]);
    assert_exit_2(&output, &format!("{}:3: ", bad.display()));
    let covered: u64 = statuses(&output)
        .iter()
        .map(|s| s["messageCount"].as_u64().expect("a count"))
        .sum();
    assert_eq!(covered, 2, "{}", stderr(&output));
    let state = daemon.state().await;
    let ipv4 = state.ipv4.expect("IPv4 state");
    let remotes: Vec<&str> = ipv4.remote_vteps.iter().map(|v| v.node.as_str()).collect();
    assert_eq!(remotes, ["node-b"]);
    assert!(!state.in_sync);
}

#[test]
fn no_daemon_on_the_socket_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let replay = replay_file(dir.path(), "one.jsonl", &[r#"{"inSync": {}}"#]);
    let socket = dir.path().join("nobody.sock");
    let output = calc_stub_replay(&socket, &[replay.to_str().unwrap()]);
    assert_exit_2(&output, &format!("connecting to {}", socket.display()));
}

fn generate(args: &[&str]) -> Output {
    Command::new(CALC_STUB)
        .arg("generate")
        .args(args)
        .output()
        .expect("calc-stub runs")
}

fn generated(args: &[&str]) -> Vec<ToDataplane> {
    let output = generate(args);
    assert!(output.status.success(), "{}", stderr(&output));
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| json::from_str(l).expect("generate writes messages"))
        .collect()
}

#[test]
fn generate_ipv6_gives_v6_vteps_and_blocks() {
    let messages = generated(&["--nodes", "2", "--blocks-per-node", "2", "--ipv6"]);
    let vteps: Vec<_> = messages
        .iter()
        .filter_map(|m| match &m.payload {
            Some(Payload::VtepUpdate(v)) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(vteps.len(), 2);
    let node_1 = vteps.iter().find(|v| v.node == "node-1").unwrap();
    assert_eq!(node_1.mac_v6, "66:bb:00:00:00:01");
    assert_eq!(node_1.ipv6_addr, "fd00:244::80");
    assert_eq!(node_1.parent_device_ipv6, "fd00:172::2");
    let v6_blocks: Vec<&str> = messages
        .iter()
        .filter_map(|m| match &m.payload {
            Some(Payload::RouteUpdate(r)) if r.dst.ends_with("/122") => Some(r.dst.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        v6_blocks,
        [
            "fd00:244::/122",
            "fd00:244::40/122",
            "fd00:244::80/122",
            "fd00:244::c0/122"
        ]
    );
}

#[test]
fn generate_pools_declares_the_blocks_pools_masquerading() {
    let pools = |args: &[&str]| -> Vec<(String, String, bool)> {
        generated(args)
            .into_iter()
            .filter_map(|m| match m.payload {
                Some(Payload::IpamPoolUpdate(p)) => {
                    let pool = p.pool.unwrap();
                    Some((p.id, pool.cidr, pool.masquerade))
                }
                _ => None,
            })
            .collect()
    };
    assert!(pools(&["--nodes", "2", "--ipv6"]).is_empty());
    assert_eq!(
        pools(&["--nodes", "2", "--ipv6", "--pools"]),
        [
            ("pool-ipv4".into(), "10.0.0.0/8".into(), true),
            ("pool-ipv6".into(), "fd00:244::/48".into(), true)
        ]
    );
    assert_eq!(pools(&["--nodes", "2", "--pools"]).len(), 1);
}

#[test]
fn generate_local_node_makes_that_nodes_blocks_local() {
    let messages = generated(&[
        "--nodes",
        "3",
        "--blocks-per-node",
        "1",
        "--local-node",
        "node-2",
    ]);
    let local = RouteType::LocalWorkload as i32;
    let blocks: Vec<(&str, bool)> = messages
        .iter()
        .filter_map(|m| match &m.payload {
            Some(Payload::RouteUpdate(r)) if r.dst.ends_with("/26") => {
                Some((r.dst_node_name.as_str(), r.types == local))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        blocks,
        [("node-0", false), ("node-1", false), ("node-2", true)]
    );
}

#[test]
fn generate_refuses_a_local_node_it_does_not_generate() {
    for local in ["node-a", "node-3", "node-01"] {
        let output = generate(&["--nodes", "3", "--local-node", local]);
        assert_exit_2(
            &output,
            &format!(
                "--local-node \"{local}\" is not one of the generated nodes (node-0 to node-2)"
            ),
        );
    }
}

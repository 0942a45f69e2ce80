//! Replay regression tests: every `tests/replays/*.jsonl` is streamed by the
//! real calc-stub into a real vxmgrd (memory kernel) one message per batch;
//! the batch statuses and the final GetState must equal the goldens beside
//! it (`NAME.batches.jsonl`, `NAME.state.json`).
//!
//! `VXMGR_REGENERATE=1 cargo test --test replay` rewrites the goldens.

mod support;

use std::path::{Path, PathBuf};

use support::{Daemon, statuses, stderr};

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

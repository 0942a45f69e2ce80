//! Every seed of the fuzz corpora in `fuzz/corpus/<target>/` through the
//! property its target checks, so the properties hold in every build and
//! not only while someone fuzzes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use vxmgr::fuzzing;

/// Runs every file of `fuzz/corpus/<target>/` through `check`; fails naming
/// the files whose check panicked.
fn replay_corpus(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: no seeds", dir.display());
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).expect("read a seed");
            catch_unwind(AssertUnwindSafe(|| check(&data))).is_err()
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(failed.is_empty(), "{target} fails on {failed:#?}");
}

#[test]
fn replay_jsonl_corpus() {
    replay_corpus("replay_jsonl", fuzzing::replay_jsonl);
}

#[test]
fn replay_framed_corpus() {
    replay_corpus("replay_framed", fuzzing::replay_framed);
}

#[test]
fn manager_updates_corpus() {
    replay_corpus("manager_updates", fuzzing::manager_updates);
}

#[test]
fn authority_stream_corpus() {
    replay_corpus("authority_stream", fuzzing::authority_stream);
}

#[test]
fn authority_requests_corpus() {
    replay_corpus("authority_requests", fuzzing::authority_requests);
}

#[test]
fn authority_header_blocks_corpus() {
    replay_corpus("authority_header_blocks", fuzzing::authority_header_blocks);
}

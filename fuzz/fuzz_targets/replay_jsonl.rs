//! JSONL replay decoding: any bytes give messages or an error naming the
//! line, never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use vxmgr::wire::replay::{ReplayFormat, read};

fuzz_target!(|data: &[u8]| {
    if let Err(e) = read(Path::new("fuzz.jsonl"), ReplayFormat::Jsonl, data) {
        assert!(e.to_string().starts_with("fuzz.jsonl"), "{e}");
    }
});

//! Felix-framed replay decoding: any bytes give messages or an error, never
//! a panic or an allocation the length prefix alone asks for.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use vxmgr::wire::replay::{ReplayFormat, read};

fuzz_target!(|data: &[u8]| {
    let _ = read(Path::new("fuzz.bin"), ReplayFormat::Framed, data);
});

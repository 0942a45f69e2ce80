//! Felix-framed replay decoding; the property is
//! `vxmgr::fuzzing::replay_framed`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vxmgr::fuzzing::replay_framed(data));

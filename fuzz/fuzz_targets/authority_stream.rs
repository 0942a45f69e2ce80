//! The HTTP/2 filter on a connection's bytes fed in any chunks; the property is
//! `vxmgr::fuzzing::authority_stream`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vxmgr::fuzzing::authority_stream(data));

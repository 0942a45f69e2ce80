//! The HPACK rewriter on a series of header blocks; the property is
//! `vxmgr::fuzzing::authority_header_blocks`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vxmgr::fuzzing::authority_header_blocks(data));

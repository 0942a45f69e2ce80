//! The HTTP/2 filter on connections built of header blocks split, padded and broken every way; the property is
//! `vxmgr::fuzzing::authority_requests`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vxmgr::fuzzing::authority_requests(data));

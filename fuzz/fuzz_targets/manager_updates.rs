//! The manager's update path; the property is
//! `vxmgr::fuzzing::manager_updates`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vxmgr::fuzzing::manager_updates(data));

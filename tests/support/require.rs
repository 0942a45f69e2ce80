//! The `VXMGR_REQUIRE_*` variables. A test that lacks a privilege, a tool
//! or a service skips, saying so on stderr, unless the variable for what
//! it lacks requires it: then it fails. Also compiled into the library's
//! own tests.

use std::io::Write;

/// Whether `VXMGR_REQUIRE_<what>` requires it: `1` or `true` (any case)
/// do; unset, empty, `0` or `false` do not. Any other value fails the
/// test, so that a typo cannot turn a requirement into a skip.
pub fn required(what: &str) -> bool {
    let name = format!("VXMGR_REQUIRE_{what}");
    match std::env::var(&name) {
        Err(std::env::VarError::NotPresent) => false,
        Ok(v) if v == "1" || v.eq_ignore_ascii_case("true") => true,
        Ok(v) if v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false") => false,
        value => panic!("{name}={value:?}: use 1 or true to require, 0 or false not to"),
    }
}

/// `test` cannot run for want of `why`: fails when `VXMGR_REQUIRE_<what>`
/// requires it, or says that it skips.
pub fn skip(test: &str, what: &str, why: &str) {
    let name = format!("VXMGR_REQUIRE_{what}");
    assert!(!required(what), "{test}: {why} ({name} is set)");
    say(&format!(
        "SKIPPED {test}: {why}; set {name}=1 to make this a failure"
    ));
}

/// The running test's name (libtest names each test's thread after it).
pub fn current_test() -> String {
    let thread = std::thread::current();
    thread.name().unwrap_or("this test").to_string()
}

/// A line on the test's stderr, past the test harness's capture.
pub fn say(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

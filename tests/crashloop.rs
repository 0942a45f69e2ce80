//! vxmgrd SIGKILLed again and again at random moments beside the host's
//! own objects, across a cold start of a 5,000-node view, churn, periodic
//! resyncs, IP pool changes with and without NAT, a VNI change and a
//! reconnect that declares nothing (see the testbed's crash loop). After
//! every restart the kernel matches an uninterrupted run, the host's
//! objects are as they were, and no route or nexthop that was right at
//! the kill is deleted or replaced. The seed of the kill points is printed;
//! VXMGR_CRASH_SEED=<seed> replays a run. `cargo bench --bench dataplane
//! -- crashloop` runs the long loop. Needs root; skips without it unless
//! VXMGR_REQUIRE_NETNS=1.

mod support;

use std::path::Path;

use support::netns::{can_run, generated_cluster};
use support::testbed::crashloop::{self, Settings};
use support::{CALC_STUB, say};

const NODES: u32 = 5000;
const JOINERS: u32 = 200;
const KILLS: u32 = 50;

#[test]
fn a_daemon_killed_at_random_moments_converges_without_touching_what_was_right() {
    if !can_run("a_daemon_killed_at_random_moments_converges_without_touching_what_was_right") {
        return;
    }
    let seed = crashloop::seed().unwrap();
    say(&format!(
        "crash loop: seed {seed} ({}={seed} replays it)",
        crashloop::SEED_VARIABLE
    ));
    let mut cluster = generated_cluster();
    let settings = Settings {
        nodes: NODES,
        joiners: JOINERS,
        kills: KILLS,
        seed,
    };
    let outcome = crashloop::run(&mut cluster, Path::new(CALC_STUB), settings, say)
        .unwrap_or_else(|e| panic!("{e:#}"));
    for line in outcome.summary().iter().chain(&outcome.table()) {
        say(line);
    }
    assert_eq!(outcome.kills.len(), KILLS as usize);
}

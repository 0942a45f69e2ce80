//! deploy/: every systemd unit passes `systemd-analyze verify` without a
//! warning, its binary path pointed at this build's; and vxmgrd programs
//! the kernel, IP pools' firewall rules included, with the capabilities
//! the unit leaves it.
//!
//! Without systemd-analyze the first test skips, unless
//! VXMGR_REQUIRE_SYSTEMD=1; the second is a namespace test.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use support::testbed::{self, Binaries, Cluster, pool};

#[test]
fn systemd_units_verify_cleanly() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let bin_dir = Path::new(support::VXMGRD).parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for entry in std::fs::read_dir(&deploy).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "service") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.contains("ExecStart=/usr/local/bin/"),
                "{}: the binary is installed in /usr/local/bin",
                path.display()
            );
            let local = text.replace(
                "ExecStart=/usr/local/bin/",
                &format!("ExecStart={}/", bin_dir.display()),
            );
            let copy = dir.path().join(path.file_name().unwrap());
            std::fs::write(&copy, local).unwrap();
            units.push(copy);
        }
    }
    assert!(!units.is_empty(), "no unit in deploy/");
    let output = match Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            support::require::skip(
                &support::require::current_test(),
                "SYSTEMD",
                "systemd-analyze not on PATH (apt-get install systemd)",
            );
            return;
        }
        Err(e) => panic!("running systemd-analyze: {e}"),
    };
    let stderr = support::stderr(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.trim().is_empty(), "warnings: {stderr}");
}

/// The unit's `CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW`, with
/// setpriv: root's uid, no other capability.
#[test]
fn the_units_capabilities_are_enough_to_program_the_kernel() {
    if !support::netns::can_run("the_units_capabilities_are_enough_to_program_the_kernel") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("vxmgrd");
    // The capabilities the daemon runs with go to its log first.
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec setpriv --bounding-set -all,+net_admin,+net_raw -- \\\n  \
             sh -c 'grep CapEff /proc/self/status >&2; exec \"$0\" \"$@\"' {} \"$@\"\n",
            support::VXMGRD
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let binaries = Binaries {
        vxmgrd: wrapper,
        calc_stub: support::CALC_STUB.into(),
    };
    let mut cluster = Cluster::new("vxcap", 2, &binaries).expect("build the cluster");
    // Every batch of both nodes' views must come back OK. On hosts without
    // iptables rules the forward rules go through iptables-legacy, which
    // needs CAP_NET_RAW.
    let pools = [pool("pods", "10.244.0.0/16", true)];
    cluster
        .start_all_with_pools(&[], false, &pools)
        .expect("converges");
    for index in [1, 2] {
        let log = cluster.node_mut(index).stop_and_read_log().unwrap();
        assert!(
            log.contains("CapEff:\t0000000000003000"),
            "only CAP_NET_ADMIN and CAP_NET_RAW (bits 12, 13):\n{log}"
        );
        assert!(log.contains("dataplane in sync"), "{log}");
        assert!(!log.contains("Operation not permitted"), "{log}");
        let save = testbed::sh(&cluster.node(index).ns, "iptables-legacy-save -t filter").unwrap();
        assert!(save.contains("-A FORWARD -j VXMGR-FORWARD"), "{save}");
    }
}

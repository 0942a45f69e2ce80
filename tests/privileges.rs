//! vxmgrd without privileges: the netlink kernel refuses to start, in one
//! line saying what is missing and how to do without; the memory kernel
//! serves.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use support::{Daemon, VXMGRD};

/// vxmgrd with `args`, as nobody and with no capability when we are root
/// (as we are otherwise).
fn unprivileged(args: &[&str]) -> Command {
    let mut command = if nix::unistd::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--bounding-set=-all",
            "--",
            VXMGRD,
        ]);
        c
    } else {
        Command::new(VXMGRD)
    };
    command.args(args).env("NO_COLOR", "1");
    command
}

/// A directory anyone may write in: the socket's.
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

#[test]
fn the_netlink_kernel_without_cap_net_admin_is_refused_in_one_line() {
    let dir = open_dir();
    let socket = dir.path().join("vxmgr.sock");
    let output = unprivileged(&["--kernel", "netlink", "--socket", socket.to_str().unwrap()])
        // Still one line when backtraces are asked for.
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("vxmgrd runs");
    assert!(!output.status.success());
    let stderr = support::stderr(&output);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    for needed in ["CAP_NET_ADMIN", "root", "--kernel memory"] {
        assert!(lines[0].contains(needed), "{needed} in {stderr}");
    }
    assert!(!socket.exists(), "nothing served");
}

#[test]
fn the_memory_kernel_serves_without_privileges() {
    let dir = open_dir();
    let socket = dir.path().join("vxmgr.sock");
    let command = unprivileged(&[
        "--kernel",
        "memory",
        "--hostname",
        "node-a",
        "--socket",
        socket.to_str().unwrap(),
    ]);
    // Fails the test unless it serves, within a deadline.
    let daemon = Daemon::spawn_command(dir, socket, command);
    assert!(daemon.socket.exists());
}

//! Each binary's `--help` opens with what that binary is for.

mod support;

use std::process::Command;

fn first_line_of_help(binary: &str) -> String {
    let output = Command::new(binary).arg("--help").output().unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn each_binary_says_what_it_is_for() {
    let vxmgrd = first_line_of_help(support::VXMGRD);
    assert!(
        vxmgrd.starts_with("Programs the kernel's VXLAN dataplane"),
        "{vxmgrd}"
    );
    let calc_stub = first_line_of_help(support::CALC_STUB);
    assert!(
        calc_stub.starts_with("Stands in for a calc process"),
        "{calc_stub}"
    );
    let calc_flannel = first_line_of_help(support::flannel::CALC_FLANNEL);
    assert!(
        calc_flannel.starts_with("flannel's subnet manager as a calc process for vxmgrd"),
        "{calc_flannel}"
    );
}

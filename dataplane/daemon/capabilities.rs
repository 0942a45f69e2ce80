//! Whether this process may change the kernel's network configuration,
//! checked before the netlink kernel is used: without it every operation
//! would fail and be retried forever.

/// CAP_NET_ADMIN's bit in the capability sets.
const CAP_NET_ADMIN: u32 = 12;

#[derive(Debug, thiserror::Error)]
#[error(
    "the netlink kernel needs CAP_NET_ADMIN, which this process lacks: run vxmgrd as root or \
     with that capability (see deploy/vxmgrd.service), or with --kernel memory to leave the \
     kernel alone"
)]
pub struct MissingNetAdmin;

/// Fails when the effective capability set lacks CAP_NET_ADMIN. When the
/// set cannot be read (no /proc), the kernel's answers will tell.
pub fn require_net_admin() -> Result<(), MissingNetAdmin> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Ok(());
    };
    match effective(&status) {
        Some(caps) if caps & (1 << CAP_NET_ADMIN) == 0 => Err(MissingNetAdmin),
        _ => Ok(()),
    }
}

/// The effective set from /proc/PID/status's `CapEff:` line.
fn effective(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_set_is_read_from_the_status_file() {
        let status = "Name:\tvxmgrd\nCapInh:\t0000000000000000\nCapEff:\t0000000000001000\n";
        assert_eq!(effective(status), Some(1 << CAP_NET_ADMIN));
        assert_eq!(effective("Name:\tx\n"), None);
        assert_eq!(effective("CapEff:\tzz\n"), None);
    }
}

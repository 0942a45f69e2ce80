//! TX checksum offload through the SIOCETHTOOL ioctl: the `ethtool` crate
//! reads features but cannot set them.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// struct ethtool_value
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// A socket to address ethtool requests to. The ioctl acts in the socket's
/// network namespace, so it is opened with the netlink sockets.
pub(super) struct Ethtool {
    socket: OwnedFd,
}

impl Ethtool {
    pub fn open() -> io::Result<Ethtool> {
        let socket = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        Ok(Ethtool { socket })
    }

    /// Whether TX checksum offload is on.
    pub fn tx_checksum(&self, interface: &str) -> io::Result<bool> {
        Ok(self.value(interface, ETHTOOL_GTXCSUM, 0)? != 0)
    }

    pub fn set_tx_checksum(&self, interface: &str, on: bool) -> io::Result<()> {
        self.value(interface, ETHTOOL_STXCSUM, u32::from(on))
            .map(drop)
    }

    fn value(&self, interface: &str, cmd: u32, data: u32) -> io::Result<u32> {
        let name = interface.as_bytes();
        // One byte stays zero: the name is NUL-terminated.
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        let mut value = EthtoolValue { cmd, data };
        // SAFETY: ifreq is plain old data, for which all zeroes is valid.
        let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in request.ifr_name.iter_mut().zip(name) {
            *dst = *src as libc::c_char;
        }
        request.ifr_ifru.ifru_data = (&raw mut value).cast();
        // SAFETY: SIOCETHTOOL reads the ifreq and the ethtool_value it points
        // to, and writes that value back; both outlive the call.
        let rc = unsafe {
            libc::ioctl(
                self.socket.as_raw_fd(),
                libc::SIOCETHTOOL as _,
                &raw mut request,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(value.data)
    }
}

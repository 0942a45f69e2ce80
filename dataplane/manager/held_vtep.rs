//! A remote VTEP as the manager holds it, one per node: an IPv4 VTEP in
//! 16 bytes, where its general form (two addresses of either family) takes
//! 41 and pads its map entry to 56.

use std::net::{IpAddr, Ipv4Addr};

use super::RemoteVtep;
use crate::model::{MacAddr, VtepAddresses};

#[derive(Clone, Debug)]
pub enum HeldVtep {
    V4 {
        mac: MacAddr,
        tunnel_ip: Ipv4Addr,
        parent_ip: Ipv4Addr,
    },
    V4TunnelOnly(Ipv4Addr),
    /// IPv6, held as it came.
    Other(Box<RemoteVtep>),
}

impl HeldVtep {
    pub fn hold(vtep: RemoteVtep) -> HeldVtep {
        match vtep {
            RemoteVtep::Complete(VtepAddresses {
                mac,
                tunnel_ip: IpAddr::V4(tunnel_ip),
                parent_ip: IpAddr::V4(parent_ip),
            }) => HeldVtep::V4 {
                mac,
                tunnel_ip,
                parent_ip,
            },
            RemoteVtep::TunnelOnly(IpAddr::V4(ip)) => HeldVtep::V4TunnelOnly(ip),
            other => HeldVtep::Other(Box::new(other)),
        }
    }

    pub fn unhold(&self) -> RemoteVtep {
        match self {
            HeldVtep::V4 {
                mac,
                tunnel_ip,
                parent_ip,
            } => RemoteVtep::Complete(VtepAddresses {
                mac: *mac,
                tunnel_ip: IpAddr::V4(*tunnel_ip),
                parent_ip: IpAddr::V4(*parent_ip),
            }),
            HeldVtep::V4TunnelOnly(ip) => RemoteVtep::TunnelOnly(IpAddr::V4(*ip)),
            HeldVtep::Other(vtep) => RemoteVtep::clone(vtep),
        }
    }

    pub fn tunnel_ip(&self) -> IpAddr {
        match self {
            HeldVtep::V4 { tunnel_ip, .. } => IpAddr::V4(*tunnel_ip),
            HeldVtep::V4TunnelOnly(ip) => IpAddr::V4(*ip),
            HeldVtep::Other(vtep) => vtep.tunnel_ip(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HeldVtep;
    use crate::manager::RemoteVtep;
    use crate::model::{MacAddr, VtepAddresses};

    #[test]
    fn every_vtep_comes_back_as_it_was_held() {
        let mac = MacAddr([0x66, 0xaa, 0, 0, 0, 1]);
        let vteps = [
            RemoteVtep::Complete(VtepAddresses {
                mac,
                tunnel_ip: "10.0.0.1".parse().unwrap(),
                parent_ip: "172.16.0.1".parse().unwrap(),
            }),
            RemoteVtep::TunnelOnly("10.0.0.2".parse().unwrap()),
            RemoteVtep::Complete(VtepAddresses {
                mac,
                tunnel_ip: "fd00::1".parse().unwrap(),
                parent_ip: "fd10::1".parse().unwrap(),
            }),
            RemoteVtep::TunnelOnly("fd00::2".parse().unwrap()),
        ];
        for vtep in vteps {
            let held = HeldVtep::hold(vtep.clone());
            assert_eq!(held.tunnel_ip(), vtep.tunnel_ip());
            assert_eq!(held.unhold(), vtep);
        }
        assert_eq!(std::mem::size_of::<HeldVtep>(), 16);
    }
}

//! What it takes to make a link match a desired VXLAN device.

use std::net::IpAddr;

use crate::desired::VxlanDevice;
use crate::kernel::objects::{KernelOp, Link, VxlanSpec};

/// Why the existing link must be deleted and created again (the kernel
/// cannot change these in place), or `None` when it can be fixed up.
pub fn recreate_reason(desired: &VxlanDevice, link: &Link) -> Option<String> {
    let Some(vxlan) = &link.vxlan else {
        return Some("it is not a VXLAN device".into());
    };
    let differs = |what: &str, have: Option<String>, want: String| {
        let have = have.unwrap_or_else(|| "unset".into());
        (have != want).then(|| format!("its {what} is {have}, want {want}"))
    };
    differs("VNI", Some(vxlan.vni.to_string()), desired.vni.to_string())
        .or_else(|| {
            differs(
                "port",
                Some(vxlan.port.to_string()),
                desired.port.to_string(),
            )
        })
        .or_else(|| {
            let have = vxlan.parent_index.map(|i| format!("ifindex {i}"));
            differs("parent", have, format!("ifindex {}", desired.parent.index))
        })
        .or_else(|| {
            let have = vxlan.local.map(|ip| ip.to_string());
            differs("source address", have, desired.local_ip.to_string())
        })
        .or_else(|| {
            differs(
                "MAC",
                link.mac.map(|m| m.to_string()),
                desired.mac.to_string(),
            )
        })
        .or_else(|| vxlan.learning.then(|| "learning is on".to_string()))
}

pub fn spec(desired: &VxlanDevice) -> VxlanSpec {
    VxlanSpec {
        name: desired.family.device_name().to_string(),
        vni: desired.vni,
        port: desired.port,
        parent_index: desired.parent.index,
        local: desired.local_ip,
        mac: desired.mac,
        mtu: desired.mtu,
    }
}

/// Drift that can be corrected in place: MTU, addresses (exactly the
/// tunnel address; IPv6 link-local kept), admin state, TX checksum.
pub fn fixups(desired: &VxlanDevice, link: &Link, disable_tx_checksum: bool) -> Vec<KernelOp> {
    let index = link.index;
    let mut ops = Vec::new();
    if link.mtu != desired.mtu {
        ops.push(KernelOp::SetMtu {
            index,
            mtu: desired.mtu,
        });
    }
    for address in &link.addresses {
        if *address != desired.address && !is_link_local(address.ip()) {
            ops.push(KernelOp::DeleteAddress {
                index,
                address: *address,
            });
        }
    }
    if !link.addresses.contains(&desired.address) {
        ops.push(KernelOp::AddAddress {
            index,
            address: desired.address,
        });
    }
    if disable_tx_checksum && link.tx_checksum != Some(false) {
        ops.push(KernelOp::DisableTxChecksum {
            name: link.name.clone(),
        });
    }
    if !link.up {
        ops.push(KernelOp::SetUp { index });
    }
    ops
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
        IpAddr::V4(_) => false,
    }
}

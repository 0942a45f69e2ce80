//! What it takes to make a link match a desired VXLAN device, and the
//! reconciler's steps that do it.

use std::net::IpAddr;

use foldhash::HashSet;
use tracing::{debug, info};

use super::table::Effect;
use super::{KernelBackend, ObjectError, Reconciler, Report};
use crate::kernel::objects::{KernelNexthop, KernelRouteVia};
use crate::model::Family;

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
        name: desired.name.to_string(),
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

/// Making each family's device match: create, recreate, fix up.
impl<B: KernelBackend> Reconciler<B> {
    /// Makes one family's device match: create, recreate or fix up. With no
    /// device desired (no local VTEP or parent interface known) an existing
    /// one is left as it is, sweep or not: Felix never deletes its device
    /// for want of local information.
    pub(super) async fn reconcile_device(&mut self, family: Family, report: &mut Report) {
        self.devices[family as usize].dirty = false;
        self.refresh_link(family, report).await;
        let slot = &mut self.devices[family as usize];
        let Some(desired) = slot.desired.clone() else {
            // Nothing is tried, so nothing is failing.
            slot.error = None;
            return;
        };
        let mut link = slot.link.clone();
        let mut recreated = false;
        if let Some(l) = &link
            && let Some(reason) = recreate_reason(&desired, l)
        {
            info!(device = %l.name, %reason, "deleting device");
            self.delete_device_dependents(l.index).await;
            let op = KernelOp::DeleteLink {
                index: l.index,
                name: l.name.clone(),
            };
            if !self.device_op(family, op, report).await {
                return;
            }
            self.forget_device_objects(l.index);
            self.devices[family as usize].link = None;
            link = None;
            recreated = true;
        }
        if link.is_none() {
            let op = KernelOp::CreateVxlan(spec(&desired));
            if !self.device_op(family, op, report).await {
                return;
            }
            report.count(if recreated {
                Effect::Changed
            } else {
                Effect::Added
            });
            self.refresh_link(family, report).await;
            // Everything on the device has to be programmed (again).
            self.mark_all_pending();
            self.devices[family as usize].dirty = false;
        }
        let Some(link) = self.devices[family as usize].link.clone() else {
            return;
        };
        let fixups = fixups(&desired, &link, self.options.disable_tx_checksum);
        if fixups.is_empty() {
            self.devices[family as usize].error = None;
            return;
        }
        let mut all_ok = true;
        for op in fixups {
            all_ok &= self.device_op(family, op, report).await;
        }
        if all_ok && !recreated && link.up {
            report.count(Effect::Changed);
        }
        self.refresh_link(family, report).await;
    }

    /// One device operation; failures are reported and the device re-checked
    /// on the next pass.
    pub(super) async fn device_op(
        &mut self,
        family: Family,
        op: KernelOp,
        report: &mut Report,
    ) -> bool {
        let what = op.to_string();
        let result = self.apply_one(&op, report).await;
        let slot = &mut self.devices[family as usize];
        match result {
            Ok(()) => {
                debug!(change = %what, "kernel");
                slot.error = None;
                true
            }
            Err(e) => {
                report.fail(what.clone(), &e);
                slot.error = Some(ObjectError {
                    object: what,
                    error: e.to_string(),
                });
                slot.dirty = true;
                false
            }
        }
    }

    /// Deletes the routes and nexthops through a device before the device:
    /// the kernel would remove them too, but walks the whole routing table
    /// for each nexthop it removes that way (tens of seconds with tens of
    /// thousands of nodes, holding the routing lock). Failures do not
    /// matter: the device deletion removes what is left.
    pub(super) async fn delete_device_dependents(&mut self, index: u32) {
        let nexthops: Vec<KernelNexthop> = self
            .nexthops
            .all_actual()
            .filter(|n| n.ifindex == index)
            .collect();
        let ids: HashSet<u32> = nexthops.iter().map(|n| n.id).collect();
        let routes: Vec<KernelOp> = self
            .routes
            .all_actual()
            .filter(|r| {
                r.ifindex() == Some(index)
                    || matches!(r.via, KernelRouteVia::Nexthop(id) if ids.contains(&id))
            })
            .map(KernelOp::DeleteRoute)
            .collect();
        self.backend.apply(&routes).await;
        let nexthops: Vec<KernelOp> = nexthops.into_iter().map(KernelOp::DeleteNexthop).collect();
        self.backend.apply(&nexthops).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::desired::ParentInterface;
    use crate::kernel::objects::VxlanAttrs;
    use crate::model::Family;

    fn desired() -> VxlanDevice {
        VxlanDevice {
            name: Arc::from("vxlan.calico"),
            family: Family::V4,
            vni: 4096,
            port: 4789,
            parent: ParentInterface {
                name: arcstr::ArcStr::from("eth0"),
                index: 2,
                mtu: 1500,
            },
            local_ip: "192.168.10.1".parse().unwrap(),
            mac: "66:aa:00:00:00:01".parse().unwrap(),
            mtu: 1450,
            address: "10.244.0.0/32".parse().unwrap(),
        }
    }

    /// The link as vxmgr makes it for `desired()`.
    fn matching() -> Link {
        Link {
            index: 7,
            name: "vxlan.calico".into(),
            mtu: 1450,
            mac: Some("66:aa:00:00:00:01".parse().unwrap()),
            up: true,
            vxlan: Some(VxlanAttrs {
                vni: 4096,
                port: 4789,
                parent_index: Some(2),
                local: Some("192.168.10.1".parse().unwrap()),
                learning: false,
            }),
            addresses: vec!["10.244.0.0/32".parse().unwrap()],
            tx_checksum: Some(false),
        }
    }

    /// A change to a link, and the reason it gives to recreate the device.
    type Case = (fn(&mut Link), &'static str);

    fn vxlan(link: &mut Link) -> &mut VxlanAttrs {
        link.vxlan.as_mut().unwrap()
    }

    #[test]
    fn a_matching_link_needs_nothing() {
        assert_eq!(recreate_reason(&desired(), &matching()), None);
        assert_eq!(fixups(&desired(), &matching(), true), []);
    }

    #[test]
    fn what_the_kernel_cannot_change_in_place_recreates_the_device() {
        let cases: [Case; 8] = [
            (|l| l.vxlan = None, "it is not a VXLAN device"),
            (|l| vxlan(l).vni = 5000, "its VNI is 5000, want 4096"),
            (|l| vxlan(l).port = 8472, "its port is 8472, want 4789"),
            (
                |l| vxlan(l).parent_index = Some(3),
                "its parent is ifindex 3, want ifindex 2",
            ),
            (
                |l| vxlan(l).parent_index = None,
                "its parent is unset, want ifindex 2",
            ),
            (
                |l| vxlan(l).local = Some("192.168.10.9".parse().unwrap()),
                "its source address is 192.168.10.9, want 192.168.10.1",
            ),
            (
                |l| l.mac = Some("66:aa:00:00:00:09".parse().unwrap()),
                "its MAC is 66:aa:00:00:00:09, want 66:aa:00:00:00:01",
            ),
            (|l| vxlan(l).learning = true, "learning is on"),
        ];
        for (change, reason) in cases {
            let mut link = matching();
            change(&mut link);
            assert_eq!(
                recreate_reason(&desired(), &link).as_deref(),
                Some(reason),
                "{link:?}"
            );
        }
    }

    #[test]
    fn mtu_addresses_admin_state_and_checksum_are_fixed_in_place() {
        let mut link = matching();
        link.mtu = 9000;
        link.addresses = vec![
            "10.9.9.9/24".parse().unwrap(),
            "fe80::1/64".parse().unwrap(),
        ];
        link.up = false;
        link.tx_checksum = Some(true);
        assert_eq!(recreate_reason(&desired(), &link), None);
        assert_eq!(
            fixups(&desired(), &link, true),
            [
                KernelOp::SetMtu {
                    index: 7,
                    mtu: 1450
                },
                KernelOp::DeleteAddress {
                    index: 7,
                    address: "10.9.9.9/24".parse().unwrap()
                },
                KernelOp::AddAddress {
                    index: 7,
                    address: "10.244.0.0/32".parse().unwrap()
                },
                KernelOp::DisableTxChecksum {
                    name: "vxlan.calico".into()
                },
                KernelOp::SetUp { index: 7 },
            ],
            "the IPv6 link-local address is kept"
        );
    }
}

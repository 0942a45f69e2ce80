//! The manager and reconciler in this process, wired as the daemon wires
//! them, without the socket and the batching in between.

use anyhow::{Result, ensure};

use vxmgr::config::Config;
use vxmgr::kernel::KernelBackend;
use vxmgr::manager::Manager;
use vxmgr::model::{Family, Update};
use vxmgr::reconciler::{ApplyRequest, CONTEST_WINDOW, NexthopMode, Reconciler, ReconcilerOptions};
use vxmgr::wire::felix::ToDataplane;

use crate::cluster::LOCAL_NODE;

/// Takes every message into a manager and programs the result through a
/// reconciler on `backend`, as one batch; fails if anything was rejected
/// or failed in the kernel.
pub async fn converge<B: KernelBackend>(
    backend: B,
    messages: Vec<ToDataplane>,
) -> Result<(Manager, Reconciler<B>)> {
    let options = ReconcilerOptions {
        nexthops: NexthopMode::Auto,
        disable_tx_checksum: false,
        route_protocol: Config::default().settings().route_protocol,
        contest_window: CONTEST_WINDOW,
    };
    let mut reconciler = Reconciler::new(backend, options).await;
    // The daemon adopts the kernel's state before the first stream.
    reconciler.resync().await?;
    let mut manager = Manager::new(LOCAL_NODE, Config::default());
    for msg in messages {
        if let Some(update) = Update::from_message(msg)? {
            manager.on_update(update)?;
        }
    }
    // The engine resolves the parent interfaces before the delta, so that
    // the batch bringing the local VTEP also brings the device.
    let parent_ips = Family::ALL.map(|f| manager.family(f).parent_ip());
    let (_, parents) = reconciler.find_parents(parent_ips).await;
    for (family, parent) in Family::ALL.into_iter().zip(parents) {
        manager.set_parent(family, parent);
    }
    let request = ApplyRequest {
        delta: manager.complete_deferred_work(),
        in_sync: manager.in_sync(),
        route_protocol: manager.settings().route_protocol,
        device_names: manager.settings().device_names,
    };
    let report = reconciler.apply(request).await;
    ensure!(
        report.errors.is_empty(),
        "{} kernel errors programming the cluster, the first: {:?}",
        report.errors.len(),
        report.errors[0]
    );
    Ok((manager, reconciler))
}

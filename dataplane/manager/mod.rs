//! The pure state machine: validated updates in, deltas of desired kernel
//! state out. No I/O, no clocks; the daemon drives it.

mod family;
mod held_vtep;
mod node_routes;
mod pools;
#[cfg(test)]
mod tests;

use arcstr::ArcStr;

pub use family::{
    FamilyManager, FamilySettings, FamilySnapshot, RemoteVtep, WaitReason, WaitingRoute,
};

use crate::config::{Config, Settings};
use crate::desired::{Delta, ParentInterface};
use crate::model::update::Rejection;
use crate::model::{Family, IpPool, Update};
use pools::Pools;

/// What became of one update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// Valid, but nothing to do: another family's or pool's route, a remove
    /// for an unknown key, an unknown payload.
    Ignored,
}

/// Both families' managers, the settings they share, and the stream's
/// InSync state.
pub struct Manager {
    config: Config,
    hostname: ArcStr,
    v4: FamilyManager,
    v6: FamilyManager,
    pools: Pools,
    in_sync: bool,
}

impl Manager {
    pub fn new(hostname: &str, config: Config) -> Manager {
        let hostname = ArcStr::from(hostname);
        let settings = config.settings();
        let family = |f| {
            FamilyManager::new(
                f,
                hostname.clone(),
                FamilySettings::from_settings(f, &settings),
            )
        };
        Manager {
            v4: family(Family::V4),
            v6: family(Family::V6),
            config,
            hostname,
            pools: Pools::default(),
            in_sync: false,
        }
    }

    /// A manager for a new stream: same host, flags and underlay, no
    /// intent. Config from the previous stream's ConfigUpdate is kept until
    /// the new stream sends its own.
    pub fn fresh(&self) -> Manager {
        let mut m = Manager::new(&self.hostname, self.config.clone());
        for f in Family::ALL {
            m.family_mut(f).inherit_underlay(self.family(f));
        }
        m
    }

    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    pub fn settings(&self) -> Settings {
        self.config.settings()
    }

    pub fn in_sync(&self) -> bool {
        self.in_sync
    }

    /// The IP pools the stream declared, by id.
    pub fn pools(&self) -> impl Iterator<Item = &IpPool> {
        self.pools.all()
    }

    pub fn family(&self, f: Family) -> &FamilyManager {
        match f {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    fn family_mut(&mut self, f: Family) -> &mut FamilyManager {
        match f {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }

    /// Felix's OnUpdate.
    pub fn on_update(&mut self, update: Update) -> Result<Outcome, Rejection> {
        let applied = match update {
            Update::InSync => {
                self.in_sync = true;
                true
            }
            Update::Config(map) => {
                let result = self.config.apply_update(&map);
                let settings = self.config.settings();
                for f in Family::ALL {
                    self.family_mut(f)
                        .set_settings(FamilySettings::from_settings(f, &settings));
                }
                result?;
                true
            }
            Update::Route(r) => self.family_mut(r.family()).on_route(r),
            Update::RouteRemove(dst) => self.family_mut(Family::of_net(&dst)).on_route_remove(dst),
            Update::Vtep(v) => {
                // Each family takes its own part, as Felix's per-family
                // managers do; a bad part is reported all the same.
                match (self.v4.on_vtep(&v), self.v6.on_vtep(&v)) {
                    (Err(v4), Err(v6)) => return Err(Rejection(format!("{v4}; {v6}"))),
                    (Err(rejection), Ok(_)) | (Ok(_), Err(rejection)) => return Err(rejection),
                    (Ok(v4), Ok(v6)) => v4 || v6,
                }
            }
            Update::VtepRemove(node) => {
                let v4 = self.v4.on_vtep_remove(&node);
                let v6 = self.v6.on_vtep_remove(&node);
                v4 || v6
            }
            Update::Pool(pool) => self.pools.on_update(pool)?,
            Update::PoolRemove(id) => self.pools.on_remove(&id),
        };
        Ok(if applied {
            Outcome::Applied
        } else {
            Outcome::Ignored
        })
    }

    /// The kernel's answer to "which interface holds the parent address".
    pub fn set_parent(&mut self, family: Family, parent: Option<ParentInterface>) {
        self.family_mut(family).set_parent(parent);
    }

    /// Felix's CompleteDeferredWork, for both families.
    pub fn complete_deferred_work(&mut self) -> Delta {
        let mut delta = Delta::default();
        self.v4.complete_deferred_work(&mut delta);
        self.v6.complete_deferred_work(&mut delta);
        self.pools.complete_deferred_work(&mut delta);
        delta
    }

    /// Every desired object of both families.
    pub fn full_delta(&self) -> Delta {
        let mut delta = Delta::default();
        self.v4.full_delta(&mut delta);
        self.v6.full_delta(&mut delta);
        self.pools.full_delta(&mut delta);
        delta
    }
}

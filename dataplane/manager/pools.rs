//! The IP pools the calc process declares (Felix's `IPAMPoolUpdate`): the
//! firewall's masquerade and forward rules are made of them.

use std::collections::{BTreeMap, BTreeSet};

use ipnetwork::IpNetwork;

use crate::desired::{Change, Delta};
use crate::model::IpPool;
use crate::model::update::{Rejection, quote};

#[derive(Default)]
pub struct Pools {
    pools: BTreeMap<String, IpPool>,
    /// Ids changed since the last `complete_deferred_work`.
    dirty: BTreeSet<String>,
}

impl Pools {
    /// A pool declared or changed. One that overlaps another pool is
    /// rejected: which pool an address belongs to would be ambiguous, and
    /// removing either would take the other's addresses out of the sets.
    pub fn on_update(&mut self, pool: IpPool) -> Result<bool, Rejection> {
        let clash = self
            .pools
            .values()
            .find(|p| p.id != pool.id && overlap(p.cidr, pool.cidr));
        if let Some(other) = clash {
            return Err(Rejection(format!(
                "ipam_pool_update.pool.cidr {} of pool {} overlaps pool {} ({})",
                quote(&pool.cidr.to_string()),
                quote(&pool.id),
                quote(&other.id),
                other.cidr
            )));
        }
        if self.pools.get(&pool.id) != Some(&pool) {
            self.dirty.insert(pool.id.clone());
            self.pools.insert(pool.id.clone(), pool);
        }
        Ok(true)
    }

    /// A pool gone; `false` when it was not known.
    pub fn on_remove(&mut self, id: &str) -> bool {
        let known = self.pools.remove(id).is_some();
        if known {
            self.dirty.insert(id.to_string());
        }
        known
    }

    pub fn complete_deferred_work(&mut self, delta: &mut Delta) {
        for id in std::mem::take(&mut self.dirty) {
            let desired = self.pools.get(&id).cloned();
            delta.pools.push(Change { key: id, desired });
        }
    }

    pub fn full_delta(&self, delta: &mut Delta) {
        delta.pools.extend(self.pools.values().map(|p| Change {
            key: p.id.clone(),
            desired: Some(p.clone()),
        }));
    }

    /// Every pool, by id.
    pub fn all(&self) -> impl Iterator<Item = &IpPool> {
        self.pools.values()
    }
}

fn overlap(a: IpNetwork, b: IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(id: &str, cidr: &str, masquerade: bool) -> IpPool {
        IpPool {
            id: id.into(),
            cidr: cidr.parse().unwrap(),
            masquerade,
        }
    }

    fn changes(pools: &mut Pools) -> Vec<(String, Option<IpPool>)> {
        let mut delta = Delta::default();
        pools.complete_deferred_work(&mut delta);
        delta
            .pools
            .into_iter()
            .map(|c| (c.key, c.desired))
            .collect()
    }

    #[test]
    fn an_overlapping_pool_is_rejected_and_the_other_stays() {
        let mut pools = Pools::default();
        pools.on_update(pool("a", "10.244.0.0/16", true)).unwrap();
        pools.on_update(pool("v6", "fd00:244::/48", false)).unwrap();
        changes(&mut pools);
        for cidr in ["10.244.3.0/24", "10.0.0.0/8", "10.244.0.0/16"] {
            let err = pools.on_update(pool("b", cidr, false)).unwrap_err();
            assert!(err.0.contains("overlaps pool \"a\""), "{cidr}: {err}");
        }
        // A pool may move within its own range; the other family is apart.
        pools.on_update(pool("a", "10.244.0.0/17", true)).unwrap();
        pools.on_update(pool("b", "10.245.0.0/16", false)).unwrap();
        assert_eq!(
            changes(&mut pools),
            [
                ("a".into(), Some(pool("a", "10.244.0.0/17", true))),
                ("b".into(), Some(pool("b", "10.245.0.0/16", false))),
            ]
        );
    }

    #[test]
    fn only_what_changed_goes_into_the_delta() {
        let mut pools = Pools::default();
        pools.on_update(pool("a", "10.244.0.0/16", true)).unwrap();
        changes(&mut pools);
        pools.on_update(pool("a", "10.244.0.0/16", true)).unwrap();
        assert!(changes(&mut pools).is_empty());
        assert!(!pools.on_remove("nope"));
        assert!(pools.on_remove("a"));
        assert_eq!(changes(&mut pools), [("a".into(), None)]);
    }
}

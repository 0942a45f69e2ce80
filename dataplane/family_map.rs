//! A dense map keyed by an address or a network, each family's keys in a
//! map of their own and in their own size: an IPv4 network is 5 bytes where
//! one of either family takes 18, and the manager keeps one per route.

use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};

use crate::dense_map::DenseMap;

/// A key of either family, and its two narrower forms.
pub trait FamilySplit: Copy {
    type V4: Copy + Hash + Eq;
    type V6: Copy + Hash + Eq;
    fn split(self) -> Either<Self::V4, Self::V6>;
    fn from_v4(key: Self::V4) -> Self;
    fn from_v6(key: Self::V6) -> Self;
}

pub enum Either<A, B> {
    V4(A),
    V6(B),
}

impl FamilySplit for IpAddr {
    type V4 = Ipv4Addr;
    type V6 = Ipv6Addr;
    fn split(self) -> Either<Ipv4Addr, Ipv6Addr> {
        match self {
            IpAddr::V4(a) => Either::V4(a),
            IpAddr::V6(a) => Either::V6(a),
        }
    }
    fn from_v4(key: Ipv4Addr) -> IpAddr {
        IpAddr::V4(key)
    }
    fn from_v6(key: Ipv6Addr) -> IpAddr {
        IpAddr::V6(key)
    }
}

impl FamilySplit for IpNetwork {
    type V4 = Ipv4Network;
    type V6 = Ipv6Network;
    fn split(self) -> Either<Ipv4Network, Ipv6Network> {
        match self {
            IpNetwork::V4(n) => Either::V4(n),
            IpNetwork::V6(n) => Either::V6(n),
        }
    }
    fn from_v4(key: Ipv4Network) -> IpNetwork {
        IpNetwork::V4(key)
    }
    fn from_v6(key: Ipv6Network) -> IpNetwork {
        IpNetwork::V6(key)
    }
}

pub struct FamilyMap<K: FamilySplit, V> {
    v4: DenseMap<K::V4, V>,
    v6: DenseMap<K::V6, V>,
}

impl<K: FamilySplit, V> Default for FamilyMap<K, V> {
    fn default() -> Self {
        FamilyMap {
            v4: DenseMap::default(),
            v6: DenseMap::default(),
        }
    }
}

impl<K: FamilySplit, V> FamilyMap<K, V> {
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        match key.split() {
            Either::V4(k) => self.v4.get(&k),
            Either::V6(k) => self.v6.get(&k),
        }
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        match key.split() {
            Either::V4(k) => self.v4.get_mut(&k),
            Either::V6(k) => self.v6.get_mut(&k),
        }
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        match key.split() {
            Either::V4(k) => self.v4.get_or_insert_with(k, make),
            Either::V6(k) => self.v6.get_or_insert_with(k, make),
        }
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match key.split() {
            Either::V4(k) => self.v4.insert(k, value),
            Either::V6(k) => self.v6.insert(k, value),
        }
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        match key.split() {
            Either::V4(k) => self.v4.remove(&k),
            Either::V6(k) => self.v6.remove(&k),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (K, &V)> {
        let v4 = self.v4.iter().map(|(k, v)| (K::from_v4(*k), v));
        v4.chain(self.v6.iter().map(|(k, v)| (K::from_v6(*k), v)))
    }

    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.iter().map(|(k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::FamilyMap;
    use ipnetwork::IpNetwork;

    #[test]
    fn keeps_each_family_apart_and_gives_keys_back_whole() {
        let mut map = FamilyMap::<IpNetwork, u32>::default();
        let v4: IpNetwork = "10.0.0.0/26".parse().unwrap();
        let v6: IpNetwork = "fd00::/64".parse().unwrap();
        assert_eq!(map.insert(v4, 1), None);
        assert_eq!(map.insert(v6, 2), None);
        *map.get_or_insert_with(v4, || 0) += 10;
        assert_eq!(map.get(&v4), Some(&11));
        assert_eq!(map.len(), 2);
        let mut keys: Vec<_> = map.keys().collect();
        keys.sort();
        assert_eq!(keys, [v4, v6]);
        assert_eq!(map.remove(&v6), Some(2));
        assert!(!map.contains_key(&v6));
        assert_eq!(map.len(), 1);
    }
}

//! A small bounded map that forgets its least recently used entry when full.
//!
//! Used for caches of immutable, verified things (parsed Parquet footers, a prepared
//! statement's physical plans) where entries are few enough that finding the oldest by a
//! scan on insert costs less than keeping an ordered index.

use std::collections::HashMap;
use std::hash::Hash;

/// A map of at most `capacity` entries (at least one); `get` refreshes an entry.
#[derive(Debug)]
pub(crate) struct Lru<K, V> {
    entries: HashMap<K, (V, u64)>,
    clock: u64,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Lru<K, V> {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            clock: 0,
            capacity: capacity.max(1),
        }
    }

    /// A copy of the value under `key`, marked as just used.
    pub fn get<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.clock += 1;
        let now = self.clock;
        self.entries.get_mut(key).map(|(v, used)| {
            *used = now;
            v.clone()
        })
    }

    /// Stores `value`, evicting the least recently used entry if the map is full.
    pub fn insert(&mut self, key: K, value: V) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
        self.clock += 1;
        self.entries.insert(key, (value, self.clock));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Forgets every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = Lru::new(2);
        c.insert("a", 1);
        c.insert("b", 2);
        assert_eq!(c.get("a"), Some(1)); // "b" is now the oldest
        c.insert("c", 3);
        assert_eq!(c.get("b"), None);
        assert_eq!((c.get("a"), c.get("c")), (Some(1), Some(3)));
        c.insert("c", 4); // replacing does not evict
        assert_eq!((c.len(), c.get("a"), c.get("c")), (2, Some(1), Some(4)));
    }
}

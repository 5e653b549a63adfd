//! Keys stored with their hash, so that a map of keys never runs a key's
//! own `Hash` once the key is in it.
//!
//! `std`'s `HashMap` hashes every key again when it rehashes in place, and
//! if a key's `Hash` panics then, it drops the keys it has not placed again:
//! busy keys among them, whose slots would be counted by a second bulkhead
//! made for the key. A key's hash is computed once, by the keys' own
//! `RandomState`, as it comes in; the map hashes that number alone, with
//! [`Passthrough`], and is looked up by a borrowed key and its hash through
//! [`Lookup`].

use std::borrow::Borrow;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A key and its hash, as a map of keys and its ring hold them.
#[derive(Debug)]
pub(crate) struct Hashed<K> {
    pub(crate) hash: u64,
    pub(crate) key: K,
}

/// A key and its hash, borrowed: what a map of keys is looked up by.
pub(crate) struct Borrowed<'a, K> {
    pub(crate) hash: u64,
    pub(crate) key: &'a K,
}

/// A key and its hash, owned or borrowed.
pub(crate) trait Lookup<K> {
    fn hash(&self) -> u64;
    fn key(&self) -> &K;
}

impl<K> Lookup<K> for Hashed<K> {
    fn hash(&self) -> u64 {
        self.hash
    }

    fn key(&self) -> &K {
        &self.key
    }
}

impl<K> Lookup<K> for Borrowed<'_, K> {
    fn hash(&self) -> u64 {
        self.hash
    }

    fn key(&self) -> &K {
        self.key
    }
}

impl<'a, K> Borrowed<'a, K> {
    /// As a map of keys is looked up.
    pub(crate) fn lookup(&self) -> &(dyn Lookup<K> + 'a) {
        self
    }
}

impl<K> Hashed<K> {
    /// As a map of keys is looked up.
    pub(crate) fn lookup(&self) -> &(dyn Lookup<K> + '_) {
        self
    }
}

// Owned and borrowed hash and compare alike, as `Borrow` requires: the hash
// alone, then the hash and the key.

impl<'a, K: 'a> Borrow<dyn Lookup<K> + 'a> for Hashed<K> {
    fn borrow(&self) -> &(dyn Lookup<K> + 'a) {
        self
    }
}

impl<K> Hash for dyn Lookup<K> + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(Lookup::hash(self));
    }
}

impl<K: PartialEq> PartialEq for dyn Lookup<K> + '_ {
    fn eq(&self, other: &Self) -> bool {
        Lookup::hash(self) == Lookup::hash(other) && self.key() == other.key()
    }
}

impl<K: Eq> Eq for dyn Lookup<K> + '_ {}

impl<K> Hash for Hashed<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl<K: PartialEq> PartialEq for Hashed<K> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl<K: Eq> Eq for Hashed<K> {}

/// The map's hasher: a key's hash, as computed when it came in.
pub(crate) type PassthroughState = BuildHasherDefault<Passthrough>;

/// Hashes a `u64` to itself. (It is a hash already: a `RandomState`'s, so a
/// map of keys resists keys chosen to collide as much as a plain map does.)
#[derive(Default)]
pub(crate) struct Passthrough(u64);

impl Hasher for Passthrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Never called: a map of keys hashes one `u64`. Folded all the same.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_map_of_hashed_keys_is_found_by_a_borrowed_key_and_its_hash() {
        let mut map: HashMap<Hashed<String>, u32, PassthroughState> = HashMap::default();
        map.insert(
            Hashed {
                hash: 7,
                key: "a".to_owned(),
            },
            1,
        );
        // Two keys of one hash, told apart by the key.
        map.insert(
            Hashed {
                hash: 7,
                key: "b".to_owned(),
            },
            2,
        );
        let found = |hash: u64, key: &String| map.get(Borrowed { hash, key }.lookup()).copied();
        let (a, b) = ("a".to_owned(), "b".to_owned());
        assert_eq!(found(7, &a), Some(1));
        assert_eq!(found(7, &b), Some(2));
        // A key under another hash is another key.
        assert_eq!(found(8, &a), None);
    }
}

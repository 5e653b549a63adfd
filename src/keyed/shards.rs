//! Which of the keys' shards holds a key: the keys are spread over
//! several maps, each behind its own lock, so that calls of different keys
//! on different cores do not all write one lock's word.

use std::hash::{Hash, Hasher};

/// How many keys a shard is made for, at least: a keyed bulkhead of fewer
/// than twice as many keys has one shard.
const KEYS_A_SHARD: usize = 64;

/// The most shards, whatever the cores: past it, two cores meet on one
/// shard's lock rarely enough.
const MAX_SHARDS: usize = 64;

/// How many shards a keyed bulkhead of `max_keys` keys has: a power of
/// two, up to four for each core this process may run on (so that two
/// cores' calls meet on one shard's lock one time in four times the cores),
/// but no more than one for each `KEYS_A_SHARD` keys.
pub(crate) fn shard_count(max_keys: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let most = (max_keys / KEYS_A_SHARD)
        .min(cores.saturating_mul(4))
        .clamp(1, MAX_SHARDS);
    // The power of two at or below.
    1 << most.ilog2()
}

/// The shard of `key`, of `count` (a power of two).
///
/// The hash is a cheap one, not the maps' own (which resists keys chosen to
/// collide): keys chosen to fall in one shard make that shard's lock as
/// busy as a single map's would be, and no worse.
#[inline(always)]
pub(crate) fn shard_of<K: Hash + ?Sized>(key: &K, count: usize) -> usize {
    debug_assert!(count.is_power_of_two());
    if count == 1 {
        return 0;
    }
    let mut hasher = ShardHasher(0);
    key.hash(&mut hasher);
    // The high bits: a multiplication mixes every bit of the key into them.
    (hasher.0 >> (u64::BITS - count.trailing_zeros())) as usize
}

/// An odd constant with well-spread bits (the golden ratio's).
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// A multiply-and-rotate hash (as rustc's `FxHasher`), for picking a
/// shard, and for the maps' keys, which are the keys' hashes already.
#[derive(Default)]
pub(crate) struct ShardHasher(u64);

impl Hasher for ShardHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    /// A word at a time: an integer's bytes (what a key's `Hash` writes
    /// most) are one word, mixed in by one multiplication.
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_ne_bytes(word)).wrapping_mul(SEED);
        }
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_shard_count_is_a_power_of_two_within_its_bounds() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        for max_keys in [0, 1, 2, 63, 64, 65, 127, 128, 1_000, 4_096, usize::MAX] {
            let count = shard_count(max_keys);
            assert!(count.is_power_of_two(), "{max_keys}: {count}");
            assert!(count <= MAX_SHARDS, "{max_keys}: {count}");
            assert!(
                count <= (max_keys / KEYS_A_SHARD).max(1),
                "{max_keys}: {count}"
            );
            assert!(count <= 4 * cores, "{max_keys}: {count}");
        }
        assert_eq!(shard_count(1), 1);
        assert_eq!(shard_count(KEYS_A_SHARD - 1), 1);
        assert_eq!(shard_count(2 * KEYS_A_SHARD), 2);
        // Rounded down: never more than one shard for each 64 keys.
        assert_eq!(shard_count(3 * KEYS_A_SHARD), 2);
    }

    /// `tests/keyed_shards.rs` places `u64` keys in shards by this rule.
    #[test]
    fn a_u64_falls_in_the_shard_of_the_top_bits_of_its_product_with_the_seed() {
        for key in [0u64, 1, 2, 1_000, u64::MAX] {
            for bits in 1..=6 {
                let count = 1 << bits;
                let top_bits = key.wrapping_mul(SEED) >> (64 - bits);
                assert_eq!(shard_of(&key, count), top_bits as usize, "{key}, {count}");
            }
        }
    }

    #[test]
    fn keys_spread_over_every_shard_and_a_key_stays_in_one() {
        for count in [2, 8, 64] {
            let mut keys_in = vec![0usize; count];
            for key in 0..count as u64 * 100 {
                let shard = shard_of(&key, count);
                assert_eq!(shard, shard_of(&key, count));
                keys_in[shard] += 1;
            }
            // 100 keys a shard on average: none empty, none with half again.
            for (shard, &keys) in keys_in.iter().enumerate() {
                assert!(
                    (1..150).contains(&keys),
                    "{count} shards: shard {shard} has {keys}"
                );
            }
            let mut strings_in = vec![0usize; count];
            for key in 0..count * 100 {
                strings_in[shard_of(format!("tenant-{key}").as_str(), count)] += 1;
            }
            assert!(strings_in.iter().all(|&keys| keys > 0), "{strings_in:?}");
        }
    }
}

//! Which of the keys' shards holds a key: the keys are spread over
//! several maps, each behind its own lock, so that calls of different keys
//! on different cores do not all write one lock's word.

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

/// The shard of a key whose hash (the maps' own, computed once as a call
/// comes in) is `hash`, of `count` (a power of two).
///
/// Bits 32 and up: a shard's map places its keys by the low bits of the
/// same hash, and tells them apart within a group by the top seven, so
/// that the bits that pick the shard, alike for every key in it, are
/// neither of those.
#[inline(always)]
pub(crate) fn shard_of(hash: u64, count: usize) -> usize {
    debug_assert!(count.is_power_of_two() && count <= MAX_SHARDS);
    (hash >> 32) as usize & (count - 1)
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

    /// Keys spread over every shard by the maps' own hash, and within a
    /// shard over the low bits and the top seven as before (see
    /// `shard_of`).
    #[test]
    fn keys_spread_over_every_shard_by_the_maps_hash() {
        use std::hash::BuildHasher;
        let hasher = std::collections::hash_map::RandomState::new();
        for count in [2, 8, 64] {
            let mut keys_in = vec![0usize; count];
            let mut low_and_top = std::collections::HashSet::new();
            for key in 0..count as u64 * 100 {
                let hash = hasher.hash_one(key);
                let shard = shard_of(hash, count);
                keys_in[shard] += 1;
                if shard == 0 {
                    low_and_top.insert((hash & 0xff, hash >> 57));
                }
            }
            // 100 keys a shard on average: none empty, none with half again.
            for (shard, &keys) in keys_in.iter().enumerate() {
                assert!(
                    (1..150).contains(&keys),
                    "{count} shards: shard {shard} has {keys}"
                );
            }
            assert!(low_and_top.len() > keys_in[0] / 2, "{count} shards");
            let mut strings_in = vec![0usize; count];
            for key in 0..count * 100 {
                strings_in[shard_of(hasher.hash_one(format!("tenant-{key}")), count)] += 1;
            }
            assert!(strings_in.iter().all(|&keys| keys > 0), "{strings_in:?}");
        }
    }
}

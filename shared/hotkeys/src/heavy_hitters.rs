//! The sketch the request threads share: Space-Saving tables, one per shard, each behind its own
//! lock.
//!
//! A key always hashes to the same shard, so each key is counted in exactly one table and the
//! union of the tables is the sketch: nothing is merged across shards, and every bound of
//! `space_saving` holds per shard, with N the draws into that shard and k the capacity per shard.

use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::{Mutex, MutexGuard};

use crate::config::{HotKeysConfig, HotKeysConfigError};
use crate::decay::{Decay, InvalidDecayFactor};
use crate::space_saving::{HotKey, SpaceSaving};

/// A bounded count of the most frequent keys of a stream, recorded from many threads.
///
/// `record` locks one shard for a hash-map lookup and a few heap steps; `decay`, `top`, `len`
/// and `untracked_bound` lock each shard in turn, briefly. No lock is ever held while another is
/// taken, and none across an `.await` (there is none in this crate).
pub struct HeavyHitters<K> {
    shards: Box<[Shard<K>]>,
    /// `shards.len() − 1`: the shard count is a power of two, so a mask picks the shard.
    shard_mask: usize,
    capacity_per_shard: usize,
}

/// One shard on a cache line pair of its own (128 bytes covers the adjacent-line prefetch of
/// x86 and the 128-byte lines of some ARM cores), so two threads recording into neighbouring
/// shards do not invalidate each other's lines.
#[repr(align(128))]
struct Shard<K> {
    table: Mutex<SpaceSaving<K>>,
}

impl<K: Copy + Eq + Hash> Shard<K> {
    /// The shard's table. A panic while the lock was held (only a `Hash` or `Eq` of `K` that
    /// panics could cause one: nothing else in a table's update panics, and a failed allocation
    /// aborts) may have left the table half updated, so a poisoned table is emptied before it is
    /// used again. Its counts are estimates that the traffic rebuilds; a broken heap would not
    /// be.
    fn lock(&self) -> MutexGuard<'_, SpaceSaving<K>> {
        match self.table.lock() {
            Ok(table) => table,
            Err(poisoned) => {
                let mut table = poisoned.into_inner();
                table.clear();
                self.table.clear_poison();
                table
            }
        }
    }
}

impl<K: Copy + Eq + Hash + Send + 'static> HeavyHitters<K> {
    /// An empty sketch, every counter reserved up front (some 150 bytes a counter for a 24-byte
    /// key), so that filling the tables does not grow them under their locks.
    pub fn new(config: HotKeysConfig) -> Result<Self, HotKeysConfigError> {
        config.validate()?;
        let capacity_per_shard = config.capacity_per_shard();
        let shards = (0..config.shards)
            .map(|_| Shard {
                table: Mutex::new(SpaceSaving::new(capacity_per_shard)),
            })
            .collect();
        Ok(Self {
            shards,
            shard_mask: config.shards - 1,
            capacity_per_shard,
        })
    }

    /// Counts one draw of `key`: called for every answered request.
    pub fn record(&self, key: K) {
        self.shard_of(&key).lock().record(key);
    }

    /// Multiplies every count and error by `factor`, in (0, 1], so that old traffic fades: call
    /// it on a schedule with `0.5^(elapsed / half_life)`. Counts are rounded down and errors up,
    /// so the bounds of [`HotKey`] still hold against the true counts decayed (and rounded down)
    /// alike; keys whose count reaches 0 are dropped.
    pub fn decay(&self, factor: f64) -> Result<(), InvalidDecayFactor> {
        let decay = Decay::new(factor)?;
        for shard in &self.shards {
            shard.lock().decay(decay);
        }
        Ok(())
    }

    /// The `n` keys with the largest counts, largest first; of equal counts, the smaller error
    /// first. Each shard is read under its lock in turn, so the list is not one instant's picture
    /// while records go on, which an estimate does not need.
    pub fn top(&self, n: usize) -> Vec<HotKey<K>> {
        if n == 0 {
            return Vec::new();
        }
        let mut keys = Vec::with_capacity(self.capacity());
        for shard in &self.shards {
            keys.extend(shard.lock().hot_keys());
        }
        let largest_first =
            |a: &HotKey<K>, b: &HotKey<K>| b.count.cmp(&a.count).then(a.error.cmp(&b.error));
        if keys.len() > n {
            keys.select_nth_unstable_by(n - 1, largest_first);
            keys.truncate(n);
        }
        keys.sort_by(largest_first);
        keys
    }

    /// The most draws a key not tracked at all can have had (decayed): the largest minimum of
    /// the full shards, 0 while no shard is full. A key missing from `top(n)` had at most the
    /// larger of this and the last listed count — what a merge of several instances' lists
    /// counts for an instance that did not list a key.
    pub fn untracked_bound(&self) -> u64 {
        self.shards
            .iter()
            .map(|shard| shard.lock().untracked_bound())
            .max()
            .unwrap_or(0)
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters in all: the configured capacity rounded up to a multiple of the shard count.
    pub fn capacity(&self) -> usize {
        self.capacity_per_shard * self.shards.len()
    }

    fn shard_of(&self, key: &K) -> &Shard<K> {
        &self.shards[self.shard_index(key)]
    }

    fn shard_index(&self, key: &K) -> usize {
        let hash = BuildHasherDefault::<ShardHasher>::default().hash_one(key);
        hash as usize & self.shard_mask
    }
}

impl<K> fmt::Debug for HeavyHitters<K> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("HeavyHitters")
            .field("shards", &self.shards.len())
            .field("capacity_per_shard", &self.capacity_per_shard)
            .finish_non_exhaustive()
    }
}

/// Picks a key's shard: FxHash's multiply-rotate step over the key's words, finished with
/// MurmurHash3's 64-bit mixer so that the low bits the mask keeps depend on every input bit.
/// Cheap (a few multiplications for a 24-byte key) and fixed rather than seeded: the worst a
/// client choosing keys can do is crowd one shard, which costs that shard's small keys their
/// place and nothing else. The tables' own index keeps std's seeded hasher.
#[derive(Debug, Default)]
struct ShardHasher {
    state: u64,
}

impl ShardHasher {
    const MULTIPLIER: u64 = 0x517c_c1b7_2722_0a95;

    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(Self::MULTIPLIER);
    }
}

impl Hasher for ShardHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.add(u64::from(value));
    }

    fn write_u16(&mut self, value: u16) {
        self.add(u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.add(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        let mut mixed = self.state;
        mixed ^= mixed >> 33;
        mixed = mixed.wrapping_mul(0xff51_afd7_ed55_8ccd);
        mixed ^= mixed >> 33;
        mixed = mixed.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        mixed ^ (mixed >> 33)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::cmp::Reverse;
    use std::collections::{HashMap, HashSet};
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::Arc;

    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use rand_distr::{Distribution, Zipf};
    use rebate_domain::{ItemId, ItemKey, Platform};

    use super::*;

    fn sketch<K: Copy + Eq + Hash + Send + 'static>(
        capacity: usize,
        shards: usize,
    ) -> HeavyHitters<K> {
        HeavyHitters::new(HotKeysConfig { capacity, shards }).unwrap()
    }

    fn assert_invariants<K: Copy + Eq + Hash + Send + 'static>(hitters: &HeavyHitters<K>) {
        for shard in &hitters.shards {
            shard.lock().assert_invariants();
        }
    }

    fn count_of<K: Copy + Eq + Hash + Send + 'static>(
        hitters: &HeavyHitters<K>,
        key: K,
    ) -> Option<HotKey<K>> {
        hitters
            .top(hitters.capacity())
            .into_iter()
            .find(|hot| hot.key == key)
    }

    #[test]
    fn an_invalid_config_is_refused() {
        let refused = HeavyHitters::<u32>::new(HotKeysConfig {
            capacity: 10,
            shards: 3,
        });
        assert_eq!(
            refused.unwrap_err(),
            HotKeysConfigError::ShardsNotPowerOfTwo(3)
        );
    }

    #[test]
    fn capacity_is_rounded_up_to_whole_shards() {
        let hitters = sketch::<u32>(100, 16);
        assert_eq!(hitters.capacity(), 112);
        assert!(hitters.is_empty());
    }

    #[test]
    fn counts_are_exact_while_fewer_keys_than_capacity() {
        let hitters = sketch::<u32>(4096, 16);
        // Key k drawn k times, interleaved: 1..=200 (200 keys; at most 256 in one shard, so no
        // shard can overflow).
        for round in 1..=200u32 {
            for key in round..=200 {
                hitters.record(key);
            }
        }
        assert_invariants(&hitters);
        assert_eq!(hitters.len(), 200);
        assert_eq!(hitters.untracked_bound(), 0);
        let top = hitters.top(200);
        for (rank, hot) in top.iter().enumerate() {
            assert_eq!(hot.key as usize, 200 - rank);
            assert_eq!(hot.count, u64::from(hot.key));
            assert_eq!(hot.error, 0);
        }
    }

    #[test]
    fn top_is_largest_first_and_at_most_n() {
        let hitters = sketch::<u32>(64, 4);
        for (key, times) in [(7, 30), (3, 20), (9, 10), (1, 5)] {
            for _ in 0..times {
                hitters.record(key);
            }
        }
        let keys: Vec<u32> = hitters.top(3).iter().map(|hot| hot.key).collect();
        assert_eq!(keys, [7, 3, 9]);
        assert_eq!(hitters.top(10).len(), 4);
        assert!(hitters.top(0).is_empty());
    }

    #[test]
    fn decay_halves_counts_and_keeps_the_order() {
        let hitters = sketch::<u32>(64, 4);
        for key in 1..=20u32 {
            for _ in 0..key * 4 {
                hitters.record(key);
            }
        }
        let before = hitters.top(20);
        hitters.decay(0.5).unwrap();
        assert_invariants(&hitters);
        let after = hitters.top(20);
        let halved: Vec<(u32, u64)> = before.iter().map(|hot| (hot.key, hot.count / 2)).collect();
        let read: Vec<(u32, u64)> = after.iter().map(|hot| (hot.key, hot.count)).collect();
        assert_eq!(read, halved);
    }

    #[test]
    fn decay_outside_zero_to_one_is_refused_and_changes_nothing() {
        let hitters = sketch::<u32>(64, 4);
        hitters.record(1);
        for factor in [0.0, -1.0, 1.5, f64::NAN] {
            assert!(hitters.decay(factor).is_err(), "{factor} was accepted");
        }
        assert_eq!(count_of(&hitters, 1).map(|hot| hot.count), Some(1));
    }

    #[test]
    fn the_bound_covers_untracked_keys() {
        let hitters = sketch::<u32>(1, 1);
        for key in [1, 1, 2] {
            hitters.record(key);
        }
        // Key 1 lost its counter to key 2 (count 3, error 2): it had 2 draws, the bound is 3.
        assert_eq!(
            hitters.top(5),
            [HotKey {
                key: 2,
                count: 3,
                error: 2
            }]
        );
        assert_eq!(hitters.untracked_bound(), 3);
    }

    #[test]
    fn concurrent_records_lose_no_count() {
        const THREADS: u32 = 4;
        const ROUNDS: u32 = 5_000;
        const KEYS: u32 = 100;
        let hitters = Arc::new(sketch::<u32>(4096, 16));
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let hitters = Arc::clone(&hitters);
                std::thread::spawn(move || {
                    for round in 0..ROUNDS {
                        hitters.record((round + thread) % KEYS);
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        let top = hitters.top(usize::MAX);
        assert_eq!(top.len(), KEYS as usize);
        let total: u64 = top.iter().map(|hot| hot.count).sum();
        assert_eq!(total, u64::from(THREADS * ROUNDS));
        for hot in top {
            assert_eq!(hot.count, u64::from(THREADS * ROUNDS / KEYS), "{hot:?}");
            assert_eq!(hot.error, 0);
        }
        assert_invariants(&hitters);
    }

    thread_local! {
        /// Hashes a `Touchy` key allows on this thread before one panics.
        static HASHES_LEFT: Cell<u32> = const { Cell::new(u32::MAX) };
    }

    /// A key whose `Hash` panics on demand, to poison a shard's lock from inside.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Touchy(u32);

    impl Hash for Touchy {
        fn hash<H: Hasher>(&self, state: &mut H) {
            let left = HASHES_LEFT.get();
            HASHES_LEFT.set(left.saturating_sub(1));
            assert!(left > 0, "hash refused");
            self.0.hash(state);
        }
    }

    #[test]
    fn a_panic_under_the_lock_empties_that_shard_and_recording_goes_on() {
        let hitters = sketch::<Touchy>(8, 1);
        for key in [1, 1, 2] {
            hitters.record(Touchy(key));
        }
        // The shard's hash passes, the table's index lookup panics with the lock held.
        HASHES_LEFT.set(1);
        let panicked = catch_unwind(AssertUnwindSafe(|| hitters.record(Touchy(3))));
        HASHES_LEFT.set(u32::MAX);
        assert!(panicked.is_err());
        assert!(hitters.shards[0].table.is_poisoned());

        hitters.record(Touchy(4));
        assert!(!hitters.shards[0].table.is_poisoned());
        assert_invariants(&hitters);
        assert_eq!(
            hitters.top(8),
            [HotKey {
                key: Touchy(4),
                count: 1,
                error: 0
            }]
        );
    }

    #[test]
    fn the_service_key_works() {
        let hitters = sketch::<ItemKey>(64, 4);
        let key = ItemKey::new(Platform::Jd, ItemId::from_u64(100_001));
        hitters.record(key);
        hitters.record(key);
        assert_eq!(
            hitters.top(1),
            [HotKey {
                key,
                count: 2,
                error: 0
            }]
        );
    }

    /// The Zipf exponent at which the top `top_count` of `n` ranks get `share` of the draws
    /// (bisection: the share grows with the exponent).
    fn exponent_for(n: usize, top_count: usize, share: f64) -> f64 {
        let top_share = |exponent: f64| {
            let weight = |rank: usize| (rank as f64).powf(-exponent);
            let top: f64 = (1..=top_count).map(weight).sum();
            let all: f64 = top + (top_count + 1..=n).map(weight).sum::<f64>();
            top / all
        };
        let (mut low, mut high) = (0.0_f64, 4.0_f64);
        for _ in 0..50 {
            let middle = (low + high) / 2.0;
            if top_share(middle) < share {
                low = middle;
            } else {
                high = middle;
            }
        }
        (low + high) / 2.0
    }

    /// 1,000,000 draws over 30,000 items, Zipf with the top 10 % getting 90 % of the draws
    /// (exponent ≈ 1.15), into the default sketch (4096 counters over 16 shards): at least 90
    /// of the true top 100 are in `top(100)`.
    #[test]
    fn finds_the_top_hundred_of_a_zipf_stream() {
        const ITEMS: usize = 30_000;
        const DRAWS: usize = 1_000_000;
        let exponent = exponent_for(ITEMS, ITEMS / 10, 0.9);
        assert!((1.1..1.2).contains(&exponent), "exponent {exponent}");
        let zipf = Zipf::new(ITEMS as f64, exponent).unwrap();
        let mut rng = SmallRng::seed_from_u64(0x0407_2026);
        let item = |rank: f64| ItemKey::new(Platform::Taobao, ItemId::from_u64(rank as u64));

        let hitters = HeavyHitters::new(HotKeysConfig::default()).unwrap();
        let mut truth: HashMap<ItemKey, u64> = HashMap::new();
        for _ in 0..DRAWS {
            let key = item(zipf.sample(&mut rng));
            hitters.record(key);
            *truth.entry(key).or_default() += 1;
        }

        let mut true_order: Vec<(ItemKey, u64)> = truth.into_iter().collect();
        true_order.sort_by_key(|(_, seen)| Reverse(*seen));
        let true_top: HashSet<ItemKey> = true_order[..100].iter().map(|(key, _)| *key).collect();
        let found = hitters
            .top(100)
            .iter()
            .filter(|hot| true_top.contains(&hot.key))
            .count();
        assert!(found >= 90, "only {found} of the true top 100 found");
        assert_invariants(&hitters);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Record(u16),
        Decay(f64),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            20 => (0u16..200).prop_map(Step::Record),
            20 => (0u16..12).prop_map(Step::Record),
            1 => (0.01f64..=1.0).prop_map(Step::Decay),
        ];
        proptest::collection::vec(step, 0..1500)
    }

    proptest! {
        /// Over random streams with decays, against true counts decayed alike: every tracked
        /// key's count − error ≤ true ≤ count, every untracked key within `untracked_bound`,
        /// and each shard's table consistent. Without decays, every key with more than
        /// N / k draws into its shard is tracked.
        #[test]
        fn the_space_saving_bounds_hold_per_shard(
            shards_log2 in 0u32..3,
            capacity_per_shard in 1usize..10,
            steps in steps(),
            with_decays in any::<bool>(),
        ) {
            let shards = 1usize << shards_log2;
            let hitters = sketch::<u16>(capacity_per_shard * shards, shards);
            let mut truth: HashMap<u16, u64> = HashMap::new();
            let mut decayed = false;
            for step in steps {
                match step {
                    Step::Record(key) => {
                        hitters.record(key);
                        *truth.entry(key).or_default() += 1;
                    }
                    Step::Decay(_) if !with_decays => {}
                    Step::Decay(factor) => {
                        hitters.decay(factor).unwrap();
                        let decay = Decay::new(factor).unwrap();
                        truth.values_mut().for_each(|seen| *seen = decay.scale_down(*seen));
                        decayed = true;
                    }
                }
            }
            assert_invariants(&hitters);

            let tracked: HashMap<u16, HotKey<u16>> = hitters
                .top(usize::MAX)
                .into_iter()
                .map(|hot| (hot.key, hot))
                .collect();
            for (key, &seen) in &truth {
                match tracked.get(key) {
                    Some(hot) => {
                        prop_assert!(hot.guaranteed() <= seen && seen <= hot.count, "{hot:?}, seen {seen}");
                    }
                    None => prop_assert!(seen <= hitters.untracked_bound(), "key {key} seen {seen}"),
                }
            }
            if !decayed {
                let mut draws_per_shard = vec![0u64; shards];
                for (key, &seen) in &truth {
                    draws_per_shard[hitters.shard_index(key)] += seen;
                }
                for (key, &seen) in &truth {
                    let draws = draws_per_shard[hitters.shard_index(key)];
                    if seen * capacity_per_shard as u64 > draws {
                        prop_assert!(tracked.contains_key(key), "key {key}: {seen} of {draws}");
                    }
                }
            }
        }
    }
}

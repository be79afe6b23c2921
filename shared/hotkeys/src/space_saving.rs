//! One Space-Saving table (Metwally, Agrawal, El Abbadi, "Efficient computation of frequent and
//! top-k elements in data streams", 2005): at most `capacity` counters, the smallest always at
//! hand.
//!
//! A tracked key's counter goes up by one. An untracked key takes over the counter with the
//! smallest count: its count becomes that minimum + 1 and its error that minimum, since the
//! newcomer may have been seen up to `minimum` times while it was not tracked. Hence, for a
//! stream of N draws into a table of k counters:
//! - the counts always add up to N, so the minimum is at most N / k;
//! - an untracked key was seen at most `minimum` times, so every key seen more than N / k times
//!   is tracked;
//! - a tracked key was seen between `count − error` and `count` times.
//!
//! # Layout of the table
//! Counters live in a dense `Vec` and never move while they are tracked (their index is their
//! *slot*); an index `HashMap` finds a key's slot, and a binary min-heap of slots orders them by
//! count, each counter remembering its heap position. Swapping two heap entries fixes up two
//! positions in the `Vec`, not in the map: a record hashes its key once, whatever the heap does.
//! Update is O(log k), the minimum is the heap's root.

use std::collections::HashMap;
use std::hash::Hash;

use serde::Serialize;

use crate::decay::Decay;

/// One tracked key as read from the sketch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HotKey<K> {
    pub key: K,
    /// Draws counted for the key (decayed): never below its true count.
    pub count: u64,
    /// How much of `count` may belong to keys this counter tracked before: the true count is
    /// at least `count − error`. Zero for a key tracked since its first draw (decayed alike).
    pub error: u64,
}

impl<K> HotKey<K> {
    /// The draws the key surely had: `count − error`.
    pub fn guaranteed(&self) -> u64 {
        self.count - self.error
    }
}

#[derive(Debug, Clone, Copy)]
struct Counter<K> {
    key: K,
    count: u64,
    /// At most `count`.
    error: u64,
    /// Where this counter's slot sits in the heap.
    heap_position: usize,
}

/// A Space-Saving table of at most `capacity` counters.
#[derive(Debug)]
pub(crate) struct SpaceSaving<K> {
    capacity: usize,
    /// The counters by slot; full once it holds `capacity` of them.
    counters: Vec<Counter<K>>,
    /// Slots, a binary min-heap by count: `heap[0]` is the smallest.
    heap: Vec<usize>,
    /// Each tracked key's slot. std's `RandomState` (SipHash with a per-process key), because
    /// the keys come from clients, who must not be able to pick keys that collide.
    slots: HashMap<K, usize>,
}

impl<K: Copy + Eq + Hash> SpaceSaving<K> {
    /// Reserves room for every counter up front, so that filling the table does not reallocate
    /// under the shard's lock.
    pub(crate) fn new(capacity: usize) -> Self {
        debug_assert!(capacity >= 1);
        Self {
            capacity,
            counters: Vec::with_capacity(capacity),
            heap: Vec::with_capacity(capacity),
            slots: HashMap::with_capacity(capacity),
        }
    }

    pub(crate) fn record(&mut self, key: K) {
        if let Some(&slot) = self.slots.get(&key) {
            let counter = &mut self.counters[slot];
            counter.count = counter.count.saturating_add(1);
            let position = counter.heap_position;
            self.sift_down(position);
        } else if self.counters.len() < self.capacity {
            self.track_new(key);
        } else {
            self.replace_minimum(key);
        }
    }

    /// Multiplies every count and error by the factor, and drops the counters that reach 0.
    pub(crate) fn decay(&mut self, decay: Decay) {
        for counter in &mut self.counters {
            counter.count = decay.scale_down(counter.count);
            counter.error = decay.scale_up(counter.error).min(counter.count);
        }
        // ⌊c × f⌋ is monotone in c: a parent's count not above its children's stays so, and the
        // heap needs no repair. So while any counter is at 0 the root is, and removing the
        // minimum until it is positive drops them all.
        //
        // Dropping them keeps the bounds: the minimum reached 0, and an untracked key was seen
        // at most the minimum's times, so (decayed alike) it was seen 0 times, as a key entering
        // a table with room (error 0) must have been.
        while self.minimum() == Some(0) {
            self.remove_minimum();
        }
    }

    pub(crate) fn clear(&mut self) {
        self.counters.clear();
        self.heap.clear();
        self.slots.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.counters.len()
    }

    /// The most draws an untracked key can have had: the smallest count once the table is full,
    /// 0 while it has room (a key then enters as soon as it is seen).
    pub(crate) fn untracked_bound(&self) -> u64 {
        if self.counters.len() < self.capacity {
            return 0;
        }
        self.minimum().unwrap_or(0)
    }

    /// Every tracked key, in no particular order.
    pub(crate) fn hot_keys(&self) -> impl Iterator<Item = HotKey<K>> + '_ {
        self.counters.iter().map(|counter| HotKey {
            key: counter.key,
            count: counter.count,
            error: counter.error,
        })
    }

    fn minimum(&self) -> Option<u64> {
        self.heap.first().map(|&slot| self.counters[slot].count)
    }

    fn track_new(&mut self, key: K) {
        let slot = self.counters.len();
        let position = self.heap.len();
        self.counters.push(Counter {
            key,
            count: 1,
            error: 0,
            heap_position: position,
        });
        self.heap.push(slot);
        self.slots.insert(key, slot);
        self.sift_up(position);
    }

    fn replace_minimum(&mut self, key: K) {
        let slot = self.heap[0];
        let evicted = self.counters[slot].key;
        self.slots.remove(&evicted);
        self.slots.insert(key, slot);
        let counter = &mut self.counters[slot];
        counter.key = key;
        counter.error = counter.count;
        counter.count = counter.count.saturating_add(1);
        self.sift_down(0);
    }

    fn remove_minimum(&mut self) {
        let slot = self.heap.swap_remove(0);
        if let Some(&moved_up) = self.heap.first() {
            self.counters[moved_up].heap_position = 0;
            self.sift_down(0);
        }
        let removed = self.counters.swap_remove(slot);
        self.slots.remove(&removed.key);
        // The last counter now fills the freed slot: point its heap entry and its key there.
        if let Some(moved) = self.counters.get(slot) {
            self.heap[moved.heap_position] = slot;
            self.slots.insert(moved.key, slot);
        }
    }

    fn count_at(&self, position: usize) -> u64 {
        self.counters[self.heap[position]].count
    }

    fn swap(&mut self, first: usize, second: usize) {
        self.heap.swap(first, second);
        self.counters[self.heap[first]].heap_position = first;
        self.counters[self.heap[second]].heap_position = second;
    }

    fn sift_up(&mut self, mut position: usize) {
        while position > 0 {
            let parent = (position - 1) / 2;
            if self.count_at(parent) <= self.count_at(position) {
                return;
            }
            self.swap(parent, position);
            position = parent;
        }
    }

    fn sift_down(&mut self, mut position: usize) {
        loop {
            let left = 2 * position + 1;
            if left >= self.heap.len() {
                return;
            }
            let right = left + 1;
            let smaller_child =
                if right < self.heap.len() && self.count_at(right) < self.count_at(left) {
                    right
                } else {
                    left
                };
            if self.count_at(position) <= self.count_at(smaller_child) {
                return;
            }
            self.swap(position, smaller_child);
            position = smaller_child;
        }
    }

    /// Panics unless the table is consistent: every slot in the heap once, heap order by count,
    /// positions and the index agreeing with the counters, errors within counts, within capacity.
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        let len = self.counters.len();
        assert!(
            len <= self.capacity,
            "{len} counters over capacity {}",
            self.capacity
        );
        assert_eq!(self.heap.len(), len, "heap and counters differ in length");
        assert_eq!(self.slots.len(), len, "index and counters differ in length");
        for (slot, counter) in self.counters.iter().enumerate() {
            assert_eq!(
                self.heap[counter.heap_position], slot,
                "slot {slot}'s heap position is stale"
            );
            assert_eq!(
                self.slots.get(&counter.key),
                Some(&slot),
                "slot {slot}'s key is not indexed to it"
            );
            assert!(
                counter.error <= counter.count,
                "slot {slot}: error over count"
            );
            assert!(counter.count > 0, "slot {slot}: a counter at 0 was kept");
        }
        for position in 1..len {
            let parent = (position - 1) / 2;
            assert!(
                self.count_at(parent) <= self.count_at(position),
                "heap order broken between positions {parent} and {position}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn count_of(table: &SpaceSaving<u32>, key: u32) -> Option<(u64, u64)> {
        table
            .hot_keys()
            .find(|hot| hot.key == key)
            .map(|hot| (hot.count, hot.error))
    }

    fn half() -> Decay {
        Decay::new(0.5).unwrap()
    }

    #[test]
    fn counts_are_exact_while_the_table_has_room() {
        let mut table = SpaceSaving::new(10);
        for (key, times) in [(1, 5), (2, 3), (3, 1)] {
            for _ in 0..times {
                table.record(key);
            }
        }
        table.assert_invariants();
        assert_eq!(count_of(&table, 1), Some((5, 0)));
        assert_eq!(count_of(&table, 2), Some((3, 0)));
        assert_eq!(count_of(&table, 3), Some((1, 0)));
        assert_eq!(table.len(), 3);
        assert_eq!(table.untracked_bound(), 0);
    }

    #[test]
    fn a_newcomer_takes_over_the_smallest_counter() {
        let mut table = SpaceSaving::new(2);
        for key in [1, 1, 1, 2, 2] {
            table.record(key);
        }
        table.record(3);
        table.assert_invariants();
        assert_eq!(
            count_of(&table, 2),
            None,
            "the smallest counter was evicted"
        );
        assert_eq!(count_of(&table, 3), Some((3, 2)), "min + 1, error min");
        assert_eq!(count_of(&table, 1), Some((3, 0)));
        assert_eq!(table.untracked_bound(), 3);
    }

    #[test]
    fn decay_halves_counts_and_keeps_their_order() {
        let mut table = SpaceSaving::new(8);
        for (key, times) in [(1, 40), (2, 21), (3, 10), (4, 3)] {
            for _ in 0..times {
                table.record(key);
            }
        }
        table.decay(half());
        table.assert_invariants();
        assert_eq!(count_of(&table, 1), Some((20, 0)));
        assert_eq!(count_of(&table, 2), Some((10, 0)));
        assert_eq!(count_of(&table, 3), Some((5, 0)));
        assert_eq!(count_of(&table, 4), Some((1, 0)));
    }

    #[test]
    fn decay_drops_the_counters_that_reach_zero() {
        let mut table = SpaceSaving::new(4);
        for key in [1, 1, 1, 1, 2, 3, 4] {
            table.record(key);
        }
        table.decay(half());
        table.assert_invariants();
        assert_eq!(table.len(), 1);
        assert_eq!(count_of(&table, 1), Some((2, 0)));
        // The room made is taken by new keys, exactly counted.
        table.record(5);
        assert_eq!(count_of(&table, 5), Some((1, 0)));
        table.assert_invariants();
    }

    #[test]
    fn decay_rounds_errors_up_and_within_the_count() {
        let mut table = SpaceSaving::new(1);
        for key in [1, 1, 1, 2] {
            table.record(key);
        }
        assert_eq!(count_of(&table, 2), Some((4, 3)));
        table.decay(Decay::new(0.3).unwrap());
        // ⌊1.2⌋ = 1, ⌈0.9⌉ = 1.
        assert_eq!(count_of(&table, 2), Some((1, 1)));
        table.assert_invariants();
    }

    #[test]
    fn clearing_empties_the_table() {
        let mut table = SpaceSaving::new(2);
        for key in [1, 2, 3] {
            table.record(key);
        }
        table.clear();
        table.assert_invariants();
        assert_eq!(table.len(), 0);
        table.record(4);
        assert_eq!(count_of(&table, 4), Some((1, 0)));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Record(u32),
        Decay(f64),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            30 => (0u32..40).prop_map(Step::Record),
            // A skewed stream too: small keys far more often.
            30 => (0u32..6).prop_map(Step::Record),
            1 => (0.01f64..=1.0).prop_map(Step::Decay),
        ];
        proptest::collection::vec(step, 0..600)
    }

    proptest! {
        /// The Space-Saving bounds and the table's invariants after any records and decays,
        /// against true counts decayed the same way.
        #[test]
        fn bounds_and_invariants_hold(
            capacity in 1usize..12,
            steps in steps(),
            with_decays in any::<bool>(),
        ) {
            let mut table = SpaceSaving::new(capacity);
            let mut truth: HashMap<u32, u64> = HashMap::new();
            let mut draws = 0u64;
            let mut decayed = false;
            for step in steps {
                match step {
                    Step::Record(key) => {
                        table.record(key);
                        *truth.entry(key).or_default() += 1;
                        draws += 1;
                    }
                    Step::Decay(_) if !with_decays => {}
                    Step::Decay(factor) => {
                        let decay = Decay::new(factor).unwrap();
                        table.decay(decay);
                        truth.values_mut().for_each(|seen| *seen = decay.scale_down(*seen));
                        decayed = true;
                    }
                }
                table.assert_invariants();
            }
            let tracked: HashMap<u32, HotKey<u32>> =
                table.hot_keys().map(|hot| (hot.key, hot)).collect();
            for (key, &seen) in &truth {
                match tracked.get(key) {
                    Some(hot) => {
                        prop_assert!(hot.guaranteed() <= seen, "{hot:?} guarantees more than {seen}");
                        prop_assert!(seen <= hot.count, "{hot:?} counts less than {seen}");
                    }
                    None => prop_assert!(
                        seen <= table.untracked_bound(),
                        "untracked key {key} seen {seen} times, bound {}", table.untracked_bound()
                    ),
                }
            }
            if !decayed {
                // The counts add up to the draws, and so every key with more than N / k draws is
                // tracked.
                let total: u64 = table.hot_keys().map(|hot| hot.count).sum();
                prop_assert_eq!(total, draws);
                for (key, &seen) in &truth {
                    if seen * capacity as u64 > draws {
                        prop_assert!(tracked.contains_key(key), "frequent key {key} untracked");
                    }
                }
            }
        }
    }
}

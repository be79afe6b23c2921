//! State per client key, bounded in count and forgotten after an idle spell: what the per-client
//! limits keep (this instance's buckets, and the fleet's leases in `rebate-guard`).
//!
//! Every request looks its key up, so the lookup is the cost that matters: a quick_cache
//! (sharded, S3-FIFO) read takes a shard's read lock and one atomic stamp, where moka's
//! bookkeeping (read-op channel, access-order deques, housekeeping on the caller's thread) took a
//! tenth of the service's CPU on the hot path. S3-FIFO also suits an edge that strangers can feed:
//! a flood of one-off keys passes through its small queue and does not push out the clients that
//! keep coming back.
//!
//! Idle keys are swept lazily: the first lookup after `idle / 4` has passed since the last sweep
//! removes every key unused for `idle` (one pass over at most `max_keys` entries, one shard locked
//! at a time). A key's state is thus dropped between `idle` and `1.25 × idle` after its last use,
//! or earlier when more than `max_keys` keys are live. `idle` can change while the map is in
//! use ([`KeyedSlots::set_idle`]); `max_keys` sizes the map and is fixed.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quick_cache::sync::Cache;

/// One key's state and when it was last looked up.
#[derive(Debug)]
pub struct Slot<V> {
    value: V,
    last_seen: AtomicU64,
}

impl<V> Deref for Slot<V> {
    type Target = V;

    fn deref(&self) -> &V {
        &self.value
    }
}

/// A bounded map from keys to shared state, each key forgotten after `idle` without a lookup.
#[derive(Debug)]
pub struct KeyedSlots<V> {
    slots: Cache<Arc<str>, Arc<Slot<V>>>,
    idle_nanos: AtomicU64,
    sweep_every_nanos: AtomicU64,
    /// Ticker nanoseconds at or after which the next lookup sweeps.
    next_sweep: AtomicU64,
}

impl<V> KeyedSlots<V> {
    /// At most `max_keys` keys (at least one), each forgotten after `idle` unused.
    pub fn new(max_keys: u64, idle: Duration) -> Self {
        let (idle_nanos, sweep_every_nanos) = idle_and_sweep_nanos(idle);
        Self {
            slots: Cache::new(usize::try_from(max_keys.max(1)).unwrap_or(usize::MAX)),
            idle_nanos: AtomicU64::new(idle_nanos),
            sweep_every_nanos: AtomicU64::new(sweep_every_nanos),
            next_sweep: AtomicU64::new(sweep_every_nanos),
        }
    }

    /// Forgets keys after `idle` unused from the next sweep on (the sweep already scheduled
    /// keeps its time). The keys tracked keep their state.
    pub fn set_idle(&self, idle: Duration) {
        let (idle_nanos, sweep_every_nanos) = idle_and_sweep_nanos(idle);
        self.idle_nanos.store(idle_nanos, Ordering::Relaxed);
        self.sweep_every_nanos
            .store(sweep_every_nanos, Ordering::Relaxed);
    }

    /// `key`'s slot at ticker time `now_nanos`, made by `make` on first sight (or after the key
    /// was forgotten). Sweeps idle keys first when a sweep is due.
    pub fn get_or_insert_with(
        &self,
        key: &str,
        now_nanos: u64,
        make: impl FnOnce() -> V,
    ) -> Arc<Slot<V>> {
        self.sweep_if_due(now_nanos);
        let slot = match self.slots.get(key) {
            Some(slot) => slot,
            None => {
                let made: Result<_, std::convert::Infallible> =
                    self.slots.get_or_insert_with(&Arc::<str>::from(key), || {
                        Ok(Arc::new(Slot {
                            value: make(),
                            last_seen: AtomicU64::new(now_nanos),
                        }))
                    });
                match made {
                    Ok(slot) => slot,
                    Err(never) => match never {},
                }
            }
        };
        // Racing lookups may store a slightly older time; a sweep then keeps the key for longer.
        if slot.last_seen.load(Ordering::Relaxed) < now_nanos {
            slot.last_seen.store(now_nanos, Ordering::Relaxed);
        }
        slot
    }

    /// `key`'s slot if it is tracked, without making one or stamping its use: an advisory look
    /// (a key nobody looked up is at its initial state, whatever that is for the caller).
    pub fn peek(&self, key: &str) -> Option<Arc<Slot<V>>> {
        self.slots.get(key)
    }

    /// Visits every key's value, as tracked when the visit reaches it: a key made meanwhile may
    /// or may not be visited. Takes each shard's read lock in turn, as a lookup does.
    pub fn for_each(&self, mut visit: impl FnMut(&V)) {
        for (_, slot) in self.slots.iter() {
            visit(&slot.value);
        }
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Removes every key unused for `idle` at `now_nanos`.
    pub fn forget_idle(&self, now_nanos: u64) {
        let idle = self.idle_nanos.load(Ordering::Relaxed);
        self.slots.retain(|_, slot| {
            now_nanos.saturating_sub(slot.last_seen.load(Ordering::Relaxed)) < idle
        });
    }

    fn sweep_if_due(&self, now_nanos: u64) {
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now_nanos < due {
            return;
        }
        let next = now_nanos.saturating_add(self.sweep_every_nanos.load(Ordering::Relaxed));
        // One caller sweeps; the others go on.
        if self
            .next_sweep
            .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.forget_idle(now_nanos);
        }
    }
}

/// `idle` in nanoseconds, and how often to sweep for it: every quarter of it.
fn idle_and_sweep_nanos(idle: Duration) -> (u64, u64) {
    let idle_nanos = u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX);
    (idle_nanos, (idle_nanos / 4).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_key_keeps_its_slot_while_used() {
        let slots = KeyedSlots::new(100, Duration::from_secs(60));
        let first = slots.get_or_insert_with("app-1", SECOND, || AtomicU64::new(7));
        first.fetch_add(1, Ordering::Relaxed);
        let again = slots.get_or_insert_with("app-1", 2 * SECOND, || AtomicU64::new(0));
        assert_eq!(again.load(Ordering::Relaxed), 8, "the same slot");
        let other = slots.get_or_insert_with("h5-2", 2 * SECOND, || AtomicU64::new(0));
        assert_eq!(other.load(Ordering::Relaxed), 0);
        assert_eq!(slots.len(), 2);
    }

    #[test]
    fn idle_keys_are_forgotten_at_the_next_sweep_and_used_ones_kept() {
        let slots = KeyedSlots::new(100, Duration::from_secs(60));
        slots.get_or_insert_with("quiet", SECOND, || 1u32);
        slots.get_or_insert_with("busy", SECOND, || 2u32);
        // "busy" is used every 10 s; sweeps are due every 15 s.
        let mut now = SECOND;
        while now < 80 * SECOND {
            now += 10 * SECOND;
            slots.get_or_insert_with("busy", now, || 0u32);
        }
        assert_eq!(slots.len(), 1, "quiet was unused for 80 s");
        assert_eq!(**slots.get_or_insert_with("busy", now, || 0u32), 2);
        assert_eq!(
            **slots.get_or_insert_with("quiet", now, || 3u32),
            3,
            "made anew"
        );
    }

    #[test]
    fn no_sweep_before_a_quarter_of_idle() {
        let slots = KeyedSlots::new(100, Duration::from_secs(60));
        slots.get_or_insert_with("a", 0, || ());
        // Idle for 61 s but the first sweep is due at 15 s: it runs at the lookup at 61 s.
        slots.get_or_insert_with("b", 14 * SECOND, || ());
        assert_eq!(slots.len(), 2);
        slots.get_or_insert_with("b", 61 * SECOND, || ());
        assert_eq!(slots.len(), 1);
    }

    #[test]
    fn a_shorter_idle_applies_from_the_next_sweep_and_keeps_the_keys_in_use() {
        let slots = KeyedSlots::new(100, Duration::from_secs(60));
        slots.get_or_insert_with("quiet", SECOND, || 1u32);
        slots.get_or_insert_with("busy", SECOND, || 2u32);
        slots.set_idle(Duration::from_secs(8));
        // The sweep scheduled for 15 s still runs then; from it on, every 2 s.
        slots.get_or_insert_with("busy", 14 * SECOND, || 0u32);
        assert_eq!(slots.len(), 2);
        slots.get_or_insert_with("busy", 16 * SECOND, || 0u32);
        assert_eq!(
            slots.len(),
            1,
            "quiet was unused for 15 s, over the new 8 s"
        );
        assert_eq!(**slots.get_or_insert_with("busy", 17 * SECOND, || 0u32), 2);
    }

    #[test]
    fn every_key_is_visited() {
        let slots = KeyedSlots::new(100, Duration::from_secs(60));
        for n in 0..10u64 {
            slots.get_or_insert_with(&format!("key-{n}"), SECOND, || AtomicU64::new(n));
        }
        let mut sum = 0;
        slots.for_each(|value| sum += value.load(Ordering::Relaxed));
        assert_eq!(sum, 45);
    }

    #[test]
    fn a_peek_neither_makes_nor_keeps_a_key() {
        let slots = KeyedSlots::new(100, Duration::from_secs(60));
        assert!(slots.peek("viral").is_none());
        assert!(slots.is_empty(), "peeking made no slot");
        slots.get_or_insert_with("viral", SECOND, || 5u32);
        assert_eq!(slots.peek("viral").map(|slot| **slot), Some(5));
        // Peeks do not count as use: the key is forgotten 60 s after its last lookup.
        slots.peek("viral");
        slots.get_or_insert_with("other", 62 * SECOND, || 0u32);
        assert!(slots.peek("viral").is_none());
    }

    #[test]
    fn the_count_stays_bounded_whatever_keys_arrive() {
        let slots = KeyedSlots::new(1_000, Duration::from_secs(300));
        for n in 0..50_000u64 {
            slots.get_or_insert_with(&format!("stranger-{n}"), SECOND, || n);
        }
        assert!(slots.len() <= 1_000, "{} keys", slots.len());
    }

    #[test]
    fn regulars_survive_a_flood_of_one_off_keys() {
        let slots = KeyedSlots::new(1_000, Duration::from_secs(300));
        let regulars: Vec<String> = (0..100).map(|n| format!("regular-{n}")).collect();
        for regular in &regulars {
            slots.get_or_insert_with(regular, SECOND, || 1u8);
        }
        for round in 0..20u64 {
            for regular in &regulars {
                slots.get_or_insert_with(regular, SECOND, || 0u8);
            }
            for n in 0..1_000u64 {
                slots.get_or_insert_with(&format!("stranger-{round}-{n}"), SECOND, || 0u8);
            }
        }
        let kept = regulars
            .iter()
            .filter(|regular| **slots.get_or_insert_with(regular, SECOND, || 0u8) == 1)
            .count();
        assert!(kept >= 90, "only {kept} of 100 regulars kept their state");
    }
}

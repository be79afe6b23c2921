//! A bound on concurrent calls to one dependency that fails at once when full.
//!
//! Queueing in front of a slow dependency only turns its slowness into ours: when every slot is
//! taken the caller degrades immediately (stale data or template text) instead of waiting.
//!
//! The bound can change while calls are in flight ([`Bulkhead::resize`]): it is one atomic the
//! acquiring caller reads, so nothing held is revoked and nothing is rebuilt.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bulkhead {name} is full ({max} calls in flight)")]
pub struct BulkheadFull {
    pub name: &'static str,
    pub max: u32,
}

#[derive(Debug)]
pub struct Bulkhead {
    name: &'static str,
    /// The bound in force; one relaxed load per acquisition.
    max: AtomicU32,
    in_flight: AtomicU32,
    peak: AtomicU32,
    rejected: AtomicU64,
}

impl Bulkhead {
    /// A bulkhead of `max` concurrent calls (at least 1).
    pub fn new(name: &'static str, max: u32) -> Self {
        Self {
            name,
            max: AtomicU32::new(max.max(1)),
            in_flight: AtomicU32::new(0),
            peak: AtomicU32::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn max(&self) -> u32 {
        self.max.load(Ordering::Relaxed)
    }

    /// Changes the bound to `max` (at least 1) in place. The permits held stay valid: above the
    /// new bound, acquisitions are refused until enough of them are released to get below it.
    pub fn resize(&self, max: u32) {
        self.max.store(max.max(1), Ordering::Relaxed);
    }

    /// A slot for one call, held until the permit drops.
    pub fn try_acquire(&self) -> Result<BulkheadPermit<'_>, BulkheadFull> {
        let max = self.max();
        let mut current = self.in_flight.load(Ordering::Relaxed);
        loop {
            if current >= max {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(BulkheadFull {
                    name: self.name,
                    max,
                });
            }
            match self.in_flight.compare_exchange_weak(
                current,
                current + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        self.peak.fetch_max(current + 1, Ordering::Relaxed);
        Ok(BulkheadPermit { bulkhead: self })
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> BulkheadSnapshot {
        BulkheadSnapshot {
            name: self.name,
            max: self.max(),
            in_flight: self.in_flight(),
            peak: self.peak.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }
}

/// One occupied slot; dropping it frees the slot.
#[must_use = "the slot is freed when the permit drops"]
#[derive(Debug)]
pub struct BulkheadPermit<'a> {
    bulkhead: &'a Bulkhead,
}

impl Drop for BulkheadPermit<'_> {
    fn drop(&mut self) {
        self.bulkhead.in_flight.fetch_sub(1, Ordering::Release);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BulkheadSnapshot {
    pub name: &'static str,
    pub max: u32,
    pub in_flight: u32,
    /// The most calls ever in flight at once.
    pub peak: u32,
    pub rejected: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn fails_at_once_when_full_and_frees_on_drop() {
        let bulkhead = Bulkhead::new("coupon", 2);
        let first = bulkhead.try_acquire().unwrap();
        let _second = bulkhead.try_acquire().unwrap();
        assert_eq!(
            bulkhead.try_acquire().unwrap_err(),
            BulkheadFull {
                name: "coupon",
                max: 2
            }
        );
        drop(first);
        assert!(bulkhead.try_acquire().is_ok());
        let snapshot = bulkhead.snapshot();
        assert_eq!(
            (snapshot.in_flight, snapshot.peak, snapshot.rejected),
            (1, 2, 1)
        );
    }

    #[test]
    fn a_resize_keeps_the_permits_held_and_refuses_until_below_the_new_bound() {
        let bulkhead = Bulkhead::new("coupon", 4);
        let mut held: Vec<_> = (0..4).map(|_| bulkhead.try_acquire().unwrap()).collect();
        bulkhead.resize(2);
        assert_eq!(bulkhead.snapshot().max, 2);
        assert_eq!(bulkhead.in_flight(), 4, "nothing in flight is dropped");
        assert_eq!(
            bulkhead.try_acquire().unwrap_err(),
            BulkheadFull {
                name: "coupon",
                max: 2
            }
        );
        held.truncate(2);
        assert!(bulkhead.try_acquire().is_err(), "2 in flight of 2");
        held.pop();
        held.push(bulkhead.try_acquire().expect("1 in flight of 2"));

        bulkhead.resize(3);
        held.push(
            bulkhead
                .try_acquire()
                .expect("the larger bound applies at once"),
        );
        assert!(bulkhead.try_acquire().is_err());
        drop(held);
        bulkhead.resize(0);
        assert_eq!(bulkhead.max(), 1, "at least one slot");
        let snapshot = bulkhead.snapshot();
        assert_eq!(
            (snapshot.in_flight, snapshot.peak, snapshot.rejected),
            (0, 4, 3)
        );
    }

    #[test]
    fn concurrent_callers_never_exceed_the_bound() {
        let bulkhead = Arc::new(Bulkhead::new("mysql", 3));
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (bulkhead, inside, most) = (bulkhead.clone(), inside.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Ok(_permit) = bulkhead.try_acquire() {
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            inside.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert_eq!(bulkhead.in_flight(), 0);
    }
}

//! [`ItemFilter`]: a Bloom filter over every item key that exists, the first gate of a query.
//!
//! An id the filter has never seen cannot exist, so it is answered "not found" before any cache
//! tier or the store is asked (cache penetration). The filter fails *open*: until the first build
//! finishes, and whenever it is not ready, every key passes and the not-found cache takes over.
//! It is rebuilt from the store periodically (deletions, drift) and items created in between are
//! added as their events arrive; keys inserted while a rebuild runs are carried into the new
//! filter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use bloomfilter::Bloom;
use futures::{Stream, StreamExt};
use rebate_domain::ItemKey;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum FilterError {
    #[error("false-positive rate {0} must be within 0.000001 and 0.1")]
    BadRate(f64),
    #[error("expected item count must be at least 1")]
    NoCapacity,
}

/// What one build did, for logs and the start-up measurement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BuildReport {
    pub keys: u64,
    pub capacity: u64,
    pub elapsed: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FilterStats {
    pub ready: bool,
    pub keys: u64,
    pub checks: u64,
    pub rejections: u64,
}

#[derive(Debug)]
pub struct ItemFilter {
    false_positive_rate: f64,
    expected_items: u64,
    bloom: RwLock<Option<Bloom<ItemKey>>>,
    /// Keys inserted while a rebuild streams the store; `None` when no rebuild runs.
    pending: Mutex<Option<Vec<ItemKey>>>,
    keys: AtomicU64,
    checks: AtomicU64,
    rejections: AtomicU64,
    /// Wakes the rebuild loop early ([`ItemFilter::request_rebuild`]).
    rebuild_requested: tokio::sync::Notify,
}

impl ItemFilter {
    /// Asks whoever maintains the filter to rebuild it now rather than at its next interval:
    /// after `item_created` events may have been missed, their keys are known only to the store.
    pub fn request_rebuild(&self) {
        self.rebuild_requested.notify_one();
    }

    /// Completes when a rebuild was requested since the last call.
    pub async fn rebuild_requested(&self) {
        self.rebuild_requested.notified().await;
    }

    /// An empty, not-yet-ready filter (every key passes until [`ItemFilter::rebuild`] finishes).
    pub fn new(false_positive_rate: f64, expected_items: u64) -> Result<Self, FilterError> {
        if !(0.000_001..=0.1).contains(&false_positive_rate) {
            return Err(FilterError::BadRate(false_positive_rate));
        }
        if expected_items == 0 {
            return Err(FilterError::NoCapacity);
        }
        Ok(Self {
            false_positive_rate,
            expected_items,
            bloom: RwLock::new(None),
            pending: Mutex::new(None),
            keys: AtomicU64::new(0),
            checks: AtomicU64::new(0),
            rejections: AtomicU64::new(0),
            rebuild_requested: tokio::sync::Notify::new(),
        })
    }

    /// False only when the key certainly does not exist.
    pub fn might_contain(&self, key: &ItemKey) -> bool {
        self.checks.fetch_add(1, Ordering::Relaxed);
        let bloom = self.bloom.read().unwrap_or_else(PoisonError::into_inner);
        let passes = bloom.as_ref().is_none_or(|bloom| bloom.check(key));
        if !passes {
            self.rejections.fetch_add(1, Ordering::Relaxed);
        }
        passes
    }

    /// Records a newly created item.
    pub fn insert(&self, key: ItemKey) {
        if let Some(pending) = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            pending.push(key);
        }
        let mut bloom = self.bloom.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(bloom) = bloom.as_mut() {
            bloom.set(&key);
            self.keys.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn is_ready(&self) -> bool {
        self.bloom
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    pub fn stats(&self) -> FilterStats {
        FilterStats {
            ready: self.is_ready(),
            keys: self.keys.load(Ordering::Relaxed),
            checks: self.checks.load(Ordering::Relaxed),
            rejections: self.rejections.load(Ordering::Relaxed),
        }
    }

    /// Builds a new filter from `keys` and swaps it in. The old filter (or fail-open) serves
    /// meanwhile; on a stream error the old state stays and the error is returned.
    #[expect(
        clippy::disallowed_methods,
        reason = "the build's duration is reported, nothing depends on it"
    )]
    pub async fn rebuild<E>(
        &self,
        keys: impl Stream<Item = Result<ItemKey, E>>,
    ) -> Result<BuildReport, E> {
        let started = Instant::now();
        // Size for the larger of the configured count and what the last build saw, with room
        // to grow: an overfull filter quietly loses its false-positive guarantee.
        let seen = self.keys.load(Ordering::Relaxed);
        let capacity = self.expected_items.max(seen.saturating_mul(5) / 4);
        let mut bloom = Bloom::new_for_fp_rate(
            usize::try_from(capacity).unwrap_or(usize::MAX),
            self.false_positive_rate,
        )
        .expect("rate and capacity were validated at construction");
        *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(Vec::new());
        let mut count = 0u64;
        let mut keys = std::pin::pin!(keys);
        while let Some(key) = keys.next().await {
            match key {
                Ok(key) => {
                    bloom.set(&key);
                    count += 1;
                }
                Err(error) => {
                    *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    return Err(error);
                }
            }
        }
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            for key in pending.take().unwrap_or_default() {
                bloom.set(&key);
                count += 1;
            }
            *self.bloom.write().unwrap_or_else(PoisonError::into_inner) = Some(bloom);
        }
        self.keys.store(count, Ordering::Relaxed);
        if count > capacity {
            tracing::warn!(
                count,
                capacity,
                "bloom filter holds more keys than it was sized for; the next rebuild grows it"
            );
        }
        Ok(BuildReport {
            keys: count,
            capacity,
            elapsed: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebate_domain::{ItemId, Platform};

    #[tokio::test]
    async fn a_requested_rebuild_wakes_the_maintainer_once() {
        let filter = ItemFilter::new(0.01, 100).unwrap();
        filter.request_rebuild();
        tokio::time::timeout(Duration::from_secs(1), filter.rebuild_requested())
            .await
            .expect("the request is kept until the maintainer waits");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), filter.rebuild_requested())
                .await
                .is_err(),
            "one request, one wake-up"
        );
    }

    fn key(id: u64) -> ItemKey {
        ItemKey::new(Platform::Jd, ItemId::from_u64(id))
    }

    fn existing() -> impl Stream<Item = Result<ItemKey, std::convert::Infallible>> {
        futures::stream::iter((0..10_000).map(|id| Ok(key(id))))
    }

    #[tokio::test]
    async fn fails_open_until_built_then_rejects_unknown_keys() {
        let filter = ItemFilter::new(0.001, 10_000).unwrap();
        assert!(filter.might_contain(&key(50_000_000)));
        let report = filter.rebuild(existing()).await.unwrap();
        assert_eq!(report.keys, 10_000);
        assert!((0..10_000).all(|id| filter.might_contain(&key(id))));
        let passed = (1_000_000..1_100_000)
            .filter(|id| filter.might_contain(&key(*id)))
            .count();
        // 100,000 unknown ids at a 0.1 % rate: about 100 pass; 300 would be far off.
        assert!(passed < 300, "{passed} false positives");
        assert_eq!(filter.stats().rejections as usize, 100_000 - passed);
    }

    #[tokio::test]
    async fn created_items_pass_and_survive_a_rebuild_that_missed_them() {
        let filter = ItemFilter::new(0.001, 10_000).unwrap();
        filter.rebuild(existing()).await.unwrap();
        filter.insert(key(77_777_777));
        assert!(filter.might_contain(&key(77_777_777)));
        // A key created while a rebuild streams an older snapshot is carried over.
        let slow =
            futures::stream::iter((0..10_000).map(|id| Ok::<_, std::convert::Infallible>(key(id))))
                .then(|item| async move {
                    tokio::task::yield_now().await;
                    item
                });
        let rebuild = filter.rebuild(slow);
        let insert = async {
            tokio::task::yield_now().await;
            filter.insert(key(88_888_888));
        };
        let (report, ()) = tokio::join!(rebuild, insert);
        report.unwrap();
        assert!(filter.might_contain(&key(88_888_888)));
    }

    #[tokio::test]
    async fn a_failed_rebuild_keeps_the_old_filter() {
        let filter = ItemFilter::new(0.001, 100).unwrap();
        filter.rebuild(existing()).await.unwrap();
        let broken = futures::stream::iter(vec![Ok(key(1)), Err("store down")]);
        assert_eq!(filter.rebuild(broken).await.unwrap_err(), "store down");
        assert!(filter.might_contain(&key(9_999)));
        assert!(ItemFilter::new(0.5, 10).is_err());
        assert!(ItemFilter::new(0.01, 0).is_err());
    }
}

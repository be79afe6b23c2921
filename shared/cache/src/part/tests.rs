use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rebate_domain::{ItemId, ItemKey, PartKind, Platform, Timestamp};

use super::{
    CacheOutcome, FailureKind, L2Config, LoadFailure, Loaded, Loader, PartCache, PartCacheConfig,
};
use crate::clock::{Clock, ManualClock};
use crate::envelope::{Envelope, Jitter, TtlPolicy};
use crate::memory::MemoryTier;
use crate::part::view::PartView;
use crate::shared::{SharedTier, TierEntry, TierKey};

mod lifetimes;

/// An in-process source whose answers, latency and call count the test controls.
#[derive(Debug, Default)]
struct FakeSource {
    calls: AtomicU64,
    failing: AtomicBool,
    /// Says it is not ready (a spent quota) and refuses every load.
    refusing: AtomicBool,
    missing: AtomicBool,
    delay_ms: AtomicU64,
    version: AtomicU64,
    /// An item whose own share of loads is spent: not ready for it, and its loads refused.
    hot: std::sync::Mutex<Option<ItemKey>>,
}

impl FakeSource {
    fn is_hot(&self, key: ItemKey) -> bool {
        *self.hot.lock().unwrap() == Some(key)
    }
}

#[async_trait]
impl Loader<String> for FakeSource {
    async fn load(&self, key: ItemKey) -> Result<Loaded<String>, LoadFailure> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        // The row is "read" when the load starts; the delay models the trip back.
        let version = self.version.load(Ordering::SeqCst);
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.failing.load(Ordering::SeqCst) {
            return Err(LoadFailure::error("source down"));
        }
        if self.refusing.load(Ordering::SeqCst) {
            return Err(LoadFailure::new(FailureKind::Quota, "quota spent"));
        }
        if self.is_hot(key) {
            return Err(LoadFailure::new(FailureKind::HotItem, "item's loads spent"));
        }
        if self.missing.load(Ordering::SeqCst) {
            return Ok(Loaded {
                value: None,
                version: 0,
            });
        }
        Ok(Loaded {
            value: Some(format!("{key}#{call}")),
            version,
        })
    }

    fn ready(&self) -> bool {
        !self.refusing.load(Ordering::SeqCst)
    }

    fn ready_for(&self, key: ItemKey) -> bool {
        self.ready() && !self.is_hot(key)
    }
}

fn key() -> ItemKey {
    ItemKey::new(Platform::Taobao, ItemId::from_u64(100_001))
}

/// The values concurrent callers received; every one must have been answered with a value.
async fn answered_values(
    callers: Vec<tokio::task::JoinHandle<CacheOutcome<String>>>,
) -> Vec<String> {
    let mut values = Vec::new();
    for caller in callers {
        match caller.await.unwrap() {
            CacheOutcome::Loaded(envelope) | CacheOutcome::Hit(envelope) => {
                values.push(envelope.value.clone().unwrap());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    values
}

fn cache(source: &Arc<FakeSource>, clock: &ManualClock) -> PartCache<String> {
    let loader: Arc<dyn Loader<String>> = source.clone();
    PartCache::new(settings(), loader, Arc::new(clock.clone()))
}

fn settings() -> PartCacheConfig {
    PartCacheConfig {
        name: "test",
        part: PartKind::Rate,
        max_entries: 1_000,
        ttl: TtlPolicy {
            fresh: Duration::from_secs(60),
            jitter: Jitter::Ratio(0.1),
            stale: Duration::from_secs(600),
            not_found: Duration::from_secs(30),
        },
        load_timeout: Duration::from_secs(2),
        refresh_lead: Duration::ZERO,
        max_version_gap: 1_000_000,
    }
}

/// One "instance": its own L1 and its own view of the source, sharing `tier`.
fn instance(
    source: &Arc<FakeSource>,
    tier: &Arc<MemoryTier>,
    clock: &ManualClock,
) -> PartCache<String> {
    let loader: Arc<dyn Loader<String>> = source.clone();
    PartCache::with_shared_tier(
        settings(),
        l2_config(tier.clone()),
        loader,
        Arc::new(clock.clone()),
    )
}

/// The production profile's L2 lifetimes and lease timings over `tier`.
fn l2_config(tier: Arc<dyn SharedTier>) -> L2Config {
    L2Config {
        tier,
        ttl: TtlPolicy {
            fresh: Duration::from_secs(900),
            jitter: Jitter::UpTo(Duration::from_secs(300)),
            stale: Duration::from_secs(1800),
            not_found: Duration::from_secs(120),
        },
        lease_ttl: Duration::from_secs(3),
        lease_wait: Duration::from_millis(300),
        lease_poll: Duration::from_millis(10),
    }
}

fn tier_key() -> TierKey {
    TierKey {
        item: key(),
        part: PartKind::Rate,
    }
}

/// Two instances, 100 concurrent callers each, one cold key: the lease lets exactly one
/// instance ask the source; the other takes the winner's value from L2.
#[tokio::test]
async fn one_rebuild_per_key_across_instances() {
    let source = Arc::new(FakeSource::default());
    source.delay_ms.store(30, Ordering::SeqCst);
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let first = instance(&source, &tier, &clock);
    let second = instance(&source, &tier, &clock);
    let callers: Vec<_> = (0..200)
        .map(|index| {
            let cache = if index % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            };
            tokio::spawn(async move { cache.get(key(), BUDGET).await })
        })
        .collect();
    let values = answered_values(callers).await;
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    assert!(values.iter().all(|value| value == &values[0]));
    let (a, b) = (first.stats(), second.stats());
    assert_eq!(a.leases_won + b.leases_won, 1);
    assert_eq!(a.lease_waits_served + b.lease_waits_served, 1);
    assert_eq!(tier.version_of(tier_key()), Some(0));
}

#[tokio::test]
async fn a_cold_instance_fills_from_l2_without_the_source() {
    let source = Arc::new(FakeSource::default());
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let warm = instance(&source, &tier, &clock);
    warm.get(key(), BUDGET).await;
    // Let the background L2 write land.
    while tier.version_of(tier_key()).is_none() {
        tokio::task::yield_now().await;
    }
    let cold = instance(&source, &tier, &clock);
    assert!(matches!(
        cold.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    assert_eq!(cold.stats().l2_hits, 1);
    // The L1 copy is fresh for at most L1's TTL (66 s), though L2's lasts 15 min or more.
    let copy = cold.peek(&key()).unwrap();
    assert!(copy.fresh_until.millis_since(clock.now()) <= 66_000);
}

#[tokio::test]
async fn an_unreachable_l2_is_skipped() {
    let source = Arc::new(FakeSource::default());
    let tier = Arc::new(MemoryTier::new());
    tier.set_failing(true);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = instance(&source, &tier, &clock);
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Hit(_)
    ));
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    assert!(cache.stats().l2_errors >= 1);
}

#[tokio::test]
async fn a_stale_l2_copy_stands_in_when_the_source_fails() {
    let source = Arc::new(FakeSource::default());
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    instance(&source, &tier, &clock).get(key(), BUDGET).await;
    while tier.version_of(tier_key()).is_none() {
        tokio::task::yield_now().await;
    }
    source.failing.store(true, Ordering::SeqCst);
    // Past L2's fresh window (≤ 20 min), inside its stale window (+30 min).
    clock.advance(Duration::from_secs(1_300));
    let fresh_instance = instance(&source, &tier, &clock);
    match fresh_instance.get(key(), BUDGET).await {
        CacheOutcome::Stale(envelope, failure) => {
            assert_eq!(failure.kind, FailureKind::Error);
            assert_eq!(envelope.fetched_at, Timestamp::from_millis(0));
        }
        other => panic!("expected stale, got {other:?}"),
    }
}

/// An item whose own share of the source's loads is spent gets no rebuild lease either, while
/// the source stays ready for every other item: the hot item's miss costs one L2 read and is
/// refused as `hot_item`; another item leases and loads as usual.
#[tokio::test]
async fn no_lease_is_taken_for_an_item_whose_loads_are_spent() {
    let source = Arc::new(FakeSource::default());
    let hot = key();
    *source.hot.lock().unwrap() = Some(hot);
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = instance(&source, &tier, &clock);
    match cache.get(hot, BUDGET).await {
        CacheOutcome::Failed(failure) => assert_eq!(failure.kind, FailureKind::HotItem),
        other => panic!("expected the refusal, got {other:?}"),
    }
    let stats = cache.stats();
    assert_eq!((stats.leases_won, stats.leases_lost), (0, 0), "{stats:?}");
    assert_eq!(tier.round_trips(), 1, "the L2 read alone");

    let other = ItemKey::new(Platform::Taobao, ItemId::from_u64(100_002));
    assert!(matches!(
        cache.get(other, BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    assert_eq!(cache.stats().leases_won, 1, "the other item leased");
}

/// A source that would refuse (its quota spent) gets no rebuild lease: the miss costs one L2
/// read, not a lease taken and released, and the lease stays free for an instance that can load.
#[tokio::test]
async fn no_lease_is_taken_for_a_source_that_would_refuse() {
    let source = Arc::new(FakeSource::default());
    source.refusing.store(true, Ordering::SeqCst);
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let starved = instance(&source, &tier, &clock);
    match starved.get(key(), BUDGET).await {
        CacheOutcome::Failed(failure) => assert_eq!(failure.kind, FailureKind::Quota),
        other => panic!("expected the refusal, got {other:?}"),
    }
    let stats = starved.stats();
    assert_eq!((stats.leases_won, stats.leases_lost), (0, 0), "{stats:?}");
    assert_eq!(tier.round_trips(), 1, "the L2 read alone");
    assert_eq!(
        source.calls.load(Ordering::SeqCst),
        1,
        "refused at once, not waited on"
    );

    // Ready again: the next miss leases and loads as before.
    source.refusing.store(false, Ordering::SeqCst);
    assert!(matches!(
        starved.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    assert_eq!(starved.stats().leases_won, 1);
}

/// A rebuild that read the row before a change and finishes after the change's event was
/// processed: its early callers get what they asked for, nobody after the event sees it.
#[tokio::test(start_paused = true)]
async fn a_rebuild_racing_an_invalidation_never_serves_the_old_value_afterwards() {
    let source = Arc::new(FakeSource::default());
    source.version.store(1, Ordering::SeqCst);
    source.delay_ms.store(100, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    // The old load starts: it has "read" version 1.
    let early = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.get(key(), Duration::from_secs(1)).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The row changes to version 2 and the event is processed.
    source.version.store(2, Ordering::SeqCst);
    cache
        .invalidate_to(key(), 2, Duration::from_secs(60), false)
        .await
        .unwrap();
    // A caller after the event does not join the old load; it gets version 2.
    match cache.get(key(), Duration::from_secs(1)).await {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 2),
        other => panic!("expected a fresh load, got {other:?}"),
    }
    // The early caller got its version-1 answer, but L1 never took it.
    match early.await.unwrap() {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 1),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(cache.peek(&key()).unwrap().version, 2);
    for _ in 0..3 {
        match cache.get(key(), Duration::from_secs(1)).await {
            CacheOutcome::Hit(envelope) => assert_eq!(envelope.version, 2),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_old_or_duplicate_event_keeps_newer_data() {
    let source = Arc::new(FakeSource::default());
    source.version.store(5, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    cache.get(key(), BUDGET).await;
    for version in [4, 5] {
        cache
            .invalidate_to(key(), version, Duration::from_secs(60), false)
            .await
            .unwrap();
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Hit(_)
        ));
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    // A newer event fences it: the next read reloads, and a fence is never served stale.
    source.failing.store(true, Ordering::SeqCst);
    cache
        .invalidate_to(key(), 6, Duration::from_secs(60), false)
        .await
        .unwrap();
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Failed(_)
    ));
    assert_eq!(cache.stats().invalidations, 3);
}

/// The same change announced twice (an operator's event and the binlog's, at one version) while
/// the first event's reload is in flight: the second fence finds the first in L1 and leaves the
/// load joinable, so the change costs one load.
#[tokio::test(start_paused = true)]
async fn a_second_fence_at_the_same_version_keeps_the_reload_in_flight() {
    let source = Arc::new(FakeSource::default());
    source.version.store(1, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    cache.get(key(), Duration::from_secs(1)).await;
    source.version.store(2, Ordering::SeqCst);
    source.delay_ms.store(100, Ordering::SeqCst);
    cache
        .invalidate_to(key(), 2, Duration::from_secs(60), false)
        .await
        .unwrap();
    let reload = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.get(key(), Duration::from_secs(1)).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    cache
        .invalidate_to(key(), 2, Duration::from_secs(60), false)
        .await
        .unwrap();
    match cache.get(key(), Duration::from_secs(1)).await {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 2),
        other => panic!("expected to join the reload, got {other:?}"),
    }
    assert!(matches!(reload.await.unwrap(), CacheOutcome::Loaded(_)));
    assert_eq!(
        source.calls.load(Ordering::SeqCst),
        2,
        "one load before, one after"
    );
    // A newer version still detaches and reloads.
    source.version.store(3, Ordering::SeqCst);
    cache
        .invalidate_to(key(), 3, Duration::from_secs(60), false)
        .await
        .unwrap();
    match cache.get(key(), Duration::from_secs(1)).await {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 3),
        other => panic!("unexpected {other:?}"),
    }
}

/// A load that began before `forget_all` (a resync) answers its callers but leaves no copy in
/// L1: it may have read what the instance was told to forget.
#[tokio::test(start_paused = true)]
async fn a_load_that_began_before_forget_all_leaves_no_copy() {
    let source = Arc::new(FakeSource::default());
    source.version.store(1, Ordering::SeqCst);
    source.delay_ms.store(100, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    let early = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.get(key(), Duration::from_secs(1)).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    source.version.store(2, Ordering::SeqCst);
    cache.forget_all();
    match early.await.unwrap() {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 1),
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        cache.peek(&key()).is_none(),
        "the early load's copy is not kept"
    );
    match cache.get(key(), Duration::from_secs(1)).await {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 2),
        other => panic!("expected a reload, got {other:?}"),
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
}

/// After a resync, an L2 copy fetched before its floor reads as absent: the part reloads from
/// the source and overwrites it; copies fetched after the floor are served as before.
#[tokio::test]
async fn an_l2_copy_from_before_the_floor_is_ignored() {
    let source = Arc::new(FakeSource::default());
    source.version.store(1, Ordering::SeqCst);
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(1_000));
    let writer = instance(&source, &tier, &clock);
    writer.get(key(), BUDGET).await;
    while tier.version_of(tier_key()) != Some(1) {
        tokio::task::yield_now().await;
    }
    let reader = instance(&source, &tier, &clock);
    clock.advance(Duration::from_millis(10));
    reader.set_l2_floor(clock.now());
    assert_eq!(reader.l2_floor(), Some(clock.now()));
    assert!(
        matches!(
            PartView::l2_entry(&reader, key()).await.unwrap(),
            crate::part::view::L2Entry::Absent
        ),
        "inspection sees what a read sees"
    );
    source.version.store(2, Ordering::SeqCst);
    match reader.get(key(), BUDGET).await {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 2),
        other => panic!("expected a reload, got {other:?}"),
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
    while tier.version_of(tier_key()) != Some(2) {
        tokio::task::yield_now().await;
    }
    // The reloaded copy is after the floor: a third instance with the same floor takes it.
    let third = instance(&source, &tier, &clock);
    third.set_l2_floor(clock.now());
    assert!(matches!(
        third.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    assert_eq!(source.calls.load(Ordering::SeqCst), 2, "served from L2");
    // A floor never goes down.
    third.set_l2_floor(Timestamp::from_millis(0));
    assert_eq!(third.l2_floor(), Some(clock.now()));
}

/// Through L2: the fence also stops another instance's rebuild that read the old row.
#[tokio::test]
async fn an_instance_that_fenced_its_l1_never_serves_the_older_l2_copy() {
    let source = Arc::new(FakeSource::default());
    source.version.store(1, Ordering::SeqCst);
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let reader = instance(&source, &tier, &clock);
    let value_of = |outcome: CacheOutcome<String>| match outcome {
        CacheOutcome::Loaded(envelope) | CacheOutcome::Hit(envelope) => {
            (envelope.version, envelope.value.clone().unwrap())
        }
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(value_of(reader.get(key(), BUDGET).await).0, 1);
    while tier.version_of(tier_key()) != Some(1) {
        tokio::task::yield_now().await;
    }
    // The row moves to version 2 and this instance applies the event to its L1; the L2
    // fence (another instance's shared delivery) has not landed yet.
    source.version.store(2, Ordering::SeqCst);
    reader
        .invalidate_to(key(), 2, Duration::from_secs(60), false)
        .await
        .unwrap();
    assert_eq!(tier.version_of(tier_key()), Some(1), "L2 still holds v1");
    let (version, value) = value_of(reader.get(key(), BUDGET).await);
    assert_eq!(version, 2, "{value}: the v1 copy in L2 must not come back");
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
}

/// After an event, a rebuild asks L2 once before the source: behind a fence the read is a miss,
/// most likely, so the lease goes with it, and the winner does not read again. The other
/// instance, coming after the winner's value is in L2, gets it with the same one round trip and
/// gives the lease back.
#[tokio::test]
async fn after_an_event_a_rebuild_asks_l2_once_before_the_source() {
    let source = Arc::new(FakeSource::default());
    source.version.store(1, Ordering::SeqCst);
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let first = instance(&source, &tier, &clock);
    let second = instance(&source, &tier, &clock);
    first.get(key(), BUDGET).await;
    until(|| tier.version_of(tier_key()) == Some(1)).await;
    second.get(key(), BUDGET).await;
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);

    source.version.store(2, Ordering::SeqCst);
    first
        .invalidate_to(key(), 2, Duration::from_secs(60), true)
        .await
        .unwrap();
    second
        .invalidate_to(key(), 2, Duration::from_secs(60), false)
        .await
        .unwrap();
    let trips = tier.round_trips();
    match first.get(key(), BUDGET).await {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 2),
        other => panic!("expected the rebuilt value, got {other:?}"),
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        first.stats().leases_won,
        2,
        "the cold load's and this one's"
    );
    settle().await;
    // The lease and the read together, then (off the caller's path) the value's write and the
    // lease's release. Read, lease and a second read made it five.
    assert_eq!(tier.round_trips() - trips, 3);

    let trips = tier.round_trips();
    match second.get(key(), BUDGET).await {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 2),
        other => panic!("expected the winner's value from L2, got {other:?}"),
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 2, "no second rebuild");
    settle().await;
    // The lease and the read, then the lease given back off the caller's path.
    assert_eq!(tier.round_trips() - trips, 2);
    assert!(
        tier.try_lease(tier_key(), 9, Duration::from_secs(3))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn an_l2_fence_refuses_an_older_rebuild_from_another_instance() {
    let old_source = Arc::new(FakeSource::default());
    old_source.version.store(1, Ordering::SeqCst);
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let operator_side = instance(&old_source, &tier, &clock);
    operator_side
        .invalidate_to(key(), 2, Duration::from_secs(60), true)
        .await
        .unwrap();
    assert_eq!(tier.version_of(tier_key()), Some(2));
    // Another instance whose source still returns version 1 (a lagging read).
    let lagging = instance(&old_source, &tier, &clock);
    assert!(matches!(
        lagging.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    let refused = || lagging.stats().fenced_writes_refused >= 1;
    while !refused() {
        tokio::task::yield_now().await;
    }
    assert_eq!(tier.version_of(tier_key()), Some(2));
}

#[tokio::test]
async fn an_older_version_never_replaces_a_newer_one_in_l1() {
    let source = Arc::new(FakeSource::default());
    source.version.store(5, Ordering::SeqCst);
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = instance(&source, &tier, &clock);
    cache.get(key(), BUDGET).await;
    let older = Envelope {
        value: Some("old".to_owned()),
        version: 4,
        fetched_at: clock.now(),
        fresh_until: clock.now().saturating_add_millis(60_000),
        stale_until: clock.now().saturating_add_millis(600_000),
        tombstone: false,
    };
    let entry = TierEntry {
        version: 4,
        bytes: older.encode().unwrap(),
    };
    cache.absorb(key(), &entry);
    let held = cache.peek(&key()).unwrap();
    assert_eq!(held.version, 5);
    assert_ne!(held.value.as_deref(), Some("old"));
    assert_eq!(cache.stats().fenced_writes_refused, 1);
}

const BUDGET: Duration = Duration::from_millis(500);

#[tokio::test]
async fn fresh_entries_answer_without_the_source() {
    let source = Arc::new(FakeSource::default());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    let CacheOutcome::Loaded(first) = cache.get(key(), BUDGET).await else {
        panic!("first read must load");
    };
    let CacheOutcome::Hit(second) = cache.get(key(), BUDGET).await else {
        panic!("second read must hit");
    };
    assert_eq!(first.value, second.value);
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    // Past the longest jittered fresh TTL (66 s) the entry is reloaded.
    clock.advance(Duration::from_secs(67));
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn concurrent_misses_share_one_load() {
    let source = Arc::new(FakeSource::default());
    source.delay_ms.store(20, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    let callers: Vec<_> = (0..200)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.get(key(), BUDGET).await })
        })
        .collect();
    let values = answered_values(callers).await;
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    assert!(values.iter().all(|value| value == &values[0]));
    let stats = cache.stats();
    assert_eq!(stats.loads_started, 1);
    assert_eq!(stats.hits + stats.loads_joined + 1, 200, "{stats:?}");
}

#[tokio::test]
async fn failing_source_serves_stale_until_the_stale_window_ends() {
    let source = Arc::new(FakeSource::default());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    source.failing.store(true, Ordering::SeqCst);
    clock.advance(Duration::from_secs(120));
    match cache.get(key(), BUDGET).await {
        CacheOutcome::Stale(envelope, failure) => {
            assert_eq!(failure.kind, FailureKind::Error);
            assert_eq!(envelope.fetched_at, Timestamp::from_millis(0));
        }
        other => panic!("expected stale, got {other:?}"),
    }
    // Fresh window ≤ 66 s plus a 600 s stale window: gone by 700 s.
    clock.advance(Duration::from_secs(600));
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Failed(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn slow_source_times_out_but_its_value_is_kept_for_the_next_caller() {
    let source = Arc::new(FakeSource::default());
    source.delay_ms.store(800, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    match cache.get(key(), Duration::from_millis(100)).await {
        CacheOutcome::Failed(failure) => assert_eq!(failure.kind, FailureKind::Timeout),
        other => panic!("expected a timeout, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(matches!(
        cache.get(key(), Duration::from_millis(100)).await,
        CacheOutcome::Hit(_)
    ));
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hung_source_is_cut_off_by_the_load_timeout() {
    let source = Arc::new(FakeSource::default());
    source.delay_ms.store(3_600_000, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    let outcome = cache.get(key(), Duration::from_secs(10)).await;
    match outcome {
        CacheOutcome::Failed(failure) => assert_eq!(failure.kind, FailureKind::Timeout),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // The load left `in_flight`: the next call starts a new one.
    source.delay_ms.store(0, Ordering::SeqCst);
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    assert_eq!(cache.stats().loads_started, 2);
}

#[tokio::test]
async fn not_found_is_cached_briefly() {
    let source = Arc::new(FakeSource::default());
    source.missing.store(true, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    for _ in 0..5 {
        match cache.get(key(), BUDGET).await {
            CacheOutcome::Loaded(envelope) | CacheOutcome::Hit(envelope) => {
                assert!(envelope.is_not_found());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    // The marker lives at most 33 s (30 s ± 10 %); then the source is asked again.
    clock.advance(Duration::from_secs(34));
    source.missing.store(false, Ordering::SeqCst);
    match cache.get(key(), BUDGET).await {
        CacheOutcome::Loaded(envelope) => assert!(envelope.value.is_some()),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(cache.stats().not_found_cached, 1);
}

#[tokio::test]
async fn invalidate_drops_the_copy() {
    let source = Arc::new(FakeSource::default());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    cache.get(key(), BUDGET).await;
    assert!(cache.peek(&key()).is_some());
    cache.invalidate(&key());
    assert!(cache.peek(&key()).is_none());
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
}

/// The cache of [`cache`] with refresh ahead at `lead`.
fn refreshing_cache(
    source: &Arc<FakeSource>,
    clock: &ManualClock,
    lead: Duration,
) -> PartCache<String> {
    let loader: Arc<dyn Loader<String>> = source.clone();
    let settings = PartCacheConfig {
        refresh_lead: lead,
        max_version_gap: 1_000_000,
        ..settings()
    };
    PartCache::new(settings, loader, Arc::new(clock.clone()))
}

/// Lets the background work this runtime has (L2 writes, lease releases) run to its end.
async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

/// Yields until `done` holds (background loads run on this runtime), at most 10,000 times.
async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the background work did not finish");
}

/// Reads `key` until a read starts a refresh (each is due with a chance close to 1 this near
/// the expiry), then waits for the refresh to land in L1. Returns the new `fresh_until`.
async fn read_until_refreshed(cache: &PartCache<String>) -> Timestamp {
    let before = cache.peek(&key()).unwrap().fresh_until;
    let refreshes = cache.stats().refreshes;
    for _ in 0..50 {
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Hit(_)
        ));
        if cache.stats().refreshes > refreshes {
            break;
        }
    }
    assert_eq!(
        cache.stats().refreshes,
        refreshes + 1,
        "one refresh started"
    );
    until(|| {
        cache
            .peek(&key())
            .is_some_and(|entry| entry.fresh_until > before)
    })
    .await;
    cache.peek(&key()).unwrap().fresh_until
}

#[tokio::test]
async fn a_key_read_near_its_expiry_is_reloaded_before_it_expires() {
    let source = Arc::new(FakeSource::default());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = refreshing_cache(&source, &clock, Duration::from_secs(1));
    cache.get(key(), BUDGET).await;
    let first_expiry = cache.peek(&key()).unwrap().fresh_until;
    // Far from the expiry (≥ 54 s left, past ten leads): reads never refresh.
    for _ in 0..1_000 {
        cache.get(key(), BUDGET).await;
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    // 100 ms before it: a read refreshes with a chance of e^-0.1.
    clock.advance(Duration::from_millis(
        first_expiry.millis_since(clock.now()) - 100,
    ));
    let second_expiry = read_until_refreshed(&cache).await;
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
    assert!(second_expiry.millis_since(first_expiry) >= 50_000);
    // Past the first expiry the key still answers from L1: no caller waited for the reload.
    clock.advance(Duration::from_millis(200));
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Hit(_)
    ));
    let stats = cache.stats();
    assert_eq!((stats.misses, stats.refreshes), (1, 1), "{stats:?}");
}

#[tokio::test]
async fn no_refresh_starts_for_a_source_that_would_refuse_or_without_a_lead() {
    let source = Arc::new(FakeSource::default());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let refreshing = refreshing_cache(&source, &clock, Duration::from_secs(10));
    let plain = cache(&source, &clock);
    refreshing.get(key(), BUDGET).await;
    plain.get(key(), BUDGET).await;
    source.refusing.store(true, Ordering::SeqCst);
    clock.advance(Duration::from_millis(53_900));
    for _ in 0..100 {
        refreshing.get(key(), BUDGET).await;
        plain.get(key(), BUDGET).await;
    }
    assert_eq!(refreshing.stats().refreshes, 0);
    assert!(!refreshing.refresh_ahead(key(), Timestamp::from_millis(i64::MAX)));
    // Ready again, the engine's call starts one when the entry ends by its horizon, but the
    // cache without a lead never refreshes.
    source.refusing.store(false, Ordering::SeqCst);
    assert!(!refreshing.refresh_ahead(key(), clock.now()));
    assert!(refreshing.refresh_ahead(key(), Timestamp::from_millis(i64::MAX)));
    assert!(!plain.refresh_ahead(key(), Timestamp::from_millis(i64::MAX)));
    assert_eq!(plain.stats().refreshes, 0);
}

/// L1's copy of an L2 entry is never fresh past L2's: refreshing L1 takes L2's copy while that
/// stays fresh longer, and once both end together the refresh reloads from the source (under
/// the lease) and rewrites L2. No read in between misses.
#[tokio::test]
async fn a_refresh_reads_l2_until_l2_itself_needs_the_reload() {
    let source = Arc::new(FakeSource::default());
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let loader: Arc<dyn Loader<String>> = source.clone();
    let cache = PartCache::with_shared_tier(
        PartCacheConfig {
            refresh_lead: Duration::from_secs(10),
            max_version_gap: 1_000_000,
            ..settings()
        },
        L2Config {
            tier: tier.clone(),
            // L2 outlives L1 by about half an L1 lifetime.
            ttl: TtlPolicy {
                fresh: Duration::from_secs(90),
                jitter: Jitter::UpTo(Duration::ZERO),
                stale: Duration::from_secs(600),
                not_found: Duration::from_secs(30),
            },
            lease_ttl: Duration::from_secs(3),
            lease_wait: Duration::from_millis(300),
            lease_poll: Duration::from_millis(10),
        },
        loader,
        Arc::new(clock.clone()),
    );
    cache.get(key(), BUDGET).await;
    until(|| tier.version_of(tier_key()).is_some()).await;
    let l2_expiry = Timestamp::from_millis(90_000);
    // First refresh: L2's copy is fresh until 90 s, longer than L1's (54–66 s): taken as is.
    let fresh_until = cache.peek(&key()).unwrap().fresh_until;
    clock.advance(Duration::from_millis(
        fresh_until.millis_since(clock.now()) - 100,
    ));
    let fresh_until = read_until_refreshed(&cache).await;
    assert_eq!(fresh_until, l2_expiry, "L1's copy ends with L2's");
    assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    // Second: L2's copy ends with L1's, so the source reloads it and L2 gets the new value.
    clock.advance(Duration::from_millis(
        fresh_until.millis_since(clock.now()) - 100,
    ));
    let fresh_until = read_until_refreshed(&cache).await;
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
    assert!(fresh_until > l2_expiry);
    let stats = cache.stats();
    assert_eq!(
        (stats.misses, stats.refreshes, stats.leases_won),
        (1, 2, 2),
        "{stats:?}"
    );
    // The reload reached L2 too (written in the background).
    for _ in 0..10_000 {
        let entry = tier.get_many(&[tier_key()]).await.unwrap().pop().flatten();
        let envelope = Envelope::<String>::decode(&entry.unwrap().bytes).unwrap();
        if envelope.fresh_until > l2_expiry {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the reload never reached L2");
}

/// A shared tier whose lease requests wait at a gate the test opens: it decides when an
/// instance's lease request reaches the tier.
#[derive(Debug)]
struct GatedLeases {
    tier: Arc<MemoryTier>,
    /// Told when a lease request arrives at the gate.
    arrived: tokio::sync::Notify,
    gate: tokio::sync::Semaphore,
}

#[async_trait]
impl SharedTier for GatedLeases {
    async fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<TierEntry>>, crate::TierError> {
        self.tier.get_many(keys).await
    }

    async fn put_fenced(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<crate::FenceOutcome, crate::TierError> {
        self.tier.put_fenced(key, entry, ttl).await
    }

    async fn put_fence(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<crate::FenceOutcome, crate::TierError> {
        self.tier.put_fence(key, entry, ttl).await
    }

    async fn try_lease(
        &self,
        key: TierKey,
        token: u64,
        ttl: Duration,
    ) -> Result<bool, crate::TierError> {
        self.arrived.notify_one();
        self.gate
            .acquire()
            .await
            .expect("the gate stays open")
            .forget();
        self.tier.try_lease(key, token, ttl).await
    }

    async fn release_lease(&self, key: TierKey, token: u64) -> Result<(), crate::TierError> {
        self.tier.release_lease(key, token).await
    }

    async fn ping(&self) -> Result<(), crate::TierError> {
        self.tier.ping().await
    }
}

/// An instance whose L2 read missed takes the lease only after another instance has taken it,
/// rebuilt the key, written L2 and released it: the lease is free, and without a second look at
/// L2 the key would be rebuilt twice. With it, the late instance takes the value from L2.
#[tokio::test]
async fn a_lease_won_after_someone_elses_whole_rebuild_takes_its_value() {
    let source = Arc::new(FakeSource::default());
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let gated = Arc::new(GatedLeases {
        tier: Arc::clone(&tier),
        arrived: tokio::sync::Notify::new(),
        gate: tokio::sync::Semaphore::new(0),
    });
    let loader: Arc<dyn Loader<String>> = source.clone();
    let late = PartCache::with_shared_tier(
        settings(),
        l2_config(gated.clone()),
        loader,
        Arc::new(clock.clone()),
    );
    let early = instance(&source, &tier, &clock);
    // The late instance reads L2 (a miss) and stops at the gate on its way to the lease.
    let waiting = tokio::spawn({
        let late = late.clone();
        async move { late.get(key(), BUDGET).await }
    });
    gated.arrived.notified().await;
    // Meanwhile the other instance rebuilds the key from start to end.
    assert!(matches!(
        early.get(key(), BUDGET).await,
        CacheOutcome::Loaded(_)
    ));
    until(|| tier.version_of(tier_key()).is_some()).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    gated.gate.add_permits(1);
    match waiting.await.unwrap() {
        CacheOutcome::Loaded(envelope) => {
            assert_eq!(envelope.value.as_deref(), Some("taobao:100001#1"))
        }
        other => panic!("expected the other instance's value, got {other:?}"),
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 1, "rebuilt once");
    assert_eq!(late.stats().leases_won, 1);
}

/// A load's context as a loader saw it: its deadline and the retries left.
type SeenContext = Option<(Option<tokio::time::Instant>, u32)>;

/// Records the load context each load ran in.
#[derive(Debug, Default)]
struct ContextProbe {
    seen: std::sync::Mutex<Vec<SeenContext>>,
}

#[async_trait]
impl Loader<String> for ContextProbe {
    async fn load(&self, key: ItemKey) -> Result<Loaded<String>, LoadFailure> {
        let context = crate::LoadContext::current()
            .map(|context| (context.deadline(), context.retries_left()));
        self.seen.lock().unwrap().push(context);
        Ok(Loaded {
            value: Some(key.to_string()),
            version: 1,
        })
    }
}

/// A refresh is nobody's request: it has no deadline and spends no retries (a batch of
/// refreshes may wait for a token however close the entry's end).
#[tokio::test(start_paused = true)]
async fn a_refresh_has_no_deadline_and_no_retries() {
    let probe = Arc::new(ContextProbe::default());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let loader: Arc<dyn Loader<String>> = probe.clone();
    let cache = PartCache::new(
        PartCacheConfig {
            refresh_lead: Duration::from_secs(1),
            max_version_gap: 1_000_000,
            ..settings()
        },
        loader,
        Arc::new(clock.clone()),
    );
    cache.get(key(), BUDGET).await;
    let fresh_until = cache.peek(&key()).unwrap().fresh_until;
    clock.advance(Duration::from_millis(
        fresh_until.millis_since(clock.now()) - 400,
    ));
    assert!(cache.refresh_ahead(key(), fresh_until));
    until(|| probe.seen.lock().unwrap().len() == 2).await;
    let (deadline, retries) = probe.seen.lock().unwrap()[1].expect("a context");
    assert_eq!((deadline, retries), (None, 0));
}

/// What holds the rebuild lease of the key while another instance reads it.
#[derive(Debug, Clone, Copy)]
enum Holder {
    /// A slow source: the holder's value arrives after a while.
    SlowSource,
    /// A load stuck waiting for a quota token, refused in the end: no value ever arrives.
    StuckOnSpentQuota,
    /// The holder's breaker opened under it: its load fails at once and the lease goes back.
    BreakerOpened,
}

/// Warms `key()` at version 1 through L2 and moves past L2's fresh window: L1 holds nothing,
/// L2 a servable stale copy.
async fn l2_holds_only_a_stale_copy(tier: &Arc<MemoryTier>, clock: &ManualClock) {
    let source = Arc::new(FakeSource::default());
    source.version.store(1, Ordering::SeqCst);
    instance(&source, tier, clock).get(key(), BUDGET).await;
    while tier.version_of(tier_key()).is_none() {
        tokio::task::yield_now().await;
    }
    // Past L2's fresh window (≤ 20 min), inside its stale window (+30 min).
    clock.advance(Duration::from_secs(1_300));
}

/// A lease loser holding a servable copy answers with it at once, whatever the holder is
/// doing; the readers that come while the holder works join the same load (one lease attempt,
/// no further Redis round trips); once the holder is done, the next reader gets its value (or,
/// when none came, rebuilds).
#[tokio::test(start_paused = true)]
async fn a_lease_loser_with_a_stale_copy_answers_at_once_whatever_the_holder_does() {
    for holder in [
        Holder::SlowSource,
        Holder::StuckOnSpentQuota,
        Holder::BreakerOpened,
    ] {
        let tier = Arc::new(MemoryTier::new());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        l2_holds_only_a_stale_copy(&tier, &clock).await;

        let holder_source = Arc::new(FakeSource::default());
        holder_source.version.store(2, Ordering::SeqCst);
        let delay_ms = match holder {
            // Within the follower's 300 ms: its value reaches the reader's L1.
            Holder::SlowSource => 200,
            Holder::StuckOnSpentQuota => 2_000,
            Holder::BreakerOpened => 100,
        };
        holder_source.delay_ms.store(delay_ms, Ordering::SeqCst);
        // The holder takes the lease; its readers wait at most their budget.
        let holding = instance(&holder_source, &tier, &clock);
        let holder_read = {
            let holding = holding.clone();
            tokio::spawn(async move { holding.get(key(), Duration::from_secs(3)).await })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(holding.stats().leases_won, 1, "{holder:?}");
        // The holder's source was ready when it leased; its load now ends refused or failed.
        match holder {
            Holder::SlowSource => {}
            Holder::StuckOnSpentQuota => holder_source.refusing.store(true, Ordering::SeqCst),
            Holder::BreakerOpened => holder_source.failing.store(true, Ordering::SeqCst),
        }

        let source = Arc::new(FakeSource::default());
        source.version.store(2, Ordering::SeqCst);
        let reader = instance(&source, &tier, &clock);
        let started = tokio::time::Instant::now();
        let round_trips = tier.round_trips();
        match reader.get(key(), BUDGET).await {
            CacheOutcome::Stale(envelope, _) => assert_eq!(envelope.version, 1, "{holder:?}"),
            other => panic!("{holder:?}: expected the stale copy, got {other:?}"),
        }
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "{holder:?}: no wait at all"
        );
        let after_first = tier.round_trips();
        assert_eq!(
            after_first - round_trips,
            2,
            "{holder:?}: one read, one lease"
        );
        // Readers meanwhile join the load that follows the holder: stale at once, no Redis.
        for _ in 0..20 {
            match reader.get(key(), BUDGET).await {
                CacheOutcome::Stale(envelope, _) => assert_eq!(envelope.version, 1),
                other => panic!("{holder:?}: expected the stale copy, got {other:?}"),
            }
        }
        assert_eq!(started.elapsed(), Duration::ZERO, "{holder:?}");
        let stats = reader.stats();
        assert_eq!(
            (stats.leases_lost, stats.lease_losses_served_stale),
            (1, 1),
            "{holder:?}"
        );
        assert_eq!(stats.loads_started, 1, "{holder:?}");
        assert_eq!(source.calls.load(Ordering::SeqCst), 0, "{holder:?}");

        // The holder finishes (or gives up); its own reader was answered within its budget.
        let _ = holder_read.await.unwrap();
        // Past the follower's wait (`lease_wait`, 300 ms) in every case.
        tokio::time::sleep(Duration::from_millis(400)).await;
        match (holder, reader.get(key(), BUDGET).await) {
            (Holder::SlowSource, CacheOutcome::Hit(envelope)) => {
                assert_eq!(envelope.version, 2);
                assert_eq!(reader.stats().lease_waits_served, 1);
                assert_eq!(source.calls.load(Ordering::SeqCst), 0);
            }
            (Holder::StuckOnSpentQuota | Holder::BreakerOpened, CacheOutcome::Loaded(envelope)) => {
                // Nothing came from the holder: this reader rebuilt, under the lease.
                assert_eq!(envelope.version, 2);
                assert_eq!(reader.stats().leases_won, 1);
                assert_eq!(source.calls.load(Ordering::SeqCst), 1);
            }
            (holder, other) => panic!("{holder:?}: unexpected {other:?}"),
        }
    }
}

/// A loser without a servable copy waits for the winner about as long as a rebuild takes here
/// lately, not the whole `lease_wait`, and then loads itself.
#[tokio::test(start_paused = true)]
async fn a_lease_loser_without_a_copy_waits_a_few_load_times_then_loads() {
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let source = Arc::new(FakeSource::default());
    source.delay_ms.store(10, Ordering::SeqCst);
    let reader = instance(&source, &tier, &clock);
    // One load of another item times the source: 10 ms.
    let other = ItemKey::new(Platform::Taobao, ItemId::from_u64(100_002));
    reader.get(other, BUDGET).await;
    // Another instance holds the lease of the key and never finishes.
    assert!(
        tier.try_lease(tier_key(), 7, Duration::from_secs(3))
            .await
            .unwrap()
    );
    let started = tokio::time::Instant::now();
    match reader.get(key(), BUDGET).await {
        CacheOutcome::Loaded(_) => {}
        other => panic!("expected its own load, got {other:?}"),
    }
    // The bound of one 10 ms load (10 ms + 4 × 5 ms), two 10 ms polls and L2's round trips
    // (instant here), rounded up to a poll: 60 ms of waiting, then its own 10 ms load. Not
    // lease_wait's 300 ms.
    assert_eq!(started.elapsed(), Duration::from_millis(70));
    let stats = reader.stats();
    assert_eq!((stats.leases_lost, stats.lease_waits_given_up), (1, 1));
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
}

/// A loser without a copy looks for the winner's value first after a typical rebuild here, not
/// after a whole `lease_poll`: the winner's 1 ms rebuild reaches the loser's caller at 3 ms (the
/// loser's own loads take 2 ms, its L2 trips a microsecond each, and tokio's millisecond timer
/// rounds 2.002 ms up), where a fixed poll answered at 10 ms.
#[tokio::test(start_paused = true)]
async fn a_lease_loser_looks_for_the_value_after_a_typical_rebuild() {
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let source = Arc::new(FakeSource::default());
    source.delay_ms.store(2, Ordering::SeqCst);
    let reader = instance(&source, &tier, &clock);
    // One load of another item times the reader's source: 2 ms.
    let other = ItemKey::new(Platform::Taobao, ItemId::from_u64(100_002));
    reader.get(other, BUDGET).await;

    let winner_source = Arc::new(FakeSource::default());
    winner_source.delay_ms.store(1, Ordering::SeqCst);
    winner_source.version.store(5, Ordering::SeqCst);
    let winner = instance(&winner_source, &tier, &clock);
    let winning = {
        let winner = winner.clone();
        tokio::spawn(async move { winner.get(key(), BUDGET).await })
    };
    while winner.stats().leases_won == 0 {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    match reader.get(key(), BUDGET).await {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 5),
        other => panic!("expected the winner's value, got {other:?}"),
    }
    assert_eq!(started.elapsed(), Duration::from_millis(3));
    let stats = reader.stats();
    assert_eq!((stats.leases_lost, stats.lease_waits_served), (1, 1));
    assert_eq!(
        source.calls.load(Ordering::SeqCst),
        1,
        "only the timing load"
    );
    winning.await.unwrap();
}

/// A fence far ahead of what the source has (an event with a mistyped version) is lifted by the
/// first load: the value is cached as usual, and the next reads are hits.
#[tokio::test]
async fn a_fence_far_ahead_of_the_source_is_lifted() {
    let source = Arc::new(FakeSource::default());
    source.version.store(4, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    cache.get(key(), BUDGET).await;
    cache
        .invalidate_to(key(), 40_000_000_000, Duration::from_secs(60), false)
        .await
        .unwrap();
    match cache.get(key(), BUDGET).await {
        CacheOutcome::Loaded(envelope) => {
            assert_eq!(envelope.version, 4);
            assert!(envelope.is_fresh(clock.now()));
        }
        other => panic!("unexpected {other:?}"),
    }
    for _ in 0..10 {
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Hit(_)
        ));
    }
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
    assert_eq!(cache.stats().fences_lifted, 1);
    // A later, sane event fences again as usual.
    source.version.store(5, Ordering::SeqCst);
    cache
        .invalidate_to(key(), 5, Duration::from_secs(60), false)
        .await
        .unwrap();
    match cache.get(key(), BUDGET).await {
        CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 5),
        other => panic!("unexpected {other:?}"),
    }
}

/// The boundary of `max_version_gap`: a fence exactly that far ahead of the source stands (the
/// value it refuses is fresh for no one); one version further is lifted.
#[tokio::test]
async fn a_fence_within_the_gap_stands_and_one_beyond_it_is_lifted() {
    let source = Arc::new(FakeSource::default());
    source.version.store(4, Ordering::SeqCst);
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    cache
        .invalidate_to(key(), 4 + 1_000_000, Duration::from_secs(60), false)
        .await
        .unwrap();
    for _ in 0..3 {
        match cache.get(key(), BUDGET).await {
            CacheOutcome::Loaded(envelope) => {
                assert_eq!(envelope.version, 4);
                assert!(!envelope.is_fresh(clock.now()));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(cache.stats().fences_lifted, 0);
    assert_eq!(source.calls.load(Ordering::SeqCst), 3);
    cache
        .invalidate_to(key(), 4 + 1_000_001, Duration::from_secs(60), false)
        .await
        .unwrap();
    cache.get(key(), BUDGET).await;
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Hit(_)
    ));
    assert_eq!(cache.stats().fences_lifted, 1);
    assert_eq!(source.calls.load(Ordering::SeqCst), 4);
}

//! Lifetimes and refresh lead replaced at runtime ([`PartCache::set_ttl`],
//! [`PartCache::set_refresh_lead`]): what is stamped from then on changes, nothing cached or in
//! flight does.

use super::*;
use crate::envelope::PolicyError;

/// Lifetimes without jitter, so that a stamp can be checked to the millisecond.
fn exact(fresh_secs: u64, stale_secs: u64) -> TtlPolicy {
    TtlPolicy {
        fresh: Duration::from_secs(fresh_secs),
        jitter: Jitter::Ratio(0.0),
        stale: Duration::from_secs(stale_secs),
        not_found: Duration::from_secs(1),
    }
}

fn other_key() -> ItemKey {
    ItemKey::new(Platform::Taobao, ItemId::from_u64(100_002))
}

#[tokio::test]
async fn new_lifetimes_stamp_the_next_load_and_leave_cached_entries_as_they_were() {
    let source = Arc::new(FakeSource::default());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    cache.get(key(), BUDGET).await;
    let cached_before = cache.peek(&key()).unwrap();
    cache.set_ttl(exact(5, 10), None).unwrap();
    assert_eq!(cache.ttl(), (exact(5, 10), None));
    // Past the new 5 s, the entry stamped before still answers: it keeps its 54–66 s.
    clock.advance(Duration::from_secs(10));
    assert!(matches!(
        cache.get(key(), BUDGET).await,
        CacheOutcome::Hit(_)
    ));
    let cached_after = cache.peek(&key()).unwrap();
    assert_eq!(cached_after.fresh_until, cached_before.fresh_until);
    assert_eq!(cached_after.stale_until, cached_before.stale_until);
    // A load from now on is stamped with the new lifetimes.
    cache.get(other_key(), BUDGET).await;
    let stamped = cache.peek(&other_key()).unwrap();
    assert_eq!(stamped.fresh_until.millis_since(clock.now()), 5_000);
    assert_eq!(
        stamped.stale_until.millis_since(stamped.fresh_until),
        10_000
    );
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
}

/// A load whose value arrives after the change is stamped with the new lifetimes in both
/// tiers, L2's stamp and L1's cap of it from the same change; its caller still gets its value.
#[tokio::test(start_paused = true)]
async fn a_load_in_flight_across_a_change_stamps_both_tiers_with_the_new_lifetimes() {
    let source = Arc::new(FakeSource::default());
    source.delay_ms.store(100, Ordering::SeqCst);
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = instance(&source, &tier, &clock);
    let reading = tokio::spawn({
        let cache = cache.clone();
        async move { cache.get(key(), BUDGET).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        source.calls.load(Ordering::SeqCst),
        1,
        "the load is in flight"
    );
    cache.set_ttl(exact(5, 10), Some(exact(20, 40))).unwrap();
    let CacheOutcome::Loaded(in_l1) = reading.await.unwrap() else {
        panic!("the load in flight answers its caller");
    };
    assert_eq!(
        in_l1.fresh_until.millis_since(clock.now()),
        5_000,
        "L1's cap"
    );
    until(|| tier.version_of(tier_key()).is_some()).await;
    let written = tier
        .get_many(&[tier_key()])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    let in_l2 = Envelope::<String>::decode(&written.bytes).unwrap();
    assert_eq!(in_l2.fresh_until.millis_since(clock.now()), 20_000);
    assert_eq!(in_l2.stale_until.millis_since(in_l2.fresh_until), 40_000);
}

#[tokio::test]
async fn invalid_lifetimes_are_refused_whole_and_none_keeps_l2s() {
    let source = Arc::new(FakeSource::default());
    let tier = Arc::new(MemoryTier::new());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let with_l2 = instance(&source, &tier, &clock);
    let built = with_l2.ttl();
    let zero_fresh = TtlPolicy {
        fresh: Duration::ZERO,
        ..exact(5, 10)
    };
    let wide_jitter = TtlPolicy {
        jitter: Jitter::Ratio(0.9),
        ..exact(20, 40)
    };
    assert_eq!(
        with_l2.set_ttl(zero_fresh, None),
        Err(PolicyError::ZeroFresh)
    );
    assert_eq!(
        with_l2.set_ttl(exact(5, 10), Some(wide_jitter)),
        Err(PolicyError::JitterOutOfRange(0.9))
    );
    assert_eq!(with_l2.ttl(), built, "a refused change changes nothing");
    with_l2.set_ttl(exact(5, 10), None).unwrap();
    assert_eq!(with_l2.ttl(), (exact(5, 10), built.1), "L2's kept");
    // A cache without L2 checks the L2 policy it is given, and has no use for it.
    let l1_only = cache(&source, &clock);
    assert_eq!(
        l1_only.set_ttl(exact(5, 10), Some(wide_jitter)),
        Err(PolicyError::JitterOutOfRange(0.9))
    );
    l1_only.set_ttl(exact(5, 10), Some(exact(20, 40))).unwrap();
    assert_eq!(l1_only.ttl(), (exact(5, 10), None));
}

#[tokio::test]
async fn a_new_refresh_lead_applies_from_the_next_read() {
    let source = Arc::new(FakeSource::default());
    let clock = ManualClock::new(Timestamp::from_millis(0));
    let cache = cache(&source, &clock);
    cache.get(key(), BUDGET).await;
    let expiry = cache.peek(&key()).unwrap().fresh_until;
    clock.advance(Duration::from_millis(
        expiry.millis_since(clock.now()) - 100,
    ));
    // Without a lead, reads 100 ms before the expiry never refresh.
    for _ in 0..100 {
        cache.get(key(), BUDGET).await;
    }
    assert_eq!(cache.stats().refreshes, 0);
    cache.set_refresh_lead(Duration::from_secs(1));
    assert_eq!(cache.refresh_lead(), Duration::from_secs(1));
    let refreshed_until = read_until_refreshed(&cache).await;
    assert!(refreshed_until > expiry);
    // Off again: not even the engine's call starts one.
    cache.set_refresh_lead(Duration::ZERO);
    assert!(!cache.refresh_ahead(key(), Timestamp::from_millis(i64::MAX)));
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
}

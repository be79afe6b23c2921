use super::*;
use crate::timeout_class::ClassTimeouts;
use async_trait::async_trait;
use rebate_cache::{Jitter, LoadFailure, Loaded, Loader, ManualClock, PartCacheConfig, TtlPolicy};
use rebate_domain::{
    Cents, Coupon, Extras, ItemId, Platform, Product, ProductStatus, RateBps, RebateRate,
};

#[derive(Debug)]
struct Fixed<T> {
    value: Option<T>,
    delay: Duration,
    fail: bool,
}

#[async_trait]
impl<T: Clone + Send + Sync + std::fmt::Debug + 'static> Loader<T> for Fixed<T> {
    async fn load(&self, _key: ItemKey) -> Result<Loaded<T>, LoadFailure> {
        tokio::time::sleep(self.delay).await;
        if self.fail {
            return Err(LoadFailure::error("down"));
        }
        Ok(Loaded {
            value: self.value.clone(),
            version: 1,
        })
    }
}

fn part<T: Clone + Serialize + DeserializeOwned + Send + Sync + std::fmt::Debug + 'static>(
    name: &'static str,
    loader: impl Loader<T>,
    clock: &ManualClock,
    refresh_lead: Duration,
) -> PartCache<T> {
    PartCache::new(
        PartCacheConfig {
            name,
            part: PartKind::Product,
            max_entries: 100,
            ttl: TtlPolicy {
                fresh: Duration::from_secs(60),
                jitter: Jitter::Ratio(0.1),
                stale: Duration::from_secs(600),
                not_found: Duration::from_secs(30),
            },
            load_timeout: Duration::from_secs(5),
            refresh_lead,
            max_version_gap: 1_000_000,
        },
        Arc::new(loader),
        Arc::new(clock.clone()),
    )
}

fn key() -> ItemKey {
    ItemKey::new(Platform::Jd, ItemId::from_u64(100_001))
}

fn engine(coupon_delay: Duration, rate_fails: bool) -> QueryEngine {
    let clock = ManualClock::starting_now();
    engine_with(coupon_delay, rate_fails, Vec::new(), &clock)
}

fn engine_with(
    coupon_delay: Duration,
    rate_fails: bool,
    coupons: Vec<Coupon>,
    clock: &ManualClock,
) -> QueryEngine {
    engine_refreshing(coupon_delay, rate_fails, coupons, clock, Duration::ZERO)
}

/// The engine of [`engine_with`], its parts and renderings refreshed ahead at `lead`.
fn engine_refreshing(
    coupon_delay: Duration,
    rate_fails: bool,
    coupons: Vec<Coupon>,
    clock: &ManualClock,
    lead: Duration,
) -> QueryEngine {
    let product = Product {
        platform: Platform::Jd,
        item_id: ItemId::from_u64(100_001),
        title: "耳机".to_owned(),
        price_cents: Cents::new(10_000),
        image_url: String::new(),
        shop_name: String::new(),
        status: ProductStatus::OnSale,
    };
    let parts = EngineParts {
        product: part(
            "product",
            Fixed {
                value: Some(product),
                delay: Duration::from_millis(5),
                fail: false,
            },
            clock,
            lead,
        ),
        rate: part(
            "rate",
            Fixed {
                value: Some(RebateRate {
                    rate_bps: RateBps::try_from(1000u64).unwrap(),
                }),
                delay: Duration::from_millis(5),
                fail: rate_fails,
            },
            clock,
            lead,
        ),
        coupons: part(
            "coupons",
            Fixed {
                value: Some(coupons),
                delay: coupon_delay,
                fail: false,
            },
            clock,
            lead,
        ),
        extras: part(
            "extras",
            Fixed {
                value: Some(Extras {
                    sales_30d: 1,
                    popular_searches: vec![],
                }),
                delay: Duration::from_millis(5),
                fail: false,
            },
            clock,
            lead,
        ),
    };
    let settings = EngineConfig {
        refresh_lead: lead,
        ..EngineConfig::new(ClassTimeouts::default().part_timeouts())
    };
    QueryEngine::with_settings(parts, settings, Arc::new(clock.clone()), None)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(2)
}

async fn answer(engine: &QueryEngine) -> QuoteAnswer {
    engine
        .answer(key(), deadline(), ShedLevel::Normal)
        .await
        .unwrap()
}

fn rendered_json(answer: &QuoteAnswer) -> String {
    match answer {
        QuoteAnswer::Rendered(rendered) => rendered.json().get().to_owned(),
        QuoteAnswer::Assembled(quote) => panic!("expected a rendering, got {quote:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_complete_quote_is_kept_rendered_as_it_serialises() {
    let engine = engine(Duration::from_millis(5), false);
    let first = answer(&engine).await;
    let second = answer(&engine).await;
    let quote = engine.quote(key(), deadline()).await.unwrap();
    assert_eq!(
        rendered_json(&first),
        serde_json::to_string(&quote).unwrap()
    );
    assert_eq!(rendered_json(&second), rendered_json(&first));
    let stats = engine.rendered_stats().unwrap();
    assert_eq!((stats.inserts, stats.hits, stats.entries), (1, 1, 1));
    // The second answer touched no part cache.
    assert_eq!(engine.parts().product.stats().hits, 1);
}

#[tokio::test(start_paused = true)]
async fn a_rendering_records_its_parts_versions_and_a_peek_is_no_hit() {
    let engine = engine(Duration::from_millis(5), false);
    assert!(engine.peek_rendered(&key()).is_none());
    answer(&engine).await;
    let peeked = engine.peek_rendered(&key()).expect("kept");
    let in_l1 = PerPart::from_fn(|part| {
        engine
            .parts()
            .view(part)
            .l1_entry(&key())
            .expect("in L1")
            .version
    });
    assert_eq!(peeked.versions(), in_l1);
    assert_eq!(engine.rendered_keys().collect::<Vec<_>>(), [key()]);
    assert_eq!(engine.rendered_stats().unwrap().hits, 0, "a peek is no hit");
}

#[tokio::test(start_paused = true)]
async fn a_degraded_quote_is_never_kept() {
    let engine = engine(Duration::from_millis(5), true);
    for _ in 0..2 {
        let answer = answer(&engine).await;
        assert!(answer.degraded());
        assert!(matches!(answer, QuoteAnswer::Assembled(_)));
    }
    assert_eq!(engine.rendered_stats().unwrap().entries, 0);
}

#[tokio::test(start_paused = true)]
async fn a_rendering_ends_when_a_part_stops_being_fresh() {
    let clock = ManualClock::starting_now();
    let engine = engine_with(Duration::from_millis(5), false, Vec::new(), &clock);
    answer(&engine).await;
    assert!(matches!(answer(&engine).await, QuoteAnswer::Rendered(_)));
    // Fresh for 60 s ± 10 %: past 66 s every part has to be loaded again.
    clock.advance(Duration::from_secs(67));
    assert!(
        matches!(answer(&engine).await, QuoteAnswer::Rendered(_)),
        "re-rendered"
    );
    assert_eq!(engine.rendered_stats().unwrap().inserts, 2);
    assert_eq!(engine.parts().product.stats().misses, 2);
}

/// A hot key's reads all land on its rendering, which never asks the part caches; near the
/// rendering's end one read starts the refresh of the parts it ends with, so that when it
/// ends the next read assembles from fresh parts and no read waits on a load.
#[tokio::test(start_paused = true)]
async fn a_rendering_near_its_end_refreshes_the_parts_that_end_it() {
    let clock = ManualClock::starting_now();
    let lead = Duration::from_secs(1);
    let engine = engine_refreshing(Duration::from_millis(5), false, Vec::new(), &clock, lead);
    let QuoteAnswer::Rendered(rendering) = answer(&engine).await else {
        panic!("assembled and kept");
    };
    // 50 ms before the rendering ends, each read is due with a chance of e^-0.05.
    let left = rendering.valid_until().millis_since(clock.now());
    clock.advance(Duration::from_millis(left - 50));
    for _ in 0..20 {
        assert!(matches!(answer(&engine).await, QuoteAnswer::Rendered(_)));
    }
    let refreshes = |engine: &QueryEngine| {
        engine
            .parts()
            .views()
            .iter()
            .map(|(_, part)| part.stats().refreshes)
            .sum::<u64>()
    };
    // The part that ends the rendering is refreshed (and no more than the four parts,
    // however many reads came).
    assert!(
        (1..=4).contains(&refreshes(&engine)),
        "{}",
        refreshes(&engine)
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    clock.advance(Duration::from_millis(60));
    // The rendering has ended; its parts are fresh again: assembled without a miss.
    let misses = |engine: &QueryEngine| {
        engine
            .parts()
            .views()
            .iter()
            .map(|(_, part)| part.stats().misses)
            .sum::<u64>()
    };
    assert_eq!(misses(&engine), 4, "the first answer's four misses only");
    let inserts = engine.rendered_stats().unwrap().inserts;
    assert!(matches!(answer(&engine).await, QuoteAnswer::Rendered(_)));
    assert_eq!(
        engine.rendered_stats().unwrap().inserts,
        inserts + 1,
        "kept anew"
    );
    assert_eq!(misses(&engine), 4);
}

#[tokio::test(start_paused = true)]
async fn a_rendering_ends_when_a_coupon_in_it_expires() {
    let clock = ManualClock::starting_now();
    let coupon = Coupon {
        coupon_id: "c1".to_owned(),
        discount_cents: Cents::new(2_000),
        threshold_cents: Cents::new(5_000),
        expires_at: clock.now().saturating_add_millis(10_000),
    };
    let engine = engine_with(Duration::from_millis(5), false, vec![coupon], &clock);
    let with_coupon: serde_json::Value =
        serde_json::from_str(&rendered_json(&answer(&engine).await)).unwrap();
    assert_eq!(with_coupon["rebate"]["estimated_cents"], 800);
    clock.advance(Duration::from_secs(11));
    // The parts are still fresh, but the estimate no longer counts the coupon.
    let without: serde_json::Value =
        serde_json::from_str(&rendered_json(&answer(&engine).await)).unwrap();
    assert_eq!(without["rebate"]["estimated_cents"], 1_000);
    assert_eq!(engine.parts().product.stats().misses, 1);
}

#[tokio::test(start_paused = true)]
async fn an_invalidation_drops_the_rendering() {
    let engine = engine(Duration::from_millis(5), false);
    answer(&engine).await;
    engine
        .invalidate(key(), PartKind::Rate, 2, Duration::from_secs(60), false)
        .await
        .unwrap();
    assert_eq!(engine.rendered_stats().unwrap().entries, 0);
    // The rate is loaded again (the fence at version 2 refuses the loader's version 1, so
    // that answer is not kept either: nothing stale is rendered).
    answer(&engine).await;
    assert_eq!(engine.parts().rate.stats().misses, 2);
}

#[tokio::test(start_paused = true)]
async fn a_zero_capacity_renders_nothing() {
    let plain = engine(Duration::from_millis(5), false);
    let clock = ManualClock::starting_now();
    let mut settings = plain.settings();
    settings.rendered_capacity_bytes = 0;
    let off = QueryEngine::with_settings(plain.parts().clone(), settings, Arc::new(clock), None);
    assert!(off.rendered_stats().is_none());
    assert!(matches!(answer(&off).await, QuoteAnswer::Assembled(_)));
    assert!(matches!(answer(&off).await, QuoteAnswer::Assembled(_)));
}

#[tokio::test(start_paused = true)]
async fn parts_are_fetched_in_parallel() {
    let engine = engine(Duration::from_millis(5), false);
    let started = Instant::now();
    let quote = engine
        .quote(key(), Instant::now() + Duration::from_secs(2))
        .await
        .unwrap();
    // Four 5 ms loads in parallel take 5 ms of (paused) time, not 20.
    assert_eq!(started.elapsed(), Duration::from_millis(5));
    assert!(!quote.degraded);
    assert_eq!(quote.rebate.estimated_cents, Some(Cents::new(1000)));
}

#[tokio::test(start_paused = true)]
async fn a_slow_part_is_cut_at_its_tier() {
    let engine = engine(Duration::from_secs(3), false);
    let started = Instant::now();
    let quote = engine
        .quote(key(), Instant::now() + Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    assert_eq!(quote.degraded_parts.len(), 1);
    assert_eq!(quote.degraded_parts[0].part, PartKind::Coupons);
    assert_eq!(quote.degraded_parts[0].reason, DegradeReason::Timeout);
}

#[tokio::test(start_paused = true)]
async fn the_request_deadline_caps_every_tier() {
    let engine = engine(Duration::from_secs(3), false);
    let started = Instant::now();
    let quote = engine
        .quote(key(), Instant::now() + Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(200));
    assert!(quote.degraded);
}

#[tokio::test]
async fn the_bloom_gate_answers_unknown_ids_without_any_load() {
    let clock = ManualClock::starting_now();
    let filter = Arc::new(rebate_cache::ItemFilter::new(0.001, 1_000).unwrap());
    let known = futures::stream::iter([Ok::<_, std::convert::Infallible>(key())]);
    filter.rebuild(known).await.unwrap();
    let plain = engine(Duration::from_millis(5), false);
    let gated = QueryEngine::with_settings(
        plain.parts().clone(),
        plain.settings(),
        Arc::new(clock),
        Some(filter),
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    let unknown = ItemKey::new(Platform::Jd, ItemId::from_u64(999_999_999));
    assert_eq!(
        gated.quote(unknown, deadline).await,
        Err(QueryError::NotFound { delisted: false })
    );
    assert_eq!(gated.parts().product.stats().misses, 0);
    assert!(gated.quote(key(), deadline).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_failing_rate_degrades_to_template() {
    let engine = engine(Duration::from_millis(5), true);
    let quote = engine
        .quote(key(), Instant::now() + Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(quote.rebate.rate_bps, None);
    assert_eq!(quote.degraded_parts[0].reason, DegradeReason::Error);
}

/// The engine of [`engine_with`] with `cache_only_loads` warming permits.
fn warming_engine(loads: usize, coupon_delay: Duration) -> QueryEngine {
    let clock = ManualClock::starting_now();
    let base = engine_with(coupon_delay, false, Vec::new(), &clock);
    let settings = EngineConfig {
        cache_only_loads: loads,
        ..base.settings()
    };
    QueryEngine::with_settings(base.parts().clone(), settings, Arc::new(clock), None)
}

#[tokio::test(start_paused = true)]
async fn strict_cache_only_refuses_a_key_l1_lacks() {
    let engine = warming_engine(0, Duration::from_millis(5));
    let answer = engine.answer(key(), deadline(), ShedLevel::CacheOnly).await;
    assert!(matches!(
        answer,
        Err(QueryError::Unavailable {
            reason: DegradeReason::Shed
        })
    ));
    assert_eq!(engine.parts().product.stats().source_loads, 0);
    let loads = engine.cache_only_loads();
    assert_eq!((loads.started, loads.refused), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn cache_only_warms_a_missing_key_under_a_permit_and_serves_it_from_l1_after() {
    let engine = warming_engine(1, Duration::from_millis(5));
    let first = engine
        .answer(key(), deadline(), ShedLevel::CacheOnly)
        .await
        .expect("the key loads under the free permit");
    // Loaded at level 2: extras are off, so the quote is degraded and not rendered.
    assert!(matches!(first, QuoteAnswer::Assembled(_)));
    assert_eq!(engine.parts().product.stats().source_loads, 1);
    assert_eq!(engine.parts().extras.stats().source_loads, 0);
    // The next request finds every part a level-2 load fetches: no load, no permit.
    engine
        .answer(key(), deadline(), ShedLevel::CacheOnly)
        .await
        .expect("answered from L1");
    assert_eq!(engine.parts().product.stats().source_loads, 1);
    let loads = engine.cache_only_loads();
    assert_eq!((loads.capacity, loads.started, loads.refused), (1, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn cache_only_runs_at_most_its_permits_at_once() {
    let engine = warming_engine(2, Duration::from_millis(50));
    let keys: Vec<ItemKey> = (0..6)
        .map(|n| ItemKey::new(Platform::Jd, ItemId::from_u64(100_001 + n)))
        .collect();
    let single = futures::future::join_all(
        keys[..3]
            .iter()
            .map(|key| engine.answer(*key, deadline(), ShedLevel::CacheOnly)),
    );
    let batch = engine.answer_many(&keys[3..], deadline(), ShedLevel::CacheOnly);
    let (single, batch) = tokio::join!(single, batch);
    let answered = single.iter().filter(|answer| answer.is_ok()).count()
        + batch.iter().filter(|answer| answer.is_ok()).count();
    assert_eq!(answered, 2, "two permits: two keys loaded, four refused");
    let loads = engine.cache_only_loads();
    assert_eq!((loads.started, loads.refused), (2, 4));
    assert_eq!(engine.parts().product.stats().source_loads, 2);
}

/// A request that began before a change keeps the timeouts it began with: the change lands
/// while it waits on its slow coupons, and it still gives up at the old 500 ms. The next
/// request waits the new 1,500 ms.
#[tokio::test(start_paused = true)]
async fn a_request_keeps_the_timeouts_it_began_with_and_the_next_waits_the_new_ones() {
    let engine = engine(Duration::from_secs(3), false);
    let built = engine.request_budget();
    let mut longer = built.timeouts;
    longer.coupons = Duration::from_millis(1_500);
    let started = Instant::now();
    let running = tokio::spawn({
        let engine = engine.clone();
        async move { engine.quote(key(), deadline()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    engine.set_timeouts(longer, built.short_timeouts);
    let before = running.await.unwrap().unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    assert_eq!(before.degraded_parts[0].part, PartKind::Coupons);
    assert_eq!(before.degraded_parts[0].reason, DegradeReason::Timeout);
    // The next request joins the coupons load still in flight (it ends at 3 s) and waits the
    // new budget for it.
    let next_started = Instant::now();
    let after = engine.quote(key(), deadline()).await.unwrap();
    assert_eq!(next_started.elapsed(), Duration::from_millis(1_500));
    assert_eq!(after.degraded_parts[0].reason, DegradeReason::Timeout);
    assert_eq!(
        engine.request_budget(),
        RequestBudget {
            timeouts: longer,
            ..built
        }
    );
    assert_eq!(engine.settings().timeouts, longer);
}

/// A rate source that records what the request starting each load allowed it, and fails, so
/// that every request loads again.
#[derive(Debug, Default)]
struct SeesContext {
    seen: Arc<std::sync::Mutex<Vec<Allowed>>>,
}

/// A load's attempt timeout and its request's retries left when it started.
type Allowed = (Option<Duration>, u32);

#[async_trait]
impl Loader<RebateRate> for SeesContext {
    async fn load(&self, _key: ItemKey) -> Result<Loaded<RebateRate>, LoadFailure> {
        let context = LoadContext::current().expect("loads run under their request's context");
        self.seen
            .lock()
            .unwrap()
            .push((context.attempt_timeout(), context.retries_left()));
        Err(LoadFailure::error("down"))
    }
}

/// The whole budget is swapped in one go: the next request's loads see the new timeouts (the
/// shortened ones at shed level 2) and the new retries together.
#[tokio::test(start_paused = true)]
async fn a_new_budget_reaches_the_loads_of_the_next_request_whole() {
    let clock = ManualClock::starting_now();
    let base = engine_with(Duration::from_millis(5), false, Vec::new(), &clock);
    let source = SeesContext::default();
    let seen = Arc::clone(&source.seen);
    let parts = EngineParts {
        rate: part("rate", source, &clock, Duration::ZERO),
        ..base.parts().clone()
    };
    let engine = QueryEngine::with_settings(parts, base.settings(), Arc::new(clock), None);
    let built = engine.request_budget();
    engine.quote(key(), deadline()).await.unwrap();
    let changed = RequestBudget {
        timeouts: built.timeouts.map(|_, timeout| *timeout * 2),
        short_timeouts: built.timeouts.map(|_, timeout| *timeout / 4),
        retries_per_request: 5,
    };
    engine.set_request_budget(changed);
    engine.quote(key(), deadline()).await.unwrap();
    engine
        .answer(key(), deadline(), ShedLevel::ShortTimeouts)
        .await
        .unwrap();
    let rate = built.timeouts.rate;
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (Some(rate), built.retries_per_request),
            (Some(rate * 2), 5),
            (Some(rate / 4), 5),
        ]
    );
}

/// Renderings kept before the refresh lead changed are refreshed ahead under the new lead: it
/// is read at each rendered hit, not stamped on the rendering.
#[tokio::test(start_paused = true)]
async fn a_new_refresh_lead_reaches_renderings_kept_before_it() {
    let clock = ManualClock::starting_now();
    let engine = engine_with(Duration::from_millis(5), false, Vec::new(), &clock);
    let QuoteAnswer::Rendered(rendering) = answer(&engine).await else {
        panic!("assembled and kept");
    };
    let left = rendering.valid_until().millis_since(clock.now());
    clock.advance(Duration::from_millis(left - 50));
    let refreshes = |engine: &QueryEngine| {
        engine
            .parts()
            .views()
            .iter()
            .map(|(_, part)| part.stats().refreshes)
            .sum::<u64>()
    };
    for _ in 0..20 {
        assert!(matches!(answer(&engine).await, QuoteAnswer::Rendered(_)));
    }
    assert_eq!(refreshes(&engine), 0, "no lead, no refresh");
    let lead = Duration::from_secs(1);
    for (_, part) in engine.parts().views().iter() {
        part.set_refresh_lead(lead);
    }
    engine.set_refresh_lead(lead);
    assert_eq!(engine.settings().refresh_lead, lead);
    // 50 ms before the rendering ends, each read is due with a chance of e^-0.05.
    for _ in 0..20 {
        assert!(matches!(answer(&engine).await, QuoteAnswer::Rendered(_)));
    }
    assert!(
        (1..=4).contains(&refreshes(&engine)),
        "{}",
        refreshes(&engine)
    );
}

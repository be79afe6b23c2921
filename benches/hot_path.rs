//! The per-request work that runs on every cache hit: key parsing, the rebate formula, an L1
//! lookup, and a whole four-part quote answered from L1.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use rebate_cache::{
    CacheOutcome, Envelope, Jitter, LoadFailure, Loaded, Loader, PartCache, PartCacheConfig,
    SystemClock, TtlPolicy,
};
use rebate_domain::{
    Cents, Coupon, Extras, ItemId, ItemKey, Platform, Product, ProductStatus, RateBps, RebateRate,
    Timestamp, estimate_rebate,
};
use rebate_engine::{ClassTimeouts, EngineParts, QueryEngine, QuoteAnswer, ShedLevel};

#[derive(Debug)]
struct Constant<T>(T);

#[async_trait]
impl<T: Clone + Send + Sync + std::fmt::Debug + 'static> Loader<T> for Constant<T> {
    async fn load(&self, _key: ItemKey) -> Result<Loaded<T>, LoadFailure> {
        Ok(Loaded {
            value: Some(self.0.clone()),
            version: 1,
        })
    }
}

fn cache<T>(value: T) -> PartCache<T>
where
    T: Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + std::fmt::Debug
        + 'static,
{
    PartCache::new(
        PartCacheConfig {
            name: "bench",
            part: rebate_domain::PartKind::Product,
            max_entries: 10_000,
            ttl: TtlPolicy {
                fresh: Duration::from_secs(3600),
                jitter: Jitter::Ratio(0.1),
                stale: Duration::from_secs(3600),
                not_found: Duration::from_secs(60),
            },
            load_timeout: Duration::from_secs(1),
            refresh_lead: Duration::ZERO,
            max_version_gap: 1_000_000,
        },
        Arc::new(Constant(value)),
        Arc::new(SystemClock),
    )
}

fn coupons() -> Vec<Coupon> {
    let expires_at = Timestamp::now().saturating_add_millis(86_400_000);
    vec![
        Coupon {
            coupon_id: "c1".into(),
            discount_cents: Cents::new(1000),
            threshold_cents: Cents::new(9900),
            expires_at,
        },
        Coupon {
            coupon_id: "c2".into(),
            discount_cents: Cents::new(300),
            threshold_cents: Cents::new(0),
            expires_at,
        },
    ]
}

fn bench_domain(criterion: &mut Criterion) {
    criterion.bench_function("item_key_parse", |bench| {
        bench.iter(|| {
            ItemKey::parse(
                std::hint::black_box("taobao"),
                std::hint::black_box("100001"),
            )
        })
    });
    let coupons = coupons();
    let rate = RateBps::try_from(850u64).unwrap();
    let now = Timestamp::now();
    criterion.bench_function("estimate_rebate_2_coupons", |bench| {
        bench.iter(|| {
            estimate_rebate(
                std::hint::black_box(Cents::new(12_900)),
                &coupons,
                rate,
                now,
            )
        })
    });
}

fn bench_cache(criterion: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let key = ItemKey::new(Platform::Taobao, ItemId::from_u64(100_001));
    let rate = cache(RebateRate {
        rate_bps: RateBps::try_from(850u64).unwrap(),
    });
    runtime.block_on(rate.get(key, Duration::from_secs(1)));
    criterion.bench_function("l1_hit_one_part", |bench| {
        bench.to_async(&runtime).iter(|| async {
            let outcome = rate.get(key, Duration::from_secs(1)).await;
            assert!(matches!(outcome, CacheOutcome::Hit(_)));
        })
    });

    let engine = QueryEngine::new(
        EngineParts {
            product: cache(Product {
                platform: Platform::Taobao,
                item_id: key.item_id,
                title: "无线蓝牙耳机 降噪 长续航".into(),
                price_cents: Cents::new(12_900),
                image_url: "https://img.example.com/taobao/100001.jpg".into(),
                shop_name: "数码官方旗舰店".into(),
                status: ProductStatus::OnSale,
            }),
            rate,
            coupons: cache(coupons()),
            extras: cache(Extras {
                sales_30d: 1234,
                popular_searches: vec!["耳机".into(), "降噪耳机".into()],
            }),
        },
        ClassTimeouts::default().part_timeouts(),
        Arc::new(SystemClock),
    );
    let deadline = || tokio::time::Instant::now() + Duration::from_secs(1);
    runtime.block_on(engine.quote(key, deadline())).unwrap();
    criterion.bench_function("quote_all_parts_from_l1", |bench| {
        bench
            .to_async(&runtime)
            .iter(|| async { engine.quote(key, deadline()).await.unwrap() })
    });
    // What the HTTP handler does on the hot path: the kept rendering, the trace id appended.
    let answer = || engine.answer(key, deadline(), ShedLevel::Normal);
    runtime.block_on(answer()).unwrap();
    let member = br#""trace_id":"4bf92f3577b34da6a3ce929d0e0e4736""#;
    criterion.bench_function("rendered_quote_with_trace_id", |bench| {
        bench.to_async(&runtime).iter(|| async {
            match answer().await.unwrap() {
                QuoteAnswer::Rendered(rendered) => rendered.with_members(member),
                QuoteAnswer::Assembled(_) => panic!("the quote was not kept"),
            }
        })
    });
    // The same answer without renderings: four L1 hits, assembly and serialisation.
    criterion.bench_function("quote_all_parts_from_l1_serialised", |bench| {
        bench.to_async(&runtime).iter(|| async {
            let quote = engine.quote(key, deadline()).await.unwrap();
            serde_json::to_vec(&quote).unwrap()
        })
    });
}

fn bench_envelope(criterion: &mut Criterion) {
    let now = Timestamp::now();
    let product = Envelope {
        value: Some(Product {
            platform: Platform::Taobao,
            item_id: ItemId::from_u64(100_001),
            title: "无线蓝牙耳机 降噪 长续航".into(),
            price_cents: Cents::new(12_900),
            image_url: "https://img.example.com/taobao/100001.jpg".into(),
            shop_name: "数码官方旗舰店".into(),
            status: ProductStatus::OnSale,
        }),
        version: 3,
        fetched_at: now,
        fresh_until: now.saturating_add_millis(900_000),
        stale_until: now.saturating_add_millis(2_700_000),
        tombstone: false,
    };
    let coupons = Envelope {
        value: Some(coupons()),
        version: 1,
        fetched_at: now,
        fresh_until: now.saturating_add_millis(60_000),
        stale_until: now.saturating_add_millis(660_000),
        tombstone: false,
    };
    let product_bytes = product.encode().unwrap();
    let coupon_bytes = coupons.encode().unwrap();
    criterion.bench_function("envelope_encode_product", |bench| {
        bench.iter(|| std::hint::black_box(&product).encode().unwrap())
    });
    criterion.bench_function("envelope_decode_product", |bench| {
        bench.iter(|| Envelope::<Product>::decode(std::hint::black_box(&product_bytes)).unwrap())
    });
    criterion.bench_function("envelope_encode_coupons", |bench| {
        bench.iter(|| std::hint::black_box(&coupons).encode().unwrap())
    });
    criterion.bench_function("envelope_decode_coupons", |bench| {
        bench.iter(|| Envelope::<Vec<Coupon>>::decode(std::hint::black_box(&coupon_bytes)).unwrap())
    });
}

criterion_group!(benches, bench_domain, bench_cache, bench_envelope);
criterion_main!(benches);

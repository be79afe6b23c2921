//! The consistency observer. On the embedded profile: an operator's event whose version is far
//! ahead of the store's row (40000000000 typed for the row's version) is its own outcome,
//! `ahead_of_store`, in the status and the metrics, while an event the store holds is
//! consistent. On the production profile: the drift sampler finds an L2 copy written behind
//! the caches' back, with no event at all.

use std::time::Duration;

use rebate_cache::{Envelope, SharedTier, TierKey};
use rebate_domain::{ItemKey, PartKind, RateBps, RebateRate, Timestamp};
use rebate_redis_tier::{RedisTarget, RedisTier, RedisTierConfig};
use rebate_store::{CatalogRepository, Versioned};
use rebate_tests::{ProductionEnv, TestApp, spawn_app_with, wait_until, wait_until_true};
use serde_json::{Value, json};

/// The store's version of an item's rate row, as the inspection route reads it.
async fn rate_version(app: &TestApp, item_id: &str) -> u64 {
    let inspection: Value = app
        .admin_get(&format!("/admin/v1/items/jd/{item_id}"))
        .await
        .json()
        .await
        .unwrap();
    inspection["store"]["rate"]["version"]
        .as_u64()
        .unwrap_or_else(|| panic!("a rate row: {inspection}"))
}

/// Publishes an operator's rate event through the admin API.
async fn publish(app: &TestApp, item_id: &str, version: u64) {
    let published = app
        .client
        .post(format!("{}/admin/v1/events", app.admin_url))
        .bearer_auth(&app.admin_token)
        .json(
            &json!({"kind": "rate_changed", "platform": "jd", "item_ids": [item_id],
            "version": version}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(published.status(), 202);
}

#[tokio::test]
async fn a_mistyped_event_version_is_ahead_of_store_and_a_held_one_consistent() {
    // Two short windows, both before events.fence_secs (60 s): the last one is the verdict.
    let app = spawn_app_with(|settings| {
        settings.events.observer.windows_ms = vec![100, 200];
    })
    .await;
    let held = rate_version(&app, "100001").await;
    let row = rate_version(&app, "100002").await;
    let mistyped = 40_000_000_000;
    let gap = query_api::Settings::defaults()
        .unwrap()
        .events
        .max_version_gap;
    assert!(mistyped - row > gap, "far beyond events.max_version_gap");

    publish(&app, "100001", held).await;
    publish(&app, "100002", mistyped).await;
    app.state.events.in_process().unwrap().settled().await;
    wait_until("both windows checked both events", || {
        let report = app.state.consistency.report();
        report.pending == 0
            && report.windows.iter().all(|window| {
                window.consistent + window.inconsistent + window.unknown + window.ahead_of_store
                    == 2
            })
    })
    .await;

    let status: Value = app
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    let consistency = &status["consistency"];
    assert_eq!(consistency["ahead_of_store"], 1, "{consistency}");
    for window in consistency["windows"].as_array().unwrap() {
        assert_eq!(
            (
                &window["consistent"],
                &window["inconsistent"],
                &window["unknown"],
                &window["ahead_of_store"]
            ),
            (&json!(1), &json!(0), &json!(0), &json!(1)),
            "{consistency}"
        );
    }
    let metrics = app.metrics_text().await;
    for window in ["100ms", "200ms"] {
        for (outcome, count) in [
            ("consistent", 1),
            ("inconsistent", 0),
            ("unknown", 0),
            ("ahead_of_store", 1),
        ] {
            let line = format!(
                "\nrebate_consistency_checks_total{{source=\"event\",window=\"{window}\",outcome=\"{outcome}\"}} {count}\n"
            );
            assert!(metrics.contains(&line), "{line} missing from:\n{metrics}");
        }
    }
    assert!(
        metrics.contains("\nrebate_consistency_ahead_of_store_total 1\n"),
        "{metrics}"
    );
    app.stop().await;
}

/// The value of one sample of the exposition (`name{labels}`), 0 when absent.
fn sample(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0, |value| value.trim().parse().unwrap())
}

/// A production instance (MariaDB, Redis) caches an item; then its L2 rate copy is replaced by
/// an older version than the store's, with no event. The drift sampler, drawing the item (the
/// hottest, and kept rendered), finds L2 behind at its first look and still behind at the first
/// window: inconsistent under `source="sample"`, while no event was checked.
#[tokio::test]
async fn the_drift_sampler_finds_an_old_l2_copy_no_event_announced() {
    let env = ProductionEnv::new("drift").await;
    let app = env
        .spawn_instance(|settings| {
            settings.events.observer.windows_ms = vec![1_000, 2_000];
            settings.events.observer.drift_keys_per_sec = 20;
            // Every answer counts in the hot-key sketch, and nothing else is warmed.
            settings.hot_keys.sample_every = 1;
            settings.warmup.enabled = false;
        })
        .await;
    let key = ItemKey::parse("jd", "100230").unwrap();
    // A few versions ahead of the seed, so that an older one exists to put back.
    let store = env.store().await;
    let row = store.rate(key).await.unwrap().expect("a demo rate row");
    let version = row.version + 5;
    store
        .upsert_rate(
            key,
            &Versioned {
                value: RebateRate {
                    rate_bps: RateBps::try_from(1_230u64).unwrap(),
                },
                version,
                updated_at: Timestamp::now(),
            },
        )
        .await
        .unwrap();
    for _ in 0..3 {
        let answer: Value = app.get_item("jd", "100230").await.json().await.unwrap();
        assert_eq!(answer["rebate"]["rate_bps"], 1_230, "{answer}");
    }

    let mut tier_settings = RedisTierConfig::new(RedisTarget::Single(env.redis_url.clone()));
    tier_settings.prefix = env.prefix.clone();
    tier_settings.command_timeout = Duration::from_secs(2);
    let tier = RedisTier::connect(tier_settings).await.unwrap();
    let tier_key = TierKey {
        item: key,
        part: PartKind::Rate,
    };
    wait_until_true("the load wrote the rate to L2", || async {
        tier.get_many(&[tier_key]).await.unwrap()[0]
            .as_ref()
            .is_some_and(|entry| entry.version == version)
    })
    .await;
    // An older copy, fresh for ten minutes, written straight into Redis: the tier's own write
    // would refuse it (a fenced write never goes back a version).
    let older = version - 1;
    let now = Timestamp::now();
    let envelope = Envelope {
        value: Some(RebateRate {
            rate_bps: RateBps::try_from(1_229u64).unwrap(),
        }),
        version: older,
        fetched_at: now,
        fresh_until: now.saturating_add_millis(600_000),
        stale_until: now.saturating_add_millis(600_000),
        tombstone: false,
    };
    let mut stored = older.to_string().into_bytes();
    stored.push(b':');
    stored.extend(envelope.encode().unwrap());
    let mut redis = redis::Client::open(env.redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{}:v1:{key}:rate", env.prefix))
        .arg(stored)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        tier.get_many(&[tier_key]).await.unwrap()[0]
            .as_ref()
            .map(|entry| entry.version),
        Some(older)
    );

    let inconsistent_at_first_window =
        "rebate_consistency_checks_total{source=\"sample\",window=\"1s\",outcome=\"inconsistent\"}";
    wait_until_true(
        "the sampler counted the old L2 copy inconsistent",
        || async { sample(&app.metrics_text().await, inconsistent_at_first_window) > 0 },
    )
    .await;
    let status: Value = app
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    let consistency = &status["consistency"];
    assert!(
        consistency["sources"]["sample"][0]["inconsistent"]
            .as_u64()
            .is_some_and(|count| count > 0),
        "{consistency}"
    );
    assert!(
        consistency["drift"]["drawn"].as_u64().unwrap() > 0,
        "{consistency}"
    );
    for window in consistency["windows"].as_array().unwrap() {
        assert_eq!(
            window["consistent"].as_u64().unwrap() + window["inconsistent"].as_u64().unwrap(),
            0,
            "no event was checked: {consistency}"
        );
    }
    store.close().await;
    app.stop().await;
    env.clean_up().await;
}

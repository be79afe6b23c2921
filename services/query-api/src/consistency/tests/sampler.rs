//! The drift sampler: keys this instance holds, looked at without any event.

use rebate_cache::{Envelope, SharedTier, TierEntry, TierKey};

use super::*;
use crate::config::HotKeySettings;
use crate::hot_keys::HotKeys;
use crate::test_log::CapturedLines;

const DRIFT_LINE: &str = "inconsistent: a cache tier would serve a copy";

/// A hot-key sketch that counts `keys`, the first the hottest.
fn hot(keys: &[ItemKey]) -> HotKeys {
    let hot_keys = HotKeys::new(
        &HotKeySettings {
            enabled: true,
            capacity: 64,
            sample_every: 1,
            half_life_secs: 60,
            publish_interval_secs: 10,
            publish_top: 16,
        },
        None,
        "test",
    )
    .expect("valid settings");
    for (rank, key) in keys.iter().enumerate() {
        for _ in 0..(keys.len() - rank) * 10 {
            hot_keys.record(*key);
        }
    }
    hot_keys
}

/// Writes a fresh rate copy at `version` straight into L2, as a stray writer would: no event,
/// no fence, nothing in L1.
async fn write_l2_rate(tier: &MemoryTier, key: ItemKey, version: u64) {
    let now = Timestamp::now();
    let far = now.saturating_add_millis(600_000);
    let envelope = Envelope {
        value: Some(rate_row(version).value),
        version,
        fetched_at: now,
        fresh_until: far,
        stale_until: far,
        tombstone: false,
    };
    let entry = TierEntry {
        version,
        bytes: envelope.encode().unwrap(),
    };
    let tier_key = TierKey {
        item: key,
        part: PartKind::Rate,
    };
    tier.put_fenced(tier_key, &entry, FRESH_FOR).await.unwrap();
}

/// L1 over a memory L2, and that L2.
fn observed_over_l2(settings: ObserverConfig) -> (Observed, Arc<MemoryTier>) {
    let tier = Arc::new(MemoryTier::new());
    (observed_with(settings, Some(&tier)), tier)
}

#[tokio::test(start_paused = true)]
async fn an_l2_copy_written_behind_its_back_is_inconsistent_at_every_window_and_logged_once() {
    let (captured, _guard) = CapturedLines::start();
    let (observed, tier) = observed_over_l2(settings());
    observed.rows.set(key(20), PartKind::Rate, 3);
    write_l2_rate(&tier, key(20), 2).await;

    observed.observer.sample_round(Some(&hot(&[key(20)]))).await;
    assert_eq!(observed.observer.report().drift.following, 1);
    let report = observed.finish().await;

    // The product (no row, nothing cached) agrees; the rate's L2 copy never does.
    assert_eq!(counts(&report.sources.sample), [(1, 1, 0, 0); 3]);
    assert_eq!(counts(&report.windows), [(0, 0, 0, 0); 3], "no event");
    assert_eq!(
        (
            report.drift.drawn,
            report.drift.following,
            report.drift.skipped
        ),
        (1, 0, 0)
    );
    let lines = captured.containing(DRIFT_LINE);
    assert_eq!(lines.len(), 1, "once per episode: {:?}", captured.lines());
    for field in [
        "source=sample",
        "key=jd:20",
        "part=rate",
        "window_ms=1000",
        "l2_version=2",
        "store_version=3",
    ] {
        assert!(lines[0].contains(field), "{field} missing: {lines:?}");
    }
    assert!(lines[0].starts_with("WARN "), "{lines:?}");
    assert!(!lines[0].contains("l1_version"), "{lines:?}");
}

#[tokio::test(start_paused = true)]
async fn a_clean_key_drawn_from_the_renderings_is_consistent_at_every_window() {
    let (captured, _guard) = CapturedLines::start();
    let (observed, _tier) = observed_over_l2(settings());
    observed.rows.set(key(21), PartKind::Product, 1);
    observed.rows.set(key(21), PartKind::Rate, 3);
    observed.request(key(21)).await;

    observed.observer.sample_round(None).await;
    let report = observed.finish().await;
    assert_eq!(counts(&report.sources.sample), [(2, 0, 0, 0); 3]);
    assert_eq!(report.drift.drawn, 1, "drawn from the renderings");
    assert_eq!(report.drift.following, 0, "nothing to follow");
    assert!(captured.lines().is_empty(), "{:?}", captured.lines());
    assert_eq!(observed.engine.rendered_stats().unwrap().hits, 0);
}

#[tokio::test(start_paused = true)]
async fn a_copy_that_catches_up_before_the_first_window_is_consistent() {
    let (captured, _guard) = CapturedLines::start();
    let (observed, tier) = observed_over_l2(settings());
    observed.rows.set(key(22), PartKind::Rate, 3);
    write_l2_rate(&tier, key(22), 2).await;

    observed.observer.sample_round(Some(&hot(&[key(22)]))).await;
    assert_eq!(
        observed.observer.report().drift.following,
        1,
        "behind at the first look"
    );
    // The change reaches L2 before the first window.
    write_l2_rate(&tier, key(22), 3).await;

    let report = observed.finish().await;
    assert_eq!(counts(&report.sources.sample), [(2, 0, 0, 0); 3]);
    assert!(captured.containing(DRIFT_LINE).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_write_after_the_first_look_is_not_blamed_on_the_copy() {
    let (observed, tier) = observed_over_l2(settings());
    observed.rows.set(key(23), PartKind::Rate, 3);
    write_l2_rate(&tier, key(23), 2).await;
    observed.observer.sample_round(Some(&hot(&[key(23)]))).await;
    // L2 catches up with the first look's row; the row moves on meanwhile.
    write_l2_rate(&tier, key(23), 3).await;
    observed.rows.set(key(23), PartKind::Rate, 4);

    let report = observed.finish().await;
    assert_eq!(counts(&report.sources.sample), [(2, 0, 0, 0); 3]);
}

#[tokio::test(start_paused = true)]
async fn keys_beyond_max_pending_are_skipped_not_followed() {
    let (observed, tier) = observed_over_l2(ObserverConfig {
        max_pending: 1,
        ..settings()
    });
    for item in [24, 25] {
        observed.rows.set(key(item), PartKind::Rate, 3);
        write_l2_rate(&tier, key(item), 2).await;
    }
    observed
        .observer
        .sample_round(Some(&hot(&[key(24), key(25)])))
        .await;

    let report = observed.finish().await;
    assert_eq!(report.drift.skipped, 1);
    assert_eq!(
        counts(&report.sources.sample),
        [(2, 1, 0, 0); 3],
        "both products agree; one rate is followed"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreadable_l2_is_unknown_at_every_window() {
    let (observed, tier) = observed_over_l2(settings());
    tier.set_failing(true);
    observed.observer.sample_round(Some(&hot(&[key(26)]))).await;
    let report = observed.finish().await;
    assert_eq!(counts(&report.sources.sample), [(0, 0, 2, 0); 3]);
}

#[tokio::test(start_paused = true)]
async fn hot_keys_come_first_then_renderings_then_more_hot_keys() {
    let observed = observed_with(
        ObserverConfig {
            drift_keys_per_sec: 4,
            ..settings()
        },
        None,
    );
    for item in [50, 51, 52] {
        observed.rows.set(key(item), PartKind::Product, 1);
        observed.rows.set(key(item), PartKind::Rate, 1);
        observed.request(key(item)).await;
    }
    let hot_keys = hot(&[key(40), key(41), key(42), key(50)]);

    let drawn = observed.observer.draw(Some(&hot_keys));
    assert_eq!(drawn.len(), 4, "{drawn:?}");
    assert_eq!(
        drawn[..2],
        [key(40), key(41)],
        "half the round from the hottest"
    );
    let renderings = [key(50), key(51), key(52)];
    assert!(
        drawn[2..].iter().all(|drawn| renderings.contains(drawn)),
        "{drawn:?}"
    );
    let unique: std::collections::HashSet<_> = drawn.iter().collect();
    assert_eq!(unique.len(), 4, "no key twice: {drawn:?}");

    // Too few renderings: more hot keys fill the round.
    let sparse = observed_with(
        ObserverConfig {
            drift_keys_per_sec: 4,
            ..settings()
        },
        None,
    );
    sparse.rows.set(key(60), PartKind::Product, 1);
    sparse.rows.set(key(60), PartKind::Rate, 1);
    sparse.request(key(60)).await;
    let drawn = sparse.observer.draw(Some(&hot_keys));
    assert_eq!(drawn, [key(40), key(41), key(60), key(42)]);
}

#[tokio::test(start_paused = true)]
async fn the_sampler_runs_a_round_a_second_until_shutdown() {
    let (observed, tier) = observed_over_l2(settings());
    observed.rows.set(key(27), PartKind::Rate, 3);
    write_l2_rate(&tier, key(27), 2).await;
    observed
        .observer
        .start_drift_sampler(Some(Arc::new(hot(&[key(27)]))));
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let report = observed.observer.report();
    assert_eq!(
        report.drift.drawn, 1,
        "the key is followed, not drawn again"
    );
    assert_eq!(report.sources.sample[0].inconsistent, 1, "its 1 s look");
    observed.shutdown.cancel();
    let report = observed.finish().await;
    assert_eq!(report.drift.following, 0);
}

#[tokio::test(start_paused = true)]
async fn no_sampler_when_its_rate_is_zero() {
    let observed = observed_with(
        ObserverConfig {
            drift_keys_per_sec: 0,
            ..settings()
        },
        None,
    );
    observed.observer.start_drift_sampler(None);
    let report = observed.finish().await;
    assert_eq!(report.drift.drawn, 0);
}

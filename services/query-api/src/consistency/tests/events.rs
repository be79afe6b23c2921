//! The event path: applied events (an operator's or change capture's) looked at after each
//! window.

use super::*;
use crate::consistency::{BySource, CheckSource, Outcome, nines};
use crate::test_log::CapturedLines;

const AHEAD_LINE: &str = "event ahead of the store";

#[tokio::test(start_paused = true)]
async fn a_mistyped_version_is_ahead_of_store_at_every_window_and_logged_once() {
    let (captured, _guard) = CapturedLines::start();
    let observed = observed();
    observed.rows.set(key(4), PartKind::Rate, 4);
    observed.observer.observe(&rate_changed(4, 40_000_000_000));

    let report = observed.finish().await;
    assert_eq!(counts(&report.windows), [(0, 0, 0, 1); 3]);
    assert_eq!(report.ahead_of_store, 1);
    let lines = captured.containing(AHEAD_LINE);
    assert_eq!(lines.len(), 1, "{:?}", captured.lines());
    for field in [
        "source=event",
        "event_id=evt-4-40000000000",
        "key=jd:4",
        "part=rate",
        "event_version=40000000000",
        "store_version=4",
        "why=more_than_max_version_gap",
        "window_ms=1000",
    ] {
        assert!(lines[0].contains(field), "{field} missing: {lines:?}");
    }
    assert!(lines[0].starts_with("WARN "), "{lines:?}");
}

#[tokio::test(start_paused = true)]
async fn an_event_the_store_holds_is_consistent_and_says_nothing() {
    let (captured, _guard) = CapturedLines::start();
    let observed = observed();
    observed.rows.set(key(5), PartKind::Rate, 5);
    observed.observer.observe(&rate_changed(5, 5));

    let report = observed.finish().await;
    assert_eq!(counts(&report.windows), [(1, 0, 0, 0); 3]);
    assert_eq!(report.ahead_of_store, 0);
    assert!(captured.lines().is_empty(), "{:?}", captured.lines());
}

#[tokio::test(start_paused = true)]
async fn an_event_slightly_ahead_is_judged_at_the_first_window_at_or_after_the_fence() {
    let (captured, _guard) = CapturedLines::start();
    let observed = observed();
    // The store never reaches the event's version.
    observed.rows.set(key(6), PartKind::Rate, 5);
    observed.observer.observe(&rate_changed(6, 7));
    // The store reaches it between the 10 s and the 60 s look.
    observed.rows.set(key(7), PartKind::Rate, 5);
    observed.observer.observe(&rate_changed(7, 7));
    tokio::time::sleep(Duration::from_secs(30)).await;
    observed.rows.set(key(7), PartKind::Rate, 7);

    let report = observed.finish().await;
    assert_eq!(
        counts(&report.windows),
        [(2, 0, 0, 0), (2, 0, 0, 0), (1, 0, 0, 1)],
        "before the fence falls, an event slightly ahead may still be met by its write"
    );
    assert_eq!(report.ahead_of_store, 1);
    let lines = captured.containing(AHEAD_LINE);
    assert_eq!(lines.len(), 1, "{:?}", captured.lines());
    assert!(lines[0].contains("key=jd:6"), "{lines:?}");
    assert!(lines[0].contains("why=not_reached_in_time"), "{lines:?}");
    assert!(lines[0].contains("window_ms=60000"), "{lines:?}");
}

#[tokio::test(start_paused = true)]
async fn a_tier_behind_the_store_is_inconsistent_even_when_the_event_is_ahead() {
    let (captured, _guard) = CapturedLines::start();
    let observed = observed();
    observed.rows.set(key(8), PartKind::Rate, 3);
    let cached = observed
        .engine
        .parts()
        .rate
        .get(key(8), Duration::from_secs(1))
        .await;
    assert!(
        matches!(&cached, rebate_cache::CacheOutcome::Loaded(entry) if entry.version == 3),
        "L1 holds version 3"
    );
    observed.rows.set(key(8), PartKind::Rate, 4);
    observed.observer.observe(&rate_changed(8, 40_000_000_000));

    let report = observed.finish().await;
    assert_eq!(counts(&report.windows), [(0, 1, 0, 0); 3]);
    assert_eq!(report.ahead_of_store, 1, "counted all the same");
    assert_eq!(captured.containing(AHEAD_LINE).len(), 1);
    assert_eq!(captured.containing("inconsistent").len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_missing_row_is_nothing_to_be_ahead_of() {
    let observed = observed();
    observed.observer.observe(&rate_changed(9, 40_000_000_000));
    let report = observed.finish().await;
    assert_eq!(counts(&report.windows), [(1, 0, 0, 0); 3]);
    assert_eq!(report.ahead_of_store, 0);
}

/// A rendering that outlived a change (here: L1's copy dropped, the rendering left, and the
/// event observed without being applied, as if its invalidation were lost) is what a client
/// gets: inconsistent, with the rendering's version in the line.
#[tokio::test(start_paused = true)]
async fn a_rendering_kept_at_an_old_version_is_inconsistent_after_an_event() {
    let (captured, _guard) = CapturedLines::start();
    let observed = observed();
    observed.rows.set(key(10), PartKind::Product, 1);
    observed.rows.set(key(10), PartKind::Rate, 3);
    observed.request(key(10)).await;
    observed.engine.parts().rate.invalidate(&key(10));
    assert!(
        observed
            .engine
            .parts()
            .view(PartKind::Rate)
            .l1_entry(&key(10))
            .is_none(),
        "only the rendering holds the old rate"
    );
    observed.rows.set(key(10), PartKind::Rate, 4);
    observed.observer.observe(&rate_changed(10, 4));

    let report = observed.finish().await;
    assert_eq!(counts(&report.windows), [(0, 1, 0, 0); 3]);
    let lines = captured.containing("inconsistent");
    assert_eq!(lines.len(), 3, "{:?}", captured.lines());
    for field in [
        "rendering_version=3",
        "store_version=4",
        "event_version=4",
        "source=event",
    ] {
        assert!(lines[0].contains(field), "{field} missing: {lines:?}");
    }
    assert!(
        !lines[0].contains("l1_version"),
        "L1 holds nothing: {lines:?}"
    );
    assert_eq!(
        observed.engine.rendered_stats().unwrap().hits,
        0,
        "looking at the rendering is no hit"
    );
}

/// An applied event whose invalidation reached the engine leaves no rendering behind.
#[tokio::test(start_paused = true)]
async fn an_applied_event_leaves_no_old_rendering() {
    let observed = observed();
    observed.rows.set(key(11), PartKind::Product, 1);
    observed.rows.set(key(11), PartKind::Rate, 3);
    observed.request(key(11)).await;
    observed.rows.set(key(11), PartKind::Rate, 4);
    observed
        .engine
        .invalidate(key(11), PartKind::Rate, 4, Duration::from_secs(60), false)
        .await
        .unwrap();
    observed.observer.observe(&rate_changed(11, 4));

    let report = observed.finish().await;
    assert_eq!(counts(&report.windows), [(1, 0, 0, 0); 3]);
}

#[tokio::test(start_paused = true)]
async fn a_binlog_event_counts_under_its_own_source() {
    let observed = observed();
    observed.rows.set(key(12), PartKind::Rate, 6);
    observed.rows.set(key(13), PartKind::Rate, 2);
    observed
        .observer
        .observe(&rate_changed_by("binlog:mysql-bin.000042:1337", 12, 6));
    observed.observer.observe(&rate_changed(13, 2));
    observed
        .observer
        .observe(&rate_changed_by("binlog:mysql-bin.000042:1400", 13, 2));

    let report = observed.finish().await;
    assert_eq!(counts(&report.sources.binlog), [(2, 0, 0, 0); 3]);
    assert_eq!(counts(&report.sources.event), [(1, 0, 0, 0); 3]);
    assert_eq!(counts(&report.sources.sample), [(0, 0, 0, 0); 3]);
    assert_eq!(
        counts(&report.windows),
        [(3, 0, 0, 0); 3],
        "every event, whatever its source"
    );
}

#[test]
fn an_event_id_tells_its_source() {
    let source = |id: &str| CheckSource::of(&rate_changed_by(id, 1, 1));
    assert_eq!(source("binlog:mysql-bin.000001:4"), CheckSource::Binlog);
    assert_eq!(source("evt-1"), CheckSource::Event);
    assert_eq!(
        source("binlog-1"),
        CheckSource::Event,
        "the prefix has a colon"
    );
    assert_eq!(source("my:binlog:1"), CheckSource::Event);
    let names = BySource::from_fn(CheckSource::as_str);
    assert_eq!(
        serde_json::to_value(names).unwrap(),
        serde_json::json!({"event": "event", "binlog": "binlog", "sample": "sample"})
    );
    for source in CheckSource::ALL {
        assert_eq!(*BySource::from_fn(|each| each).get(source), source);
    }
}

#[test]
fn the_nines_are_capped_at_what_the_count_can_show() {
    assert_eq!(nines(0, 0), None, "nothing checked");
    assert_eq!(nines(1, 0), Some(0.0), "one clean check shows nothing");
    assert_eq!(nines(1_000, 0), Some(3.0), "as if one in 1,000 failed");
    assert_eq!(nines(999, 1), Some(3.0));
    assert_eq!(nines(0, 5), Some(0.0));
    let two = nines(99, 1).unwrap();
    assert!((two - 2.0).abs() < 1e-9, "{two}");
}

#[test]
fn the_verdict_window_is_the_first_at_or_after_the_fence_else_the_last() {
    let verdict = |windows: &[u64], fence_secs: u64| {
        let observed = observed();
        let observer = ConsistencyObserver::new(
            ObserverConfig {
                windows: windows
                    .iter()
                    .map(|secs| Duration::from_secs(*secs))
                    .collect(),
                max_pending: 1,
                fence_for: Duration::from_secs(fence_secs),
                max_version_gap: 1,
                ..settings()
            },
            observed.engine.clone(),
            Arc::clone(&observed.rows) as Arc<dyn CatalogRepository>,
            TaskTracker::new(),
            CancellationToken::new(),
        );
        observer.verdict_window
    };
    assert_eq!(verdict(&[1, 10, 60], 60), 2);
    assert_eq!(verdict(&[1, 10, 60], 5), 1);
    assert_eq!(verdict(&[1, 10, 60], 1), 0);
    assert_eq!(
        verdict(&[1, 10, 60], 600),
        2,
        "none reaches the fence: the last"
    );
    assert_eq!(verdict(&[3, 6], 60), 1);
}

#[test]
fn every_outcome_has_its_name_and_its_count() {
    let report = WindowReport {
        window_ms: 1_000,
        consistent: 1,
        inconsistent: 2,
        unknown: 3,
        ahead_of_store: 4,
        nines: None,
    };
    let named: Vec<(&str, u64)> = Outcome::ALL
        .iter()
        .map(|outcome| (outcome.as_str(), report.count(*outcome)))
        .collect();
    assert_eq!(
        named,
        [
            ("consistent", 1),
            ("inconsistent", 2),
            ("unknown", 3),
            ("ahead_of_store", 4)
        ]
    );
    for (index, outcome) in Outcome::ALL.iter().enumerate() {
        assert_eq!(*outcome as usize, index);
    }
}

#[tokio::test(start_paused = true)]
async fn a_rules_announcement_is_not_observed() {
    let observed = observed();
    let announcement = InvalidationEvent::rules_changed(
        EventId::parse("rules-9").expect("valid id"),
        9,
        Timestamp::now(),
    )
    .expect("valid announcement");
    observed.observer.observe(&announcement);

    let report = observed.finish().await;
    assert_eq!(counts(&report.windows), [(0, 0, 0, 0); 3]);
    assert_eq!((report.pending, report.skipped), (0, 0));
}

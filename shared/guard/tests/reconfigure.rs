//! Reconfiguring a running [`DependencyGuard`]: every part keeps its state (the breaker's state
//! and window, the calls in flight, the tokens held) and takes the new values at its next
//! decision; what only a new guard can change is kept and named.
//!
//! Time never comes from the wall clock: the breaker and the quota read a [`ManualTicker`] the
//! tests move by hand, and attempt timeouts and back-offs run on tokio's paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rebate_cache::{FailureKind, ItemKey, LoadFailure};
use rebate_guard::dependency::RetrySnapshot;
use rebate_guard::{AttemptFailure, DependencyConfig, DependencyGuard, HotItemConfig};
use rebate_resilience::{BreakerConfig, BreakerState, ManualTicker, RateConfig, RetryConfig};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

fn breaker() -> BreakerConfig {
    BreakerConfig {
        window: Duration::from_secs(10),
        buckets: 10,
        failure_ratio: 0.5,
        min_calls: 4,
        slow_call: Duration::from_secs(60),
        cool_down: Duration::from_secs(5),
        max_cool_down: Duration::from_secs(60),
        probe_stages: 1,
    }
}

fn retry(max_per_request: u32) -> RetryConfig {
    RetryConfig {
        max_per_request,
        ratio: 1.0,
        max_saved: 10,
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
    }
}

/// Every part on: breaker, two slots, a quota of 2 a second (3 at once), retries, a 1 s timeout.
fn config() -> DependencyConfig {
    DependencyConfig {
        breaker: breaker(),
        max_concurrent: 2,
        quota: Some(RateConfig {
            per_second: 2.0,
            burst: 3,
        }),
        fleet_quota: None,
        retry: Some(retry(2)),
        timeout: Some(Duration::from_secs(1)),
    }
}

fn guard(config: DependencyConfig) -> (Arc<DependencyGuard>, ManualTicker) {
    let ticker = ManualTicker::new();
    let guard = DependencyGuard::new("coupons", config, Arc::new(ticker.clone()));
    (Arc::new(guard), ticker)
}

async fn succeed(guard: &DependencyGuard) -> Result<(), LoadFailure> {
    guard.call(|| async { Ok::<_, AttemptFailure>(()) }).await
}

async fn fail(guard: &DependencyGuard, calls: &AtomicU32) -> LoadFailure {
    guard
        .call(|| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(AttemptFailure::transient(LoadFailure::error("502"))) }
        })
        .await
        .unwrap_err()
}

/// Starts a call whose inner call waits for the returned [`Notify`]; returns once it runs.
async fn hold(guard: &Arc<DependencyGuard>) -> (JoinHandle<Result<(), LoadFailure>>, Arc<Notify>) {
    let (started_tx, started_rx) = oneshot::channel();
    let release = Arc::new(Notify::new());
    let task = {
        let (guard, release) = (Arc::clone(guard), Arc::clone(&release));
        let mut started_tx = Some(started_tx);
        tokio::spawn(async move {
            guard
                .call(move || {
                    let started_tx = started_tx.take();
                    let release = Arc::clone(&release);
                    async move {
                        if let Some(started_tx) = started_tx {
                            let _ = started_tx.send(());
                        }
                        release.notified().await;
                        Ok::<_, AttemptFailure>(())
                    }
                })
                .await
        })
    };
    started_rx.await.expect("the held call started");
    (task, release)
}

#[tokio::test(start_paused = true)]
async fn the_snapshot_shows_every_value_in_force_and_the_answer_names_what_needs_a_new_guard() {
    let (guard, _ticker) = guard(config());
    let changed = DependencyConfig {
        breaker: BreakerConfig {
            buckets: 40,
            failure_ratio: 0.8,
            min_calls: 9,
            cool_down: Duration::from_secs(7),
            ..breaker()
        },
        max_concurrent: 5,
        quota: Some(RateConfig {
            per_second: 9.0,
            burst: 4,
        }),
        retry: Some(RetryConfig {
            ratio: 0.3,
            ..retry(1)
        }),
        timeout: Some(Duration::from_millis(250)),
        ..config()
    };
    assert_eq!(
        guard.reconfigure(changed.clone()).fields,
        ["breaker.buckets"]
    );
    let snapshot = guard.snapshot();
    let thresholds = &snapshot.breaker_thresholds;
    assert_eq!(
        (
            thresholds.buckets,
            thresholds.failure_ratio,
            thresholds.min_calls
        ),
        (10, 0.8, 9),
        "the bucket count it was built with"
    );
    assert_eq!(thresholds.cool_down_ms, 7_000);
    assert_eq!(snapshot.bulkhead.max, 5);
    let quota = snapshot.quota.unwrap();
    assert_eq!((quota.per_second, quota.burst), (9.0, 4));
    assert_eq!(
        snapshot.retry,
        Some(RetrySnapshot {
            max_per_request: 1,
            ratio: 0.3,
            first_attempts: 0,
            retries: 0,
            refused: 0,
        })
    );
    assert_eq!(snapshot.timeout_ms, Some(250));

    let without_parts = DependencyConfig {
        quota: None,
        retry: None,
        timeout: None,
        ..changed
    };
    assert_eq!(
        guard.reconfigure(without_parts).fields,
        ["breaker.buckets", "quota", "retry"]
    );
    let snapshot = guard.snapshot();
    assert!(snapshot.quota.is_some() && snapshot.retry.is_some(), "kept");
    assert_eq!(snapshot.timeout_ms, None, "the timeout is live");
    let hot_items = HotItemConfig {
        rate: RateConfig {
            per_second: 1.0,
            burst: 1,
        },
        max_items: 10,
    };
    assert_eq!(
        guard.reconfigure_hot_items(hot_items).fields,
        ["hot_items"],
        "built without a per-item limit"
    );
}

#[tokio::test(start_paused = true)]
async fn calls_in_flight_keep_their_slots_and_the_refusal_names_the_new_bound() {
    let (guard, _ticker) = guard(config());
    let (first, release_first) = hold(&guard).await;
    let (second, release_second) = hold(&guard).await;
    assert!(
        guard
            .reconfigure(DependencyConfig {
                max_concurrent: 1,
                ..config()
            })
            .is_empty()
    );
    let snapshot = guard.snapshot().bulkhead;
    assert_eq!((snapshot.max, snapshot.in_flight), (1, 2));
    let refused = succeed(&guard).await.unwrap_err();
    assert_eq!(refused.kind, FailureKind::BulkheadFull);
    assert_eq!(
        &*refused.detail,
        "coupons: all 1 slots for concurrent calls taken"
    );

    release_first.notify_one();
    assert_eq!(first.await.unwrap(), Ok(()), "its slot held to the end");
    assert_eq!(
        succeed(&guard).await.unwrap_err().kind,
        FailureKind::BulkheadFull,
        "one in flight at a bound of one"
    );
    release_second.notify_one();
    assert_eq!(second.await.unwrap(), Ok(()));
    assert_eq!(succeed(&guard).await, Ok(()));
    assert_eq!(guard.snapshot().bulkhead.in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_stays_open_through_a_reconfiguration() {
    let (guard, ticker) = guard(DependencyConfig {
        retry: None,
        quota: None,
        ..config()
    });
    let calls = AtomicU32::new(0);
    for _ in 0..4 {
        fail(&guard, &calls).await;
    }
    let before = guard.snapshot().breaker;
    assert_eq!(before.state, BreakerState::Open);
    assert!(
        guard
            .reconfigure(DependencyConfig {
                breaker: BreakerConfig {
                    failure_ratio: 0.9,
                    min_calls: 100,
                    ..breaker()
                },
                retry: None,
                quota: None,
                ..config()
            })
            .is_empty()
    );
    assert_eq!(
        guard.snapshot().breaker,
        before,
        "state, window and cool-down kept"
    );
    assert_eq!(
        succeed(&guard).await.unwrap_err().kind,
        FailureKind::BreakerOpen
    );
    ticker.advance(Duration::from_secs(5));
    assert_eq!(
        succeed(&guard).await,
        Ok(()),
        "the probe after its cool-down"
    );
    assert_eq!(guard.breaker().state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn the_quota_keeps_its_tokens_and_refills_at_the_new_rate() {
    let (guard, ticker) = guard(config());
    for _ in 0..2 {
        succeed(&guard).await.unwrap();
    }
    let faster = RateConfig {
        per_second: 10.0,
        burst: 3,
    };
    assert!(
        guard
            .reconfigure(DependencyConfig {
                quota: Some(faster),
                ..config()
            })
            .is_empty()
    );
    assert_eq!(succeed(&guard).await, Ok(()), "the one token it held");
    assert_eq!(succeed(&guard).await.unwrap_err().kind, FailureKind::Quota);
    assert_eq!(guard.wait_for_quota(), Duration::from_millis(100));
    ticker.advance(Duration::from_millis(100));
    assert_eq!(succeed(&guard).await, Ok(()));
}

#[tokio::test(start_paused = true)]
async fn a_new_timeout_and_retry_allowance_apply_to_the_next_call() {
    let (guard, _ticker) = guard(DependencyConfig {
        quota: None,
        ..config()
    });
    let shorter = DependencyConfig {
        quota: None,
        timeout: Some(Duration::from_millis(100)),
        retry: Some(retry(0)),
        ..config()
    };
    assert!(guard.reconfigure(shorter).is_empty());
    let failure = guard
        .call(|| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, AttemptFailure>(())
        })
        .await
        .unwrap_err();
    assert_eq!(failure.kind, FailureKind::Timeout);
    assert_eq!(&*failure.detail, "coupons did not answer within 100 ms");

    let calls = AtomicU32::new(0);
    // Successes that keep the breaker closed through the failures below.
    for _ in 0..10 {
        succeed(&guard).await.unwrap();
    }
    fail(&guard, &calls).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no retry allowed any more");
    assert!(
        guard
            .reconfigure(DependencyConfig {
                quota: None,
                retry: Some(retry(2)),
                ..config()
            })
            .is_empty()
    );
    fail(&guard, &calls).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1 + 3, "two retries again");
}

/// A guard reconfigured from two threads while two others call it: nothing panics, every slot
/// is given back, and the last reconfiguration's values are the ones in force.
#[test]
fn reconfigurations_from_many_threads_under_calls_end_with_the_last_values() {
    const ROUNDS: u32 = 2_000;
    let variant = |n: u32| {
        let step = f64::from(n);
        (
            DependencyConfig {
                breaker: BreakerConfig {
                    window: Duration::from_secs(5 + u64::from(n)),
                    failure_ratio: 0.4 + 0.1 * step,
                    min_calls: 3 + n,
                    cool_down: Duration::from_millis(1 + u64::from(n)),
                    ..breaker()
                },
                max_concurrent: 1 + n,
                quota: Some(RateConfig {
                    per_second: 1_000.0 * (1.0 + step),
                    burst: 2 + n,
                }),
                fleet_quota: None,
                retry: Some(RetryConfig {
                    ratio: 0.2 * (1.0 + step),
                    ..retry(n % 3)
                }),
                timeout: Some(Duration::from_secs(1 + u64::from(n))),
            },
            HotItemConfig {
                rate: RateConfig {
                    per_second: 10.0 * (1.0 + step),
                    burst: 1 + n,
                },
                max_items: 100,
            },
        )
    };
    let (first, first_items) = variant(0);
    let ticker = ManualTicker::new();
    let guard = DependencyGuard::new("coupons", first, Arc::new(ticker.clone()))
        .with_hot_items(first_items);
    let (last, last_items) = variant(3);
    let item = ItemKey::parse("taobao", "100001").unwrap();
    std::thread::scope(|scope| {
        for thread in 0..2 {
            let (guard, last, ticker) = (&guard, &last, &ticker);
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    let (config, items) = variant((round + thread) % 3);
                    assert!(guard.reconfigure(config).is_empty());
                    assert!(guard.reconfigure_hot_items(items).is_empty());
                }
                assert!(guard.reconfigure(last.clone()).is_empty());
                assert!(guard.reconfigure_hot_items(last_items).is_empty());
            });
            scope.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    for round in 0..ROUNDS {
                        let _ = guard.admit_item(item);
                        let _ = guard
                            .call(|| async move {
                                if round.is_multiple_of(3) {
                                    Err(AttemptFailure::permanent(LoadFailure::error("500")))
                                } else {
                                    Ok(())
                                }
                            })
                            .await;
                        if round.is_multiple_of(50) {
                            ticker.advance(Duration::from_millis(1));
                        }
                    }
                });
            });
        }
    });

    assert_eq!(guard.breaker().config(), last.breaker);
    let snapshot = guard.snapshot();
    let breaker = &snapshot.breaker_thresholds;
    assert_eq!(
        (breaker.window_ms, breaker.failure_ratio, breaker.min_calls),
        (8_000, last.breaker.failure_ratio, 6)
    );
    assert_eq!((snapshot.bulkhead.max, snapshot.bulkhead.in_flight), (4, 0));
    let quota = snapshot.quota.unwrap();
    assert_eq!((quota.per_second, quota.burst), (4_000.0, 5));
    let retry = snapshot.retry.unwrap();
    let asked = last.retry.unwrap();
    assert_eq!(
        (retry.max_per_request, retry.ratio),
        (asked.max_per_request, asked.ratio)
    );
    assert_eq!(snapshot.timeout_ms, Some(4_000));
    let hot_items = snapshot.hot_items.unwrap();
    assert_eq!((hot_items.per_second, hot_items.burst), (40.0, 4));
}

//! The guard's public contract: breaker, bulkhead, quota, attempt timeout, budgeted retries, the
//! observer and the request timeline, and [`GuardedTier`] in front of an in-process L2.
//!
//! Time never comes from the wall clock: the breaker and the quota read a [`ManualTicker`] the
//! tests move by hand, and attempt timeouts and back-offs run on tokio's paused clock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rebate_cache::{
    FailureKind, FenceOutcome, ItemKey, LoadContext, LoadFailure, MemoryTier, SharedTier,
    TierEntry, TierError, TierKey,
};
use rebate_domain::PartKind;
use rebate_guard::dependency::RetrySnapshot;
use rebate_guard::{
    AttemptFailure, CallObserver, CallOutcome, DependencyConfig, DependencyGuard, GuardedTier,
    HotItemConfig, QuotaScope, QuotaSnapshot,
};
use rebate_resilience::{BreakerConfig, BreakerState, ManualTicker, RateConfig, RetryConfig};
use rebate_telemetry::{Timeline, TraceId};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const COOL_DOWN: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

/// Every attempt and refusal a guard reported, in order.
#[derive(Debug, Default)]
struct Recorder {
    seen: Mutex<Vec<(&'static str, CallOutcome, Duration)>>,
}

impl CallObserver for Recorder {
    fn observe(&self, dependency: &'static str, outcome: CallOutcome, elapsed: Duration) {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((dependency, outcome, elapsed));
    }
}

impl Recorder {
    fn seen(&self) -> Vec<(&'static str, CallOutcome, Duration)> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn outcomes(&self) -> Vec<CallOutcome> {
        self.seen()
            .into_iter()
            .map(|(_, outcome, _)| outcome)
            .collect()
    }

    fn last(&self) -> Option<(&'static str, CallOutcome, Duration)> {
        self.seen().last().copied()
    }
}

/// A breaker that opens once `min_calls` calls are in its 10 s window and half of them failed,
/// stays open for [`COOL_DOWN`] and closes after a single successful probe. Its slow-call
/// threshold is far out of reach: the ticker never moves during a call.
fn breaker(min_calls: u32) -> BreakerConfig {
    BreakerConfig {
        window: Duration::from_secs(10),
        buckets: 10,
        failure_ratio: 0.5,
        min_calls,
        slow_call: Duration::from_secs(60),
        cool_down: COOL_DOWN,
        max_cool_down: Duration::from_secs(60),
        probe_stages: 1,
    }
}

/// No quota, no retries, no timeout, plenty of slots: each test turns on what it is about.
fn settings() -> DependencyConfig {
    DependencyConfig {
        breaker: breaker(4),
        max_concurrent: 16,
        quota: None,
        fleet_quota: None,
        retry: None,
        timeout: None,
    }
}

/// Retries whose global budget earns a whole retry per first attempt, with a 10 ms back-off.
fn retries(max_per_request: u32) -> RetryConfig {
    RetryConfig {
        max_per_request,
        ratio: 1.0,
        max_saved: 10,
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
    }
}

struct Fixture {
    guard: Arc<DependencyGuard>,
    ticker: ManualTicker,
    observer: Arc<Recorder>,
    /// How often the inner call actually ran.
    calls: AtomicU32,
}

fn fixture(name: &'static str, settings: DependencyConfig) -> Fixture {
    let ticker = ManualTicker::new();
    let observer = Arc::new(Recorder::default());
    let guard = DependencyGuard::new(name, settings, Arc::new(ticker.clone()))
        .with_observer(Arc::clone(&observer) as Arc<dyn CallObserver>);
    Fixture {
        guard: Arc::new(guard),
        ticker,
        observer,
        calls: AtomicU32::new(0),
    }
}

impl Fixture {
    /// One guarded call whose inner call answers `answer(n)` on its `n`th run (1-based, counted
    /// over the fixture's whole life).
    async fn call(
        &self,
        answer: impl Fn(u32) -> Result<u32, AttemptFailure>,
    ) -> Result<u32, LoadFailure> {
        self.guard
            .call(|| {
                let run = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
                let answer = answer(run);
                async move { answer }
            })
            .await
    }

    async fn succeed(&self) -> Result<u32, LoadFailure> {
        self.call(Ok).await
    }

    async fn fail(&self, failure: fn() -> AttemptFailure) -> Result<u32, LoadFailure> {
        self.call(|_| Err(failure())).await
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Fails `n` calls permanently and checks that the breaker is open afterwards.
    async fn trip(&self, n: u32) {
        for _ in 0..n {
            let failure = self.fail(permanent).await.unwrap_err();
            assert_eq!(failure.kind, FailureKind::Error);
        }
        assert_eq!(self.guard.breaker().state(), BreakerState::Open);
    }
}

fn transient() -> AttemptFailure {
    AttemptFailure::transient(LoadFailure::error("502 bad gateway"))
}

fn permanent() -> AttemptFailure {
    AttemptFailure::permanent(LoadFailure::error("404 not found"))
}

/// Starts a call on its own task whose inner call waits for the returned [`Notify`]; returns once
/// the inner call is running, so the call is in flight and holds its slot.
async fn hold(
    guard: &Arc<DependencyGuard>,
) -> (JoinHandle<Result<&'static str, LoadFailure>>, Arc<Notify>) {
    let (started_tx, started_rx) = oneshot::channel();
    let release = Arc::new(Notify::new());
    let task = {
        let guard = Arc::clone(guard);
        let release = Arc::clone(&release);
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
                        Ok::<_, AttemptFailure>("held")
                    }
                })
                .await
        })
    };
    started_rx.await.expect("the held call started");
    (task, release)
}

/// Fails the test if `future` has to wait: on the paused clock, a refusal that waited for a
/// timer or for another call would run into this second.
async fn at_once<T>(future: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let output = tokio::time::timeout(Duration::from_secs(1), future)
        .await
        .expect("answered without waiting");
    assert_eq!(started.elapsed(), Duration::ZERO, "no time passed");
    output
}

// ---------------------------------------------------------------------------------------------
// 1, 2. The circuit breaker
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_open_breaker_refuses_at_once_without_calling_or_counting_a_failure() {
    let fixture = fixture("coupons", settings());
    fixture.trip(4).await;
    let before = fixture.guard.snapshot();

    for _ in 0..3 {
        let refused = at_once(fixture.succeed()).await.unwrap_err();
        assert_eq!(refused.kind, FailureKind::BreakerOpen);
        assert_eq!(&*refused.detail, "coupons: circuit breaker open");
        assert_eq!(
            fixture.observer.last(),
            Some(("coupons", CallOutcome::BreakerOpen, Duration::ZERO))
        );
    }

    assert_eq!(fixture.calls(), 4, "the inner call never ran while open");
    assert!(!fixture.guard.ready(), "an open breaker: not ready");
    let after = fixture.guard.snapshot();
    assert_eq!(after.rejected_breaker, 3);
    assert_eq!(
        (
            after.attempts,
            after.failures,
            after.timeouts,
            after.successes
        ),
        (
            before.attempts,
            before.failures,
            before.timeouts,
            before.successes
        ),
        "refusals are neither attempts nor failures"
    );
    assert_eq!(
        (after.breaker.calls, after.breaker.failures),
        (4, 4),
        "nor do they enter the breaker's window"
    );
    assert_eq!(after.breaker.trips, 1);
    assert_eq!(
        after.breaker.open_for_ms,
        Some(5_000),
        "and refusing does not extend the cool-down"
    );
}

#[tokio::test]
async fn the_breaker_opens_once_min_calls_are_in_the_window_and_the_failure_ratio_is_reached() {
    // Every call fails, but three calls are too few to trust the ratio.
    let all_failing = fixture("mysql", settings());
    for _ in 0..3 {
        all_failing.fail(permanent).await.unwrap_err();
    }
    assert_eq!(all_failing.guard.breaker().state(), BreakerState::Closed);
    all_failing.fail(permanent).await.unwrap_err();
    assert_eq!(
        all_failing.guard.breaker().state(),
        BreakerState::Open,
        "four of four"
    );

    // Enough calls, but below half of them failed until the sixth.
    let mixed = fixture("mysql", settings());
    for _ in 0..3 {
        mixed.succeed().await.unwrap();
    }
    for _ in 0..2 {
        mixed.fail(permanent).await.unwrap_err();
    }
    assert_eq!(
        mixed.guard.breaker().state(),
        BreakerState::Closed,
        "two of five is below the ratio"
    );
    mixed.fail(permanent).await.unwrap_err();
    let snapshot = mixed.guard.snapshot();
    assert_eq!(snapshot.breaker.state, BreakerState::Open, "three of six");
    assert_eq!((snapshot.breaker.calls, snapshot.breaker.failures), (6, 3));
    assert_eq!(snapshot.breaker.trips, 1);
}

#[tokio::test]
async fn after_the_cool_down_a_probe_is_admitted_and_its_success_closes_the_breaker() {
    let fixture = fixture("coupons", settings());
    fixture.trip(4).await;

    fixture.ticker.advance(COOL_DOWN - Duration::from_millis(1));
    let refused = fixture.succeed().await.unwrap_err();
    assert_eq!(
        refused.kind,
        FailureKind::BreakerOpen,
        "1 ms before the end"
    );
    assert_eq!(fixture.calls(), 4);

    fixture.ticker.advance(Duration::from_millis(1));
    assert_eq!(fixture.guard.breaker().state(), BreakerState::HalfOpen);
    let (probe, release) = hold(&fixture.guard).await;

    // One probe at a time: the next caller is refused while it is out.
    let refused = fixture.succeed().await.unwrap_err();
    assert_eq!(refused.kind, FailureKind::BreakerOpen);
    assert_eq!(fixture.calls(), 4);

    release.notify_one();
    assert_eq!(probe.await.unwrap(), Ok("held"));
    assert_eq!(fixture.guard.breaker().state(), BreakerState::Closed);
    assert_eq!(fixture.succeed().await, Ok(5));
    assert_eq!(fixture.guard.snapshot().rejected_breaker, 2);
}

#[tokio::test]
async fn a_failed_probe_reopens_the_breaker_for_a_doubled_cool_down() {
    let fixture = fixture("coupons", settings());
    fixture.trip(4).await;
    fixture.ticker.advance(COOL_DOWN);

    let failure = fixture.fail(permanent).await.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Error, "the probe was made");
    assert_eq!(fixture.calls(), 5);
    let snapshot = fixture.guard.snapshot();
    assert_eq!(snapshot.breaker.state, BreakerState::Open);
    assert_eq!(snapshot.breaker.trips, 2);

    fixture.ticker.advance(COOL_DOWN);
    assert_eq!(
        fixture.succeed().await.unwrap_err().kind,
        FailureKind::BreakerOpen,
        "still open after one cool-down"
    );
    fixture.ticker.advance(COOL_DOWN);
    assert_eq!(fixture.succeed().await, Ok(6));
    assert_eq!(fixture.guard.breaker().state(), BreakerState::Closed);
}

// ---------------------------------------------------------------------------------------------
// 3. The bulkhead
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_full_bulkhead_refuses_the_next_call_at_once_and_frees_the_slot_when_the_call_ends() {
    let fixture = fixture(
        "coupons",
        DependencyConfig {
            // A breaker that would open on a single failure: refusals must not be failures.
            breaker: breaker(1),
            max_concurrent: 1,
            ..settings()
        },
    );
    let (held, release) = hold(&fixture.guard).await;
    assert_eq!(fixture.guard.snapshot().bulkhead.in_flight, 1);

    let refused = at_once(fixture.succeed()).await.unwrap_err();
    assert_eq!(refused.kind, FailureKind::BulkheadFull);
    assert_eq!(
        &*refused.detail,
        "coupons: all 1 slots for concurrent calls taken"
    );
    assert_eq!(fixture.calls(), 0, "the refused call never ran");
    assert_eq!(
        fixture.observer.last(),
        Some(("coupons", CallOutcome::BulkheadFull, Duration::ZERO))
    );

    release.notify_one();
    assert_eq!(held.await.unwrap(), Ok("held"));
    assert_eq!(fixture.succeed().await, Ok(1), "the slot is free again");

    let snapshot = fixture.guard.snapshot();
    assert_eq!(snapshot.rejected_bulkhead, 1);
    assert_eq!(
        (snapshot.attempts, snapshot.successes, snapshot.failures),
        (2, 2, 0)
    );
    assert_eq!(snapshot.bulkhead.in_flight, 0);
    assert_eq!(snapshot.breaker.state, BreakerState::Closed);
    assert_eq!(snapshot.breaker.failures, 0);
}

// ---------------------------------------------------------------------------------------------
// 4. The outbound quota
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn calls_past_the_quota_burst_are_refused_until_the_ticker_brings_a_token_back() {
    let fixture = fixture(
        "coupons",
        DependencyConfig {
            breaker: breaker(1),
            // A token every 500 ms, three at once after a quiet spell.
            quota: Some(RateConfig {
                per_second: 2.0,
                burst: 3,
            }),
            fleet_quota: None,
            ..settings()
        },
    );
    assert!(fixture.guard.ready());
    for expected in 1..=3 {
        assert_eq!(fixture.succeed().await, Ok(expected));
    }
    assert!(
        !fixture.guard.ready(),
        "the burst is spent: a call now would be refused"
    );
    let refused = at_once(fixture.succeed()).await.unwrap_err();
    assert_eq!(refused.kind, FailureKind::Quota);
    assert_eq!(&*refused.detail, "coupons: outbound quota spent");
    assert_eq!(
        fixture.observer.last(),
        Some(("coupons", CallOutcome::Quota, Duration::ZERO))
    );
    assert_eq!(fixture.calls(), 3, "the refused call never ran");

    fixture.ticker.advance(Duration::from_millis(499));
    assert_eq!(
        fixture.succeed().await.unwrap_err().kind,
        FailureKind::Quota,
        "1 ms before the next token"
    );
    fixture.ticker.advance(Duration::from_millis(1));
    assert!(fixture.guard.ready(), "asking takes nothing");
    assert!(fixture.guard.ready());
    assert_eq!(fixture.succeed().await, Ok(4), "a token is back");
    assert_eq!(
        fixture.succeed().await.unwrap_err().kind,
        FailureKind::Quota
    );

    let snapshot = fixture.guard.snapshot();
    assert_eq!(
        snapshot.quota,
        Some(QuotaSnapshot {
            scope: QuotaScope::Instance,
            per_second: 2.0,
            burst: 3,
            granted: 4,
            refused: 3,
            fleet: None,
        })
    );
    assert_eq!(snapshot.rejected_quota, 3);
    assert_eq!((snapshot.attempts, snapshot.failures), (4, 0));
    assert_eq!(
        snapshot.breaker.state,
        BreakerState::Closed,
        "quota refusals are not the dependency's failures"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. The attempt timeout
// ---------------------------------------------------------------------------------------------

/// An inner call that answers after `delay` on tokio's (paused) clock.
async fn slow(delay: Duration) -> Result<u32, AttemptFailure> {
    tokio::time::sleep(delay).await;
    Ok(7)
}

#[tokio::test(start_paused = true)]
async fn an_attempt_slower_than_the_timeout_ends_as_a_timeout_failure() {
    let fixture = fixture(
        "coupons",
        DependencyConfig {
            timeout: Some(Duration::from_millis(100)),
            ..settings()
        },
    );
    let started = Instant::now();
    let failure = fixture
        .guard
        .call(|| slow(Duration::from_secs(10)))
        .await
        .unwrap_err();
    let elapsed = started.elapsed();

    assert_eq!(failure.kind, FailureKind::Timeout);
    assert_eq!(&*failure.detail, "coupons did not answer within 100 ms");
    assert!(
        (Duration::from_millis(100)..Duration::from_millis(102)).contains(&elapsed),
        "cut at the timeout, not at the call's 10 s: {elapsed:?}"
    );
    let (name, outcome, observed) = fixture.observer.last().unwrap();
    assert_eq!((name, outcome), ("coupons", CallOutcome::Timeout));
    assert!(observed >= Duration::from_millis(100), "{observed:?}");

    let snapshot = fixture.guard.snapshot();
    assert_eq!(
        (
            snapshot.attempts,
            snapshot.timeouts,
            snapshot.failures,
            snapshot.successes
        ),
        (1, 1, 0, 0),
        "a timeout is counted as such, not as an error"
    );
    assert_eq!(snapshot.timeout_ms, Some(100));
    assert_eq!(
        (snapshot.breaker.calls, snapshot.breaker.failures),
        (1, 1),
        "the breaker counts it as a failure"
    );
}

#[tokio::test(start_paused = true)]
async fn an_attempt_within_the_timeout_succeeds() {
    let fixture = fixture(
        "coupons",
        DependencyConfig {
            timeout: Some(Duration::from_millis(100)),
            ..settings()
        },
    );
    let value = fixture.guard.call(|| slow(Duration::from_millis(99))).await;
    assert_eq!(value, Ok(7));
    assert_eq!(fixture.observer.outcomes(), [CallOutcome::Success]);
}

#[tokio::test(start_paused = true)]
async fn the_part_timeout_of_the_load_context_shortens_the_attempt_but_never_lengthens_it() {
    let timed = |timeout: Option<Duration>| {
        fixture(
            "coupons",
            DependencyConfig {
                timeout,
                ..settings()
            },
        )
    };
    let request = LoadContext::new(None, 0);
    let cases = [
        // (the guard's timeout, the part's, the cut)
        (Some(500), 50, 50),
        (Some(100), 1_000, 100),
        (None, 80, 80),
    ];
    for (guard_ms, part_ms, expected_ms) in cases {
        let fixture = timed(guard_ms.map(Duration::from_millis));
        let started = Instant::now();
        let failure = request
            .for_part(Duration::from_millis(part_ms))
            .scope(fixture.guard.call(|| slow(Duration::from_secs(10))))
            .await
            .unwrap_err();
        let elapsed = started.elapsed();
        assert_eq!(failure.kind, FailureKind::Timeout);
        assert_eq!(
            &*failure.detail,
            format!("coupons did not answer within {expected_ms} ms")
        );
        let expected = Duration::from_millis(expected_ms);
        assert!(
            (expected..expected + Duration::from_millis(2)).contains(&elapsed),
            "guard {guard_ms:?}, part {part_ms}: cut after {elapsed:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn without_any_timeout_a_slow_attempt_is_waited_for() {
    let fixture = fixture("redis", settings());
    let value = fixture
        .guard
        .call(|| slow(Duration::from_secs(3_600)))
        .await;
    assert_eq!(value, Ok(7), "the client enforces its own timeout");
    assert_eq!(fixture.guard.snapshot().timeout_ms, None);
}

/// Pins the per-attempt budget documented on `attempt_budget` and `LoadContext` (measured from
/// the attempt's start, never cut by the starting request's deadline, so callers that joined the
/// load later are served). Note that `DependencyConfig::timeout`'s doc says "further capped by
/// the request's deadline", which the code does not do.
#[tokio::test(start_paused = true)]
async fn the_request_deadline_does_not_cut_an_attempt_short() {
    let fixture = fixture(
        "coupons",
        DependencyConfig {
            timeout: Some(Duration::from_millis(100)),
            ..settings()
        },
    );
    let deadline = Instant::now() + Duration::from_millis(10);
    let value = LoadContext::new(Some(deadline), 0)
        .scope(fixture.guard.call(|| slow(Duration::from_millis(50))))
        .await;
    assert_eq!(value, Ok(7));
    assert!(Instant::now() > deadline);
}

// ---------------------------------------------------------------------------------------------
// 6. Retries
// ---------------------------------------------------------------------------------------------

fn retrying(retry: RetryConfig) -> Fixture {
    fixture(
        "coupons",
        DependencyConfig {
            breaker: breaker(100),
            retry: Some(retry),
            ..settings()
        },
    )
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_retried_up_to_max_per_request_with_a_growing_back_off() {
    let fixture = retrying(retries(2));
    // Each first attempt earns a whole retry: the budget holds more than two, so what stops the
    // retries below is the per-request limit.
    for _ in 0..3 {
        fixture.succeed().await.unwrap();
    }

    let started = Instant::now();
    let failure = fixture.fail(transient).await.unwrap_err();
    let elapsed = started.elapsed();

    assert_eq!(failure.kind, FailureKind::Error);
    assert_eq!(&*failure.detail, "502 bad gateway");
    assert_eq!(fixture.calls(), 3 + 3, "the first attempt and two retries");
    // Back-offs of [5, 10] ms then [10, 20] ms (equal jitter), plus timer rounding.
    assert!(
        (Duration::from_millis(15)..=Duration::from_millis(32)).contains(&elapsed),
        "{elapsed:?}"
    );
    let snapshot = fixture.guard.snapshot();
    assert_eq!(
        snapshot.retry,
        Some(RetrySnapshot {
            max_per_request: 2,
            ratio: 1.0,
            first_attempts: 4,
            retries: 2,
            refused: 0,
        }),
        "the budget was not asked for a third"
    );
    assert_eq!((snapshot.attempts, snapshot.failures), (6, 3));
    assert_eq!(
        fixture.observer.outcomes(),
        [
            CallOutcome::Success,
            CallOutcome::Success,
            CallOutcome::Success,
            CallOutcome::Error,
            CallOutcome::Error,
            CallOutcome::Error
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_succeeds_answers_the_call() {
    let fixture = retrying(retries(2));
    let value = fixture
        .call(|run| if run == 1 { Err(transient()) } else { Ok(run) })
        .await;
    assert_eq!(value, Ok(2));
    assert_eq!(fixture.calls(), 2);
    assert_eq!(
        fixture.observer.outcomes(),
        [CallOutcome::Error, CallOutcome::Success]
    );
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_is_not_retried() {
    let fixture = retrying(retries(2));
    fixture.succeed().await.unwrap();
    let failure = fixture.fail(permanent).await.unwrap_err();
    assert_eq!(&*failure.detail, "404 not found");
    assert_eq!(fixture.calls(), 2);
    let retry = fixture.guard.snapshot().retry.unwrap();
    assert_eq!(
        (retry.retries, retry.refused),
        (0, 0),
        "the budget was not even asked"
    );
}

#[tokio::test(start_paused = true)]
async fn without_retry_settings_a_transient_failure_is_not_retried() {
    let fixture = fixture("coupons", settings());
    fixture.fail(transient).await.unwrap_err();
    assert_eq!(fixture.calls(), 1);
    assert_eq!(fixture.guard.snapshot().retry, None);
}

#[tokio::test(start_paused = true)]
async fn retries_are_capped_by_the_global_budget_which_starts_empty() {
    // With a 10 % ratio, one first attempt earns a tenth of a retry: none is made.
    let fixture = retrying(RetryConfig {
        ratio: 0.1,
        ..retries(2)
    });
    fixture.fail(transient).await.unwrap_err();
    assert_eq!(fixture.calls(), 1);
    let retry = fixture.guard.snapshot().retry.unwrap();
    assert_eq!(
        (retry.first_attempts, retry.retries, retry.refused),
        (1, 0, 1)
    );

    // With a 100 % ratio, the failing call's own first attempt pays for exactly one retry.
    let fixture = retrying(retries(2));
    fixture.fail(transient).await.unwrap_err();
    assert_eq!(fixture.calls(), 2, "one retry, then the budget is spent");
    let retry = fixture.guard.snapshot().retry.unwrap();
    assert_eq!(
        (retry.first_attempts, retry.retries, retry.refused),
        (1, 1, 1),
        "retries deposit nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn the_request_allowance_is_spent_across_calls_and_refunded_when_the_budget_refuses() {
    let fixture = retrying(retries(2));
    for _ in 0..3 {
        fixture.succeed().await.unwrap();
    }
    let request = LoadContext::new(None, 1);
    request
        .clone()
        .scope(fixture.fail(transient))
        .await
        .unwrap_err();
    assert_eq!(fixture.calls(), 3 + 2, "the request's one retry");
    assert_eq!(request.retries_left(), 0);
    request
        .for_part(Duration::from_secs(1))
        .scope(fixture.fail(transient))
        .await
        .unwrap_err();
    assert_eq!(
        fixture.calls(),
        3 + 2 + 1,
        "another part of the same request has none left"
    );

    // The budget refuses (ratio 0 earns nothing): the request keeps its retries.
    let broke = retrying(RetryConfig {
        ratio: 0.0,
        ..retries(2)
    });
    let request = LoadContext::new(None, 2);
    request
        .clone()
        .scope(broke.fail(transient))
        .await
        .unwrap_err();
    assert_eq!(broke.calls(), 1);
    assert_eq!(request.retries_left(), 2, "refunded");
}

#[tokio::test(start_paused = true)]
async fn no_retry_is_started_when_the_back_off_would_end_past_the_deadline() {
    let fixture = retrying(retries(2));
    fixture.succeed().await.unwrap();

    // The first back-off is at least 5 ms; 1 ms is left.
    let request = LoadContext::new(Some(Instant::now() + Duration::from_millis(1)), 2);
    request
        .clone()
        .scope(fixture.fail(transient))
        .await
        .unwrap_err();
    assert_eq!(fixture.calls(), 2);
    assert_eq!(request.retries_left(), 2, "no retry taken");
    assert_eq!(fixture.guard.snapshot().retry.unwrap().retries, 0);

    // With time to spare, the same failure is retried.
    let request = LoadContext::new(Some(Instant::now() + Duration::from_secs(10)), 2);
    let value = request
        .clone()
        .scope(fixture.call(|run| if run == 3 { Err(transient()) } else { Ok(run) }))
        .await;
    assert_eq!(value, Ok(4));
    assert_eq!(request.retries_left(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_guards_own_timeout_is_not_retried() {
    let fixture = fixture(
        "coupons",
        DependencyConfig {
            breaker: breaker(100),
            retry: Some(retries(2)),
            timeout: Some(Duration::from_millis(100)),
            ..settings()
        },
    );
    for _ in 0..3 {
        fixture.guard.call(|| slow(Duration::ZERO)).await.unwrap();
    }
    let runs = AtomicU32::new(0);
    let failure = fixture
        .guard
        .call(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            slow(Duration::from_secs(10))
        })
        .await
        .unwrap_err();
    assert_eq!(failure.kind, FailureKind::Timeout);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(fixture.guard.snapshot().retry.unwrap().retries, 0);
}

#[tokio::test(start_paused = true)]
async fn the_guards_refusals_are_never_retried() {
    let fixture = fixture(
        "coupons",
        DependencyConfig {
            retry: Some(retries(2)),
            quota: Some(RateConfig {
                per_second: 1.0,
                burst: 4,
            }),
            fleet_quota: None,
            ..settings()
        },
    );
    fixture.trip(4).await;
    let refused = at_once(fixture.succeed()).await.unwrap_err();
    assert_eq!(refused.kind, FailureKind::BreakerOpen);
    assert_eq!(
        fixture.observer.outcomes().last(),
        Some(&CallOutcome::BreakerOpen)
    );
    assert_eq!(
        fixture.observer.outcomes().len(),
        5,
        "one refusal, no retry"
    );

    // After the cool-down (which also refilled the quota spent by the four failures), the probe
    // closes the breaker; then the quota's burst of four is spent.
    fixture.ticker.advance(COOL_DOWN);
    for _ in 0..4 {
        fixture.succeed().await.unwrap();
    }
    let refused = at_once(fixture.succeed()).await.unwrap_err();
    assert_eq!(refused.kind, FailureKind::Quota);
    assert_eq!(
        fixture.observer.outcomes().len(),
        10,
        "one refusal, no retry"
    );
    assert_eq!(fixture.guard.snapshot().retry.unwrap().retries, 0);
}

// ---------------------------------------------------------------------------------------------
// 7. The observer and the request's timeline
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_observer_sees_every_attempt_and_refusal_with_its_outcome() {
    let coupons = fixture(
        "coupons",
        DependencyConfig {
            breaker: breaker(100),
            retry: Some(retries(1)),
            quota: Some(RateConfig {
                per_second: 1.0,
                burst: 5,
            }),
            fleet_quota: None,
            timeout: Some(Duration::from_millis(100)),
            ..settings()
        },
    );
    coupons.succeed().await.unwrap();
    coupons.fail(permanent).await.unwrap_err();
    coupons
        .guard
        .call(|| slow(Duration::from_secs(1)))
        .await
        .unwrap_err();
    // A transient failure and its successful retry: two attempts, two quota tokens.
    let retried = coupons
        .call(|run| if run == 3 { Err(transient()) } else { Ok(run) })
        .await;
    assert_eq!(retried, Ok(4));
    // The burst of five is spent.
    coupons.succeed().await.unwrap_err();

    let seen = coupons.observer.seen();
    let outcomes: Vec<_> = seen.iter().map(|(_, outcome, _)| *outcome).collect();
    assert_eq!(
        outcomes,
        [
            CallOutcome::Success,
            CallOutcome::Error,
            CallOutcome::Timeout,
            CallOutcome::Error,
            CallOutcome::Success,
            CallOutcome::Quota,
        ]
    );
    assert!(seen.iter().all(|(name, _, _)| *name == "coupons"));
    assert!(
        seen[2].2 >= Duration::from_millis(100),
        "the timeout's time"
    );
    assert_eq!(seen[5].2, Duration::ZERO, "refusals take no time");

    let snapshot = coupons.guard.snapshot();
    let count = |outcome| outcomes.iter().filter(|seen| **seen == outcome).count() as u64;
    assert_eq!(snapshot.successes, count(CallOutcome::Success));
    assert_eq!(snapshot.failures, count(CallOutcome::Error));
    assert_eq!(snapshot.timeouts, count(CallOutcome::Timeout));
    assert_eq!(snapshot.rejected_quota, count(CallOutcome::Quota));
    assert_eq!(snapshot.attempts, 5);

    // The breaker and the bulkhead refusals, on a second guard.
    let redis = fixture(
        "redis",
        DependencyConfig {
            max_concurrent: 1,
            ..settings()
        },
    );
    let (held, release) = hold(&redis.guard).await;
    redis.succeed().await.unwrap_err();
    release.notify_one();
    held.await.unwrap().unwrap();
    // The held call's success is in the window: three failures of four calls open it.
    redis.trip(3).await;
    redis.succeed().await.unwrap_err();
    let seen = redis.observer.seen();
    assert_eq!(
        seen[0],
        ("redis", CallOutcome::BulkheadFull, Duration::ZERO)
    );
    assert_eq!(seen[1].1, CallOutcome::Success, "the held call");
    assert_eq!(
        seen.last(),
        Some(&("redis", CallOutcome::BreakerOpen, Duration::ZERO))
    );
    assert_eq!(seen.len(), 1 + 1 + 3 + 1);
}

/// The per-item limit refuses an item's loads past its bucket before any call: the refusals
/// take no quota token (the next item's call gets it), are observed as `hot_item` with no time,
/// and are not failures for the breaker.
#[tokio::test]
async fn a_hot_item_is_refused_before_the_quota_and_is_no_failure() {
    let ticker = ManualTicker::new();
    let observer = Arc::new(Recorder::default());
    let guard = DependencyGuard::new(
        "coupons",
        DependencyConfig {
            quota: Some(RateConfig {
                per_second: 10.0,
                burst: 2,
            }),
            ..settings()
        },
        Arc::new(ticker.clone()),
    )
    .with_observer(Arc::clone(&observer) as Arc<dyn CallObserver>)
    .with_hot_items(HotItemConfig {
        rate: RateConfig {
            per_second: 1.0,
            burst: 1,
        },
        max_items: 100,
    });
    let viral = ItemKey::parse("pdd", "100001").unwrap();
    let other = ItemKey::parse("pdd", "100002").unwrap();
    let call = || guard.call(|| async { Ok::<_, AttemptFailure>(7) });

    guard.admit_item(viral).unwrap();
    assert_eq!(call().await, Ok(7));
    for _ in 0..5 {
        assert_eq!(
            guard.admit_item(viral).unwrap_err().kind,
            FailureKind::HotItem
        );
    }
    assert!(!guard.item_ready(viral));
    assert!(guard.item_ready(other));
    guard.admit_item(other).unwrap();
    assert_eq!(
        call().await,
        Ok(7),
        "the quota's second token is still there"
    );

    let snapshot = guard.snapshot();
    assert_eq!(snapshot.rejected_hot_item, 5);
    assert_eq!(snapshot.quota.as_ref().unwrap().granted, 2);
    assert_eq!((snapshot.failures, snapshot.attempts), (0, 2));
    assert_eq!(snapshot.breaker.state, BreakerState::Closed);
    let hot = snapshot.hot_items.unwrap();
    assert_eq!((hot.per_second, hot.burst, hot.max_items), (1.0, 1, 100));
    assert_eq!((hot.items_tracked, hot.refused), (2, 5));
    let mut expected = vec![CallOutcome::Success];
    expected.extend([CallOutcome::HotItem; 5]);
    expected.push(CallOutcome::Success);
    assert_eq!(observer.outcomes(), expected);
    assert!(
        observer
            .seen()
            .iter()
            .all(|(_, outcome, elapsed)| *outcome != CallOutcome::HotItem || elapsed.is_zero())
    );

    ticker.advance(Duration::from_secs(1));
    guard.admit_item(viral).unwrap();
}

/// Without a per-item limit every load is admitted and nothing is reported.
#[tokio::test]
async fn without_a_per_item_limit_every_load_is_admitted() {
    let fixture = fixture("extras", settings());
    let key = ItemKey::parse("jd", "100001").unwrap();
    for _ in 0..100 {
        fixture.guard.admit_item(key).unwrap();
    }
    assert!(fixture.guard.item_ready(key));
    let snapshot = fixture.guard.snapshot();
    assert_eq!(snapshot.rejected_hot_item, 0);
    assert!(snapshot.hot_items.is_none());
    assert!(fixture.observer.seen().is_empty());
}

#[test]
fn call_outcomes_are_labelled_in_snake_case() {
    let labels = [
        (CallOutcome::Success, "success"),
        (CallOutcome::Error, "error"),
        (CallOutcome::Timeout, "timeout"),
        (CallOutcome::BreakerOpen, "breaker_open"),
        (CallOutcome::BulkheadFull, "bulkhead_full"),
        (CallOutcome::Quota, "quota"),
        (CallOutcome::HotItem, "hot_item"),
    ];
    for (outcome, label) in labels {
        assert_eq!(outcome.as_str(), label);
    }
}

#[tokio::test(start_paused = true)]
async fn every_attempt_and_refusal_is_a_stage_on_the_request_timeline() {
    let fixture = retrying(RetryConfig { ..retries(2) });
    let timeline = Timeline::new(TraceId::generate());
    timeline
        .clone()
        .scope(async {
            let value = fixture
                .call(|run| if run == 1 { Err(transient()) } else { Ok(run) })
                .await;
            assert_eq!(value, Ok(2));
        })
        .await;
    // Outside the request's scope nothing is recorded.
    fixture.succeed().await.unwrap();

    let tripped = fixture_tripped().await;
    timeline
        .clone()
        .scope(async {
            tripped.succeed().await.unwrap_err();
        })
        .await;

    let stages: Vec<_> = timeline
        .stages()
        .into_iter()
        .map(|stage| {
            (
                stage.kind,
                stage.name,
                stage.outcome.into_owned(),
                stage.attempt,
            )
        })
        .collect();
    assert_eq!(
        stages,
        [
            ("dependency", "coupons", "error".to_owned(), Some(1)),
            ("dependency", "coupons", "success".to_owned(), Some(2)),
            ("dependency", "mysql", "breaker_open".to_owned(), Some(1)),
        ]
    );
}

async fn fixture_tripped() -> Fixture {
    let fixture = fixture("mysql", settings());
    fixture.trip(4).await;
    fixture
}

#[tokio::test]
async fn the_snapshot_reports_the_configuration_it_judges_by() {
    let fixture = fixture(
        "coupons",
        DependencyConfig {
            quota: Some(RateConfig {
                per_second: 45.0,
                burst: 10,
            }),
            fleet_quota: None,
            retry: Some(retries(2)),
            timeout: Some(Duration::from_millis(250)),
            max_concurrent: 7,
            ..settings()
        },
    );
    let snapshot = fixture.guard.snapshot();
    assert_eq!(snapshot.name, "coupons");
    assert_eq!(fixture.guard.name(), "coupons");
    assert_eq!(snapshot.timeout_ms, Some(250));
    assert_eq!(snapshot.bulkhead.max, 7);
    let thresholds = &snapshot.breaker_thresholds;
    assert_eq!(
        (
            thresholds.window_ms,
            thresholds.buckets,
            thresholds.min_calls,
            thresholds.cool_down_ms,
            thresholds.max_cool_down_ms,
            thresholds.probe_stages,
        ),
        (10_000, 10, 4, 5_000, 60_000, 1)
    );
    assert_eq!(thresholds.failure_ratio, 0.5);
    let quota = snapshot.quota.unwrap();
    assert_eq!((quota.per_second, quota.burst), (45.0, 10));
    let retry = snapshot.retry.unwrap();
    assert_eq!((retry.max_per_request, retry.ratio), (2, 1.0));
}

// ---------------------------------------------------------------------------------------------
// 8. GuardedTier
// ---------------------------------------------------------------------------------------------

fn tier_key(item: &str) -> TierKey {
    TierKey {
        item: ItemKey::parse("jd", item).unwrap(),
        part: PartKind::Coupons,
    }
}

fn entry(version: u64) -> TierEntry {
    TierEntry {
        version,
        bytes: vec![1, 2, 3],
    }
}

const TTL: Duration = Duration::from_secs(60);

struct TierFixture {
    memory: Arc<MemoryTier>,
    guarded: GuardedTier,
    redis: Fixture,
}

fn guarded_memory() -> TierFixture {
    let memory = Arc::new(MemoryTier::new());
    let redis = fixture(
        "redis",
        DependencyConfig {
            breaker: breaker(3),
            ..settings()
        },
    );
    let guarded = GuardedTier::new(
        Arc::clone(&memory) as Arc<dyn SharedTier>,
        Arc::clone(&redis.guard),
    );
    TierFixture {
        memory,
        guarded,
        redis,
    }
}

impl TierFixture {
    /// Opens the Redis breaker with three failed reads, then lets the tier answer again.
    async fn trip(&self) {
        self.memory.set_failing(true);
        for _ in 0..3 {
            let error = self.guarded.get_many(&[tier_key("1")]).await.unwrap_err();
            assert!(
                matches!(&error, TierError::Backend(detail) if detail.contains("memory tier set to fail")),
                "{error:?}"
            );
        }
        self.memory.set_failing(false);
        assert_eq!(self.redis.guard.breaker().state(), BreakerState::Open);
    }
}

#[tokio::test]
async fn while_closed_reads_and_leases_go_through_the_guard_and_writes_around_it() {
    let tier = guarded_memory();
    let key = tier_key("100002");
    assert_eq!(
        tier.guarded.put_fenced(key, &entry(3), TTL).await.unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(
        tier.guarded.get_many(&[key, tier_key("9")]).await.unwrap(),
        [Some(entry(3)), None]
    );
    assert!(tier.guarded.try_lease(key, 1, TTL).await.unwrap());
    assert!(
        !tier.guarded.try_lease(key, 2, TTL).await.unwrap(),
        "held by 1"
    );
    tier.guarded.release_lease(key, 1).await.unwrap();
    // The lease with the read: one round trip, one call through the guard.
    assert_eq!(
        tier.guarded.lease_and_read(key, 3, TTL).await.unwrap(),
        (true, Some(entry(3)))
    );
    tier.guarded.ping().await.unwrap();

    assert_eq!(tier.memory.round_trips(), 7);
    let snapshot = tier.redis.guard.snapshot();
    assert_eq!(
        (snapshot.attempts, snapshot.successes),
        (4, 4),
        "the read, both leases and the lease with its read, not the write, the release or the ping"
    );
}

#[tokio::test(start_paused = true)]
async fn while_the_redis_breaker_is_open_reads_and_leases_skip_the_tier_at_once() {
    let tier = guarded_memory();
    tier.trip().await;
    let round_trips = tier.memory.round_trips();

    let error = at_once(tier.guarded.get_many(&[tier_key("1")]))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, TierError::Backend(detail) if detail == "redis: circuit breaker open"),
        "{error:?}"
    );
    let error = at_once(tier.guarded.try_lease(tier_key("1"), 7, TTL))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, TierError::Backend(detail) if detail == "redis: circuit breaker open"),
        "{error:?}"
    );
    assert_eq!(
        tier.memory.round_trips(),
        round_trips,
        "the tier was not called"
    );
    assert_eq!(tier.redis.guard.snapshot().rejected_breaker, 2);

    // After the cool-down a read probes the tier again and closes the breaker.
    tier.redis.ticker.advance(COOL_DOWN);
    assert_eq!(
        tier.guarded.get_many(&[tier_key("1")]).await.unwrap(),
        [None]
    );
    assert_eq!(tier.memory.round_trips(), round_trips + 1);
    assert_eq!(tier.redis.guard.breaker().state(), BreakerState::Closed);
    assert!(tier.guarded.try_lease(tier_key("1"), 7, TTL).await.unwrap());
}

#[tokio::test]
async fn while_the_redis_breaker_is_open_writes_fences_releases_and_pings_still_reach_the_tier() {
    let tier = guarded_memory();
    let key = tier_key("100002");
    // Taken on the tier itself, so the breaker's window holds only the three failed reads.
    assert!(tier.memory.try_lease(key, 9, TTL).await.unwrap());
    tier.trip().await;
    let round_trips = tier.memory.round_trips();

    assert_eq!(
        tier.guarded.put_fenced(key, &entry(4), TTL).await.unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(tier.memory.version_of(key), Some(4));
    assert_eq!(
        tier.guarded.put_fenced(key, &entry(3), TTL).await.unwrap(),
        FenceOutcome::Stale { current: 4 },
        "fenced by the tier itself"
    );
    assert_eq!(
        tier.guarded.put_fence(key, &entry(5), TTL).await.unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(tier.memory.version_of(key), Some(5));
    tier.guarded.release_lease(key, 9).await.unwrap();
    tier.guarded.ping().await.unwrap();
    assert_eq!(tier.memory.round_trips(), round_trips + 5);

    // They report the tier's own errors, not the breaker's.
    tier.memory.set_failing(true);
    let error = tier.guarded.ping().await.unwrap_err();
    assert!(
        matches!(&error, TierError::Backend(detail) if detail == "memory tier set to fail"),
        "{error:?}"
    );
    assert!(tier.guarded.put_fence(key, &entry(6), TTL).await.is_err());
    assert_eq!(tier.memory.round_trips(), round_trips + 7);

    let snapshot = tier.redis.guard.snapshot();
    assert_eq!(snapshot.breaker.state, BreakerState::Open);
    assert_eq!(
        snapshot.rejected_breaker, 0,
        "none of them asked the breaker"
    );
    assert_eq!(snapshot.attempts, 3, "the three failed reads");
}

/// A tier whose reads and leases time out (as a Redis command would).
#[derive(Debug)]
struct TimingOut;

#[async_trait]
impl SharedTier for TimingOut {
    async fn get_many(&self, _keys: &[TierKey]) -> Result<Vec<Option<TierEntry>>, TierError> {
        Err(TierError::Timeout(Duration::from_millis(50)))
    }

    async fn put_fenced(
        &self,
        _key: TierKey,
        _entry: &TierEntry,
        _ttl: Duration,
    ) -> Result<FenceOutcome, TierError> {
        Ok(FenceOutcome::Written)
    }

    async fn put_fence(
        &self,
        _key: TierKey,
        _entry: &TierEntry,
        _ttl: Duration,
    ) -> Result<FenceOutcome, TierError> {
        Ok(FenceOutcome::Written)
    }

    async fn try_lease(
        &self,
        _key: TierKey,
        _token: u64,
        _ttl: Duration,
    ) -> Result<bool, TierError> {
        Err(TierError::Timeout(Duration::from_millis(50)))
    }

    async fn release_lease(&self, _key: TierKey, _token: u64) -> Result<(), TierError> {
        Ok(())
    }

    async fn ping(&self) -> Result<(), TierError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_tier_timeout_counts_as_a_timeout_and_comes_back_as_a_backend_error() {
    let redis = fixture(
        "redis",
        DependencyConfig {
            // Retries configured: a tier failure is still never retried.
            retry: Some(retries(2)),
            ..settings()
        },
    );
    let guarded = GuardedTier::new(Arc::new(TimingOut), Arc::clone(&redis.guard));
    let error = guarded.get_many(&[tier_key("1")]).await.unwrap_err();
    assert!(
        matches!(&error, TierError::Backend(detail) if detail == "shared tier timed out after 50ms"),
        "{error:?}"
    );
    assert!(guarded.try_lease(tier_key("1"), 1, TTL).await.is_err());

    let snapshot = redis.guard.snapshot();
    assert_eq!(
        (snapshot.attempts, snapshot.timeouts, snapshot.failures),
        (2, 2, 0)
    );
    assert_eq!(snapshot.retry.unwrap().retries, 0);
    assert_eq!(
        redis.observer.outcomes(),
        [CallOutcome::Timeout, CallOutcome::Timeout]
    );
}

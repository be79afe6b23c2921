//! The simulator's shared state: faults, call counters (with the peak call rate), the batch
//! size limit and coupon versions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rand::Rng;
use rebate_domain::ItemKey;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::batch::{BatchLimitError, MAX_BATCH_ITEMS, MAX_BATCH_ITEMS_BOUNDS};
use crate::catalog::INITIAL_COUPON_VERSION;
use crate::endpoint::{Endpoint, PerEndpoint};
use crate::fault::{Fault, FaultError};
use crate::peak::PeakRate;

/// Everything the simulator knows, shared by the HTTP handlers and in-process tests.
///
/// Cheap to clone (one `Arc`); every clone sees and changes the same faults and counters.
#[derive(Debug, Clone, Default)]
pub struct SimState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Read once per call and copied out; the lock is never held across an `.await`.
    faults: RwLock<PerEndpoint<Fault>>,
    /// Atomics so that counting never contends with concurrent calls.
    counters: PerEndpoint<Counters>,
    /// The most items one batch call may carry; an atomic so a test can change it while serving.
    max_batch_items: AtomicUsize,
    /// Only items whose coupon version was bumped; every other item is at version 1.
    coupon_versions: RwLock<HashMap<ItemKey, u64>>,
    /// Cancelled at shutdown so that hung and delayed calls finish and graceful shutdown can
    /// complete instead of waiting on calls designed never to end.
    release: CancellationToken,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            faults: RwLock::default(),
            counters: PerEndpoint::default(),
            max_batch_items: AtomicUsize::new(MAX_BATCH_ITEMS),
            coupon_versions: RwLock::default(),
            release: CancellationToken::new(),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU64,
    items: AtomicU64,
    batch_calls: AtomicU64,
    ok: AtomicU64,
    errors: AtomicU64,
    hung: AtomicU64,
    rate_limited: AtomicU64,
    outage: AtomicU64,
    /// Behind a short lock rather than atomics: a sliding window needs the arrival times.
    peak: PeakRate,
}

/// What kind of call [`SimState::apply_fault`] is counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// `GET /v1/{endpoint}/{platform}/{item_id}`: one item.
    Single,
    /// `POST /v1/{endpoint}:batch` with this many items (at least one).
    Batch { items: usize },
}

impl Call {
    fn items(self) -> u64 {
        match self {
            Call::Single => 1,
            Call::Batch { items } => items as u64,
        }
    }
}

/// How the calls of one endpoint ended, since start or the last reset.
///
/// A batch call is one call, whatever its length: its one fault draw decides one outcome. Once no
/// call is in flight:
/// - `calls == ok + errors + hung + rate_limited + outage`; calls still waiting out their latency
///   are counted in `calls` only;
/// - `batch_calls <= calls` and `items >= calls` (a call carries at least one item), and
///   `items - (calls - batch_calls)` items came in batches, so `items / calls` is the batch factor;
/// - `peak_calls_per_sec <= calls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CounterSnapshot {
    /// Every call with a valid request (invalid keys and batch bodies are refused before
    /// counting), single or batch, whatever its outcome.
    pub calls: u64,
    /// Item keys answered or attempted: 1 per single call, its length per batch call, counted
    /// when the call is, whatever its outcome.
    pub items: u64,
    /// How many of `calls` were batch calls.
    pub batch_calls: u64,
    /// The most calls (single and batch, every outcome) that arrived within any sliding
    /// one-second window: the outbound rate a client's quota must allow. Exact up to a million
    /// calls a second, where it saturates.
    pub peak_calls_per_sec: u64,
    /// Answered 200 with data.
    pub ok: u64,
    /// Answered 500 by `error_rate`.
    pub errors: u64,
    /// Chose to hang by `hang_rate` (counted when the hang starts).
    pub hung: u64,
    /// Answered 429 because `rate_limited` was on.
    pub rate_limited: u64,
    /// Answered 503 because `outage` was on.
    pub outage: u64,
}

/// Why a call was not answered with data; the HTTP layer maps each to a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Outage,
    RateLimited,
    InjectedError,
    /// A hung or delayed call let go because the simulator is shutting down.
    Released,
}

impl SimState {
    /// A healthy simulator: no faults, zero counters, every item at coupon version 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the fault of `endpoint`; a fault that fails [`Fault::validate`] is refused and the
    /// previous one stays.
    pub fn set_fault(&self, endpoint: Endpoint, fault: Fault) -> Result<(), FaultError> {
        fault.validate()?;
        *self.write_faults().get_mut(endpoint) = fault;
        tracing::info!(%endpoint, ?fault, "fault set");
        Ok(())
    }

    /// The fault currently applied to `endpoint`.
    pub fn fault(&self, endpoint: Endpoint) -> Fault {
        *self.read_faults().get(endpoint)
    }

    /// The faults of every endpoint, as `GET /_sim/faults` reports them.
    pub fn faults(&self) -> PerEndpoint<Fault> {
        *self.read_faults()
    }

    /// Makes `endpoint` healthy again.
    pub fn reset_fault(&self, endpoint: Endpoint) {
        *self.write_faults().get_mut(endpoint) = Fault::NONE;
        tracing::info!(%endpoint, "fault reset");
    }

    /// Makes every endpoint healthy again.
    pub fn reset_faults(&self) {
        *self.write_faults() = PerEndpoint::default();
        tracing::info!("all faults reset");
    }

    /// How the calls of `endpoint` ended so far.
    pub fn counters(&self, endpoint: Endpoint) -> CounterSnapshot {
        let counters = self.inner.counters.get(endpoint);
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CounterSnapshot {
            calls: load(&counters.calls),
            items: load(&counters.items),
            batch_calls: load(&counters.batch_calls),
            peak_calls_per_sec: counters.peak.peak(),
            ok: load(&counters.ok),
            errors: load(&counters.errors),
            hung: load(&counters.hung),
            rate_limited: load(&counters.rate_limited),
            outage: load(&counters.outage),
        }
    }

    /// The counters of every endpoint, as `GET /_sim/counters` reports them.
    pub fn all_counters(&self) -> PerEndpoint<CounterSnapshot> {
        PerEndpoint::from_fn(|endpoint| self.counters(endpoint))
    }

    /// Zeroes every counter and forgets the peak rate and the arrivals behind it, so a test can
    /// measure only its own calls.
    pub fn reset_counters(&self) {
        for endpoint in Endpoint::ALL {
            let counters = self.inner.counters.get(endpoint);
            counters.peak.reset();
            for counter in [
                &counters.calls,
                &counters.items,
                &counters.batch_calls,
                &counters.ok,
                &counters.errors,
                &counters.hung,
                &counters.rate_limited,
                &counters.outage,
            ] {
                counter.store(0, Ordering::Relaxed);
            }
        }
    }

    /// The most items a batch call may carry now ([`MAX_BATCH_ITEMS`] unless changed).
    pub fn max_batch_items(&self) -> usize {
        self.inner.max_batch_items.load(Ordering::Relaxed)
    }

    /// Changes the most items a batch call may carry, to mimic another API's limit; a value
    /// outside [`MAX_BATCH_ITEMS_BOUNDS`] is refused and the previous one stays. Not a fault:
    /// resetting the faults leaves it.
    pub fn set_max_batch_items(&self, max_items: usize) -> Result<(), BatchLimitError> {
        if !MAX_BATCH_ITEMS_BOUNDS.contains(&max_items) {
            return Err(BatchLimitError { value: max_items });
        }
        self.inner
            .max_batch_items
            .store(max_items, Ordering::Relaxed);
        tracing::info!(max_items, "batch size limit set");
        Ok(())
    }

    /// The version the coupon API reports for `key`.
    pub fn coupon_version(&self, key: ItemKey) -> u64 {
        let versions = self
            .inner
            .coupon_versions
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        versions
            .get(&key)
            .copied()
            .unwrap_or(INITIAL_COUPON_VERSION)
    }

    /// Simulates an operator editing the coupons of `key`: the version goes up by one and the
    /// served coupons change. Returns the new version.
    pub fn bump_coupon_version(&self, key: ItemKey) -> u64 {
        let mut versions = self
            .inner
            .coupon_versions
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let version = versions.entry(key).or_insert(INITIAL_COUPON_VERSION);
        *version = version.saturating_add(1);
        *version
    }

    /// Lets every hung or delayed call finish (answered 503 `shutting_down`), now and from now on.
    ///
    /// [`crate::RunningSimulator`] calls this when its shutdown token is cancelled; call it
    /// yourself when serving [`crate::router`] with your own graceful shutdown.
    pub fn release_hung_calls(&self) {
        self.inner.release.cancel();
    }

    /// Counts one call of `endpoint` (its items, whether it is a batch, its arrival for the peak
    /// rate) and applies its fault, in the documented order: once per call, so a batch has one
    /// outcome for all of its items.
    pub(crate) async fn apply_fault(&self, endpoint: Endpoint, call: Call) -> Result<(), Refusal> {
        let counters = self.inner.counters.get(endpoint);
        counters.calls.fetch_add(1, Ordering::Relaxed);
        counters.items.fetch_add(call.items(), Ordering::Relaxed);
        if matches!(call, Call::Batch { .. }) {
            counters.batch_calls.fetch_add(1, Ordering::Relaxed);
        }
        // Before any `.await`: the peak's lock is released when `record` returns.
        counters.peak.record(tokio::time::Instant::now());
        let fault = self.fault(endpoint);
        if fault.outage {
            counters.outage.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::Outage);
        }
        if fault.rate_limited {
            counters.rate_limited.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::RateLimited);
        }
        let delay_ms = fault
            .latency_ms
            .saturating_add(random_up_to(fault.latency_jitter_ms));
        if delay_ms > 0 {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
                () = self.inner.release.cancelled() => return Err(Refusal::Released),
            }
        }
        if happens(fault.hang_rate) {
            counters.hung.fetch_add(1, Ordering::Relaxed);
            self.inner.release.cancelled().await;
            return Err(Refusal::Released);
        }
        if happens(fault.error_rate) {
            counters.errors.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::InjectedError);
        }
        counters.ok.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn read_faults(&self) -> std::sync::RwLockReadGuard<'_, PerEndpoint<Fault>> {
        // A fault is replaced by a single assignment, so a poisoned lock still holds a whole one.
        self.inner
            .faults
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write_faults(&self) -> std::sync::RwLockWriteGuard<'_, PerEndpoint<Fault>> {
        self.inner
            .faults
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// True with probability `rate`; `rate` is validated to lie in `[0, 1]`.
fn happens(rate: f64) -> bool {
    // `random::<f64>()` lies in `[0, 1)`, so 1.0 always happens and 0.0 never does.
    rate > 0.0 && rand::rng().random::<f64>() < rate
}

/// A uniform value in `0..=max`.
fn random_up_to(max: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    rand::rng().random_range(0..=max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item() -> ItemKey {
        ItemKey::parse("taobao", "100001").unwrap()
    }

    #[test]
    fn invalid_fault_leaves_the_previous_one() {
        let state = SimState::new();
        let slow = Fault {
            latency_ms: 50,
            ..Fault::NONE
        };
        state.set_fault(Endpoint::Extras, slow).unwrap();
        let error = state
            .set_fault(
                Endpoint::Extras,
                Fault {
                    error_rate: 2.0,
                    ..Fault::NONE
                },
            )
            .unwrap_err();
        assert!(error.to_string().starts_with("error_rate"));
        assert_eq!(state.fault(Endpoint::Extras), slow);
        assert_eq!(state.fault(Endpoint::Coupons), Fault::NONE);
        state.reset_fault(Endpoint::Extras);
        assert_eq!(state.faults(), PerEndpoint::default());
    }

    #[test]
    fn versions_start_at_one_and_bump_per_item() {
        let state = SimState::new();
        let other = ItemKey::parse("jd", "100001").unwrap();
        assert_eq!(state.coupon_version(item()), 1);
        assert_eq!(state.bump_coupon_version(item()), 2);
        assert_eq!(state.bump_coupon_version(item()), 3);
        assert_eq!(state.coupon_version(item()), 3);
        assert_eq!(state.coupon_version(other), 1);
        // Clones share the same data.
        assert_eq!(state.clone().coupon_version(item()), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_are_counted_and_reset() {
        let state = SimState::new();
        assert_eq!(
            state.apply_fault(Endpoint::Coupons, Call::Single).await,
            Ok(())
        );
        let failing = Fault {
            error_rate: 1.0,
            ..Fault::NONE
        };
        state.set_fault(Endpoint::Coupons, failing).unwrap();
        assert_eq!(
            state.apply_fault(Endpoint::Coupons, Call::Single).await,
            Err(Refusal::InjectedError)
        );
        // Outage wins over rate limiting, which wins over everything else.
        let everything = Fault {
            outage: true,
            rate_limited: true,
            hang_rate: 1.0,
            ..failing
        };
        state.set_fault(Endpoint::Coupons, everything).unwrap();
        assert_eq!(
            state.apply_fault(Endpoint::Coupons, Call::Single).await,
            Err(Refusal::Outage)
        );
        state
            .set_fault(
                Endpoint::Coupons,
                Fault {
                    outage: false,
                    ..everything
                },
            )
            .unwrap();
        assert_eq!(
            state.apply_fault(Endpoint::Coupons, Call::Single).await,
            Err(Refusal::RateLimited)
        );
        assert_eq!(
            state.counters(Endpoint::Coupons),
            CounterSnapshot {
                calls: 4,
                items: 4,
                batch_calls: 0,
                peak_calls_per_sec: 4,
                ok: 1,
                errors: 1,
                hung: 0,
                rate_limited: 1,
                outage: 1,
            }
        );
        assert_eq!(state.counters(Endpoint::Extras), CounterSnapshot::default());
        state.reset_counters();
        assert_eq!(state.all_counters(), PerEndpoint::default());
    }

    #[tokio::test(start_paused = true)]
    async fn hang_lasts_until_released() {
        let state = SimState::new();
        state
            .set_fault(
                Endpoint::Extras,
                Fault {
                    hang_rate: 1.0,
                    ..Fault::NONE
                },
            )
            .unwrap();
        let hung = tokio::spawn({
            let state = state.clone();
            async move { state.apply_fault(Endpoint::Extras, Call::Single).await }
        });
        tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        assert!(!hung.is_finished());
        assert_eq!(state.counters(Endpoint::Extras).hung, 1);
        state.release_hung_calls();
        assert_eq!(hung.await.unwrap(), Err(Refusal::Released));
    }

    #[tokio::test(start_paused = true)]
    async fn latency_with_jitter_stays_in_range() {
        let state = SimState::new();
        let fault = Fault {
            latency_ms: 100,
            latency_jitter_ms: 50,
            ..Fault::NONE
        };
        state.set_fault(Endpoint::Coupons, fault).unwrap();
        let mut distinct = std::collections::HashSet::new();
        for _ in 0..50 {
            let started = tokio::time::Instant::now();
            state
                .apply_fault(Endpoint::Coupons, Call::Single)
                .await
                .unwrap();
            let waited = started.elapsed().as_millis();
            assert!((100..=151).contains(&waited), "{waited}");
            distinct.insert(waited);
        }
        assert!(
            distinct.len() > 5,
            "jitter should spread latencies: {distinct:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_is_one_call_of_many_items_with_one_outcome() {
        let state = SimState::new();
        state
            .apply_fault(Endpoint::Extras, Call::Batch { items: 7 })
            .await
            .unwrap();
        state
            .apply_fault(Endpoint::Extras, Call::Single)
            .await
            .unwrap();
        state
            .set_fault(
                Endpoint::Extras,
                Fault {
                    rate_limited: true,
                    ..Fault::NONE
                },
            )
            .unwrap();
        assert_eq!(
            state
                .apply_fault(Endpoint::Extras, Call::Batch { items: 40 })
                .await,
            Err(Refusal::RateLimited)
        );
        assert_eq!(
            state.counters(Endpoint::Extras),
            CounterSnapshot {
                calls: 3,
                items: 48,
                batch_calls: 2,
                peak_calls_per_sec: 3,
                ok: 2,
                rate_limited: 1,
                ..CounterSnapshot::default()
            }
        );
    }

    /// `count` calls of `endpoint` at `offset` after `start`, on the paused clock.
    async fn calls_at(state: &SimState, start: tokio::time::Instant, offset_ms: u64, count: usize) {
        tokio::time::advance(
            (start + Duration::from_millis(offset_ms)).duration_since(tokio::time::Instant::now()),
        )
        .await;
        for _ in 0..count {
            state
                .apply_fault(Endpoint::Coupons, Call::Single)
                .await
                .unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn peak_rate_is_a_sliding_window_per_endpoint() {
        let state = SimState::new();
        let start = tokio::time::Instant::now();
        // Two bursts 0.8 s apart straddle the 1 s boundary: one window holds both.
        calls_at(&state, start, 600, 30).await;
        calls_at(&state, start, 1_400, 30).await;
        assert_eq!(state.counters(Endpoint::Coupons).peak_calls_per_sec, 60);
        // Bursts more than a second apart never share a window.
        calls_at(&state, start, 2_500, 50).await;
        calls_at(&state, start, 3_600, 50).await;
        assert_eq!(state.counters(Endpoint::Coupons).peak_calls_per_sec, 60);
        calls_at(&state, start, 4_500, 20).await;
        assert_eq!(state.counters(Endpoint::Coupons).peak_calls_per_sec, 70);
        assert_eq!(state.counters(Endpoint::Extras).peak_calls_per_sec, 0);

        state.reset_counters();
        assert_eq!(state.all_counters(), PerEndpoint::default());
        // The calls before the reset are forgotten, not just the peak.
        calls_at(&state, start, 4_600, 1).await;
        assert_eq!(state.counters(Endpoint::Coupons).peak_calls_per_sec, 1);
    }

    #[test]
    fn batch_limit_is_validated_and_survives_fault_resets() {
        let state = SimState::new();
        assert_eq!(state.max_batch_items(), MAX_BATCH_ITEMS);
        for refused in [0, 1_001, usize::MAX] {
            let error = state.set_max_batch_items(refused).unwrap_err();
            assert_eq!(error, BatchLimitError { value: refused });
            assert!(error.to_string().contains("between 1 and 1000"), "{error}");
        }
        assert_eq!(state.max_batch_items(), MAX_BATCH_ITEMS);
        for accepted in [1, 1_000, 100] {
            state.set_max_batch_items(accepted).unwrap();
            assert_eq!(state.clone().max_batch_items(), accepted);
        }
        state.reset_faults();
        state.reset_counters();
        assert_eq!(state.max_batch_items(), 100);
    }
}

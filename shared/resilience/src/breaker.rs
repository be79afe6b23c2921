//! A circuit breaker per dependency: stop calling what is failing, then find out carefully
//! whether it has recovered.
//!
//! Closed, the breaker counts calls and failures (errors, timeouts and slow successes) in a
//! rolling window and opens when enough of them failed. Open, it refuses every call at once
//! until a cool-down has passed; the cool-down doubles with each trip in a row, up to a cap.
//! Half-open, it admits probes in slow start (1, then 2, then 4, …): when every probe of the
//! last stage has succeeded it closes with an empty window, and any probe failure opens it again.
//! A probe that never reports (a hung call, a leaked permit) fails its stage once it has been out
//! longer than any call may take, so the breaker cannot stay half-open for ever.
//!
//! # Layout
//! Everything lives in atomics; admitting and recording a call takes no lock and allocates
//! nothing.
//! - `state` packs the whole state machine into one `u64`, so every transition is one CAS:
//!   bits 0–1 state (closed, open, half-open), 2–5 probe stage, 6–15 probes admitted in the
//!   stage, 16–25 probe successes in the stage, 26–31 consecutive trips (saturating at 63),
//!   32–63 generation. The generation changes on every transition; a permit remembers the one it
//!   was admitted in, so a late outcome from an earlier state (a call admitted while closed that
//!   ends after the breaker opened, a probe of a stage already failed) changes nothing.
//! - `deadline` holds when the current state's time runs out (open: the end of the cool-down;
//!   half-open: when the newest probe is overdue), in milliseconds, tagged with the low 20 bits
//!   of the generation it belongs to. A reader that finds another generation's deadline (the
//!   thread that made the transition has not stored the new one yet) treats the time as not yet
//!   run out, so a new state is never judged by an old deadline.
//! - `buckets` holds one `u64` per slice of the window: bits 32–63 the slice's epoch
//!   (`now / bucket length`, truncated), 16–31 failures, 0–15 calls. A write that finds an older
//!   epoch resets the slot; a read sums only the slots of the last `buckets` epochs. A slot that
//!   reaches 65,535 calls halves both counts (the ratio stays, nothing overflows); the epoch
//!   wraps after 2^32 slices (50 days at the 1 ms minimum, 68 years at the default 500 ms).
//! - `rules` holds the configuration as calls read it, one relaxed load per value, so
//!   [`CircuitBreaker::reconfigure`] changes thresholds under running calls (see [`crate::live`]).

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::live::{RestartOnly, load_f64, lock, store_f64};
use crate::ticker::{Ticker, saturating_nanos};

const MAX_BUCKETS: u32 = 1_000;
const MIN_BUCKET: Duration = Duration::from_millis(1);
/// Deadlines are kept in milliseconds, so shorter cool-downs would round to nothing.
const MIN_COOL_DOWN: Duration = Duration::from_millis(1);
const MAX_PROBE_STAGES: u32 = 10;
const NANOS_PER_MILLI: u64 = 1_000_000;

/// How one dependency's breaker decides. Each dependency has its own: a slow coupon API must not
/// open the MySQL breaker, and a quiet dependency needs a smaller `min_calls` than a busy one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakerConfig {
    /// How far back the failure ratio looks.
    pub window: Duration,
    /// Equal slices of the window (at least 1 ms each); calls leave the window one slice at a
    /// time, so more slices make the ratio move more smoothly.
    pub buckets: u32,
    /// The share of failed calls in the window that opens the breaker, in (0, 1].
    pub failure_ratio: f64,
    /// Calls the window must hold before its ratio is trusted (5 suits quiet dependencies), so
    /// two failures out of three calls at night do not cut a dependency off.
    pub min_calls: u32,
    /// A success slower than this counts as a failure: a dependency that answers late hurts the
    /// request as much as one that errs.
    pub slow_call: Duration,
    /// How long the first trip keeps the breaker open; each further trip in a row doubles it.
    pub cool_down: Duration,
    /// The cap on the doubled cool-down, so a long outage is still probed now and then.
    pub max_cool_down: Duration,
    /// Half-open stages (1 to 10): stage k admits 2^k probes, and the breaker closes once every
    /// probe of the last stage has succeeded. Slow start keeps a recovering dependency from
    /// being flooded at once.
    pub probe_stages: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            buckets: 20,
            failure_ratio: 0.5,
            min_calls: 20,
            slow_call: Duration::from_secs(1),
            cool_down: Duration::from_secs(5),
            max_cool_down: Duration::from_secs(60),
            probe_stages: 3,
        }
    }
}

impl BreakerConfig {
    /// Explains the first value out of range, naming its field.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_BUCKETS).contains(&self.buckets) {
            return Err(format!(
                "buckets must be between 1 and {MAX_BUCKETS}, got {}",
                self.buckets
            ));
        }
        if self.window < MIN_BUCKET * self.buckets {
            return Err(format!(
                "window must split into buckets of at least 1 ms: {:?} over {} buckets is too short",
                self.window, self.buckets
            ));
        }
        if self.failure_ratio.is_nan() || self.failure_ratio <= 0.0 || self.failure_ratio > 1.0 {
            return Err(format!(
                "failure_ratio must be in (0, 1], got {}",
                self.failure_ratio
            ));
        }
        if self.min_calls == 0 {
            return Err("min_calls must be at least 1".to_owned());
        }
        if self.slow_call.is_zero() {
            return Err("slow_call must be greater than zero".to_owned());
        }
        if self.cool_down < MIN_COOL_DOWN {
            return Err(format!(
                "cool_down must be at least 1 ms, got {:?}",
                self.cool_down
            ));
        }
        if self.cool_down > self.max_cool_down {
            return Err(format!(
                "cool_down ({:?}) must not exceed max_cool_down ({:?})",
                self.cool_down, self.max_cool_down
            ));
        }
        if !(1..=MAX_PROBE_STAGES).contains(&self.probe_stages) {
            return Err(format!(
                "probe_stages must be between 1 and {MAX_PROBE_STAGES}, got {}",
                self.probe_stages
            ));
        }
        Ok(())
    }

    /// The nearest configuration that passes [`Self::validate`].
    fn clamped(mut self) -> Self {
        self.buckets = self.buckets.clamp(1, MAX_BUCKETS);
        self.window = self.window.max(MIN_BUCKET * self.buckets);
        if self.failure_ratio.is_nan() || self.failure_ratio <= 0.0 {
            self.failure_ratio = Self::default().failure_ratio;
        }
        self.failure_ratio = self.failure_ratio.min(1.0);
        self.min_calls = self.min_calls.max(1);
        self.slow_call = self.slow_call.max(Duration::from_nanos(1));
        self.cool_down = self.cool_down.max(MIN_COOL_DOWN);
        self.max_cool_down = self.max_cool_down.max(self.cool_down);
        self.probe_stages = self.probe_stages.clamp(1, MAX_PROBE_STAGES);
        self
    }
}

/// What callers see of the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls flow; failures are counted.
    Closed,
    /// Calls are refused until the cool-down ends.
    Open,
    /// A few probes find out whether the dependency has recovered; other calls are refused.
    HalfOpen,
}

/// The refusal: the caller should degrade (stale data, template text) instead of calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("circuit breaker {name} is open")]
pub struct BreakerOpen {
    pub name: &'static str,
}

/// The breaker of one dependency; share it (`Arc`) between every caller of that dependency.
pub struct CircuitBreaker {
    name: &'static str,
    /// The configuration in force, for [`Self::config`]. Only [`Self::reconfigure`] takes the
    /// lock (while it stores `rules`); calls read `rules`.
    config: Mutex<BreakerConfig>,
    rules: Rules,
    ticker: Arc<dyn Ticker>,
    /// The state machine, see [`Word`].
    state: AtomicU64,
    /// The current state's deadline, see the module's layout notes.
    deadline: AtomicU64,
    buckets: Box<[AtomicU64]>,
    trips: AtomicU64,
    rejected: AtomicU64,
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("CircuitBreaker")
            .field("name", &self.name)
            .field("state", &self.state())
            .field("config", &self.config())
            .finish_non_exhaustive()
    }
}

/// The configuration as calls read it: one relaxed load per value.
#[derive(Debug, Default)]
struct Rules {
    /// The length of one slice of the window.
    bucket_nanos: AtomicU64,
    failure_ratio_bits: AtomicU64,
    min_calls: AtomicU32,
    slow_call_nanos: AtomicU64,
    cool_down_nanos: AtomicU64,
    max_cool_down_nanos: AtomicU64,
    /// How long a probe may be out before its stage counts as failed: `max(cool_down, slow_call)`.
    probe_timeout_nanos: AtomicU64,
    probe_stages: AtomicU32,
}

impl Rules {
    /// `config` is clamped; `buckets` is the window's slot count.
    fn store(&self, config: &BreakerConfig, buckets: u64) {
        let relaxed = Ordering::Relaxed;
        let cool_down_nanos = saturating_nanos(config.cool_down);
        let slow_call_nanos = saturating_nanos(config.slow_call);
        self.bucket_nanos
            .store((saturating_nanos(config.window) / buckets).max(1), relaxed);
        store_f64(&self.failure_ratio_bits, config.failure_ratio);
        self.min_calls.store(config.min_calls, relaxed);
        self.slow_call_nanos.store(slow_call_nanos, relaxed);
        self.cool_down_nanos.store(cool_down_nanos, relaxed);
        self.max_cool_down_nanos
            .store(saturating_nanos(config.max_cool_down), relaxed);
        self.probe_timeout_nanos
            .store(cool_down_nanos.max(slow_call_nanos), relaxed);
        self.probe_stages.store(config.probe_stages, relaxed);
    }
}

impl CircuitBreaker {
    /// A closed breaker. `config` should have passed [`BreakerConfig::validate`]; values out of
    /// range are clamped rather than trusted, and [`Self::config`] reports the values in force.
    pub fn new(name: &'static str, config: BreakerConfig, ticker: Arc<dyn Ticker>) -> Self {
        let config = config.clamped();
        let rules = Rules::default();
        rules.store(&config, u64::from(config.buckets));
        Self {
            name,
            rules,
            state: AtomicU64::new(Word::INITIAL.pack()),
            deadline: AtomicU64::new(0),
            buckets: (0..config.buckets).map(|_| AtomicU64::new(0)).collect(),
            trips: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            config: Mutex::new(config),
            ticker,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The configuration in force: the last [`Self::reconfigure`]'s (or [`Self::new`]'s),
    /// clamped, with the bucket count the breaker was built with.
    pub fn config(&self) -> BreakerConfig {
        lock(&self.config).clone()
    }

    /// Applies `config` to the running breaker, from the next decision on: the failure ratio,
    /// `min_calls`, the slow-call limit, the cool-downs and the probe stages. The state is kept
    /// (closed, open or half-open, the trips in a row, the deadline already set: an open breaker
    /// waits out the cool-down it opened with, the next trip gets the new one), and so are the
    /// window's counts while the slices keep their length. A `window` that changes the slices'
    /// length clears the counts, which were taken in slices of the old length; the state stays.
    ///
    /// `buckets` is restart-only (the slices are a fixed array): the count in force is kept,
    /// and named in the answer when `config` asks for another. Out-of-range values are clamped
    /// as by [`Self::new`].
    pub fn reconfigure(&self, config: BreakerConfig) -> RestartOnly {
        let buckets = self.buckets.len() as u32;
        let mut restart_only = RestartOnly::default();
        restart_only.note("buckets", &buckets, &config.buckets);
        let config = BreakerConfig { buckets, ..config }.clamped();
        let mut in_force = lock(&self.config);
        let old_bucket_nanos = self.rules.bucket_nanos.load(Ordering::Relaxed);
        self.rules.store(&config, u64::from(buckets));
        if self.rules.bucket_nanos.load(Ordering::Relaxed) != old_bucket_nanos {
            for slot in self.buckets.iter() {
                slot.store(0, Ordering::Relaxed);
            }
        }
        *in_force = config;
        restart_only
    }

    /// Asks to make one call. Refused while open, and while half-open once the stage's probe
    /// slots are taken; refusals are counted for the snapshot but never as failures, so they
    /// cannot keep the breaker open.
    pub fn try_acquire(&self) -> Result<BreakerPermit<'_>, BreakerOpen> {
        let now = self.ticker.now_nanos();
        let mut bits = self.state.load(Ordering::Acquire);
        loop {
            let word = Word::unpack(bits);
            let next = match word.state {
                BreakerState::Closed => {
                    return Ok(BreakerPermit::new(self, word.generation, now));
                }
                BreakerState::Open => {
                    if !self.deadline_passed(word.generation, now) {
                        return Err(self.reject());
                    }
                    // The cool-down is over. This caller becomes the first probe in the same CAS
                    // that starts the half-open stage, so of all the callers racing at this
                    // instant exactly one gets through.
                    word.half_open(0).with_admitted(1)
                }
                BreakerState::HalfOpen => {
                    if word.admitted > word.successes && self.deadline_passed(word.generation, now)
                    {
                        // A probe has been out longer than any call may take: its stage failed.
                        let reopened = word.opened();
                        match self.state.compare_exchange(
                            bits,
                            reopened.pack(),
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        ) {
                            Ok(_) => {
                                self.on_opened(reopened, now, OpenReason::ProbeLost);
                                return Err(self.reject());
                            }
                            Err(actual) => {
                                bits = actual;
                                continue;
                            }
                        }
                    }
                    if word.admitted >= word.probe_capacity() {
                        return Err(self.reject());
                    }
                    // Raised before the slot is taken, so whoever sees the new probe also sees
                    // that it has a full timeout ahead of it.
                    self.raise_deadline(word.generation, now.saturating_add(self.probe_timeout()));
                    word.with_admitted(word.admitted + 1)
                }
            };
            match self.state.compare_exchange_weak(
                bits,
                next.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if word.state == BreakerState::Open {
                        self.raise_deadline(
                            next.generation,
                            now.saturating_add(self.probe_timeout()),
                        );
                        tracing::info!(breaker = self.name, "circuit breaker half-open");
                    }
                    return Ok(BreakerPermit::new(self, next.generation, now));
                }
                Err(actual) => bits = actual,
            }
        }
    }

    /// The state the next caller meets: an open breaker whose cool-down has passed reports
    /// half-open, and a half-open one with an overdue probe reports open.
    pub fn state(&self) -> BreakerState {
        let now = self.ticker.now_nanos();
        self.view(Word::unpack(self.state.load(Ordering::Acquire)), now)
            .state
    }

    /// Counters for health pages and metrics.
    pub fn snapshot(&self) -> BreakerSnapshot {
        let now = self.ticker.now_nanos();
        let word = Word::unpack(self.state.load(Ordering::Acquire));
        let view = self.view(word, now);
        let (calls, failures) = self.window_counts(now);
        BreakerSnapshot {
            name: self.name,
            state: view.state,
            calls,
            failures,
            failure_ratio: if calls == 0 {
                0.0
            } else {
                failures as f64 / calls as f64
            },
            trips: self.trips.load(Ordering::Relaxed),
            consecutive_trips: word.consecutive_trips,
            rejected: self.rejected.load(Ordering::Relaxed),
            open_for_ms: view
                .open_for_nanos
                .map(|nanos| nanos.div_ceil(NANOS_PER_MILLI)),
            probe_stage: view.probe_stage,
        }
    }

    fn reject(&self) -> BreakerOpen {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        BreakerOpen { name: self.name }
    }

    /// The outcome of a permit admitted in `generation` at `started`.
    fn on_outcome(&self, generation: u32, started: u64, ok: bool) {
        let now = self.ticker.now_nanos();
        let failed =
            !ok || now.saturating_sub(started) > self.rules.slow_call_nanos.load(Ordering::Relaxed);
        let mut bits = self.state.load(Ordering::Acquire);
        loop {
            let word = Word::unpack(bits);
            if word.generation != generation {
                // The state this call was admitted in is gone; its outcome says nothing about
                // the current one.
                return;
            }
            let next = match word.state {
                BreakerState::Closed => {
                    self.record_closed_call(generation, now, failed);
                    return;
                }
                // No permit is handed out while open, so none can belong to this generation.
                BreakerState::Open => return,
                BreakerState::HalfOpen => {
                    debug_assert!(word.successes < word.admitted);
                    if failed {
                        word.opened()
                    } else if word.successes + 1 < word.probe_capacity() {
                        word.with_successes(word.successes + 1)
                    } else if word.stage + 1 < self.rules.probe_stages.load(Ordering::Relaxed) {
                        word.half_open(word.stage + 1)
                    } else {
                        word.closed()
                    }
                }
            };
            match self.state.compare_exchange_weak(
                bits,
                next.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.after_probe_outcome(word, next, now);
                    return;
                }
                Err(actual) => bits = actual,
            }
        }
    }

    /// The bookkeeping of a transition a probe's outcome made.
    fn after_probe_outcome(&self, before: Word, after: Word, now: u64) {
        match after.state {
            BreakerState::Open => self.on_opened(after, now, OpenReason::ProbeFailed),
            BreakerState::Closed => {
                // The failures that opened the breaker are history; left in the window they
                // would trip it again at the first new failure.
                for slot in self.buckets.iter() {
                    slot.store(0, Ordering::Relaxed);
                }
                tracing::info!(breaker = self.name, "circuit breaker closed");
            }
            BreakerState::HalfOpen if after.generation != before.generation => {
                self.raise_deadline(after.generation, now.saturating_add(self.probe_timeout()));
                tracing::debug!(
                    breaker = self.name,
                    stage = after.stage,
                    "circuit breaker probe stage passed"
                );
            }
            BreakerState::HalfOpen => {}
        }
    }

    /// Adds a call to the window and, for a failure, opens the breaker if the window now holds
    /// enough failures. Successes never look at the whole window.
    fn record_closed_call(&self, generation: u32, now: u64, failed: bool) {
        let epoch = now / self.rules.bucket_nanos.load(Ordering::Relaxed);
        let slot = &self.buckets[(epoch % self.buckets.len() as u64) as usize];
        let epoch_tag = epoch as u32;
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            let bucket = Bucket::unpack(current);
            let mut counts = if bucket.epoch_tag == epoch_tag {
                bucket
            } else if is_ahead(bucket.epoch_tag, epoch_tag)
                && bucket.epoch_tag.wrapping_sub(epoch_tag) <= self.buckets.len() as u32
            {
                // The slot already holds the next window's slice: this call ended a window ago.
                // (A slot further ahead holds a slice of another length, written by a call that
                // raced a new `window`: it is overwritten.)
                return;
            } else {
                Bucket {
                    epoch_tag,
                    failures: 0,
                    calls: 0,
                }
            };
            if counts.calls == Bucket::MAX_COUNT {
                // Halving both keeps the ratio while making room.
                counts.calls /= 2;
                counts.failures /= 2;
            }
            counts.calls += 1;
            counts.failures += u64::from(failed);
            match slot.compare_exchange_weak(
                current,
                counts.pack(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        if failed {
            self.trip_if_failing(generation, now);
        }
    }

    fn trip_if_failing(&self, generation: u32, now: u64) {
        let (calls, failures) = self.window_counts(now);
        if calls < u64::from(self.rules.min_calls.load(Ordering::Relaxed))
            || (failures as f64) < load_f64(&self.rules.failure_ratio_bits) * calls as f64
        {
            return;
        }
        let bits = self.state.load(Ordering::Acquire);
        let word = Word::unpack(bits);
        if word.state != BreakerState::Closed || word.generation != generation {
            return;
        }
        let opened = word.opened();
        // A closed word only changes by leaving closed, so one attempt settles it: if it fails,
        // another caller has opened the breaker already.
        if self
            .state
            .compare_exchange(bits, opened.pack(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.on_opened(opened, now, OpenReason::FailureRatio { calls, failures });
        }
    }

    /// The bookkeeping of the transition to `opened`, done once by the caller that made it.
    fn on_opened(&self, opened: Word, now: u64, reason: OpenReason) {
        self.trips.fetch_add(1, Ordering::Relaxed);
        let cool_down_nanos = self.cool_down_nanos_for(opened.consecutive_trips);
        self.raise_deadline(opened.generation, now.saturating_add(cool_down_nanos));
        let cool_down_ms = cool_down_nanos / NANOS_PER_MILLI;
        let consecutive_trips = opened.consecutive_trips;
        match reason {
            OpenReason::FailureRatio { calls, failures } => tracing::warn!(
                breaker = self.name,
                calls,
                failures,
                cool_down_ms,
                "circuit breaker opened"
            ),
            OpenReason::ProbeFailed => tracing::warn!(
                breaker = self.name,
                consecutive_trips,
                cool_down_ms,
                "circuit breaker reopened: a probe failed"
            ),
            OpenReason::ProbeLost => tracing::warn!(
                breaker = self.name,
                consecutive_trips,
                cool_down_ms,
                "circuit breaker reopened: a probe did not report in time"
            ),
        }
    }

    /// A probe permit dropped unreported gives its slot back, so another caller may probe.
    fn release_probe(&self, generation: u32) {
        let mut bits = self.state.load(Ordering::Acquire);
        loop {
            let word = Word::unpack(bits);
            if word.generation != generation
                || word.state != BreakerState::HalfOpen
                || word.admitted <= word.successes
            {
                return;
            }
            match self.state.compare_exchange_weak(
                bits,
                word.with_admitted(word.admitted - 1).pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => bits = actual,
            }
        }
    }

    /// `cool_down × 2^(consecutive_trips − 1)`, capped.
    fn cool_down_nanos_for(&self, consecutive_trips: u32) -> u64 {
        let doublings = consecutive_trips.saturating_sub(1).min(63);
        self.rules
            .cool_down_nanos
            .load(Ordering::Relaxed)
            .saturating_mul(1 << doublings)
            .min(self.rules.max_cool_down_nanos.load(Ordering::Relaxed))
    }

    fn probe_timeout(&self) -> u64 {
        self.rules.probe_timeout_nanos.load(Ordering::Relaxed)
    }

    /// Calls and failures in the window ending at `now`.
    fn window_counts(&self, now: u64) -> (u64, u64) {
        let current = (now / self.rules.bucket_nanos.load(Ordering::Relaxed)) as u32;
        let span = self.buckets.len() as u32;
        let (mut calls, mut failures) = (0, 0);
        for slot in self.buckets.iter() {
            let bucket = Bucket::unpack(slot.load(Ordering::Relaxed));
            // A slot a little ahead was written by a caller whose clock read came later.
            if current.wrapping_sub(bucket.epoch_tag) < span
                || bucket.epoch_tag.wrapping_sub(current) < span
            {
                calls += bucket.calls;
                failures += bucket.failures;
            }
        }
        (calls, failures)
    }

    /// Moves the deadline of `generation` to `deadline_nanos`: replaces another generation's
    /// older deadline, only ever raises its own, and never touches a newer generation's.
    fn raise_deadline(&self, generation: u32, deadline_nanos: u64) {
        let wanted = Deadline::pack(generation, deadline_nanos);
        let _ = self
            .deadline
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                let current_tag = Deadline::tag(current);
                let wanted_tag = Deadline::tag(wanted);
                if current_tag == wanted_tag {
                    (wanted > current).then_some(wanted)
                } else if is_older_tag(current_tag, wanted_tag) {
                    Some(wanted)
                } else {
                    None
                }
            });
    }

    /// Whether `generation`'s deadline has passed; `false` while it has not been stored yet.
    fn deadline_passed(&self, generation: u32, now: u64) -> bool {
        self.deadline_of(generation)
            .is_some_and(|deadline| now >= deadline)
    }

    fn deadline_of(&self, generation: u32) -> Option<u64> {
        let packed = self.deadline.load(Ordering::Acquire);
        (Deadline::tag(packed) == generation & Deadline::TAG_MASK).then(|| Deadline::nanos(packed))
    }

    /// The state as the next caller will find it, with the lazy transitions applied.
    fn view(&self, word: Word, now: u64) -> View {
        match word.state {
            BreakerState::Closed => View::CLOSED,
            BreakerState::Open => match self.deadline_of(word.generation) {
                Some(deadline) if now >= deadline => View::half_open(0),
                Some(deadline) => View::open(deadline - now),
                // The transition is being made; its cool-down starts about now.
                None => View::open(self.cool_down_nanos_for(word.consecutive_trips)),
            },
            BreakerState::HalfOpen => {
                if word.admitted > word.successes && self.deadline_passed(word.generation, now) {
                    View::open(self.cool_down_nanos_for(word.consecutive_trips + 1))
                } else {
                    View::half_open(word.stage)
                }
            }
        }
    }
}

/// Why the breaker opened, for the log line.
#[derive(Debug, Clone, Copy)]
enum OpenReason {
    FailureRatio { calls: u64, failures: u64 },
    ProbeFailed,
    ProbeLost,
}

/// What [`CircuitBreaker::state`] and the snapshot report.
#[derive(Debug, Clone, Copy)]
struct View {
    state: BreakerState,
    open_for_nanos: Option<u64>,
    probe_stage: Option<u32>,
}

impl View {
    const CLOSED: Self = Self {
        state: BreakerState::Closed,
        open_for_nanos: None,
        probe_stage: None,
    };

    fn open(remaining_nanos: u64) -> Self {
        Self {
            state: BreakerState::Open,
            open_for_nanos: Some(remaining_nanos),
            probe_stage: None,
        }
    }

    fn half_open(stage: u32) -> Self {
        Self {
            state: BreakerState::HalfOpen,
            open_for_nanos: None,
            probe_stage: Some(stage),
        }
    }
}

/// Leave to make one call, admitted by [`CircuitBreaker::try_acquire`]. Report how the call went
/// with [`Self::success`] or [`Self::failure`]; dropping it unreported (the caller was
/// cancelled) records nothing, and a half-open probe slot is given back.
#[must_use = "report the call with success() or failure(); a dropped permit records nothing"]
pub struct BreakerPermit<'a> {
    breaker: &'a CircuitBreaker,
    generation: u32,
    started_nanos: u64,
    reported: bool,
}

impl<'a> BreakerPermit<'a> {
    fn new(breaker: &'a CircuitBreaker, generation: u32, started_nanos: u64) -> Self {
        Self {
            breaker,
            generation,
            started_nanos,
            reported: false,
        }
    }
}

impl BreakerPermit<'_> {
    /// The call succeeded; if it took longer than `slow_call`, it still counts as a failure.
    pub fn success(self) {
        self.record(true);
    }

    /// The call failed or timed out.
    pub fn failure(self) {
        self.record(false);
    }

    /// [`Self::success`] when `ok`, else [`Self::failure`].
    pub fn record(mut self, ok: bool) {
        self.reported = true;
        self.breaker
            .on_outcome(self.generation, self.started_nanos, ok);
    }
}

impl Drop for BreakerPermit<'_> {
    fn drop(&mut self) {
        if !self.reported {
            self.breaker.release_probe(self.generation);
        }
    }
}

impl fmt::Debug for BreakerPermit<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("BreakerPermit")
            .field("breaker", &self.breaker.name)
            .field("generation", &self.generation)
            .field("started_nanos", &self.started_nanos)
            .finish()
    }
}

/// The breaker seen from outside, for health pages and metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakerSnapshot {
    pub name: &'static str,
    pub state: BreakerState,
    /// Calls in the current window.
    pub calls: u64,
    /// Failures (errors, timeouts, slow successes) in the current window.
    pub failures: u64,
    /// `failures / calls`, 0 without calls.
    pub failure_ratio: f64,
    /// Times the breaker opened since start.
    pub trips: u64,
    /// Trips since it last closed; each doubles the cool-down.
    pub consecutive_trips: u32,
    /// Calls refused since start.
    pub rejected: u64,
    /// While open, the cool-down left (rounded up).
    pub open_for_ms: Option<u64>,
    /// While half-open, the slow-start stage: stage k admits 2^k probes.
    pub probe_stage: Option<u32>,
}

/// The unpacked `state` word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Word {
    state: BreakerState,
    /// Half-open only: the slow-start stage.
    stage: u32,
    /// Half-open only: probes admitted in this stage and not given back.
    admitted: u32,
    /// Half-open only: probes of this stage that succeeded.
    successes: u32,
    consecutive_trips: u32,
    generation: u32,
}

impl Word {
    const STAGE_SHIFT: u32 = 2;
    const ADMITTED_SHIFT: u32 = 6;
    const SUCCESSES_SHIFT: u32 = 16;
    const TRIPS_SHIFT: u32 = 26;
    const GENERATION_SHIFT: u32 = 32;
    const PROBE_COUNT_MASK: u64 = (1 << 10) - 1;
    const STAGE_MASK: u64 = (1 << 4) - 1;
    const MAX_CONSECUTIVE_TRIPS: u32 = (1 << 6) - 1;

    const INITIAL: Self = Self {
        state: BreakerState::Closed,
        stage: 0,
        admitted: 0,
        successes: 0,
        consecutive_trips: 0,
        generation: 0,
    };

    fn pack(self) -> u64 {
        debug_assert!(u64::from(self.stage) <= Self::STAGE_MASK);
        debug_assert!(u64::from(self.admitted) <= Self::PROBE_COUNT_MASK);
        debug_assert!(u64::from(self.successes) <= Self::PROBE_COUNT_MASK);
        debug_assert!(self.consecutive_trips <= Self::MAX_CONSECUTIVE_TRIPS);
        let state = match self.state {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        };
        state
            | u64::from(self.stage) << Self::STAGE_SHIFT
            | u64::from(self.admitted) << Self::ADMITTED_SHIFT
            | u64::from(self.successes) << Self::SUCCESSES_SHIFT
            | u64::from(self.consecutive_trips) << Self::TRIPS_SHIFT
            | u64::from(self.generation) << Self::GENERATION_SHIFT
    }

    fn unpack(bits: u64) -> Self {
        let state = match bits & 0b11 {
            0 => BreakerState::Closed,
            1 => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        };
        Self {
            state,
            stage: ((bits >> Self::STAGE_SHIFT) & Self::STAGE_MASK) as u32,
            admitted: ((bits >> Self::ADMITTED_SHIFT) & Self::PROBE_COUNT_MASK) as u32,
            successes: ((bits >> Self::SUCCESSES_SHIFT) & Self::PROBE_COUNT_MASK) as u32,
            consecutive_trips: ((bits >> Self::TRIPS_SHIFT)
                & u64::from(Self::MAX_CONSECUTIVE_TRIPS)) as u32,
            generation: (bits >> Self::GENERATION_SHIFT) as u32,
        }
    }

    /// Probes the current half-open stage admits.
    fn probe_capacity(self) -> u32 {
        1 << self.stage
    }

    fn with_admitted(self, admitted: u32) -> Self {
        Self { admitted, ..self }
    }

    fn with_successes(self, successes: u32) -> Self {
        Self { successes, ..self }
    }

    fn opened(self) -> Self {
        Self {
            state: BreakerState::Open,
            stage: 0,
            admitted: 0,
            successes: 0,
            consecutive_trips: (self.consecutive_trips + 1).min(Self::MAX_CONSECUTIVE_TRIPS),
            generation: self.generation.wrapping_add(1),
        }
    }

    fn half_open(self, stage: u32) -> Self {
        Self {
            state: BreakerState::HalfOpen,
            stage,
            admitted: 0,
            successes: 0,
            consecutive_trips: self.consecutive_trips,
            generation: self.generation.wrapping_add(1),
        }
    }

    fn closed(self) -> Self {
        Self {
            generation: self.generation.wrapping_add(1),
            ..Self::INITIAL
        }
    }
}

// Stage 9, the last of ten, admits 512 probes: the counts must fit their 10 bits.
const _: () = assert!(1 << (MAX_PROBE_STAGES - 1) <= Word::PROBE_COUNT_MASK);
const _: () = assert!(MAX_PROBE_STAGES as u64 - 1 <= Word::STAGE_MASK);

/// One slice of the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    /// `now / bucket length` of the slice, truncated to 32 bits.
    epoch_tag: u32,
    failures: u64,
    calls: u64,
}

impl Bucket {
    const MAX_COUNT: u64 = u16::MAX as u64;

    fn pack(self) -> u64 {
        debug_assert!(self.failures <= self.calls && self.calls <= Self::MAX_COUNT);
        u64::from(self.epoch_tag) << 32 | self.failures << 16 | self.calls
    }

    fn unpack(bits: u64) -> Self {
        Self {
            epoch_tag: (bits >> 32) as u32,
            failures: (bits >> 16) & Self::MAX_COUNT,
            calls: bits & Self::MAX_COUNT,
        }
    }
}

/// The `deadline` word: milliseconds in the high bits, a generation tag in the low ones.
#[derive(Debug)]
struct Deadline;

impl Deadline {
    const TAG_BITS: u32 = 20;
    const TAG_MASK: u32 = (1 << Self::TAG_BITS) - 1;
    /// 2^44 ms is over 500 years: later deadlines mean "never".
    const MAX_MILLIS: u64 = (1 << (64 - Self::TAG_BITS)) - 1;

    fn pack(generation: u32, deadline_nanos: u64) -> u64 {
        let millis = deadline_nanos
            .div_ceil(NANOS_PER_MILLI)
            .min(Self::MAX_MILLIS);
        millis << Self::TAG_BITS | u64::from(generation & Self::TAG_MASK)
    }

    fn tag(packed: u64) -> u32 {
        packed as u32 & Self::TAG_MASK
    }

    fn nanos(packed: u64) -> u64 {
        (packed >> Self::TAG_BITS) * NANOS_PER_MILLI
    }
}

/// Whether deadline tag `tag` belongs to a generation before `than` (tags wrap around).
fn is_older_tag(tag: u32, than: u32) -> bool {
    let distance = than.wrapping_sub(tag) & Deadline::TAG_MASK;
    distance != 0 && distance < 1 << (Deadline::TAG_BITS - 1)
}

/// Whether epoch tag `tag` is later than `than` (tags wrap around).
fn is_ahead(tag: u32, than: u32) -> bool {
    (tag.wrapping_sub(than) as i32) > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ticker::ManualTicker;
    use proptest::prelude::*;
    use std::sync::Barrier;
    use std::sync::atomic::AtomicUsize;

    fn quiet_config() -> BreakerConfig {
        BreakerConfig {
            min_calls: 5,
            ..BreakerConfig::default()
        }
    }

    fn breaker_with(config: BreakerConfig) -> (CircuitBreaker, ManualTicker) {
        let ticker = ManualTicker::new();
        let breaker = CircuitBreaker::new("coupon", config, Arc::new(ticker.clone()));
        (breaker, ticker)
    }

    fn record(breaker: &CircuitBreaker, ok: bool, times: u32) {
        for _ in 0..times {
            breaker
                .try_acquire()
                .expect("breaker should admit")
                .record(ok);
        }
    }

    fn word(breaker: &CircuitBreaker) -> Word {
        Word::unpack(breaker.state.load(Ordering::SeqCst))
    }

    /// Trips a `quiet_config` breaker (min_calls 5) with five failures.
    fn tripped(config: BreakerConfig) -> (CircuitBreaker, ManualTicker) {
        let (breaker, ticker) = breaker_with(config);
        record(&breaker, false, breaker.config().min_calls);
        assert_eq!(breaker.state(), BreakerState::Open);
        (breaker, ticker)
    }

    /// Passes half-open stage `stage` with all its probes succeeding.
    fn pass_stage(breaker: &CircuitBreaker, stage: u32) {
        assert_eq!(breaker.snapshot().probe_stage, Some(stage));
        let probes: Vec<_> = (0..1 << stage)
            .map(|_| breaker.try_acquire().expect("a probe slot"))
            .collect();
        assert!(
            breaker.try_acquire().is_err(),
            "stage {stage} admits only {}",
            1 << stage
        );
        probes.into_iter().for_each(BreakerPermit::success);
    }

    #[test]
    fn defaults_pass_validation() {
        assert_eq!(BreakerConfig::default().validate(), Ok(()));
        assert_eq!(quiet_config().validate(), Ok(()));
    }

    #[test]
    fn does_not_open_below_min_calls_even_when_every_call_fails() {
        let (breaker, _ticker) = breaker_with(BreakerConfig::default());
        record(&breaker, false, 19);
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Closed);
        assert_eq!((snapshot.calls, snapshot.failures), (19, 19));
        assert_eq!(snapshot.failure_ratio, 1.0);
    }

    #[test]
    fn opens_at_min_calls_when_the_ratio_reaches_the_threshold() {
        let (breaker, _ticker) = breaker_with(BreakerConfig::default());
        record(&breaker, true, 10);
        record(&breaker, false, 9);
        assert_eq!(breaker.state(), BreakerState::Closed);
        record(&breaker, false, 1);
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Open);
        assert_eq!(
            (snapshot.calls, snapshot.failures, snapshot.trips),
            (20, 10, 1)
        );
        assert_eq!(snapshot.consecutive_trips, 1);
        assert_eq!(snapshot.open_for_ms, Some(5_000));
        assert_eq!(
            breaker.try_acquire().unwrap_err(),
            BreakerOpen { name: "coupon" }
        );
    }

    #[test]
    fn stays_closed_below_the_threshold() {
        let (breaker, _ticker) = breaker_with(BreakerConfig::default());
        for _ in 0..50 {
            record(&breaker, true, 11);
            record(&breaker, false, 9);
        }
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Closed);
        assert_eq!((snapshot.calls, snapshot.failures), (1_000, 450));
    }

    #[test]
    fn old_buckets_roll_out_of_the_window() {
        let (breaker, ticker) = breaker_with(BreakerConfig::default());
        record(&breaker, false, 10);
        ticker.advance(Duration::from_secs(5));
        record(&breaker, true, 5);
        assert_eq!(breaker.snapshot().calls, 15);

        ticker.advance(Duration::from_secs(5));
        let snapshot = breaker.snapshot();
        assert_eq!(
            (snapshot.calls, snapshot.failures),
            (5, 0),
            "the first slice has left"
        );
        record(&breaker, false, 9);
        assert_eq!(
            breaker.state(),
            BreakerState::Closed,
            "the 10 old failures no longer count"
        );

        ticker.advance(Duration::from_secs(10));
        let snapshot = breaker.snapshot();
        assert_eq!((snapshot.calls, snapshot.failures), (0, 0));
        assert_eq!(snapshot.failure_ratio, 0.0);
    }

    #[test]
    fn a_full_bucket_halves_its_counts_instead_of_overflowing() {
        let (breaker, _ticker) = breaker_with(BreakerConfig::default());
        for call in 0..70_000 {
            breaker.try_acquire().unwrap().record(call % 4 != 0);
        }
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Closed);
        assert!(
            snapshot.calls < 70_000 && snapshot.calls > 30_000,
            "{snapshot:?}"
        );
        assert!((snapshot.failure_ratio - 0.25).abs() < 0.01, "{snapshot:?}");
    }

    #[test]
    fn slow_successes_count_as_failures() {
        let config = BreakerConfig {
            slow_call: Duration::from_millis(100),
            ..quiet_config()
        };
        let (breaker, ticker) = breaker_with(config);
        for _ in 0..5 {
            let on_time = breaker.try_acquire().unwrap();
            ticker.advance(Duration::from_millis(100));
            on_time.success();
        }
        assert_eq!(
            breaker.snapshot().failures,
            0,
            "exactly slow_call is not slow"
        );

        for _ in 0..5 {
            let slow = breaker.try_acquire().unwrap();
            ticker.advance(Duration::from_millis(101));
            slow.success();
        }
        let snapshot = breaker.snapshot();
        assert_eq!((snapshot.calls, snapshot.failures), (10, 5));
        assert_eq!(snapshot.state, BreakerState::Open);
    }

    #[test]
    fn rejections_while_open_neither_count_as_failures_nor_extend_the_cool_down() {
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_secs(2));
        for _ in 0..100 {
            assert!(breaker.try_acquire().is_err());
        }
        let snapshot = breaker.snapshot();
        assert_eq!((snapshot.calls, snapshot.failures), (5, 5));
        assert_eq!(snapshot.rejected, 100);
        assert_eq!(snapshot.open_for_ms, Some(3_000));
        ticker.advance(Duration::from_secs(3));
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert!(breaker.try_acquire().is_ok());
    }

    #[test]
    fn state_reports_half_open_once_the_cool_down_has_passed() {
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_millis(4_999));
        assert_eq!(breaker.state(), BreakerState::Open);
        assert_eq!(breaker.snapshot().open_for_ms, Some(1));
        ticker.advance(Duration::from_millis(1));
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::HalfOpen);
        assert_eq!(
            (snapshot.probe_stage, snapshot.open_for_ms),
            (Some(0), None)
        );
        assert_eq!(
            word(&breaker).state,
            BreakerState::Open,
            "only a caller moves it"
        );
    }

    #[test]
    fn half_open_admits_one_then_two_then_four_probes_then_closes() {
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_secs(5));
        pass_stage(&breaker, 0);
        pass_stage(&breaker, 1);
        pass_stage(&breaker, 2);
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Closed);
        assert_eq!(
            (snapshot.probe_stage, snapshot.consecutive_trips),
            (None, 0)
        );
        assert_eq!(snapshot.trips, 1);
    }

    #[test]
    fn a_stage_passes_only_when_all_its_probes_succeed() {
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_secs(5));
        pass_stage(&breaker, 0);
        let first = breaker.try_acquire().unwrap();
        first.success();
        assert_eq!(
            breaker.snapshot().probe_stage,
            Some(1),
            "one of two probes is not enough"
        );
        breaker.try_acquire().unwrap().success();
        assert_eq!(breaker.snapshot().probe_stage, Some(2));
    }

    #[test]
    fn a_probe_failure_reopens_with_a_doubled_cool_down_up_to_the_cap() {
        let config = BreakerConfig {
            max_cool_down: Duration::from_secs(15),
            ..quiet_config()
        };
        let (breaker, ticker) = tripped(config);
        ticker.advance(Duration::from_secs(5));
        pass_stage(&breaker, 0);
        breaker.try_acquire().unwrap().failure();

        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Open);
        assert_eq!((snapshot.trips, snapshot.consecutive_trips), (2, 2));
        assert_eq!(snapshot.open_for_ms, Some(10_000));
        ticker.advance(Duration::from_secs(5));
        assert_eq!(
            breaker.state(),
            BreakerState::Open,
            "still open after one cool_down"
        );
        assert!(breaker.try_acquire().is_err());
        ticker.advance(Duration::from_secs(5));
        assert_eq!(
            breaker.state(),
            BreakerState::HalfOpen,
            "half-open after twice the cool_down"
        );

        breaker.try_acquire().unwrap().failure();
        assert_eq!(
            breaker.snapshot().open_for_ms,
            Some(15_000),
            "20 s capped at 15 s"
        );
        ticker.advance(Duration::from_secs(15));
        breaker.try_acquire().unwrap().failure();
        let snapshot = breaker.snapshot();
        assert_eq!(
            (snapshot.open_for_ms, snapshot.consecutive_trips),
            (Some(15_000), 4)
        );
    }

    #[test]
    fn of_a_thousand_threads_at_the_half_open_instant_exactly_one_probes_then_exactly_two() {
        const THREADS: usize = 1_000;
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_secs(5));
        for (stage, expected) in [(0, 1), (1, 2)] {
            let barrier = Barrier::new(THREADS);
            let admitted = AtomicUsize::new(0);
            std::thread::scope(|scope| {
                for _ in 0..THREADS {
                    scope.spawn(|| {
                        barrier.wait();
                        let permit = breaker.try_acquire().ok();
                        if permit.is_some() {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                        // Held until everyone has tried, so a finished probe frees no slot.
                        barrier.wait();
                        if let Some(permit) = permit {
                            permit.success();
                        }
                    });
                }
            });
            assert_eq!(admitted.load(Ordering::SeqCst), expected, "stage {stage}");
        }
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.probe_stage, Some(2));
        assert_eq!(snapshot.rejected, (2 * THREADS - 3) as u64);
    }

    #[test]
    fn a_stuck_probe_reopens_the_breaker_after_the_stage_deadline() {
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_secs(5));
        let stuck = breaker.try_acquire().unwrap();
        ticker.advance(Duration::from_millis(4_999));
        assert!(breaker.try_acquire().is_err());
        assert_eq!(breaker.state(), BreakerState::HalfOpen);

        ticker.advance(Duration::from_millis(1));
        assert_eq!(
            breaker.state(),
            BreakerState::Open,
            "the next caller will reopen it"
        );
        assert!(breaker.try_acquire().is_err());
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Open);
        assert_eq!((snapshot.trips, snapshot.consecutive_trips), (2, 2));
        assert_eq!(snapshot.open_for_ms, Some(10_000));

        stuck.success();
        assert_eq!(
            breaker.state(),
            BreakerState::Open,
            "a late report changes nothing"
        );
        ticker.advance(Duration::from_secs(10));
        assert!(breaker.try_acquire().is_ok());
    }

    #[test]
    fn the_probe_deadline_is_the_longer_of_cool_down_and_slow_call() {
        let config = BreakerConfig {
            slow_call: Duration::from_secs(8),
            ..quiet_config()
        };
        let (breaker, ticker) = tripped(config);
        ticker.advance(Duration::from_secs(5));
        let _stuck = breaker.try_acquire().unwrap();
        ticker.advance(Duration::from_millis(7_999));
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        ticker.advance(Duration::from_millis(1));
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    #[test]
    fn a_dropped_probe_frees_its_slot() {
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_secs(5));
        let cancelled = breaker.try_acquire().unwrap();
        assert!(breaker.try_acquire().is_err());
        drop(cancelled);
        let probe = breaker.try_acquire().expect("the slot was given back");
        probe.success();
        assert_eq!(breaker.snapshot().probe_stage, Some(1));
        assert_eq!(
            breaker.snapshot().trips,
            1,
            "a cancelled probe is no failure"
        );
    }

    #[test]
    fn a_quiet_stage_without_probes_out_does_not_time_out() {
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_secs(5));
        pass_stage(&breaker, 0);
        breaker.try_acquire().unwrap().success();
        ticker.advance(Duration::from_secs(60));
        assert_eq!(breaker.state(), BreakerState::HalfOpen, "no probe is out");

        let late = breaker.try_acquire().expect("the second slot of stage 1");
        ticker.advance(Duration::from_millis(4_999));
        assert_eq!(
            breaker.state(),
            BreakerState::HalfOpen,
            "the late probe has its full time"
        );
        drop(late);
        breaker.try_acquire().unwrap().success();
        assert_eq!(breaker.snapshot().probe_stage, Some(2));
    }

    #[test]
    fn after_closing_the_window_is_empty_and_a_few_failures_do_not_retrip() {
        let config = BreakerConfig {
            cool_down: Duration::from_secs(1),
            ..quiet_config()
        };
        let (breaker, ticker) = tripped(config);
        ticker.advance(Duration::from_secs(1));
        for stage in 0..3 {
            pass_stage(&breaker, stage);
        }
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Closed);
        assert_eq!(
            (snapshot.calls, snapshot.failures),
            (0, 0),
            "cleared within the window"
        );

        record(&breaker, false, 4);
        assert_eq!(
            breaker.state(),
            BreakerState::Closed,
            "the old failures no longer count"
        );
        record(&breaker, true, 6);
        record(&breaker, false, 1);
        assert_eq!(
            breaker.state(),
            BreakerState::Closed,
            "5 of 11 is below the ratio"
        );
        record(&breaker, false, 1);
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Open);
        assert_eq!(
            (snapshot.trips, snapshot.consecutive_trips),
            (2, 1),
            "cool-down starts over"
        );
        assert_eq!(snapshot.open_for_ms, Some(1_000));
    }

    #[test]
    fn outcomes_from_an_older_generation_do_not_move_a_half_open_breaker() {
        let (breaker, ticker) = breaker_with(quiet_config());
        let admitted_while_closed = breaker.try_acquire().unwrap();
        let also_admitted_while_closed = breaker.try_acquire().unwrap();
        record(&breaker, false, 5);
        ticker.advance(Duration::from_secs(5));
        let probe = breaker.try_acquire().unwrap();

        admitted_while_closed.failure();
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::HalfOpen);
        assert_eq!((snapshot.trips, snapshot.probe_stage), (1, Some(0)));
        also_admitted_while_closed.success();
        assert_eq!(
            breaker.snapshot().probe_stage,
            Some(0),
            "nor does an old success count"
        );

        probe.success();
        assert_eq!(breaker.snapshot().probe_stage, Some(1));
    }

    #[test]
    fn validation_names_the_field_at_fault() {
        type Change = fn(&mut BreakerConfig);
        let problem = |change: Change| {
            let mut config = BreakerConfig::default();
            change(&mut config);
            config.validate().unwrap_err()
        };
        let cases: [(Change, &str); 12] = [
            (
                |c| c.buckets = 0,
                "buckets must be between 1 and 1000, got 0",
            ),
            (
                |c| c.buckets = 1_001,
                "buckets must be between 1 and 1000, got 1001",
            ),
            (
                |c| c.window = Duration::from_millis(19),
                "window must split into buckets of at least 1 ms",
            ),
            (
                |c| c.failure_ratio = 0.0,
                "failure_ratio must be in (0, 1], got 0",
            ),
            (
                |c| c.failure_ratio = 1.5,
                "failure_ratio must be in (0, 1], got 1.5",
            ),
            (
                |c| c.failure_ratio = f64::NAN,
                "failure_ratio must be in (0, 1], got NaN",
            ),
            (|c| c.min_calls = 0, "min_calls must be at least 1"),
            (
                |c| c.slow_call = Duration::ZERO,
                "slow_call must be greater than zero",
            ),
            (
                |c| c.cool_down = Duration::from_micros(999),
                "cool_down must be at least 1 ms, got 999µs",
            ),
            (
                |c| c.cool_down = Duration::from_secs(61),
                "cool_down (61s) must not exceed max_cool_down (60s)",
            ),
            (
                |c| c.probe_stages = 0,
                "probe_stages must be between 1 and 10, got 0",
            ),
            (
                |c| c.probe_stages = 11,
                "probe_stages must be between 1 and 10, got 11",
            ),
        ];
        for (change, expected) in cases {
            let message = problem(change);
            assert!(
                message.starts_with(expected),
                "{message:?} is not {expected:?}"
            );
        }

        let edges = BreakerConfig {
            window: Duration::from_millis(20),
            failure_ratio: 1.0,
            min_calls: 1,
            cool_down: Duration::from_secs(60),
            probe_stages: 10,
            ..BreakerConfig::default()
        };
        assert_eq!(edges.validate(), Ok(()));
    }

    #[test]
    fn new_clamps_an_invalid_config_into_range() {
        let config = BreakerConfig {
            buckets: 0,
            window: Duration::ZERO,
            failure_ratio: f64::NAN,
            min_calls: 0,
            slow_call: Duration::ZERO,
            cool_down: Duration::ZERO,
            max_cool_down: Duration::ZERO,
            probe_stages: 50,
        };
        let (breaker, _ticker) = breaker_with(config);
        assert_eq!(breaker.config().validate(), Ok(()));
        record(&breaker, false, 1);
        assert_eq!(breaker.snapshot().trips, 1);
    }

    #[test]
    fn an_open_breaker_keeps_its_deadline_across_a_threshold_change_and_trips_with_the_new_one() {
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_secs(2));
        let kept = breaker.reconfigure(BreakerConfig {
            failure_ratio: 0.9,
            min_calls: 50,
            cool_down: Duration::from_secs(30),
            ..quiet_config()
        });
        assert!(kept.is_empty(), "{kept}");
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, BreakerState::Open);
        assert_eq!(
            snapshot.open_for_ms,
            Some(3_000),
            "the cool-down it opened with"
        );
        assert_eq!(
            (snapshot.calls, snapshot.failures, snapshot.trips),
            (5, 5, 1)
        );
        assert_eq!(breaker.config().cool_down, Duration::from_secs(30));

        ticker.advance(Duration::from_secs(3));
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        breaker.try_acquire().unwrap().failure();
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.consecutive_trips, 2);
        assert_eq!(
            snapshot.open_for_ms,
            Some(60_000),
            "the new 30 s, doubled for the second trip in a row"
        );
    }

    #[test]
    fn a_closed_breaker_opens_at_the_next_failure_once_its_threshold_drops_and_keeps_its_window() {
        type Change = fn(&mut BreakerConfig);
        let cases: [(BreakerConfig, Change); 2] = [
            (
                BreakerConfig {
                    failure_ratio: 0.9,
                    ..BreakerConfig::default()
                },
                |config| config.failure_ratio = 0.5,
            ),
            (
                BreakerConfig {
                    min_calls: 40,
                    ..BreakerConfig::default()
                },
                |config| config.min_calls = 20,
            ),
        ];
        for (before, change) in cases {
            let (breaker, _ticker) = breaker_with(before.clone());
            record(&breaker, true, 10);
            record(&breaker, false, 10);
            assert_eq!(breaker.state(), BreakerState::Closed, "{before:?}");
            let mut after = before;
            change(&mut after);
            assert!(breaker.reconfigure(after.clone()).is_empty());
            assert_eq!(breaker.config(), after);
            let snapshot = breaker.snapshot();
            assert_eq!(
                snapshot.state,
                BreakerState::Closed,
                "successes judge nothing"
            );
            assert_eq!(
                (snapshot.calls, snapshot.failures),
                (20, 10),
                "the window is kept"
            );

            record(&breaker, false, 1);
            let snapshot = breaker.snapshot();
            assert_eq!(snapshot.state, BreakerState::Open, "{after:?}");
            assert_eq!(
                (snapshot.calls, snapshot.failures, snapshot.trips),
                (21, 11, 1)
            );
        }
    }

    #[test]
    fn a_new_window_clears_the_counts_but_keeps_an_open_breaker_open() {
        let (breaker, ticker) = tripped(quiet_config());
        let longer = BreakerConfig {
            window: Duration::from_secs(20),
            ..quiet_config()
        };
        assert!(breaker.reconfigure(longer.clone()).is_empty());
        let snapshot = breaker.snapshot();
        assert_eq!((snapshot.calls, snapshot.failures), (0, 0));
        assert_eq!(snapshot.state, BreakerState::Open);
        assert_eq!((snapshot.open_for_ms, snapshot.trips), (Some(5_000), 1));

        ticker.advance(Duration::from_secs(5));
        for stage in 0..3 {
            pass_stage(&breaker, stage);
        }
        record(&breaker, true, 3);
        ticker.advance(Duration::from_secs(15));
        record(&breaker, true, 1);
        assert_eq!(
            breaker.snapshot().calls,
            4,
            "15 s back is within the new 20 s window"
        );
        ticker.advance(Duration::from_secs(6));
        assert_eq!(breaker.snapshot().calls, 1, "slices of a second each");
        assert!(
            breaker.reconfigure(longer).is_empty(),
            "the same window keeps the counts"
        );
        assert_eq!(breaker.snapshot().calls, 1);
    }

    #[test]
    fn a_slot_left_far_ahead_by_a_call_racing_a_new_window_is_taken_over() {
        let (breaker, ticker) = breaker_with(quiet_config());
        let epoch = ticker.now_nanos() / breaker.rules.bucket_nanos.load(Ordering::SeqCst);
        let slots = breaker.buckets.len() as u64;
        // What a call that read the old slice length writes after the new window cleared the
        // counts: a tag in another numbering, here three windows ahead.
        let stale = Bucket {
            epoch_tag: (epoch + 3 * slots) as u32,
            failures: 1,
            calls: 1,
        };
        breaker.buckets[(epoch % slots) as usize].store(stale.pack(), Ordering::SeqCst);
        record(&breaker, false, 1);
        let snapshot = breaker.snapshot();
        assert_eq!(
            (snapshot.calls, snapshot.failures),
            (1, 1),
            "counted, not dropped"
        );
    }

    #[test]
    fn buckets_are_restart_only_and_the_rest_applies() {
        let (breaker, _ticker) = breaker_with(quiet_config());
        record(&breaker, false, 3);
        let kept = breaker.reconfigure(BreakerConfig {
            buckets: 40,
            failure_ratio: 0.8,
            ..quiet_config()
        });
        assert_eq!(kept.fields, ["buckets"]);
        let config = breaker.config();
        assert_eq!((config.buckets, config.failure_ratio), (20, 0.8));
        assert_eq!(breaker.snapshot().failures, 3, "the slices are the same");
    }

    #[test]
    fn probe_stages_and_slow_calls_apply_to_the_decision_after_the_change() {
        let (breaker, ticker) = tripped(quiet_config());
        ticker.advance(Duration::from_secs(5));
        pass_stage(&breaker, 0);
        let fewer_stages = BreakerConfig {
            probe_stages: 2,
            slow_call: Duration::from_millis(100),
            ..quiet_config()
        };
        assert!(breaker.reconfigure(fewer_stages).is_empty());
        assert_eq!(breaker.snapshot().probe_stage, Some(1), "the stage is kept");
        pass_stage(&breaker, 1);
        assert_eq!(
            breaker.state(),
            BreakerState::Closed,
            "stage 1 is now the last"
        );

        let slow = breaker.try_acquire().unwrap();
        ticker.advance(Duration::from_millis(150));
        slow.success();
        assert_eq!(breaker.snapshot().failures, 1, "slow by the new limit");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Advance(u64),
        Acquire,
        Succeed(usize),
        Fail(usize),
        Cancel(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0_u64..400).prop_map(Op::Advance),
            4 => Just(Op::Acquire),
            4 => any::<usize>().prop_map(Op::Succeed),
            1 => any::<usize>().prop_map(Op::Fail),
            1 => any::<usize>().prop_map(Op::Cancel),
        ]
    }

    proptest! {
        #[test]
        fn invariants_hold_for_any_sequence_of_calls(ops in proptest::collection::vec(op(), 0..300)) {
            let config = BreakerConfig {
                window: Duration::from_secs(1),
                buckets: 10,
                min_calls: 5,
                slow_call: Duration::from_millis(150),
                cool_down: Duration::from_millis(100),
                max_cool_down: Duration::from_millis(400),
                ..BreakerConfig::default()
            };
            let probe_timeout = config.cool_down.max(config.slow_call);
            let settle = config.max_cool_down + probe_timeout + Duration::from_millis(1);
            let (breaker, ticker) = breaker_with(config);
            let mut held: Vec<BreakerPermit<'_>> = Vec::new();
            for op in ops {
                match op {
                    Op::Advance(millis) => ticker.advance(Duration::from_millis(millis)),
                    Op::Acquire => held.extend(breaker.try_acquire().ok()),
                    Op::Succeed(index) if !held.is_empty() => {
                        let index = index % held.len();
                        held.swap_remove(index).success();
                    }
                    Op::Fail(index) if !held.is_empty() => {
                        let index = index % held.len();
                        held.swap_remove(index).failure();
                    }
                    Op::Cancel(index) if !held.is_empty() => {
                        let index = index % held.len();
                        drop(held.swap_remove(index));
                    }
                    Op::Succeed(_) | Op::Fail(_) | Op::Cancel(_) => {}
                }
                let current = word(&breaker);
                let snapshot = breaker.snapshot();
                prop_assert!(matches!(
                    snapshot.state,
                    BreakerState::Closed | BreakerState::Open | BreakerState::HalfOpen
                ));
                match current.state {
                    BreakerState::HalfOpen => {
                        prop_assert!(current.stage < breaker.config().probe_stages);
                        prop_assert!(current.admitted <= 1 << current.stage);
                        prop_assert!(current.successes <= current.admitted);
                        let outstanding = held
                            .iter()
                            .filter(|permit| permit.generation == current.generation)
                            .count();
                        prop_assert_eq!((current.admitted - current.successes) as usize, outstanding);
                    }
                    BreakerState::Closed => {
                        prop_assert_eq!(current.consecutive_trips, 0);
                        prop_assert_eq!((current.admitted, current.successes), (0, 0));
                    }
                    BreakerState::Open => {
                        prop_assert!(current.consecutive_trips >= 1);
                        prop_assert!(snapshot.open_for_ms.is_some() || snapshot.state == BreakerState::HalfOpen);
                    }
                }
            }
            drop(held);
            ticker.advance(settle);
            prop_assert!(breaker.try_acquire().is_ok(), "{:?}", breaker.snapshot());
        }
    }
}

//! A population of simulated users, each with a client of its own: one that follows the client
//! contract (docs/CLIENTS.md, as the reference H5 client `clients/h5/rebate-client.mjs`
//! implements it) or a naive one that retries at once.
//!
//! Users tap on an open loop: each user's taps are a Poisson process fixed before the run, and
//! a tap happens whatever the answers to the earlier ones were. A tap opens an item of the
//! user's own short list (users go back and forth between a few items, so a kept answer can
//! stand in for a refused one). What each kind of client does with a tap:
//!
//! | | contract | naive |
//! | --- | --- | --- |
//! | retries | `429`, `5xx`, network errors; a `500` once; at most 3 attempts and 10 s per call | `429`, `5xx`, network errors, at once, 3 times |
//! | waits | full jitter under 250 ms × 2ⁿ (8 s cap), never less than `Retry-After` + 0–50 % | none |
//! | `Retry-After` | holds for every call of the user; past the budget, nothing is sent | ignored |
//! | adaptive throttle | K = 2 over 2 minutes | none |
//! | a new tap | cancels the call in flight and its back-off | starts another call beside it |
//! | shown on failure | the last good answer for the item, if any; at once when the call must wait | nothing (an error) |
//!
//! Every figure is counted per second of the run ([`Tally`]) and per user and phase (before,
//! during and after a spike), so that a report can give requests and retries per user per
//! minute, the share of retries, what users were shown, and how fast both recovered.
//! The clients send no `If-None-Match`: a `304` changes the bytes, not the count of requests.

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::analysis::SecondPoint;
use crate::client::{Attempt, LoadClient, RequestKind, Target, TransportError};
use crate::keys::{ItemKey, KeyPicker};

/// Which client the users run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// The client contract (docs/CLIENTS.md).
    Contract,
    /// Retries a `429`, `5xx` or network error at once, [`NAIVE_RETRIES`] times, and keeps
    /// nothing to show instead.
    Naive,
}

impl ClientKind {
    pub const ALL: [Self; 2] = [Self::Contract, Self::Naive];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Contract => "contract",
            Self::Naive => "naive",
        }
    }
}

/// Retries of the naive client: a retry interceptor's usual default.
pub const NAIVE_RETRIES: u32 = 3;

/// The contract's numbers (docs/CLIENTS.md, "Attempts and back-off" and "Adaptive
/// throttling"): the reference client's `DEFAULTS`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contract {
    /// Attempts per call, the first included.
    pub max_attempts: u32,
    /// The first back-off's ceiling; each later one doubles, up to `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// A call gives up (and falls back) rather than wait past this.
    pub budget: Duration,
    /// A `Retry-After` is waited in full, plus up to this share of it at random.
    pub retry_after_jitter: f64,
    pub throttle_k: f64,
    pub throttle_window: Duration,
}

impl Contract {
    pub const DEFAULT: Self = Self {
        max_attempts: 3,
        base_delay: Duration::from_millis(250),
        max_delay: Duration::from_secs(8),
        budget: Duration::from_secs(10),
        retry_after_jitter: 0.5,
        throttle_k: 2.0,
        throttle_window: Duration::from_secs(120),
    };

    /// Retries one call may make: the attempts after the first.
    pub fn max_retries(&self) -> u32 {
        self.max_attempts.saturating_sub(1)
    }
}

/// The wait before retry `retry` (1 for the first): "full jitter", uniform in
/// `[0, min(max_delay, base_delay · 2^(retry − 1))]`, and never less than `retry_after` waited in
/// full plus up to `retry_after_jitter` of it. `random` gives uniform draws in [0, 1), taken
/// in the reference client's order (the back-off first).
pub fn backoff_delay(
    contract: &Contract,
    retry: u32,
    retry_after: Option<Duration>,
    random: &mut impl FnMut() -> f64,
) -> Duration {
    let doubling = retry.saturating_sub(1).min(20);
    let ceiling = contract
        .base_delay
        .saturating_mul(1 << doubling)
        .min(contract.max_delay);
    let drawn = ceiling.mul_f64(random().clamp(0.0, 1.0));
    match retry_after {
        None => drawn,
        Some(after) => {
            drawn.max(after.mul_f64(1.0 + random().clamp(0.0, 1.0) * contract.retry_after_jitter))
        }
    }
}

/// Adaptive throttling (Google SRE book, "Handling Overload"), as the reference client keeps
/// it: over a sliding window of buckets, refuse with probability
/// `max(0, (requests − K · accepts) / (requests + 1))`. Local refusals count as requests at
/// once; a request sent counts when its answer comes, so one cancelled in flight counts for
/// nothing.
#[derive(Debug, Clone)]
pub struct Throttle {
    k: f64,
    bucket: Duration,
    origin: Instant,
    buckets: Vec<ThrottleBucket>,
}

#[derive(Debug, Clone, Copy, Default)]
struct ThrottleBucket {
    slot: Option<u64>,
    requests: u32,
    accepts: u32,
}

impl Throttle {
    /// Buckets of the reference client's window.
    const BUCKETS: u32 = 60;

    pub fn new(k: f64, window: Duration, origin: Instant) -> Self {
        Self {
            k,
            bucket: (window / Self::BUCKETS).max(Duration::from_millis(1)),
            origin,
            buckets: vec![ThrottleBucket::default(); Self::BUCKETS as usize],
        }
    }

    fn slot(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(elapsed / self.bucket.as_nanos()).unwrap_or(u64::MAX)
    }

    fn bucket_mut(&mut self, now: Instant) -> &mut ThrottleBucket {
        let slot = self.slot(now);
        let len = self.buckets.len() as u64;
        let bucket = &mut self.buckets[(slot % len) as usize];
        if bucket.slot != Some(slot) {
            *bucket = ThrottleBucket {
                slot: Some(slot),
                requests: 0,
                accepts: 0,
            };
        }
        bucket
    }

    /// Requests and accepts in the window that ends at `now`.
    pub fn totals(&self, now: Instant) -> (u32, u32) {
        let newest = self.slot(now);
        let oldest = newest.saturating_sub(self.buckets.len() as u64 - 1);
        self.buckets
            .iter()
            .filter(|bucket| {
                bucket
                    .slot
                    .is_some_and(|slot| slot >= oldest && slot <= newest)
            })
            .fold((0, 0), |(requests, accepts), bucket| {
                (requests + bucket.requests, accepts + bucket.accepts)
            })
    }

    pub fn reject_probability(&self, now: Instant) -> f64 {
        let (requests, accepts) = self.totals(now);
        let requests = f64::from(requests);
        ((requests - self.k * f64::from(accepts)) / (requests + 1.0)).max(0.0)
    }

    /// Whether to send the next request; a refusal counts as a request at once. `unit` is
    /// uniform in [0, 1).
    pub fn admit(&mut self, now: Instant, unit: f64) -> bool {
        if unit < self.reject_probability(now) {
            self.bucket_mut(now).requests += 1;
            return false;
        }
        true
    }

    /// A request sent was answered, or failed on the network; `accepted` unless the server
    /// refused it for load (`429`, `503`) or could not be reached.
    pub fn answered(&mut self, now: Instant, accepted: bool) {
        let bucket = self.bucket_mut(now);
        bucket.requests += 1;
        if accepted {
            bucket.accepts += 1;
        }
    }
}

/// Sends one request for a user: the real service over HTTP ([`HttpTransport`]), or a fake in
/// the unit tests.
pub trait Transport: Send + Sync + 'static {
    fn send(&self, client_id: &str, key: ItemKey) -> impl Future<Output = Attempt> + Send;
}

/// The service, over the harness's keep-alive connections.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    pub client: LoadClient,
    pub target: Target,
}

impl Transport for HttpTransport {
    async fn send(&self, client_id: &str, key: ItemKey) -> Attempt {
        self.client
            .attempt(&self.target, &RequestKind::Single(key), client_id)
            .await
    }
}

/// What a call ended with on the user's screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// A live answer from the service.
    Live,
    /// The last good answer for the item, with its banner.
    LastGood,
    /// An error: nothing to show.
    Nothing,
}

/// The phases of a run, by time: before the spike, during it, after it.
pub const PHASES: [&str; 3] = ["before", "spike", "after"];

/// What one second of the run saw.
#[derive(Debug, Default)]
pub struct WindowCounters {
    pub taps: AtomicU64,
    /// Calls dropped by the user's next tap (contract only) …
    pub superseded: AtomicU64,
    /// … and of them those that had shown nothing yet: the user left waiting.
    pub left_waiting: AtomicU64,
    /// Requests sent (by send time), and of them the retries (a call's second or third attempt).
    pub sent: AtomicU64,
    pub retries: AtomicU64,
    /// Attempts refused locally: by the adaptive throttle, or by a `Retry-After` still running.
    pub throttled: AtomicU64,
    pub held: AtomicU64,
    /// Answers, by answer time.
    pub ok: AtomicU64,
    pub limited_429: AtomicU64,
    pub refused_503: AtomicU64,
    pub other_status: AtomicU64,
    pub transport_errors: AtomicU64,
    /// Not sent: the harness's own bound on connections was reached.
    pub not_sent: AtomicU64,
    /// Calls ended, by end time.
    pub live: AtomicU64,
    pub last_good: AtomicU64,
    pub nothing: AtomicU64,
    /// The highest `x-shed-level` any answer carried.
    pub shed_level: AtomicU8,
}

impl WindowCounters {
    /// Calls that ended in this second: with something shown, or left by the user.
    pub fn calls_ended(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
            + self.last_good.load(Ordering::Relaxed)
            + self.nothing.load(Ordering::Relaxed)
            + self.left_waiting.load(Ordering::Relaxed)
    }
}

/// Per user and phase: taps, requests sent, retries among them, and the most retries one call
/// made.
#[derive(Debug, Default)]
pub struct UserCounters {
    pub taps: [AtomicU32; 3],
    pub sent: [AtomicU32; 3],
    pub retries: [AtomicU32; 3],
    pub max_retries_in_call: AtomicU32,
}

/// Everything a population run counted, per second and per user.
#[derive(Debug)]
pub struct Tally {
    start: Instant,
    window: Duration,
    /// Offsets from `start` where the spike begins and ends.
    spike: (Duration, Duration),
    pub windows: Vec<WindowCounters>,
    /// Tap-to-shown time of the calls that ended in each second, in µs.
    shown_us: Vec<Mutex<Histogram<u64>>>,
    pub users: Vec<UserCounters>,
}

impl Tally {
    pub fn new(
        start: Instant,
        window: Duration,
        length: Duration,
        spike: (Duration, Duration),
        users: usize,
    ) -> Self {
        let count = (length.as_secs_f64() / window.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        Self {
            start,
            window,
            spike,
            windows: (0..count).map(|_| WindowCounters::default()).collect(),
            shown_us: (0..count)
                .map(|_| {
                    Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid bounds"))
                })
                .collect(),
            users: (0..users).map(|_| UserCounters::default()).collect(),
        }
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    pub fn spike(&self) -> (Duration, Duration) {
        self.spike
    }

    fn index(&self, at: Instant) -> usize {
        let offset = at.saturating_duration_since(self.start).as_nanos();
        let index = usize::try_from(offset / self.window.as_nanos()).unwrap_or(usize::MAX);
        index.min(self.windows.len() - 1)
    }

    fn at(&self, at: Instant) -> &WindowCounters {
        &self.windows[self.index(at)]
    }

    /// The phase `at` falls in (0 before the spike, 1 during, 2 after).
    pub fn phase(&self, at: Instant) -> usize {
        let offset = at.saturating_duration_since(self.start);
        if offset < self.spike.0 {
            0
        } else if offset < self.spike.1 {
            1
        } else {
            2
        }
    }

    fn tap(&self, user: usize, at: Instant) {
        self.at(at).taps.fetch_add(1, Ordering::Relaxed);
        self.users[user].taps[self.phase(at)].fetch_add(1, Ordering::Relaxed);
    }

    /// A call the next tap cancelled: left waiting, unless it had shown the last good answer.
    fn superseded(&self, user: usize, tapped_at: Instant, at: Instant, progress: CallProgress) {
        self.at(at).superseded.fetch_add(1, Ordering::Relaxed);
        match progress.stale_shown_at {
            Some(shown_at) => {
                let end = CallEnd {
                    shown: Shown::LastGood,
                    retries: progress.retries,
                };
                self.ended(user, tapped_at, Some(shown_at), at, &end);
            }
            None => {
                self.at(at).left_waiting.fetch_add(1, Ordering::Relaxed);
                self.users[user]
                    .max_retries_in_call
                    .fetch_max(progress.retries, Ordering::Relaxed);
            }
        }
    }

    fn refused_locally(&self, at: Instant, held: bool) {
        let window = self.at(at);
        if held {
            window.held.fetch_add(1, Ordering::Relaxed);
        } else {
            window.throttled.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One request: sent at `sent_at`, answered (`answer`) at `answered_at`.
    fn attempt(
        &self,
        user: usize,
        retry: bool,
        sent_at: Instant,
        answered_at: Instant,
        answer: &Attempt,
    ) {
        let answered = self.at(answered_at);
        match answer {
            Attempt::Transport(TransportError::Overflow) => {
                answered.not_sent.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Attempt::Transport(_) => {
                answered.transport_errors.fetch_add(1, Ordering::Relaxed);
            }
            Attempt::Response(response) => {
                let counter = match response.status {
                    200..=399 => &answered.ok,
                    429 => &answered.limited_429,
                    503 => &answered.refused_503,
                    _ => &answered.other_status,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let Some(level) = response.shed_level {
                    answered.shed_level.fetch_max(level, Ordering::Relaxed);
                }
            }
        }
        let sent = self.at(sent_at);
        sent.sent.fetch_add(1, Ordering::Relaxed);
        let phase = self.phase(sent_at);
        self.users[user].sent[phase].fetch_add(1, Ordering::Relaxed);
        if retry {
            sent.retries.fetch_add(1, Ordering::Relaxed);
            self.users[user].retries[phase].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A call ended at `ended_at`; the user first saw something at `shown_at` (the last good
    /// answer while the call waited), else at its end.
    fn ended(
        &self,
        user: usize,
        tapped_at: Instant,
        shown_at: Option<Instant>,
        ended_at: Instant,
        end: &CallEnd,
    ) {
        let window = self.at(ended_at);
        let counter = match end.shown {
            Shown::Live => &window.live,
            Shown::LastGood => &window.last_good,
            Shown::Nothing => &window.nothing,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let micros = shown_at
            .unwrap_or(ended_at)
            .saturating_duration_since(tapped_at)
            .as_micros();
        let micros = u64::try_from(micros).unwrap_or(u64::MAX).max(1);
        if let Ok(mut histogram) = self.shown_us[self.index(ended_at)].lock() {
            histogram.saturating_record(micros);
        }
        self.users[user]
            .max_retries_in_call
            .fetch_max(end.retries, Ordering::Relaxed);
    }

    /// Tap-to-shown time at `quantile` over the seconds `[from, to)`, in ms.
    pub fn shown_quantile_ms(&self, from: usize, to: usize, quantile: f64) -> Option<f64> {
        let mut merged = Histogram::<u64>::new_with_bounds(1, 60_000_000, 2).ok()?;
        for histogram in self.shown_us.get(from..to.min(self.shown_us.len()))? {
            if let Ok(histogram) = histogram.lock() {
                merged.add(&*histogram).ok()?;
            }
        }
        (!merged.is_empty()).then(|| merged.value_at_quantile(quantile) as f64 / 1000.0)
    }

    /// One point per second for [`crate::analysis::recovery_time`]: taps, the share of the
    /// calls that ended (a call the user left included) with a live answer, and the P99 from
    /// tap to what was shown.
    pub fn second_points(&self) -> Vec<SecondPoint> {
        (0..self.windows.len())
            .map(|index| {
                let window = &self.windows[index];
                let live = window.live.load(Ordering::Relaxed);
                let ended = window.calls_ended();
                SecondPoint {
                    at_s: index as f64 * self.window.as_secs_f64(),
                    requests: window.taps.load(Ordering::Relaxed),
                    answered_share: (ended > 0).then(|| live as f64 / ended as f64),
                    p99_ms: self.shown_quantile_ms(index, index + 1, 0.99),
                }
            })
            .collect()
    }
}

/// How one call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallEnd {
    pub shown: Shown,
    /// Requests sent on the call's second or later attempt.
    pub retries: u32,
}

/// A contract user's own state: the `Retry-After` that holds for all its calls, its throttle,
/// which of its items it has a good answer for, its random source, and how its current call is
/// going.
#[derive(Debug)]
pub struct ContractState {
    not_before: Option<Instant>,
    throttle: Throttle,
    kept: Vec<bool>,
    rng: SmallRng,
    call: CallProgress,
}

/// How far the current call got: when it showed the last good answer while it waited, and the
/// retries it sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallProgress {
    pub stale_shown_at: Option<Instant>,
    pub retries: u32,
}

impl ContractState {
    pub fn new(contract: &Contract, items: usize, origin: Instant, seed: u64) -> Self {
        Self {
            not_before: None,
            throttle: Throttle::new(contract.throttle_k, contract.throttle_window, origin),
            kept: vec![false; items],
            rng: SmallRng::seed_from_u64(seed),
            call: CallProgress::default(),
        }
    }

    /// The call is about to wait (a `Retry-After`, a back-off): show the item's last good
    /// answer now, once, rather than nothing until the wait ends.
    fn show_stale_while_waiting(&mut self, slot: usize) {
        if self.kept[slot] && self.call.stale_shown_at.is_none() {
            self.call.stale_shown_at = Some(Instant::now());
        }
    }

    pub fn progress(&self) -> CallProgress {
        self.call
    }

    fn fall_back(&self, slot: usize, retries: u32) -> CallEnd {
        CallEnd {
            shown: if self.kept[slot] {
                Shown::LastGood
            } else {
                Shown::Nothing
            },
            retries,
        }
    }
}

/// Who is calling, for what, and where it is counted.
#[derive(Debug)]
pub struct CallContext<'a, T> {
    pub transport: &'a T,
    pub tally: &'a Tally,
    pub user: usize,
    pub client_id: &'a str,
    pub key: ItemKey,
    /// The item's place in the user's list (what is kept is per item).
    pub slot: usize,
}

/// One call of the contract client, as the reference client's `call`: each pass either waits
/// out a running `Retry-After` (or falls back at once when that would pass the budget), asks
/// the throttle, and sends; a `429` or `503` with `Retry-After` holds every later call of the
/// user; a `500` allows one retry; a final `4xx` ends the call with nothing to show. Before
/// any wait, the item's last good answer is shown (the reference client's `onStale`).
pub async fn contract_call<T: Transport>(
    contract: &Contract,
    state: &mut ContractState,
    context: &CallContext<'_, T>,
) -> CallEnd {
    let started = Instant::now();
    let mut allowed = contract.max_attempts;
    let mut attempt = 0;
    let mut retries = 0;
    let mut retry_after = None;
    state.call = CallProgress::default();
    while attempt < allowed {
        attempt += 1;
        let now = Instant::now();
        if let Some(held) = state
            .not_before
            .map(|not_before| not_before.saturating_duration_since(now))
            .filter(|held| !held.is_zero())
        {
            let jitter = state.rng.random::<f64>();
            let wait = held.mul_f64(1.0 + jitter * contract.retry_after_jitter);
            if now.saturating_duration_since(started) + wait > contract.budget {
                context.tally.refused_locally(now, true);
                return state.fall_back(context.slot, retries);
            }
            state.show_stale_while_waiting(context.slot);
            tokio::time::sleep(wait).await;
        }
        let now = Instant::now();
        let unit = state.rng.random::<f64>();
        if !state.throttle.admit(now, unit) {
            context.tally.refused_locally(now, false);
        } else {
            let answer = context.transport.send(context.client_id, context.key).await;
            let answered = Instant::now();
            let retry = attempt > 1;
            context
                .tally
                .attempt(context.user, retry, now, answered, &answer);
            if retry && !matches!(answer, Attempt::Transport(TransportError::Overflow)) {
                retries += 1;
                state.call.retries = retries;
            }
            retry_after = None;
            match &answer {
                Attempt::Transport(TransportError::Overflow) => {}
                Attempt::Transport(_) => state.throttle.answered(answered, false),
                Attempt::Response(response) => state
                    .throttle
                    .answered(answered, !matches!(response.status, 429 | 503)),
            }
            if let Attempt::Response(response) = &answer {
                let refused = matches!(response.status, 429 | 503);
                match response.status {
                    200..=399 => {
                        state.kept[context.slot] = true;
                        return CallEnd {
                            shown: Shown::Live,
                            retries,
                        };
                    }
                    404 => {
                        // The item is gone: its kept answer must not stand in for it.
                        state.kept[context.slot] = false;
                        return CallEnd {
                            shown: Shown::Nothing,
                            retries,
                        };
                    }
                    408 | 429 => {}
                    400..=499 => {
                        return CallEnd {
                            shown: Shown::Nothing,
                            retries,
                        };
                    }
                    500 => allowed = allowed.min(2),
                    _ => {}
                }
                if refused && let Some(after) = response.retry_after {
                    let until = answered + after;
                    state.not_before = Some(state.not_before.map_or(until, |at| at.max(until)));
                    retry_after = Some(after);
                }
            }
        }
        if attempt >= allowed {
            break;
        }
        let delay = backoff_delay(contract, attempt, retry_after, &mut || {
            state.rng.random::<f64>()
        });
        if Instant::now().saturating_duration_since(started) + delay > contract.budget {
            break;
        }
        state.show_stale_while_waiting(context.slot);
        tokio::time::sleep(delay).await;
    }
    state.fall_back(context.slot, retries)
}

/// One call of the naive client: retries at once on `429`, `5xx` or a network error,
/// [`NAIVE_RETRIES`] times; shows nothing when the last attempt failed.
pub async fn naive_call<T: Transport>(context: &CallContext<'_, T>) -> CallEnd {
    let mut retries = 0;
    for attempt in 0..=NAIVE_RETRIES {
        let sent = Instant::now();
        let answer = context.transport.send(context.client_id, context.key).await;
        context
            .tally
            .attempt(context.user, attempt > 0, sent, Instant::now(), &answer);
        if attempt > 0 {
            retries += 1;
        }
        match &answer {
            Attempt::Response(response) if response.status < 400 => {
                return CallEnd {
                    shown: Shown::Live,
                    retries,
                };
            }
            Attempt::Response(response) if response.status == 429 || response.status >= 500 => {}
            Attempt::Transport(TransportError::Overflow) | Attempt::Response(_) => break,
            Attempt::Transport(_) => {}
        }
    }
    CallEnd {
        shown: Shown::Nothing,
        retries,
    }
}

/// The population and its timeline.
#[derive(Debug, Clone)]
pub struct PopulationPlan {
    pub users: usize,
    /// Mean time between one user's taps (exponential).
    pub mean_think: Duration,
    /// Items on each user's own list.
    pub items_per_user: usize,
    /// Taps happen in `[0, taps_for)` from the start.
    pub taps_for: Duration,
    /// After the last tap, calls may run this long; then they are dropped.
    pub drain: Duration,
    pub spike: (Duration, Duration),
    pub window: Duration,
    pub seed: u64,
}

impl PopulationPlan {
    /// How long the tally counts: the taps and the drain.
    pub fn length(&self) -> Duration {
        self.taps_for + self.drain
    }
}

/// A user's tap times (offsets from the start) and the items they open (indexes into the
/// user's list): a Poisson process of rate 1 / `mean_think`, seeded per user.
pub fn user_taps(plan: &PopulationPlan, user: usize) -> Vec<(Duration, usize)> {
    let mut rng = SmallRng::seed_from_u64(plan.seed ^ (user as u64).wrapping_mul(0x9e37_79b9));
    let Ok(gaps) = Exp::new(1.0 / plan.mean_think.as_secs_f64().max(1e-3)) else {
        return Vec::new();
    };
    let mut taps = Vec::new();
    let mut at = gaps.sample(&mut rng);
    while at < plan.taps_for.as_secs_f64() {
        taps.push((
            Duration::from_secs_f64(at),
            rng.random_range(0..plan.items_per_user.max(1)),
        ));
        at += gaps.sample(&mut rng);
    }
    taps
}

/// Each user's list: `items_per_user` keys drawn from the catalogue's popularity.
fn user_items(plan: &PopulationPlan, keys: &KeyPicker, user: usize) -> Vec<ItemKey> {
    let mut rng = SmallRng::seed_from_u64(plan.seed.wrapping_add(user as u64) ^ 0x5bd1_e995);
    (0..plan.items_per_user.max(1))
        .map(|_| keys.pick(&mut rng).0)
        .collect()
}

/// Runs the population from `start` to the end of the plan's drain, every user on `kind`'s
/// client, and returns what it counted.
pub async fn run_population<T: Transport>(
    plan: &PopulationPlan,
    kind: ClientKind,
    contract: Contract,
    keys: &KeyPicker,
    transport: Arc<T>,
    start: Instant,
) -> Arc<Tally> {
    let tally = Arc::new(Tally::new(
        start,
        plan.window,
        plan.length(),
        plan.spike,
        plan.users,
    ));
    let end = start + plan.length();
    let mut users = JoinSet::new();
    for user in 0..plan.users {
        let taps = user_taps(plan, user);
        let items = user_items(plan, keys, user);
        let tally = tally.clone();
        let transport = transport.clone();
        let seed = plan.seed.wrapping_mul(31).wrapping_add(user as u64);
        users.spawn(async move {
            let client_id = format!("user-{user}");
            let user_run = async {
                match kind {
                    ClientKind::Contract => {
                        contract_user(
                            &contract,
                            &taps,
                            &items,
                            &tally,
                            &*transport,
                            user,
                            &client_id,
                            start,
                            seed,
                        )
                        .await;
                    }
                    ClientKind::Naive => {
                        naive_user(&taps, &items, &tally, &transport, user, &client_id, start)
                            .await;
                    }
                }
            };
            // The run's bound: whatever is still waiting at the end of the drain is dropped.
            let _ = tokio::time::timeout_at(end, user_run).await;
        });
    }
    while users.join_next().await.is_some() {}
    tally
}

#[allow(
    clippy::too_many_arguments,
    reason = "one user's whole setup, used once"
)]
async fn contract_user<T: Transport>(
    contract: &Contract,
    taps: &[(Duration, usize)],
    items: &[ItemKey],
    tally: &Tally,
    transport: &T,
    user: usize,
    client_id: &str,
    start: Instant,
    seed: u64,
) {
    let mut state = ContractState::new(contract, items.len(), start, seed);
    for (index, &(offset, slot)) in taps.iter().enumerate() {
        let tapped = start + offset;
        tokio::time::sleep_until(tapped).await;
        tally.tap(user, tapped);
        let context = CallContext {
            transport,
            tally,
            user,
            client_id,
            key: items[slot],
            slot,
        };
        let call = contract_call(contract, &mut state, &context);
        // The next tap moves the user on: the call and its back-off are cancelled.
        let ended = match taps.get(index + 1) {
            Some(&(next, _)) => tokio::select! {
                end = call => Some(end),
                () = tokio::time::sleep_until(start + next) => None,
            },
            None => Some(call.await),
        };
        let progress = state.progress();
        match ended {
            Some(end) => tally.ended(user, tapped, progress.stale_shown_at, Instant::now(), &end),
            None => tally.superseded(user, tapped, Instant::now(), progress),
        }
    }
}

async fn naive_user<T: Transport>(
    taps: &[(Duration, usize)],
    items: &[ItemKey],
    tally: &Arc<Tally>,
    transport: &Arc<T>,
    user: usize,
    client_id: &str,
    start: Instant,
) {
    // Nothing is cancelled: every tap's call runs beside the others to its end.
    let mut calls = JoinSet::new();
    for &(offset, slot) in taps {
        let tapped = start + offset;
        tokio::time::sleep_until(tapped).await;
        tally.tap(user, tapped);
        let (tally, transport, client_id) =
            (tally.clone(), transport.clone(), client_id.to_owned());
        let key = items[slot];
        calls.spawn(async move {
            let context = CallContext {
                transport: &*transport,
                tally: &tally,
                user,
                client_id: &client_id,
                key,
                slot,
            };
            let end = naive_call(&context).await;
            tally.ended(user, tapped, None, Instant::now(), &end);
        });
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::client::ResponseSummary;

    fn response(status: u16, retry_after: Option<u64>) -> Attempt {
        Attempt::Response(ResponseSummary {
            status,
            retry_after: retry_after.map(Duration::from_secs),
            shed_level: None,
            business_ok: status == 200,
            refusal: None,
            queued: None,
        })
    }

    /// Answers from a script (then 200s), each after `latency`, and remembers when each request
    /// came.
    struct Scripted {
        answers: Mutex<VecDeque<Attempt>>,
        sent: Mutex<Vec<Instant>>,
        latency: Duration,
    }

    impl Scripted {
        fn new(answers: Vec<Attempt>) -> Self {
            Self {
                answers: Mutex::new(answers.into()),
                sent: Mutex::new(Vec::new()),
                latency: Duration::from_millis(1),
            }
        }

        fn sent(&self) -> Vec<Instant> {
            self.sent.lock().unwrap().clone()
        }
    }

    impl Transport for Scripted {
        async fn send(&self, _client_id: &str, _key: ItemKey) -> Attempt {
            self.sent.lock().unwrap().push(Instant::now());
            tokio::time::sleep(self.latency).await;
            let next = self.answers.lock().unwrap().pop_front();
            next.unwrap_or_else(|| response(200, None))
        }
    }

    const KEY: ItemKey = ItemKey {
        platform: "taobao",
        item_id: 100_001,
    };

    fn tally(start: Instant) -> Tally {
        Tally::new(
            start,
            Duration::from_secs(1),
            Duration::from_secs(600),
            (Duration::from_secs(60), Duration::from_secs(120)),
            1,
        )
    }

    fn context<'a>(transport: &'a Scripted, tally: &'a Tally) -> CallContext<'a, Scripted> {
        CallContext {
            transport,
            tally,
            user: 0,
            client_id: "user-0",
            key: KEY,
            slot: 0,
        }
    }

    fn uniform(values: &[f64]) -> impl FnMut() -> f64 + '_ {
        let mut next = values.iter().cycle();
        move || *next.next().unwrap()
    }

    #[test]
    fn backoff_is_full_jitter_under_a_doubling_ceiling_and_honours_retry_after() {
        let contract = Contract::DEFAULT;
        let ms = Duration::from_millis;
        assert_eq!(
            backoff_delay(&contract, 1, None, &mut uniform(&[0.5])),
            ms(125)
        );
        assert_eq!(
            backoff_delay(&contract, 3, None, &mut uniform(&[0.5])),
            ms(500)
        );
        // The ceiling stops at 8 s.
        assert_eq!(
            backoff_delay(&contract, 10, None, &mut uniform(&[1.0])),
            ms(8000)
        );
        assert_eq!(
            backoff_delay(&contract, 2, None, &mut uniform(&[0.0])),
            ms(0)
        );
        // Retry-After 4 s with the second draw 0.5: 4 s × 1.25, over any drawn back-off.
        assert_eq!(
            backoff_delay(&contract, 1, Some(ms(4000)), &mut uniform(&[0.9, 0.5])),
            ms(5000)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_throttle_refuses_by_the_formula_over_its_window() {
        let start = Instant::now();
        let mut throttle = Throttle::new(2.0, Duration::from_secs(120), start);
        // 10 accepted: nothing is refused while accepts ≥ requests / K.
        for _ in 0..10 {
            assert!(throttle.admit(start, 0.0));
            throttle.answered(start, true);
        }
        assert_eq!(throttle.reject_probability(start), 0.0);
        // 30 more refused by the server: (40 − 2·10) / 41.
        for _ in 0..30 {
            assert!(throttle.admit(start, 0.99));
            throttle.answered(start, false);
        }
        let expected = 20.0 / 41.0;
        assert!((throttle.reject_probability(start) - expected).abs() < 1e-12);
        // Admitted and never answered (cancelled in flight): nothing changes.
        assert!(throttle.admit(start, 0.99));
        assert!((throttle.reject_probability(start) - expected).abs() < 1e-12);
        // A local refusal counts: (41 − 20) / 42.
        assert!(!throttle.admit(start, expected - 0.01));
        assert!((throttle.reject_probability(start) - 21.0 / 42.0).abs() < 1e-12);
        // Two minutes later the window has forgotten all of it.
        let later = start + Duration::from_secs(121);
        assert_eq!(throttle.totals(later), (0, 0));
        assert_eq!(throttle.reject_probability(later), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_within_the_budget_is_waited_out_then_retried() {
        let start = Instant::now();
        let tally = tally(start);
        let mut answers = vec![response(200, None); 3];
        answers.push(response(429, Some(2)));
        let transport = Scripted::new(answers);
        let mut state = ContractState::new(&Contract::DEFAULT, 1, start, 7);
        // Three accepted calls first: a throttle that has seen only one refusal refuses half
        // of what follows (1 request, 0 accepts: (1 − 0) / 2).
        for _ in 0..3 {
            let end =
                contract_call(&Contract::DEFAULT, &mut state, &context(&transport, &tally)).await;
            assert_eq!(end.shown, Shown::Live);
        }
        let end = contract_call(&Contract::DEFAULT, &mut state, &context(&transport, &tally)).await;
        assert_eq!(
            end,
            CallEnd {
                shown: Shown::Live,
                retries: 1
            }
        );
        let sent = transport.sent();
        assert_eq!(sent.len(), 5);
        let gap = sent[4] - sent[3];
        assert!(
            gap >= Duration::from_millis(2001) && gap <= Duration::from_millis(3001),
            "the retry waited Retry-After (2 s) plus 0–50 %, not {gap:?}"
        );
        // The kept answer was shown as soon as the 429 came, not after the wait.
        let shown = state
            .progress()
            .stale_shown_at
            .expect("the last good answer was shown");
        assert!(shown >= sent[3] && shown <= sent[3] + Duration::from_millis(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_past_the_budget_holds_every_call_and_sends_nothing() {
        let start = Instant::now();
        let tally = tally(start);
        let transport = Scripted::new(vec![response(200, None), response(429, Some(20))]);
        let mut state = ContractState::new(&Contract::DEFAULT, 1, start, 7);
        let first =
            contract_call(&Contract::DEFAULT, &mut state, &context(&transport, &tally)).await;
        assert_eq!(first.shown, Shown::Live);
        // The 429's Retry-After (20 s) is past the budget: the kept answer, no retry.
        let second =
            contract_call(&Contract::DEFAULT, &mut state, &context(&transport, &tally)).await;
        assert_eq!(
            second,
            CallEnd {
                shown: Shown::LastGood,
                retries: 0
            }
        );
        assert_eq!(transport.sent().len(), 2);
        // Another call 5 s later: the hold still runs, nothing is sent.
        tokio::time::advance(Duration::from_secs(5)).await;
        let third =
            contract_call(&Contract::DEFAULT, &mut state, &context(&transport, &tally)).await;
        assert_eq!(third.shown, Shown::LastGood);
        assert_eq!(transport.sent().len(), 2);
        // Once the hold can be waited within the budget, the call waits and sends.
        tokio::time::advance(Duration::from_secs(10)).await;
        let fourth =
            contract_call(&Contract::DEFAULT, &mut state, &context(&transport, &tally)).await;
        assert_eq!(fourth.shown, Shown::Live);
        let sent = transport.sent();
        assert_eq!(sent.len(), 3);
        assert!(sent[2] >= sent[1] + Duration::from_secs(20));
        // Only the third call was answered by the hold; the second sent, and its retry would
        // have waited past the budget.
        let held: u64 = tally
            .windows
            .iter()
            .map(|w| w.held.load(Ordering::Relaxed))
            .sum();
        assert_eq!(held, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_three_attempts_a_500_once_and_no_retry_for_a_404() {
        let start = Instant::now();
        let tally = tally(start);
        let contract = Contract::DEFAULT;
        let overloaded = Scripted::new(vec![response(503, None); 5]);
        let mut state = ContractState::new(&contract, 1, start, 7);
        let end = contract_call(&contract, &mut state, &context(&overloaded, &tally)).await;
        assert_eq!(
            end,
            CallEnd {
                shown: Shown::Nothing,
                retries: 2
            }
        );
        assert_eq!(overloaded.sent().len(), 3);

        let broken = Scripted::new(vec![response(500, None); 5]);
        let mut state = ContractState::new(&contract, 1, start, 8);
        let end = contract_call(&contract, &mut state, &context(&broken, &tally)).await;
        assert_eq!(end.retries, 1);
        assert_eq!(broken.sent().len(), 2);

        let gone = Scripted::new(vec![response(404, None)]);
        let mut state = ContractState::new(&contract, 1, start, 9);
        state.kept[0] = true;
        let end = contract_call(&contract, &mut state, &context(&gone, &tally)).await;
        assert_eq!(
            end,
            CallEnd {
                shown: Shown::Nothing,
                retries: 0
            }
        );
        assert_eq!(gone.sent().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_naive_client_retries_at_once_three_times() {
        let start = Instant::now();
        let tally = tally(start);
        let transport = Scripted::new(vec![response(429, Some(5)); 10]);
        let end = naive_call(&context(&transport, &tally)).await;
        assert_eq!(
            end,
            CallEnd {
                shown: Shown::Nothing,
                retries: 3
            }
        );
        let sent = transport.sent();
        assert_eq!(sent.len(), 4);
        assert!(
            sent[3] - sent[0] < Duration::from_millis(10),
            "no wait between retries"
        );
        let retries: u64 = tally
            .windows
            .iter()
            .map(|w| w.retries.load(Ordering::Relaxed))
            .sum();
        assert_eq!(retries, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_population_counts_taps_per_user_and_phase_and_a_new_tap_cancels() {
        let plan = PopulationPlan {
            users: 50,
            mean_think: Duration::from_secs(2),
            items_per_user: 4,
            taps_for: Duration::from_secs(30),
            drain: Duration::from_secs(11),
            spike: (Duration::from_secs(10), Duration::from_secs(20)),
            window: Duration::from_secs(1),
            seed: 3,
        };
        let keys = KeyPicker::catalogue(1).unwrap();
        // Every request answers after 3 s: most calls are still in flight at the next tap.
        let mut slow = Scripted::new(Vec::new());
        slow.latency = Duration::from_secs(3);
        let start = Instant::now();
        let tally = run_population(
            &plan,
            ClientKind::Contract,
            Contract::DEFAULT,
            &keys,
            Arc::new(slow),
            start,
        )
        .await;
        let expected: usize = (0..plan.users)
            .map(|user| user_taps(&plan, user).len())
            .sum();
        let taps: u64 = tally
            .windows
            .iter()
            .map(|w| w.taps.load(Ordering::Relaxed))
            .sum();
        assert_eq!(taps, expected as u64);
        let per_phase: u32 = tally
            .users
            .iter()
            .flat_map(|user| user.taps.iter().map(|count| count.load(Ordering::Relaxed)))
            .sum();
        assert_eq!(per_phase as usize, expected);
        let sum = |pick: fn(&WindowCounters) -> &AtomicU64| -> u64 {
            tally
                .windows
                .iter()
                .map(|w| pick(w).load(Ordering::Relaxed))
                .sum()
        };
        let (cancelled, left, live) = (
            sum(|w| &w.superseded),
            sum(|w| &w.left_waiting),
            sum(|w| &w.live),
        );
        // A slow answer gives no stale answer to show while it comes: every call cut short
        // left its user waiting.
        assert_eq!(left, cancelled);
        assert!(
            cancelled > 0,
            "a tap within 3 s of the one before cancels it"
        );
        assert_eq!(
            left + live + sum(|w| &w.last_good) + sum(|w| &w.nothing),
            taps
        );
        // About one tap per user every 2 s, 30 s: 750 ± a few standard deviations.
        assert!((600..900).contains(&taps), "{taps} taps");
    }
}

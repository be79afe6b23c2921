//! Three levels of load shedding, chosen from measured load, that do not flap.
//!
//! The shedder only *chooses* a [`ShedLevel`]; the caller applies it: level 1 drops extras,
//! level 2 shortens dependency timeouts, level 3 answers from cache only.
//!
//! # What overload is
//! Overload is work waiting, not work arriving: the signals hold on a 2-core VM and a 64-core
//! host alike, with nothing configured per machine. Every `interval` the first request past the
//! deadline wins a CAS on the evaluation timestamp and computes, from that interval's counters,
//! `load = max(queue delay / target, standing in-flight / concurrency limit[, throughput / cap])`:
//! - **queue delay** (CoDel's sojourn time): the caller's probe reports how long a task waits for
//!   a worker of the runtime ([`LoadShedder::record_queue_delay`], every `queue_probe_every`).
//!   The interval's *minimum* counts, as in CoDel: a burst the service absorbs leaves some
//!   samples low and sheds nothing; only a standing queue, where every sample waited, does.
//!   And only once it stood for two intervals (the lower of this interval's minimum and the
//!   previous one's), as the mean concurrency below: a stall of one interval, the cores taken by
//!   other processes for a moment, queues every probe in it and drains by itself. An interval
//!   without any report keeps the last one's delay (a starved probe reports its lateness when
//!   it runs again).
//! - **standing in-flight**: the larger of two readings. One is the *mean* concurrency (the time
//!   completed requests spent in flight within an interval, over its length: Little's law), the
//!   lower of this interval's and the previous one's, so a slow spell of one interval that drains
//!   by itself does not count. The other is the count in flight at both this evaluation and the
//!   previous one (requests piled up on a hung dependency complete nothing, so only the count
//!   shows them). A stall of a few milliseconds
//!   that piles up hundreds of requests and drains again adds little to the mean and is gone by
//!   the next evaluation: it sheds nothing — the same reading of "standing" as the queue
//!   delay's. The count at a single instant (the first admission after a stall sees the whole
//!   pile) is never used.
//! - **the concurrency limit** follows latency against its own baseline, as in Netflix's
//!   Gradient2: with `short` = this interval's mean latency and `long` = a slow EWMA of it,
//!   `gradient = clamp(1.5 · long / short, 0.5, 2)`. Latency over the tolerated multiple moves
//!   the limit a fifth of the way towards `limit · gradient + √limit`; latency back within it
//!   grows the limit by a fifth of the gradient's headroom (10 % an interval at the baseline,
//!   20 % well below it; Envoy's adaptive concurrency caps its gradient at 2 the same way) plus
//!   `√limit / 2`, so the cut an incident made is undone within seconds, however little of the
//!   limit the traffic uses. At level 3 it is frozen: cache-only answers say nothing about full
//!   work. It stays within `[min_in_flight, max_in_flight]`, starts at `max_in_flight` and stays
//!   there when `adaptive` is off. Only admitted requests count: the edge reads a request's body
//!   before admitting it, so a client trickling its body is neither in flight nor part of the
//!   latency.
//! - **throughput / capacity_rps**: an optional cap (0, the default, leaves it out) for a
//!   deployment that must not exceed a rate whatever the machine could do.
//!
//! The load goes through a [`LevelController`]: up at once, down one level at a time, only below
//! the level's threshold minus `hysteresis` and only after `min_dwell` at the current level.
//!
//! # Leaving cache-only without flapping
//! Cache-only answers are cheap, so at level 3 the queue drains and the limit relaxes while the
//! offered load is unchanged; stepping down on those signals alone would cycle 3 → 2 → 3. So the
//! shedder learns what it can serve: whenever an interval shows it saturated while still doing
//! full work (level ≤ 2), that interval's throughput is the **saturated rate** (an EWMA over such
//! intervals). Saturated means a standing queue for a worker, or standing in-flight over the
//! limit while the runtime's workers were busy for at least [`SATURATED_BUSY`] of the interval
//! ([`LoadShedder::record_worker_busy`]). The second case matters where the queue probe cannot
//! see the queue: when the service's threads wait in the kernel's run queue behind other
//! processes, a yield is still polled at once. Requests piled on a slow dependency leave the
//! workers idle and teach nothing. The shedder also learns the **served rate**: the highest mean
//! admission rate of a second whose every interval was calm (level 0, load and mean
//! concurrency below the level-1 threshold minus the hysteresis), decaying while full work goes
//! on. At level 3, the last second's mean admission rate (not completions: requests piling up
//! complete little but are offered load) is full load when it is above both
//! `saturated × (1 − hysteresis)` and `served × (1 + hysteresis)`, and holds nothing otherwise:
//! a load near the rate full work queued at is overload, one near a rate served calmly is not,
//! and the served rate wins where the two meet. So the hold ends once the offered load is back
//! at a rate this instance has served calmly, with no margin fitted to a machine. It lasts at
//! most [`MAX_HOLD_DWELLS`] dwells, after which one step down re-measures (a service that
//! saturates again at level 2 relearns the rate and returns to 3; one that copes stays down).
//!
//! The hold aside, level 3 is left only after a second (the window the hold compares) in which
//! every interval's measured load stayed below the level-3 threshold minus the hysteresis: at
//! level 3 the signals flicker between cheap answers, and one low interval inside a burst is no
//! more a reason to resume full work than one high interval is to stop it. The second runs
//! alongside the hold's, so it adds nothing to a recovery the hold already waits for.
//!
//! Evaluation is lazy: without traffic nothing is evaluated, so after a quiet spell the level
//! steps down from the first request on, one level per dwell as always.
//!
//! The measured level, the operator's forced level and the time the measured level was entered
//! share one `AtomicU64`, so [`LoadShedder::admit`] reads the level with one load and updates
//! never tear.
//!
//! # Layout
//! - `mod.rs`: the signals and their evaluation, the packed level, admission;
//! - `level.rs`: [`LevelController`], the level policy;
//! - `limit.rs`: the adaptive concurrency limit's step (Gradient2);
//! - `rules.rs`: the configuration values the evaluation reads, which
//!   [`LoadShedder::reconfigure`] changes in place.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::live::{RestartOnly, load_f64, lock};
use crate::ticker::{Ticker, saturating_nanos};

mod level;
mod limit;
mod rules;

pub use level::LevelController;
use level::{sanitize_load, validate_levels};
use limit::{LONG_LATENCY_ALPHA, next_limit};
use rules::{Bounds, Rules};

/// How much of its normal work the service gives up to stay responsive. Ordered: a higher level
/// includes the measures of the lower ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ShedLevel {
    Normal = 0,
    /// Optional work (extras) is dropped.
    DropExtras = 1,
    /// Dependency timeouts are shortened as well.
    ShortTimeouts = 2,
    /// Only caches answer; misses are refused.
    CacheOnly = 3,
}

impl ShedLevel {
    const ALL: [Self; 4] = [
        Self::Normal,
        Self::DropExtras,
        Self::ShortTimeouts,
        Self::CacheOnly,
    ];

    pub fn as_u8(self) -> u8 {
        self as u8
    }

    pub fn from_u8(value: u8) -> Option<Self> {
        Self::ALL.get(usize::from(value)).copied()
    }

    /// The name used in logs, metrics and the status page (same as the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::DropExtras => "drop_extras",
            Self::ShortTimeouts => "short_timeouts",
            Self::CacheOnly => "cache_only",
        }
    }

    /// The next level down (Normal stays Normal).
    fn lower(self) -> Self {
        Self::from_u8(self.as_u8().saturating_sub(1)).unwrap_or(Self::Normal)
    }
}

/// The shedding knobs of one instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShedConfig {
    /// An optional cap in requests per second: throughput over it counts as load. 0 (the
    /// default) leaves it out; overload is then seen from queueing and latency alone.
    pub capacity_rps: u32,
    /// The standing queue delay that is full load (CoDel's target): the runtime queue delay
    /// that stood for two intervals (the lower of their minimums) divided by this is the queue
    /// signal.
    pub queue_delay_target: Duration,
    /// How often the caller's probe measures the runtime queue delay; an interval without a
    /// report means the probe itself was starved.
    pub queue_probe_every: Duration,
    /// Hard ceiling of the concurrency limit: more requests in flight than this is overload
    /// whatever the latency says.
    pub max_in_flight: u32,
    /// Floor of the adaptive limit, so one latency spike cannot make a handful of requests look
    /// like overload.
    pub min_in_flight: u32,
    /// Adapt the concurrency limit to the latency trend (Gradient2); off = `max_in_flight`.
    pub adaptive: bool,
    /// Loads (1.0 = at capacity) at which levels 1, 2 and 3 start; strictly increasing.
    pub thresholds: [f64; 3],
    /// A level is left only once load is below its threshold by this much, so noise around a
    /// threshold does not flap.
    pub hysteresis: f64,
    /// Time a level is held before it may step down; going up never waits.
    pub min_dwell: Duration,
    /// How often load is re-evaluated: long enough to average noise, short enough to react.
    pub interval: Duration,
}

impl Default for ShedConfig {
    fn default() -> Self {
        Self {
            capacity_rps: 0,
            queue_delay_target: Duration::from_millis(5),
            queue_probe_every: Duration::from_millis(10),
            max_in_flight: 512,
            min_in_flight: 16,
            adaptive: true,
            thresholds: [0.70, 0.85, 1.00],
            hysteresis: 0.05,
            min_dwell: Duration::from_secs(1),
            interval: Duration::from_millis(250),
        }
    }
}

impl ShedConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_in_flight == 0 {
            return Err("max_in_flight must be at least 1, got 0".to_owned());
        }
        if self.min_in_flight == 0 || self.min_in_flight > self.max_in_flight {
            return Err(format!(
                "min_in_flight must be in [1, max_in_flight = {}], got {}",
                self.max_in_flight, self.min_in_flight
            ));
        }
        validate_levels(self.thresholds, self.hysteresis)?;
        if self.interval < MIN_INTERVAL {
            return Err(format!(
                "interval must be at least 1ms (every admission would re-evaluate), got {:?}",
                self.interval
            ));
        }
        if !(MIN_INTERVAL..=Duration::from_secs(1)).contains(&self.queue_delay_target) {
            return Err(format!(
                "queue_delay_target must be within 1ms..=1s, got {:?}",
                self.queue_delay_target
            ));
        }
        if !(MIN_INTERVAL..=Duration::from_secs(1)).contains(&self.queue_probe_every) {
            return Err(format!(
                "queue_probe_every must be within 1ms..=1s, got {:?}",
                self.queue_probe_every
            ));
        }
        Ok(())
    }

    /// The nearest configuration the shedder can run: counts at least 1, the floor within the
    /// ceiling, the interval at least [`MIN_INTERVAL`].
    fn clamped(self) -> Self {
        let max_in_flight = self.max_in_flight.max(1);
        Self {
            max_in_flight,
            min_in_flight: self.min_in_flight.clamp(1, max_in_flight),
            interval: self.interval.max(MIN_INTERVAL),
            ..self
        }
    }
}

const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// Weight of one saturated interval's throughput in the learned saturated rate.
const SATURATED_ALPHA: f64 = 0.5;
/// Level 3 is held on the saturated rate for at most this many dwells before a step down
/// re-measures: long enough to ride out a flash crowd without flapping, short enough that a rate
/// that has gone wrong costs at most this long at level 3. Only a rate the instance has
/// corroborated (it served at least [`CORROBORATED_SHARE`] of it calmly) is held
/// this long; any other is held for [`SHORT_HOLD_DWELLS`].
pub(crate) const MAX_HOLD_DWELLS: u32 = 20;
/// The hold for a saturated rate learned before the instance ever served a comparable rate with
/// no shedding — typically a cold start, whose cost per request falls as its caches fill, so
/// the rate it saturated at is soon too low.
pub(crate) const SHORT_HOLD_DWELLS: u32 = 5;
/// Share of the saturated rate the instance must have served calmly for the rate
/// to be held for [`MAX_HOLD_DWELLS`].
pub(crate) const CORROBORATED_SHARE: f64 = 0.5;
/// Half-life of the served rate: a rate served long ago says less about today's costs.
const SERVED_HALF_LIFE_SECS: f64 = 300.0;
/// Intervals in the mean offered rate the level-3 hold compares: a second at 250 ms, so one
/// interval in which the edge admitted less (its own threads starved) does not end the hold in
/// the middle of a burst. A plain window, not an EWMA: a load that falls to exactly the served
/// rate reaches it after this many intervals, where an average with a tail would stay above it.
const OFFERED_WINDOW: usize = 4;
/// Share of an interval the runtime's workers must have been busy for in-flight overload to
/// count as saturation (rather than requests waiting on a slow dependency, which idles them).
pub(crate) const SATURATED_BUSY: f64 = 0.9;
/// Sheds load in three levels from measured throughput, concurrency and latency.
///
/// One per instance, shared by every request (`Arc<LoadShedder>` or a `static`).
#[derive(Debug)]
pub struct LoadShedder {
    /// The configuration in force, for [`Self::config`]; only [`Self::reconfigure`] takes the
    /// lock (while it stores `rules`, which the evaluation reads).
    config: Mutex<ShedConfig>,
    rules: Rules,
    ticker: Arc<dyn Ticker>,
    /// Restart-only: every measurement is taken over it.
    interval_nanos: u64,
    /// Restart-only, see [`Self::reconfigure`].
    adaptive: bool,
    /// A [`PackedLevel`]: what `admit` reads, with one load.
    level_word: AtomicU64,
    /// When load was last evaluated; the CAS on it elects the evaluator.
    last_evaluation_nanos: AtomicU64,
    /// Written by every request.
    counters: RequestCounters,
    // The f64 results of evaluations, as bits. Written only by the elected evaluator.
    limit_bits: AtomicU64,
    short_latency_nanos_bits: AtomicU64,
    long_latency_nanos_bits: AtomicU64,
    load_bits: AtomicU64,
    throughput_rps_bits: AtomicU64,
    /// Admissions per second over the last interval (f64 bits).
    offered_rps_bits: AtomicU64,
    /// The last [`OFFERED_WINDOW`] intervals' offered rates, whose mean the hold compares.
    offered_window: RateWindow,
    /// The standing in-flight count the last evaluation used (f64 bits).
    standing_in_flight_bits: AtomicU64,
    /// `in_flight` as the last evaluation read it.
    evaluated_in_flight: AtomicU64,
    /// The last interval's mean concurrency (f64 bits).
    mean_in_flight_bits: AtomicU64,
    /// Written by the queue-delay probe.
    probe: ProbeCounters,
    /// The last interval's queue delay, in nanoseconds (as f64 bits): the minimum the probe
    /// reported in it, or the interval before's when it reported nothing.
    queue_delay_nanos_bits: AtomicU64,
    /// The queue delay the last evaluation compared with the target: the lower of the last two
    /// intervals' (f64 bits, nanoseconds).
    standing_queue_delay_nanos_bits: AtomicU64,
    /// The learned saturated rate in requests/s (0 = not learned yet), as f64 bits.
    saturated_rps_bits: AtomicU64,
    /// The workers' busy share the last evaluation used (f64 bits; negative = never reported).
    worker_busy_bits: AtomicU64,
    /// The highest mean admission rate of a calm second (four intervals at level 0, each with
    /// load and mean concurrency below the level-1 threshold minus the hysteresis), decaying with
    /// [`SERVED_HALF_LIFE_SECS`] while full work goes on; f64 bits, 0 = none yet.
    served_rps_bits: AtomicU64,
    /// Consecutive calm intervals up to the last evaluation (written by the evaluator alone).
    calm_streak: AtomicU64,
    /// When an evaluation last measured a load at or above level 3's leave threshold (the hold
    /// aside), in ticker nanoseconds.
    last_full_load_nanos: AtomicU64,
}

/// The probe's reports since the last evaluation.
#[derive(Debug)]
struct ProbeCounters {
    /// Smallest delay reported in this interval; `u64::MAX` = none.
    min_delay_nanos: AtomicU64,
    /// Worker busy time and the worker time it was out of, summed over this interval's reports.
    busy_nanos: AtomicU64,
    available_nanos: AtomicU64,
}

impl LoadShedder {
    /// `config` must have passed [`ShedConfig::validate`]; out-of-range counts and intervals are
    /// clamped rather than trusted.
    pub fn new(config: ShedConfig, ticker: Arc<dyn Ticker>) -> Self {
        debug_assert!(config.validate().is_ok(), "{:?}", config.validate());
        let config = config.clamped();
        let now_nanos = ticker.now_nanos();
        let initial = PackedLevel {
            measured: ShedLevel::Normal,
            forced: None,
            since_nanos: now_nanos,
        };
        Self {
            interval_nanos: saturating_nanos(config.interval),
            adaptive: config.adaptive,
            rules: Rules::new(&config),
            ticker,
            level_word: AtomicU64::new(initial.pack()),
            counters: RequestCounters::default(),
            last_evaluation_nanos: AtomicU64::new(now_nanos),
            // A cold start is not overload: the limit only shrinks on evidence.
            limit_bits: AtomicU64::new(f64::from(config.max_in_flight).to_bits()),
            short_latency_nanos_bits: AtomicU64::new(0.0_f64.to_bits()),
            long_latency_nanos_bits: AtomicU64::new(0.0_f64.to_bits()),
            load_bits: AtomicU64::new(0.0_f64.to_bits()),
            throughput_rps_bits: AtomicU64::new(0.0_f64.to_bits()),
            offered_rps_bits: AtomicU64::new(0.0_f64.to_bits()),
            offered_window: RateWindow::default(),
            standing_in_flight_bits: AtomicU64::new(0.0_f64.to_bits()),
            evaluated_in_flight: AtomicU64::new(0),
            mean_in_flight_bits: AtomicU64::new(0.0_f64.to_bits()),
            probe: ProbeCounters {
                min_delay_nanos: AtomicU64::new(u64::MAX),
                busy_nanos: AtomicU64::new(0),
                available_nanos: AtomicU64::new(0),
            },
            queue_delay_nanos_bits: AtomicU64::new(0.0_f64.to_bits()),
            standing_queue_delay_nanos_bits: AtomicU64::new(0.0_f64.to_bits()),
            saturated_rps_bits: AtomicU64::new(0.0_f64.to_bits()),
            worker_busy_bits: AtomicU64::new((-1.0_f64).to_bits()),
            served_rps_bits: AtomicU64::new(0.0_f64.to_bits()),
            calm_streak: AtomicU64::new(0),
            last_full_load_nanos: AtomicU64::new(0),
            config: Mutex::new(config),
        }
    }

    /// Applies `config` to the running shedder from its next evaluation on. Live: the queue
    /// delay target, the thresholds, the hysteresis, the dwell, the concurrency limit's floor
    /// and ceiling (`min_in_flight`, `max_in_flight`: the learned limit is kept, clamped into
    /// them at once, or set to the ceiling when `adaptive` is off) and `capacity_rps` (0 = none).
    /// Kept: the level (measured and forced) and when it was entered, the requests in flight,
    /// and every measurement and learned rate.
    ///
    /// Restart-only, kept at their old values and named in the answer when `config` differs:
    /// - `interval`: every measurement is per interval (the mean concurrency, the two-interval
    ///   minimums, the one-second windows of four intervals, the latency EWMAs' weights), so a
    ///   new length would mix intervals the signals are not calibrated for;
    /// - `queue_probe_every`: the caller's probe task reads it when it starts;
    /// - `adaptive`: switching it would start a limit pinned at the ceiling adapting from
    ///   there, or pin an adapted one, where the service was built to run one or the other.
    ///
    /// (The service's own `enabled`, `accept_queue`, level-2 timeout factors and `Retry-After`
    /// range are not the shedder's: whoever holds them applies them.) `config` should have
    /// passed [`ShedConfig::validate`]; counts are clamped as by [`Self::new`].
    pub fn reconfigure(&self, config: &ShedConfig) -> RestartOnly {
        debug_assert!(config.validate().is_ok(), "{:?}", config.validate());
        let mut in_force = lock(&self.config);
        let mut restart_only = RestartOnly::default();
        restart_only.note("interval", &in_force.interval, &config.interval);
        restart_only.note(
            "queue_probe_every",
            &in_force.queue_probe_every,
            &config.queue_probe_every,
        );
        restart_only.note("adaptive", &in_force.adaptive, &config.adaptive);
        let config = ShedConfig {
            interval: in_force.interval,
            queue_probe_every: in_force.queue_probe_every,
            adaptive: in_force.adaptive,
            ..config.clone()
        }
        .clamped();
        self.rules.store(&config);
        self.clamp_limit(self.rules.bounds());
        *in_force = config;
        restart_only
    }

    /// Brings the concurrency limit within `bounds` (to the ceiling when it does not adapt).
    fn clamp_limit(&self, bounds: Bounds) {
        let _ = self
            .limit_bits
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |bits| {
                let limit = if self.adaptive {
                    bounds.clamp(f64::from_bits(bits))
                } else {
                    f64::from(bounds.max)
                };
                Some(limit.to_bits())
            });
    }

    /// Reports one measurement of how long a task waited for a runtime worker (the caller's
    /// probe: how late its timer fired, or how long a yield took to be polled again). Cheap: one
    /// `fetch_min`.
    pub fn record_queue_delay(&self, delay: Duration) {
        self.probe
            .min_delay_nanos
            .fetch_min(saturating_nanos(delay), Ordering::Relaxed);
    }

    /// Reports how long the runtime's workers were busy (`busy`, summed over workers) out of
    /// the worker time that passed (`available`: elapsed time × workers) since the last report.
    /// Two `fetch_add`s.
    pub fn record_worker_busy(&self, busy: Duration, available: Duration) {
        let available = saturating_nanos(available);
        self.probe
            .busy_nanos
            .fetch_add(saturating_nanos(busy).min(available), Ordering::Relaxed);
        self.probe
            .available_nanos
            .fetch_add(available, Ordering::Relaxed);
    }

    /// Admits one request: counts it in flight and returns the level to serve it at. Hold the
    /// admission for the whole request, shed answers included: its drop is what measures
    /// throughput and latency.
    ///
    /// Re-evaluates the load lazily when `interval` has passed since the last evaluation
    /// (exactly one caller wins a CAS on the evaluation timestamp and does it; the others read
    /// the level atomically).
    pub fn admit(&self) -> Admission<'_> {
        let now_nanos = self.ticker.now_nanos();
        // Before this request is counted: it belongs to the interval that starts now.
        self.evaluate_if_due(now_nanos);
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        let level = PackedLevel::unpack(self.level_word.load(Ordering::Acquire)).effective();
        Admission {
            shedder: self,
            level,
            admitted_at_nanos: now_nanos,
        }
    }

    /// Closes the interval when it is over (the CAS winner evaluates it).
    fn evaluate_if_due(&self, now_nanos: u64) {
        let last_nanos = self.last_evaluation_nanos.load(Ordering::Relaxed);
        if now_nanos.saturating_sub(last_nanos) >= self.interval_nanos
            && self
                .last_evaluation_nanos
                .compare_exchange(last_nanos, now_nanos, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.evaluate(last_nanos, now_nanos);
        }
    }

    /// The level a request admitted now would be served at, evaluating the load first when the
    /// interval is over, as [`LoadShedder::admit`] does, but without admitting anything: what a
    /// request that waits checks on each try, so that a service whose only traffic waits still
    /// re-evaluates its level and can let it in.
    pub fn evaluated_level(&self) -> ShedLevel {
        self.evaluate_if_due(self.ticker.now_nanos());
        self.level()
    }

    /// The level new requests are served at (forced or measured).
    pub fn level(&self) -> ShedLevel {
        PackedLevel::unpack(self.level_word.load(Ordering::Acquire)).effective()
    }

    /// Whether fewer requests are in flight than the concurrency limit allows: the room a
    /// request that may wait ([`crate::AdmissionQueue`]) needs before it is admitted. Two relaxed
    /// loads; the answer may be stale by the time the caller admits, which overshoots the limit
    /// by at most the callers racing.
    pub fn has_room(&self) -> bool {
        let in_flight = self.counters.in_flight.load(Ordering::Relaxed);
        (in_flight as f64) < load_f64(&self.limit_bits)
    }

    /// Operator override for drills (None = measured). Applies at once; the measured level keeps
    /// being tracked underneath.
    pub fn force(&self, level: Option<ShedLevel>) {
        let update = self
            .level_word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                let packed = PackedLevel::unpack(word);
                Some(
                    PackedLevel {
                        forced: level,
                        ..packed
                    }
                    .pack(),
                )
            });
        let (Ok(previous) | Err(previous)) =
            update.map(PackedLevel::unpack).map_err(PackedLevel::unpack);
        tracing::warn!(
            forced = level.map(ShedLevel::as_str),
            previous = previous.forced.map(ShedLevel::as_str),
            "shed level override changed"
        );
    }

    /// Feeds an explicit load ratio through the controller (tests and drills); returns the level
    /// new requests are served at. The next measured evaluation overrides it: to hold a level
    /// under live traffic, use [`LoadShedder::force`].
    pub fn observe_load(&self, load: f64) -> ShedLevel {
        let load = sanitize_load(load);
        self.load_bits.store(load.to_bits(), Ordering::Relaxed);
        let controller = self.rules.load().controller();
        self.apply_load(&controller, load, self.ticker.now_nanos())
    }

    pub fn snapshot(&self) -> ShedSnapshot {
        let now_nanos = self.ticker.now_nanos();
        let rules = self.rules.load();
        let packed = PackedLevel::unpack(self.level_word.load(Ordering::Acquire));
        ShedSnapshot {
            level: packed.effective(),
            forced: packed.forced,
            load: load_f64(&self.load_bits),
            in_flight: self.counters.in_flight.load(Ordering::Relaxed),
            standing_in_flight: load_f64(&self.standing_in_flight_bits),
            concurrency_limit: load_f64(&self.limit_bits) as u64,
            throughput_rps: load_f64(&self.throughput_rps_bits),
            offered_rps: load_f64(&self.offered_rps_bits),
            mean_offered_rps: self.offered_window.mean(),
            latency_ms: load_f64(&self.short_latency_nanos_bits) / 1e6,
            baseline_latency_ms: load_f64(&self.long_latency_nanos_bits) / 1e6,
            level_since_ms: now_nanos.saturating_sub(packed.since_nanos) / 1_000_000,
            thresholds: rules.thresholds,
            queue_delay_ms: load_f64(&self.standing_queue_delay_nanos_bits) / 1e6,
            interval_queue_delay_ms: load_f64(&self.queue_delay_nanos_bits) / 1e6,
            queue_delay_target_ms: Duration::from_nanos(rules.queue_delay_target_nanos)
                .as_secs_f64()
                * 1e3,
            saturated_rps: Some(load_f64(&self.saturated_rps_bits)).filter(|rps| *rps > 0.0),
            worker_busy: Some(load_f64(&self.worker_busy_bits)).filter(|busy| *busy >= 0.0),
            served_rps: Some(load_f64(&self.served_rps_bits)).filter(|rps| *rps > 0.0),
            min_in_flight: rules.bounds.min,
            max_in_flight: rules.bounds.max,
            capacity_rps: Some(rules.capacity_rps).filter(|cap| *cap > 0),
        }
    }

    /// The configuration in force: the last [`Self::reconfigure`]'s (or [`Self::new`]'s),
    /// clamped, with the restart-only values the shedder was built with.
    pub fn config(&self) -> ShedConfig {
        lock(&self.config).clone()
    }

    /// Closes the interval `(previous_nanos, now_nanos]`: turns its counters into a load and
    /// feeds the controller. Only the CAS winner runs it, so its plain load/store pairs are
    /// single-writer (a thread paused for a whole interval could overlap the next evaluator and
    /// lose one limit update, which the next interval repairs). Cold: once per interval, and
    /// kept out of the admission it is called from.
    #[cold]
    fn evaluate(&self, previous_nanos: u64, now_nanos: u64) {
        let rules = self.rules.load();
        let elapsed_nanos = now_nanos.saturating_sub(previous_nanos).max(1);
        let completed = self.counters.completed.swap(0, Ordering::Relaxed);
        let latency_sum_nanos = self.counters.latency_sum_nanos.swap(0, Ordering::Relaxed);
        let busy_nanos = self.counters.busy_nanos.swap(0, Ordering::Relaxed);
        let in_flight = self.counters.in_flight.load(Ordering::Relaxed);
        let previous_in_flight = self.evaluated_in_flight.swap(in_flight, Ordering::Relaxed);
        let persisting = in_flight.min(previous_in_flight);
        let mean_in_flight = busy_nanos as f64 / elapsed_nanos as f64;
        // The mean counts only where it held for two intervals in a row, as the count does: a
        // slow spell of a few hundred milliseconds (a dependency's hiccup) raises one interval's
        // mean and drains by itself; overload raises both.
        let previous_mean = f64::from_bits(
            self.mean_in_flight_bits
                .swap(mean_in_flight.to_bits(), Ordering::Relaxed),
        );
        let standing_in_flight = mean_in_flight.min(previous_mean).max(persisting as f64);
        self.standing_in_flight_bits
            .store(standing_in_flight.to_bits(), Ordering::Relaxed);

        let throughput_rps = completed as f64 * 1e9 / elapsed_nanos as f64;
        self.throughput_rps_bits
            .store(throughput_rps.to_bits(), Ordering::Relaxed);
        // Admissions in the interval: what completed plus what the in-flight count grew by. The
        // offered load, where completions alone would read low while requests pile up.
        let admitted = (completed as f64 + in_flight as f64 - previous_in_flight as f64).max(0.0);
        let offered_rps = admitted * 1e9 / elapsed_nanos as f64;
        self.offered_rps_bits
            .store(offered_rps.to_bits(), Ordering::Relaxed);
        let mean_offered_rps = self.offered_window.push(offered_rps);
        if completed > 0 {
            self.update_latency_and_limit(
                latency_sum_nanos as f64 / completed as f64,
                rules.bounds,
            );
        }

        // The queue delay counts once it held for two intervals, as the mean concurrency does:
        // a stall of one interval (the machine's other processes took the cores) queues every
        // probe of that interval and drains by itself once the cores are back; overload queues
        // both.
        let previous_queue_delay_nanos = load_f64(&self.queue_delay_nanos_bits);
        let queue_delay_nanos = self.interval_queue_delay();
        self.queue_delay_nanos_bits
            .store(queue_delay_nanos.to_bits(), Ordering::Relaxed);
        let standing_queue_delay_nanos = queue_delay_nanos.min(previous_queue_delay_nanos);
        self.standing_queue_delay_nanos_bits
            .store(standing_queue_delay_nanos.to_bits(), Ordering::Relaxed);
        let queue_ratio = standing_queue_delay_nanos / rules.queue_delay_target_nanos as f64;
        let concurrency_ratio = standing_in_flight / load_f64(&self.limit_bits);
        let cap_ratio = if rules.capacity_rps == 0 {
            0.0
        } else {
            throughput_rps / f64::from(rules.capacity_rps)
        };
        let overload = queue_ratio.max(concurrency_ratio);
        let worker_busy = self.interval_worker_busy();
        let packed = PackedLevel::unpack(self.level_word.load(Ordering::Acquire));
        let full_load = rules.thresholds[2];
        let saturated_now = queue_ratio >= full_load
            || (concurrency_ratio >= full_load && worker_busy >= SATURATED_BUSY);
        if packed.measured < ShedLevel::CacheOnly && saturated_now && throughput_rps > 0.0 {
            // Saturated while doing full work: what it completed is what it can serve. Many
            // requests in flight alone do not say so: they may be waiting on a slow dependency,
            // which leaves the workers idle and says nothing about the rate this instance can
            // serve.
            let learned = load_f64(&self.saturated_rps_bits);
            let saturated = if learned > 0.0 {
                learned + SATURATED_ALPHA * (throughput_rps - learned)
            } else {
                throughput_rps
            };
            self.saturated_rps_bits
                .store(saturated.to_bits(), Ordering::Relaxed);
        }
        let measured_load = overload.max(cap_ratio);
        let mut load = measured_load;
        // Calm: full work (extras included) and no level would be entered. Its throughput is a
        // rate this instance serves without shedding, whatever its workers' busy share.
        let calm_below = rules.thresholds[0] - rules.hysteresis;
        let calm = packed.measured == ShedLevel::Normal
            && load < calm_below
            && mean_in_flight / load_f64(&self.limit_bits) < calm_below;
        let calm_streak = if calm {
            self.calm_streak.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.calm_streak.store(0, Ordering::Relaxed);
            0
        };
        // A second in which every interval was calm: its mean admission rate was served.
        let calm_second = calm_streak >= OFFERED_WINDOW as u64;
        let served = self.update_served_rate(
            calm_second.then_some(mean_offered_rps),
            elapsed_nanos,
            packed.measured < ShedLevel::CacheOnly,
        );
        let saturated = load_f64(&self.saturated_rps_bits);
        let held_nanos = now_nanos.saturating_sub(packed.since_nanos);
        let hold_dwells = if served >= CORROBORATED_SHARE * saturated {
            MAX_HOLD_DWELLS
        } else {
            SHORT_HOLD_DWELLS
        };
        let max_hold_nanos = rules.min_dwell_nanos.saturating_mul(u64::from(hold_dwells));
        if packed.measured == ShedLevel::CacheOnly && saturated > 0.0 && held_nanos < max_hold_nanos
        {
            // Cheap answers hide the offered load; the rate that saturated full work does not.
            // The hold is all or nothing, and the hysteresis counts towards each rate's own
            // side: an offered load within it of the saturated rate is full load (that rate is
            // where full work queued, and a burst at just the rate the instance saturates at
            // saturated it again at level 2 after every step down), and one within it of the
            // served rate holds nothing (it was measured calm, and the retries of the 503s
            // level 3 itself answers lift the offered load a few per cent above what came
            // before the burst). The served rate wins where the two meet: a rate learned while
            // the instance thrashed must not hold level 3 after the load is back to normal.
            let hold_above = (saturated * (1.0 - rules.hysteresis).max(0.0))
                .max(served * (1.0 + rules.hysteresis));
            if mean_offered_rps > hold_above {
                load = load.max(full_load.max(mean_offered_rps / saturated.max(served)));
            }
        }
        // Level 3 is left only once the measured load (the hold aside) has been below its leave
        // threshold for a second, the window the hold compares: cache-only answers make the
        // signals at level 3 flicker (in a burst the machine could not even admit, one interval
        // read 0.74 between 1.3 and 1.7 and resumed full work into the burst), and one low
        // interval is no more a reason to resume full work than one high one is to stop it.
        let leave_cache_only_below = full_load - rules.hysteresis;
        if measured_load >= leave_cache_only_below {
            self.last_full_load_nanos
                .fetch_max(now_nanos, Ordering::Relaxed);
        }
        let quiet_nanos =
            now_nanos.saturating_sub(self.last_full_load_nanos.load(Ordering::Relaxed));
        if packed.measured == ShedLevel::CacheOnly
            && quiet_nanos < self.interval_nanos.saturating_mul(OFFERED_WINDOW as u64)
        {
            load = load.max(leave_cache_only_below);
        }
        self.load_bits.store(load.to_bits(), Ordering::Relaxed);
        self.apply_load(&rules.controller(), load, now_nanos);
    }

    /// The interval's queue delay in nanoseconds: the smallest the probe reported, or the last
    /// interval's when it reported nothing (0 while no probe runs).
    fn interval_queue_delay(&self) -> f64 {
        match self.probe.min_delay_nanos.swap(u64::MAX, Ordering::Relaxed) {
            u64::MAX => load_f64(&self.queue_delay_nanos_bits),
            min_delay => min_delay as f64,
        }
    }

    /// Decays the served rate by the interval's share of its half-life (only while full work
    /// goes on, `decays`: at level 3 no interval can renew it, so time there must not erode it)
    /// and raises it to `calm_rate`, the mean admission rate of a second whose every interval
    /// was calm: the same statistic the hold compares, so a load back at a rate served before
    /// ends the hold. No headroom is extrapolated: only a rate actually served counts. Returns
    /// the new served rate.
    fn update_served_rate(&self, calm_rate: Option<f64>, elapsed_nanos: u64, decays: bool) -> f64 {
        let mut served = load_f64(&self.served_rps_bits);
        if decays {
            served *= 0.5_f64.powf(elapsed_nanos as f64 / 1e9 / SERVED_HALF_LIFE_SECS);
        }
        if let Some(rate) = calm_rate {
            served = served.max(rate);
        }
        self.served_rps_bits
            .store(served.to_bits(), Ordering::Relaxed);
        served
    }

    /// The share of worker time the interval's reports found busy, or the last interval's when
    /// none came (a starved probe), stored for the snapshot. Negative while none ever came.
    fn interval_worker_busy(&self) -> f64 {
        let available = self.probe.available_nanos.swap(0, Ordering::Relaxed);
        let busy = self.probe.busy_nanos.swap(0, Ordering::Relaxed);
        if available == 0 {
            return load_f64(&self.worker_busy_bits);
        }
        let share = busy as f64 / available as f64;
        self.worker_busy_bits
            .store(share.to_bits(), Ordering::Relaxed);
        share
    }

    /// One Gradient2 step from an interval's mean latency, within `bounds`.
    fn update_latency_and_limit(&self, short_nanos: f64, bounds: Bounds) {
        let previous_long_nanos = load_f64(&self.long_latency_nanos_bits);
        let cache_only = PackedLevel::unpack(self.level_word.load(Ordering::Acquire)).measured
            == ShedLevel::CacheOnly;
        let mut long_nanos = if cache_only && previous_long_nanos > 0.0 {
            // Cache-only answers take microseconds: learning them as the baseline would make
            // real work look slow when it resumes and shrink the limit back into overload.
            previous_long_nanos
        } else if previous_long_nanos > 0.0 {
            previous_long_nanos + LONG_LATENCY_ALPHA * (short_nanos - previous_long_nanos)
        } else {
            // Seeded by the first interval that measured anything.
            short_nanos
        };
        if !cache_only && short_nanos > 0.0 && long_nanos / short_nanos > 2.0 {
            // Latency is back to normal after a long bad spell: forget the bad baseline faster
            // than the EWMA would, or a new slowdown would go unnoticed for minutes.
            long_nanos *= 0.95;
        }
        self.short_latency_nanos_bits
            .store(short_nanos.to_bits(), Ordering::Relaxed);
        self.long_latency_nanos_bits
            .store(long_nanos.to_bits(), Ordering::Relaxed);
        if !self.adaptive || cache_only {
            // The limit is about full work, which level 3 does not do: what cheap answers (or
            // answers waiting on a slow L2) take says nothing about it. Frozen, the limit meets
            // full work again at the value it had when level 3 began.
            return;
        }
        let limit = next_limit(
            load_f64(&self.limit_bits),
            short_nanos,
            long_nanos,
            f64::from(bounds.min),
            f64::from(bounds.max),
        );
        self.limit_bits.store(limit.to_bits(), Ordering::SeqCst);
        // A reconfiguration that moved the bounds since this evaluation read them may have
        // clamped the limit before the store above: clamp it again (see `Bounds`).
        let bounds_now = self.rules.bounds();
        if bounds_now != bounds {
            self.clamp_limit(bounds_now);
        }
    }

    /// Runs `controller` on the packed state until the CAS sticks (it races only with
    /// [`LoadShedder::force`] and [`LoadShedder::observe_load`]). Returns the effective level.
    fn apply_load(&self, controller: &LevelController, load: f64, now_nanos: u64) -> ShedLevel {
        let mut word = self.level_word.load(Ordering::Acquire);
        loop {
            let current = PackedLevel::unpack(word);
            let (measured, since_nanos) =
                controller.step(current.measured, current.since_nanos, load, now_nanos);
            if measured == current.measured {
                // Same level (dwell and since only change with the level): nothing to write.
                return current.effective();
            }
            let next = PackedLevel {
                measured,
                since_nanos,
                ..current
            };
            match self.level_word.compare_exchange_weak(
                word,
                next.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    tracing::info!(
                        from = current.measured.as_str(),
                        to = measured.as_str(),
                        load,
                        forced = next.forced.map(ShedLevel::as_str),
                        "shed level changed"
                    );
                    return next.effective();
                }
                Err(actual) => word = actual,
            }
        }
    }
}

/// The last [`OFFERED_WINDOW`] rates, written by the evaluator alone (as f64 bits, so the
/// snapshot can read them).
#[derive(Debug, Default)]
struct RateWindow {
    rates: [AtomicU64; OFFERED_WINDOW],
    pushed: AtomicU64,
}

impl RateWindow {
    /// Replaces the oldest rate with `rate`; returns the window's new mean.
    fn push(&self, rate: f64) -> f64 {
        let slot = self.pushed.fetch_add(1, Ordering::Relaxed) as usize % OFFERED_WINDOW;
        self.rates[slot].store(rate.to_bits(), Ordering::Relaxed);
        self.mean()
    }

    /// The mean of the rates pushed so far (of the last [`OFFERED_WINDOW`]); 0 before any.
    fn mean(&self) -> f64 {
        let filled = (self.pushed.load(Ordering::Relaxed) as usize).min(OFFERED_WINDOW);
        if filled == 0 {
            return 0.0;
        }
        self.rates[..filled].iter().map(load_f64).sum::<f64>() / filled as f64
    }
}

/// The counters every request writes, on cache lines of their own: sharing a line with the
/// read-mostly level word would make each admission on one core a cache miss on the others.
#[derive(Debug, Default)]
#[repr(align(128))]
struct RequestCounters {
    in_flight: AtomicU64,
    /// Time requests completed since the last evaluation spent in flight after it began.
    busy_nanos: AtomicU64,
    /// Completions since the last evaluation and the sum of their latencies.
    completed: AtomicU64,
    latency_sum_nanos: AtomicU64,
}

/// The measured level, the forced level and when the measured level was entered, in one `u64`
/// so that `admit` needs one load and no update can tear them apart.
///
/// Bits 0–1: measured level; bits 2–4: forced level + 1 (0 = none); bits 5–63: since, in ticker
/// nanoseconds (saturating after 18 years of uptime, after which the dwell is always met).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PackedLevel {
    measured: ShedLevel,
    forced: Option<ShedLevel>,
    since_nanos: u64,
}

impl PackedLevel {
    const FORCED_SHIFT: u32 = 2;
    const SINCE_SHIFT: u32 = 5;
    const SINCE_MAX: u64 = u64::MAX >> Self::SINCE_SHIFT;

    fn pack(self) -> u64 {
        let forced = self.forced.map_or(0, |level| u64::from(level.as_u8()) + 1);
        u64::from(self.measured.as_u8())
            | forced << Self::FORCED_SHIFT
            | self.since_nanos.min(Self::SINCE_MAX) << Self::SINCE_SHIFT
    }

    fn unpack(word: u64) -> Self {
        let level_at = |bits: u64| ShedLevel::ALL[(bits & 0b11) as usize];
        let forced_bits = (word >> Self::FORCED_SHIFT) & 0b111;
        Self {
            measured: level_at(word),
            forced: forced_bits.checked_sub(1).map(level_at),
            since_nanos: word >> Self::SINCE_SHIFT,
        }
    }

    fn effective(self) -> ShedLevel {
        self.forced.unwrap_or(self.measured)
    }
}

/// One admitted request; dropping it records its completion and latency.
#[must_use = "the request counts as in flight until the admission drops"]
pub struct Admission<'a> {
    shedder: &'a LoadShedder,
    level: ShedLevel,
    admitted_at_nanos: u64,
}

impl Admission<'_> {
    /// The level to serve this request at, fixed at admission.
    pub fn level(&self) -> ShedLevel {
        self.level
    }

    /// The admission without its borrow of the shedder, for a request whose remaining work
    /// outlives the scope it was admitted in: it stays in flight until the ticket is handed to
    /// [`LoadShedder::complete`].
    pub fn into_ticket(self) -> AdmissionTicket {
        let ticket = AdmissionTicket {
            level: self.level,
            admitted_at_nanos: self.admitted_at_nanos,
        };
        std::mem::forget(self);
        ticket
    }
}

/// An [`Admission`] detached from its shedder ([`Admission::into_ticket`]); the request counts
/// as in flight until [`LoadShedder::complete`] takes it back.
#[derive(Debug)]
#[must_use = "the request counts as in flight until the ticket is completed"]
pub struct AdmissionTicket {
    level: ShedLevel,
    admitted_at_nanos: u64,
}

impl AdmissionTicket {
    /// The level to serve this request at, fixed at admission.
    pub fn level(&self) -> ShedLevel {
        self.level
    }
}

impl LoadShedder {
    /// Records the completion of a request admitted as `ticket`, as dropping its [`Admission`]
    /// would have.
    pub fn complete(&self, ticket: AdmissionTicket) {
        self.record_completion(ticket.admitted_at_nanos);
    }

    fn record_completion(&self, admitted_at_nanos: u64) {
        let now_nanos = self.ticker.now_nanos();
        let latency_nanos = now_nanos.saturating_sub(admitted_at_nanos);
        let counters = &self.counters;
        counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        counters
            .latency_sum_nanos
            .fetch_add(latency_nanos, Ordering::Relaxed);
        // Only the part inside the current interval: a request that hung for seconds must not
        // count its whole wait against the interval it happens to end in.
        let interval_start = self.last_evaluation_nanos.load(Ordering::Relaxed);
        counters.busy_nanos.fetch_add(
            now_nanos.saturating_sub(admitted_at_nanos.max(interval_start)),
            Ordering::Relaxed,
        );
        counters.completed.fetch_add(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for Admission<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Admission")
            .field("level", &self.level)
            .field("admitted_at_nanos", &self.admitted_at_nanos)
            .finish_non_exhaustive()
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.shedder.record_completion(self.admitted_at_nanos);
    }
}

/// What the status page and metrics show about shedding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShedSnapshot {
    /// The level new requests are served at.
    pub level: ShedLevel,
    /// The operator's override, if any.
    pub forced: Option<ShedLevel>,
    /// The last load fed to the controller (1.0 = full load: a standing queue at the target,
    /// in-flight at the limit, or the saturated rate held at level 3).
    pub load: f64,
    pub in_flight: u64,
    /// What the last evaluation compared with the limit: the mean concurrency of the last two
    /// intervals (the lower), or the count in flight at this and the previous evaluation,
    /// whichever is larger.
    pub standing_in_flight: f64,
    pub concurrency_limit: u64,
    /// Completions per second over the last interval.
    pub throughput_rps: f64,
    /// Admissions per second over the last interval: completions plus the growth of the
    /// in-flight count.
    pub offered_rps: f64,
    /// The offered rate's mean over the last second (four intervals): what the level-3 hold
    /// compares with the rate this instance is known to serve.
    pub mean_offered_rps: f64,
    /// Mean latency of the last interval that completed anything.
    pub latency_ms: f64,
    /// The long-term (slow EWMA) latency the current one is compared with.
    pub baseline_latency_ms: f64,
    /// How long the measured level has been held (a forced level does not reset it).
    pub level_since_ms: u64,
    pub thresholds: [f64; 3],
    /// The runtime queue delay the last evaluation compared with the target: the lower of the
    /// last two intervals' minimum probe reports (a queue that stood for both).
    pub queue_delay_ms: f64,
    /// The last interval's minimum probe report alone.
    pub interval_queue_delay_ms: f64,
    /// The queue delay that is full load.
    pub queue_delay_target_ms: f64,
    /// The throughput at which the service last saturated while doing full work; holds level 3
    /// while the offered load is still there. None until it first saturates.
    pub saturated_rps: Option<f64>,
    /// The highest mean admission rate of a calm second at full work (decaying, half-life 5 min,
    /// not while at level 3): the hold never compares with less, and a saturated rate at least
    /// twice it is held only briefly. None until such a second.
    pub served_rps: Option<f64>,
    /// The share of the last interval the runtime's workers were busy (0–1); None until the
    /// caller first reports it.
    pub worker_busy: Option<f64>,
    /// The concurrency limit's floor and ceiling.
    pub min_in_flight: u32,
    pub max_in_flight: u32,
    /// The configured throughput cap, if any.
    pub capacity_rps: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ticker::ManualTicker;

    const SECOND: u64 = 1_000_000_000;
    const DWELL: Duration = Duration::from_secs(2);
    const INTERVAL: Duration = Duration::from_millis(250);

    use ShedLevel::{CacheOnly, DropExtras, Normal, ShortTimeouts};

    #[test]
    fn level_names_and_numbers_round_trip() {
        for level in ShedLevel::ALL {
            assert_eq!(ShedLevel::from_u8(level.as_u8()), Some(level));
        }
        assert_eq!(ShedLevel::from_u8(4), None);
        assert_eq!(ShortTimeouts.as_str(), "short_timeouts");
        assert!(Normal < DropExtras && ShortTimeouts < CacheOnly);
    }

    fn manual_shedder(config: ShedConfig) -> (LoadShedder, ManualTicker) {
        config.validate().unwrap();
        let ticker = ManualTicker::new();
        (LoadShedder::new(config, Arc::new(ticker.clone())), ticker)
    }

    /// One interval of traffic: `requests` admitted together (the first closes the previous
    /// interval) and held for `latency`, then time moves to the end of the interval.
    fn interval_of_traffic(
        shedder: &LoadShedder,
        ticker: &ManualTicker,
        requests: usize,
        latency: Duration,
    ) {
        let admissions: Vec<_> = (0..requests).map(|_| shedder.admit()).collect();
        ticker.advance(latency);
        drop(admissions);
        ticker.advance(shedder.config().interval.saturating_sub(latency));
    }

    #[test]
    fn a_ticket_keeps_the_request_in_flight_until_completed_like_an_admission() {
        let (shedder, ticker) = manual_shedder(ShedConfig::default());
        let kept = shedder.admit();
        let ticket = shedder.admit().into_ticket();
        assert_eq!(ticket.level(), kept.level());
        assert_eq!(
            shedder.snapshot().in_flight,
            2,
            "forgetting the borrow ends nothing"
        );
        ticker.advance(Duration::from_millis(40));
        drop(kept);
        assert_eq!(shedder.snapshot().in_flight, 1);
        shedder.complete(ticket);
        assert_eq!(shedder.snapshot().in_flight, 0);
        assert_eq!(shedder.counters.completed.load(Ordering::Relaxed), 2);
        assert_eq!(
            shedder.counters.latency_sum_nanos.load(Ordering::Relaxed),
            2 * 40_000_000,
            "both held 40 ms"
        );
    }

    #[test]
    fn the_packed_level_round_trips() {
        for measured in ShedLevel::ALL {
            for forced in [None, Some(Normal), Some(ShortTimeouts), Some(CacheOnly)] {
                for since_nanos in [0, SECOND, PackedLevel::SINCE_MAX] {
                    let packed = PackedLevel {
                        measured,
                        forced,
                        since_nanos,
                    };
                    assert_eq!(PackedLevel::unpack(packed.pack()), packed);
                }
            }
        }
        let far_future = PackedLevel {
            measured: CacheOnly,
            forced: None,
            since_nanos: u64::MAX,
        };
        assert_eq!(
            PackedLevel::unpack(far_future.pack()),
            PackedLevel {
                since_nanos: PackedLevel::SINCE_MAX,
                ..far_future
            }
        );
    }

    #[test]
    fn an_injected_load_walks_the_shedder_up_and_down_in_order() {
        let (shedder, ticker) = manual_shedder(ShedConfig::default());
        let mut walked = vec![shedder.level()];
        for load in [0.5, 0.72, 0.9, 1.1, 1.1, 0.9, 0.7, 0.5, 0.0] {
            ticker.advance(DWELL);
            let level = shedder.observe_load(load);
            if walked.last() != Some(&level) {
                walked.push(level);
            }
        }
        assert_eq!(
            walked,
            [
                Normal,
                DropExtras,
                ShortTimeouts,
                CacheOnly,
                ShortTimeouts,
                DropExtras,
                Normal
            ]
        );
        let snapshot = shedder.snapshot();
        assert_eq!((snapshot.load, snapshot.level_since_ms), (0.0, 2000));
        assert_eq!(shedder.observe_load(f64::NAN), Normal);
        assert_eq!(shedder.snapshot().load, 0.0, "the load the controller used");
    }

    #[test]
    fn throughput_over_capacity_sheds_and_quiet_intervals_walk_back_down() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            capacity_rps: 100,
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        for _ in 0..50 {
            drop(shedder.admit());
        }
        ticker.advance(INTERVAL);
        // 50 completions in 250 ms = 200 rps = load 2.0.
        assert_eq!(shedder.admit().level(), CacheOnly);
        let snapshot = shedder.snapshot();
        assert_eq!(snapshot.throughput_rps, 200.0);
        assert_eq!(snapshot.load, 2.0);

        let mut walked = vec![shedder.level()];
        for _ in 0..4 {
            ticker.advance(DWELL);
            let level = shedder.admit().level();
            assert!(shedder.snapshot().load < 0.01);
            walked.push(level);
        }
        assert_eq!(
            walked,
            [CacheOnly, ShortTimeouts, DropExtras, Normal, Normal]
        );
    }

    #[test]
    fn concurrency_near_the_limit_sheds_until_released() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            max_in_flight: 10,
            min_in_flight: 1,
            adaptive: false,
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        let mut open: Vec<_> = (0..10).map(|_| shedder.admit()).collect();
        assert!(open.iter().all(|admission| admission.level() == Normal));
        ticker.advance(INTERVAL);
        // Swap one request for another, so nine stay open while the new one closes the interval.
        // One evaluation that sees them is a count at an instant, not a standing one.
        drop(open.pop());
        open.push(shedder.admit());
        assert_eq!(open.last().map(Admission::level), Some(Normal));
        ticker.advance(INTERVAL);
        drop(open.pop());
        open.push(shedder.admit());
        assert_eq!(
            open.last().map(Admission::level),
            Some(ShortTimeouts),
            "nine in flight at two evaluations in a row: 0.9 ≥ 0.85"
        );
        assert_eq!(shedder.snapshot().in_flight, 10);

        drop(open);
        assert_eq!(shedder.snapshot().in_flight, 0);
        let mut walked = vec![shedder.level()];
        for _ in 0..4 {
            ticker.advance(DWELL);
            walked.push(shedder.admit().level());
        }
        // Released: down one level a dwell from the first evaluation on.
        assert_eq!(walked, [ShortTimeouts, DropExtras, Normal, Normal, Normal]);
    }

    #[test]
    fn the_adaptive_limit_follows_the_latency_trend_within_its_bounds() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            max_in_flight: 64,
            min_in_flight: 16,
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        let baseline = Duration::from_millis(10);
        for _ in 0..20 {
            interval_of_traffic(&shedder, &ticker, 40, baseline);
        }
        drop(shedder.admit());
        let steady = shedder.snapshot();
        assert_eq!(steady.concurrency_limit, 64, "already at its ceiling");
        assert_eq!(
            (steady.latency_ms, steady.baseline_latency_ms),
            (10.0, 10.0)
        );
        assert_eq!(steady.level, Normal, "40 of 64");

        // A jump to ten times the baseline shrinks the limit.
        interval_of_traffic(&shedder, &ticker, 40, 10 * baseline);
        drop(shedder.admit());
        assert!(shedder.snapshot().concurrency_limit < 64);

        // Latency that keeps rising drives it to its floor and no further, and the same 40
        // requests in flight become overload.
        let mut latency = 10 * baseline;
        let mut previous_limit = shedder.snapshot().concurrency_limit;
        for _ in 0..40 {
            latency = latency * 3 / 2;
            interval_of_traffic(&shedder, &ticker, 40, latency);
            drop(shedder.admit());
            let limit = shedder.snapshot().concurrency_limit;
            assert!(
                (16..=previous_limit).contains(&limit),
                "{limit} after {previous_limit}"
            );
            previous_limit = limit;
        }
        assert!(previous_limit < 40, "{previous_limit}");
        assert_eq!(
            shedder.level(),
            CacheOnly,
            "40 in flight against a limit that fell below 40; frozen there at level 3"
        );

        // Back to normal latency, the limit regrows to its ceiling and no further.
        for _ in 0..200 {
            interval_of_traffic(&shedder, &ticker, 40, baseline);
            drop(shedder.admit());
            assert!(shedder.snapshot().concurrency_limit <= 64);
        }
        assert_eq!(shedder.snapshot().concurrency_limit, 64);
        assert_eq!(shedder.level(), Normal);
    }

    /// At level 3 neither the latency baseline nor the limit learns from what cache-only answers
    /// take, cheap or waiting on a slow L2: full work meets both as they were when level 3 began.
    #[test]
    fn cache_only_answers_move_neither_the_latency_baseline_nor_the_limit() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            interval: INTERVAL,
            min_dwell: Duration::from_secs(10),
            ..ShedConfig::default()
        });
        for _ in 0..10 {
            interval_of_traffic(&shedder, &ticker, 20, Duration::from_millis(10));
        }
        drop(shedder.admit());
        assert_eq!(shedder.snapshot().baseline_latency_ms, 10.0);
        // One interval at ten times the baseline cuts the limit below its ceiling.
        interval_of_traffic(&shedder, &ticker, 20, Duration::from_millis(100));
        drop(shedder.admit());
        let before = shedder.snapshot();
        assert!(before.concurrency_limit < 512, "{before:?}");
        assert_eq!(shedder.observe_load(1.5), CacheOnly);
        // Answers waiting on a slow L2, then served from L1 in microseconds, for less than the
        // dwell: still level 3, and nothing learned.
        let slow_then_cheap = [Duration::from_millis(100); 2]
            .into_iter()
            .chain([Duration::from_micros(5); 8]);
        for latency in slow_then_cheap {
            interval_of_traffic(&shedder, &ticker, 20, latency);
            drop(shedder.admit());
            let snapshot = shedder.snapshot();
            assert_eq!(snapshot.level, CacheOnly);
            assert_eq!(
                (snapshot.baseline_latency_ms, snapshot.concurrency_limit),
                (before.baseline_latency_ms, before.concurrency_limit),
                "{snapshot:?}"
            );
        }
        assert!(shedder.snapshot().latency_ms < 0.01);
    }

    #[test]
    fn the_limit_probes_back_up_while_latency_is_at_its_baseline() {
        // However little of it is used: the cut an incident made must not stay. At the
        // baseline: 10 % (a fifth of the gradient's headroom of 1.5) plus √100 / 2.
        let at_baseline = next_limit(100.0, 1.0, 1.0, 16.0, 512.0);
        assert!((at_baseline - 115.0).abs() < 1e-9, "{at_baseline}");
        // Within the tolerance but above the baseline: little more than the additive probe.
        let near_tolerance = next_limit(100.0, 1.4, 1.0, 16.0, 512.0);
        assert!((105.0..107.0).contains(&near_tolerance), "{near_tolerance}");
        assert!(next_limit(100.0, 10.0, 1.0, 16.0, 512.0) < 100.0);
        assert_eq!(next_limit(510.0, 1.0, 1.0, 16.0, 512.0), 512.0, "capped");
        let no_latency = next_limit(100.0, 0.0, 0.0, 16.0, 512.0);
        assert!(
            (no_latency - 125.0).abs() < 1e-9,
            "no latency: no queue, the gradient at its cap of 2: {no_latency}"
        );
        // From the floor back to the ceiling in seconds of baseline latency.
        let mut limit = 16.0;
        let mut intervals = 0;
        while limit < 512.0 {
            limit = next_limit(limit, 1.0, 1.0, 16.0, 512.0);
            intervals += 1;
        }
        assert!(intervals <= 28, "{intervals} intervals of 250 ms");
    }

    /// The issue's incident: steady traffic at 10 ms, then a 5 s table lock during which every
    /// request takes 1 s (40 admitted and 40 completing per 250 ms interval), then 10 ms again.
    /// The limit must fall during the lock and be back within 20 % of where it was within 60 s.
    #[test]
    fn after_a_five_second_table_lock_the_limit_recovers_within_a_minute() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        let fast = Duration::from_millis(10);
        for _ in 0..40 {
            interval_of_traffic(&shedder, &ticker, 40, fast);
        }
        drop(shedder.admit());
        let before = shedder.snapshot().concurrency_limit as f64;

        // The lock: requests admitted in one interval complete four intervals (1 s) later.
        let mut waiting: std::collections::VecDeque<Vec<Admission<'_>>> = Default::default();
        for _ in 0..20 {
            waiting.push_back((0..40).map(|_| shedder.admit()).collect());
            if waiting.len() > 4 {
                drop(waiting.pop_front());
            }
            ticker.advance(INTERVAL);
        }
        drop(waiting);
        drop(shedder.admit());
        let during = shedder.snapshot().concurrency_limit as f64;
        assert!(during < before * 0.6, "{during} vs {before}");

        let mut recovered_after = None;
        for interval in 1..=240 {
            interval_of_traffic(&shedder, &ticker, 40, fast);
            drop(shedder.admit());
            if recovered_after.is_none()
                && shedder.snapshot().concurrency_limit as f64 >= before * 0.8
            {
                recovered_after = Some(INTERVAL * interval);
            }
        }
        let recovered_after = recovered_after.expect("the limit never recovered");
        assert!(
            recovered_after <= Duration::from_secs(60),
            "{recovered_after:?}"
        );
        assert_eq!(shedder.level(), Normal);
    }

    #[test]
    fn a_queue_standing_for_two_intervals_sheds_and_a_burst_or_a_stall_does_not() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        // A burst: some probes wait 50 ms, but one in the interval found a free worker.
        for delay_ms in [50, 40, 0, 30] {
            shedder.record_queue_delay(Duration::from_millis(delay_ms));
        }
        interval_of_traffic(&shedder, &ticker, 10, Duration::from_millis(1));
        shedder.record_queue_delay(Duration::from_micros(100));
        drop(shedder.admit());
        assert_eq!(shedder.level(), Normal, "{:?}", shedder.snapshot());

        // A stall: every probe of one interval waited at least the target, and the next found a
        // free worker again.
        let queued_interval = |delays: &[u64]| {
            for delay_ms in delays {
                shedder.record_queue_delay(Duration::from_millis(*delay_ms));
            }
            interval_of_traffic(&shedder, &ticker, 10, Duration::from_millis(1));
            drop(shedder.admit());
        };
        queued_interval(&[6, 9, 12]);
        let snapshot = shedder.snapshot();
        assert_eq!(snapshot.interval_queue_delay_ms, 6.0);
        assert_eq!(
            snapshot.queue_delay_ms, 0.0,
            "the interval before found a free worker"
        );
        assert_eq!(snapshot.level, Normal, "{snapshot:?}");
        queued_interval(&[0]);
        assert_eq!(shedder.level(), Normal, "{:?}", shedder.snapshot());

        // A standing queue: every probe of two intervals in a row waited at least the target.
        queued_interval(&[6, 9, 12]);
        assert_eq!(shedder.level(), Normal, "{:?}", shedder.snapshot());
        queued_interval(&[7, 8]);
        let snapshot = shedder.snapshot();
        assert_eq!(snapshot.level, CacheOnly, "{snapshot:?}");
        assert_eq!(snapshot.queue_delay_ms, 6.0, "the lower of the two");
        assert_eq!(snapshot.interval_queue_delay_ms, 7.0);
        assert_eq!(snapshot.load, 1.2);
        assert_eq!(
            snapshot.saturated_rps,
            Some(44.0),
            "11 completions (10 and the probe of the level) in 250 ms, doing full work"
        );
    }

    #[test]
    fn an_interval_without_a_probe_report_keeps_the_last_delay() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        drop(shedder.admit());
        ticker.advance(INTERVAL);
        drop(shedder.admit());
        assert_eq!(
            shedder.snapshot().queue_delay_ms,
            0.0,
            "no probe runs: no signal"
        );

        shedder.record_queue_delay(Duration::from_millis(4));
        ticker.advance(INTERVAL);
        drop(shedder.admit());
        assert_eq!(shedder.snapshot().interval_queue_delay_ms, 4.0);
        assert_eq!(
            shedder.snapshot().queue_delay_ms,
            0.0,
            "one interval so far"
        );
        assert_eq!(shedder.level(), Normal);
        // A starved probe reports nothing for an interval: the queue is not taken to be gone,
        // so it has now stood for two.
        ticker.advance(INTERVAL);
        drop(shedder.admit());
        assert_eq!(shedder.snapshot().interval_queue_delay_ms, 4.0);
        assert_eq!(shedder.snapshot().queue_delay_ms, 4.0);
        assert_eq!(shedder.level(), DropExtras, "0.8 of the target");
        shedder.record_queue_delay(Duration::from_millis(1));
        ticker.advance(INTERVAL);
        drop(shedder.admit());
        assert_eq!(shedder.snapshot().queue_delay_ms, 1.0);
    }

    /// Sustained overload: cache-only answers are cheap, so the queue drains at level 3; the
    /// saturated rate holds it there while the offered load lasts, then it walks down one level
    /// per dwell once the load falls.
    #[test]
    fn level_three_holds_while_the_saturating_load_lasts_and_walks_down_after() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        let busy = |shedder: &LoadShedder, ticker: &ManualTicker, requests, delay_ms| {
            shedder.record_queue_delay(Duration::from_millis(delay_ms));
            interval_of_traffic(shedder, ticker, requests, Duration::from_millis(1));
        };
        // Saturated at 100 requests per interval (400 rps) doing full work, for two intervals.
        busy(&shedder, &ticker, 100, 20);
        busy(&shedder, &ticker, 100, 20);
        drop(shedder.admit());
        assert_eq!(shedder.level(), CacheOnly);
        assert_eq!(
            shedder.snapshot().saturated_rps,
            Some(400.0),
            "100 in 250 ms"
        );

        // 150 % offered, served cheaply: no queue, yet level 3 stays for the whole hold.
        let mut changes = 0;
        let mut previous = shedder.level();
        for _ in 0..16 {
            busy(&shedder, &ticker, 150, 0);
            let level = shedder.admit().level();
            changes += usize::from(level != previous);
            previous = level;
        }
        assert_eq!(
            (previous, changes),
            (CacheOnly, 0),
            "{:?}",
            shedder.snapshot()
        );

        // The load drops to 80 % of the saturated rate: down to normal one level per dwell.
        let mut walked = vec![shedder.level()];
        for _ in 0..20 {
            busy(&shedder, &ticker, 80, 0);
            let level = shedder.admit().level();
            if walked.last() != Some(&level) {
                walked.push(level);
            }
        }
        assert_eq!(walked, [CacheOnly, ShortTimeouts, DropExtras, Normal]);
    }

    #[test]
    fn a_pile_up_that_drains_within_the_interval_sheds_nothing() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            max_in_flight: 64,
            min_in_flight: 16,
            adaptive: false,
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        for _ in 0..4 {
            interval_of_traffic(&shedder, &ticker, 20, Duration::from_millis(1));
        }
        // A 15 ms stall of the runtime: 300 requests arrive together (the first admission
        // after it sees every one in flight), then all drain within 15 ms.
        interval_of_traffic(&shedder, &ticker, 300, Duration::from_millis(15));
        for _ in 0..4 {
            interval_of_traffic(&shedder, &ticker, 20, Duration::from_millis(1));
            assert_eq!(shedder.level(), Normal);
        }
        // 300 × 15 ms in a 250 ms interval is a mean of 18 in flight: 0.28 of 64.
        drop(shedder.admit());
        let snapshot = shedder.snapshot();
        assert!(snapshot.standing_in_flight < 1.0, "{snapshot:?}");
    }

    /// Where the queue probe sees nothing (the service's threads wait in the kernel's run queue,
    /// not in the runtime's), in-flight overload on busy workers is saturation: its rate holds
    /// level 3. The same overload on idle workers is waiting, and teaches nothing.
    #[test]
    fn in_flight_overload_on_busy_workers_teaches_the_saturated_rate() {
        let saturate = |worker_busy: f64| {
            let (shedder, ticker) = limited_shedder();
            // 100 requests of 150 ms an interval, two intervals running: a mean of 60 in
            // flight against 40.
            for _ in 0..2 {
                interval_of_traffic(&shedder, &ticker, 100, Duration::from_millis(150));
                shedder.record_worker_busy(INTERVAL.mul_f64(worker_busy * 2.0), INTERVAL * 2);
            }
            drop(shedder.admit());
            shedder.snapshot()
        };
        let waiting = saturate(0.5);
        assert_eq!(waiting.level, CacheOnly, "{waiting:?}");
        assert_eq!(waiting.saturated_rps, None, "idle workers: waiting");
        assert_eq!(waiting.worker_busy, Some(0.5));

        let saturated = saturate(0.95);
        assert_eq!(saturated.level, CacheOnly);
        assert_eq!(saturated.saturated_rps, Some(400.0));
    }

    /// Full work served with spare capacity, `requests` per interval (4 × per second), workers
    /// 60 % busy.
    fn spare_interval(shedder: &LoadShedder, ticker: &ManualTicker, requests: usize) {
        interval_of_traffic(shedder, ticker, requests, Duration::from_millis(1));
        shedder.record_worker_busy(INTERVAL.mul_f64(0.6), INTERVAL);
    }

    /// Overload on busy workers: `requests` of 150 ms an interval against a limit of 40, for
    /// two intervals (a mean counts once it held for two).
    fn saturated_intervals(shedder: &LoadShedder, ticker: &ManualTicker, requests: usize) {
        for _ in 0..2 {
            interval_of_traffic(shedder, ticker, requests, Duration::from_millis(150));
            shedder.record_worker_busy(INTERVAL.mul_f64(0.95), INTERVAL);
        }
    }

    /// The distinct levels, in order, over `intervals` intervals of `requests` quick ones each.
    fn levels_over(
        shedder: &LoadShedder,
        ticker: &ManualTicker,
        requests: usize,
        intervals: usize,
    ) -> Vec<ShedLevel> {
        let mut walked = vec![shedder.level()];
        for _ in 0..intervals {
            interval_of_traffic(shedder, ticker, requests, Duration::from_millis(1));
            let level = shedder.admit().level();
            if walked.last() != Some(&level) {
                walked.push(level);
            }
        }
        walked
    }

    /// `intervals` intervals of `requests` quick ones answered on idle workers (cheap cache-only
    /// answers), each followed by an admission that must find level 3.
    fn assert_held_through(
        shedder: &LoadShedder,
        ticker: &ManualTicker,
        requests: usize,
        intervals: usize,
    ) {
        for _ in 0..intervals {
            shedder.record_worker_busy(INTERVAL / 5, INTERVAL);
            interval_of_traffic(shedder, ticker, requests, Duration::from_millis(1));
            assert_eq!(
                shedder.admit().level(),
                CacheOnly,
                "{:?}",
                shedder.snapshot()
            );
        }
    }

    fn limited_shedder() -> (LoadShedder, ManualTicker) {
        manual_shedder(ShedConfig {
            max_in_flight: 40,
            min_in_flight: 1,
            adaptive: false,
            interval: INTERVAL,
            ..ShedConfig::default()
        })
    }

    /// A flash crowd on a warm instance: the rate it saturated at is corroborated by what it
    /// served before, so level 3 holds for the whole burst, then walks down once it ends.
    #[test]
    fn a_corroborated_saturated_rate_holds_level_three_through_a_burst() {
        let (shedder, ticker) = limited_shedder();
        for _ in 0..8 {
            spare_interval(&shedder, &ticker, 60);
        }
        drop(shedder.admit());
        assert_eq!(
            shedder.snapshot().served_rps,
            Some(240.0),
            "60 an interval, served calmly: no headroom is extrapolated"
        );
        saturated_intervals(&shedder, &ticker, 100);
        drop(shedder.admit());
        assert_eq!(shedder.level(), CacheOnly);
        assert_eq!(
            shedder.snapshot().saturated_rps,
            Some(400.0),
            "100 completions in the second saturated interval, 250 ms"
        );
        // 150 % offered for 10 s, answered cheaply and with idle workers: held throughout.
        assert_held_through(&shedder, &ticker, 150, 40);
        // The load drops to 80 %: down one level per dwell.
        assert_eq!(
            levels_over(&shedder, &ticker, 80, 20),
            [CacheOnly, ShortTimeouts, DropExtras, Normal]
        );
    }

    /// A burst at just the rate full work saturated at (the interval that taught it completed a
    /// little more than arrives on average, draining what had queued) is still full load: it is
    /// held through, not left and re-entered after every dwell.
    #[test]
    fn a_burst_within_the_hysteresis_below_the_saturated_rate_is_held() {
        let (shedder, ticker) = limited_shedder();
        for _ in 0..8 {
            spare_interval(&shedder, &ticker, 60);
        }
        saturated_intervals(&shedder, &ticker, 100);
        drop(shedder.admit());
        assert_eq!(shedder.snapshot().saturated_rps, Some(400.0));
        // 97 an interval plus the admission that reads the level: 392 rps, 2 % under 400.
        assert_held_through(&shedder, &ticker, 97, 40);
        assert_eq!(
            levels_over(&shedder, &ticker, 60, 20),
            [CacheOnly, ShortTimeouts, DropExtras, Normal]
        );
    }

    /// Thrashing lowers what a saturated interval completes: a rate learned then would hold
    /// level 3 after the load is back to what the instance served before. It is never taken
    /// below that.
    #[test]
    fn a_rate_learned_while_thrashing_is_floored_by_what_was_served() {
        let (shedder, ticker) = limited_shedder();
        for _ in 0..8 {
            spare_interval(&shedder, &ticker, 60);
        }
        // Saturated, but completing only 50 an interval (200 rps, below the 240 served): 50
        // more are stuck in flight for two evaluations, against a limit of 40.
        let piled: Vec<_> = (0..50).map(|_| shedder.admit()).collect();
        for _ in 0..2 {
            interval_of_traffic(&shedder, &ticker, 50, Duration::from_millis(1));
            shedder.record_worker_busy(INTERVAL.mul_f64(0.95), INTERVAL);
        }
        drop(shedder.admit());
        drop(piled);
        let snapshot = shedder.snapshot();
        assert_eq!(snapshot.level, CacheOnly, "{snapshot:?}");
        assert!(snapshot.saturated_rps.unwrap() < 240.0, "{snapshot:?}");
        // Well above what was served: held.
        for _ in 0..8 {
            interval_of_traffic(&shedder, &ticker, 90, Duration::from_millis(1));
            assert_eq!(
                shedder.admit().level(),
                CacheOnly,
                "{:?}",
                shedder.snapshot()
            );
        }
        // Back within the hysteresis of the 240 rps served before (61 an interval and the
        // admission that reads the level: 248 rps, under 240 × 1.05): once the last second's
        // mean is there, it walks down, with no margin below the served rate.
        assert_eq!(
            levels_over(&shedder, &ticker, 61, 20),
            [CacheOnly, ShortTimeouts, DropExtras, Normal]
        );
    }

    /// What the hold compares is what arrives, not what completes: requests piling up at level 3
    /// (cache-only answers waiting on a slow L2) complete little but are offered load.
    #[test]
    fn the_hold_counts_admissions_not_completions() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            max_in_flight: 1_000,
            min_in_flight: 1,
            adaptive: false,
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        for _ in 0..8 {
            spare_interval(&shedder, &ticker, 60);
        }
        // A queue that stands for two intervals.
        for _ in 0..2 {
            drop(shedder.admit());
            shedder.record_queue_delay(Duration::from_millis(20));
            shedder.record_worker_busy(INTERVAL, INTERVAL);
            interval_of_traffic(&shedder, &ticker, 100, Duration::from_millis(1));
        }
        drop(shedder.admit());
        let saturated = shedder.snapshot();
        assert_eq!(saturated.level, CacheOnly);
        assert_eq!(saturated.saturated_rps, Some(404.0));
        let mut piled = Vec::new();
        for _ in 0..8 {
            // 110 arrive an interval, 30 of them stay in flight: 320 rps complete, below the
            // 404 learned, while 440 rps are offered.
            shedder.record_queue_delay(Duration::ZERO);
            shedder.record_worker_busy(INTERVAL / 5, INTERVAL);
            piled.extend((0..30).map(|_| shedder.admit()));
            interval_of_traffic(&shedder, &ticker, 79, Duration::from_millis(1));
            assert_eq!(shedder.admit().level(), CacheOnly);
        }
        let held = shedder.snapshot();
        assert_eq!(
            (held.throughput_rps, held.mean_offered_rps),
            (320.0, 440.0),
            "{held:?}"
        );
        assert!(held.standing_in_flight < 0.3 * 1_000.0, "{held:?}");
    }

    #[test]
    fn level_three_is_left_only_after_a_second_of_low_load() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            max_in_flight: 10,
            min_in_flight: 1,
            adaptive: false,
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        let evaluate = || {
            ticker.advance(INTERVAL);
            drop(shedder.admit());
            shedder.level()
        };
        // 12 in flight against 10 at every evaluation, for longer than the dwell; the workers
        // idle, so no saturated rate and no hold.
        let stuck: Vec<_> = (0..12).map(|_| shedder.admit()).collect();
        for _ in 0..6 {
            evaluate();
        }
        assert_eq!(shedder.level(), CacheOnly);
        assert_eq!(shedder.snapshot().saturated_rps, None);
        drop(stuck);
        // One low interval, then one high again: still level 3, and the second starts anew.
        assert_eq!(evaluate(), CacheOnly, "{:?}", shedder.snapshot());
        let stuck: Vec<_> = (0..12).map(|_| shedder.admit()).collect();
        evaluate();
        assert_eq!(evaluate(), CacheOnly, "{:?}", shedder.snapshot());
        drop(stuck);
        let levels: Vec<_> = (0..6).map(|_| evaluate()).collect();
        assert_eq!(
            levels,
            [
                CacheOnly,
                CacheOnly,
                CacheOnly,
                ShortTimeouts,
                ShortTimeouts,
                ShortTimeouts
            ],
            "a second after the last high interval, then one level per dwell"
        );
    }

    #[test]
    fn requests_piled_on_a_slow_dependency_teach_no_saturated_rate() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            max_in_flight: 10,
            min_in_flight: 1,
            adaptive: false,
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        let stuck: Vec<_> = (0..12).map(|_| shedder.admit()).collect();
        ticker.advance(INTERVAL);
        drop(shedder.admit());
        assert_eq!(
            shedder.level(),
            Normal,
            "one evaluation's count is not standing"
        );
        ticker.advance(INTERVAL);
        drop(shedder.admit());
        let snapshot = shedder.snapshot();
        assert_eq!(snapshot.level, CacheOnly, "12 in flight against 10, twice");
        assert_eq!(snapshot.saturated_rps, None);
        // Once they finish, nothing holds level 3 beyond the dwell.
        drop(stuck);
        let mut walked = vec![shedder.level()];
        for _ in 0..5 {
            ticker.advance(ShedConfig::default().min_dwell);
            walked.push(shedder.admit().level());
        }
        assert_eq!(
            walked,
            [CacheOnly, ShortTimeouts, DropExtras, Normal, Normal, Normal]
        );
    }

    #[test]
    fn the_hold_is_bounded_and_a_step_down_relearns_the_rate() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        for _ in 0..2 {
            shedder.record_queue_delay(Duration::from_millis(20));
            interval_of_traffic(&shedder, &ticker, 100, Duration::from_millis(1));
        }
        drop(shedder.admit());
        assert_eq!(shedder.level(), CacheOnly);
        // The rate stays above what saturated it (by more than the hysteresis), but nothing
        // queues. The instance never served such a rate calmly (a cold start): after the short
        // hold, one step down tries full work again.
        let mut intervals = 0;
        while shedder.level() == CacheOnly {
            interval_of_traffic(&shedder, &ticker, 110, Duration::from_millis(1));
            shedder.record_queue_delay(Duration::ZERO);
            drop(shedder.admit());
            intervals += 1;
            assert!(intervals < 400, "never stepped down");
        }
        let held = INTERVAL * intervals;
        let max_hold = ShedConfig::default().min_dwell * SHORT_HOLD_DWELLS;
        assert!(
            held >= max_hold && held <= max_hold + 2 * INTERVAL,
            "{held:?}"
        );
        // Full work saturates again, at a higher rate: back to 3, the rate relearned.
        for _ in 0..2 {
            shedder.record_queue_delay(Duration::from_millis(20));
            interval_of_traffic(&shedder, &ticker, 120, Duration::from_millis(1));
        }
        drop(shedder.admit());
        assert_eq!(shedder.level(), CacheOnly);
        assert_eq!(
            shedder.snapshot().saturated_rps,
            Some(440.0),
            "halfway from 400 to 480 (120 completions in the interval the queue stood for two)"
        );
    }

    #[test]
    fn a_forced_level_applies_at_once_and_none_returns_to_measured() {
        let (shedder, ticker) = manual_shedder(ShedConfig::default());
        shedder.force(Some(CacheOnly));
        assert_eq!(shedder.admit().level(), CacheOnly);
        assert_eq!(
            shedder.observe_load(0.9),
            CacheOnly,
            "forced wins over measured"
        );
        let snapshot = shedder.snapshot();
        assert_eq!(
            (snapshot.level, snapshot.forced),
            (CacheOnly, Some(CacheOnly))
        );

        shedder.force(None);
        assert_eq!(
            shedder.level(),
            ShortTimeouts,
            "the measured level kept being tracked"
        );
        ticker.advance(DWELL);
        assert_eq!(shedder.observe_load(0.0), DropExtras);
        assert_eq!(shedder.snapshot().forced, None);
    }

    #[test]
    fn the_snapshot_agrees_with_the_shedder() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            capacity_rps: 500,
            adaptive: false,
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        interval_of_traffic(&shedder, &ticker, 100, Duration::from_millis(20));
        let held = shedder.admit();
        ticker.advance(Duration::from_millis(300));
        let snapshot = shedder.snapshot();
        assert_eq!(
            snapshot,
            ShedSnapshot {
                level: DropExtras,
                forced: None,
                load: 0.8,
                in_flight: 1,
                // 100 requests of 20 ms each in a 250 ms interval: a mean of 8 (Little's law),
                // but not in the interval before, so nothing is standing yet.
                standing_in_flight: 0.0,
                concurrency_limit: 512,
                throughput_rps: 400.0,
                offered_rps: 400.0,
                mean_offered_rps: 400.0,
                latency_ms: 20.0,
                baseline_latency_ms: 20.0,
                level_since_ms: 300,
                thresholds: [0.70, 0.85, 1.00],
                queue_delay_ms: 0.0,
                interval_queue_delay_ms: 0.0,
                queue_delay_target_ms: 5.0,
                saturated_rps: None,
                worker_busy: None,
                served_rps: None,
                min_in_flight: 16,
                max_in_flight: 512,
                capacity_rps: Some(500),
            }
        );
        assert_eq!(held.level(), snapshot.level);
        assert_eq!(shedder.level(), snapshot.level);
    }

    #[test]
    fn a_reconfiguration_keeps_the_level_and_applies_new_thresholds_hysteresis_and_dwell() {
        let (shedder, ticker) = manual_shedder(ShedConfig::default());
        assert_eq!(shedder.observe_load(0.8), DropExtras);
        shedder.force(Some(ShortTimeouts));
        ticker.advance(Duration::from_millis(500));
        let stricter = ShedConfig {
            thresholds: [0.9, 0.95, 1.0],
            hysteresis: 0.02,
            min_dwell: Duration::from_secs(3),
            ..ShedConfig::default()
        };
        assert!(shedder.reconfigure(&stricter).is_empty());
        assert_eq!(shedder.config(), stricter);
        let snapshot = shedder.snapshot();
        assert_eq!(
            (snapshot.level, snapshot.forced, snapshot.level_since_ms),
            (ShortTimeouts, Some(ShortTimeouts), 500),
            "the forced and the measured level are kept"
        );
        assert_eq!(snapshot.thresholds, [0.9, 0.95, 1.0]);
        shedder.force(None);
        assert_eq!(shedder.level(), DropExtras);

        // 2 s at level 1: the old 1 s dwell is met, the new 3 s one is not.
        ticker.advance(Duration::from_millis(1_500));
        assert_eq!(shedder.observe_load(0.87), DropExtras, "the new dwell");
        ticker.advance(Duration::from_secs(1));
        assert_eq!(
            shedder.observe_load(0.87),
            Normal,
            "below 0.9 − 0.02, where the old thresholds made 0.87 level 2"
        );
        assert_eq!(shedder.observe_load(0.92), DropExtras);
    }

    #[test]
    fn a_new_cap_or_queue_target_judges_the_next_interval_and_the_measurements_are_kept() {
        // Two intervals of 50 requests (200 rps) whose probe waited 4 ms: a standing queue at
        // 0.8 of the 5 ms target, level 1 without a change.
        let next_level = |change: Option<ShedConfig>| {
            let config = ShedConfig {
                interval: INTERVAL,
                ..ShedConfig::default()
            };
            let (shedder, ticker) = manual_shedder(config);
            for _ in 0..50 {
                drop(shedder.admit());
            }
            shedder.record_queue_delay(Duration::from_millis(4));
            ticker.advance(INTERVAL);
            drop(shedder.admit());
            let before = shedder.snapshot();
            assert_eq!((before.level, before.throughput_rps), (Normal, 200.0));
            if let Some(change) = change {
                assert!(shedder.reconfigure(&change).is_empty());
                let after = shedder.snapshot();
                let live = ShedSnapshot {
                    capacity_rps: after.capacity_rps,
                    queue_delay_target_ms: after.queue_delay_target_ms,
                    ..before
                };
                assert_eq!(after, live, "only the rules changed");
            }
            for _ in 0..49 {
                drop(shedder.admit());
            }
            shedder.record_queue_delay(Duration::from_millis(4));
            ticker.advance(INTERVAL);
            shedder.admit().level()
        };
        let with = |capacity_rps, target_ms| ShedConfig {
            capacity_rps,
            queue_delay_target: Duration::from_millis(target_ms),
            interval: INTERVAL,
            ..ShedConfig::default()
        };
        assert_eq!(next_level(None), DropExtras);
        assert_eq!(
            next_level(Some(with(100, 5))),
            CacheOnly,
            "200 rps at a cap of 100"
        );
        assert_eq!(
            next_level(Some(with(0, 2))),
            CacheOnly,
            "4 ms at a 2 ms target"
        );
        assert_eq!(
            next_level(Some(with(0, 20))),
            Normal,
            "4 ms at a 20 ms target"
        );
    }

    #[test]
    fn new_in_flight_bounds_clamp_the_learned_limit_and_keep_the_requests_in_flight() {
        let (shedder, _ticker) = manual_shedder(ShedConfig::default());
        let bounds = |min_in_flight, max_in_flight| ShedConfig {
            min_in_flight,
            max_in_flight,
            ..ShedConfig::default()
        };
        let held: Vec<_> = (0..8).map(|_| shedder.admit()).collect();
        assert!(shedder.reconfigure(&bounds(4, 6)).is_empty());
        let snapshot = shedder.snapshot();
        assert_eq!((snapshot.concurrency_limit, snapshot.in_flight), (6, 8));
        assert_eq!((snapshot.min_in_flight, snapshot.max_in_flight), (4, 6));
        assert!(!shedder.has_room(), "8 in flight over a limit of 6");
        drop(held);
        assert!(shedder.has_room());
        assert_eq!(shedder.snapshot().in_flight, 0);
        assert!(shedder.reconfigure(&bounds(100, 300)).is_empty());
        assert_eq!(
            shedder.snapshot().concurrency_limit,
            100,
            "the learned 6, raised to the floor rather than reset"
        );
    }

    #[test]
    fn interval_probe_and_adaptive_are_restart_only() {
        let built = ShedConfig {
            adaptive: false,
            max_in_flight: 10,
            min_in_flight: 1,
            ..ShedConfig::default()
        };
        let (shedder, _ticker) = manual_shedder(built.clone());
        let asked = ShedConfig {
            interval: Duration::from_secs(1),
            queue_probe_every: Duration::from_millis(50),
            adaptive: true,
            max_in_flight: 20,
            ..built.clone()
        };
        let kept = shedder.reconfigure(&asked);
        assert_eq!(kept.fields, ["interval", "queue_probe_every", "adaptive"]);
        assert_eq!(
            shedder.config(),
            ShedConfig {
                max_in_flight: 20,
                ..built
            }
        );
        assert_eq!(
            shedder.snapshot().concurrency_limit,
            20,
            "not adaptive: at the new ceiling"
        );
    }

    #[test]
    fn config_validation_names_the_field() {
        let valid = ShedConfig::default();
        assert_eq!(valid.validate(), Ok(()));
        let cases = [
            (
                ShedConfig {
                    max_in_flight: 0,
                    ..valid.clone()
                },
                "max_in_flight must be at least 1, got 0",
            ),
            (
                ShedConfig {
                    min_in_flight: 600,
                    ..valid.clone()
                },
                "min_in_flight must be in [1, max_in_flight = 512], got 600",
            ),
            (
                ShedConfig {
                    thresholds: [0.7, f64::NAN, 1.0],
                    ..valid.clone()
                },
                "thresholds must be finite and > 0, got [0.7, NaN, 1.0]",
            ),
            (
                ShedConfig {
                    thresholds: [0.7, 0.7, 1.0],
                    ..valid.clone()
                },
                "thresholds must be strictly increasing, got [0.7, 0.7, 1.0]",
            ),
            (
                ShedConfig {
                    hysteresis: 0.7,
                    ..valid.clone()
                },
                "hysteresis must be in [0, thresholds[0] = 0.7), got 0.7",
            ),
            (
                ShedConfig {
                    interval: Duration::ZERO,
                    ..valid.clone()
                },
                "interval must be at least 1ms (every admission would re-evaluate), got 0ns",
            ),
            (
                ShedConfig {
                    queue_delay_target: Duration::from_secs(2),
                    ..valid.clone()
                },
                "queue_delay_target must be within 1ms..=1s, got 2s",
            ),
            (
                ShedConfig {
                    queue_probe_every: Duration::ZERO,
                    ..valid.clone()
                },
                "queue_probe_every must be within 1ms..=1s, got 0ns",
            ),
        ];
        for (config, message) in cases {
            assert_eq!(config.validate(), Err(message.to_owned()));
        }
    }

    #[test]
    fn room_is_in_flight_below_the_concurrency_limit() {
        let (shedder, _) = manual_shedder(ShedConfig {
            max_in_flight: 2,
            min_in_flight: 1,
            adaptive: false,
            ..ShedConfig::default()
        });
        assert!(shedder.has_room());
        let first = shedder.admit();
        assert!(shedder.has_room());
        let second = shedder.admit();
        assert!(!shedder.has_room(), "two in flight at a limit of two");
        drop(first);
        assert!(shedder.has_room(), "a completion frees the room");
        drop(second);
    }

    #[test]
    fn the_evaluated_level_falls_without_admitting_anything() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            capacity_rps: 100,
            interval: INTERVAL,
            ..ShedConfig::default()
        });
        for _ in 0..50 {
            drop(shedder.admit());
        }
        ticker.advance(INTERVAL);
        assert_eq!(
            shedder.evaluated_level(),
            CacheOnly,
            "200 rps at a cap of 100"
        );
        assert_eq!(shedder.snapshot().in_flight, 0, "nothing admitted");
        let mut walked = vec![CacheOnly];
        for _ in 0..3 {
            ticker.advance(DWELL);
            walked.push(shedder.evaluated_level());
        }
        assert_eq!(walked, [CacheOnly, ShortTimeouts, DropExtras, Normal]);
    }

    #[test]
    fn concurrent_admissions_balance_out() {
        let (shedder, ticker) = manual_shedder(ShedConfig {
            interval: Duration::from_millis(1),
            ..ShedConfig::default()
        });
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for round in 0..100_000 {
                        let admission = shedder.admit();
                        if round % 1000 == 0 {
                            // Evaluations race with admissions on the other thread.
                            ticker.advance(Duration::from_millis(1));
                        }
                        drop(admission);
                    }
                });
            }
        });
        assert_eq!(shedder.snapshot().in_flight, 0);
        assert!(shedder.snapshot().concurrency_limit >= 16);
    }
}

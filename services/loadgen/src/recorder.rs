//! Where completed logical requests are counted: a total, one set per 1-second window (by
//! *scheduled* time, for the charts), one per named phase, one per request class.
//!
//! Latencies go into HDR histograms in microseconds with 3 significant digits: the *logical*
//! latency (due time to final answer, retries and their waits included) and, separately, the
//! latency of every *admitted attempt* (see [`AttemptRecord::admitted`]), timed from when that
//! attempt was due. Attempts count in the slice of their logical request (its scheduled time).
//! The lock is held only for a few counter bumps and histogram records, never across an
//! `.await`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::{AttemptRecord, QueueOutcome, Refusal, RequestClass, TransportError};

/// Largest latency the histograms hold (longer ones are recorded as this): 2 minutes.
const MAX_LATENCY_MICROS: u64 = 120_000_000;

/// How a logical request ended, as far as the counts care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Final {
    Response {
        status: u16,
        business_ok: bool,
        shed_level: Option<u8>,
    },
    Transport(TransportError),
    /// Not sent: the in-flight bound was reached.
    ClientOverflow,
}

fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_max(MAX_LATENCY_MICROS, 3)
        .expect("3 significant digits up to 2 minutes is a valid histogram")
}

fn micros(latency: Duration) -> u64 {
    u64::try_from(latency.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl Final {
    /// The same outcome, its `x-shed-level` left out.
    fn without_shed_level(self) -> Self {
        match self {
            Self::Response {
                status,
                business_ok,
                ..
            } => Self::Response {
                status,
                business_ok,
                shed_level: None,
            },
            other => other,
        }
    }
}

/// Counters and latency histograms for one slice of a run.
#[derive(Debug, Clone)]
pub struct Stats {
    latency: Histogram<u64>,
    /// Attempts the service did the work for, each from its own due time.
    admitted: Histogram<u64>,
    /// HTTP attempts of the recorded logical requests.
    attempts: u64,
    received_503: u64,
    /// The 503s by the error code of their bodies.
    received_503_by_code: BTreeMap<&'static str, u64>,
    received_429: u64,
    /// Attempts answered 5xx other than 503 (503 is the service's deliberate refusal).
    server_errors_non_503: u64,
    logical: u64,
    ok_2xx: u64,
    business_ok: u64,
    items: u64,
    by_status: BTreeMap<u16, u64>,
    timeouts: u64,
    connect_errors: u64,
    other_errors: u64,
    client_overflow: u64,
    max_shed_level: Option<u8>,
    /// Attempts that queued for admission (the service's `Server-Timing`), by how that ended.
    queue: QueueCounts,
    /// The waits of queued attempts that were admitted or timed out (a full queue has none).
    queue_wait: Histogram<u64>,
    /// 503 attempts that carried `Retry-After`.
    received_503_with_retry_after: u64,
    /// Logical requests answered 2xx by an attempt that had queued for admission.
    ok_after_wait: u64,
}

/// Queued attempts by [`QueueOutcome`].
#[derive(Debug, Clone, Copy, Default)]
struct QueueCounts {
    admitted: u64,
    timed_out: u64,
    full: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            latency: latency_histogram(),
            admitted: latency_histogram(),
            attempts: 0,
            received_503: 0,
            received_503_by_code: BTreeMap::new(),
            received_429: 0,
            server_errors_non_503: 0,
            logical: 0,
            ok_2xx: 0,
            business_ok: 0,
            items: 0,
            by_status: BTreeMap::new(),
            timeouts: 0,
            connect_errors: 0,
            other_errors: 0,
            client_overflow: 0,
            max_shed_level: None,
            queue: QueueCounts::default(),
            queue_wait: latency_histogram(),
            received_503_with_retry_after: 0,
            ok_after_wait: 0,
        }
    }
}

impl Stats {
    fn record(
        &mut self,
        latency: Duration,
        outcome: Final,
        items: u32,
        attempts: &[AttemptRecord],
    ) {
        self.logical += 1;
        self.items += u64::from(items);
        self.attempts += attempts.len() as u64;
        for attempt in attempts {
            match attempt.status {
                Ok(503) => {
                    self.received_503 += 1;
                    if attempt.retry_after {
                        self.received_503_with_retry_after += 1;
                    }
                    let code = attempt.refusal.unwrap_or(Refusal::Other).as_str();
                    *self.received_503_by_code.entry(code).or_default() += 1;
                }
                Ok(429) => self.received_429 += 1,
                Ok(500..=599) => self.server_errors_non_503 += 1,
                _ => {}
            }
            if attempt.admitted() {
                self.admitted.saturating_record(micros(attempt.latency));
            }
            if let Some(queued) = attempt.queued {
                match queued.outcome {
                    QueueOutcome::Admitted => self.queue.admitted += 1,
                    QueueOutcome::TimedOut => self.queue.timed_out += 1,
                    QueueOutcome::Full => self.queue.full += 1,
                }
                if queued.outcome != QueueOutcome::Full {
                    self.queue_wait.saturating_record(micros(queued.wait));
                }
            }
        }
        match outcome {
            Final::Response {
                status,
                business_ok,
                shed_level,
            } => {
                *self.by_status.entry(status).or_default() += 1;
                if (200..300).contains(&status) {
                    self.ok_2xx += 1;
                    let last = attempts.last().and_then(|attempt| attempt.queued);
                    if last.is_some_and(|queued| queued.outcome == QueueOutcome::Admitted) {
                        self.ok_after_wait += 1;
                    }
                }
                if business_ok {
                    self.business_ok += 1;
                }
                self.max_shed_level = self.max_shed_level.max(shed_level);
            }
            Final::Transport(TransportError::Timeout) => self.timeouts += 1,
            Final::Transport(TransportError::Connect) => self.connect_errors += 1,
            Final::Transport(TransportError::Other) => self.other_errors += 1,
            Final::Transport(TransportError::Overflow) | Final::ClientOverflow => {
                self.client_overflow += 1;
                return;
            }
        }
        self.latency.saturating_record(micros(latency));
    }

    /// Adds `other`'s requests, as if each had been recorded here too. Every field is named,
    /// so a new one cannot be left out.
    fn merge(&mut self, other: &Stats) {
        let Stats {
            latency,
            admitted,
            attempts,
            received_503,
            received_503_by_code,
            received_429,
            server_errors_non_503,
            logical,
            ok_2xx,
            business_ok,
            items,
            by_status,
            timeouts,
            connect_errors,
            other_errors,
            client_overflow,
            max_shed_level,
            queue,
            queue_wait,
            received_503_with_retry_after,
            ok_after_wait,
        } = other;
        // Every histogram has the bounds of `latency_histogram()` and saturates at its top.
        for (mine, theirs) in [
            (&mut self.latency, latency),
            (&mut self.admitted, admitted),
            (&mut self.queue_wait, queue_wait),
        ] {
            mine.add(theirs).expect("histograms of the same bounds");
        }
        for (code, count) in received_503_by_code {
            *self.received_503_by_code.entry(code).or_default() += count;
        }
        for (status, count) in by_status {
            *self.by_status.entry(*status).or_default() += count;
        }
        self.attempts += attempts;
        self.received_503 += received_503;
        self.received_429 += received_429;
        self.server_errors_non_503 += server_errors_non_503;
        self.logical += logical;
        self.ok_2xx += ok_2xx;
        self.business_ok += business_ok;
        self.items += items;
        self.timeouts += timeouts;
        self.connect_errors += connect_errors;
        self.other_errors += other_errors;
        self.client_overflow += client_overflow;
        self.max_shed_level = self.max_shed_level.max(*max_shed_level);
        self.queue.admitted += queue.admitted;
        self.queue.timed_out += queue.timed_out;
        self.queue.full += queue.full;
        self.received_503_with_retry_after += received_503_with_retry_after;
        self.ok_after_wait += ok_after_wait;
    }

    /// The merge of `slices`.
    fn merged<'a>(slices: impl IntoIterator<Item = &'a Stats>) -> Stats {
        let mut stats = Stats::default();
        for slice in slices {
            stats.merge(slice);
        }
        stats
    }

    pub fn logical(&self) -> u64 {
        self.logical
    }

    pub fn ok_2xx(&self) -> u64 {
        self.ok_2xx
    }

    /// Latency at `quantile` (0–1) in milliseconds; `None` without any completed request.
    pub fn quantile_ms(&self, quantile: f64) -> Option<f64> {
        quantile_of(&self.latency, quantile)
    }

    /// Admitted-attempt latency at `quantile` (0–1) in milliseconds; `None` without any.
    pub fn admitted_quantile_ms(&self, quantile: f64) -> Option<f64> {
        quantile_of(&self.admitted, quantile)
    }

    pub fn summary(&self) -> StatsSummary {
        let rate = |count: u64| {
            if self.logical == 0 {
                None
            } else {
                Some(count as f64 / self.logical as f64)
            }
        };
        StatsSummary {
            logical_requests: self.logical,
            items: self.items,
            ok_2xx: self.ok_2xx,
            business_ok: self.business_ok,
            http_success_rate: rate(self.ok_2xx),
            business_success_rate: rate(self.business_ok),
            p50_ms: self.quantile_ms(0.5),
            p90_ms: self.quantile_ms(0.9),
            p99_ms: self.quantile_ms(0.99),
            p999_ms: self.quantile_ms(0.999),
            max_ms: (!self.latency.is_empty()).then(|| self.latency.max() as f64 / 1000.0),
            attempts: self.attempts,
            admitted_attempts: self.admitted.len(),
            admitted_p50_ms: self.admitted_quantile_ms(0.5),
            admitted_p99_ms: self.admitted_quantile_ms(0.99),
            admitted_max_ms: (!self.admitted.is_empty())
                .then(|| self.admitted.max() as f64 / 1000.0),
            received_503: self.received_503,
            received_503_by_code: self
                .received_503_by_code
                .iter()
                .map(|(code, count)| ((*code).to_owned(), *count))
                .collect(),
            received_429: self.received_429,
            server_errors_non_503: self.server_errors_non_503,
            by_status: self
                .by_status
                .iter()
                .map(|(status, count)| (status.to_string(), *count))
                .collect(),
            timeouts: self.timeouts,
            connect_errors: self.connect_errors,
            other_errors: self.other_errors,
            client_overflow: self.client_overflow,
            max_shed_level_seen: self.max_shed_level,
            received_503_with_retry_after: self.received_503_with_retry_after,
            ok_after_wait: self.ok_after_wait,
            queued_admitted: self.queue.admitted,
            queued_timed_out: self.queue.timed_out,
            queued_full: self.queue.full,
            queue_wait_p50_ms: quantile_of(&self.queue_wait, 0.5),
            queue_wait_p90_ms: quantile_of(&self.queue_wait, 0.9),
            queue_wait_p99_ms: quantile_of(&self.queue_wait, 0.99),
            queue_wait_max_ms: (!self.queue_wait.is_empty())
                .then(|| self.queue_wait.max() as f64 / 1000.0),
        }
    }
}

fn quantile_of(histogram: &Histogram<u64>, quantile: f64) -> Option<f64> {
    (!histogram.is_empty()).then(|| histogram.value_at_quantile(quantile) as f64 / 1000.0)
}

/// The figures of one slice, as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsSummary {
    pub logical_requests: u64,
    /// Items asked for (a batch counts its keys).
    pub items: u64,
    pub ok_2xx: u64,
    pub business_ok: u64,
    /// 2xx ÷ logical requests (client overflow and transport failures count as failures).
    pub http_success_rate: Option<f64>,
    /// 200 with every quote `"degraded":false` ÷ logical requests.
    pub business_success_rate: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// HTTP attempts of these logical requests (retries included).
    pub attempts: u64,
    /// Attempts the service did the work for: answered with any status but 429/503, or timed
    /// out. Each is timed from when it was due: the request's scheduled time for a first
    /// attempt, the end of the retry wait for a retry.
    pub admitted_attempts: u64,
    pub admitted_p50_ms: Option<f64>,
    pub admitted_p99_ms: Option<f64>,
    pub admitted_max_ms: Option<f64>,
    /// Attempts answered 503 (shed, or a dependency refused) and 429 (rate limited).
    pub received_503: u64,
    /// The 503s by the `code` of their error bodies (`overloaded`, `unavailable`, `timeout`).
    pub received_503_by_code: BTreeMap<String, u64>,
    pub received_429: u64,
    /// Attempts answered 5xx other than 503: errors, not deliberate refusals.
    pub server_errors_non_503: u64,
    /// Final HTTP status of logical requests, by status.
    pub by_status: BTreeMap<String, u64>,
    pub timeouts: u64,
    pub connect_errors: u64,
    pub other_errors: u64,
    pub client_overflow: u64,
    /// Highest `x-shed-level` header seen: the level a request was served at (for a refused
    /// one, the measured level), so per class it shows lists and prefetches served higher.
    pub max_shed_level_seen: Option<u8>,
    /// 503 attempts that carried `Retry-After`.
    pub received_503_with_retry_after: u64,
    /// Logical requests answered 2xx by an attempt that had queued for admission: they
    /// succeeded after waiting.
    pub ok_after_wait: u64,
    /// Attempts that queued for admission (the service's `Server-Timing: admission`), by how
    /// the wait ended: admitted, timed out (503), or refused at once by a full queue (503).
    pub queued_admitted: u64,
    pub queued_timed_out: u64,
    pub queued_full: u64,
    /// Waits of the queued attempts that were admitted or timed out, as the service timed them.
    pub queue_wait_p50_ms: Option<f64>,
    pub queue_wait_p90_ms: Option<f64>,
    pub queue_wait_p99_ms: Option<f64>,
    pub queue_wait_max_ms: Option<f64>,
}

/// A named part of a run, from `start` (offset into the run) to the next phase's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    pub name: String,
    pub start: Duration,
}

/// What a request is recorded in: its window, and its phase's slice for its class. The
/// phases, the classes and the whole run are merged from the slices when a snapshot is taken,
/// so that each request costs two records, not five.
#[derive(Debug)]
struct Inner {
    windows: Vec<Stats>,
    /// Per phase (one slice for the whole run when there are no phases), by
    /// [`RequestClass::index`].
    phase_classes: Vec<[Stats; RequestClass::ALL.len()]>,
}

/// Collects completions from every request task of one run.
#[derive(Debug)]
pub struct Recorder {
    window: Duration,
    phases: Vec<Phase>,
    inner: Mutex<Inner>,
}

impl Recorder {
    /// `phases` sorted by start; the first should start at 0 (earlier completions fall into it
    /// anyway).
    pub fn new(window: Duration, phases: Vec<Phase>) -> Self {
        debug_assert!(!window.is_zero());
        debug_assert!(phases.windows(2).all(|pair| pair[0].start <= pair[1].start));
        let phase_classes = (0..phases.len().max(1))
            .map(|_| Default::default())
            .collect();
        Self {
            window,
            phases,
            inner: Mutex::new(Inner {
                windows: Vec::new(),
                phase_classes,
            }),
        }
    }

    /// One finished (or overflowed) logical request scheduled at `offset` into the run, with
    /// its HTTP attempts (none for an overflow).
    pub fn record(
        &self,
        offset: Duration,
        latency: Duration,
        outcome: Final,
        class: RequestClass,
        items: u32,
        attempts: &[AttemptRecord],
    ) {
        let window_index = (offset.as_nanos() / self.window.as_nanos()) as usize;
        let phase_index = self
            .phases
            .iter()
            .rposition(|phase| phase.start <= offset)
            .unwrap_or(0);
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if inner.windows.len() <= window_index {
            inner.windows.resize_with(window_index + 1, Stats::default);
        }
        // A window's shed level charts the level the service measured, and only a page is
        // served at it: a list or prefetch header says a higher one (or a refusal).
        let window_outcome = match class {
            RequestClass::Page => outcome,
            RequestClass::List | RequestClass::Prefetch => outcome.without_shed_level(),
        };
        inner.windows[window_index].record(latency, window_outcome, items, attempts);
        inner.phase_classes[phase_index][class.index()].record(latency, outcome, items, attempts);
    }

    /// Everything recorded so far.
    pub fn snapshot(&self) -> Recorded {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let slices = &inner.phase_classes;
        Recorded {
            window: self.window,
            total: Stats::merged(slices.iter().flatten()),
            windows: inner.windows.clone(),
            phases: self
                .phases
                .iter()
                .cloned()
                .zip(slices.iter().map(Stats::merged))
                .collect(),
            classes: RequestClass::ALL
                .map(|class| Stats::merged(slices.iter().map(|classes| &classes[class.index()]))),
            phase_classes: slices.clone(),
        }
    }
}

/// A copy of a recorder's contents.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub window: Duration,
    pub total: Stats,
    pub windows: Vec<Stats>,
    pub phases: Vec<(Phase, Stats)>,
    /// By [`RequestClass::index`]; see [`Recorded::class`].
    pub classes: [Stats; RequestClass::ALL.len()],
    /// Each phase's requests by class (aligned with `phases`); see [`Recorded::phase_class`].
    pub phase_classes: Vec<[Stats; RequestClass::ALL.len()]>,
}

impl Recorded {
    /// The requests of one class.
    pub fn class(&self, class: RequestClass) -> &Stats {
        &self.classes[class.index()]
    }

    /// The requests of one class in phase number `phase`.
    pub fn phase_class(&self, phase: usize, class: RequestClass) -> Option<&Stats> {
        Some(&self.phase_classes.get(phase)?[class.index()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(status: Result<u16, TransportError>, latency_ms: u64) -> AttemptRecord {
        AttemptRecord {
            status,
            latency: Duration::from_millis(latency_ms),
            refusal: None,
            retry_after: false,
            queued: None,
        }
    }

    fn ok(business_ok: bool) -> Final {
        Final::Response {
            status: 200,
            business_ok,
            shed_level: None,
        }
    }

    #[test]
    fn counts_land_in_total_window_phase_and_class() {
        let recorder = Recorder::new(
            Duration::from_secs(1),
            vec![
                Phase {
                    name: "before".into(),
                    start: Duration::ZERO,
                },
                Phase {
                    name: "fault".into(),
                    start: Duration::from_millis(1500),
                },
            ],
        );
        let ms = Duration::from_millis;
        recorder.record(
            ms(100),
            ms(2),
            ok(true),
            RequestClass::Page,
            1,
            &[attempt(Ok(200), 2)],
        );
        recorder.record(
            ms(1200),
            ms(4),
            ok(false),
            RequestClass::Page,
            1,
            &[attempt(Ok(200), 4)],
        );
        recorder.record(
            ms(1600),
            ms(900),
            Final::Transport(TransportError::Timeout),
            RequestClass::List,
            10,
            &[attempt(Err(TransportError::Timeout), 900)],
        );
        recorder.record(
            ms(2100),
            Duration::ZERO,
            Final::ClientOverflow,
            RequestClass::Page,
            1,
            &[],
        );
        recorder.record(
            ms(2200),
            ms(8),
            Final::Response {
                status: 503,
                business_ok: false,
                shed_level: Some(3),
            },
            RequestClass::Page,
            1,
            &[attempt(Ok(503), 8)],
        );
        let recorded = recorder.snapshot();
        let total = recorded.total.summary();
        assert_eq!(total.logical_requests, 5);
        assert_eq!(total.ok_2xx, 2);
        assert_eq!(total.business_ok, 1);
        assert_eq!(total.http_success_rate, Some(0.4));
        assert_eq!(total.business_success_rate, Some(0.2));
        assert_eq!(total.client_overflow, 1);
        assert_eq!(total.timeouts, 1);
        assert_eq!(total.by_status.get("503"), Some(&1));
        assert_eq!(total.max_shed_level_seen, Some(3));
        assert_eq!(total.items, 14);
        assert_eq!(total.attempts, 4);
        assert_eq!(total.received_503, 1);
        assert_eq!(total.server_errors_non_503, 0);
        assert_eq!(
            total.admitted_attempts, 3,
            "the 503 is not admitted; the timeout is"
        );
        let admitted_max = total.admitted_max_ms.unwrap();
        assert!((899.0..=901.0).contains(&admitted_max), "{admitted_max}");

        assert_eq!(recorded.windows.len(), 3);
        assert_eq!(
            recorded
                .windows
                .iter()
                .map(Stats::logical)
                .collect::<Vec<_>>(),
            [1, 2, 2]
        );
        assert_eq!(recorded.phases[0].1.logical(), 2);
        assert_eq!(recorded.phases[1].1.logical(), 3);
        assert_eq!(recorded.class(RequestClass::List).logical(), 1);
        // Overflow has no latency: three of the four others are ≤ 8 ms.
        let p50 = recorded.total.quantile_ms(0.5).unwrap();
        assert!((3.9..=4.1).contains(&p50), "{p50}");
        let max = total.max_ms.unwrap();
        assert!((899.0..=901.0).contains(&max), "{max}");
    }

    #[test]
    fn admitted_attempts_are_timed_apart_from_the_logical_latency() {
        let recorder = Recorder::new(
            Duration::from_secs(1),
            vec![
                Phase {
                    name: "shedding".into(),
                    start: Duration::ZERO,
                },
                Phase {
                    name: "released".into(),
                    start: Duration::from_secs(1),
                },
            ],
        );
        let ms = Duration::from_millis;
        // Shed (503, Retry-After 2 s), then a 502, then a 200: the logical latency holds both
        // waits; the admitted attempts are the 502 and the 200, each timed from its own due time.
        recorder.record(
            ms(300),
            ms(3_010),
            ok(true),
            RequestClass::Page,
            1,
            &[
                attempt(Ok(503), 1),
                attempt(Ok(502), 6),
                attempt(Ok(200), 3),
            ],
        );
        recorder.record(
            ms(1_300),
            ms(2),
            ok(true),
            RequestClass::Page,
            1,
            &[attempt(Ok(200), 2)],
        );
        let recorded = recorder.snapshot();
        let total = recorded.total.summary();
        assert_eq!(total.attempts, 4);
        assert_eq!(total.admitted_attempts, 3);
        assert_eq!(total.received_503, 1);
        assert_eq!(total.server_errors_non_503, 1);
        assert_eq!(total.by_status.get("200"), Some(&2));
        let logical_p99 = total.p99_ms.unwrap();
        assert!(logical_p99 >= 3_000.0, "{logical_p99}");
        let admitted_p99 = total.admitted_p99_ms.unwrap();
        assert!((5.9..=6.1).contains(&admitted_p99), "{admitted_p99}");
        let admitted_p50 = total.admitted_p50_ms.unwrap();
        assert!((2.9..=3.1).contains(&admitted_p50), "{admitted_p50}");
        // Attempts count where their logical request was scheduled.
        let shedding = recorded.phases[0].1.summary();
        assert_eq!((shedding.attempts, shedding.admitted_attempts), (3, 2));
        assert_eq!(shedding.server_errors_non_503, 1);
        let window = recorded.windows[1].summary();
        assert_eq!((window.attempts, window.received_503), (1, 0));
        assert_eq!(window.admitted_p99_ms, window.p99_ms);
    }

    #[test]
    fn classes_are_counted_apart_and_only_pages_set_a_windows_shed_level() {
        let recorder = Recorder::new(
            Duration::from_secs(1),
            vec![Phase {
                name: "all".into(),
                start: Duration::ZERO,
            }],
        );
        let ms = Duration::from_millis;
        let served = |status, shed_level| Final::Response {
            status,
            business_ok: status == 200,
            shed_level: Some(shed_level),
        };
        // Measured level 1: a page is served at 1, a list at 2, a prefetch at 3; a later
        // prefetch is refused at level 2.
        recorder.record(
            ms(10),
            ms(2),
            served(200, 1),
            RequestClass::Page,
            1,
            &[attempt(Ok(200), 2)],
        );
        recorder.record(
            ms(20),
            ms(9),
            served(200, 2),
            RequestClass::List,
            20,
            &[attempt(Ok(200), 9)],
        );
        recorder.record(
            ms(30),
            ms(1),
            served(200, 3),
            RequestClass::Prefetch,
            1,
            &[attempt(Ok(200), 1)],
        );
        recorder.record(
            ms(40),
            ms(1),
            served(503, 2),
            RequestClass::Prefetch,
            1,
            &[attempt(Ok(503), 1)],
        );
        let recorded = recorder.snapshot();
        let figures = |class| recorded.class(class).summary();
        let page = figures(RequestClass::Page);
        let list = figures(RequestClass::List);
        let prefetch = figures(RequestClass::Prefetch);
        assert_eq!(
            (page.logical_requests, list.logical_requests),
            (1, 1),
            "{page:?} {list:?}"
        );
        assert_eq!((list.items, prefetch.logical_requests), (20, 2));
        assert_eq!((prefetch.ok_2xx, prefetch.received_503), (1, 1));
        assert_eq!(page.received_503 + list.received_503, 0);
        assert_eq!(
            [page, list, prefetch].map(|summary| summary.max_shed_level_seen),
            [Some(1), Some(2), Some(3)]
        );
        assert_eq!(recorded.total.summary().max_shed_level_seen, Some(3));
        assert_eq!(recorded.windows[0].summary().max_shed_level_seen, Some(1));
        assert_eq!(recorded.windows[0].logical(), 4);
    }

    #[test]
    fn phases_classes_and_the_whole_run_are_the_merges_of_their_slices() {
        let phases = vec![
            Phase {
                name: "before".into(),
                start: Duration::ZERO,
            },
            Phase {
                name: "after".into(),
                start: Duration::from_secs(2),
            },
        ];
        let recorder = Recorder::new(Duration::from_secs(1), phases);
        // What each slice should hold, recorded directly: [phase][class], the whole run.
        let mut expected: [[Stats; 3]; 2] = Default::default();
        let mut whole = Stats::default();
        let queued = |outcome, wait_ms| crate::client::Queued {
            outcome,
            wait: Duration::from_millis(wait_ms),
        };
        for index in 0..60_u64 {
            let class = RequestClass::ALL[(index % 3) as usize];
            let offset = Duration::from_millis(index * 70);
            let latency = Duration::from_millis(1 + index * 13 % 400);
            let (outcome, attempts) = match index % 5 {
                0 => (Final::ClientOverflow, vec![]),
                1 => (
                    Final::Response {
                        status: 503,
                        business_ok: false,
                        shed_level: Some(3),
                    },
                    vec![AttemptRecord {
                        retry_after: true,
                        refusal: Some(Refusal::Overloaded),
                        queued: Some(queued(QueueOutcome::TimedOut, 250)),
                        ..attempt(Ok(503), 251)
                    }],
                ),
                2 => (
                    Final::Transport(TransportError::Timeout),
                    vec![attempt(Err(TransportError::Timeout), 900)],
                ),
                3 => (
                    ok(true),
                    vec![AttemptRecord {
                        queued: Some(queued(QueueOutcome::Admitted, index)),
                        ..attempt(Ok(200), index + 2)
                    }],
                ),
                _ => (ok(index % 2 == 0), vec![attempt(Ok(200), index % 40)]),
            };
            let phase = usize::from(offset >= Duration::from_secs(2));
            for stats in [&mut expected[phase][class.index()], &mut whole] {
                stats.record(latency, outcome, 1, &attempts);
            }
            recorder.record(offset, latency, outcome, class, 1, &attempts);
        }
        let recorded = recorder.snapshot();
        assert_eq!(recorded.total.summary(), whole.summary());
        assert_eq!(recorded.total.logical(), 60);
        for (phase, (_, stats)) in recorded.phases.iter().enumerate() {
            let direct = Stats::merged(&expected[phase]);
            assert_eq!(stats.summary(), direct.summary(), "phase {phase}");
        }
        for class in RequestClass::ALL {
            let direct = Stats::merged(expected.iter().map(|slice| &slice[class.index()]));
            assert_eq!(
                recorded.class(class).summary(),
                direct.summary(),
                "{class:?}"
            );
            for (phase, slices) in expected.iter().enumerate() {
                assert_eq!(
                    recorded.phase_class(phase, class).unwrap().summary(),
                    slices[class.index()].summary()
                );
            }
        }
    }

    #[test]
    fn queued_attempts_are_counted_by_outcome_and_their_waits_kept_apart() {
        let queued = |status, outcome, wait_ms, retry_after| AttemptRecord {
            retry_after,
            queued: Some(crate::client::Queued {
                outcome,
                wait: Duration::from_millis(wait_ms),
            }),
            ..attempt(Ok(status), wait_ms + 2)
        };
        let served = |status| Final::Response {
            status,
            business_ok: status == 200,
            shed_level: None,
        };
        let ms = Duration::from_millis;
        let mut stats = Stats::default();
        // Waited 40 ms and was admitted.
        let waited = [queued(200, QueueOutcome::Admitted, 40, false)];
        stats.record(ms(42), served(200), 1, &waited);
        // A full queue, then a spent 250 ms wait, then admitted after 10 ms on the third try.
        let retried = [
            queued(503, QueueOutcome::Full, 0, true),
            queued(503, QueueOutcome::TimedOut, 250, true),
            queued(200, QueueOutcome::Admitted, 10, false),
        ];
        stats.record(ms(900), served(200), 1, &retried);
        // Admitted at once (no Server-Timing), and a 503 without Retry-After.
        stats.record(ms(1), served(200), 1, &[attempt(Ok(200), 1)]);
        stats.record(ms(1), served(503), 1, &[attempt(Ok(503), 1)]);
        let summary = stats.summary();
        assert_eq!(
            (
                summary.queued_admitted,
                summary.queued_timed_out,
                summary.queued_full
            ),
            (2, 1, 1)
        );
        assert_eq!((summary.ok_2xx, summary.ok_after_wait), (3, 2));
        assert_eq!(
            (summary.received_503, summary.received_503_with_retry_after),
            (3, 2)
        );
        // Three waits (10, 40, 250 ms): the full queue's refusal is not one.
        // (Histograms keep 3 significant digits.)
        let near = |figure: Option<f64>, expected: f64| {
            figure.is_some_and(|figure| (figure - expected).abs() <= expected * 1e-3)
        };
        assert!(near(summary.queue_wait_p50_ms, 40.0), "{summary:?}");
        assert!(near(summary.queue_wait_max_ms, 250.0), "{summary:?}");
    }

    #[test]
    fn empty_stats_report_no_rates() {
        let summary = Stats::default().summary();
        assert_eq!(summary.http_success_rate, None);
        assert_eq!(summary.p99_ms, None);
        assert_eq!(summary.admitted_p99_ms, None);
        assert_eq!(summary.admitted_attempts, 0);
    }
}

//! The per-second figures a canary is judged on: requests and their latency, answers and how
//! many were complete, breaker trips and the highest shed level.
//!
//! The hot path adds one relaxed increment per request ([`RequestWindow::record`]); a task turns
//! the running totals into one slot a second ([`RequestWindow::sample`]); [`RequestWindow::figures`]
//! sums the slots of a span. Slots are kept for a bounded number of seconds.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Seconds of figures kept: an hour, twice the longest default observation window's needs.
pub const KEPT_SECONDS: usize = 3600;

/// Latency buckets: upper bounds growing by half from 0.1 ms; the last is unbounded.
pub const BUCKETS: usize = 32;

fn upper_bound_micros(bucket: usize) -> f64 {
    100.0 * 1.5f64.powi(bucket as i32)
}

fn bucket_of(elapsed: Duration) -> usize {
    let micros = elapsed.as_secs_f64() * 1e6;
    if micros <= 100.0 {
        return 0;
    }
    // ln(micros / 100) / ln(1.5), rounded up: the first bucket whose bound holds it.
    let index = ((micros / 100.0).ln() / 1.5f64.ln()).ceil() as usize;
    index.min(BUCKETS - 1)
}

/// What a span of seconds held. Figures of several instances add up ([`Figures::add`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Seconds with a slot in the span.
    pub seconds: u64,
    pub requests: u64,
    /// Items answered and judged (all but the client's mistakes), and those that were a
    /// success: every part live, or a correct `404` (the business success ratio).
    pub answered: u64,
    pub complete: u64,
    pub trips: u64,
    pub max_shed_level: u8,
    /// Request latency histogram, [`BUCKETS`] counts.
    pub latency: Vec<u64>,
}

impl Default for Figures {
    fn default() -> Self {
        Self {
            seconds: 0,
            requests: 0,
            answered: 0,
            complete: 0,
            trips: 0,
            max_shed_level: 0,
            latency: vec![0; BUCKETS],
        }
    }
}

impl Figures {
    pub fn add(&mut self, other: &Figures) {
        self.seconds = self.seconds.max(other.seconds);
        self.requests += other.requests;
        self.answered += other.answered;
        self.complete += other.complete;
        self.trips += other.trips;
        self.max_shed_level = self.max_shed_level.max(other.max_shed_level);
        for (mine, theirs) in self.latency.iter_mut().zip(&other.latency) {
            *mine += theirs;
        }
    }

    /// Complete answers ÷ answers; `None` without answers.
    pub fn success_ratio(&self) -> Option<f64> {
        (self.answered > 0).then(|| self.complete as f64 / self.answered as f64)
    }

    /// The 99th percentile in milliseconds, interpolated inside its bucket on a log scale;
    /// `None` without requests.
    pub fn p99_ms(&self) -> Option<f64> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (total as f64 * 0.99).ceil();
        let mut seen = 0.0;
        for (bucket, &count) in self.latency.iter().enumerate() {
            if count == 0 {
                continue;
            }
            if seen + count as f64 >= rank {
                let upper = upper_bound_micros(bucket);
                let lower = if bucket == 0 {
                    upper / 1.5
                } else {
                    upper_bound_micros(bucket - 1)
                };
                let share = (rank - seen) / count as f64;
                return Some(lower * (upper / lower).powf(share) / 1000.0);
            }
            seen += count as f64;
        }
        Some(upper_bound_micros(BUCKETS - 1) / 1000.0)
    }
}

/// Items answered, by outcome:
///
/// | outcome | what | in the ratios |
/// | --- | --- | --- |
/// | `complete` | every part live | a success |
/// | `not_found` | `404`: the item is unknown or delisted, a correct answer | a success |
/// | `degraded` | a part stale or template | its own ratio |
/// | `limited` | `429`: the client's limit | its own ratio |
/// | `failed` | `5xx` (shed, unavailable, timeout, internal) and failed batch lines | its own ratio |
/// | `invalid` | `400`-class: the client named the item wrongly | not counted |
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerTotals {
    pub complete: u64,
    pub degraded: u64,
    pub not_found: u64,
    pub invalid: u64,
    pub limited: u64,
    pub failed: u64,
}

impl AnswerTotals {
    /// What was answered after `earlier`.
    pub fn since(&self, earlier: &AnswerTotals) -> AnswerTotals {
        AnswerTotals {
            complete: self.complete.saturating_sub(earlier.complete),
            degraded: self.degraded.saturating_sub(earlier.degraded),
            not_found: self.not_found.saturating_sub(earlier.not_found),
            invalid: self.invalid.saturating_sub(earlier.invalid),
            limited: self.limited.saturating_sub(earlier.limited),
            failed: self.failed.saturating_sub(earlier.failed),
        }
    }

    pub fn add(&mut self, other: &AnswerTotals) {
        self.complete += other.complete;
        self.degraded += other.degraded;
        self.not_found += other.not_found;
        self.invalid += other.invalid;
        self.limited += other.limited;
        self.failed += other.failed;
    }

    /// The answers the ratios are over: all but the client's mistakes (`invalid`).
    pub fn judged(&self) -> u64 {
        self.complete + self.not_found + self.degraded + self.limited + self.failed
    }

    /// The business success ratio: complete and not-found answers ÷ [`AnswerTotals::judged`];
    /// `None` without any.
    pub fn success_ratio(&self) -> Option<f64> {
        self.share(self.complete + self.not_found)
    }

    /// `part` ÷ [`AnswerTotals::judged`]; `None` without any.
    pub fn share(&self, part: u64) -> Option<f64> {
        let judged = self.judged();
        (judged > 0).then(|| part as f64 / judged as f64)
    }
}

/// Running totals as read at one sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub answers: AnswerTotals,
    pub trips: u64,
}

#[derive(Debug, Clone)]
struct Slot {
    second: u64,
    requests: u64,
    answers: AnswerTotals,
    trips: u64,
    level: u8,
    latency: [u64; BUCKETS],
}

#[derive(Debug)]
struct Ring {
    slots: VecDeque<Slot>,
    capacity: usize,
    last: Option<(Totals, [u64; BUCKETS])>,
}

/// Requests' latency as they finish, and a slot per second of everything a verdict needs.
#[derive(Debug)]
pub struct RequestWindow {
    latency: [AtomicU64; BUCKETS],
    ring: Mutex<Ring>,
}

impl RequestWindow {
    /// Keeps the last `seconds` slots.
    pub fn new(seconds: usize) -> Self {
        Self {
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
            ring: Mutex::new(Ring {
                slots: VecDeque::with_capacity(seconds.min(4096)),
                capacity: seconds.max(1),
                last: None,
            }),
        }
    }

    /// One finished request (the hot path: one relaxed increment).
    pub fn record(&self, elapsed: Duration) {
        self.latency[bucket_of(elapsed)].fetch_add(1, Ordering::Relaxed);
    }

    /// Closes second `second` (Unix seconds) with the service's running totals and its shed
    /// level now. The first sample only sets the starting point.
    pub fn sample(&self, second: u64, totals: Totals, level: u8) {
        let latency: [u64; BUCKETS] =
            std::array::from_fn(|bucket| self.latency[bucket].load(Ordering::Relaxed));
        let mut ring = self
            .ring
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some((before, before_latency)) = ring.last {
            let delta: [u64; BUCKETS] = std::array::from_fn(|bucket| {
                latency[bucket].saturating_sub(before_latency[bucket])
            });
            let slot = Slot {
                second,
                requests: delta.iter().sum(),
                answers: totals.answers.since(&before.answers),
                trips: totals.trips.saturating_sub(before.trips),
                level,
                latency: delta,
            };
            if ring.slots.len() == ring.capacity {
                ring.slots.pop_front();
            }
            ring.slots.push_back(slot);
        }
        ring.last = Some((totals, latency));
    }

    /// The sum of the slots of seconds `from..until` (Unix seconds).
    pub fn figures(&self, from: u64, until: u64) -> Figures {
        let ring = self
            .ring
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut figures = Figures::default();
        for slot in ring
            .slots
            .iter()
            .filter(|slot| (from..until).contains(&slot.second))
        {
            figures.seconds += 1;
            figures.requests += slot.requests;
            figures.answered += slot.answers.judged();
            figures.complete += slot.answers.complete + slot.answers.not_found;
            figures.trips += slot.trips;
            figures.max_shed_level = figures.max_shed_level.max(slot.level);
            for (sum, count) in figures.latency.iter_mut().zip(slot.latency) {
                *sum += count;
            }
        }
        figures
    }

    /// The answers of the last `seconds` slots and of the second under way: `now` less the
    /// totals of the last sample (all of `now` before the first sample).
    pub fn recent_answers(&self, seconds: usize, now: &AnswerTotals) -> AnswerTotals {
        let ring = self
            .ring
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut recent = match &ring.last {
            Some((last, _)) => now.since(&last.answers),
            None => *now,
        };
        for slot in ring.slots.iter().rev().take(seconds) {
            recent.add(&slot.answers);
        }
        recent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `answered` items, `complete` of them whole and the rest degraded.
    fn totals(answered: u64, complete: u64, trips: u64) -> Totals {
        Totals {
            answers: AnswerTotals {
                complete,
                degraded: answered - complete,
                ..AnswerTotals::default()
            },
            trips,
        }
    }

    #[test]
    fn buckets_hold_their_bounds() {
        assert_eq!(bucket_of(Duration::from_micros(50)), 0);
        assert_eq!(bucket_of(Duration::from_micros(100)), 0);
        assert_eq!(bucket_of(Duration::from_micros(149)), 1);
        assert_eq!(bucket_of(Duration::from_micros(151)), 2);
        assert_eq!(bucket_of(Duration::from_secs(3600)), BUCKETS - 1);
        for micros in [120u64, 700, 4_000, 90_000, 2_000_000] {
            let bucket = bucket_of(Duration::from_micros(micros));
            assert!(
                micros as f64 <= upper_bound_micros(bucket) + 1e-6,
                "{micros}"
            );
            assert!(micros as f64 > upper_bound_micros(bucket - 1), "{micros}");
        }
    }

    #[test]
    fn a_span_sums_its_seconds_and_nothing_else() {
        let window = RequestWindow::new(10);
        window.sample(100, totals(0, 0, 0), 0);
        for _ in 0..99 {
            window.record(Duration::from_millis(2));
        }
        window.record(Duration::from_millis(400));
        window.sample(101, totals(100, 90, 1), 1);
        for _ in 0..10 {
            window.record(Duration::from_millis(2));
        }
        window.sample(102, totals(110, 100, 1), 0);

        let first = window.figures(101, 102);
        assert_eq!(first.seconds, 1);
        assert_eq!(first.requests, 100);
        assert_eq!((first.answered, first.complete, first.trips), (100, 90, 1));
        assert_eq!(first.max_shed_level, 1);
        assert_eq!(first.success_ratio(), Some(0.9));
        // The 99th of 100 requests is the last 2 ms one: its bucket is (1.709, 2.563] ms, and
        // the last of a bucket's requests reads as its upper bound.
        let p99 = first.p99_ms().unwrap();
        assert!((2.56..=2.57).contains(&p99), "{p99}");

        let both = window.figures(0, u64::MAX);
        assert_eq!(both.requests, 110);
        assert_eq!(both.answered, 110);
        assert_eq!(both.max_shed_level, 1);
        assert_eq!(window.figures(103, 200), Figures::default());
    }

    #[test]
    fn the_ring_forgets_its_oldest_seconds() {
        let window = RequestWindow::new(3);
        for second in 0..10u64 {
            window.record(Duration::from_millis(1));
            window.sample(second, totals(second, second, 0), 0);
        }
        let kept = window.figures(0, u64::MAX);
        assert_eq!(kept.seconds, 3);
        assert_eq!(kept.requests, 3);
    }

    #[test]
    fn figures_add_up_across_instances() {
        let mut one = Figures {
            requests: 10,
            answered: 10,
            complete: 9,
            trips: 1,
            max_shed_level: 1,
            seconds: 5,
            ..Figures::default()
        };
        one.latency[3] = 10;
        let mut other = one.clone();
        other.max_shed_level = 2;
        other.latency[20] = 1;
        one.add(&other);
        assert_eq!(
            (one.requests, one.answered, one.complete, one.trips),
            (20, 20, 18, 2)
        );
        assert_eq!(one.max_shed_level, 2);
        assert_eq!(one.latency.iter().sum::<u64>(), 21);
        assert_eq!(Figures::default().p99_ms(), None);
        assert_eq!(Figures::default().success_ratio(), None);
    }
}

//! The peak call rate: the most calls that arrived within any sliding one-second window.
//!
//! A sliding window, not aligned seconds: a burst that straddles a second boundary (30 calls at
//! 0.6 s, 30 at 1.4 s) is one burst of 60, which is what a client's outbound quota must absorb.
//! The maximum over every window equals the maximum over the windows that *end at an arrival*,
//! so recording the count at each arrival is exact.
//!
//! Times are `tokio::time::Instant`, so tests pause and advance the clock instead of sleeping.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The window's length.
pub(crate) const PEAK_WINDOW: Duration = Duration::from_secs(1);

/// The most arrivals remembered at once (16 bytes each, so at most 16 MiB per endpoint), so a
/// flood cannot grow memory without bound. Past it the oldest arrival is forgotten early, and the
/// peak saturates at this value: a simulator seeing a million calls a second has bigger problems.
pub(crate) const MAX_TRACKED_ARRIVALS: usize = 1_000_000;

/// Arrival times within the last [`PEAK_WINDOW`] and the highest count seen, behind one lock that
/// is taken for a few instructions per call and never across an `.await`.
#[derive(Debug, Default)]
pub(crate) struct PeakRate {
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// Oldest first; every entry is less than [`PEAK_WINDOW`] older than the newest.
    arrivals: VecDeque<Instant>,
    peak: u64,
}

impl PeakRate {
    /// Records one call arriving at `now` (which must not go backwards, as tokio's clock does not)
    /// and raises the peak if this window holds more calls than any before.
    pub(crate) fn record(&self, now: Instant) {
        let mut window = self.lock();
        // Calls exactly one window apart are not in the same window.
        while window
            .arrivals
            .front()
            .is_some_and(|&oldest| now.saturating_duration_since(oldest) >= PEAK_WINDOW)
        {
            window.arrivals.pop_front();
        }
        if window.arrivals.len() >= MAX_TRACKED_ARRIVALS {
            window.arrivals.pop_front();
        }
        window.arrivals.push_back(now);
        let in_window = window.arrivals.len() as u64;
        window.peak = window.peak.max(in_window);
    }

    /// The most calls seen within one window since creation or the last [`PeakRate::reset`].
    pub(crate) fn peak(&self) -> u64 {
        self.lock().peak
    }

    /// Forgets every arrival and the peak, and gives back the memory a flood took.
    pub(crate) fn reset(&self) {
        *self.lock() = Window::default();
    }

    fn lock(&self) -> MutexGuard<'_, Window> {
        // Every update leaves the window usable (at worst one arrival short), so a poisoned lock
        // is still worth reading.
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_many(rate: &PeakRate, count: usize, at: Instant) {
        for _ in 0..count {
            rate.record(at);
        }
    }

    #[test]
    fn bursts_straddling_a_second_boundary_count_together() {
        let rate = PeakRate::default();
        let start = Instant::now();
        record_many(&rate, 30, start + Duration::from_millis(600));
        record_many(&rate, 30, start + Duration::from_millis(1_400));
        assert_eq!(rate.peak(), 60);
        // 2.3 s is more than a second after 1.4 s: the older bursts have left the window.
        record_many(&rate, 10, start + Duration::from_millis(2_400));
        assert_eq!(rate.peak(), 60);
    }

    #[test]
    fn calls_a_second_or_more_apart_do_not() {
        let rate = PeakRate::default();
        let start = Instant::now();
        for second in 0..5 {
            record_many(&rate, 7, start + Duration::from_secs(second));
        }
        assert_eq!(rate.peak(), 7);
        // One nanosecond inside the window joins it.
        rate.record(start + Duration::from_secs(5) - Duration::from_nanos(1));
        assert_eq!(rate.peak(), 8);
    }

    #[test]
    fn reset_forgets_the_peak_and_the_window() {
        let rate = PeakRate::default();
        let start = Instant::now();
        record_many(&rate, 12, start);
        rate.reset();
        assert_eq!(rate.peak(), 0);
        // The calls before the reset no longer share a window with the next one.
        rate.record(start + Duration::from_millis(10));
        assert_eq!(rate.peak(), 1);
    }

    #[test]
    fn the_window_is_capped() {
        let rate = PeakRate::default();
        let start = Instant::now();
        record_many(&rate, MAX_TRACKED_ARRIVALS + 5, start);
        assert_eq!(rate.peak(), MAX_TRACKED_ARRIVALS as u64);
        assert_eq!(rate.lock().arrivals.len(), MAX_TRACKED_ARRIVALS);
    }
}

//! Open-loop schedules: when request *i* is due, fixed before the run starts.
//!
//! A schedule is a list of segments whose offered rate moves linearly from `from_rps` to
//! `to_rps` over `duration` (a constant rate is a segment with equal ends). Request *i* is due
//! at the time *t* where the cumulative offered count ∫₀ᵗ rate first reaches *i*; for a constant
//! rate that is `i / rate`. Nothing here depends on how fast the target answers: that is what
//! keeps the generator free of coordinated omission.

use std::time::Duration;

/// One stretch of a schedule with a linearly changing offered rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Segment {
    pub duration: Duration,
    pub from_rps: f64,
    pub to_rps: f64,
}

impl Segment {
    pub fn constant(rps: f64, duration: Duration) -> Self {
        Self {
            duration,
            from_rps: rps,
            to_rps: rps,
        }
    }

    pub fn ramp(from_rps: f64, to_rps: f64, duration: Duration) -> Self {
        Self {
            duration,
            from_rps,
            to_rps,
        }
    }

    /// Requests offered in the whole segment (not rounded).
    fn area(&self) -> f64 {
        (self.from_rps + self.to_rps) / 2.0 * self.duration.as_secs_f64()
    }

    /// The time into the segment at which `count` requests have been offered
    /// (`count` ≤ `area()`): solves `from·t + (to − from)·t² / (2T) = count`.
    fn time_of(&self, count: f64) -> f64 {
        let total = self.duration.as_secs_f64();
        let slope = (self.to_rps - self.from_rps) / total;
        if slope.abs() < 1e-12 {
            return count / self.from_rps;
        }
        // slope/2 · t² + from · t − count = 0, the root in [0, T].
        let discriminant = self.from_rps * self.from_rps + 2.0 * slope * count;
        let root = (-self.from_rps + discriminant.max(0.0).sqrt()) / slope;
        root.clamp(0.0, total)
    }
}

/// A whole run's offered load.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    segments: Vec<Segment>,
}

/// A schedule that could not be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ScheduleError {
    #[error("a schedule needs at least one segment")]
    Empty,
    #[error("segment {0}: rates must be finite and ≥ 0, duration > 0, and not both ends 0")]
    InvalidSegment(usize),
}

impl Schedule {
    pub fn new(segments: Vec<Segment>) -> Result<Self, ScheduleError> {
        if segments.is_empty() {
            return Err(ScheduleError::Empty);
        }
        for (index, segment) in segments.iter().enumerate() {
            let rates_ok = segment.from_rps.is_finite()
                && segment.to_rps.is_finite()
                && segment.from_rps >= 0.0
                && segment.to_rps >= 0.0
                && segment.from_rps + segment.to_rps > 0.0;
            if !rates_ok || segment.duration.is_zero() {
                return Err(ScheduleError::InvalidSegment(index));
            }
        }
        Ok(Self { segments })
    }

    /// A constant rate for `duration`.
    pub fn constant(rps: f64, duration: Duration) -> Result<Self, ScheduleError> {
        Self::new(vec![Segment::constant(rps, duration)])
    }

    pub fn duration(&self) -> Duration {
        self.segments.iter().map(|segment| segment.duration).sum()
    }

    /// How many requests the whole schedule offers.
    pub fn total_requests(&self) -> u64 {
        let area: f64 = self.segments.iter().map(Segment::area).sum();
        // A hair of tolerance so 1000 rps × 1 s is 1000, not 999, after float sums.
        (area + 1e-6).floor() as u64
    }

    /// Mean offered rate over the whole schedule.
    pub fn mean_rps(&self) -> f64 {
        self.total_requests() as f64 / self.duration().as_secs_f64()
    }

    /// Highest offered rate anywhere in the schedule.
    pub fn peak_rps(&self) -> f64 {
        self.segments
            .iter()
            .map(|segment| segment.from_rps.max(segment.to_rps))
            .fold(0.0, f64::max)
    }

    /// Offset from the run's start at which request `index` (0-based) is due, or `None` past
    /// the end. Request 0 is due at 0.
    pub fn offset_of(&self, index: u64) -> Option<Duration> {
        if index >= self.total_requests() {
            return None;
        }
        let mut remaining = index as f64;
        let mut elapsed = 0.0;
        for segment in &self.segments {
            let area = segment.area();
            if remaining < area {
                return Some(Duration::from_secs_f64(
                    elapsed + segment.time_of(remaining),
                ));
            }
            remaining -= area;
            elapsed += segment.duration.as_secs_f64();
        }
        // Rounding at the very end: the last request is due at the end.
        Some(self.duration())
    }

    /// Every due offset in order.
    pub fn offsets(&self) -> impl Iterator<Item = Duration> + '_ {
        (0..self.total_requests()).map_while(|index| self.offset_of(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(value: f64) -> Duration {
        Duration::from_secs_f64(value)
    }

    #[test]
    fn constant_rate_is_i_over_rate() {
        let schedule = Schedule::constant(1000.0, Duration::from_secs(2)).unwrap();
        assert_eq!(schedule.total_requests(), 2000);
        for index in [0_u64, 1, 7, 999, 1000, 1999] {
            let due = schedule.offset_of(index).unwrap().as_secs_f64();
            assert!((due - index as f64 / 1000.0).abs() < 1e-9, "{index}: {due}");
        }
        assert_eq!(schedule.offset_of(2000), None);
        assert!((schedule.mean_rps() - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn ramp_from_zero_follows_the_square_root() {
        // rate(t) = R·t/T, so N(t) = R·t²/(2T) and request i is due at √(2·T·i/R).
        let schedule = Schedule::new(vec![Segment::ramp(0.0, 1000.0, secs(5.0))]).unwrap();
        assert_eq!(schedule.total_requests(), 2500);
        for index in [1_u64, 10, 100, 1250, 2499] {
            let expected = (2.0 * 5.0 * index as f64 / 1000.0).sqrt();
            let due = schedule.offset_of(index).unwrap().as_secs_f64();
            assert!(
                (due - expected).abs() < 1e-9,
                "{index}: {due} vs {expected}"
            );
        }
    }

    #[test]
    fn segments_chain_and_offsets_never_go_back() {
        let schedule = Schedule::new(vec![
            Segment::ramp(0.0, 300.0, secs(1.0)),
            Segment::constant(300.0, secs(1.0)),
            Segment::ramp(300.0, 100.0, secs(1.0)),
        ])
        .unwrap();
        assert_eq!(schedule.total_requests(), 150 + 300 + 200);
        assert_eq!(schedule.peak_rps(), 300.0);
        let offsets: Vec<Duration> = schedule.offsets().collect();
        assert_eq!(offsets.len(), 650);
        assert!(offsets.windows(2).all(|pair| pair[0] <= pair[1]));
        // Request 150 is the first of the constant segment: due at 1 s.
        assert!((offsets[150].as_secs_f64() - 1.0).abs() < 1e-9);
        // Request 450 is the first of the ramp down.
        assert!((offsets[450].as_secs_f64() - 2.0).abs() < 1e-9);
        assert!(offsets[649] <= schedule.duration());
    }

    #[test]
    fn offsets_count_requests_per_second_as_offered() {
        let schedule = Schedule::new(vec![Segment::ramp(100.0, 300.0, secs(2.0))]).unwrap();
        let first_second = schedule
            .offsets()
            .filter(|offset| *offset < Duration::from_secs(1))
            .count();
        // ∫₀¹ (100 + 100t) dt = 150.
        assert_eq!(first_second, 150);
    }

    #[test]
    fn invalid_schedules_are_refused() {
        assert_eq!(Schedule::new(vec![]), Err(ScheduleError::Empty));
        assert_eq!(
            Schedule::new(vec![Segment::constant(0.0, secs(1.0))]),
            Err(ScheduleError::InvalidSegment(0))
        );
        assert_eq!(
            Schedule::new(vec![Segment::constant(10.0, Duration::ZERO)]),
            Err(ScheduleError::InvalidSegment(0))
        );
        assert_eq!(
            Schedule::constant(f64::NAN, secs(1.0)),
            Err(ScheduleError::InvalidSegment(0))
        );
    }
}

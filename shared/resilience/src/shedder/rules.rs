//! The shedder's live rules: the values of [`ShedConfig`] its evaluation reads, in atomics that
//! [`LoadShedder::reconfigure`](super::LoadShedder::reconfigure) stores under running traffic.
//! An evaluation reads them once, at its start ([`Rules::load`]); `admit` reads none of them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::ShedConfig;
use super::level::LevelController;
use crate::live::{load_f64, store_f64};
use crate::ticker::saturating_nanos;

#[derive(Debug)]
pub(super) struct Rules {
    thresholds_bits: [AtomicU64; 3],
    hysteresis_bits: AtomicU64,
    min_dwell_nanos: AtomicU64,
    queue_delay_target_nanos: AtomicU64,
    /// [`Bounds`], packed so that a reader never sees one config's floor with another's ceiling.
    in_flight_bounds: AtomicU64,
    capacity_rps: AtomicU32,
}

impl Rules {
    /// `config` must be clamped (`min_in_flight ≤ max_in_flight`).
    pub(super) fn new(config: &ShedConfig) -> Self {
        let rules = Self {
            thresholds_bits: Default::default(),
            hysteresis_bits: AtomicU64::new(0),
            min_dwell_nanos: AtomicU64::new(0),
            queue_delay_target_nanos: AtomicU64::new(0),
            in_flight_bounds: AtomicU64::new(0),
            capacity_rps: AtomicU32::new(0),
        };
        rules.store(config);
        rules
    }

    /// Stores `config`'s live values (clamped, as for [`Rules::new`]).
    pub(super) fn store(&self, config: &ShedConfig) {
        for (bits, threshold) in self.thresholds_bits.iter().zip(config.thresholds) {
            store_f64(bits, threshold);
        }
        store_f64(&self.hysteresis_bits, config.hysteresis);
        self.min_dwell_nanos
            .store(saturating_nanos(config.min_dwell), Ordering::Relaxed);
        self.queue_delay_target_nanos.store(
            saturating_nanos(config.queue_delay_target),
            Ordering::Relaxed,
        );
        self.capacity_rps
            .store(config.capacity_rps, Ordering::Relaxed);
        // Sequentially consistent with the evaluator's limit update, see `Bounds`.
        let bounds = Bounds {
            min: config.min_in_flight,
            max: config.max_in_flight,
        };
        self.in_flight_bounds.store(bounds.pack(), Ordering::SeqCst);
    }

    /// The rules in force now.
    pub(super) fn load(&self) -> InForce {
        InForce {
            thresholds: self.thresholds_bits.each_ref().map(load_f64),
            hysteresis: load_f64(&self.hysteresis_bits),
            min_dwell_nanos: self.min_dwell_nanos.load(Ordering::Relaxed),
            queue_delay_target_nanos: self.queue_delay_target_nanos.load(Ordering::Relaxed),
            capacity_rps: self.capacity_rps.load(Ordering::Relaxed),
            bounds: self.bounds(),
        }
    }

    pub(super) fn bounds(&self) -> Bounds {
        Bounds::unpack(self.in_flight_bounds.load(Ordering::SeqCst))
    }
}

/// The rules one evaluation applies. Read while a reconfiguration stores them, they may mix
/// old and new values (each valid on its own; only the bounds are read whole) for that one
/// evaluation.
#[derive(Debug, Clone, Copy)]
pub(super) struct InForce {
    pub(super) thresholds: [f64; 3],
    pub(super) hysteresis: f64,
    pub(super) min_dwell_nanos: u64,
    pub(super) queue_delay_target_nanos: u64,
    pub(super) capacity_rps: u32,
    pub(super) bounds: Bounds,
}

impl InForce {
    pub(super) fn controller(&self) -> LevelController {
        LevelController::with_rules(self.thresholds, self.hysteresis, self.min_dwell_nanos)
    }
}

/// The concurrency limit's floor and ceiling (`min ≤ max`).
///
/// The limit is written by the evaluator and clamped by a reconfiguration; both go through
/// sequentially consistent operations on the bounds and the limit, so that whichever of a
/// racing evaluation and reconfiguration comes second sees the other's write: the limit always
/// ends within the bounds in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bounds {
    pub(super) min: u32,
    pub(super) max: u32,
}

impl Bounds {
    fn pack(self) -> u64 {
        u64::from(self.min) << 32 | u64::from(self.max)
    }

    fn unpack(bits: u64) -> Self {
        Self {
            min: (bits >> 32) as u32,
            max: bits as u32,
        }
    }

    pub(super) fn clamp(self, limit: f64) -> f64 {
        limit.clamp(f64::from(self.min), f64::from(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_read_back_as_stored_and_the_bounds_pack_whole() {
        let config = ShedConfig {
            capacity_rps: 900,
            min_in_flight: 3,
            max_in_flight: u32::MAX,
            ..ShedConfig::default()
        };
        let rules = Rules::new(&config).load();
        assert_eq!(rules.thresholds, config.thresholds);
        assert_eq!(rules.hysteresis, config.hysteresis);
        assert_eq!(rules.min_dwell_nanos, 1_000_000_000);
        assert_eq!(rules.queue_delay_target_nanos, 5_000_000);
        assert_eq!(rules.capacity_rps, 900);
        assert_eq!(
            rules.bounds,
            Bounds {
                min: 3,
                max: u32::MAX
            }
        );
        assert_eq!(rules.bounds.clamp(1.0), 3.0);
    }
}

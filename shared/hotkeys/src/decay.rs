//! Fading old traffic: a factor in (0, 1] applied to every count in exact integer arithmetic.

/// The factor is turned into a multiplier of 2⁻³² units, so that scaling is exact integer
/// arithmetic: floors and ceilings come out the same on every machine, and the bounds proven for
/// the counts hold without a floating-point caveat.
const FRACTION_BITS: u32 = 32;

/// [`HeavyHitters::decay`](crate::HeavyHitters::decay) was given a factor outside (0, 1].
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("hot keys: a decay factor must be in (0, 1], got {0}")]
pub struct InvalidDecayFactor(pub f64);

/// A validated decay factor: `multiplier / 2³²`, rounded down, in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decay {
    multiplier: u64,
}

impl Decay {
    /// Refuses 0, negatives, values above 1 and NaN. A positive factor below 2⁻³² rounds to 0 and
    /// empties the table, which is what so strong a decay means anyway.
    pub(crate) fn new(factor: f64) -> Result<Self, InvalidDecayFactor> {
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(InvalidDecayFactor(factor));
        }
        let multiplier = (factor * (1u64 << FRACTION_BITS) as f64).floor() as u64;
        Ok(Self { multiplier })
    }

    /// `⌊value × factor⌋`: how a count decays.
    pub(crate) fn scale_down(self, value: u64) -> u64 {
        let scaled = (u128::from(value) * u128::from(self.multiplier)) >> FRACTION_BITS;
        // Never more than `value`, as the multiplier is at most 2³².
        scaled as u64
    }

    /// `⌈value × factor⌉`: how an error bound decays, rounded the safe way.
    pub(crate) fn scale_up(self, value: u64) -> u64 {
        let product = u128::from(value) * u128::from(self.multiplier);
        product.div_ceil(1u128 << FRACTION_BITS) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_outside_zero_to_one_are_refused() {
        for factor in [0.0, -0.5, 1.000_001, f64::NAN, f64::INFINITY, -0.0] {
            assert!(Decay::new(factor).is_err(), "{factor} was accepted");
        }
        assert!(Decay::new(1.0).is_ok());
        assert!(Decay::new(f64::MIN_POSITIVE).is_ok());
    }

    #[test]
    fn one_keeps_every_value() {
        let one = Decay::new(1.0).unwrap();
        for value in [0, 1, 7, u64::MAX] {
            assert_eq!(one.scale_down(value), value);
            assert_eq!(one.scale_up(value), value);
        }
    }

    #[test]
    fn a_half_floors_counts_and_ceils_errors() {
        let half = Decay::new(0.5).unwrap();
        assert_eq!(half.scale_down(7), 3);
        assert_eq!(half.scale_up(7), 4);
        assert_eq!(half.scale_down(8), 4);
        assert_eq!(half.scale_up(8), 4);
        assert_eq!(half.scale_down(1), 0);
    }

    #[test]
    fn a_factor_below_the_resolution_empties() {
        let tiny = Decay::new(1e-12).unwrap();
        assert_eq!(tiny.scale_down(1_000_000), 0);
        assert_eq!(tiny.scale_up(1_000_000), 0);
    }
}

//! The rebate formula: `floor((price − best applicable coupon) × rate_bps / 10_000)`.
//!
//! Rounding is always *down* to the cent, so the service never promises a user more than the
//! platform will pay. Because the rate is at most 10 000 bps and the coupon is capped at the
//! price, the result is never negative and never above the price.

use crate::money::{Cents, RateBps};
use crate::part::Coupon;
use crate::time::Timestamp;

/// The coupon that lowers the price most among those usable on `price` at `now`.
///
/// A coupon is usable when the price reaches its threshold and it has not expired. Ties keep the
/// first coupon in the list, so the choice is deterministic.
pub fn best_coupon(price: Cents, coupons: &[Coupon], now: Timestamp) -> Option<&Coupon> {
    coupons
        .iter()
        .filter(|coupon| coupon.threshold_cents <= price && coupon.expires_at > now)
        .fold(None, |best: Option<&Coupon>, coupon| match best {
            Some(current) if current.discount_cents >= coupon.discount_cents => Some(current),
            _ => Some(coupon),
        })
}

/// Estimated rebate for buying at `price` with the best usable coupon, at `rate`.
///
/// `floor((price − min(discount, price)) × rate / 10_000)`, computed in `u128` so that no price
/// can overflow.
pub fn estimate_rebate(price: Cents, coupons: &[Coupon], rate: RateBps, now: Timestamp) -> Cents {
    let discount = best_coupon(price, coupons, now)
        .map(|coupon| coupon.discount_cents)
        .unwrap_or(Cents::ZERO);
    let paid = price.saturating_sub(discount);
    let rebate = u128::from(paid.get()) * u128::from(rate.get()) / u128::from(RateBps::FULL);
    debug_assert!(rebate <= u128::from(price.get()));
    // `rebate <= paid <= u64::MAX`, so the conversion cannot fail.
    Cents::new(u64::try_from(rebate).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn coupon(discount: u64, threshold: u64, expires_at: i64) -> Coupon {
        Coupon {
            coupon_id: format!("c{discount}-{threshold}"),
            discount_cents: Cents::new(discount),
            threshold_cents: Cents::new(threshold),
            expires_at: Timestamp::from_millis(expires_at),
        }
    }

    const NOW: Timestamp = Timestamp::from_millis(1_000_000);

    #[test]
    fn contract_example() {
        // The contract's example: price 129.00, coupon 10.00 off from 99.00, rate 8.5 % → 10.11
        let coupons = [coupon(1000, 9900, 2_000_000)];
        let rate = RateBps::try_from(850u64).unwrap();
        assert_eq!(
            estimate_rebate(Cents::new(12_900), &coupons, rate, NOW),
            Cents::new(1011)
        );
    }

    #[test]
    fn rounds_down_to_the_cent() {
        let rate = RateBps::try_from(333u64).unwrap();
        // 999 × 0.0333 = 33.2667 → 33
        assert_eq!(
            estimate_rebate(Cents::new(999), &[], rate, NOW),
            Cents::new(33)
        );
    }

    #[test]
    fn skips_expired_and_unreached_coupons() {
        let coupons = [
            coupon(5000, 0, NOW.as_millis()), // expires exactly now: unusable
            coupon(3000, 20_000, 2_000_000),  // threshold not reached
            coupon(500, 0, 2_000_000),        // usable
            coupon(500, 100, 2_000_000),      // same discount, later: first wins
        ];
        let best = best_coupon(Cents::new(10_000), &coupons, NOW).unwrap();
        assert_eq!(best.coupon_id, "c500-0");
    }

    #[test]
    fn coupon_larger_than_price_gives_zero() {
        let coupons = [coupon(50_000, 0, 2_000_000)];
        let rate = RateBps::try_from(10_000u64).unwrap();
        assert_eq!(
            estimate_rebate(Cents::new(100), &coupons, rate, NOW),
            Cents::ZERO
        );
    }

    prop_compose! {
        fn any_coupon()(discount in 0u64..=u64::MAX / 2, threshold in 0u64..=u64::MAX / 2,
                        expires in 0i64..2_000_000) -> Coupon {
            coupon(discount, threshold, expires)
        }
    }

    proptest! {
        #[test]
        fn rebate_is_never_negative_nor_above_the_price(
            price in 0u64..=u64::MAX,
            rate in 0u64..=10_000,
            coupons in proptest::collection::vec(any_coupon(), 0..6),
        ) {
            let rate = RateBps::try_from(rate).unwrap();
            let rebate = estimate_rebate(Cents::new(price), &coupons, rate, NOW);
            prop_assert!(rebate.get() <= price);
        }

        #[test]
        fn rebate_never_exceeds_the_paid_amount_times_rate(
            price in 0u64..10_000_000_000,
            rate in 0u64..=10_000,
            coupons in proptest::collection::vec(any_coupon(), 0..6),
        ) {
            let rate_bps = RateBps::try_from(rate).unwrap();
            let rebate = estimate_rebate(Cents::new(price), &coupons, rate_bps, NOW).get();
            let discount = best_coupon(Cents::new(price), &coupons, NOW)
                .map_or(0, |c| c.discount_cents.get().min(price));
            let exact_times_10k = u128::from(price - discount) * u128::from(rate);
            // floor: rebate × 10k ≤ exact < (rebate + 1) × 10k
            prop_assert!(u128::from(rebate) * 10_000 <= exact_times_10k);
            prop_assert!(exact_times_10k < (u128::from(rebate) + 1) * 10_000);
        }

        #[test]
        fn best_coupon_is_usable_and_maximal(
            price in 0u64..1_000_000,
            coupons in proptest::collection::vec(any_coupon(), 0..8),
        ) {
            let usable: Vec<&Coupon> = coupons.iter()
                .filter(|c| c.threshold_cents.get() <= price && c.expires_at > NOW)
                .collect();
            match best_coupon(Cents::new(price), &coupons, NOW) {
                None => prop_assert!(usable.is_empty()),
                Some(best) => {
                    prop_assert!(best.threshold_cents.get() <= price && best.expires_at > NOW);
                    prop_assert!(usable.iter().all(|c| c.discount_cents <= best.discount_cents));
                }
            }
        }
    }
}

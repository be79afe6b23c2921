//! The quote a client receives and the pure assembly of it from four part results.
//!
//! Assembly is a pure function of the parts and "now", so the degrade ladder is property-tested
//! without any I/O.

use rebate_domain::{
    Cents, Coupon, Extras, ItemId, PartKind, Platform, Product, ProductStatus, RateBps, RebateRate,
    Timestamp, estimate_rebate,
};
use serde::{Deserialize, Serialize};

use crate::error::DegradeReason;
use crate::error::QueryError;

/// How a part's data was obtained: `live` (the source, or a cache entry still fresh), `stale` (a
/// cached copy past its fresh window, because the source failed), `template` (no data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Served {
    /// From the source, or from a cache entry that is still fresh.
    Live,
    /// From a cache entry past its fresh window, because the source failed.
    Stale,
    /// No data: template text stands in.
    Template,
}

/// One part's outcome as the engine saw it, before assembly.
#[derive(Debug, Clone, PartialEq)]
pub enum PartResult<T> {
    /// Fresh data; `None` when the source says the item has none.
    Live { value: Option<T>, as_of: Timestamp },
    /// Data past its fresh window, served because the source failed for `reason`.
    Stale {
        value: Option<T>,
        as_of: Timestamp,
        reason: DegradeReason,
    },
    /// Nothing usable.
    Failed { reason: DegradeReason },
}

impl<T> PartResult<T> {
    pub fn is_failed(&self) -> bool {
        matches!(self, Self::Failed { .. })
    }
}

/// Template texts shown to users when a part is degraded. Fixed strings: clients may match them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Notice {
    RateUnknown,
    RateMayBeOutdated,
    CouponsUnavailable,
}

impl Notice {
    pub const fn text(self) -> &'static str {
        match self {
            Notice::RateUnknown => "返利比例以实际下单为准",
            Notice::RateMayBeOutdated => "返利信息可能有延迟，以实际下单为准",
            Notice::CouponsUnavailable => "优惠券信息暂时无法获取，预估返利未计入优惠券",
        }
    }
}

impl Serialize for Notice {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.text())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemView {
    pub platform: Platform,
    pub item_id: ItemId,
    pub title: String,
    pub price_cents: Cents,
    pub image_url: String,
    pub shop_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RebateView {
    /// `None` when the rate is unknown (template).
    pub rate_bps: Option<RateBps>,
    /// `floor((price − best usable coupon) × rate)`; `None` when the rate is unknown.
    pub estimated_cents: Option<Cents>,
    pub source: Served,
    /// When the rate was fetched from its source; `None` for template.
    pub as_of: Option<Timestamp>,
}

/// A part that is not live, why, and what stands in for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DegradedPart {
    pub part: PartKind,
    pub reason: DegradeReason,
    pub served: Served,
    /// For stale data: when it was fetched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<Timestamp>,
}

/// A complete answer for one item. Field names are the HTTP contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quote {
    pub item: ItemView,
    pub rebate: RebateView,
    pub coupons: Vec<Coupon>,
    pub extras: Option<Extras>,
    pub degraded: bool,
    pub degraded_parts: Vec<DegradedPart>,
    pub notices: Vec<Notice>,
}

/// The degraded parts and notices collected while walking each part's ladder.
#[derive(Default)]
struct Ladder {
    degraded_parts: Vec<DegradedPart>,
    notices: Vec<Notice>,
}

impl Ladder {
    fn stale(&mut self, part: PartKind, reason: DegradeReason, as_of: Timestamp) {
        self.degraded_parts.push(DegradedPart {
            part,
            reason,
            served: Served::Stale,
            as_of: Some(as_of),
        });
    }

    fn template(&mut self, part: PartKind, reason: DegradeReason, notice: Option<Notice>) {
        self.degraded_parts.push(DegradedPart {
            part,
            reason,
            served: Served::Template,
            as_of: None,
        });
        self.notices.extend(notice);
    }
}

/// Builds the quote from the four part results, walking each part's degrade ladder.
pub fn assemble(
    product: PartResult<Product>,
    rate: PartResult<RebateRate>,
    coupons: PartResult<Vec<Coupon>>,
    extras: PartResult<Extras>,
    now: Timestamp,
) -> Result<Quote, QueryError> {
    let mut ladder = Ladder::default();

    let product = match product {
        PartResult::Live { value, .. } => value,
        PartResult::Stale {
            value,
            as_of,
            reason,
        } => {
            ladder.stale(PartKind::Product, reason, as_of);
            value
        }
        PartResult::Failed { reason } => return Err(QueryError::Unavailable { reason }),
    };
    let product = match product {
        Some(product) if product.status == ProductStatus::OnSale => product,
        Some(_) => return Err(QueryError::NotFound { delisted: true }),
        None => return Err(QueryError::NotFound { delisted: false }),
    };

    let coupons = match coupons {
        PartResult::Live { value, .. } => value.unwrap_or_default(),
        PartResult::Stale {
            value,
            as_of,
            reason,
        } => {
            ladder.stale(PartKind::Coupons, reason, as_of);
            value.unwrap_or_default()
        }
        PartResult::Failed { reason } => {
            ladder.template(PartKind::Coupons, reason, Some(Notice::CouponsUnavailable));
            Vec::new()
        }
    };

    let rate = match rate {
        PartResult::Live {
            value: Some(rate),
            as_of,
        } => Some((rate.rate_bps, Served::Live, as_of)),
        PartResult::Stale {
            value: Some(rate),
            as_of,
            reason,
        } => {
            ladder.stale(PartKind::Rate, reason, as_of);
            ladder.notices.push(Notice::RateMayBeOutdated);
            Some((rate.rate_bps, Served::Stale, as_of))
        }
        PartResult::Live { value: None, .. } | PartResult::Stale { value: None, .. } => {
            ladder.template(
                PartKind::Rate,
                DegradeReason::Missing,
                Some(Notice::RateUnknown),
            );
            None
        }
        PartResult::Failed { reason } => {
            ladder.template(PartKind::Rate, reason, Some(Notice::RateUnknown));
            None
        }
    };
    let rebate = match rate {
        Some((rate_bps, source, as_of)) => RebateView {
            rate_bps: Some(rate_bps),
            estimated_cents: Some(estimate_rebate(
                product.price_cents,
                &coupons,
                rate_bps,
                now,
            )),
            source,
            as_of: Some(as_of),
        },
        None => RebateView {
            rate_bps: None,
            estimated_cents: None,
            source: Served::Template,
            as_of: None,
        },
    };

    let extras = match extras {
        PartResult::Live { value, .. } => value,
        PartResult::Stale {
            value,
            as_of,
            reason,
        } => {
            ladder.stale(PartKind::Extras, reason, as_of);
            value
        }
        PartResult::Failed { reason } => {
            ladder.template(PartKind::Extras, reason, None);
            None
        }
    };

    Ok(Quote {
        item: ItemView {
            platform: product.platform,
            item_id: product.item_id,
            title: product.title,
            price_cents: product.price_cents,
            image_url: product.image_url,
            shop_name: product.shop_name,
        },
        rebate,
        coupons,
        extras,
        degraded: !ladder.degraded_parts.is_empty(),
        degraded_parts: ladder.degraded_parts,
        notices: ladder.notices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: Timestamp = Timestamp::from_millis(1_800_000_000_000);

    fn product(status: ProductStatus, price: u64) -> Product {
        Product {
            platform: Platform::Taobao,
            item_id: ItemId::from_u64(100_001),
            title: "保温杯".to_owned(),
            price_cents: Cents::new(price),
            image_url: "https://img.example.com/taobao/100001.jpg".to_owned(),
            shop_name: "官方旗舰店".to_owned(),
            status,
        }
    }

    fn rate(bps: u64) -> RebateRate {
        RebateRate {
            rate_bps: RateBps::try_from(bps).unwrap(),
        }
    }

    fn coupon(discount: u64, threshold: u64) -> Coupon {
        Coupon {
            coupon_id: "c1".to_owned(),
            discount_cents: Cents::new(discount),
            threshold_cents: Cents::new(threshold),
            expires_at: NOW.saturating_add_millis(86_400_000),
        }
    }

    fn live<T>(value: T) -> PartResult<T> {
        PartResult::Live {
            value: Some(value),
            as_of: NOW,
        }
    }

    fn extras() -> Extras {
        Extras {
            sales_30d: 1234,
            popular_searches: vec![],
        }
    }

    #[test]
    fn all_live_is_a_complete_quote() {
        let quote = assemble(
            live(product(ProductStatus::OnSale, 12_900)),
            live(rate(850)),
            live(vec![coupon(1000, 9900)]),
            live(extras()),
            NOW,
        )
        .unwrap();
        assert!(!quote.degraded);
        assert!(quote.degraded_parts.is_empty() && quote.notices.is_empty());
        assert_eq!(quote.rebate.estimated_cents, Some(Cents::new(1011)));
        assert_eq!(quote.rebate.source, Served::Live);
        assert_eq!(quote.extras, Some(extras()));
    }

    #[test]
    fn failed_rate_becomes_the_template_notice() {
        let quote = assemble(
            live(product(ProductStatus::OnSale, 12_900)),
            PartResult::Failed {
                reason: DegradeReason::Timeout,
            },
            live(vec![]),
            live(extras()),
            NOW,
        )
        .unwrap();
        assert_eq!(quote.rebate.rate_bps, None);
        assert_eq!(quote.rebate.source, Served::Template);
        assert_eq!(quote.notices, vec![Notice::RateUnknown]);
        let json = serde_json::to_value(&quote).unwrap();
        assert_eq!(json["notices"][0], "返利比例以实际下单为准");
        assert_eq!(json["degraded_parts"][0]["part"], "rate");
        assert_eq!(json["degraded_parts"][0]["reason"], "timeout");
        assert_eq!(json["rebate"]["rate_bps"], serde_json::Value::Null);
    }

    #[test]
    fn stale_coupons_keep_their_as_of() {
        let fetched = Timestamp::from_millis(NOW.as_millis() - 600_000);
        let quote = assemble(
            live(product(ProductStatus::OnSale, 12_900)),
            live(rate(850)),
            PartResult::Stale {
                value: Some(vec![coupon(1000, 0)]),
                as_of: fetched,
                reason: DegradeReason::Error,
            },
            live(extras()),
            NOW,
        )
        .unwrap();
        assert_eq!(quote.coupons.len(), 1);
        assert_eq!(
            quote.degraded_parts,
            vec![DegradedPart {
                part: PartKind::Coupons,
                reason: DegradeReason::Error,
                served: Served::Stale,
                as_of: Some(fetched),
            }]
        );
    }

    #[test]
    fn product_decides_found_or_not() {
        let others = || (live(rate(850)), live(vec![]), live(extras()));
        let (r, c, e) = others();
        assert_eq!(
            assemble(
                PartResult::Live {
                    value: None,
                    as_of: NOW
                },
                r,
                c,
                e,
                NOW
            ),
            Err(QueryError::NotFound { delisted: false })
        );
        let (r, c, e) = others();
        assert_eq!(
            assemble(live(product(ProductStatus::Delisted, 100)), r, c, e, NOW),
            Err(QueryError::NotFound { delisted: true })
        );
        let (r, c, e) = others();
        assert_eq!(
            assemble(
                PartResult::Failed {
                    reason: DegradeReason::Error
                },
                r,
                c,
                e,
                NOW
            ),
            Err(QueryError::Unavailable {
                reason: DegradeReason::Error
            })
        );
    }

    fn any_reason() -> impl Strategy<Value = DegradeReason> {
        prop_oneof![
            Just(DegradeReason::Timeout),
            Just(DegradeReason::Error),
            Just(DegradeReason::Missing),
            Just(DegradeReason::BreakerOpen),
            Just(DegradeReason::BulkheadFull),
            Just(DegradeReason::Quota),
            Just(DegradeReason::HotItem),
            Just(DegradeReason::Shed),
        ]
    }

    fn any_result<T: Clone + std::fmt::Debug + 'static>(
        value: impl Strategy<Value = T> + Clone + 'static,
    ) -> impl Strategy<Value = PartResult<T>> {
        prop_oneof![
            proptest::option::of(value.clone())
                .prop_map(|value| PartResult::Live { value, as_of: NOW }),
            (proptest::option::of(value), any_reason()).prop_map(|(value, reason)| {
                PartResult::Stale {
                    value,
                    as_of: NOW,
                    reason,
                }
            }),
            any_reason().prop_map(|reason| PartResult::Failed { reason }),
        ]
    }

    fn is_degraded<T>(result: &PartResult<T>) -> bool {
        !matches!(result, PartResult::Live { .. })
    }

    proptest! {
        /// Whatever mix of outcomes: the product alone decides success, every non-live optional
        /// part is reported, `degraded` agrees with the list, and the rebate stays within price.
        #[test]
        fn degrade_ladder_invariants(
            price in 0u64..10_000_000,
            status in prop_oneof![Just(ProductStatus::OnSale), Just(ProductStatus::Delisted)],
            product_result in any_result(Just(())),
            rate_result in any_result((0u64..=10_000).prop_map(rate)),
            coupons_result in any_result(proptest::collection::vec(
                (0u64..20_000, 0u64..20_000).prop_map(|(d, t)| coupon(d, t)), 0..4)),
            extras_result in any_result(Just(extras())),
        ) {
            let product_result = match product_result {
                PartResult::Live { value, as_of } =>
                    PartResult::Live { value: value.map(|()| product(status, price)), as_of },
                PartResult::Stale { value, as_of, reason } =>
                    PartResult::Stale { value: value.map(|()| product(status, price)), as_of, reason },
                PartResult::Failed { reason } => PartResult::Failed { reason },
            };
            let product_ok = match &product_result {
                PartResult::Live { value: Some(p), .. } | PartResult::Stale { value: Some(p), .. } =>
                    p.status == ProductStatus::OnSale,
                _ => false,
            };
            let optional_degraded = [
                (PartKind::Rate, is_degraded(&rate_result)
                    || matches!(rate_result, PartResult::Live { value: None, .. })),
                (PartKind::Coupons, is_degraded(&coupons_result)),
                (PartKind::Extras, is_degraded(&extras_result)),
            ];
            let result = assemble(product_result, rate_result, coupons_result, extras_result, NOW);
            prop_assert_eq!(result.is_ok(), product_ok);
            if let Ok(quote) = result {
                prop_assert_eq!(quote.degraded, !quote.degraded_parts.is_empty());
                for (part, degraded) in optional_degraded {
                    let reported = quote.degraded_parts.iter().any(|d| d.part == part);
                    prop_assert_eq!(reported, degraded, "part {:?}", part);
                }
                prop_assert_eq!(quote.rebate.rate_bps.is_none(), quote.rebate.source == Served::Template);
                prop_assert_eq!(quote.rebate.rate_bps.is_none(), quote.rebate.estimated_cents.is_none());
                if let Some(estimated) = quote.rebate.estimated_cents {
                    prop_assert!(estimated <= quote.item.price_cents);
                }
                if quote.rebate.rate_bps.is_none() {
                    prop_assert!(quote.notices.contains(&Notice::RateUnknown));
                }
            }
        }
    }
}

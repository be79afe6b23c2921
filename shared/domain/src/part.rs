//! The four parts a quote is assembled from, each with its own source and timeout tier.

use serde::{Deserialize, Serialize};

use crate::key::{ItemId, Platform};
use crate::money::{Cents, RateBps};
use crate::time::Timestamp;

/// Which part of a quote; used for cache names, timeouts, counters and degrade reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PartKind {
    Product,
    Rate,
    Coupons,
    Extras,
}

impl PartKind {
    pub const ALL: [PartKind; 4] = [
        PartKind::Product,
        PartKind::Rate,
        PartKind::Coupons,
        PartKind::Extras,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            PartKind::Product => "product",
            PartKind::Rate => "rate",
            PartKind::Coupons => "coupons",
            PartKind::Extras => "extras",
        }
    }
}

/// One value per part, indexed by [`PartKind`]: the four-way lists (timeouts, settings, caches,
/// statistics) are written once, so adding a part is adding a field here and its kind. Serialises
/// as an object keyed by the parts' names, in [`PartKind::ALL`] order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerPart<T> {
    pub product: T,
    pub rate: T,
    pub coupons: T,
    pub extras: T,
}

impl<T> PerPart<T> {
    /// Builds every part's value from one function, so none can be forgotten.
    pub fn from_fn(mut make: impl FnMut(PartKind) -> T) -> Self {
        Self {
            product: make(PartKind::Product),
            rate: make(PartKind::Rate),
            coupons: make(PartKind::Coupons),
            extras: make(PartKind::Extras),
        }
    }

    pub fn get(&self, part: PartKind) -> &T {
        match part {
            PartKind::Product => &self.product,
            PartKind::Rate => &self.rate,
            PartKind::Coupons => &self.coupons,
            PartKind::Extras => &self.extras,
        }
    }

    pub fn get_mut(&mut self, part: PartKind) -> &mut T {
        match part {
            PartKind::Product => &mut self.product,
            PartKind::Rate => &mut self.rate,
            PartKind::Coupons => &mut self.coupons,
            PartKind::Extras => &mut self.extras,
        }
    }

    /// Each part with its value, in [`PartKind::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (PartKind, &T)> {
        PartKind::ALL.into_iter().map(|part| (part, self.get(part)))
    }

    /// A new set with `change` applied to each part's value.
    pub fn map<U>(&self, mut change: impl FnMut(PartKind, &T) -> U) -> PerPart<U> {
        PerPart::from_fn(|part| change(part, self.get(part)))
    }
}

impl<T> std::ops::Index<PartKind> for PerPart<T> {
    type Output = T;

    fn index(&self, part: PartKind) -> &T {
        self.get(part)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProductStatus {
    OnSale,
    Delisted,
}

/// A product as the catalogue (MySQL / SQLite `products`) knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Product {
    pub platform: Platform,
    pub item_id: ItemId,
    pub title: String,
    pub price_cents: Cents,
    pub image_url: String,
    pub shop_name: String,
    pub status: ProductStatus,
}

/// The rebate rate an item currently earns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebateRate {
    pub rate_bps: RateBps,
}

/// A coupon from the coupon API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coupon {
    pub coupon_id: String,
    pub discount_cents: Cents,
    pub threshold_cents: Cents,
    pub expires_at: Timestamp,
}

/// Optional extras from the extras API; a quote is complete without them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extras {
    pub sales_30d: u64,
    #[serde(default)]
    pub popular_searches: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_part_is_indexed_and_listed_by_kind_in_order() {
        let names = PerPart::from_fn(PartKind::as_str);
        for part in PartKind::ALL {
            assert_eq!(names[part], part.as_str());
        }
        let listed: Vec<_> = names.iter().map(|(part, name)| (part, *name)).collect();
        assert_eq!(listed[0], (PartKind::Product, "product"));
        assert_eq!(listed[3], (PartKind::Extras, "extras"));
        let lengths = names.map(|_, name| name.len());
        assert_eq!(lengths.coupons, 7);
        assert_eq!(
            serde_json::to_string(&lengths).unwrap(),
            r#"{"product":7,"rate":4,"coupons":7,"extras":6}"#
        );
    }

    #[test]
    fn per_part_refuses_an_unknown_part_name() {
        let error = serde_json::from_str::<PerPart<u8>>(
            r#"{"product":1,"rate":2,"coupons":3,"extras":4,"shipping":5}"#,
        )
        .unwrap_err();
        assert!(error.to_string().contains("shipping"), "{error}");
    }
}

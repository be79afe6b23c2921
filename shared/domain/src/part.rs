//! The four parts a quote is assembled from, each with its own source and timeout tier.

use serde::{Deserialize, Serialize};

use crate::key::{ItemId, Platform};
use crate::money::{Cents, RateBps};
use crate::time::Timestamp;

/// Which part of a quote; used for cache names, timeouts, counters and degrade reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

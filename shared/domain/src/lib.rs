//! Domain types of the rebate query service.
//!
//! Contract: every value here is valid by construction. Platforms, item ids, money and rates are
//! parsed once at the edge (`FromStr` / `TryFrom`) and cannot hold an invalid value afterwards.
//! The rebate arithmetic is integer-only. This crate does no I/O and depends on no runtime, store,
//! cache or HTTP crate; every other crate may depend on it.
//!
//! # Layout
//! - [`key`]: [`Platform`], [`ItemId`], [`ItemKey`]: what a client asks about.
//! - [`money`]: [`Cents`] and [`RateBps`].
//! - [`rebate`]: [`estimate_rebate`] and [`best_coupon`], the rebate formula.
//! - [`part`]: the four parts a quote is assembled from ([`Product`], [`RebateRate`],
//!   [`Coupon`], [`Extras`]) and [`PartKind`].
//! - [`time`]: [`Timestamp`], wall-clock milliseconds shared by every tier.
//! - [`error`]: [`ErrorCode`], the small error vocabulary clients rely on.

pub mod error;
pub mod key;
pub mod money;
pub mod part;
pub mod rebate;
pub mod text;
pub mod time;

pub use error::ErrorCode;
pub use key::{ItemId, ItemKey, KeyError, Platform};
pub use money::{Cents, MoneyError, RateBps};
pub use part::{Coupon, Extras, PartKind, PerPart, Product, ProductStatus, RebateRate};
pub use rebate::{best_coupon, estimate_rebate};
pub use time::{Timestamp, TimestampError};

//! Rows ↔ domain types, shared by the SQL stores.
//!
//! Both schemas hold the same columns with the same meaning, so reading a row back into domain
//! types (and refusing a row that breaks an invariant) and binding domain values for a write are
//! written once, here. Only the SQL dialect around them (placeholders, conflict clauses) differs
//! per store.

use rebate_domain::{Cents, ItemKey, Product, ProductStatus, RateBps, RebateRate, Timestamp};
use sqlx::{Database, Encode, QueryBuilder, Type};

use crate::demo::DemoItem;
use crate::{StoreError, Versioned};

const PRODUCT_COLUMNS: &str = " INTO products (platform, item_id, title, price_cents, \
     image_url, shop_name, status, version, updated_at_ms) ";

const RATE_COLUMNS: &str =
    " INTO rebate_rates (platform, item_id, rate_bps, version, updated_at_ms) ";

const HOT_ITEM_COLUMNS: &str = " INTO hot_items (platform, item_id, hot_rank) ";

/// A product as bound to SQL: integers already narrowed to `i64`, so a value that does not fit is
/// refused before any statement runs.
pub(crate) struct ProductParams<'a> {
    pub(crate) platform: &'a str,
    pub(crate) item_id: &'a str,
    pub(crate) title: &'a str,
    pub(crate) price_cents: i64,
    pub(crate) image_url: &'a str,
    pub(crate) shop_name: &'a str,
    pub(crate) status: &'a str,
    pub(crate) version: i64,
    pub(crate) updated_at_ms: i64,
}

impl<'a> TryFrom<&'a Versioned<Product>> for ProductParams<'a> {
    type Error = StoreError;

    fn try_from(versioned: &'a Versioned<Product>) -> Result<Self, Self::Error> {
        let product = &versioned.value;
        let key = ItemKey::new(product.platform, product.item_id);
        Ok(Self {
            platform: product.platform.as_str(),
            item_id: product.item_id.as_str(),
            title: &product.title,
            price_cents: to_column(key, "products.price_cents", product.price_cents.get())?,
            image_url: &product.image_url,
            shop_name: &product.shop_name,
            status: status_to_column(product.status),
            version: to_column(key, "products.version", versioned.version)?,
            updated_at_ms: versioned.updated_at.as_millis(),
        })
    }
}

/// A rate as bound to SQL; see [`ProductParams`].
pub(crate) struct RateParams {
    pub(crate) key: ItemKey,
    pub(crate) rate_bps: i64,
    pub(crate) version: i64,
    pub(crate) updated_at_ms: i64,
}

impl RateParams {
    pub(crate) fn new(key: ItemKey, rate: &Versioned<RebateRate>) -> Result<Self, StoreError> {
        Ok(Self {
            key,
            rate_bps: i64::from(rate.value.rate_bps.get()),
            version: to_column(key, "rebate_rates.version", rate.version)?,
            updated_at_ms: rate.updated_at.as_millis(),
        })
    }
}

/// One seeding batch: the product and rate rows of a run of demo items, converted up front so a
/// value that does not fit fails the seed before the batch's statements run.
pub(crate) struct DemoBatch<'a> {
    pub(crate) products: Vec<ProductParams<'a>>,
    pub(crate) rates: Vec<RateParams>,
}

impl<'a> DemoBatch<'a> {
    pub(crate) fn new(items: &'a [DemoItem]) -> Result<Self, StoreError> {
        let products = items
            .iter()
            .map(|item| ProductParams::try_from(&item.product))
            .collect::<Result<Vec<_>, _>>()?;
        let rates = items
            .iter()
            .map(|item| RateParams::new(item.key(), &item.rate))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { products, rates })
    }
}

/// `{verb} INTO products (…) VALUES (…), (…)` for `rows`, which must not be empty. The verb
/// (`INSERT`, `INSERT IGNORE`) and any conflict clause the caller appends are its dialect's.
pub(crate) fn insert_products<'args, DB>(
    verb: &str,
    rows: &'args [ProductParams<'args>],
) -> QueryBuilder<'args, DB>
where
    DB: Database,
    DB::Arguments<'args>: Default,
    &'args str: Encode<'args, DB> + Type<DB>,
    i64: Encode<'args, DB> + Type<DB>,
{
    debug_assert!(!rows.is_empty(), "an INSERT needs at least one row");
    let mut builder = QueryBuilder::new(verb);
    builder.push(PRODUCT_COLUMNS);
    builder.push_values(rows, |mut values, row| {
        values
            .push_bind(row.platform)
            .push_bind(row.item_id)
            .push_bind(row.title)
            .push_bind(row.price_cents)
            .push_bind(row.image_url)
            .push_bind(row.shop_name)
            .push_bind(row.status)
            .push_bind(row.version)
            .push_bind(row.updated_at_ms);
    });
    builder
}

/// `{verb} INTO rebate_rates (…) VALUES …` for `rows`; see [`insert_products`].
pub(crate) fn insert_rates<'args, DB>(
    verb: &str,
    rows: &'args [RateParams],
) -> QueryBuilder<'args, DB>
where
    DB: Database,
    DB::Arguments<'args>: Default,
    &'args str: Encode<'args, DB> + Type<DB>,
    i64: Encode<'args, DB> + Type<DB>,
{
    debug_assert!(!rows.is_empty(), "an INSERT needs at least one row");
    let mut builder = QueryBuilder::new(verb);
    builder.push(RATE_COLUMNS);
    builder.push_values(rows, |mut values, row| {
        let platform: &'args str = row.key.platform.as_str();
        values
            .push_bind(platform)
            .push_bind(row.key.item_id.as_str())
            .push_bind(row.rate_bps)
            .push_bind(row.version)
            .push_bind(row.updated_at_ms);
    });
    builder
}

/// `{verb} INTO hot_items (…) VALUES …` for `(key, rank)` rows; see [`insert_products`].
pub(crate) fn insert_hot_items<'args, DB>(
    verb: &str,
    rows: &'args [(ItemKey, u32)],
) -> QueryBuilder<'args, DB>
where
    DB: Database,
    DB::Arguments<'args>: Default,
    &'args str: Encode<'args, DB> + Type<DB>,
    i64: Encode<'args, DB> + Type<DB>,
{
    debug_assert!(!rows.is_empty(), "an INSERT needs at least one row");
    let mut builder = QueryBuilder::new(verb);
    builder.push(HOT_ITEM_COLUMNS);
    builder.push_values(rows, |mut values, (key, rank)| {
        let platform: &'args str = key.platform.as_str();
        values
            .push_bind(platform)
            .push_bind(key.item_id.as_str())
            .push_bind(i64::from(*rank));
    });
    builder
}

/// Narrows an unsigned domain value to the signed integer column holding it; `key` names the row
/// in the error.
pub(crate) fn to_column(
    key: impl std::fmt::Display,
    column: &str,
    value: u64,
) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::ValueOutOfRange {
        key: key.to_string(),
        reason: format!(
            "{column} {value} is above the column's maximum {}",
            i64::MAX
        ),
    })
}

fn status_to_column(status: ProductStatus) -> &'static str {
    match status {
        ProductStatus::OnSale => "on_sale",
        ProductStatus::Delisted => "delisted",
    }
}

fn status_from_column(bytes: &[u8]) -> Option<ProductStatus> {
    match bytes {
        b"on_sale" => Some(ProductStatus::OnSale),
        b"delisted" => Some(ProductStatus::Delisted),
        _ => None,
    }
}

/// The key as the row spells it, for error messages about rows whose key may itself be corrupt.
fn raw_key(platform: &[u8], item_id: &[u8]) -> String {
    format!(
        "{}:{}",
        String::from_utf8_lossy(platform),
        String::from_utf8_lossy(item_id)
    )
}

/// A `(platform, item_id)` row as read for the key stream and the warm-up list. Bytes, for the
/// reason given on [`ProductRow`].
pub(crate) type KeyRow = (Vec<u8>, Vec<u8>);

/// The key of a [`KeyRow`] of `table`, or [`StoreError::CorruptRow`] naming it.
pub(crate) fn key_from_row(
    table: &str,
    (platform, item_id): KeyRow,
) -> Result<ItemKey, StoreError> {
    parse_key(&platform, &item_id).map_err(|reason| StoreError::CorruptRow {
        key: raw_key(&platform, &item_id),
        reason: format!("{table} key: {reason}"),
    })
}

/// A `products` row exactly as stored; [`ProductRow::into_versioned`] is the only way out.
///
/// The ASCII columns (key and status) are read as bytes: MySQL declares them `ascii_bin` (so that
/// `'Taobao'` is not `'taobao'`), which the protocol flags as binary and sqlx then refuses to
/// decode as `String`. Bytes also let a key that is not even UTF-8 be reported as a corrupt row.
#[derive(sqlx::FromRow)]
pub(crate) struct ProductRow {
    pub(crate) platform: Vec<u8>,
    pub(crate) item_id: Vec<u8>,
    pub(crate) title: String,
    pub(crate) price_cents: i64,
    pub(crate) image_url: String,
    pub(crate) shop_name: String,
    pub(crate) status: Vec<u8>,
    pub(crate) version: i64,
    pub(crate) updated_at_ms: i64,
}

impl ProductRow {
    pub(crate) fn into_versioned(self) -> Result<Versioned<Product>, StoreError> {
        let corrupt = |reason: String| StoreError::CorruptRow {
            key: raw_key(&self.platform, &self.item_id),
            reason,
        };
        let key = parse_key(&self.platform, &self.item_id)
            .map_err(|reason| corrupt(format!("products key: {reason}")))?;
        let price_cents = Cents::try_from(self.price_cents)
            .map_err(|error| corrupt(format!("products.price_cents: {error}")))?;
        let status = status_from_column(&self.status).ok_or_else(|| {
            corrupt(format!(
                "products.status is {:?}; expected on_sale or delisted",
                String::from_utf8_lossy(&self.status)
            ))
        })?;
        let version = parse_version(self.version)
            .map_err(|reason| corrupt(format!("products.version: {reason}")))?;
        Ok(Versioned {
            value: Product {
                platform: key.platform,
                item_id: key.item_id,
                title: self.title,
                price_cents,
                image_url: self.image_url,
                shop_name: self.shop_name,
                status,
            },
            version,
            updated_at: Timestamp::from_millis(self.updated_at_ms),
        })
    }
}

/// A `rebate_rates` row exactly as stored; [`RateRow::into_versioned`] is the only way out. Key
/// columns are bytes, as in [`ProductRow`].
#[derive(sqlx::FromRow)]
pub(crate) struct RateRow {
    pub(crate) platform: Vec<u8>,
    pub(crate) item_id: Vec<u8>,
    pub(crate) rate_bps: i64,
    pub(crate) version: i64,
    pub(crate) updated_at_ms: i64,
}

impl RateRow {
    pub(crate) fn into_versioned(self) -> Result<Versioned<RebateRate>, StoreError> {
        let corrupt = |reason: String| StoreError::CorruptRow {
            key: raw_key(&self.platform, &self.item_id),
            reason,
        };
        parse_key(&self.platform, &self.item_id)
            .map_err(|reason| corrupt(format!("rebate_rates key: {reason}")))?;
        let rate_bps = RateBps::try_from(self.rate_bps)
            .map_err(|error| corrupt(format!("rebate_rates.rate_bps: {error}")))?;
        let version = parse_version(self.version)
            .map_err(|reason| corrupt(format!("rebate_rates.version: {reason}")))?;
        Ok(Versioned {
            value: RebateRate { rate_bps },
            version,
            updated_at: Timestamp::from_millis(self.updated_at_ms),
        })
    }
}

fn parse_key(platform: &[u8], item_id: &[u8]) -> Result<ItemKey, String> {
    let (Ok(platform), Ok(item_id)) = (std::str::from_utf8(platform), std::str::from_utf8(item_id))
    else {
        return Err(String::from("not UTF-8"));
    };
    ItemKey::parse(platform, item_id).map_err(|error| error.to_string())
}

fn parse_version(version: i64) -> Result<u64, String> {
    u64::try_from(version).map_err(|_| format!("{version} is negative; versions only grow from 0"))
}

/// Asserts that the rows read back from a seeded store are exactly the demo catalogue (nothing
/// missing, extra, truncated or converted on the way). Shared by both stores' tests.
#[cfg(test)]
pub(crate) fn assert_rows_match_demo(products: Vec<ProductRow>, rates: Vec<RateRow>) {
    use std::collections::HashMap;

    let mut stored_rates: HashMap<ItemKey, Versioned<RebateRate>> = HashMap::new();
    for row in rates {
        let key =
            key_from_row("rebate_rates", (row.platform.clone(), row.item_id.clone())).unwrap();
        stored_rates.insert(key, row.into_versioned().unwrap());
    }
    let mut stored: HashMap<ItemKey, DemoItem> = HashMap::new();
    for row in products {
        let product = row.into_versioned().unwrap();
        let key = ItemKey::new(product.value.platform, product.value.item_id);
        let rate = stored_rates.remove(&key).expect("a rate for every product");
        stored.insert(key, DemoItem { product, rate });
    }
    assert!(stored_rates.is_empty());
    assert_eq!(stored.len(), 30_000);
    for item in crate::demo::demo_items() {
        assert_eq!(stored.get(&item.key()), Some(&item));
    }
}

//! The embedded SQLite catalogue behind the default profile.
//!
//! One database file in WAL mode, so readers never wait for the (rare) writer, read through a
//! small pool. Queries are plain runtime SQL (`sqlx::query_as`), prepared once per connection and
//! cached by sqlx, so no database is needed at build time. Every row is validated into domain
//! types on the way out; a row that breaks an invariant is a [`StoreError::CorruptRow`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rebate_domain::{
    Cents, ItemId, ItemKey, Platform, Product, ProductStatus, RateBps, RebateRate, Timestamp,
};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{QueryBuilder, Sqlite};

use crate::demo::{SeedReport, demo_hot_items, demo_items};
use crate::{CatalogRepository, StoreCounters, StoreError, Versioned};

/// The schema, embedded at compile time (`build.rs` rebuilds the crate when it changes).
static MIGRATOR: Migrator = sqlx::migrate!("../../migrations/sqlite");

/// How long a writer waits for another writer's lock before giving up. Readers never wait in WAL
/// mode, so this only bounds seeding and operator writes racing each other.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Rows per multi-row INSERT while seeding: 500 × 9 columns = 4,500 bind parameters, well below
/// SQLite's limit of 32,766, and few enough statements that 30,000 rows load in well under a second.
const SEED_ROWS_PER_STATEMENT: usize = 500;

const SELECT_PRODUCT: &str = "SELECT platform, item_id, title, price_cents, image_url, shop_name, \
     status, version, updated_at_ms FROM products WHERE platform = ?1 AND item_id = ?2";

const SELECT_RATE: &str = "SELECT platform, item_id, rate_bps, version, updated_at_ms \
     FROM rebate_rates WHERE platform = ?1 AND item_id = ?2";

const INSERT_PRODUCTS: &str = "INSERT INTO products (platform, item_id, title, price_cents, \
     image_url, shop_name, status, version, updated_at_ms) ";

const INSERT_RATES: &str =
    "INSERT INTO rebate_rates (platform, item_id, rate_bps, version, updated_at_ms) ";

/// Keeps what is already there: reseeding must not roll back a row an operator changed since.
const ON_KEY_CONFLICT_KEEP: &str = " ON CONFLICT (platform, item_id) DO NOTHING";

/// Where the catalogue lives and how many connections read it. Filled in by the service's config.
#[derive(Debug, Clone)]
pub struct SqliteSettings {
    /// The database file; it and its parent directory are created when missing.
    pub path: PathBuf,
    /// Upper bound on open connections. WAL lets them all read concurrently; 0 is treated as 1.
    pub max_connections: u32,
    /// How long a read waits for a free connection before failing with `PoolTimedOut`, which the
    /// loaders report as a timeout rather than an error.
    pub acquire_timeout: Duration,
}

/// The SQLite catalogue. Cloning is cheap and clones share the pool and the counters.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    counters: Arc<StoreCounters>,
}

impl SqliteStore {
    /// Opens (creating when missing) the database file and brings its schema up to date.
    pub async fn open(settings: &SqliteSettings) -> Result<Self, StoreError> {
        create_parent_dir(&settings.path).await?;
        let options = SqliteConnectOptions::new()
            .filename(&settings.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // With WAL, NORMAL only risks the last commits on power loss, never corruption.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(settings.max_connections.max(1))
            .acquire_timeout(settings.acquire_timeout)
            .connect_with(options)
            .await?;
        let store = Self::migrated(pool).await?;
        tracing::debug!(
            path = %settings.path.display(),
            max_connections = settings.max_connections,
            "sqlite catalogue opened"
        );
        Ok(store)
    }

    /// A private, migrated, empty in-memory catalogue for tests.
    ///
    /// Every connection to `:memory:` is a database of its own, so the pool holds exactly one
    /// connection and never retires it; concurrent reads queue on it.
    pub async fn in_memory() -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .in_memory(true)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await?;
        Self::migrated(pool).await
    }

    async fn migrated(pool: SqlitePool) -> Result<Self, StoreError> {
        MIGRATOR.run(&pool).await?;
        Ok(Self {
            pool,
            counters: Arc::new(StoreCounters::default()),
        })
    }

    /// The underlying pool, for tests and tools that need raw SQL.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Closes every connection (checkpointing the WAL); later calls fail with `PoolClosed`.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    pub async fn count_products(&self) -> Result<u64, StoreError> {
        self.count("SELECT COUNT(*) FROM products").await
    }

    pub async fn count_rates(&self) -> Result<u64, StoreError> {
        self.count("SELECT COUNT(*) FROM rebate_rates").await
    }

    async fn count(&self, sql: &'static str) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar(sql).fetch_one(&self.pool).await?;
        // COUNT(*) is never negative.
        Ok(u64::try_from(count).unwrap_or_default())
    }

    /// The warm-up list, hottest first (rank 1 of every platform, then rank 2, …), at most `limit`.
    pub async fn hot_keys(&self, limit: u32) -> Result<Vec<ItemKey>, StoreError> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT platform, item_id FROM hot_items \
             ORDER BY hot_rank, platform, item_id LIMIT ?1",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(platform, item_id)| {
                ItemKey::parse(&platform, &item_id).map_err(|error| StoreError::CorruptRow {
                    key: raw_key(&platform, &item_id),
                    reason: format!("hot_items key: {error}"),
                })
            })
            .collect()
    }

    /// Writes `product` as given, version included, replacing any existing row. No version fence:
    /// this is the operator's (and the tests') write path, not a cache.
    pub async fn upsert_product(&self, product: &Versioned<Product>) -> Result<(), StoreError> {
        let params = ProductParams::try_from(product)?;
        sqlx::query(
            "INSERT INTO products (platform, item_id, title, price_cents, image_url, shop_name, \
             status, version, updated_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (platform, item_id) DO UPDATE SET title = excluded.title, \
             price_cents = excluded.price_cents, image_url = excluded.image_url, \
             shop_name = excluded.shop_name, status = excluded.status, \
             version = excluded.version, updated_at_ms = excluded.updated_at_ms",
        )
        .bind(params.platform)
        .bind(params.item_id)
        .bind(params.title)
        .bind(params.price_cents)
        .bind(params.image_url)
        .bind(params.shop_name)
        .bind(params.status)
        .bind(params.version)
        .bind(params.updated_at_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Writes the rate of `key` as given, version included, replacing any existing row.
    pub async fn upsert_rate(
        &self,
        key: ItemKey,
        rate: &Versioned<RebateRate>,
    ) -> Result<(), StoreError> {
        let params = RateParams::new(key, rate)?;
        sqlx::query(
            "INSERT INTO rebate_rates (platform, item_id, rate_bps, version, updated_at_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (platform, item_id) DO UPDATE SET rate_bps = excluded.rate_bps, \
             version = excluded.version, updated_at_ms = excluded.updated_at_ms",
        )
        .bind(params.key.platform.as_str())
        .bind(params.key.item_id.as_str())
        .bind(params.rate_bps)
        .bind(params.version)
        .bind(params.updated_at_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Loads the demo catalogue (products, rates, hot items) in one transaction.
    ///
    /// Idempotent: rows already present are kept as they are, so running it again, or on a
    /// catalogue an operator has since changed, inserts only what is missing.
    pub async fn seed_demo(&self) -> Result<SeedReport, StoreError> {
        let started = Instant::now();
        let items: Vec<_> = demo_items().collect();
        let hot_items: Vec<_> = demo_hot_items().collect();

        let mut transaction = self.pool.begin().await?;
        let mut products = 0;
        let mut rates = 0;
        for chunk in items.chunks(SEED_ROWS_PER_STATEMENT) {
            let product_rows = chunk
                .iter()
                .map(|item| ProductParams::try_from(&item.product))
                .collect::<Result<Vec<_>, _>>()?;
            products += insert_products(&mut transaction, &product_rows).await?;
            let rate_rows = chunk
                .iter()
                .map(|item| RateParams::new(item.key(), &item.rate))
                .collect::<Result<Vec<_>, _>>()?;
            rates += insert_rates(&mut transaction, &rate_rows).await?;
        }
        let mut hot = 0;
        for chunk in hot_items.chunks(SEED_ROWS_PER_STATEMENT) {
            hot += insert_hot_items(&mut transaction, chunk).await?;
        }
        transaction.commit().await?;

        let report = SeedReport {
            products,
            rates,
            hot_items: hot,
            elapsed: started.elapsed(),
        };
        tracing::debug!(
            products,
            rates,
            hot_items = hot,
            elapsed_ms = report.elapsed.as_millis() as u64,
            "demo catalogue seeded"
        );
        Ok(report)
    }

    /// Seeds the demo catalogue only into an empty store, so a restart never touches data that is
    /// already there. `None` when the store already held products.
    pub async fn seed_demo_if_empty(&self) -> Result<Option<SeedReport>, StoreError> {
        if self.count_products().await? > 0 {
            return Ok(None);
        }
        self.seed_demo().await.map(Some)
    }
}

#[async_trait]
impl CatalogRepository for SqliteStore {
    async fn product(&self, key: ItemKey) -> Result<Option<Versioned<Product>>, StoreError> {
        self.counters.record_product_load();
        let row: Option<ProductRow> = sqlx::query_as(SELECT_PRODUCT)
            .bind(key.platform.as_str())
            .bind(key.item_id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(ProductRow::into_versioned).transpose()
    }

    async fn rate(&self, key: ItemKey) -> Result<Option<Versioned<RebateRate>>, StoreError> {
        self.counters.record_rate_load();
        let row: Option<RateRow> = sqlx::query_as(SELECT_RATE)
            .bind(key.platform.as_str())
            .bind(key.item_id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(RateRow::into_versioned).transpose()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn counters(&self) -> &StoreCounters {
        &self.counters
    }
}

async fn create_parent_dir(path: &Path) -> Result<(), StoreError> {
    let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    else {
        return Ok(());
    };
    tokio::fs::create_dir_all(parent)
        .await
        .map_err(|source| StoreError::Io {
            path: parent.display().to_string(),
            source,
        })
}

async fn insert_products(
    connection: &mut SqliteConnection,
    rows: &[ProductParams<'_>],
) -> Result<u64, StoreError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut builder = QueryBuilder::<Sqlite>::new(INSERT_PRODUCTS);
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
    builder.push(ON_KEY_CONFLICT_KEEP);
    let result = builder.build().execute(&mut *connection).await?;
    Ok(result.rows_affected())
}

async fn insert_rates(
    connection: &mut SqliteConnection,
    rows: &[RateParams],
) -> Result<u64, StoreError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut builder = QueryBuilder::<Sqlite>::new(INSERT_RATES);
    builder.push_values(rows, |mut values, row| {
        values
            .push_bind(row.key.platform.as_str())
            .push_bind(row.key.item_id.as_str())
            .push_bind(row.rate_bps)
            .push_bind(row.version)
            .push_bind(row.updated_at_ms);
    });
    builder.push(ON_KEY_CONFLICT_KEEP);
    let result = builder.build().execute(&mut *connection).await?;
    Ok(result.rows_affected())
}

async fn insert_hot_items(
    connection: &mut SqliteConnection,
    rows: &[(ItemKey, u32)],
) -> Result<u64, StoreError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut builder =
        QueryBuilder::<Sqlite>::new("INSERT INTO hot_items (platform, item_id, hot_rank) ");
    builder.push_values(rows, |mut values, (key, rank)| {
        values
            .push_bind(key.platform.as_str())
            .push_bind(key.item_id.as_str())
            .push_bind(i64::from(*rank));
    });
    builder.push(ON_KEY_CONFLICT_KEEP);
    let result = builder.build().execute(&mut *connection).await?;
    Ok(result.rows_affected())
}

/// A product as bound to SQL: integers already narrowed to `i64`, so a value that does not fit is
/// refused before any statement runs.
struct ProductParams<'a> {
    platform: &'static str,
    item_id: &'a str,
    title: &'a str,
    price_cents: i64,
    image_url: &'a str,
    shop_name: &'a str,
    status: &'static str,
    version: i64,
    updated_at_ms: i64,
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
struct RateParams {
    key: ItemKey,
    rate_bps: i64,
    version: i64,
    updated_at_ms: i64,
}

impl RateParams {
    fn new(key: ItemKey, rate: &Versioned<RebateRate>) -> Result<Self, StoreError> {
        Ok(Self {
            key,
            rate_bps: i64::from(rate.value.rate_bps.get()),
            version: to_column(key, "rebate_rates.version", rate.version)?,
            updated_at_ms: rate.updated_at.as_millis(),
        })
    }
}

/// Narrows an unsigned domain value to the signed `INTEGER` column holding it.
fn to_column(key: ItemKey, column: &str, value: u64) -> Result<i64, StoreError> {
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

fn status_from_column(text: &str) -> Option<ProductStatus> {
    match text {
        "on_sale" => Some(ProductStatus::OnSale),
        "delisted" => Some(ProductStatus::Delisted),
        _ => None,
    }
}

/// The key as the row spells it, for error messages about rows whose key may itself be corrupt.
fn raw_key(platform: &str, item_id: &str) -> String {
    format!("{platform}:{item_id}")
}

/// A `products` row exactly as stored; [`ProductRow::into_versioned`] is the only way out.
#[derive(sqlx::FromRow)]
struct ProductRow {
    platform: String,
    item_id: String,
    title: String,
    price_cents: i64,
    image_url: String,
    shop_name: String,
    status: String,
    version: i64,
    updated_at_ms: i64,
}

impl ProductRow {
    fn into_versioned(self) -> Result<Versioned<Product>, StoreError> {
        let corrupt = |reason: String| StoreError::CorruptRow {
            key: raw_key(&self.platform, &self.item_id),
            reason,
        };
        let (platform, item_id) = parse_key(&self.platform, &self.item_id)
            .map_err(|reason| corrupt(format!("products key: {reason}")))?;
        let price_cents = Cents::try_from(self.price_cents)
            .map_err(|error| corrupt(format!("products.price_cents: {error}")))?;
        let status = status_from_column(&self.status).ok_or_else(|| {
            corrupt(format!(
                "products.status is {:?}; expected on_sale or delisted",
                self.status
            ))
        })?;
        let version = parse_version(self.version)
            .map_err(|reason| corrupt(format!("products.version: {reason}")))?;
        Ok(Versioned {
            value: Product {
                platform,
                item_id,
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

/// A `rebate_rates` row exactly as stored; [`RateRow::into_versioned`] is the only way out.
#[derive(sqlx::FromRow)]
struct RateRow {
    platform: String,
    item_id: String,
    rate_bps: i64,
    version: i64,
    updated_at_ms: i64,
}

impl RateRow {
    fn into_versioned(self) -> Result<Versioned<RebateRate>, StoreError> {
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

fn parse_key(platform: &str, item_id: &str) -> Result<(Platform, ItemId), String> {
    ItemKey::parse(platform, item_id)
        .map(|key| (key.platform, key.item_id))
        .map_err(|error| error.to_string())
}

fn parse_version(version: i64) -> Result<u64, String> {
    u64::try_from(version).map_err(|_| format!("{version} is negative; versions only grow from 0"))
}

#[cfg(test)]
mod tests;

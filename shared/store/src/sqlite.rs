//! The embedded SQLite catalogue behind the default profile.
//!
//! One database file in WAL mode, so readers never wait for the (rare) writer, read through a
//! small pool. Queries are plain runtime SQL (`sqlx::query_as`), prepared once per connection and
//! cached by sqlx, so no database is needed at build time. Every row is validated into domain
//! types on the way out; a row that breaks an invariant is a [`StoreError::CorruptRow`].
//!
//! It holds the rule sets of the embedded profile too ([`RuleRepository`], written once in
//! [`crate::rules`]); this file adds only their SQLite dialect.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use rebate_domain::{ItemKey, Product, RebateRate, Timestamp};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{QueryBuilder, Sqlite};

use crate::demo::{SeedReport, demo_hot_items, demo_items};
use crate::rows::{
    DemoBatch, KeyRow, ProductParams, ProductRow, RateParams, RateRow, insert_hot_items,
    insert_products, insert_rates, key_from_row,
};
use crate::rules::sql::{RuleDialect, RuleTables};
use crate::rules::{InstanceReport, NewRuleSet, RuleRepository, RuleSetRow, RuleState};
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

/// The primary key's order: platform, then item id, both compared as bytes.
const SELECT_KEYS: &str = "SELECT platform, item_id FROM products ORDER BY platform, item_id";

const SELECT_HOT_KEYS: &str =
    "SELECT platform, item_id FROM hot_items ORDER BY hot_rank, platform, item_id LIMIT ?1";

/// Keeps what is already there; see [`insert_keeping_existing`].
const ON_KEY_CONFLICT_KEEP: &str = " ON CONFLICT (platform, item_id) DO NOTHING";

/// Where the catalogue lives and how many connections read it. Filled in by the service's config.
#[derive(Debug, Clone)]
pub struct SqliteConfig {
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
    pub async fn open(settings: &SqliteConfig) -> Result<Self, StoreError> {
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
    #[expect(
        clippy::disallowed_methods,
        reason = "the seed's duration is reported, nothing depends on it"
    )]
    pub async fn seed_demo(&self) -> Result<SeedReport, StoreError> {
        let started = Instant::now();
        let items: Vec<_> = demo_items().collect();
        let hot_items: Vec<_> = demo_hot_items().collect();

        let mut transaction = self.pool.begin().await?;
        let mut products = 0;
        let mut rates = 0;
        for chunk in items.chunks(SEED_ROWS_PER_STATEMENT) {
            let batch = DemoBatch::new(chunk)?;
            products += insert_keeping_existing(
                &mut transaction,
                insert_products("INSERT", &batch.products),
            )
            .await?;
            rates +=
                insert_keeping_existing(&mut transaction, insert_rates("INSERT", &batch.rates))
                    .await?;
        }
        let mut hot = 0;
        for chunk in hot_items.chunks(SEED_ROWS_PER_STATEMENT) {
            hot += insert_keeping_existing(&mut transaction, insert_hot_items("INSERT", chunk))
                .await?;
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

    /// Answers, and every migration this build knows has been applied successfully.
    async fn ping(&self) -> Result<(), StoreError> {
        let (applied,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM _sqlx_migrations WHERE success = TRUE")
                .fetch_one(&self.pool)
                .await?;
        crate::check_migrations(applied, MIGRATOR.iter().count())
    }

    /// One `SELECT` over the primary key, read row by row: the stream holds one pooled connection
    /// (and SQLite's read snapshot) until it ends or is dropped.
    fn keys(&self) -> BoxStream<'_, Result<ItemKey, StoreError>> {
        sqlx::query_as::<_, KeyRow>(SELECT_KEYS)
            .fetch(&self.pool)
            .map(|row| key_from_row("products", row?))
            .boxed()
    }

    /// Rank 1 of every platform, then rank 2, …
    async fn hot_keys(&self, limit: u32) -> Result<Vec<ItemKey>, StoreError> {
        let rows: Vec<KeyRow> = sqlx::query_as(SELECT_HOT_KEYS)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|row| key_from_row("hot_items", row))
            .collect()
    }

    fn counters(&self) -> &StoreCounters {
        &self.counters
    }
}

/// Rule sets: the shared SQL of `crate::rules` on this store's pool.
#[async_trait]
impl RuleRepository for SqliteStore {
    async fn insert_rule_set(&self, new: &NewRuleSet, now: Timestamp) -> Result<u64, StoreError> {
        RuleTables::new(&self.pool).insert_rule_set(new, now).await
    }

    async fn rule_set(&self, version: u64) -> Result<Option<RuleSetRow>, StoreError> {
        RuleTables::new(&self.pool).rule_set(version).await
    }

    async fn rule_sets(
        &self,
        limit: u32,
        before: Option<u64>,
    ) -> Result<Vec<RuleSetRow>, StoreError> {
        RuleTables::new(&self.pool).rule_sets(limit, before).await
    }

    async fn active_rule_set(&self) -> Result<Option<RuleSetRow>, StoreError> {
        RuleTables::new(&self.pool).active_rule_set().await
    }

    async fn rule_sets_in(&self, states: &[RuleState]) -> Result<Vec<RuleSetRow>, StoreError> {
        RuleTables::new(&self.pool).rule_sets_in(states).await
    }

    async fn transition_rule_set(
        &self,
        version: u64,
        from: &[RuleState],
        to: RuleState,
        verdict: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        RuleTables::new(&self.pool)
            .transition_rule_set(version, from, to, verdict, now)
            .await
    }

    async fn report_instance(&self, report: &InstanceReport) -> Result<(), StoreError> {
        RuleTables::new(&self.pool).report_instance(report).await
    }

    async fn instance_reports(&self, since: Timestamp) -> Result<Vec<InstanceReport>, StoreError> {
        RuleTables::new(&self.pool).instance_reports(since).await
    }

    async fn forget_instances(&self, before: Timestamp) -> Result<u64, StoreError> {
        RuleTables::new(&self.pool).forget_instances(before).await
    }
}

impl RuleDialect for Sqlite {
    /// Takes the write lock at once, so writers queue (up to `BUSY_TIMEOUT`) and never
    /// interleave. A deferred `BEGIN` that reads first could not become a writer after another
    /// writer committed: WAL mode fails that upgrade at once (`SQLITE_BUSY_SNAPSHOT`) instead of
    /// waiting.
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";

    /// A plain read: `BEGIN IMMEDIATE` already keeps every other writer out.
    const SELECT_STATE_FOR_UPDATE: &'static str = "SELECT state FROM rule_sets WHERE version = ?";

    const UPSERT_INSTANCE: &'static str = "INSERT INTO rule_instances (instance_id, \
         applied_version, reported_at_ms, report) VALUES (?, ?, ?, ?) \
         ON CONFLICT (instance_id) DO UPDATE SET applied_version = excluded.applied_version, \
         reported_at_ms = excluded.reported_at_ms, report = excluded.report";

    /// Writers never interleave, so none loses a race; a lock held past the busy timeout is an
    /// error.
    fn lost_race(_error: &sqlx::Error) -> bool {
        false
    }

    fn rows_affected(result: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        result.rows_affected()
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

/// Runs a multi-row `INSERT` built by [`crate::rows`], keeping rows whose key already exists
/// (reseeding must not roll back a row an operator changed since); returns the rows inserted.
async fn insert_keeping_existing(
    connection: &mut SqliteConnection,
    mut insert: QueryBuilder<'_, Sqlite>,
) -> Result<u64, StoreError> {
    insert.push(ON_KEY_CONFLICT_KEEP);
    let result = insert.build().execute(&mut *connection).await?;
    Ok(result.rows_affected())
}

#[cfg(test)]
mod tests;

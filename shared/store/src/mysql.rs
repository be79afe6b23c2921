//! The production catalogue on MySQL 8 / MariaDB 10.11.
//!
//! Same tables, invariants and row validation as [`crate::sqlite`] (the row mapping is shared);
//! what differs is the pool. It is tuned for a hot path of point selects by primary key:
//!
//! - **Per query** the pool makes one extra round trip, where sqlx's defaults make two (pinned
//!   by the test `the_pool_pings_once_per_query_on_release_only`). The default
//!   `test_before_acquire(true)` sends a `COM_PING` before handing out an idle connection; we turn
//!   it off, so an acquire takes an idle connection (or opens one) without touching the network.
//!   On release, sqlx 0.8 *always* pings (`Floating::return_to_pool` in
//!   `sqlx-core/src/pool/connection.rs`; no option disables it, and `after_release` runs before
//!   it, not instead): the dropped `PoolConnection` spawns a task that pings and only then puts
//!   the connection back in the idle queue. That ping is off the caller's path (its query has
//!   already returned) but costs the server a round trip and keeps the connection out of the pool
//!   meanwhile. It also drains a result set left half-read by a dropped stream, so we keep it
//!   rather than bypass the pool. A connection that died while idle is therefore found by the
//!   query that gets it failing, not by a ping; `max_lifetime` stays at sqlx's 30 minutes.
//! - **Statements** are prepared once per connection and cached by sqlx, so a point select is one
//!   `COM_STMT_EXECUTE` round trip.
//! - **Statement timeout**: every pooled connection gets a per-session limit in `after_connect`,
//!   once per connection, not per query (see [`MySqlConfig::statement_timeout`]).
//! - **Key scans** ([`CatalogRepository::keys`]) are paged, so no statement outlives the timeout.
//! - **Migrations** run on a connection of their own before the pool opens, so a long schema
//!   change is not cut short by the statement timeout meant for reads.
//!
//! The rule sets ([`RuleRepository`]) are written once in [`crate::rules`]; this file adds their
//! MySQL dialect: row locks, the upsert, and which errors mean a writer lost a race.
//!
//! The connection URL (usually from `DATABASE_URL`) carries credentials: it is never logged, and
//! [`MySqlConfig`]' `Debug` shows it without them.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use rebate_domain::{ItemKey, Product, RebateRate, Timestamp};
use sqlx::migrate::Migrator;
use sqlx::mysql::{
    MySqlConnectOptions, MySqlConnection, MySqlDatabaseError, MySqlPool, MySqlPoolOptions,
};
use sqlx::{ConnectOptions, Connection, Executor, MySql, QueryBuilder};
use tokio::task::JoinHandle;

use crate::demo::{SeedReport, demo_hot_items, demo_items};
use crate::rows::{
    DemoBatch, KeyRow, ProductParams, ProductRow, RateParams, RateRow, insert_hot_items,
    insert_products, insert_rates, key_from_row,
};
use crate::rules::sql::{RuleDialect, RuleTables};
use crate::rules::{InstanceReport, NewRuleSet, RuleRepository, RuleSetRow, RuleState};
use crate::{CatalogRepository, StoreCounters, StoreError, Versioned};

/// The schema, embedded at compile time (`build.rs` rebuilds the crate when it changes).
static MIGRATOR: Migrator = sqlx::migrate!("../../migrations/mysql");

/// Rows per multi-row INSERT while seeding: 1,000 × 9 columns = 9,000 bind parameters, well below
/// the protocol's 65,535, and about 200 KB per statement, far below `max_allowed_packet`.
const SEED_ROWS_PER_STATEMENT: usize = 1_000;

/// Seeding keeps rows whose key already exists (reseeding must not roll back a row an operator
/// changed since), and `rows_affected` then counts exactly the rows inserted.
///
/// Why not `ON DUPLICATE KEY UPDATE` with a no-op: sqlx always sets `CLIENT_FOUND_ROWS`, so such an
/// update counts every existing row as affected and a second seed could not report zero. `IGNORE`
/// also turns a CHECK or truncation error into a warning; that is acceptable only because the
/// rows are generated from domain types that satisfy the CHECKs, and tests read every one back.
const INSERT_KEEPING_EXISTING: &str = "INSERT IGNORE";

/// Keys per page of [`CatalogRepository::keys`]: about 10 ms of server time each (1,000,000 keys
/// stream in about a second), far inside any sensible statement timeout, and at most a few
/// hundred kilobytes held at once.
const KEYS_PER_PAGE: usize = 10_000;

/// MySQL and MariaDB's "Unknown system variable" error number.
const ER_UNKNOWN_SYSTEM_VARIABLE: u16 = 1193;

/// The errors of a writing transaction that lost a race and wrote nothing (see
/// [`RuleDialect::lost_race`]): a duplicate key (a version another writer took, or a second
/// active row), a deadlock, and a row changed since the snapshot read it (MariaDB 11.6+ with
/// `innodb_snapshot_isolation`).
const ER_DUP_ENTRY: u16 = 1062;
const ER_LOCK_DEADLOCK: u16 = 1213;
const ER_CHECKREAD: u16 = 1020;

const SELECT_PRODUCT: &str = "SELECT platform, item_id, title, price_cents, image_url, shop_name, \
     status, version, updated_at_ms FROM products WHERE platform = ? AND item_id = ?";

const SELECT_RATE: &str = "SELECT platform, item_id, rate_bps, version, updated_at_ms \
     FROM rebate_rates WHERE platform = ? AND item_id = ?";

const SELECT_FIRST_KEYS: &str =
    "SELECT platform, item_id FROM products ORDER BY platform, item_id LIMIT ?";

/// Written as an `OR` rather than `(platform, item_id) > (?, ?)`: MariaDB 10.11 plans the row
/// comparison as a full index scan, the `OR` as a range on the primary key.
const SELECT_KEYS_AFTER: &str = "SELECT platform, item_id FROM products \
     WHERE platform > ? OR (platform = ? AND item_id > ?) ORDER BY platform, item_id LIMIT ?";

const SELECT_HOT_KEYS: &str =
    "SELECT platform, item_id FROM hot_items ORDER BY hot_rank, platform, item_id LIMIT ?";

/// Where the catalogue lives and how the pool behaves. Filled in by the service's config.
#[derive(Clone)]
pub struct MySqlConfig {
    /// `mysql://user:password@host:3306/database`, conventionally from `DATABASE_URL`. Holds a
    /// secret: never logged, and redacted by `Debug`.
    pub url: String,
    /// Upper bound on open connections: caps the load one instance puts on the database. 0 is
    /// treated as 1.
    pub max_connections: u32,
    /// Connections kept open even when idle, so a burst after a quiet spell does not pay for
    /// handshakes. Capped at `max_connections`.
    pub min_connections: u32,
    /// How long a read waits for a free connection before failing with `PoolTimedOut`, which the
    /// loaders report as a timeout rather than an error (so it degrades instead of queueing).
    pub acquire_timeout: Duration,
    /// Per-session bound on a statement's run time, so a runaway query frees its connection.
    /// MariaDB applies it to every statement (`max_statement_time`); MySQL 8 only to read-only
    /// `SELECT`s (`max_execution_time`). Zero means no limit.
    pub statement_timeout: Duration,
    /// Idle connections above `min_connections` are closed after this long; `None` keeps them.
    pub idle_timeout: Option<Duration>,
}

impl MySqlConfig {
    /// The acquire timeout of issue #3: a read that cannot get a connection in half a second is
    /// better served stale than late.
    pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_millis(500);

    /// Settings for `url` with defaults sized for one query-api instance.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 16,
            min_connections: 2,
            acquire_timeout: Self::DEFAULT_ACQUIRE_TIMEOUT,
            statement_timeout: Duration::from_secs(2),
            idle_timeout: Some(Duration::from_secs(600)),
        }
    }
}

impl fmt::Debug for MySqlConfig {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("MySqlConfig")
            .field("url", &redacted_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("min_connections", &self.min_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

/// `scheme://host:port/database` without user, password or query parameters. Everything before
/// the last `@` is dropped, so a password holding an unescaped `@`, `/` or `?` is never shown.
fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return String::from("<redacted>");
    };
    // Credentials first: a password may hold an unescaped `?` or `#` as well.
    let after_credentials = rest
        .rsplit_once('@')
        .map_or(rest, |(_credentials, after)| after);
    let host_and_path = after_credentials
        .split(['?', '#'])
        .next()
        .unwrap_or_default();
    format!("{scheme}://{host_and_path}")
}

/// The MySQL catalogue. Cloning is cheap and clones share the pool and the counters.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    counters: Arc<StoreCounters>,
}

impl MySqlStore {
    /// Brings the schema up to date, then opens the pool (at least one connection, so a wrong
    /// URL or password fails here rather than on the first query).
    pub async fn connect(settings: &MySqlConfig) -> Result<Self, StoreError> {
        let options = MySqlConnectOptions::from_str(&settings.url)?;
        let mut migration_connection = options.connect().await?;
        MIGRATOR.run(&mut migration_connection).await?;
        migration_connection.close().await?;

        let max_connections = settings.max_connections.max(1);
        let statement_timeout = StatementTimeout::new(settings.statement_timeout);
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .min_connections(settings.min_connections.min(max_connections))
            .acquire_timeout(settings.acquire_timeout)
            .idle_timeout(settings.idle_timeout)
            // No ping before each acquire; see the module docs for what the pool does instead.
            .test_before_acquire(false)
            .after_connect(move |connection, _metadata| statement_timeout.clone().apply(connection))
            .connect_with(options.clone())
            .await?;
        tracing::debug!(
            host = options.get_host(),
            database = options.get_database().unwrap_or_default(),
            max_connections,
            statement_timeout_ms = settings.statement_timeout.as_millis() as u64,
            "mysql catalogue connected"
        );
        Ok(Self {
            pool,
            counters: Arc::new(StoreCounters::default()),
        })
    }

    /// The underlying pool, for tests and tools that need raw SQL.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Closes every connection; later calls fail with `PoolClosed`.
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
        // `VALUES(column)` rather than MySQL 8.0.19's row alias, which MariaDB does not parse.
        sqlx::query(
            "INSERT INTO products (platform, item_id, title, price_cents, image_url, shop_name, \
             status, version, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE title = VALUES(title), price_cents = VALUES(price_cents), \
             image_url = VALUES(image_url), shop_name = VALUES(shop_name), \
             status = VALUES(status), version = VALUES(version), \
             updated_at_ms = VALUES(updated_at_ms)",
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
             VALUES (?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE rate_bps = VALUES(rate_bps), version = VALUES(version), \
             updated_at_ms = VALUES(updated_at_ms)",
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
            products += execute_insert(
                &mut transaction,
                insert_products(INSERT_KEEPING_EXISTING, &batch.products),
            )
            .await?;
            rates += execute_insert(
                &mut transaction,
                insert_rates(INSERT_KEEPING_EXISTING, &batch.rates),
            )
            .await?;
        }
        let mut hot = 0;
        for chunk in hot_items.chunks(SEED_ROWS_PER_STATEMENT) {
            hot += execute_insert(
                &mut transaction,
                insert_hot_items(INSERT_KEEPING_EXISTING, chunk),
            )
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
        // EXISTS stops at the first row; COUNT(*) would scan a production-sized table.
        let has_products: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM products)")
            .fetch_one(&self.pool)
            .await?;
        if has_products {
            return Ok(None);
        }
        self.seed_demo().await.map(Some)
    }
}

#[async_trait]
impl CatalogRepository for MySqlStore {
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

    /// Pages of 10,000 keys (`KEYS_PER_PAGE`), each its own short `SELECT` resuming after the
    /// last key of the page before (a range scan of the clustered primary key). The next page is
    /// fetched while the consumer works through the current one, so the server and the consumer
    /// overlap as they would on one streamed `SELECT`; at most two pages are held at once.
    ///
    /// Not one `SELECT` streamed to the end: the statement timeout covers the time the server
    /// spends *sending* rows, so a single scan of a large catalogue (or one read by a slow
    /// consumer) is killed part-way — measured: a 300 ms limit cut a 1,000,000-key scan at about
    /// 400,000 keys. Here no statement ever waits for the consumer, and the connection goes back
    /// to the pool between pages. The price is that the keys are not one snapshot: a product
    /// added or removed during the scan may or may not be seen, which a Bloom filter kept up to
    /// date by change events tolerates.
    fn keys(&self) -> BoxStream<'_, Result<ItemKey, StoreError>> {
        let pool = self.pool.clone();
        futures::stream::try_unfold(KeyPages::First, move |pages| {
            let pool = pool.clone();
            async move {
                let page = match pages {
                    KeyPages::First => key_page(&pool, &KeyCursor::Start).await?,
                    KeyPages::Next(mut prefetched) => prefetched.wait().await?,
                    KeyPages::Done => return Ok::<_, StoreError>(None),
                };
                let next = match KeyCursor::after(&page) {
                    Some(cursor) => KeyPages::Next(PrefetchedPage::spawn(pool, cursor)),
                    None => KeyPages::Done,
                };
                let keys = page.into_iter().map(|row| key_from_row("products", row));
                Ok(Some((futures::stream::iter(keys), next)))
            }
        })
        .try_flatten()
        .boxed()
    }

    /// Rank 1 of every platform, then rank 2, …
    async fn hot_keys(&self, limit: u32) -> Result<Vec<ItemKey>, StoreError> {
        let rows: Vec<KeyRow> = sqlx::query_as(SELECT_HOT_KEYS)
            .bind(limit)
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
impl RuleRepository for MySqlStore {
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

impl RuleDialect for MySql {
    const BEGIN_WRITE: &'static str = "BEGIN";

    const SELECT_STATE_FOR_UPDATE: &'static str =
        "SELECT state FROM rule_sets WHERE version = ? FOR UPDATE";

    /// `VALUES(column)` rather than MySQL 8.0.19's row alias, which MariaDB does not parse.
    const UPSERT_INSTANCE: &'static str = "INSERT INTO rule_instances (instance_id, \
         applied_version, reported_at_ms, report) VALUES (?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE applied_version = VALUES(applied_version), \
         reported_at_ms = VALUES(reported_at_ms), report = VALUES(report)";

    fn lost_race(error: &sqlx::Error) -> bool {
        error
            .as_database_error()
            .and_then(|database_error| database_error.try_downcast_ref::<MySqlDatabaseError>())
            .is_some_and(|mysql_error| {
                matches!(
                    mysql_error.number(),
                    ER_DUP_ENTRY | ER_LOCK_DEADLOCK | ER_CHECKREAD
                )
            })
    }

    fn rows_affected(result: &sqlx::mysql::MySqlQueryResult) -> u64 {
        result.rows_affected()
    }
}

/// Runs a multi-row `INSERT` built by [`crate::rows`]; returns the rows inserted.
async fn execute_insert(
    connection: &mut MySqlConnection,
    mut insert: QueryBuilder<'_, MySql>,
) -> Result<u64, StoreError> {
    let result = insert.build().execute(&mut *connection).await?;
    Ok(result.rows_affected())
}

/// Where [`CatalogRepository::keys`] stands: before its first page, waiting for a page fetched
/// ahead, or past the last page.
enum KeyPages {
    First,
    Next(PrefetchedPage),
    Done,
}

/// Where a page of keys starts.
enum KeyCursor {
    Start,
    After { platform: String, item_id: String },
}

impl KeyCursor {
    /// The cursor after `page`, or `None` when `page` was the last one (not full).
    fn after(page: &[KeyRow]) -> Option<Self> {
        if page.len() < KEYS_PER_PAGE {
            return None;
        }
        let (platform, item_id) = page.last()?;
        Some(Self::After {
            // ASCII columns: always valid UTF-8.
            platform: String::from_utf8_lossy(platform).into_owned(),
            item_id: String::from_utf8_lossy(item_id).into_owned(),
        })
    }
}

/// One page of [`CatalogRepository::keys`], in primary-key order.
async fn key_page(pool: &MySqlPool, cursor: &KeyCursor) -> Result<Vec<KeyRow>, StoreError> {
    let page = match cursor {
        KeyCursor::Start => {
            sqlx::query_as(SELECT_FIRST_KEYS)
                .bind(KEYS_PER_PAGE as u64)
                .fetch_all(pool)
                .await?
        }
        KeyCursor::After { platform, item_id } => {
            sqlx::query_as(SELECT_KEYS_AFTER)
                .bind(platform.as_str())
                .bind(platform.as_str())
                .bind(item_id.as_str())
                .bind(KEYS_PER_PAGE as u64)
                .fetch_all(pool)
                .await?
        }
    };
    Ok(page)
}

/// A page being fetched by a task of its own. Aborted when dropped, so a key stream dropped
/// part-way stops fetching (the pool then drains and reuses the connection).
struct PrefetchedPage(JoinHandle<Result<Vec<KeyRow>, StoreError>>);

impl PrefetchedPage {
    fn spawn(pool: MySqlPool, cursor: KeyCursor) -> Self {
        Self(tokio::spawn(async move { key_page(&pool, &cursor).await }))
    }

    async fn wait(&mut self) -> Result<Vec<KeyRow>, StoreError> {
        match (&mut self.0).await {
            Ok(page) => page,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // Only the runtime shutting down cancels it: `Drop` is the one other abort.
            Err(_cancelled) => Err(StoreError::Closed),
        }
    }
}

impl Drop for PrefetchedPage {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sets the session's statement timeout on each new pooled connection, in whichever dialect the
/// server speaks. The dialect is found on the first connection and remembered by all clones, so
/// later connections pay exactly one `SET` (text protocol, one round trip) and no probing.
#[derive(Debug, Clone)]
struct StatementTimeout {
    limit: Duration,
    dialect: Arc<OnceLock<TimeoutDialect>>,
}

#[derive(Debug, Clone, Copy)]
enum TimeoutDialect {
    /// `max_statement_time`, in seconds with microsecond precision, every statement.
    MariaDb,
    /// `max_execution_time`, in whole milliseconds, read-only `SELECT`s only.
    MySql,
}

impl StatementTimeout {
    fn new(limit: Duration) -> Self {
        Self {
            limit,
            dialect: Arc::new(OnceLock::new()),
        }
    }

    fn apply(self, connection: &mut MySqlConnection) -> BoxFuture<'_, Result<(), sqlx::Error>> {
        Box::pin(async move {
            if let Some(dialect) = self.dialect.get() {
                return connection
                    .execute(self.statement(*dialect).as_str())
                    .await
                    .map(drop);
            }
            // MariaDB first: it is what production runs. MySQL 8 refuses the variable by name.
            let mariadb = self.statement(TimeoutDialect::MariaDb);
            let dialect = match connection.execute(mariadb.as_str()).await {
                Ok(_) => TimeoutDialect::MariaDb,
                Err(error) if is_unknown_system_variable(&error) => {
                    let mysql = self.statement(TimeoutDialect::MySql);
                    connection.execute(mysql.as_str()).await?;
                    TimeoutDialect::MySql
                }
                Err(error) => return Err(error),
            };
            // Another connection may have raced us to it; both found the same server.
            let _ = self.dialect.set(dialect);
            Ok(())
        })
    }

    /// The `SET` for `dialect`; sent as text (no prepare, one round trip).
    fn statement(&self, dialect: TimeoutDialect) -> String {
        match dialect {
            TimeoutDialect::MariaDb => format!(
                "SET SESSION max_statement_time = {}.{:06}",
                self.limit.as_secs(),
                self.limit.subsec_micros()
            ),
            TimeoutDialect::MySql => {
                // Round a sub-millisecond limit up: 0 would mean "no limit".
                let mut millis = u32::try_from(self.limit.as_millis()).unwrap_or(u32::MAX);
                if millis == 0 && !self.limit.is_zero() {
                    millis = 1;
                }
                format!("SET SESSION max_execution_time = {millis}")
            }
        }
    }
}

fn is_unknown_system_variable(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|database_error| database_error.try_downcast_ref::<MySqlDatabaseError>())
        .is_some_and(|mysql_error| mysql_error.number() == ER_UNKNOWN_SYSTEM_VARIABLE)
}

#[cfg(test)]
mod tests;

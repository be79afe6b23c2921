//! The store contract ([`crate::contract`]) against a real server
//! ([`crate::testing::test_mysql_url`]), one fresh database per test, then what only the MySQL
//! store does: migrate on connect, page the key scan under the statement timeout, bound the pool.
#![allow(
    clippy::disallowed_methods,
    reason = "tests against a real MariaDB measure its pool timeout on the wall clock"
)]

use futures::TryStreamExt;

use super::*;
use crate::contract::{
    ContractStore, SELECT_ALL_PRODUCT_ROWS, SELECT_ALL_RATE_ROWS, contract_suite,
    demo_keys_in_key_order, key,
};
use crate::testing::{TestDatabase, fresh_mysql_database, test_mysql_url};

fn settings(url: &str) -> MySqlConfig {
    MySqlConfig {
        url: url.to_owned(),
        max_connections: 4,
        min_connections: 0,
        acquire_timeout: Duration::from_secs(5),
        statement_timeout: Duration::from_secs(5),
        idle_timeout: None,
    }
}

/// A migrated, empty store on a database of its own. Pass both to [`finish`] at the end.
async fn fresh_store(prefix: &str) -> (TestDatabase, String, MySqlStore) {
    let (url, database) = fresh_mysql_database(&test_mysql_url(), prefix)
        .await
        .unwrap();
    let store = MySqlStore::connect(&settings(&url)).await.unwrap();
    (database, url, store)
}

async fn finish(database: TestDatabase, store: MySqlStore) {
    store.close().await;
    database.drop_database().await.unwrap();
}

async fn table_names(store: &MySqlStore) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
         WHERE table_schema = DATABASE() ORDER BY table_name",
    )
    .fetch_all(store.pool())
    .await
    .unwrap()
}

async fn applied_migrations(store: &MySqlStore) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// A throw-away database per test, named after it; [`TestDatabase`] drops it also when the check
/// panics.
#[async_trait(?Send)]
impl ContractStore for MySqlStore {
    type Storage = TestDatabase;

    async fn open_fresh(test: &str) -> (Self, TestDatabase) {
        let (database, _url, store) = fresh_store(test).await;
        (store, database)
    }

    async fn finish(self, database: TestDatabase) {
        finish(database, self).await;
    }

    async fn upsert_product(&self, product: &Versioned<Product>) -> Result<(), StoreError> {
        Self::upsert_product(self, product).await
    }

    async fn upsert_rate(
        &self,
        key: ItemKey,
        rate: &Versioned<RebateRate>,
    ) -> Result<(), StoreError> {
        Self::upsert_rate(self, key, rate).await
    }

    async fn seed_demo(&self) -> Result<SeedReport, StoreError> {
        Self::seed_demo(self).await
    }

    async fn seed_demo_if_empty(&self) -> Result<Option<SeedReport>, StoreError> {
        Self::seed_demo_if_empty(self).await
    }

    async fn count_products(&self) -> Result<u64, StoreError> {
        Self::count_products(self).await
    }

    async fn count_rates(&self) -> Result<u64, StoreError> {
        Self::count_rates(self).await
    }

    async fn close(&self) {
        Self::close(self).await;
    }

    async fn execute_sql(&self, statement: &str) -> Result<(), StoreError> {
        sqlx::query(statement).execute(self.pool()).await?;
        Ok(())
    }

    /// A connection of its own to the same database (the pool's options) with MariaDB's session
    /// switch for CHECK constraints off.
    async fn execute_unchecked(&self, statements: &[&str]) {
        let options = self.pool().connect_options();
        let mut connection = MySqlConnection::connect_with(&options).await.unwrap();
        sqlx::raw_sql("SET SESSION check_constraint_checks = OFF")
            .execute(&mut connection)
            .await
            .unwrap();
        for statement in statements {
            sqlx::query(statement)
                .execute(&mut connection)
                .await
                .unwrap();
        }
        connection.close().await.unwrap();
    }

    async fn stored_rows(&self) -> (Vec<ProductRow>, Vec<RateRow>) {
        let products = sqlx::query_as(SELECT_ALL_PRODUCT_ROWS)
            .fetch_all(self.pool())
            .await
            .unwrap();
        let rates = sqlx::query_as(SELECT_ALL_RATE_ROWS)
            .fetch_all(self.pool())
            .await
            .unwrap();
        (products, rates)
    }
}

contract_suite!(MySqlStore);

#[tokio::test]
async fn connect_migrates_a_fresh_database_and_migrating_again_is_harmless() {
    let (database, url, store) = fresh_store("store_migrate").await;

    let tables = table_names(&store).await;
    for table in [
        "_sqlx_migrations",
        "hot_items",
        "products",
        "rebate_rates",
        "rule_instances",
        "rule_sets",
    ] {
        assert!(
            tables.iter().any(|name| name == table),
            "{table} missing: {tables:?}"
        );
    }
    store.ping().await.unwrap();
    assert_eq!(store.count_products().await.unwrap(), 0);

    let again = MySqlStore::connect(&settings(&url)).await.unwrap();
    MIGRATOR.run(again.pool()).await.unwrap();

    let expected = i64::try_from(MIGRATOR.iter().count()).unwrap();
    assert_eq!(applied_migrations(&again).await, expected);
    assert_eq!(table_names(&again).await, tables);
    again.close().await;
    finish(database, store).await;
}

/// The key scan is paged, so a consumer slower than the statement timeout still gets every key:
/// no statement spans the pause (a single streamed `SELECT` would be killed part-way).
#[tokio::test]
async fn a_consumer_slower_than_the_statement_timeout_still_gets_every_key() {
    let (database, url, store) = fresh_store("store_slow_keys").await;
    store.seed_demo().await.unwrap();
    let expected = demo_keys_in_key_order();
    let strict = MySqlStore::connect(&MySqlConfig {
        statement_timeout: Duration::from_secs(1),
        ..settings(&url)
    })
    .await
    .unwrap();

    let mut keys = strict.keys();
    let first = keys.try_next().await.unwrap();
    // The server's timeout runs on its own clock: only a real pause longer than it shows this.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let rest: Vec<ItemKey> = keys.try_collect().await.unwrap();

    assert_eq!(first.as_ref(), expected.first());
    assert_eq!(rest, expected[1..]);
    strict.close().await;
    finish(database, store).await;
}

#[tokio::test]
async fn the_statement_timeout_applies_to_pooled_connections() {
    let (url, database) = fresh_mysql_database(&test_mysql_url(), "store_timeout")
        .await
        .unwrap();
    let store = MySqlStore::connect(&MySqlConfig {
        statement_timeout: Duration::from_millis(1_000),
        ..settings(&url)
    })
    .await
    .unwrap();
    let limit: f64 = sqlx::query_scalar("SELECT @@SESSION.max_statement_time")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(limit, 1.0);

    let started = Instant::now();
    let slept: Result<i64, sqlx::Error> = sqlx::query_scalar("SELECT SLEEP(3)")
        .fetch_one(store.pool())
        .await;
    let elapsed = started.elapsed();

    // MariaDB 10.11 interrupts the statement at the limit with ER_STATEMENT_TIMEOUT.
    let error = slept.unwrap_err();
    let number = error
        .as_database_error()
        .and_then(|error| error.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number);
    assert_eq!(number, Some(1969), "{error:?}");
    assert!(elapsed < Duration::from_millis(2_500), "{elapsed:?}");
    // The connection survives the interruption.
    store.ping().await.unwrap();
    finish(database, store).await;
}

#[tokio::test]
async fn a_busy_pool_fails_with_pool_timed_out_after_the_acquire_timeout() {
    let (url, database) = fresh_mysql_database(&test_mysql_url(), "store_acquire")
        .await
        .unwrap();
    let store = MySqlStore::connect(&MySqlConfig {
        max_connections: 1,
        acquire_timeout: Duration::from_millis(200),
        ..settings(&url)
    })
    .await
    .unwrap();
    let held = store.pool().acquire().await.unwrap();

    let started = Instant::now();
    let result = store.product(key("jd", "100001")).await;
    let elapsed = started.elapsed();

    assert!(matches!(result, Err(StoreError::PoolTimeout)), "{result:?}");
    assert!(
        elapsed >= Duration::from_millis(190) && elapsed < Duration::from_millis(1_000),
        "{elapsed:?}"
    );
    drop(held);
    assert_eq!(store.product(key("jd", "100001")).await.unwrap(), None);
    finish(database, store).await;
}

#[test]
fn settings_debug_never_shows_credentials() {
    let settings =
        MySqlConfig::new("mysql://rebate:s3cr@t/pw@db.internal:3306/catalogue?ssl-mode=REQUIRED");

    let shown = format!("{settings:?}");

    assert!(!shown.contains("s3cr"), "{shown}");
    assert!(!shown.contains("pw@"), "{shown}");
    assert!(!shown.contains("rebate:"), "{shown}");
    assert!(
        shown.contains("mysql://db.internal:3306/catalogue"),
        "{shown}"
    );
    assert_eq!(
        settings.acquire_timeout,
        MySqlConfig::DEFAULT_ACQUIRE_TIMEOUT
    );
    assert_eq!(redacted_url("not a url"), "<redacted>");
    assert_eq!(
        redacted_url("mysql://u:pa?ss#word@db/catalogue"),
        "mysql://db/catalogue"
    );
    assert_eq!(redacted_url("mysql://db:3306"), "mysql://db:3306");
}

/// Pins what the module docs say the pool does per query, so a sqlx upgrade that changes it is
/// noticed: no ping on acquire, one on release.
#[tokio::test]
async fn the_pool_pings_once_per_query_on_release_only() {
    let (url, database) = fresh_mysql_database(&test_mysql_url(), "store_pings")
        .await
        .unwrap();
    // One connection, so every query and the status reads below share one server session.
    let store = MySqlStore::connect(&MySqlConfig {
        max_connections: 1,
        ..settings(&url)
    })
    .await
    .unwrap();
    async fn admin_commands(store: &MySqlStore) -> i64 {
        let (_name, value): (String, String) =
            sqlx::query_as("SHOW SESSION STATUS LIKE 'Com_admin_commands'")
                .fetch_one(store.pool())
                .await
                .unwrap();
        value.parse().unwrap()
    }

    let before = admin_commands(&store).await;
    for _ in 0..50 {
        store.product(key("jd", "100001")).await.unwrap();
    }
    let after = admin_commands(&store).await;

    // 50 queries plus the first status read, each released once.
    assert_eq!(after - before, 51);
    finish(database, store).await;
}

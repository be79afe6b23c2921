//! Against a real server ([`crate::testing::test_mysql_url`]), one fresh database per test.
#![allow(
    clippy::disallowed_methods,
    reason = "tests against a real MariaDB measure its pool timeout on the wall clock"
)]

use futures::TryStreamExt;
use rebate_domain::{Cents, ItemId, Platform, ProductStatus, RateBps, Timestamp};
use sqlx::Connection;

use super::*;
use crate::demo::{demo_item, is_demo_delisted};
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

fn key(platform: &str, id: &str) -> ItemKey {
    ItemKey::parse(platform, id).unwrap()
}

/// A connection to the same database that skips CHECK constraints (MariaDB's session switch), to
/// plant corrupt rows the way a careless tool or a manual fix could.
async fn unchecked_connection(url: &str) -> MySqlConnection {
    let mut connection = MySqlConnection::connect(url).await.unwrap();
    sqlx::raw_sql("SET SESSION check_constraint_checks = OFF")
        .execute(&mut connection)
        .await
        .unwrap();
    connection
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

fn assert_corrupt(result: Result<impl std::fmt::Debug, StoreError>, key: &str, needle: &str) {
    match result {
        Err(StoreError::CorruptRow {
            key: row_key,
            reason,
        }) => {
            assert_eq!(row_key, key);
            assert!(
                reason.contains(needle),
                "{reason:?} should mention {needle:?}"
            );
        }
        other => panic!("expected CorruptRow for {key}, got {other:?}"),
    }
}

#[tokio::test]
async fn connect_migrates_a_fresh_database_and_migrating_again_is_harmless() {
    let (database, url, store) = fresh_store("store_migrate").await;

    let tables = table_names(&store).await;
    for table in ["_sqlx_migrations", "hot_items", "products", "rebate_rates"] {
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

#[tokio::test]
async fn seeding_twice_loads_the_demo_catalogue_once() {
    let (database, _url, store) = fresh_store("store_seed").await;

    let first = store.seed_demo().await.unwrap();
    assert_eq!(
        (first.products, first.rates, first.hot_items),
        (30_000, 30_000, 300)
    );
    let second = store.seed_demo().await.unwrap();
    assert_eq!((second.products, second.rates, second.hot_items), (0, 0, 0));
    assert_eq!(store.seed_demo_if_empty().await.unwrap(), None);

    assert_eq!(store.count_products().await.unwrap(), 30_000);
    assert_eq!(store.count_rates().await.unwrap(), 30_000);

    // Every row reads back exactly as generated (nothing truncated or converted on the way).
    let products: Vec<ProductRow> = sqlx::query_as(
        "SELECT platform, item_id, title, price_cents, image_url, shop_name, status, version, \
         updated_at_ms FROM products",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    let rates: Vec<RateRow> = sqlx::query_as(
        "SELECT platform, item_id, rate_bps, version, updated_at_ms FROM rebate_rates",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    crate::rows::assert_rows_match_demo(products, rates);
    finish(database, store).await;
}

#[tokio::test]
async fn reads_through_the_repository_validate_and_count() {
    let (database, url, store) = fresh_store("store_reads").await;
    assert_eq!(
        store
            .seed_demo_if_empty()
            .await
            .unwrap()
            .map(|report| report.products),
        Some(30_000)
    );

    // A known item, with a title that is not ASCII.
    let expected = demo_item(Platform::Taobao, 100_001).unwrap();
    let product = store.product(key("taobao", "100001")).await.unwrap();
    assert_eq!(product, Some(expected.product));
    assert_eq!(
        store.rate(key("taobao", "100001")).await.unwrap(),
        Some(expected.rate)
    );
    // Delisted is a status, not an absence.
    assert!(is_demo_delisted(101_123));
    let delisted = store.product(key("pdd", "101123")).await.unwrap().unwrap();
    assert_eq!(delisted.value.status, ProductStatus::Delisted);
    assert_eq!(delisted, demo_item(Platform::Pdd, 101_123).unwrap().product);
    // Unknown items are None, ids are text (leading zeros matter).
    for id in ["100000", "110001", "1", "0100001", "99999999999999999999"] {
        assert_eq!(store.product(key("jd", id)).await.unwrap(), None, "{id}");
        assert_eq!(store.rate(key("jd", id)).await.unwrap(), None, "{id}");
    }
    assert_eq!(store.counters().product_loads(), 1 + 1 + 5);
    assert_eq!(store.counters().rate_loads(), 1 + 5);

    // A failed load counts too.
    let mut connection = unchecked_connection(&url).await;
    sqlx::query(
        "UPDATE rebate_rates SET rate_bps = 20000 WHERE platform = 'jd' AND item_id = '100003'",
    )
    .execute(&mut connection)
    .await
    .unwrap();
    connection.close().await.unwrap();
    store.rate(key("jd", "100003")).await.unwrap_err();
    assert_eq!(store.counters().rate_loads(), 7);
    let clone = store.clone();
    clone.product(key("pdd", "100001")).await.unwrap();
    assert_eq!(
        store.counters().product_loads(),
        8,
        "clones share the counters"
    );
    finish(database, store).await;
}

#[tokio::test]
async fn rows_breaking_invariants_are_corrupt_row_errors() {
    let (database, url, store) = fresh_store("store_corrupt").await;
    for id in 100_001..=100_004 {
        for platform in [Platform::Taobao, Platform::Jd] {
            let item = demo_item(platform, id).unwrap();
            store.upsert_product(&item.product).await.unwrap();
            store.upsert_rate(item.key(), &item.rate).await.unwrap();
        }
    }
    let mut connection = unchecked_connection(&url).await;
    for statement in [
        "UPDATE rebate_rates SET rate_bps = 20000 WHERE platform = 'taobao' AND item_id = '100001'",
        "UPDATE rebate_rates SET rate_bps = -1 WHERE platform = 'taobao' AND item_id = '100002'",
        "UPDATE rebate_rates SET version = -3 WHERE platform = 'taobao' AND item_id = '100003'",
        "UPDATE products SET status = 'sold_out' WHERE platform = 'jd' AND item_id = '100001'",
        "UPDATE products SET price_cents = -500 WHERE platform = 'jd' AND item_id = '100002'",
        "UPDATE products SET version = -1 WHERE platform = 'jd' AND item_id = '100003'",
        "INSERT INTO hot_items VALUES ('amazon', '100001', 1)",
        "INSERT INTO products VALUES ('amazon', '7', 't', 1, 'u', 's', 'on_sale', 1, 0)",
    ] {
        sqlx::query(statement)
            .execute(&mut connection)
            .await
            .unwrap();
    }
    connection.close().await.unwrap();

    assert_corrupt(
        store.rate(key("taobao", "100001")).await,
        "taobao:100001",
        "20000",
    );
    assert_corrupt(
        store.rate(key("taobao", "100002")).await,
        "taobao:100002",
        "-1",
    );
    assert_corrupt(
        store.rate(key("taobao", "100003")).await,
        "taobao:100003",
        "version",
    );
    assert_corrupt(
        store.product(key("jd", "100001")).await,
        "jd:100001",
        "sold_out",
    );
    assert_corrupt(
        store.product(key("jd", "100002")).await,
        "jd:100002",
        "price_cents",
    );
    assert_corrupt(
        store.product(key("jd", "100003")).await,
        "jd:100003",
        "version",
    );
    assert_corrupt(store.hot_keys(1_000).await, "amazon:100001", "amazon");
    // The key stream reports the bad key in its place ('amazon' sorts first) and goes on.
    let streamed: Vec<Result<ItemKey, StoreError>> = store.keys().collect().await;
    assert_eq!(streamed.len(), 9);
    let mut streamed = streamed.into_iter();
    assert_corrupt(streamed.next().unwrap(), "amazon:7", "products key");
    assert!(streamed.all(|key| key.is_ok()));
    // The rest of the catalogue is unaffected.
    assert!(store.product(key("jd", "100004")).await.unwrap().is_some());
    finish(database, store).await;
}

#[tokio::test]
async fn the_schema_refuses_invalid_rows() {
    let (database, _url, store) = fresh_store("store_schema").await;
    for statement in [
        "INSERT INTO products VALUES ('amazon', '1', 't', 1, 'u', 's', 'on_sale', 1, 0)",
        "INSERT INTO products VALUES ('Jd', '11', 't', 1, 'u', 's', 'on_sale', 1, 0)",
        "INSERT INTO products VALUES ('jd', '12a', 't', 1, 'u', 's', 'on_sale', 1, 0)",
        "INSERT INTO products VALUES ('jd', '', 't', 1, 'u', 's', 'on_sale', 1, 0)",
        "INSERT INTO products VALUES ('jd', '123456789012345678901', 't', 1, 'u', 's', 'on_sale', 1, 0)",
        "INSERT INTO products VALUES ('jd', '3', 't', -1, 'u', 's', 'on_sale', 1, 0)",
        "INSERT INTO products VALUES ('jd', '4', 't', 'cheap', 'u', 's', 'on_sale', 1, 0)",
        "INSERT INTO products VALUES ('jd', '5', 't', 1, 'u', 's', 'gone', 1, 0)",
        "INSERT INTO products VALUES ('jd', '6', NULL, 1, 'u', 's', 'on_sale', 1, 0)",
        "INSERT INTO rebate_rates VALUES ('jd', '7', 10001, 1, 0)",
        "INSERT INTO rebate_rates VALUES ('jd', '8', 100, -1, 0)",
        "INSERT INTO hot_items VALUES ('jd', '9', 0)",
    ] {
        let result = sqlx::query(statement).execute(store.pool()).await;
        assert!(result.is_err(), "accepted: {statement}");
    }
    assert_eq!(store.count_products().await.unwrap(), 0);
    assert_eq!(store.count_rates().await.unwrap(), 0);
    sqlx::query("INSERT INTO products VALUES ('jd', '1', 't', 0, 'u', 's', 'delisted', 0, 0)")
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query("INSERT INTO rebate_rates VALUES ('jd', '1', 10000, 0, 0)")
        .execute(store.pool())
        .await
        .unwrap();
    finish(database, store).await;
}

#[tokio::test]
async fn keys_stream_every_product_in_key_order_and_hot_keys_rank_first() {
    let (database, url, store) = fresh_store("store_keys").await;
    store.seed_demo().await.unwrap();
    // Key order is the primary key's: platform, then item id, both compared as bytes.
    let mut expected: Vec<ItemKey> = demo_items().map(|item| item.key()).collect();
    expected.sort_by(|left, right| {
        (left.platform.as_str(), left.item_id.as_str())
            .cmp(&(right.platform.as_str(), right.item_id.as_str()))
    });

    let streamed: Vec<ItemKey> = store.keys().try_collect().await.unwrap();

    assert_eq!(streamed.len(), 30_000);
    assert_eq!(streamed, expected);
    assert_eq!(
        store.hot_keys(10).await.unwrap(),
        [
            key("jd", "100001"),
            key("pdd", "100001"),
            key("taobao", "100001"),
            key("jd", "100002"),
            key("pdd", "100002"),
            key("taobao", "100002"),
            key("jd", "100003"),
            key("pdd", "100003"),
            key("taobao", "100003"),
            key("jd", "100004"),
        ]
    );
    assert_eq!(store.hot_keys(1_000).await.unwrap().len(), 300);
    // A stream dropped half-way gives its connection back in a usable state.
    let first_ten: Vec<_> = store.keys().take(10).try_collect().await.unwrap();
    assert_eq!(first_ten, expected[..10]);
    store.ping().await.unwrap();

    // A consumer slower than the statement timeout still gets every key: no statement spans it.
    let strict = MySqlStore::connect(&MySqlConfig {
        statement_timeout: Duration::from_secs(1),
        ..settings(&url)
    })
    .await
    .unwrap();
    let mut keys = strict.keys();
    let first = keys.try_next().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let rest: Vec<ItemKey> = keys.try_collect().await.unwrap();
    assert_eq!(first.as_ref(), expected.first());
    assert_eq!(rest, expected[1..]);
    strict.close().await;
    finish(database, store).await;
}

#[tokio::test]
async fn upserts_replace_values_and_refuse_what_does_not_fit() {
    let (database, _url, store) = fresh_store("store_upsert").await;
    let item_key = key("taobao", "100001");
    let mut product = demo_item(Platform::Taobao, 100_001).unwrap().product;
    store.upsert_product(&product).await.unwrap();
    product.value.title = String::from("改价后的保温杯");
    product.value.price_cents = Cents::new(4_990);
    product.value.status = ProductStatus::Delisted;
    product.version = 7;
    product.updated_at = Timestamp::from_millis(1_800_000_000_000);
    let rate = Versioned {
        value: RebateRate {
            rate_bps: RateBps::try_from(10_000u64).unwrap(),
        },
        version: 0,
        updated_at: Timestamp::from_millis(0),
    };

    store.upsert_product(&product).await.unwrap();
    store.upsert_rate(item_key, &rate).await.unwrap();

    assert_eq!(
        store.product(item_key).await.unwrap(),
        Some(product.clone())
    );
    assert_eq!(store.rate(item_key).await.unwrap(), Some(rate));
    assert_eq!(store.count_products().await.unwrap(), 1);
    assert_eq!(
        store.rate(key("taobao", "0100001")).await.unwrap(),
        None,
        "ids are text"
    );
    // Reseeding keeps the changed row.
    store.seed_demo().await.unwrap();
    assert_eq!(
        store.product(item_key).await.unwrap(),
        Some(product.clone())
    );

    product.value.item_id = ItemId::from_u64(5);
    product.version = u64::MAX;
    let error = store.upsert_product(&product).await.unwrap_err();
    assert!(
        matches!(&error, StoreError::ValueOutOfRange { key, reason }
            if key == "taobao:5" && reason.contains("products.version")),
        "{error:?}"
    );
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

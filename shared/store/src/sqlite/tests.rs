use futures::TryStreamExt;
use rebate_domain::{Cents, ItemId, Platform, ProductStatus, RateBps, Timestamp};
use sqlx::Connection;
use tempfile::TempDir;

use super::*;
use crate::demo::{demo_item, is_demo_delisted};

fn settings_in(directory: &TempDir) -> SqliteConfig {
    SqliteConfig {
        path: directory.path().join("nested/deeper/catalogue.sqlite"),
        max_connections: 4,
        acquire_timeout: Duration::from_secs(5),
    }
}

/// A fresh database file per test, in a directory that disappears with the returned guard.
async fn open_temp() -> (TempDir, SqliteStore) {
    let directory = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&settings_in(&directory)).await.unwrap();
    (directory, store)
}

async fn seeded_temp() -> (TempDir, SqliteStore) {
    let (directory, store) = open_temp().await;
    store.seed_demo().await.unwrap();
    (directory, store)
}

fn key(platform: &str, id: &str) -> ItemKey {
    ItemKey::parse(platform, id).unwrap()
}

/// A second connection to the same file that skips CHECK constraints, to plant corrupt rows the
/// way a careless tool or a manual fix could.
async fn unchecked_connection(directory: &TempDir) -> SqliteConnection {
    let options = SqliteConnectOptions::new().filename(&settings_in(directory).path);
    let mut connection = SqliteConnection::connect_with(&options).await.unwrap();
    sqlx::query("PRAGMA ignore_check_constraints = ON")
        .execute(&mut connection)
        .await
        .unwrap();
    connection
}

async fn table_names(store: &SqliteStore) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .fetch_all(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn open_creates_the_parent_dir_and_file_and_migrates() {
    let directory = tempfile::tempdir().unwrap();
    let settings = settings_in(&directory);
    assert!(!settings.path.parent().unwrap().exists());

    let store = SqliteStore::open(&settings).await.unwrap();

    assert!(settings.path.is_file());
    let tables = table_names(&store).await;
    for table in ["_sqlx_migrations", "hot_items", "products", "rebate_rates"] {
        assert!(
            tables.iter().any(|name| name == table),
            "{table} missing: {tables:?}"
        );
    }
    let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(journal_mode, "wal");
    assert_eq!(store.count_products().await.unwrap(), 0);
    store.ping().await.unwrap();
}

#[tokio::test]
async fn reopening_keeps_the_data_and_does_not_reapply_migrations() {
    let directory = tempfile::tempdir().unwrap();
    let settings = settings_in(&directory);
    let first = SqliteStore::open(&settings).await.unwrap();
    first.seed_demo().await.unwrap();
    first.close().await;

    let second = SqliteStore::open(&settings).await.unwrap();

    assert_eq!(second.count_products().await.unwrap(), 30_000);
    let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
        .fetch_one(second.pool())
        .await
        .unwrap();
    assert_eq!(applied, i64::try_from(MIGRATOR.iter().count()).unwrap());
}

#[tokio::test]
async fn seeding_twice_leaves_the_same_rows() {
    let (_directory, store) = open_temp().await;

    let first = store.seed_demo().await.unwrap();
    assert_eq!(
        (first.products, first.rates, first.hot_items),
        (30_000, 30_000, 300)
    );
    let second = store.seed_demo().await.unwrap();
    assert_eq!((second.products, second.rates, second.hot_items), (0, 0, 0));

    assert_eq!(store.count_products().await.unwrap(), 30_000);
    assert_eq!(store.count_rates().await.unwrap(), 30_000);
    assert_eq!(store.hot_keys(1_000).await.unwrap().len(), 300);
}

#[tokio::test]
async fn reseeding_keeps_rows_changed_since() {
    let (_directory, store) = seeded_temp().await;
    let key = key("jd", "100002");
    let mut changed = demo_item(Platform::Jd, 100_002).unwrap().rate;
    changed.value.rate_bps = RateBps::try_from(9_999u64).unwrap();
    changed.version = 42;
    store.upsert_rate(key, &changed).await.unwrap();

    store.seed_demo().await.unwrap();

    assert_eq!(store.rate(key).await.unwrap(), Some(changed));
}

#[tokio::test]
async fn seed_if_empty_seeds_only_an_empty_store() {
    let (_directory, store) = open_temp().await;

    let report = store.seed_demo_if_empty().await.unwrap();
    assert_eq!(report.map(|report| report.products), Some(30_000));
    assert_eq!(store.seed_demo_if_empty().await.unwrap(), None);
    assert_eq!(store.count_products().await.unwrap(), 30_000);
}

#[tokio::test]
async fn every_seeded_row_reads_back_as_generated() {
    let (_directory, store) = seeded_temp().await;

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
}

#[tokio::test]
async fn a_known_item_reads_back_through_the_repository() {
    let (_directory, store) = seeded_temp().await;
    let expected = demo_item(Platform::Taobao, 100_001).unwrap();

    let product = store.product(key("taobao", "100001")).await.unwrap();
    let rate = store.rate(key("taobao", "100001")).await.unwrap();

    assert_eq!(product, Some(expected.product.clone()));
    assert_eq!(rate, Some(expected.rate));
    let product = product.unwrap().value;
    assert_eq!(product.status, ProductStatus::OnSale);
    assert_eq!(
        product.image_url,
        "https://img.example.com/taobao/100001.jpg"
    );
}

#[tokio::test]
async fn a_delisted_item_reads_back_delisted_with_its_rate() {
    let (_directory, store) = seeded_temp().await;
    assert!(is_demo_delisted(101_123));

    let product = store.product(key("pdd", "101123")).await.unwrap().unwrap();

    assert_eq!(product.value.status, ProductStatus::Delisted);
    assert_eq!(product, demo_item(Platform::Pdd, 101_123).unwrap().product);
    assert!(store.rate(key("pdd", "101123")).await.unwrap().is_some());
}

#[tokio::test]
async fn an_unknown_item_is_none_not_an_error() {
    let (_directory, store) = seeded_temp().await;

    for id in ["100000", "110001", "1", "0100001", "99999999999999999999"] {
        assert_eq!(store.product(key("jd", id)).await.unwrap(), None, "{id}");
        assert_eq!(store.rate(key("jd", id)).await.unwrap(), None, "{id}");
    }
}

#[tokio::test]
async fn the_first_999_ids_are_on_sale_on_every_platform() {
    let (_directory, store) = seeded_temp().await;

    for platform in Platform::ALL {
        for id in 100_001..=100_999u64 {
            let item_key = ItemKey::new(platform, ItemId::from_u64(id));
            let product = store.product(item_key).await.unwrap();
            let status = product.map(|product| product.value.status);
            assert_eq!(status, Some(ProductStatus::OnSale), "{item_key}");
        }
    }
}

#[tokio::test]
async fn counters_count_every_load_hit_miss_or_failure() {
    let (directory, store) = seeded_temp().await;
    let mut connection = unchecked_connection(&directory).await;
    sqlx::query(
        "UPDATE rebate_rates SET rate_bps = 20000 WHERE platform = 'jd' AND item_id = '100003'",
    )
    .execute(&mut connection)
    .await
    .unwrap();
    assert_eq!(store.counters().product_loads(), 0);

    store.product(key("taobao", "100001")).await.unwrap();
    store.product(key("taobao", "1")).await.unwrap();
    store.rate(key("taobao", "100001")).await.unwrap();
    store.rate(key("jd", "100003")).await.unwrap_err();
    store.rate(key("jd", "1")).await.unwrap();

    assert_eq!(store.counters().product_loads(), 2);
    assert_eq!(store.counters().rate_loads(), 3);
    let clone = store.clone();
    clone.product(key("pdd", "100001")).await.unwrap();
    assert_eq!(
        store.counters().product_loads(),
        3,
        "clones share the counters"
    );
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
async fn rows_breaking_invariants_are_corrupt_row_errors() {
    let (directory, store) = seeded_temp().await;
    let mut connection = unchecked_connection(&directory).await;
    for statement in [
        "UPDATE rebate_rates SET rate_bps = 20000 WHERE platform = 'taobao' AND item_id = '100001'",
        "UPDATE rebate_rates SET rate_bps = -1 WHERE platform = 'taobao' AND item_id = '100002'",
        "UPDATE rebate_rates SET version = -3 WHERE platform = 'taobao' AND item_id = '100003'",
        "UPDATE products SET status = 'sold_out' WHERE platform = 'jd' AND item_id = '100001'",
        "UPDATE products SET price_cents = -500 WHERE platform = 'jd' AND item_id = '100002'",
        "UPDATE products SET version = -1 WHERE platform = 'jd' AND item_id = '100003'",
        "UPDATE hot_items SET platform = 'amazon' WHERE platform = 'pdd' AND item_id = '100001'",
    ] {
        sqlx::query(statement)
            .execute(&mut connection)
            .await
            .unwrap();
    }

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
    // The rest of the catalogue is unaffected.
    assert!(store.product(key("jd", "100004")).await.unwrap().is_some());
}

#[tokio::test]
async fn the_schema_refuses_invalid_rows() {
    let (_directory, store) = open_temp().await;
    for statement in [
        // Distinct keys, so that no refusal is a primary-key conflict with an earlier row.
        "INSERT INTO products VALUES ('amazon', '1', 't', 1, 'u', 's', 'on_sale', 1, 0)",
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
    // The same statements' shape is accepted with valid values.
    sqlx::query("INSERT INTO products VALUES ('jd', '1', 't', 0, 'u', 's', 'delisted', 0, 0)")
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query("INSERT INTO rebate_rates VALUES ('jd', '1', 10000, 0, 0)")
        .execute(store.pool())
        .await
        .unwrap();
}

#[tokio::test]
async fn upserts_replace_values_and_versions() {
    let (_directory, store) = seeded_temp().await;
    let item_key = key("taobao", "100001");
    let mut product = demo_item(Platform::Taobao, 100_001).unwrap().product;
    product.value.title = String::from("改价后的保温杯");
    product.value.price_cents = Cents::new(4_990);
    product.value.status = ProductStatus::Delisted;
    product.version = 7;
    product.updated_at = Timestamp::from_millis(1_800_000_000_000);
    let rate = Versioned {
        value: RebateRate {
            rate_bps: RateBps::try_from(1_234u64).unwrap(),
        },
        version: 9,
        updated_at: Timestamp::from_millis(1_800_000_000_001),
    };

    store.upsert_product(&product).await.unwrap();
    store.upsert_rate(item_key, &rate).await.unwrap();

    assert_eq!(
        store.product(item_key).await.unwrap(),
        Some(product.clone())
    );
    assert_eq!(store.rate(item_key).await.unwrap(), Some(rate));
    assert_eq!(store.count_products().await.unwrap(), 30_000);

    // Plain upserts, no fence: a lower version is written as given.
    product.version = 1;
    store.upsert_product(&product).await.unwrap();
    assert_eq!(store.product(item_key).await.unwrap().unwrap().version, 1);
}

#[tokio::test]
async fn upserts_insert_new_items() {
    let (_directory, store) = open_temp().await;
    let item_key = key("pdd", "00042");
    let rate = Versioned {
        value: RebateRate {
            rate_bps: RateBps::try_from(10_000u64).unwrap(),
        },
        version: 0,
        updated_at: Timestamp::from_millis(0),
    };

    store.upsert_rate(item_key, &rate).await.unwrap();

    assert_eq!(store.rate(item_key).await.unwrap(), Some(rate));
    assert_eq!(
        store.product(item_key).await.unwrap(),
        None,
        "rates stand alone"
    );
    assert_eq!(
        store.rate(key("pdd", "42")).await.unwrap(),
        None,
        "ids are text"
    );
}

#[tokio::test]
async fn values_beyond_the_columns_are_refused_before_writing() {
    let (_directory, store) = open_temp().await;
    let mut product = demo_item(Platform::Jd, 100_001).unwrap().product;
    product.version = u64::MAX;

    let error = store.upsert_product(&product).await.unwrap_err();

    assert!(
        matches!(&error, StoreError::ValueOutOfRange { key, reason }
            if key == "jd:100001" && reason.contains("products.version")),
        "{error:?}"
    );
    assert_eq!(store.count_products().await.unwrap(), 0);
}

#[tokio::test]
async fn hot_keys_interleave_platforms_by_rank() {
    let (_directory, store) = seeded_temp().await;

    let hot = store.hot_keys(4).await.unwrap();

    assert_eq!(
        hot,
        [
            key("jd", "100001"),
            key("pdd", "100001"),
            key("taobao", "100001"),
            key("jd", "100002"),
        ]
    );
}

#[tokio::test]
async fn in_memory_store_is_migrated_and_keeps_its_data() {
    let store = SqliteStore::in_memory().await.unwrap();
    assert_eq!(store.count_products().await.unwrap(), 0);

    store.seed_demo().await.unwrap();

    // A single connection that never retires: every query sees the same database.
    assert_eq!(store.count_products().await.unwrap(), 30_000);
    let product = store.product(key("jd", "109999")).await.unwrap();
    assert_eq!(
        product,
        Some(demo_item(Platform::Jd, 109_999).unwrap().product)
    );
}

#[tokio::test]
async fn a_closed_store_fails_instead_of_hanging() {
    let (_directory, store) = open_temp().await;
    store.ping().await.unwrap();

    store.close().await;

    assert!(matches!(store.ping().await, Err(StoreError::Closed)));
}

#[tokio::test]
async fn keys_stream_every_product_in_key_order() {
    let (_directory, store) = seeded_temp().await;
    // Key order is the primary key's: platform, then item id, both compared as bytes.
    let mut expected: Vec<ItemKey> = demo_items().map(|item| item.key()).collect();
    expected.sort_by(|left, right| {
        (left.platform.as_str(), left.item_id.as_str())
            .cmp(&(right.platform.as_str(), right.item_id.as_str()))
    });

    let streamed: Vec<ItemKey> = store.keys().try_collect().await.unwrap();

    assert_eq!(streamed.len(), 30_000);
    assert_eq!(streamed, expected);
    let hot = store.hot_keys(10).await.unwrap();
    assert_eq!(hot.len(), 10);
    assert_eq!(
        hot[..3],
        [
            key("jd", "100001"),
            key("pdd", "100001"),
            key("taobao", "100001")
        ]
    );
    assert_eq!(hot[9], key("jd", "100004"));
}

#[tokio::test]
async fn a_corrupt_key_is_an_error_in_the_key_stream_not_a_panic() {
    let (directory, store) = open_temp().await;
    let item = demo_item(Platform::Jd, 100_001).unwrap();
    store.upsert_product(&item.product).await.unwrap();
    let mut connection = unchecked_connection(&directory).await;
    sqlx::query("INSERT INTO products VALUES ('amazon', '7', 't', 1, 'u', 's', 'on_sale', 1, 0)")
        .execute(&mut connection)
        .await
        .unwrap();

    let streamed: Vec<Result<ItemKey, StoreError>> = store.keys().collect().await;

    assert_eq!(streamed.len(), 2);
    let mut streamed = streamed.into_iter();
    assert_corrupt(streamed.next().unwrap(), "amazon:7", "products key");
    assert_eq!(streamed.next().unwrap().unwrap(), item.key());
}

#[tokio::test]
async fn ping_is_ready_only_with_every_migration_applied() {
    let (_directory, store) = open_temp().await;
    store.ping().await.unwrap();
    sqlx::query("UPDATE _sqlx_migrations SET success = FALSE")
        .execute(store.pool())
        .await
        .unwrap();
    let error = store.ping().await.unwrap_err();
    assert!(
        matches!(error, StoreError::MigrationsPending { applied: 0, .. }),
        "{error}"
    );
}

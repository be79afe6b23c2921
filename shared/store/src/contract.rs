//! The store contract: what every backend of this crate must do, written once as generic checks
//! over [`ContractStore`] and run against each backend by [`contract_suite!`].
//!
//! Each backend's test module implements [`ContractStore`] (a fresh store per test and the few raw
//! SQL hooks below) and invokes `contract_suite!(TheStore);`, which adds a `contract` module there
//! with one `#[tokio::test]` per check: `sqlite::tests::contract::…`, `mysql::tests::contract::…`.
//! What only one backend has (SQLite's file handling and in-memory store, MySQL's pool and
//! statement timeout) stays in that backend's test module.
//!
//! Adding a check touches only this file (or [`rules`], for the rule sets' checks): write it as
//! `pub(crate) async fn name<S: ContractStore>(store: &S)` and add its name to the matching list
//! in [`contract_suite!`]; both backends then run it. A check missing from the list is never
//! called, which the `dead_code` lint reports (and `-D warnings` refuses). The rule sets' checks
//! run as `…::contract::rules::name`.
//!
//! Every check gets a migrated, empty store of its own and seeds it itself when it needs the demo
//! catalogue. The raw SQL here is the same text for both backends; how it reaches the database (and
//! how CHECK constraints are switched off to plant corrupt rows) is each backend's hook.

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use rebate_domain::{
    Cents, ItemId, ItemKey, Platform, Product, ProductStatus, RateBps, RebateRate, Timestamp,
};

use crate::demo::{SeedReport, demo_item, demo_items, is_demo_delisted};
use crate::rows::{ProductRow, RateRow};
use crate::{CatalogRepository, RuleRepository, StoreError, Versioned};

pub(crate) mod rules;

/// Every product row, for [`ContractStore::stored_rows`].
pub(crate) const SELECT_ALL_PRODUCT_ROWS: &str = "SELECT platform, item_id, title, price_cents, \
     image_url, shop_name, status, version, updated_at_ms FROM products";

/// Every rate row, for [`ContractStore::stored_rows`].
pub(crate) const SELECT_ALL_RATE_ROWS: &str =
    "SELECT platform, item_id, rate_bps, version, updated_at_ms FROM rebate_rates";

/// A backend under the contract: the repositories, the inherent methods both stores share, a
/// fresh store per test, and hooks for raw SQL.
///
/// `?Send`: the tests run on one thread, and sqlx's migration and connection futures are not
/// provably `Send` inside the boxed futures `async_trait` would otherwise demand.
#[async_trait(?Send)]
pub(crate) trait ContractStore: CatalogRepository + RuleRepository + Clone + Sized {
    /// What holds the fresh store's data and removes it when dropped, also when a check panics
    /// (a temporary directory, a throw-away database).
    type Storage;

    /// A migrated, empty store no other test sees; `test` names it where the backend can.
    async fn open_fresh(test: &str) -> (Self, Self::Storage);

    /// Closes the store and removes its data.
    async fn finish(self, storage: Self::Storage);

    async fn upsert_product(&self, product: &Versioned<Product>) -> Result<(), StoreError>;

    async fn upsert_rate(
        &self,
        key: ItemKey,
        rate: &Versioned<RebateRate>,
    ) -> Result<(), StoreError>;

    async fn seed_demo(&self) -> Result<SeedReport, StoreError>;

    async fn seed_demo_if_empty(&self) -> Result<Option<SeedReport>, StoreError>;

    async fn count_products(&self) -> Result<u64, StoreError>;

    async fn count_rates(&self) -> Result<u64, StoreError>;

    async fn close(&self);

    /// Runs `statement` on the store's own pool, CHECK constraints enforced.
    async fn execute_sql(&self, statement: &str) -> Result<(), StoreError>;

    /// Runs `statements` on a separate connection to the same database that skips CHECK
    /// constraints, to plant corrupt rows the way a careless tool or a manual fix could.
    async fn execute_unchecked(&self, statements: &[&str]);

    /// Every product and rate row as stored ([`SELECT_ALL_PRODUCT_ROWS`],
    /// [`SELECT_ALL_RATE_ROWS`]).
    async fn stored_rows(&self) -> (Vec<ProductRow>, Vec<RateRow>);
}

/// Instantiates every contract check for one backend: `contract_suite!(SqliteStore);` in its test
/// module, where `SqliteStore` implements [`ContractStore`]. Each test opens a fresh store, runs
/// the check and finishes the store; on a panic, the store's `Storage` cleans up as it drops.
macro_rules! contract_suite {
    ($store:ident) => {
        /// The store contract ([`crate::contract`]) against this backend, one test per check.
        mod contract {
            use super::$store;
            use $crate::contract as checks;

            $crate::contract::contract_suite!(@tests $store;
                a_fresh_store_is_migrated_empty_and_ready,
                seeding_twice_leaves_the_same_rows,
                every_seeded_row_reads_back_as_generated,
                reseeding_keeps_rows_changed_since,
                seed_if_empty_seeds_only_an_empty_store,
                seed_if_empty_leaves_a_store_with_any_product,
                a_known_item_reads_back_through_the_repository,
                a_delisted_item_reads_back_delisted_with_its_rate,
                an_unknown_item_is_none_not_an_error,
                the_first_999_ids_are_on_sale_on_every_platform,
                counters_count_every_load_hit_miss_or_failure,
                rows_breaking_invariants_are_corrupt_row_errors,
                a_corrupt_key_is_an_error_in_the_key_stream_not_a_panic,
                the_schema_refuses_invalid_rows,
                upserts_replace_values_and_versions,
                upserts_insert_new_items,
                values_beyond_the_columns_are_refused_before_writing,
                hot_keys_interleave_platforms_by_rank,
                keys_stream_every_product_in_key_order,
                a_closed_store_fails_instead_of_hanging,
                ping_is_ready_only_with_every_migration_applied,
            );

            /// The rule sets' contract ([`crate::contract::rules`]).
            mod rules {
                use super::$store;
                use $crate::contract::rules as checks;

                $crate::contract::contract_suite!(@tests $store;
                    a_fresh_store_has_no_rule_sets_or_reports,
                    versions_grow_from_1_and_rows_read_back_as_written,
                    inserting_an_active_rule_set_supersedes_the_active_one,
                    a_transition_moves_only_from_an_expected_state,
                    promoting_a_canary_supersedes_the_active_one_atomically,
                    history_is_newest_first_paged_by_before_and_capped,
                    rule_sets_in_lists_the_given_states_oldest_first,
                    instance_reports_are_replaced_and_filtered_by_time,
                    values_beyond_the_rule_columns_are_refused_before_writing,
                    a_rule_row_breaking_an_invariant_is_a_corrupt_row,
                    the_schema_knows_every_state_and_refuses_invalid_rule_rows,
                    concurrent_inserts_get_distinct_consecutive_versions,
                    concurrent_promotions_leave_exactly_one_active,
                );
            }
        }
    };
    (@tests $store:ident; $($check:ident),+ $(,)?) => {
        use $crate::contract::ContractStore as _;

        $(
            #[tokio::test]
            async fn $check() {
                let (store, storage) = $store::open_fresh(stringify!($check)).await;
                checks::$check(&store).await;
                store.finish(storage).await;
            }
        )+
    };
}

pub(crate) use contract_suite;

pub(crate) fn key(platform: &str, id: &str) -> ItemKey {
    ItemKey::parse(platform, id).unwrap()
}

/// Every demo key in the primary key's order: platform, then item id, both compared as bytes.
pub(crate) fn demo_keys_in_key_order() -> Vec<ItemKey> {
    let mut keys: Vec<ItemKey> = demo_items().map(|item| item.key()).collect();
    keys.sort_by(|left, right| {
        (left.platform.as_str(), left.item_id.as_str())
            .cmp(&(right.platform.as_str(), right.item_id.as_str()))
    });
    keys
}

pub(crate) fn assert_corrupt(
    result: Result<impl std::fmt::Debug, StoreError>,
    key: &str,
    needle: &str,
) {
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

/// Writes the demo product and rate of `platform`/`id`, for checks that need a few known rows
/// but not the whole catalogue.
async fn upsert_demo_item<S: ContractStore>(store: &S, platform: Platform, id: u64) {
    let item = demo_item(platform, id).unwrap();
    store.upsert_product(&item.product).await.unwrap();
    store.upsert_rate(item.key(), &item.rate).await.unwrap();
}

pub(crate) async fn a_fresh_store_is_migrated_empty_and_ready<S: ContractStore>(store: &S) {
    store.ping().await.unwrap();
    assert_eq!(store.count_products().await.unwrap(), 0);
    assert_eq!(store.count_rates().await.unwrap(), 0);
    assert_eq!(store.hot_keys(1_000).await.unwrap(), []);
    let keys: Vec<ItemKey> = store.keys().try_collect().await.unwrap();
    assert_eq!(keys, []);
}

pub(crate) async fn seeding_twice_leaves_the_same_rows<S: ContractStore>(store: &S) {
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
    assert_eq!(store.hot_keys(1_000).await.unwrap().len(), 300);
}

/// Nothing missing, extra, truncated or converted on the way in or out.
pub(crate) async fn every_seeded_row_reads_back_as_generated<S: ContractStore>(store: &S) {
    store.seed_demo().await.unwrap();

    let (products, rates) = store.stored_rows().await;

    crate::rows::assert_rows_match_demo(products, rates);
}

/// Seeding inserts only what is missing: it neither rolls back a row changed after an earlier
/// seed nor overwrites one written before the first.
pub(crate) async fn reseeding_keeps_rows_changed_since<S: ContractStore>(store: &S) {
    let mut written_before = demo_item(Platform::Taobao, 100_001).unwrap().product;
    written_before.value.title = String::from("改价后的保温杯");
    written_before.version = 7;
    store.upsert_product(&written_before).await.unwrap();

    let first = store.seed_demo().await.unwrap();
    assert_eq!((first.products, first.rates), (29_999, 30_000));

    let rate_key = key("jd", "100002");
    let mut changed_since = demo_item(Platform::Jd, 100_002).unwrap().rate;
    changed_since.value.rate_bps = RateBps::try_from(9_999u64).unwrap();
    changed_since.version = 42;
    store.upsert_rate(rate_key, &changed_since).await.unwrap();

    let second = store.seed_demo().await.unwrap();

    assert_eq!((second.products, second.rates, second.hot_items), (0, 0, 0));
    assert_eq!(store.rate(rate_key).await.unwrap(), Some(changed_since));
    assert_eq!(
        store.product(key("taobao", "100001")).await.unwrap(),
        Some(written_before)
    );
}

pub(crate) async fn seed_if_empty_seeds_only_an_empty_store<S: ContractStore>(store: &S) {
    let report = store.seed_demo_if_empty().await.unwrap();
    assert_eq!(report.map(|report| report.products), Some(30_000));
    assert_eq!(store.seed_demo_if_empty().await.unwrap(), None);
    assert_eq!(store.count_products().await.unwrap(), 30_000);
}

/// One product is enough to make a store "not empty": seeding around it is `seed_demo`'s job.
pub(crate) async fn seed_if_empty_leaves_a_store_with_any_product<S: ContractStore>(store: &S) {
    let product = demo_item(Platform::Pdd, 100_001).unwrap().product;
    store.upsert_product(&product).await.unwrap();

    assert_eq!(store.seed_demo_if_empty().await.unwrap(), None);

    assert_eq!(store.count_products().await.unwrap(), 1);
    assert_eq!(store.count_rates().await.unwrap(), 0);
}

/// A known item, with a title that is not ASCII.
pub(crate) async fn a_known_item_reads_back_through_the_repository<S: ContractStore>(store: &S) {
    store.seed_demo().await.unwrap();
    let expected = demo_item(Platform::Taobao, 100_001).unwrap();

    let product = store.product(key("taobao", "100001")).await.unwrap();
    let rate = store.rate(key("taobao", "100001")).await.unwrap();

    assert_eq!(product, Some(expected.product.clone()));
    assert_eq!(rate, Some(expected.rate));
    let product = product.unwrap().value;
    assert!(!product.title.is_ascii(), "{}", product.title);
    assert_eq!(product.status, ProductStatus::OnSale);
    assert_eq!(
        product.image_url,
        "https://img.example.com/taobao/100001.jpg"
    );
}

/// Delisted is a status, not an absence.
pub(crate) async fn a_delisted_item_reads_back_delisted_with_its_rate<S: ContractStore>(store: &S) {
    store.seed_demo().await.unwrap();
    assert!(is_demo_delisted(101_123));

    let product = store.product(key("pdd", "101123")).await.unwrap().unwrap();

    assert_eq!(product.value.status, ProductStatus::Delisted);
    assert_eq!(product, demo_item(Platform::Pdd, 101_123).unwrap().product);
    assert_eq!(
        store.rate(key("pdd", "101123")).await.unwrap(),
        Some(demo_item(Platform::Pdd, 101_123).unwrap().rate)
    );
}

/// Just outside the seeded range, and ids that are text (leading zeros matter).
pub(crate) async fn an_unknown_item_is_none_not_an_error<S: ContractStore>(store: &S) {
    store.seed_demo().await.unwrap();

    for id in ["100000", "110001", "1", "0100001", "99999999999999999999"] {
        assert_eq!(store.product(key("jd", id)).await.unwrap(), None, "{id}");
        assert_eq!(store.rate(key("jd", id)).await.unwrap(), None, "{id}");
    }
}

pub(crate) async fn the_first_999_ids_are_on_sale_on_every_platform<S: ContractStore>(store: &S) {
    store.seed_demo().await.unwrap();

    for platform in Platform::ALL {
        for id in 100_001..=100_999u64 {
            let item_key = ItemKey::new(platform, ItemId::from_u64(id));
            let product = store.product(item_key).await.unwrap();
            let status = product.map(|product| product.value.status);
            assert_eq!(status, Some(ProductStatus::OnSale), "{item_key}");
        }
    }
}

pub(crate) async fn counters_count_every_load_hit_miss_or_failure<S: ContractStore>(store: &S) {
    upsert_demo_item(store, Platform::Taobao, 100_001).await;
    upsert_demo_item(store, Platform::Pdd, 100_001).await;
    upsert_demo_item(store, Platform::Jd, 100_003).await;
    store
        .execute_unchecked(&[
            "UPDATE rebate_rates SET rate_bps = 20000 WHERE platform = 'jd' AND item_id = '100003'",
        ])
        .await;
    assert_eq!(store.counters().product_loads(), 0, "writes are not loads");
    assert_eq!(store.counters().rate_loads(), 0, "writes are not loads");

    store
        .product(key("taobao", "100001"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.product(key("taobao", "1")).await.unwrap(), None);
    store.rate(key("taobao", "100001")).await.unwrap().unwrap();
    store.rate(key("jd", "100003")).await.unwrap_err();
    assert_eq!(store.rate(key("jd", "1")).await.unwrap(), None);

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

pub(crate) async fn rows_breaking_invariants_are_corrupt_row_errors<S: ContractStore>(store: &S) {
    for id in 100_001..=100_004 {
        for platform in [Platform::Taobao, Platform::Jd] {
            upsert_demo_item(store, platform, id).await;
        }
    }
    store.execute_unchecked(&[
        "UPDATE rebate_rates SET rate_bps = 20000 WHERE platform = 'taobao' AND item_id = '100001'",
        "UPDATE rebate_rates SET rate_bps = -1 WHERE platform = 'taobao' AND item_id = '100002'",
        "UPDATE rebate_rates SET version = -3 WHERE platform = 'taobao' AND item_id = '100003'",
        "UPDATE products SET status = 'sold_out' WHERE platform = 'jd' AND item_id = '100001'",
        "UPDATE products SET price_cents = -500 WHERE platform = 'jd' AND item_id = '100002'",
        "UPDATE products SET version = -1 WHERE platform = 'jd' AND item_id = '100003'",
        "INSERT INTO hot_items VALUES ('amazon', '100001', 1)",
    ])
    .await;

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
    assert!(store.rate(key("taobao", "100004")).await.unwrap().is_some());
}

/// The key stream reports a bad key in its place ('amazon' sorts first) and goes on.
pub(crate) async fn a_corrupt_key_is_an_error_in_the_key_stream_not_a_panic<S: ContractStore>(
    store: &S,
) {
    let good = [
        key("jd", "100001"),
        key("jd", "100002"),
        key("pdd", "100001"),
    ];
    for item_key in good {
        let id = item_key.item_id.as_str().parse().unwrap();
        upsert_demo_item(store, item_key.platform, id).await;
    }
    store
        .execute_unchecked(&[
            "INSERT INTO products VALUES ('amazon', '7', 't', 1, 'u', 's', 'on_sale', 1, 0)",
        ])
        .await;

    let streamed: Vec<Result<ItemKey, StoreError>> = store.keys().collect().await;

    assert_eq!(streamed.len(), 1 + good.len());
    let mut streamed = streamed.into_iter();
    assert_corrupt(streamed.next().unwrap(), "amazon:7", "products key");
    let rest: Vec<ItemKey> = streamed.map(Result::unwrap).collect();
    assert_eq!(rest, good);
}

pub(crate) async fn the_schema_refuses_invalid_rows<S: ContractStore>(store: &S) {
    for statement in [
        // Distinct keys, so that no refusal is a primary-key conflict with an earlier row.
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
        let result = store.execute_sql(statement).await;
        assert!(result.is_err(), "accepted: {statement}");
    }
    assert_eq!(store.count_products().await.unwrap(), 0);
    assert_eq!(store.count_rates().await.unwrap(), 0);
    assert_eq!(store.hot_keys(1_000).await.unwrap(), []);
    // The same statements' shape is accepted with valid values (the bounds included).
    store
        .execute_sql("INSERT INTO products VALUES ('jd', '1', 't', 0, 'u', 's', 'delisted', 0, 0)")
        .await
        .unwrap();
    store
        .execute_sql("INSERT INTO rebate_rates VALUES ('jd', '1', 10000, 0, 0)")
        .await
        .unwrap();
    store
        .execute_sql("INSERT INTO hot_items VALUES ('jd', '1', 1)")
        .await
        .unwrap();
    assert_eq!(store.hot_keys(1_000).await.unwrap(), [key("jd", "1")]);
}

pub(crate) async fn upserts_replace_values_and_versions<S: ContractStore>(store: &S) {
    let item_key = key("taobao", "100001");
    upsert_demo_item(store, Platform::Taobao, 100_001).await;
    let mut product = demo_item(Platform::Taobao, 100_001).unwrap().product;
    product.value.title = String::from("改价后的保温杯");
    product.value.price_cents = Cents::new(4_990);
    product.value.status = ProductStatus::Delisted;
    product.version = 7;
    product.updated_at = Timestamp::from_millis(1_800_000_000_000);
    let mut rate = Versioned {
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
    assert_eq!(store.rate(item_key).await.unwrap(), Some(rate.clone()));
    assert_eq!(store.count_products().await.unwrap(), 1);
    assert_eq!(store.count_rates().await.unwrap(), 1);

    // Plain upserts, no fence: a lower version is written as given.
    product.version = 1;
    rate.version = 2;
    store.upsert_product(&product).await.unwrap();
    store.upsert_rate(item_key, &rate).await.unwrap();
    assert_eq!(store.product(item_key).await.unwrap().unwrap().version, 1);
    assert_eq!(store.rate(item_key).await.unwrap().unwrap().version, 2);
}

pub(crate) async fn upserts_insert_new_items<S: ContractStore>(store: &S) {
    let rate_key = key("pdd", "00042");
    // The bounds of the columns: a rate of 100 % at version 0, time 0.
    let rate = Versioned {
        value: RebateRate {
            rate_bps: RateBps::try_from(10_000u64).unwrap(),
        },
        version: 0,
        updated_at: Timestamp::from_millis(0),
    };
    let product = demo_item(Platform::Taobao, 100_001).unwrap().product;
    let product_key = key("taobao", "100001");

    store.upsert_rate(rate_key, &rate).await.unwrap();
    store.upsert_product(&product).await.unwrap();

    assert_eq!(store.rate(rate_key).await.unwrap(), Some(rate));
    assert_eq!(store.product(product_key).await.unwrap(), Some(product));
    assert_eq!(
        store.product(rate_key).await.unwrap(),
        None,
        "rates stand alone"
    );
    assert_eq!(
        store.rate(product_key).await.unwrap(),
        None,
        "products stand alone"
    );
    assert_eq!(
        store.rate(key("pdd", "42")).await.unwrap(),
        None,
        "ids are text"
    );
    assert_eq!(
        store.product(key("taobao", "0100001")).await.unwrap(),
        None,
        "ids are text"
    );
}

pub(crate) async fn values_beyond_the_columns_are_refused_before_writing<S: ContractStore>(
    store: &S,
) {
    let item = demo_item(Platform::Jd, 100_001).unwrap();
    let item_key = item.key();
    let mut product = item.product;
    product.version = u64::MAX;
    let mut rate = item.rate;
    rate.version = u64::MAX;

    let product_error = store.upsert_product(&product).await.unwrap_err();
    let rate_error = store.upsert_rate(item_key, &rate).await.unwrap_err();

    assert!(
        matches!(&product_error, StoreError::ValueOutOfRange { key, reason }
            if key == "jd:100001" && reason.contains("products.version")),
        "{product_error:?}"
    );
    assert!(
        matches!(&rate_error, StoreError::ValueOutOfRange { key, reason }
            if key == "jd:100001" && reason.contains("rebate_rates.version")),
        "{rate_error:?}"
    );
    assert_eq!(store.count_products().await.unwrap(), 0);
    assert_eq!(store.count_rates().await.unwrap(), 0);
}

/// Rank 1 of every platform, then rank 2, …, at most `limit`.
pub(crate) async fn hot_keys_interleave_platforms_by_rank<S: ContractStore>(store: &S) {
    store.seed_demo().await.unwrap();

    let hot = store.hot_keys(10).await.unwrap();

    assert_eq!(
        hot,
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
    assert_eq!(store.hot_keys(4).await.unwrap(), hot[..4]);
    assert_eq!(store.hot_keys(0).await.unwrap(), []);
    assert_eq!(store.hot_keys(1_000).await.unwrap().len(), 300);
}

pub(crate) async fn keys_stream_every_product_in_key_order<S: ContractStore>(store: &S) {
    store.seed_demo().await.unwrap();
    let expected = demo_keys_in_key_order();

    let streamed: Vec<ItemKey> = store.keys().try_collect().await.unwrap();

    assert_eq!(streamed.len(), 30_000);
    assert_eq!(streamed, expected);
    // A stream dropped half-way gives its connection back in a usable state.
    let first_ten: Vec<ItemKey> = store.keys().take(10).try_collect().await.unwrap();
    assert_eq!(first_ten, expected[..10]);
    store.ping().await.unwrap();
}

pub(crate) async fn a_closed_store_fails_instead_of_hanging<S: ContractStore>(store: &S) {
    store.ping().await.unwrap();

    store.close().await;

    assert!(matches!(store.ping().await, Err(StoreError::Closed)));
    assert!(matches!(
        store.product(key("jd", "100001")).await,
        Err(StoreError::Closed)
    ));
}

pub(crate) async fn ping_is_ready_only_with_every_migration_applied<S: ContractStore>(store: &S) {
    store.ping().await.unwrap();

    store
        .execute_sql("UPDATE _sqlx_migrations SET success = FALSE")
        .await
        .unwrap();

    let error = store.ping().await.unwrap_err();
    assert!(
        matches!(error, StoreError::MigrationsPending { applied: 0, .. }),
        "{error}"
    );
}

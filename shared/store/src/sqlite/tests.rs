//! The store contract ([`crate::contract`]) on a fresh database file per test, then what only the
//! SQLite store does: create its file and directory, reopen it, live in memory.

use rebate_domain::Platform;
use sqlx::Connection;
use tempfile::TempDir;

use super::*;
use crate::contract::{
    ContractStore, SELECT_ALL_PRODUCT_ROWS, SELECT_ALL_RATE_ROWS, contract_suite, key,
};
use crate::demo::demo_item;

fn settings_in(directory: &TempDir) -> SqliteConfig {
    SqliteConfig {
        path: directory.path().join("nested/deeper/catalogue.sqlite"),
        max_connections: 4,
        acquire_timeout: Duration::from_secs(5),
    }
}

async fn table_names(store: &SqliteStore) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .fetch_all(store.pool())
        .await
        .unwrap()
}

/// A fresh database file per test, in a directory that disappears with the storage.
#[async_trait(?Send)]
impl ContractStore for SqliteStore {
    type Storage = TempDir;

    async fn open_fresh(_test: &str) -> (Self, TempDir) {
        let directory = tempfile::tempdir().unwrap();
        let store = Self::open(&settings_in(&directory)).await.unwrap();
        (store, directory)
    }

    async fn finish(self, directory: TempDir) {
        Self::close(&self).await;
        drop(directory);
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

    /// A second connection to the same file (the pool's options) with CHECKs switched off.
    async fn execute_unchecked(&self, statements: &[&str]) {
        let options = self.pool().connect_options();
        let mut connection = SqliteConnection::connect_with(&options).await.unwrap();
        sqlx::query("PRAGMA ignore_check_constraints = ON")
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

contract_suite!(SqliteStore);

#[tokio::test]
async fn open_creates_the_parent_dir_and_file_and_migrates() {
    let directory = tempfile::tempdir().unwrap();
    let settings = settings_in(&directory);
    assert!(!settings.path.parent().unwrap().exists());

    let store = SqliteStore::open(&settings).await.unwrap();

    assert!(settings.path.is_file());
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

//! How fast `MySqlStore::keys()` streams a production-sized catalogue: what building the Bloom
//! filter at start-up costs.
//!
//! Seeds 1,000,000 products into a fresh database on the server of `TEST_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306`), streams every key through `keys()` a few times, prints the
//! figures and drops the database. For comparison it also times the alternative `keys()` does not
//! take: one `SELECT` streamed to the end, which only works with the statement timeout off.
//!
//! ```sh
//! cargo run --release -p rebate-store --features testing --example bloom_keys
//! ```
#![allow(
    clippy::print_stdout,
    clippy::disallowed_methods,
    reason = "a measurement whose output is the report, timed on the wall clock"
)]

use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use rebate_domain::{ItemKey, Platform};
use rebate_store::testing::{fresh_mysql_database, test_mysql_url};
use rebate_store::{CatalogRepository, MySqlConfig, MySqlStore, StoreError};

const KEYS: u64 = 1_000_000;
/// Rows per INSERT: about 0.5 MB of SQL, well under the default `max_allowed_packet`.
const ROWS_PER_INSERT: u64 = 10_000;
/// INSERTs in flight at once, each on its own pooled connection.
const CONCURRENT_INSERTS: usize = 4;
const STREAM_PASSES: usize = 3;

#[tokio::main]
async fn main() -> Result<(), StoreError> {
    let (url, database) = fresh_mysql_database(&test_mysql_url(), "bloom_keys").await?;
    // Production defaults (2 s statement timeout included), so the stream is measured as the
    // service would run it.
    let store = MySqlStore::connect(&MySqlConfig::new(url.clone())).await?;
    let unbounded = MySqlStore::connect(&MySqlConfig {
        statement_timeout: Duration::ZERO,
        ..MySqlConfig::new(url)
    })
    .await?;

    let started = Instant::now();
    futures::stream::iter((0..KEYS).step_by(ROWS_PER_INSERT as usize))
        .map(|first| insert_products(&store, first))
        .buffer_unordered(CONCURRENT_INSERTS)
        .try_collect::<()>()
        .await?;
    let seeded_in = started.elapsed();
    println!(
        "seeded {} products in {:.2} s",
        store.count_products().await?,
        seeded_in.as_secs_f64()
    );

    // Alternate the two so that a busy machine skews both alike.
    for pass in 1..=STREAM_PASSES {
        let elapsed = time_stream(store.keys()).await?;
        report(pass, "keys() in pages", elapsed);
        let one_select = sqlx::query_as::<_, (Vec<u8>, Vec<u8>)>(
            "SELECT platform, item_id FROM products ORDER BY platform, item_id",
        )
        .fetch(unbounded.pool())
        .map(|row| {
            let (platform, item_id) = row?;
            let key = ItemKey::parse(
                std::str::from_utf8(&platform).unwrap_or_default(),
                std::str::from_utf8(&item_id).unwrap_or_default(),
            );
            Ok(key.expect("generated keys are valid"))
        });
        let elapsed = time_stream(one_select.boxed()).await?;
        report(pass, "one SELECT", elapsed);
    }

    // The whole start-up step: stream every key into the Bloom filter the service uses.
    for pass in 1..=STREAM_PASSES {
        let filter = rebate_cache::ItemFilter::new(0.001, KEYS).expect("valid filter settings");
        let started = Instant::now();
        let built = filter.rebuild(store.keys()).await?;
        let elapsed = started.elapsed();
        assert_eq!(built.keys, KEYS);
        report(pass, "keys() into the Bloom filter", elapsed);
    }

    unbounded.close().await;
    store.close().await;
    database.drop_database().await
}

/// Products `first .. first + ROWS_PER_INSERT` in one multi-row INSERT, sent as text: every value
/// is generated here (digits and fixed words), so there is nothing to escape.
async fn insert_products(store: &MySqlStore, first: u64) -> Result<(), StoreError> {
    let mut sql = String::from(
        "INSERT INTO products (platform, item_id, title, price_cents, image_url, shop_name, \
         status, version, updated_at_ms) VALUES ",
    );
    for index in first..(first + ROWS_PER_INSERT).min(KEYS) {
        if index != first {
            sql.push(',');
        }
        let platform = Platform::ALL[(index % 3) as usize];
        let item_id = 1_000_000_000 + index;
        sql.push_str(&format!(
            "('{platform}','{item_id}','t',100,'u','s','on_sale',1,0)"
        ));
    }
    sqlx::raw_sql(&sql).execute(store.pool()).await?;
    Ok(())
}

/// Drains `keys`, touching every key as a Bloom filter insert would, and checks the count.
async fn time_stream(
    mut keys: BoxStream<'_, Result<ItemKey, StoreError>>,
) -> Result<Duration, StoreError> {
    let started = Instant::now();
    let mut count = 0u64;
    let mut digits = 0u64;
    while let Some(key) = keys.try_next().await? {
        count += 1;
        digits += key.item_id.as_str().len() as u64;
    }
    let elapsed = started.elapsed();
    assert_eq!((count, digits), (KEYS, KEYS * 10));
    Ok(elapsed)
}

fn report(pass: usize, what: &str, elapsed: Duration) {
    println!(
        "pass {pass}: {what:<16} {KEYS} keys in {:.3} s = {:.0} keys/s",
        elapsed.as_secs_f64(),
        KEYS as f64 / elapsed.as_secs_f64()
    );
}

//! A throw-away MySQL database per test, so tests never share state or depend on each other.
//!
//! ```no_run
//! # async fn example() -> Result<(), rebate_store::StoreError> {
//! use rebate_store::testing::{fresh_mysql_database, test_mysql_url};
//!
//! let (url, database) = fresh_mysql_database(&test_mysql_url(), "engine").await?;
//! // … connect to `url`, run the test …
//! database.drop_database().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Call [`TestDatabase::drop_database`] at the end of the test; if the test panics first, the
//! guard's `Drop` removes the database on a helper thread instead (best effort, blocking briefly).

use std::str::FromStr;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection};

use crate::StoreError;

/// The environment variable naming the server tests run against.
pub const TEST_MYSQL_URL_VAR: &str = "TEST_MYSQL_URL";

/// The server tests use when [`TEST_MYSQL_URL_VAR`] is unset: a local MariaDB, root, no password.
pub const DEFAULT_TEST_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306";

/// Database names are at most 64 characters; the prefix gets what the pid and the random part
/// leave.
const MAX_PREFIX_LEN: usize = 32;

/// How long dropping a database waits for locks held by a connection a test left open (e.g. a
/// transaction of a panicked test) before giving up rather than hanging the test run.
const DROP_LOCK_WAIT_SECS: u32 = 10;

/// The server URL from [`TEST_MYSQL_URL_VAR`], or [`DEFAULT_TEST_MYSQL_URL`].
pub fn test_mysql_url() -> String {
    std::env::var(TEST_MYSQL_URL_VAR).unwrap_or_else(|_| String::from(DEFAULT_TEST_MYSQL_URL))
}

/// Creates an empty database named `{prefix}_{pid}_{random}` on the server of `base_url` and
/// returns its URL (`base_url` with the database as its path) and the guard that drops it.
///
/// `prefix` is reduced to `[a-z0-9_]` so the name never needs quoting rules beyond backticks.
pub async fn fresh_mysql_database(
    base_url: &str,
    prefix: &str,
) -> Result<(String, TestDatabase), StoreError> {
    let name = unique_name(prefix);
    let mut connection = connect_to_server(base_url).await?;
    sqlx::raw_sql(&format!("CREATE DATABASE `{name}`"))
        .execute(&mut connection)
        .await?;
    connection.close().await?;
    let url = with_database(base_url, &name);
    let guard = TestDatabase {
        server_url: base_url.to_owned(),
        name,
        dropped: false,
    };
    Ok((url, guard))
}

/// A database made by [`fresh_mysql_database`]; drop it with [`TestDatabase::drop_database`].
#[derive(Debug)]
pub struct TestDatabase {
    server_url: String,
    name: String,
    dropped: bool,
}

impl TestDatabase {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Drops the database. Close the pools connected to it first: a transaction left open would
    /// make this wait (up to ten seconds) for its locks.
    pub async fn drop_database(mut self) -> Result<(), StoreError> {
        self.dropped = true;
        drop_named_database(&self.server_url, &self.name).await
    }
}

impl Drop for TestDatabase {
    /// The path of a test that panicked before dropping its database. Async code cannot run in
    /// `Drop`, so a helper thread with a runtime of its own does the work and is joined.
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let server_url = self.server_url.clone();
        let name = self.name.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                // Best effort: a leftover database only costs disk space.
                let _ = runtime.block_on(drop_named_database(&server_url, &name));
            }
        });
        let _ = cleanup.join();
    }
}

async fn drop_named_database(server_url: &str, name: &str) -> Result<(), StoreError> {
    let mut connection = connect_to_server(server_url).await?;
    sqlx::raw_sql(&format!(
        "SET SESSION lock_wait_timeout = {DROP_LOCK_WAIT_SECS}; DROP DATABASE IF EXISTS `{name}`"
    ))
    .execute(&mut connection)
    .await?;
    connection.close().await?;
    Ok(())
}

/// One plain connection (no pool) for administrative statements; quiet, since tests create and
/// drop many databases.
async fn connect_to_server(url: &str) -> Result<MySqlConnection, StoreError> {
    let options = MySqlConnectOptions::from_str(url)?.disable_statement_logging();
    Ok(options.connect().await?)
}

fn unique_name(prefix: &str) -> String {
    let mut clean: String = prefix
        .chars()
        .map(|character| match character.to_ascii_lowercase() {
            letter @ ('a'..='z' | '0'..='9' | '_') => letter,
            _ => '_',
        })
        .take(MAX_PREFIX_LEN)
        .collect();
    if clean.is_empty() {
        clean.push_str("test");
    }
    format!(
        "{clean}_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// `url` with its path (the database) replaced by `database`, keeping credentials and query.
fn with_database(url: &str, database: &str) -> String {
    let (without_query, query) = match url.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (url, None),
    };
    let authority_start = without_query.find("://").map_or(0, |index| index + 3);
    // The host starts after the last `@` (credentials may hold `/`), the path at the next `/`.
    let host_start = without_query[authority_start..]
        .rfind('@')
        .map_or(authority_start, |index| authority_start + index + 1);
    let path_start = without_query[host_start..]
        .find('/')
        .map_or(without_query.len(), |index| host_start + index);
    let mut new_url = format!("{}/{database}", &without_query[..path_start]);
    if let Some(query) = query {
        new_url.push('?');
        new_url.push_str(query);
    }
    new_url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_replaces_the_path_and_keeps_the_rest() {
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306", "t_1"),
            "mysql://root@127.0.0.1:3306/t_1"
        );
        assert_eq!(
            with_database("mysql://u:p/w@db:3306/old?ssl-mode=DISABLED", "t_1"),
            "mysql://u:p/w@db:3306/t_1?ssl-mode=DISABLED"
        );
        assert_eq!(
            with_database("mysql://localhost/", "t_1"),
            "mysql://localhost/t_1"
        );
    }

    async fn database_exists(name: &str) -> bool {
        let mut connection = connect_to_server(&test_mysql_url()).await.unwrap();
        let found: Option<String> = sqlx::query_scalar(
            "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
             WHERE schema_name = ?",
        )
        .bind(name)
        .fetch_optional(&mut connection)
        .await
        .unwrap();
        found.is_some()
    }

    #[tokio::test]
    async fn a_fresh_database_is_dropped_explicitly_or_by_the_guard() {
        let (url, database) = fresh_mysql_database(&test_mysql_url(), "testing_explicit")
            .await
            .unwrap();
        let name = database.name().to_owned();
        assert!(url.ends_with(&format!("/{name}")), "{url}");
        assert!(database_exists(&name).await);
        database.drop_database().await.unwrap();
        assert!(!database_exists(&name).await);

        let (_url, forgotten) = fresh_mysql_database(&test_mysql_url(), "testing_guard")
            .await
            .unwrap();
        let name = forgotten.name().to_owned();
        drop(forgotten);
        assert!(!database_exists(&name).await, "the guard drops it too");
    }

    #[test]
    fn names_are_unique_and_safe() {
        let first = unique_name("Store-Tests!");
        let second = unique_name("Store-Tests!");
        assert_ne!(first, second);
        assert!(first.starts_with("store_tests__"), "{first}");
        assert!(
            first
                .chars()
                .all(|character| character.is_ascii_alphanumeric() || character == '_')
        );
        assert!(unique_name(&"x".repeat(100)).len() <= 64);
        assert!(unique_name("").starts_with("test_"));
    }
}

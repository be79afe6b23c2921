//! The catalogue repository (products and rebate rates, each carrying its data version) and the
//! rule sets operators change at runtime.
//!
//! Contract: [`CatalogRepository`] is the only way the rest of the service reads the catalogue,
//! and [`RuleRepository`] the only way it reads and writes rule sets and instance reports,
//! whether they live in embedded SQLite or in MySQL/MariaDB; both stores validate every row the
//! same way. Implementations return `Ok(None)` for an item they do not hold and `Err` only when
//! the store itself failed (or refused a value), so callers can cache "not found" but must never
//! cache an error. Every catalogue read is counted in [`StoreCounters`] (tests and metrics rely on
//! the counts). This crate knows nothing of caches, HTTP, the query path or what a rule set says.
//!
//! # Layout
//! - [`CatalogRepository`], [`Versioned`], [`StoreError`], [`StoreCounters`]: the contract.
//! - [`rules`]: [`RuleRepository`] and its types ([`RuleState`], [`RuleSetRow`],
//!   [`NewRuleSet`], [`InstanceReport`]), the column limits, and (private `rules::sql`) its SQL,
//!   written once for both stores, which add only their dialect.
//! - [`sqlite`]: the embedded store used by the default profile.
//! - [`mysql`]: the production store on MySQL 8 / MariaDB 10.11, with the same schema and the
//!   same row validation (shared through the private `rows` module).
//! - [`demo`]: the deterministic demo catalogue, independent of any database
//!   ([`SqliteStore::seed_demo`] and [`MySqlStore::seed_demo`] load it).
//! - `testing` (feature `testing`, off in the service): a throw-away MySQL database per test, for
//!   this and other crates' tests.
//! - `contract` (tests only): the checks every store must pass, written once and run against both
//!   stores (the rule sets' in `contract::rules`).

#[cfg(test)]
mod contract;
pub mod demo;
pub mod mysql;
mod rows;
pub mod rules;
pub mod sqlite;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures::stream::BoxStream;
use rebate_domain::{ItemKey, Product, RebateRate, Timestamp};

pub use demo::SeedReport;
pub use mysql::{MySqlConfig, MySqlStore};
pub use rules::{
    InstanceReport, NewRuleSet, RuleRepository, RuleSetRow, RuleState, UnknownRuleState,
};
pub use sqlite::{SqliteConfig, SqliteStore};

/// A value read from the store with the data version it was written at.
///
/// Versions only grow; caches compare them so that an older value never replaces a newer one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub version: u64,
    pub updated_at: Timestamp,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection came free within the pool's acquire timeout: the database is overloaded or
    /// unreachable. Callers count it as a timeout, not as a bad answer.
    #[error("no database connection came free within the acquire timeout")]
    PoolTimeout,
    /// The store was closed, or the runtime is shutting down: nothing more will be served.
    #[error("the store is closed")]
    Closed,
    /// Any other failure of the database or its driver (the driver's error is the source).
    #[error("database error: {0}")]
    Database(#[source] BoxError),
    #[error("migration failed: {0}")]
    Migration(#[source] BoxError),
    /// A stored row breaks a domain invariant (unknown status, rate above 100 %, …). Reported,
    /// never papered over: serving a made-up value would be worse than failing the read.
    #[error("corrupt row for {key}: {reason}")]
    CorruptRow { key: String, reason: String },
    /// A value to be written does not fit its column (e.g. a version above `i64::MAX`).
    #[error("cannot store {key}: {reason}")]
    ValueOutOfRange { key: String, reason: String },
    /// The database answers but lacks migrations this build needs (readiness).
    #[error("{applied} of {known} migrations applied")]
    MigrationsPending { applied: i64, known: usize },
    #[error("cannot prepare the database file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The driver's error behind [`StoreError::Database`] and [`StoreError::Migration`], kept opaque
/// so that callers depend on this crate's variants, not on the driver's.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        match error {
            sqlx::Error::PoolTimedOut => Self::PoolTimeout,
            sqlx::Error::PoolClosed => Self::Closed,
            other => Self::Database(Box::new(other)),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(error: sqlx::migrate::MigrateError) -> Self {
        Self::Migration(Box::new(error))
    }
}

/// Readiness: every migration this build knows is applied.
pub(crate) fn check_migrations(applied: i64, known: usize) -> Result<(), StoreError> {
    if usize::try_from(applied).is_ok_and(|applied| applied >= known) {
        Ok(())
    } else {
        Err(StoreError::MigrationsPending { applied, known })
    }
}

/// How many reads of each kind reached the store. Cheap relaxed atomics.
#[derive(Debug, Default)]
pub struct StoreCounters {
    product_loads: AtomicU64,
    rate_loads: AtomicU64,
}

impl StoreCounters {
    pub fn record_product_load(&self) {
        self.product_loads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_rate_load(&self) {
        self.rate_loads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn product_loads(&self) -> u64 {
        self.product_loads.load(Ordering::Relaxed)
    }

    pub fn rate_loads(&self) -> u64 {
        self.rate_loads.load(Ordering::Relaxed)
    }
}

/// Read access to the catalogue.
///
/// A delisted product is returned with `ProductStatus::Delisted`, not as `None`: whether that means
/// "not found" to a client is the query path's decision.
#[async_trait]
pub trait CatalogRepository: Send + Sync + Debug + 'static {
    async fn product(&self, key: ItemKey) -> Result<Option<Versioned<Product>>, StoreError>;

    async fn rate(&self, key: ItemKey) -> Result<Option<Versioned<RebateRate>>, StoreError>;

    /// A cheap round trip that proves the store answers with every migration applied
    /// (readiness).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Every item key in the catalogue (delisted ones included), streamed in key order without
    /// holding them all in memory: what the Bloom filter is built from.
    fn keys(&self) -> BoxStream<'_, Result<ItemKey, StoreError>>;

    /// The hottest items, hottest first, at most `limit`: what warm-up loads.
    async fn hot_keys(&self, limit: u32) -> Result<Vec<ItemKey>, StoreError>;

    fn counters(&self) -> &StoreCounters;
}

//! Product and rate loaders backed by the catalogue store.

use std::sync::Arc;

use async_trait::async_trait;
use rebate_cache::{LoadFailure, Loaded, Loader};
use rebate_domain::{ItemKey, Product, RebateRate};
use rebate_store::{CatalogRepository, StoreError, Versioned};

/// Loads products. A delisted product is returned as a value: the query path turns it into 404.
#[derive(Debug, Clone)]
pub struct ProductLoader {
    repository: Arc<dyn CatalogRepository>,
}

impl ProductLoader {
    pub fn new(repository: Arc<dyn CatalogRepository>) -> Self {
        Self { repository }
    }
}

#[async_trait]
impl Loader<Product> for ProductLoader {
    async fn load(&self, key: ItemKey) -> Result<Loaded<Product>, LoadFailure> {
        let row = self.repository.product(key).await.map_err(store_failure)?;
        Ok(loaded(row))
    }
}

/// Loads rebate rates.
#[derive(Debug, Clone)]
pub struct RateLoader {
    repository: Arc<dyn CatalogRepository>,
}

impl RateLoader {
    pub fn new(repository: Arc<dyn CatalogRepository>) -> Self {
        Self { repository }
    }
}

#[async_trait]
impl Loader<RebateRate> for RateLoader {
    async fn load(&self, key: ItemKey) -> Result<Loaded<RebateRate>, LoadFailure> {
        let row = self.repository.rate(key).await.map_err(store_failure)?;
        Ok(loaded(row))
    }
}

/// A row becomes a value at its version; no row is "not found" (version 0, older than any row).
fn loaded<T>(row: Option<Versioned<T>>) -> Loaded<T> {
    match row {
        Some(versioned) => Loaded {
            value: Some(versioned.value),
            version: versioned.version,
        },
        None => Loaded {
            value: None,
            version: 0,
        },
    }
}

/// A pool that cannot hand out a connection in time is a timeout (the store is overloaded or
/// unreachable); everything else is an error.
fn store_failure(error: StoreError) -> LoadFailure {
    if matches!(error, StoreError::Database(sqlx::Error::PoolTimedOut)) {
        LoadFailure::timeout(error.to_string())
    } else {
        LoadFailure::error(error.to_string())
    }
}

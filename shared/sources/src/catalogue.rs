//! Product and rate loaders backed by the catalogue store: behind the store's [`DependencyGuard`]
//! guard (breaker, bulkhead) and one shared bound on concurrent store loads.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use rebate_cache::{LoadFailure, Loaded, Loader};
use rebate_domain::{ItemKey, Product, RebateRate};
use rebate_store::{CatalogRepository, StoreError, Versioned};

use rebate_guard::DependencyGuard;

/// At most `limit` store loads at once, across product and rate: when many keys miss together
/// (cold start, mass expiry, Redis down) the store sees a bounded queue, not a stampede.
#[derive(Debug)]
pub struct LoadLimiter {
    permits: tokio::sync::Semaphore,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl LoadLimiter {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            permits: tokio::sync::Semaphore::new(limit),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        })
    }

    /// The most loads that ever ran at once: tests and metrics check the bound held.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::Relaxed)
    }

    async fn run<T>(&self, load: impl Future<Output = T>) -> T {
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("the load limiter's semaphore is never closed");
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_in_flight.fetch_max(now, Ordering::Relaxed);
        // Counted out on drop too: the guard's attempt timeout cancels loads mid-query.
        let _counted = InFlight(&self.in_flight);
        load.await
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Loads products and rebate rates from the catalogue, one [`Loader`] per part on the same
/// repository, limiter and guard. A delisted product is returned as a value: the query path
/// turns it into 404.
#[derive(Debug, Clone)]
pub struct CatalogLoader {
    repository: Arc<dyn CatalogRepository>,
    limiter: Arc<LoadLimiter>,
    guard: Arc<DependencyGuard>,
}

impl CatalogLoader {
    pub fn new(
        repository: Arc<dyn CatalogRepository>,
        limiter: Arc<LoadLimiter>,
        guard: Arc<DependencyGuard>,
    ) -> Self {
        Self {
            repository,
            limiter,
            guard,
        }
    }

    /// One row read through the guard, inside the limiter.
    async fn read<T, F>(&self, query: impl Fn() -> F) -> Result<Loaded<T>, LoadFailure>
    where
        F: Future<Output = Result<Option<Versioned<T>>, StoreError>>,
    {
        let row = self
            .guard
            .call(|| async {
                self.limiter
                    .run(query())
                    .await
                    .map_err(|error| store_failure(error).into())
            })
            .await?;
        Ok(loaded(row))
    }
}

#[async_trait]
impl Loader<Product> for CatalogLoader {
    async fn load(&self, key: ItemKey) -> Result<Loaded<Product>, LoadFailure> {
        self.read(|| self.repository.product(key)).await
    }

    fn ready(&self) -> bool {
        self.guard.ready()
    }
}

#[async_trait]
impl Loader<RebateRate> for CatalogLoader {
    async fn load(&self, key: ItemKey) -> Result<Loaded<RebateRate>, LoadFailure> {
        self.read(|| self.repository.rate(key)).await
    }

    fn ready(&self) -> bool {
        self.guard.ready()
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
    if matches!(error, StoreError::PoolTimeout) {
        LoadFailure::timeout(error.to_string())
    } else {
        LoadFailure::error(error.to_string())
    }
}

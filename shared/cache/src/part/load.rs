//! The load vocabulary: what a [`Loader`] returns ([`Loaded`]) or fails with ([`LoadFailure`]),
//! and what a read ends in ([`CacheOutcome`]).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::{BoxFuture, Shared};
use rebate_domain::ItemKey;
use serde::Serialize;

use crate::envelope::Envelope;

/// What a source returns: the value (or `None` for "does not exist") and its data version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded<T> {
    pub value: Option<T>,
    pub version: u64,
}

/// Why a load produced no value. Cloneable, because every caller sharing a load receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    pub kind: FailureKind,
    /// For logs only; never shown to clients.
    pub detail: Arc<str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The source did not answer within the time allowed.
    Timeout,
    /// The source answered with an error or could not be reached.
    Error,
    /// The source's circuit breaker is open: it was not called.
    BreakerOpen,
    /// Every slot for concurrent calls to the source is taken: it was not called.
    BulkheadFull,
    /// The outbound rate quota for the source is spent: it was not called.
    Quota,
    /// This item's own share of the source's loads is spent (a hot item, reloaded again and
    /// again): it was not called, and the source's quota was left to other items.
    HotItem,
    /// Load shedding: the service is over capacity and answers from cache only.
    Shed,
}

impl LoadFailure {
    pub fn timeout(detail: impl Into<Arc<str>>) -> Self {
        Self {
            kind: FailureKind::Timeout,
            detail: detail.into(),
        }
    }

    pub fn error(detail: impl Into<Arc<str>>) -> Self {
        Self {
            kind: FailureKind::Error,
            detail: detail.into(),
        }
    }

    pub fn new(kind: FailureKind, detail: impl Into<Arc<str>>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for LoadFailure {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:?}: {}", self.kind, self.detail)
    }
}

/// Fetches one part of one item from its source (store or upstream API).
#[async_trait]
pub trait Loader<T>: Send + Sync + fmt::Debug + 'static {
    async fn load(&self, key: ItemKey) -> Result<Loaded<T>, LoadFailure>;

    /// Whether a load started now could reach the source (its breaker not open, a quota token
    /// there). Advisory: the part cache takes no L2 rebuild lease when it is false, so a
    /// source that would refuse costs no lease round trips and holds up no other instance.
    fn ready(&self) -> bool {
        true
    }

    /// [`Loader::ready`] for a load of `key`: a source that limits loads per item also says
    /// whether this item's share is spent. The part cache asks this one.
    fn ready_for(&self, _key: ItemKey) -> bool {
        self.ready()
    }
}

/// What [`PartCache::get`](crate::PartCache::get) found.
#[derive(Debug, Clone)]
pub enum CacheOutcome<T> {
    /// A fresh L1 entry answered without touching the source.
    Hit(Arc<Envelope<T>>),
    /// L2 or the source answered within the budget (this caller's load or one it joined).
    Loaded(Arc<Envelope<T>>),
    /// The source failed or was too slow; this copy is past fresh but inside its stale window.
    Stale(Arc<Envelope<T>>, LoadFailure),
    /// The source failed and nothing servable is cached.
    Failed(LoadFailure),
}

/// What one load ends in; every caller that joined it receives a clone.
pub(super) type LoadResult<T> = Result<Arc<Envelope<T>>, LoadFailure>;
/// One load in flight, awaited by every caller that joined it.
pub(super) type SharedLoad<T> = Shared<BoxFuture<'static, LoadResult<T>>>;

//! Why an answer is degraded or missing: the reasons a part is not live, and the two ways a
//! query has no quote at all.

use rebate_cache::FailureKind;
use serde::{Deserialize, Serialize};

/// Why a part is not live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DegradeReason {
    /// The source did not answer within the part's tier or the request deadline.
    Timeout,
    /// The source failed.
    Error,
    /// The source answered but holds nothing for this item (e.g. no rate configured).
    Missing,
    /// The source's circuit breaker is open after repeated failures: it was not called.
    BreakerOpen,
    /// Every slot for concurrent calls to the source was taken: it was not called.
    BulkheadFull,
    /// The outbound quota for the source was spent (or the source said 429).
    Quota,
    /// This item's own share of the source's loads was spent (an item reloaded again and
    /// again, e.g. invalidated many times a second): it was not called.
    HotItem,
    /// The service is shedding load: the part was served from cache only, or dropped.
    Shed,
}

impl DegradeReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            DegradeReason::Timeout => "timeout",
            DegradeReason::Error => "error",
            DegradeReason::Missing => "missing",
            DegradeReason::BreakerOpen => "breaker_open",
            DegradeReason::BulkheadFull => "bulkhead_full",
            DegradeReason::Quota => "quota",
            DegradeReason::HotItem => "hot_item",
            DegradeReason::Shed => "shed",
        }
    }
}

/// Why there is no quote at all. Everything else degrades inside the quote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("item not found (delisted: {delisted})")]
    NotFound { delisted: bool },
    #[error("product source unavailable ({reason:?}) and nothing stale is cached")]
    Unavailable { reason: DegradeReason },
}

impl From<FailureKind> for DegradeReason {
    fn from(kind: FailureKind) -> Self {
        match kind {
            FailureKind::Timeout => DegradeReason::Timeout,
            FailureKind::Error => DegradeReason::Error,
            FailureKind::BreakerOpen => DegradeReason::BreakerOpen,
            FailureKind::BulkheadFull => DegradeReason::BulkheadFull,
            FailureKind::Quota => DegradeReason::Quota,
            FailureKind::HotItem => DegradeReason::HotItem,
            FailureKind::Shed => DegradeReason::Shed,
        }
    }
}

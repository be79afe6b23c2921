//! The clients of the external APIs, kept beside the part caches that own them as loaders, so
//! that the status page and the metrics can read how their loads were batched.

use std::sync::Arc;

use rebate_sources::{BatchStats, CouponClient, ExtrasClient};
use serde::Serialize;

/// The coupon and extras API clients.
#[derive(Debug, Clone)]
pub struct UpstreamClients {
    pub coupons: Arc<CouponClient>,
    pub extras: Arc<ExtrasClient>,
}

/// Each API's batch counters; `None` where batching is off.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct UpstreamBatchStats {
    pub coupons: Option<BatchStats>,
    pub extras: Option<BatchStats>,
}

impl UpstreamClients {
    pub fn batch_stats(&self) -> UpstreamBatchStats {
        UpstreamBatchStats {
            coupons: self.coupons.batch_stats(),
            extras: self.extras.batch_stats(),
        }
    }
}

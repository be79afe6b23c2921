//! [`EngineMode::Naive`](crate::EngineMode::Naive), the load harness's "before" baseline: no
//! cache, each part straight from its source, one after another. Never the service's path.

use rebate_cache::{Clock, LoadFailure, Loaded};
use rebate_domain::{ItemKey, Timestamp};

use crate::error::{DegradeReason, QueryError};
use crate::parts::EngineParts;
use crate::quote::{PartResult, Quote, assemble};

/// The quote for `key` from the four sources in turn, bypassing every cache tier.
pub(crate) async fn quote(
    parts: &EngineParts,
    key: ItemKey,
    clock: &dyn Clock,
) -> Result<Quote, QueryError> {
    let now = clock.now();
    let product = part(parts.product.load_uncached(key).await, now);
    let rate = part(parts.rate.load_uncached(key).await, now);
    let coupons = part(parts.coupons.load_uncached(key).await, now);
    let extras = part(parts.extras.load_uncached(key).await, now);
    assemble(product, rate, coupons, extras, clock.now())
}

fn part<T>(loaded: Result<Loaded<T>, LoadFailure>, now: Timestamp) -> PartResult<T> {
    match loaded {
        Ok(loaded) => PartResult::Live {
            value: loaded.value,
            as_of: now,
        },
        Err(failure) => PartResult::Failed {
            reason: DegradeReason::from(failure.kind),
        },
    }
}

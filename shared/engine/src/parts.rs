//! [`EngineParts`]: the four part caches the engine reads through, typed for the fan-out and
//! erased ([`PartView`]) for everything that treats the parts alike.

use rebate_cache::{PartCache, PartView};
use rebate_domain::{Coupon, Extras, PartKind, PerPart, Product, RebateRate};

/// The four part caches the engine reads through, with each part's timeout.
#[derive(Debug, Clone)]
pub struct EngineParts {
    pub product: PartCache<Product>,
    pub rate: PartCache<RebateRate>,
    pub coupons: PartCache<Vec<Coupon>>,
    pub extras: PartCache<Extras>,
}

impl EngineParts {
    /// The four caches with their value types erased: what treats the parts alike (prefetch,
    /// invalidation, statistics, inspection) goes through this, the typed fan-out does not.
    pub fn views(&self) -> PerPart<&dyn PartView> {
        PerPart {
            product: &self.product,
            rate: &self.rate,
            coupons: &self.coupons,
            extras: &self.extras,
        }
    }

    pub fn view(&self, part: PartKind) -> &dyn PartView {
        *self.views().get(part)
    }
}

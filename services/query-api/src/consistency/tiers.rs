//! One look at one key's part: the version of the copy each tier would serve a client, then the
//! store's. The event path and the drift sampler both look this way, and judge what they see
//! each by their own rule.

use rebate_cache::{EntryMeta, L2Entry};
use rebate_domain::{ItemKey, PartKind};
use rebate_engine::QueryEngine;
use rebate_store::CatalogRepository;

/// The parts the store holds rows of, with versions: the only parts compared. Coupons and
/// extras have no store row (the coupon API's document version, the fetch time).
pub(super) const STORE_BACKED: [PartKind; 2] = [PartKind::Product, PartKind::Rate];

/// The version of the fresh copy each tier would serve, in the order a request meets them.
/// `None`: that tier would not serve one (absent, past its fresh window, or a fence). A
/// not-found marker is version 0, as is a rendering's part that was not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Copies {
    /// The part's version in the kept rendering of the whole quote.
    pub(super) rendering: Option<u64>,
    pub(super) l1: Option<u64>,
    pub(super) l2: Option<u64>,
}

impl Copies {
    /// Whether any tier's copy meets `test`.
    pub(super) fn any(&self, test: impl Fn(u64) -> bool) -> bool {
        [self.rendering, self.l1, self.l2]
            .into_iter()
            .flatten()
            .any(test)
    }
}

/// L2 or the store could not be read: nothing can be said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unreadable;

/// What a look saw: the tiers' copies, read first, then the store's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) copies: Copies,
    /// The store row's version; `None`: no row.
    pub(super) store: Option<u64>,
}

/// Reads every tier, then the store (after the tiers, so that a write landing meanwhile shows
/// as a newer store version rather than as a newer copy the store seems not to have).
/// `part` must be store-backed ([`STORE_BACKED`]).
pub(super) async fn look(
    engine: &QueryEngine,
    store: &dyn CatalogRepository,
    key: ItemKey,
    part: PartKind,
) -> Result<Seen, Unreadable> {
    let copies = served(engine, key, part).await?;
    let store = match part {
        PartKind::Product => store
            .product(key)
            .await
            .map(|row| row.map(|row| row.version)),
        PartKind::Rate => store.rate(key).await.map(|row| row.map(|row| row.version)),
        PartKind::Coupons | PartKind::Extras => {
            debug_assert!(false, "{} has no store row", part.as_str());
            return Err(Unreadable);
        }
    };
    let store = store.map_err(|_| Unreadable)?;
    Ok(Seen { copies, store })
}

/// The copies of `key`'s `part` that the kept rendering, L1 and L2 would serve now. Peeks
/// only: no hit is counted, no load or refresh started.
async fn served(engine: &QueryEngine, key: ItemKey, part: PartKind) -> Result<Copies, Unreadable> {
    let now = engine.now();
    let servable = |entry: EntryMeta| entry.is_fresh(now).then_some(entry.version);
    let rendering = engine
        .peek_rendered(&key)
        .map(|rendered| *rendered.versions().get(part));
    let cache = engine.parts().view(part);
    let l1 = cache.l1_entry(&key).and_then(servable);
    let l2 = match cache.l2_entry(key).await.map_err(|_| Unreadable)? {
        L2Entry::Present(entry) => servable(entry),
        L2Entry::Absent | L2Entry::Undecodable => None,
    };
    Ok(Copies { rendering, l1, l2 })
}
